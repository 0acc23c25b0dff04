// models/onnx_ops_shape.cc: the ONNX importer's conversions of linear algebra (MatMul, Gemm) and shapes: the ops
// that move and cut values (indexing: onnx_ops_index.cc)
// (the converter table and the shared helpers: models/onnx_ops.h, onnx_ops.cc).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "graph/interpreter.h"
#include "models/onnx_import.h"
#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

Tensor i64_tensor(const std::vector<int64_t>& v, bool scalar) {
  Tensor t(DType::i64, scalar ? Shape{} : Shape{int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.span<int64_t>().begin());
  return t;
}

namespace {

// ---- linear algebra -----------------------------------------------------------------------------------

// Numpy's matmul: rank-1 operands gain (and lose) a dimension; batch dimensions broadcast.
Status convert_matmul(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  Value a = in[0], b = in[1];
  const int ra = a.type.shape.rank(), rb = b.type.shape.rank();
  if (ra == 0 || rb == 0) return c.error("inputs", "rank 1 or more", a.type.to_string() + " and " + b.type.to_string());
  if (ra == 1) a = reshaped(c, a, {1, a.type.shape[0]});
  if (rb == 1) b = reshaped(c, b, {b.type.shape[0], 1});
  const int64_t K = a.type.shape[-1];
  if (b.type.shape[-2] != K)
    return c.error("inputs", "a [..., M, K] and b [..., K, N]", a.type.to_string() + " and " + b.type.to_string());
  std::vector<int64_t> da = dims(a.type.shape), db = dims(b.type.shape);
  std::vector<int64_t> batch_a(da.begin(), da.end() - 2), batch_b(db.begin(), db.end() - 2);
  if (!batch_b.empty()) {  // b has batch dimensions: both broadcast to one batch shape
    ASPEN_ASSIGN_OR_RETURN(const Shape bs, broadcast_shape(c, {shape_of(batch_a), shape_of(batch_b)}));
    std::vector<int64_t> ta = dims(bs), tb = dims(bs);
    ta.insert(ta.end(), da.end() - 2, da.end());
    tb.insert(tb.end(), db.end() - 2, db.end());
    a = to_shape(c, a, shape_of(ta));
    b = to_shape(c, b, shape_of(tb));
  }
  // A transpose of the last two axes feeding the product becomes its trans flag (exporters write
  // MatMul(x, Transpose(W)) for a Linear, and q @ Transpose(k) in attention): no copy at run time.
  auto peel = [&](const Value& v, int64_t& trans) -> ValueId {
    const ValueId id = c.id(v);
    const graph::Graph& g = c.b.graph();
    const graph::Node& p = g.producer(id);
    if (p.op != OpKind::transpose) return id;
    const std::vector<int64_t>& perm = p.attrs.ints("perm");
    const int64_t r = int64_t(perm.size());
    if (r < 2) return id;
    for (int64_t i = 0; i < r - 2; ++i)
      if (perm[size_t(i)] != i) return id;
    if (perm[size_t(r - 2)] != r - 1 || perm[size_t(r - 1)] != r - 2) return id;
    trans = 1;
    return p.inputs[0];
  };
  int64_t ta = 0, tb = 0;
  const ValueId ia = peel(a, ta), ib = peel(b, tb);
  ValueId y = c.b.op1(OpKind::matmul, {ia, ib}, {{"trans_a", ta}, {"trans_b", tb}});
  if (!c.b.status().is_ok()) return c.b.status();
  std::vector<int64_t> dy = dims(c.b.type(y).shape);
  if (rb == 1) dy.erase(dy.end() - 1);
  if (ra == 1) dy.erase(dy.end() - (rb == 1 ? 1 : 2));
  out = {reshaped(c, c.wrap(y), dy)};
  return c.b.status();
}

Status convert_gemm(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 1.0f));
  ASPEN_ASSIGN_OR_RETURN(const float beta, c.attr_f("beta", 1.0f));
  ASPEN_ASSIGN_OR_RETURN(const int64_t ta, c.attr_i("transA", 0));
  ASPEN_ASSIGN_OR_RETURN(const int64_t tb, c.attr_i("transB", 0));
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  if (in[0].type.shape.rank() != 2 || in[1].type.shape.rank() != 2)
    return c.error("inputs A and B", "rank 2", in[0].type.to_string() + " and " + in[1].type.to_string());
  const int64_t N = tb ? in[1].type.shape[0] : in[1].type.shape[1];
  const bool has_c = in.size() > 2 && in[2].present();
  Value bias;
  if (has_c) bias = beta == 1.0f ? in[2] : c.wrap(c.b.scale(c.id(in[2]), beta));
  const bool row_bias =
      has_c && alpha == 1.0f &&
      (dims(bias.type.shape) == std::vector<int64_t>{N} || dims(bias.type.shape) == std::vector<int64_t>{1, N});
  std::vector<ValueId> args{c.id(in[0]), c.id(in[1])};
  if (row_bias) args.push_back(c.id(reshaped(c, bias, {N})));
  ValueId y = c.b.op1(OpKind::matmul, args, {{"trans_a", ta}, {"trans_b", tb}});
  if (alpha != 1.0f) y = c.b.scale(y, alpha);
  Value r = c.wrap(y);
  if (has_c && !row_bias) {
    std::vector<Value> sum{r, bias};
    ASPEN_RETURN_IF_ERROR(elementwise(c, OpKind::add, sum, out));
    return c.b.status();
  }
  out = {r};
  return c.b.status();
}

// ---- shapes -------------------------------------------------------------------------------------------


Status convert_shape(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const std::vector<int64_t> d = dims(in[0].type.shape);
  const int64_t r = int64_t(d.size());
  ASPEN_ASSIGN_OR_RETURN(int64_t start, c.attr_i("start", 0));
  ASPEN_ASSIGN_OR_RETURN(int64_t end, c.attr_i("end", r));
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, 0, r);
  out = {Ctx::constant(i64_tensor(std::vector<int64_t>(d.begin() + start, d.begin() + std::max(start, end))))};
  return Status();
}

Status convert_size(Ctx&, std::vector<Value>& in, std::vector<Value>& out) {
  out = {Ctx::constant(i64_tensor({in[0].type.shape.numel()}, true))};
  return Status();
}

Status convert_constant(Ctx& c, std::vector<Value>&, std::vector<Value>& out) {
  if (c.has("value")) {
    ASPEN_ASSIGN_OR_RETURN(Tensor t, c.attr_tensor("value"));
    out = {Ctx::constant(std::move(t))};
  } else if (c.has("value_float")) {
    ASPEN_ASSIGN_OR_RETURN(const float f, c.attr_f("value_float"));
    Tensor t(DType::f32, Shape{});
    t.span<float>()[0] = f;
    out = {Ctx::constant(std::move(t))};
  } else if (c.has("value_int")) {
    ASPEN_ASSIGN_OR_RETURN(const int64_t i, c.attr_i("value_int"));
    out = {Ctx::constant(i64_tensor({i}, true))};
  } else if (c.has("value_ints")) {
    ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> v, c.attr_ints("value_ints"));
    out = {Ctx::constant(i64_tensor(v))};
  } else if (const io::OnnxAttribute* a = c.node.find("value_floats")) {
    Tensor t(DType::f32, Shape{int64_t(a->floats.size())});
    std::copy(a->floats.begin(), a->floats.end(), t.span<float>().begin());
    out = {Ctx::constant(std::move(t))};
  } else {
    return c.unsupported("attributes", "one of value, value_float(s), value_int(s)",
                         c.node.attributes.empty() ? "none" : "'" + c.node.attributes[0].name + "'");
  }
  return Status();
}

Status convert_constant_of_shape(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> d, c.ints(in[0], "input 'input' (the shape)"));
  ASPEN_ASSIGN_OR_RETURN(const Shape s, make_shape(c, d, "input 'input' (the shape)"));
  Tensor value(DType::f32, Shape{1});
  if (c.has("value")) {
    ASPEN_ASSIGN_OR_RETURN(value, c.attr_tensor("value"));
    if (value.numel() != 1) return c.error("attribute 'value'", "one element", value.shape().to_string());
  }
  if (s.numel() > kMaxKnownElements) {
    // Too large to hold at import: the graph fills it (a broadcast scalar), and the memory plan says whether
    // the device has room for it.
    Tensor scalar(value.dtype(), Shape{});
    std::memcpy(scalar.raw(), value.raw(), size_t(dtype_size(value.dtype())));
    out = {c.wrap(c.b.broadcast(c.b.constant(std::move(scalar)), d))};
    return c.b.status();
  }
  ASPEN_ASSIGN_OR_RETURN(Tensor t, Tensor::make(value.dtype(), s));
  const size_t es = size_t(dtype_size(value.dtype()));
  for (int64_t i = 0; i < t.numel(); ++i) std::memcpy(static_cast<char*>(t.raw()) + size_t(i) * es, value.raw(), es);
  out = {Ctx::constant(std::move(t))};
  return Status();
}

Status convert_range(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  ASPEN_ASSIGN_OR_RETURN(const double start, c.scalar(in[0], "input 'start'"));
  ASPEN_ASSIGN_OR_RETURN(const double limit, c.scalar(in[1], "input 'limit'"));
  ASPEN_ASSIGN_OR_RETURN(const double delta, c.scalar(in[2], "input 'delta'"));
  if (delta == 0) return c.error("input 'delta'", "a nonzero step", "0");
  const double n = std::max(0.0, std::ceil((limit - start) / delta));
  if (n > double(kMaxKnownElements))
    return c.error("inputs", "a range of at most " + std::to_string(kMaxKnownElements) + " values (known at import)",
                   std::to_string(n));
  graph::HostArray a(TensorType{in[0].type.dtype, Shape{int64_t(n)}});
  for (int64_t i = 0; i < int64_t(n); ++i) a.data[size_t(i)] = start + double(i) * delta;
  out = {Ctx::constant(a.to_tensor())};
  return Status();
}

Status convert_reshape(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(std::vector<int64_t> d, c.ints(in[1], "input 'shape'"));
  ASPEN_ASSIGN_OR_RETURN(const int64_t allowzero, c.attr_i("allowzero", 0));
  const std::vector<int64_t> from = dims(in[0].type.shape);
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == 0 && !allowzero) {
      if (i >= from.size())
        return c.error("input 'shape'", "a 0 (copy) only where the input has a dimension", "0 at " + std::to_string(i));
      d[i] = from[i];
    }
    if (d[i] == -1) {
      if (infer >= 0) return c.error("input 'shape'", "at most one -1", "two");
      infer = int(i);
      continue;
    }
    if (d[i] < 0) return c.error("input 'shape'", "extents >= -1", std::to_string(d[i]));
    if (d[i] > 0 && known > INT64_MAX / d[i])
      return c.error("input 'shape'", "extents whose product fits in 64 bits",
                     "a larger product at " + std::to_string(i));
    known *= d[i];
  }
  const int64_t numel = in[0].type.shape.numel();
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return c.error("input 'shape'", "extents whose product divides " + std::to_string(numel),
                     "a product of " + std::to_string(known));
    d[size_t(infer)] = numel / known;
  } else if (known != numel) {
    std::string shape;
    for (int64_t e : d) shape += (shape.empty() ? "" : ", ") + std::to_string(e);
    return c.error("input 'shape'",
                   "extents whose product is " + std::to_string(numel) + " (the elements of input 'data', " +
                       in[0].type.to_string() + ")",
                   "[" + shape + "] (" + std::to_string(known) + " elements)");
  }
  out = {reshaped(c, in[0], d)};
  return c.b.status();
}

Status convert_flatten(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const int r = in[0].type.shape.rank();
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 1));
  if (a < -r || a > r)
    return c.error("attribute 'axis'", "in [" + std::to_string(-r) + ", " + std::to_string(r) + "]", std::to_string(a));
  const int axis = int(a < 0 ? a + r : a);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < r; ++i) (i < axis ? outer : inner) *= in[0].type.shape[i];
  out = {reshaped(c, in[0], {outer, inner})};
  return c.b.status();
}

// Unsqueeze's and Squeeze's axes: the input (opset 13+).
// Squeeze's and Unsqueeze's axes: an input from opset 13, an attribute before.
Result<std::vector<int64_t>> axes_input(Ctx& c, std::vector<Value>& in, size_t k) {
  if (c.opset < 13) return c.attr_ints("axes", std::vector<int64_t>{});
  if (k < in.size() && in[k].present()) return c.ints(in[k], "input 'axes'");
  return std::vector<int64_t>{};
}

Status convert_unsqueeze(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, axes_input(c, in, 1));
  const int r = in[0].type.shape.rank() + int(axes.size());
  std::vector<bool> inserted(size_t(r), false);
  for (int64_t a : axes) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(a, r, "input 'axes'"));
    if (inserted[size_t(ax)]) return c.error("input 'axes'", "each axis once", std::to_string(a) + " twice");
    inserted[size_t(ax)] = true;
  }
  std::vector<int64_t> d;
  const std::vector<int64_t> from = dims(in[0].type.shape);
  size_t k = 0;
  for (int i = 0; i < r; ++i) d.push_back(inserted[size_t(i)] ? 1 : from[k++]);
  out = {reshaped(c, in[0], d)};
  return c.b.status();
}

Status convert_squeeze(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, axes_input(c, in, 1));
  const std::vector<int64_t> from = dims(in[0].type.shape);
  const int r = int(from.size());
  std::vector<bool> drop(size_t(r), axes.empty());
  if (axes.empty())
    for (int i = 0; i < r; ++i) drop[size_t(i)] = from[size_t(i)] == 1;
  for (int64_t a : axes) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(a, r, "input 'axes'"));
    if (from[size_t(ax)] != 1)
      return c.error("input 'axes'", "axes of extent 1",
                     "axis " + std::to_string(a) + " of extent " + std::to_string(from[size_t(ax)]));
    drop[size_t(ax)] = true;
  }
  std::vector<int64_t> d;
  for (int i = 0; i < r; ++i)
    if (!drop[size_t(i)]) d.push_back(from[size_t(i)]);
  out = {reshaped(c, in[0], d)};
  return c.b.status();
}

Status convert_transpose(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const int r = in[0].type.shape.rank();
  std::vector<int64_t> rev(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) rev[size_t(i)] = r - 1 - i;
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> perm, c.attr_ints("perm", rev));
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == int64_t(i);
  out = {identity && int(perm.size()) == r ? in[0] : c.wrap(c.b.transpose(c.id(in[0]), perm))};
  return c.b.status();
}

Status convert_concat(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis"));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  std::vector<ValueId> ids;
  for (const Value& v : in)
    if (v.type.shape.rank() > axis && v.type.shape[axis] > 0) ids.push_back(c.id(v));  // empty pieces add nothing
  if (ids.empty()) ids.push_back(c.id(in[0]));  // all empty on the axis: so is the result
  out = {ids.size() == 1 && in.size() == 1 ? in[0] : c.wrap(c.b.concat(ids, axis))};
  return c.b.status();
}

// x[..., b:e:s, ...] for a step s > 1: positions b, b + s, ... are column r of the axis range
// [q s, (q + n) s) seen as [n, s] (b = q s + r), padded with zeros past the end where that range passes it.
Value strided(Ctx& c, const Value& x, int ax, int64_t b, int64_t e, int64_t step) {
  const std::vector<int64_t> d = dims(x.type.shape);
  const int64_t n = (e - b - 1) / step + 1, q = b / step, r = b % step;
  if (n == 1) return c.wrap(c.b.slice(c.id(x), ax, b, b + 1));  // (from here on step <= e - b <= d)
  const int64_t lo = q * step, hi = (q + n) * step;
  ValueId v = c.b.slice(c.id(x), ax, lo, std::min(hi, d[size_t(ax)]));
  if (hi > d[size_t(ax)]) {
    std::vector<int64_t> pad = d;
    pad[size_t(ax)] = hi - d[size_t(ax)];
    v = c.b.concat({v, c.id(filled(c, 0.0, x.type.dtype, shape_of(pad)))}, ax);
  }
  std::vector<int64_t> split = d;
  split[size_t(ax)] = n;
  split.insert(split.begin() + ax + 1, step);
  v = c.b.slice(c.b.reshape(v, split), ax + 1, r, r + 1);
  std::vector<int64_t> outd = d;
  outd[size_t(ax)] = n;
  return c.wrap(c.b.reshape(v, outd));
}

// Slice(data, starts, ends[, axes[, steps]]) with ONNX's clamping: a negative start or end counts from the
// end of its axis; then for a positive step the start and end are clamped to [0, d], for a negative one the
// start to [0, d - 1] and the end to [-1, d - 1] (so INT64_MAX and INT64_MIN, which exporters write for an
// open end, mean "to the end" either way). Negative steps pick their positions with a gather.
Status convert_slice(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> starts, c.ints(in[1], "input 'starts'"));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> ends, c.ints(in[2], "input 'ends'"));
  const int r = in[0].type.shape.rank();
  std::vector<int64_t> axes(starts.size()), steps(starts.size(), 1);
  std::iota(axes.begin(), axes.end(), 0);
  if (in.size() > 3 && in[3].present()) {
    ASPEN_ASSIGN_OR_RETURN(axes, c.ints(in[3], "input 'axes'"));
  }
  if (in.size() > 4 && in[4].present()) {
    ASPEN_ASSIGN_OR_RETURN(steps, c.ints(in[4], "input 'steps'"));
  }
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return c.error("inputs 'starts', 'ends', 'axes', 'steps'", "one length",
                   std::to_string(starts.size()) + ", " + std::to_string(ends.size()) + ", " +
                       std::to_string(axes.size()) + ", " + std::to_string(steps.size()));
  std::vector<bool> seen(size_t(std::max(r, 1)), false);
  Value x = in[0];
  for (size_t k = 0; k < starts.size(); ++k) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(axes[k], r, "input 'axes'"));
    if (seen[size_t(ax)]) return c.error("input 'axes'", "each axis once", "axis " + std::to_string(ax) + " twice");
    seen[size_t(ax)] = true;
    const int64_t step = steps[k];
    if (step == 0) return c.error("input 'steps'", "nonzero steps", "0 on axis " + std::to_string(ax));
    const int64_t d = x.type.shape[ax];
    const auto from_end = [d](int64_t v) { return v < 0 ? v + d : v; };  // no overflow: v < 0 <= d
    if (step > 0) {
      const int64_t b = std::clamp<int64_t>(from_end(starts[k]), 0, d);
      const int64_t e = std::max(b, std::clamp<int64_t>(from_end(ends[k]), 0, d));
      if (step > 1 && e > b) {
        x = strided(c, x, ax, b, e, step);
      } else if (b != 0 || e != d) {
        x = c.wrap(c.b.slice(c.id(x), ax, b, e));
      }
      continue;
    }
    // A negative step: positions b, b + step, ... while above e.
    const int64_t b = std::clamp<int64_t>(from_end(starts[k]), 0, d - 1);
    const int64_t e = std::clamp<int64_t>(from_end(ends[k]), -1, d - 1);
    if (b <= e || d == 0) {  // nothing
      x = c.wrap(c.b.slice(c.id(x), ax, 0, 0));
      continue;
    }
    const int64_t n = (b - e - 1) / -step + 1;
    Tensor idx(DType::i64, Shape{n});
    for (int64_t i = 0; i < n; ++i) idx.span<int64_t>()[size_t(i)] = b + i * step;
    std::vector<Value> gin = {x, Ctx::constant(std::move(idx))}, gout;
    ASPEN_RETURN_IF_ERROR(gather_on(c, gin, ax, gout));
    x = gout.at(0);
  }
  out = {x};
  return c.b.status();
}

Status convert_split(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  const int64_t d = in[0].type.shape[axis];
  const size_t n_out = c.node.outputs.size();
  std::vector<int64_t> sizes;
  if (c.opset < 13 && c.has("split")) {  // an attribute before opset 13
    ASPEN_ASSIGN_OR_RETURN(sizes, c.attr_ints("split"));
  } else if (in.size() > 1 && in[1].present()) {
    ASPEN_ASSIGN_OR_RETURN(sizes, c.ints(in[1], "input 'split'"));
  } else {
    ASPEN_ASSIGN_OR_RETURN(const int64_t n, c.attr_i("num_outputs", int64_t(n_out)));
    if (n < 1 || n != int64_t(n_out))
      return c.error("attribute 'num_outputs'", std::to_string(n_out) + " (the node's outputs, at least 1)",
                     std::to_string(n));
    const int64_t each = d / n + (d % n != 0);  // the last piece is smaller when n does not divide d
    for (int64_t k = 0, at = 0; k < n; ++k, at += each) sizes.push_back(std::max<int64_t>(0, std::min(each, d - at)));
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != d || sizes.size() != n_out)
    return c.error("split sizes", std::to_string(n_out) + " pieces adding up to " + std::to_string(d),
                   std::to_string(sizes.size()) + " adding up to " + std::to_string(total));
  out.clear();
  for (int64_t k = 0, at = 0; k < int64_t(sizes.size()); at += sizes[size_t(k)], ++k)
    out.push_back(c.wrap(c.b.slice(c.id(in[0]), axis, at, at + sizes[size_t(k)])));
  return c.b.status();
}

Status convert_expand(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> d, c.ints(in[1], "input 'shape'"));
  ASPEN_ASSIGN_OR_RETURN(const Shape s, make_shape(c, d, "input 'shape'"));
  ASPEN_ASSIGN_OR_RETURN(const Shape to, broadcast_shape(c, {in[0].type.shape, s}));
  out = {to_shape(c, in[0], to)};
  return c.b.status();
}

// SplitToSequence(input, split?) {axis = 0, keepdims = 1}: the pieces as a sequence (no split: pieces of
// one, squeezed unless keepdims; a scalar split: pieces of that size, the last smaller; a list: those
// sizes). SequenceAt(sequence, position): one piece. Sequences live at import only: each piece is a value.
Status convert_split_to_sequence(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  ASPEN_ASSIGN_OR_RETURN(const int64_t keepdims, c.attr_i("keepdims", 1));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  const int64_t d = in[0].type.shape[axis];
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (in.size() > 1 && in[1].present()) {
    ASPEN_ASSIGN_OR_RETURN(sizes, c.ints(in[1], "input 'split'"));
    if (in[1].type.shape.rank() == 0) {
      const int64_t each = sizes.at(0);
      if (each < 1) return c.error("input 'split'", "a piece size >= 1", std::to_string(each));
      sizes.clear();
      for (int64_t at = 0; at < d; at += each) sizes.push_back(std::min(each, d - at));
    }
  } else {
    sizes.assign(size_t(d), 1);
    squeeze = keepdims == 0;
  }
  int64_t total = 0;
  for (int64_t x : sizes) total += x;
  if (total != d) return c.error("input 'split'", "sizes adding up to " + std::to_string(d), std::to_string(total));
  auto pieces = std::make_shared<std::vector<Value>>();
  int64_t at = 0;
  for (int64_t n : sizes) {
    Value p = c.wrap(c.b.slice(c.id(in[0]), axis, at, at + n));
    if (squeeze) {
      std::vector<int64_t> dd = dims(p.type.shape);
      dd.erase(dd.begin() + axis);
      p = reshaped(c, p, dd);
    }
    pieces->push_back(p);
    at += n;
  }
  Value seq;
  seq.sequence = pieces;
  out = {seq};
  return c.b.status();
}

Status convert_sequence_at(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (!in[0].sequence) return c.error("input 'input_sequence'", "a sequence", in[0].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const double pos, c.scalar(in[1], "input 'position'"));
  const int64_t n = int64_t(in[0].sequence->size());
  int64_t p = int64_t(pos);
  if (p < -n || p >= n)
    return c.error("input 'position'", "in [" + std::to_string(-n) + ", " + std::to_string(n) + ")", std::to_string(p));
  out = {(*in[0].sequence)[size_t(p < 0 ? p + n : p)]};
  return Status();
}

// CumSum(x, axis) {exclusive, reverse} of a known tensor.
Status convert_cumsum(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t exclusive, c.attr_i("exclusive", 0));
  ASPEN_ASSIGN_OR_RETURN(const int64_t reverse, c.attr_i("reverse", 0));
  ASPEN_ASSIGN_OR_RETURN(const double a, c.scalar(in[1], "input 'axis'"));
  const Shape& s = in[0].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(int64_t(a), s.rank(), "input 'axis'"));
  if (!in[0].known()) {
    // On a computed value (RoBERTa's position ids: a cumulative sum of the padding mask): the doubling scan,
    // y += y shifted by 1, 2, 4, ... along the axis (toward the end, or the start with reverse), then shifted
    // once more for exclusive. Exact on integers; on floats the sums are grouped as a tree.
    const int64_t n = s[axis];
    const DType dt = in[0].type.dtype;
    auto shifted = [&](ValueId v, int64_t k) {
      std::vector<int64_t> d = dims(s);
      d[size_t(axis)] = std::min(k, n);
      const ValueId zeros = c.id(filled(c, 0.0, dt, shape_of(d)));
      if (k >= n) return zeros;
      return reverse ? c.b.concat({c.b.slice(v, axis, k, n), zeros}, axis)
                     : c.b.concat({zeros, c.b.slice(v, axis, 0, n - k)}, axis);
    };
    ValueId y = c.id(in[0]);
    for (int64_t k = 1; k < n; k *= 2) y = c.b.add(y, shifted(y, k));
    if (exclusive && n > 0) y = shifted(y, 1);
    out = {c.wrap(y)};
    return c.b.status();
  }
  graph::HostArray x = graph::HostArray::from_tensor(*in[0].constant), y(x.type);
  const int64_t n = s[axis], stride = s.stride(axis), outer = s.numel() / std::max<int64_t>(1, n * stride);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < stride; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = reverse ? n - 1 - k : k;
        const size_t at = size_t((o * n + j) * stride + i);
        if (exclusive) {
          y.data[at] = acc;
          acc += x.data[at];
        } else {
          acc += x.data[at];
          y.data[at] = acc;
        }
      }
    }
  out = {Ctx::constant(y.to_tensor())};
  return Status();
}

// Einsum {equation} of one or two operands (an ellipsis too), as transposes, reductions and one batched
// matrix product:
// an index in both operands and the output is a batch axis, in both but not the output contracted, in one
// operand and the output kept, in one operand alone summed first. An index repeated within one operand (a
// diagonal) is refused by name; so are three or more operands.
Status convert_einsum(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(std::string eq, c.attr_s("equation"));
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  if (in.size() > 2) return c.unsupported("inputs", "one or two operands", std::to_string(in.size()));
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms;
  const std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  for (size_t at = 0;;) {
    const size_t comma = lhs.find(',', at);
    terms.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (terms.size() != in.size())
    return c.error("attribute 'equation'", std::to_string(in.size()) + " operand terms", "'" + eq + "'");
  std::string outs;
  if (arrow != std::string::npos) {
    outs = eq.substr(arrow + 2);
  } else {  // implicit: the indices seen once, in alphabetical order
    std::map<char, int> seen;
    for (const std::string& t : terms)
      for (char ch : t) ++seen[ch];
    for (const auto& [ch, n] : seen)
      if (n == 1) outs += ch;
  }
  // The ellipsis: numpy's rule, its axes right-aligned and broadcast across the operands, named by letters
  // the equation does not use (the last e of them for an operand with e such axes); an implicit output
  // puts them first.
  if (eq.find("...") != std::string::npos) {
    std::vector<int> dots(terms.size(), -1);
    int E = 0;
    for (size_t k = 0; k < terms.size(); ++k) {
      const size_t at = terms[k].find("...");
      if (at == std::string::npos) continue;
      if (terms[k].find("...", at + 3) != std::string::npos || terms[k].find('.', at + 3) != std::string::npos)
        return c.error("attribute 'equation'", "at most one '...' per term", "'" + eq + "'");
      dots[k] = int(in[k].type.shape.rank()) - int(terms[k].size() - 3);
      if (dots[k] < 0)
        return c.error("input " + std::to_string(k), "at least rank " + std::to_string(terms[k].size() - 3),
                       in[k].type.to_string());
      E = std::max(E, dots[k]);
    }
    std::string fresh;
    for (char ch : std::string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
      if (eq.find(ch) == std::string::npos && int(fresh.size()) < E) fresh += ch;
    if (int(fresh.size()) < E) return c.unsupported("attribute 'equation'", "letters left for '...'", "'" + eq + "'");
    for (size_t k = 0; k < terms.size(); ++k)
      if (dots[k] >= 0) terms[k].replace(terms[k].find("..."), 3, fresh.substr(size_t(E - dots[k])));
    if (arrow == std::string::npos) {
      std::string singles;
      for (char ch : outs)
        if (fresh.find(ch) == std::string::npos) singles += ch;
      outs = fresh + singles;
    } else if (const size_t at = outs.find("..."); at != std::string::npos) {
      outs.replace(at, 3, fresh);
    }
    // Broadcast: an axis of extent 1 where another operand's same letter is longer takes that extent.
    std::map<char, int64_t> longest;
    for (size_t k = 0; k < terms.size(); ++k)
      for (size_t i = 0; i < terms[k].size() && int(i) < in[k].type.shape.rank(); ++i)
        longest[terms[k][i]] = std::max(longest[terms[k][i]], in[k].type.shape[int(i)]);
    for (size_t k = 0; k < terms.size(); ++k) {
      std::vector<int64_t> want;
      for (char ch : terms[k]) want.push_back(longest[ch]);
      if (int(want.size()) == in[k].type.shape.rank() && want != dims(in[k].type.shape)) {
        ASPEN_ASSIGN_OR_RETURN(const Shape to, make_shape(c, want, "input " + std::to_string(k)));
        in[k] = to_shape(c, in[k], to);
      }
    }
  }
  for (size_t k = 0; k < terms.size(); ++k) {
    const std::string& t = terms[k];
    if (int(t.size()) != in[k].type.shape.rank())
      return c.error("input " + std::to_string(k), "rank " + std::to_string(t.size()) + " ('" + t + "')",
                     in[k].type.to_string());
    for (size_t i = 0; i < t.size(); ++i)
      if (t.find(t[i], i + 1) != std::string::npos)
        return c.unsupported("attribute 'equation'", "each index once per operand (no diagonals)", "'" + eq + "'");
  }
  std::map<char, int64_t> extent;
  for (size_t k = 0; k < terms.size(); ++k)
    for (size_t i = 0; i < terms[k].size(); ++i) {
      const int64_t e = in[k].type.shape[int(i)];
      auto [it, fresh] = extent.emplace(terms[k][i], e);
      if (!fresh && it->second != e)
        return c.error("index '" + std::string(1, terms[k][i]) + "'", "one extent", std::to_string(it->second) +
                       " and " + std::to_string(e));
    }
  for (char ch : outs)
    if (!extent.count(ch)) return c.error("attribute 'equation'", "output indices of the operands", "'" + eq + "'");
  // Sums an operand over its indices in no other term; returns the value and its remaining indices.
  auto reduce_alone = [&](size_t k) -> std::pair<ValueId, std::string> {
    const std::string& t = terms[k];
    std::vector<int64_t> axes;
    std::string keep;
    for (size_t i = 0; i < t.size(); ++i) {
      const bool elsewhere = outs.find(t[i]) != std::string::npos ||
                             (terms.size() == 2 && terms[1 - k].find(t[i]) != std::string::npos);
      if (elsewhere) keep += t[i];
      else axes.push_back(int64_t(i));
    }
    ValueId v = c.id(in[k]);
    if (!axes.empty()) v = c.b.reduce_sum(v, axes, false);
    return {v, keep};
  };
  auto permuted = [&](ValueId v, const std::string& from, const std::string& to) {
    std::vector<int64_t> perm;
    for (char ch : to) perm.push_back(int64_t(from.find(ch)));
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == int64_t(i);
    return identity ? v : c.b.transpose(v, perm);
  };
  auto extents = [&](const std::string& idx) {
    std::vector<int64_t> d;
    for (char ch : idx) d.push_back(extent[ch]);
    return d;
  };
  auto product_of = [&](const std::string& idx) {
    int64_t p = 1;
    for (char ch : idx) p *= extent[ch];
    return p;
  };
  ValueId y;
  std::string yidx;
  if (terms.size() == 1) {
    std::tie(y, yidx) = reduce_alone(0);
  } else {
    auto [a, ai] = reduce_alone(0);
    auto [b, bi] = reduce_alone(1);
    std::string batch, contract, left, right;
    for (char ch : ai) {
      const bool in_b = bi.find(ch) != std::string::npos, in_out = outs.find(ch) != std::string::npos;
      if (in_b && in_out) batch += ch;
      else if (in_b) contract += ch;
      else left += ch;
    }
    for (char ch : bi)
      if (ai.find(ch) == std::string::npos) right += ch;
    const int64_t B = product_of(batch), L = product_of(left), K = product_of(contract), R = product_of(right);
    const ValueId a3 = c.b.reshape(permuted(a, ai, batch + left + contract), {B, L, K});
    const ValueId b3 = c.b.reshape(permuted(b, bi, batch + contract + right), {B, K, R});
    y = c.b.matmul(a3, b3);  // [B, L, R]
    yidx = batch + left + right;
    std::vector<int64_t> d = extents(yidx);
    y = c.b.reshape(y, d);
  }
  // Indices left in the result but not in the output are summed; then the output's order.
  std::vector<int64_t> axes;
  std::string kept;
  for (size_t i = 0; i < yidx.size(); ++i) {
    if (outs.find(yidx[i]) == std::string::npos) axes.push_back(int64_t(i));
    else kept += yidx[i];
  }
  if (!axes.empty()) y = c.b.reduce_sum(y, axes, false);
  out = {c.wrap(permuted(y, kept, outs))};
  return c.b.status();
}

// OneHot(indices, depth, values [off, on]) {axis = -1}: equal(the index, counting back from depth when
// negative, a class iota) picks on or off; indices and classes compared as f32 (exact below 2^24).
Status convert_one_hot(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const double depth_d, c.scalar(in[1], "input 'depth'"));
  const int64_t depth = int64_t(depth_d);
  if (depth < 1 || depth >= (int64_t(1) << 24))
    return c.unsupported("input 'depth'", "a depth in [1, 2^24)", std::to_string(depth_d));
  if (in[2].type.shape.numel() != 2) return c.error("input 'values'", "two values [off, on]", in[2].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", -1));
  const Shape is = in[0].type.shape;
  const int r = is.rank() + 1;
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, r, "attribute 'axis'"));
  std::vector<int64_t> d = dims(is), unsq = d;
  d.insert(d.begin() + axis, depth);
  unsq.insert(unsq.begin() + axis, 1);
  ValueId idx = c.id(in[0]);
  if (in[0].type.dtype != DType::f32) idx = c.b.cast(idx, DType::f32);
  const ValueId zero = c.id(filled(c, 0.0, DType::f32, is));
  idx = c.b.where(c.b.op1(OpKind::less, {idx, zero}), c.b.add(idx, c.id(filled(c, double(depth), DType::f32, is))), idx);
  ASPEN_ASSIGN_OR_RETURN(const ValueId classes, positions(c, shape_of(d), axis));
  const ValueId hot = c.b.op1(OpKind::equal, {c.b.broadcast(c.b.reshape(idx, unsq), d), classes});
  const ValueId values = c.b.reshape(c.id(in[2]), {2});
  auto pick = [&](int64_t k) { return c.b.broadcast(c.b.reshape(c.b.slice(values, 0, k, k + 1), {}), d); };
  out = {c.wrap(c.b.where(hot, pick(1), pick(0)))};
  return c.b.status();
}

}  // namespace

void add_shape_converters(ConverterTable& t) {
  add_converter(t, "OneHot", convert_one_hot, 3, 3);
  add_converter(t, "Einsum", convert_einsum, 1, -1);
  add_converter(t, "MatMul", convert_matmul, 2, 2);
  add_converter(t, "Gemm", convert_gemm, 2, 3);
  add_converter(t, "Shape", convert_shape, 1, 1);
  add_converter(t, "Size", convert_size, 1, 1);
  add_converter(t, "Constant", convert_constant, 0, 0);
  add_converter(t, "ConstantOfShape", convert_constant_of_shape, 1, 1);
  add_converter(t, "Range", convert_range, 3, 3);
  add_converter(t, "Reshape", convert_reshape, 2, 2);
  add_converter(t, "Flatten", convert_flatten, 1, 1);
  add_converter(t, "Unsqueeze", convert_unsqueeze, 1, 2);  // axes an attribute before opset 13
  add_converter(t, "Squeeze", convert_squeeze, 1, 2);
  add_converter(t, "Transpose", convert_transpose, 1, 1);
  add_converter(t, "Concat", convert_concat, 1, -1);
  add_converter(t, "Slice", convert_slice, 3, 5);
  add_converter(t, "Split", convert_split, 1, 2);
  add_converter(t, "Expand", convert_expand, 2, 2);
  add_converter(t, "SplitToSequence", convert_split_to_sequence, 1, 2, /*foldable=*/false);  // sequences are never folded
  add_converter(t, "SequenceAt", convert_sequence_at, 2, 2, /*foldable=*/false);
  add_converter(t, "CumSum", convert_cumsum, 2, 2);
}

}  // namespace aspen::models::onnx
