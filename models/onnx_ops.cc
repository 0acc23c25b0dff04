// models/onnx_ops.cc: the ONNX importer's conversions, one per op type of the default domain, opsets 13
// to 21 (the semantics of the latest version of each op; where an op changed between these opsets, as
// ReduceMean's axes moving from an attribute to an input at 18, both forms are read).
//
// Numpy broadcasting becomes explicit broadcast ops; ops the IR has no op for are decomposed exactly:
//   Reciprocal: 1 / x          Abs: max(x, -x)          Pow with a known exponent: products, sqrt, 1/x,
//   or exp(y log x) (NaN for x < 0, as C's pow at a non-integer exponent)
//   LessOrEqual: not(greater)  GreaterOrEqual: not(less)  Clip: max/min with its bounds
//   LogSoftmax: (x - max) - log(sum(exp(x - max)))      ReduceMean: reduce_sum / count
//   ReduceMin: -reduce_max(-x)                          Gemm: matmul (bias folded in when it is one row)
//   GlobalAveragePool: reduce_sum over the spatial axes / count
//   Softmax/LogSoftmax on an inner axis: transposed to the last and back
//   LayerNormalization over several axes: flattened to one
// Known inputs only (shape arithmetic; folded at import): Shape, Size, ConstantOfShape, Range, ReduceProd,
// Mod, CumSum, integer Div, and Gather,
// Concat, Slice, Reshape, Squeeze, Unsqueeze of integer data.
#include "models/onnx_ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "graph/interpreter.h"
#include "models/onnx_import.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

std::optional<DType> dtype_of_onnx(int32_t t) {
  switch (io::OnnxType(t)) {
    case io::OnnxType::f32:
      return DType::f32;
    case io::OnnxType::f16:
      return DType::f16;
    case io::OnnxType::bf16:
      return DType::bf16;
    case io::OnnxType::i32:
      return DType::i32;
    case io::OnnxType::i64:
      return DType::i64;
    case io::OnnxType::u8:
      return DType::u8;
    case io::OnnxType::boolean:
      return DType::boolean;
    default:
      return std::nullopt;
  }
}

// ---- Ctx ---------------------------------------------------------------------------------------------

std::string Ctx::label() const { return node.label(index_) + " at opset " + std::to_string(opset); }

Status Ctx::error(const std::string& what, const std::string& expected, const std::string& found) const {
  return Status::invalid_argument(label() + ": " + what, expected, found);
}

Status Ctx::unsupported(const std::string& what, const std::string& expected, const std::string& found) const {
  return Status::error(Code::kUnimplemented, label() + ": " + what, expected, found);
}

namespace {
std::string attr_subject(const char* name) { return std::string("attribute '") + name + "'"; }

Result<const io::OnnxAttribute*> find_attr(const Ctx& c, const char* name, io::OnnxAttrType type) {
  const io::OnnxAttribute* a = c.node.find(name);
  if (a && a->type != type)
    return c.error(attr_subject(name), "type " + io::onnx_attr_type_name(type), io::onnx_attr_type_name(a->type));
  return a;
}
}  // namespace

Result<int64_t> Ctx::attr_i(const char* name, std::optional<int64_t> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::i));
  if (a) return a->i;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

Result<float> Ctx::attr_f(const char* name, std::optional<float> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::f));
  if (a) return a->f;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

Result<std::string> Ctx::attr_s(const char* name, std::optional<std::string> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::s));
  if (a) return a->s;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

Result<std::vector<int64_t>> Ctx::attr_ints(const char* name, std::optional<std::vector<int64_t>> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::ints));
  if (a) return a->ints;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

namespace {
Result<Tensor> tensor_of(const Ctx& c, const io::OnnxTensor& t, const std::string& what) {
  return tensor_from_onnx(t, c.label() + ": " + what);
}
}  // namespace

Result<Tensor> Ctx::attr_tensor(const char* name) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::tensor));
  if (!a) return error(attr_subject(name), "the attribute", "none");
  return tensor_of(*this, a->tensors.at(0), attr_subject(name));
}

ValueId Ctx::id(const Value& v) {
  if (v.id) return *v.id;
  return b.constant(v.constant->clone());
}

Value Ctx::wrap(ValueId v) const {
  Value out;
  out.id = v;
  if (v.valid()) out.type = b.type(v);
  return out;
}

Value Ctx::constant(Tensor t) {
  Value out;
  out.type = TensorType{t.dtype(), t.shape()};
  out.constant = std::make_shared<const Tensor>(std::move(t));
  return out;
}

Result<std::vector<int64_t>> Ctx::ints(const Value& v, const std::string& what) const {
  if (!v.readable())
    return unsupported(what, "a value known when the model is imported (a constant, or computed from shapes)",
                       "one computed from the graph's inputs");
  const Tensor& t = *v.constant;
  std::vector<int64_t> out;
  if (t.dtype() == DType::i64) {
    out.assign(t.span<int64_t>().begin(), t.span<int64_t>().end());
  } else if (t.dtype() == DType::i32) {
    for (int32_t x : t.span<int32_t>()) out.push_back(x);
  } else {
    return error(what, "int64 or int32 values", std::string(dtype_name(t.dtype())));
  }
  return out;
}

Result<double> Ctx::scalar(const Value& v, const std::string& what) const {
  if (!v.readable())
    return unsupported(what, "a value known when the model is imported", "one computed from the graph's inputs");
  if (v.constant->numel() != 1) return error(what, "one value", v.type.to_string());
  return graph::HostArray::from_tensor(*v.constant).data.at(0);
}

Result<int> Ctx::axis(int64_t a, int rank, const std::string& what) const {
  if (a < -rank || a >= std::max(rank, 1))
    return error(what, "an axis in [" + std::to_string(-rank) + ", " + std::to_string(rank) + ")", std::to_string(a));
  return int(a < 0 ? a + rank : a);
}

// ---- helpers ---------------------------------------------------------------------------------------

std::vector<int64_t> dims(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }
Shape shape_of(const std::vector<int64_t>& d) { return *Shape::make(d.data(), int(d.size())); }

Value to_shape(Ctx& c, const Value& v, const Shape& to) {
  if (v.type.shape == to) return v;
  return c.wrap(c.b.broadcast(c.id(v), dims(to)));
}

Value reshaped(Ctx& c, const Value& v, const std::vector<int64_t>& d) {
  if (dims(v.type.shape) == d) return v;
  return c.wrap(c.b.reshape(c.id(v), d));
}

// A scalar constant of `dtype`, broadcast to `shape`.
Value filled(Ctx& c, double v, DType dtype, const Shape& shape) {
  Tensor t(DType::f32, Shape{});
  t.span<float>()[0] = float(v);
  ValueId s = c.b.constant(std::move(t));
  if (dtype != DType::f32) s = c.b.cast(s, dtype);
  return c.wrap(c.b.broadcast(s, dims(shape)));
}

namespace {

Result<Shape> make_shape(const Ctx& c, const std::vector<int64_t>& d, const std::string& what) {
  Result<Shape> s = Shape::make(d.data(), int(d.size()));
  if (!s.is_ok()) return c.error(what, "a shape aspen holds (rank at most 8, extents >= 0)", s.status().message());
  return s;
}

// Numpy's multidirectional broadcast of shapes.
Result<Shape> broadcast_shape(const Ctx& c, const std::vector<Shape>& shapes) {
  int rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.rank());
  std::vector<int64_t> out(size_t(rank), 1);
  for (const Shape& s : shapes)
    for (int i = 0; i < s.rank(); ++i) {
      int64_t& o = out[size_t(rank - s.rank() + i)];
      const int64_t d = s[i];
      if (d == o || d == 1) continue;
      if (o != 1) {
        std::string found;
        for (const Shape& t : shapes) found += (found.empty() ? "" : " and ") + t.to_string();
        return c.error("inputs", "shapes that broadcast together", found);
      }
      o = d;
    }
  return make_shape(c, out, "broadcast shape");
}

Status same_dtype(const Ctx& c, const std::vector<Value>& in, size_t from = 0) {
  for (size_t k = from + 1; k < in.size(); ++k)
    if (in[k].present() && in[k].type.dtype != in[from].type.dtype)
      return c.error("input " + std::to_string(k),
                     std::string(dtype_name(in[from].type.dtype)) + " (input " + std::to_string(from) + "'s type)",
                     std::string(dtype_name(in[k].type.dtype)));
  return Status();
}

// The inputs broadcast to one shape.
Result<std::vector<Value>> broadcast_all(Ctx& c, const std::vector<Value>& in) {
  std::vector<Shape> shapes;
  for (const Value& v : in) shapes.push_back(v.type.shape);
  ASPEN_ASSIGN_OR_RETURN(const Shape to, broadcast_shape(c, shapes));
  std::vector<Value> out;
  for (const Value& v : in) out.push_back(to_shape(c, v, to));
  return out;
}

Status elementwise(Ctx& c, OpKind op, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  ASPEN_ASSIGN_OR_RETURN(std::vector<Value> x, broadcast_all(c, in));
  std::vector<ValueId> ids;
  for (const Value& v : x) ids.push_back(c.id(v));
  out = {c.wrap(c.b.op1(op, ids))};
  return c.b.status();
}

Converter unary(OpKind op) {
  return [op](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    out = {c.wrap(c.b.op1(op, {c.id(in[0])}))};
    return c.b.status();
  };
}
Converter binary(OpKind op) {
  return [op](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) { return elementwise(c, op, in, out); };
}
// not(op(a, b)): LessOrEqual, GreaterOrEqual.
Converter negated(OpKind op) {
  return [op](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    ASPEN_RETURN_IF_ERROR(elementwise(c, op, in, out));
    out = {c.wrap(c.b.op1(OpKind::logical_not, {c.id(out[0])}))};
    return c.b.status();
  };
}
// Max, Min, Sum, Mean: variadic, folded left.
Converter variadic(OpKind op, bool mean = false) {
  return [op, mean](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
    ASPEN_ASSIGN_OR_RETURN(std::vector<Value> x, broadcast_all(c, in));
    ValueId acc = c.id(x[0]);
    for (size_t k = 1; k < x.size(); ++k) acc = c.b.op1(op, {acc, c.id(x[k])});
    if (mean && x.size() > 1) acc = c.b.scale(acc, 1.0 / double(x.size()));
    out = {c.wrap(acc)};
    return c.b.status();
  };
}

// ---- elementwise conversions --------------------------------------------------------------------------

Status convert_identity(Ctx&, std::vector<Value>& in, std::vector<Value>& out) {
  out = {in[0]};
  return Status();
}

Status convert_reciprocal(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Value one = filled(c, 1.0, in[0].type.dtype, in[0].type.shape);
  out = {c.wrap(c.b.div(c.id(one), c.id(in[0])))};
  return c.b.status();
}

Status convert_abs(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const ValueId x = c.id(in[0]);
  out = {c.wrap(c.b.op1(OpKind::max, {x, c.b.neg(x)}))};
  return c.b.status();
}

Status convert_pow(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const double y, c.scalar(in[1], "input 'Y' (the exponent)"));
  if (in[0].type.dtype != DType::f32 && in[0].type.dtype != DType::bf16 && in[0].type.dtype != DType::f16)
    return c.unsupported("input 'X'", "a float type", std::string(dtype_name(in[0].type.dtype)));
  const ValueId x = c.id(in[0]);
  ValueId r;
  if (y == 1.0) {
    r = x;
  } else if (y == 2.0) {
    r = c.b.mul(x, x);
  } else if (y == 3.0) {
    r = c.b.mul(c.b.mul(x, x), x);
  } else if (y == 4.0) {
    const ValueId s = c.b.mul(x, x);
    r = c.b.mul(s, s);
  } else if (y == 0.5) {
    r = c.b.sqrt(x);
  } else if (y == -1.0) {
    r = c.id(filled(c, 1.0, in[0].type.dtype, in[0].type.shape));
    r = c.b.div(r, x);
  } else if (y == -0.5) {
    r = c.b.div(c.id(filled(c, 1.0, in[0].type.dtype, in[0].type.shape)), c.b.sqrt(x));
  } else if (y == 0.0) {
    r = c.id(filled(c, 1.0, in[0].type.dtype, in[0].type.shape));
  } else {
    r = c.b.exp(c.b.scale(c.b.op1(OpKind::log, {x}), y));
  }
  out = {c.wrap(r)};
  return c.b.status();
}

Status convert_gelu(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const io::OnnxAttribute* a = c.node.find("approximate");
  if (a && a->type != io::OnnxAttrType::s)
    return c.error("attribute 'approximate'", "type STRING", io::onnx_attr_type_name(a->type));
  const std::string approx = a ? a->s : std::string("none");
  if (approx != "none" && approx != "tanh")
    return c.error("attribute 'approximate'", "'none' or 'tanh'", "'" + approx + "'");
  out = {c.wrap(c.b.gelu(c.id(in[0]), approx == "tanh"))};
  return c.b.status();
}

Status convert_where(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (in[0].type.dtype != DType::boolean)
    return c.error("input 'condition'", "bool", std::string(dtype_name(in[0].type.dtype)));
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in, 1));
  ASPEN_ASSIGN_OR_RETURN(std::vector<Value> x, broadcast_all(c, in));
  out = {c.wrap(c.b.where(c.id(x[0]), c.id(x[1]), c.id(x[2])))};
  return c.b.status();
}

// Trilu(x [..., N, M][, k]) {upper = 1}: x where column - row >= k (upper) or <= k (lower), else 0; the
// causal masks exporters write (torch's scaled_dot_product_attention with is_causal). k must be known at
// import; the mask is a constant.
Status convert_trilu(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t upper, c.attr_i("upper", 1));
  int64_t k = 0;
  if (in.size() > 1 && in[1].present()) {
    ASPEN_ASSIGN_OR_RETURN(const double kd, c.scalar(in[1], "input 'k'"));
    k = int64_t(kd);
  }
  const std::vector<int64_t> d = dims(in[0].type.shape);
  if (d.size() < 2) return c.error("input 'input'", "a tensor of rank >= 2", in[0].type.to_string());
  const int64_t N = d[d.size() - 2], M = d[d.size() - 1];
  Tensor mask(DType::boolean, Shape{N, M});
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) m[i * M + j] = upper ? j - i >= k : j - i <= k;
  const ValueId cond = c.b.broadcast(c.b.constant(std::move(mask)), d);
  out = {c.wrap(c.b.where(cond, c.id(in[0]), c.id(filled(c, 0.0, in[0].type.dtype, in[0].type.shape))))};
  return c.b.status();
}

Status convert_clip(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ValueId x = c.id(in[0]);
  const TensorType t = in[0].type;
  for (size_t k = 1; k < 3; ++k) {
    if (k >= in.size() || !in[k].present()) continue;
    ASPEN_ASSIGN_OR_RETURN(const double bound, c.scalar(in[k], k == 1 ? "input 'min'" : "input 'max'"));
    x = c.b.op1(k == 1 ? OpKind::max : OpKind::min, {x, c.id(filled(c, bound, t.dtype, t.shape))});
  }
  out = {c.wrap(x)};
  return c.b.status();
}

Status convert_cast(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t to, c.attr_i("to"));
  const std::optional<DType> dt = dtype_of_onnx(int32_t(to));
  if (!dt) return c.unsupported("attribute 'to'", kAspenTypes, io::onnx_type_name(int32_t(to)));
  out = {in[0].type.dtype == *dt ? in[0] : c.wrap(c.b.cast(c.id(in[0]), *dt))};
  return c.b.status();
}

Status convert_cast_like(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const DType dt = in[1].type.dtype;
  out = {in[0].type.dtype == dt ? in[0] : c.wrap(c.b.cast(c.id(in[0]), dt))};
  return c.b.status();
}

// A known tensor's values broadcast (numpy rules) to `to`, as doubles.
std::vector<double> broadcast_values(const Tensor& t, const Shape& to) {
  const graph::HostArray a = graph::HostArray::from_tensor(t);
  const Shape& from = t.shape();
  std::vector<double> out(size_t(to.numel()));
  const int lead = to.rank() - from.rank();
  for (int64_t i = 0; i < to.numel(); ++i) {
    int64_t rem = i, src = 0;
    for (int d = to.rank() - 1; d >= 0; --d) {
      const int64_t coord = rem % to[d];
      rem /= to[d];
      const int fd = d - lead;
      if (fd >= 0 && from[fd] != 1) src += coord * from.stride(fd);
    }
    out[size_t(i)] = a.data[size_t(src)];
  }
  return out;
}

// Known operands of an op the IR has no op for (integer Div and Mod): computed here, with broadcasting.
template <class F>
Status known_binary(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, F f) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  ASPEN_ASSIGN_OR_RETURN(const Shape to, broadcast_shape(c, {in[0].type.shape, in[1].type.shape}));
  const std::vector<double> a = broadcast_values(*in[0].constant, to), b = broadcast_values(*in[1].constant, to);
  graph::HostArray y(TensorType{in[0].type.dtype, to});
  for (size_t i = 0; i < a.size(); ++i) {
    ASPEN_ASSIGN_OR_RETURN(y.data[i], f(a[i], b[i]));
  }
  out = {Ctx::constant(y.to_tensor())};
  return Status();
}

bool is_float_type(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Mod: fmod 0 takes the divisor's sign (Python's %; integers only, as ONNX requires), fmod 1 the
// dividend's (C's fmod). Known operands only (shape arithmetic).
Status convert_mod(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t fmod, c.attr_i("fmod", 0));
  if (!in[0].known() || !in[1].known())
    return c.unsupported("inputs", "values known when the model is imported", "ones computed from the graph's inputs");
  if (!fmod && is_float_type(in[0].type.dtype)) return c.error("attribute 'fmod'", "1 for float inputs", "0");
  return known_binary(c, in, out, [&](double a, double b) -> Result<double> {
    if (b == 0 && !fmod) return c.error("input 'B'", "no zero divisor", "0");
    double m = std::fmod(a, b);
    if (!fmod && m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
  });
}

// Div: the IR's div for float types; integers (shape arithmetic) truncate toward zero, known only.
Status convert_div(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (is_float_type(in[0].type.dtype)) return elementwise(c, OpKind::div, in, out);
  if (!in[0].known() || !in[1].known())
    return c.unsupported("inputs", "float types, or integers known when the model is imported",
                         std::string(dtype_name(in[0].type.dtype)) + " computed from the graph's inputs");
  return known_binary(c, in, out, [&](double a, double b) -> Result<double> {
    if (b == 0) return c.error("input 'B'", "no zero divisor", "0");
    return std::trunc(a / b);
  });
}

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

Tensor i64_tensor(const std::vector<int64_t>& v, bool scalar = false) {
  Tensor t(DType::i64, scalar ? Shape{} : Shape{int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.span<int64_t>().begin());
  return t;
}

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
Result<std::vector<int64_t>> axes_input(Ctx& c, std::vector<Value>& in, size_t k) {
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

Status gather_on(Ctx& c, std::vector<Value>& in, int axis, std::vector<Value>& out);  // Gather below

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
  if (in.size() > 1 && in[1].present()) {
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

// Gather(data, indices, axis). Known data and indices are gathered here (shape arithmetic, any dtype);
// otherwise the axis moves to the front, the rest flattens into rows of a [V, C] table, the IR's gather
// picks rows, and the result takes its shape back. Negative known indices count from the end; at run time
// an index outside [0, V) is the gather's error.
Status convert_gather(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  return gather_on(c, in, axis, out);
}

// Gather's work on a checked axis: in = {data, indices}.
Status gather_on(Ctx& c, std::vector<Value>& in, int axis, std::vector<Value>& out) {
  const int r = in[0].type.shape.rank();
  const std::vector<int64_t> d = dims(in[0].type.shape);
  const int64_t V = d[size_t(axis)];
  std::vector<int64_t> idx_dims = dims(in[1].type.shape);
  std::vector<int64_t> out_dims(d.begin(), d.begin() + axis);
  out_dims.insert(out_dims.end(), idx_dims.begin(), idx_dims.end());
  out_dims.insert(out_dims.end(), d.begin() + axis + 1, d.end());
  std::optional<std::vector<int64_t>> known_idx;
  if (in[1].known()) {
    ASPEN_ASSIGN_OR_RETURN(std::vector<int64_t> ix, c.ints(in[1], "input 'indices'"));
    for (int64_t& i : ix) {
      if (i < -V || i >= V)
        return c.error("input 'indices'", "indices in [" + std::to_string(-V) + ", " + std::to_string(V) + ")",
                       std::to_string(i));
      if (i < 0) i += V;
    }
    known_idx = std::move(ix);
  }
  if (in[0].known() && known_idx) {
    const Tensor& src = *in[0].constant;
    ASPEN_ASSIGN_OR_RETURN(const Shape os, make_shape(c, out_dims, "output"));
    Tensor t(src.dtype(), os);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; ++i) outer *= d[size_t(i)];
    for (int i = axis + 1; i < r; ++i) inner *= d[size_t(i)];
    const size_t row = size_t(inner) * size_t(dtype_size(src.dtype()));
    const char* s = static_cast<const char*>(src.raw());
    char* o = static_cast<char*>(t.raw());
    const size_t n = known_idx->size();
    for (int64_t p = 0; p < outer; ++p)
      for (size_t k = 0; k < n; ++k)
        std::memcpy(o + (size_t(p) * n + k) * row, s + (size_t(p) * size_t(V) + size_t((*known_idx)[k])) * row, row);
    out = {Ctx::constant(std::move(t))};
    return Status();
  }
  Value ids = in[1];
  if (known_idx) {
    Tensor t(DType::i64, in[1].type.shape);
    std::copy(known_idx->begin(), known_idx->end(), t.span<int64_t>().begin());
    ids = Ctx::constant(std::move(t));
  }
  if (ids.type.dtype != DType::i64 && ids.type.dtype != DType::i32)
    return c.error("input 'indices'", "int64 or int32", std::string(dtype_name(ids.type.dtype)));
  if (!known_idx) {  // negative indices count from the end: ids + V where ids < 0
    const ValueId i = c.id(ids);
    const TensorType t = c.b.type(i);
    Tensor v(t.dtype, Shape{});
    Tensor z(t.dtype, Shape{});
    if (t.dtype == DType::i64) {
      v.span<int64_t>()[0] = V;
    } else {
      v.span<int32_t>()[0] = int32_t(V);
    }
    const ValueId vb = c.b.broadcast(c.b.constant(std::move(v)), dims(t.shape));
    const ValueId zb = c.b.broadcast(c.b.constant(std::move(z)), dims(t.shape));
    ids = c.wrap(c.b.where(c.b.op1(OpKind::less, {i, zb}), c.b.add(i, vb), i));
  }
  Value x = in[0];
  const DType data_t = x.type.dtype;
  const bool narrow = data_t == DType::boolean || data_t == DType::u8;  // exact through f32
  if (data_t != DType::f32 && data_t != DType::bf16 && data_t != DType::f16 && !narrow) {
    // Integers (exact only as themselves): with known indices, the rows are slices of the data, joined;
    // runs of consecutive indices make one slice each.
    if (!known_idx || known_idx->size() > 4096)
      return c.unsupported("input 'data'", "a float, bool or u8 tensor, or integers with at most 4096 known indices",
                           std::string(dtype_name(data_t)) + " computed from the graph's inputs");
    std::vector<ValueId> pieces;
    for (size_t k = 0; k < known_idx->size();) {
      size_t e = k + 1;
      while (e < known_idx->size() && (*known_idx)[e] == (*known_idx)[e - 1] + 1) ++e;
      pieces.push_back(c.b.slice(c.id(x), axis, (*known_idx)[k], (*known_idx)[e - 1] + 1));
      k = e;
    }
    Value joined = pieces.empty()       ? c.wrap(c.b.slice(c.id(x), axis, 0, 0))
                   : pieces.size() == 1 ? c.wrap(pieces[0])
                                        : c.wrap(c.b.concat(pieces, axis));
    out = {reshaped(c, joined, out_dims)};
    return c.b.status();
  }
  if (narrow) x = c.wrap(c.b.cast(c.id(x), DType::f32));
  std::vector<int64_t> perm;
  if (axis != 0) {
    perm.push_back(axis);
    for (int i = 0; i < r; ++i)
      if (i != axis) perm.push_back(i);
    x = c.wrap(c.b.transpose(c.id(x), perm));
  }
  const int64_t C = V == 0 ? 0 : in[0].type.shape.numel() / V;
  x = reshaped(c, x, {V, C});
  if (ids.type.shape.rank() == 0) ids = reshaped(c, ids, {1});
  Value g = c.wrap(c.b.gather(c.id(x), c.id(ids)));
  // g is [indices..., C]: give it [indices..., rest...] then move the axis block back.
  std::vector<int64_t> moved = idx_dims;
  for (int i = 0; i < r; ++i)
    if (i != axis) moved.push_back(d[size_t(i)]);
  g = reshaped(c, g, moved);
  if (axis != 0) {
    const int q = int(idx_dims.size());
    std::vector<int64_t> back;  // out dims: rest[0..axis), indices, rest[axis..)
    for (int i = 0; i < axis; ++i) back.push_back(q + i);
    for (int i = 0; i < q; ++i) back.push_back(i);
    for (int i = axis; i < r - 1; ++i) back.push_back(q + i);
    g = c.wrap(c.b.transpose(c.id(g), back));
  }
  if (narrow) g = c.wrap(c.b.cast(c.id(g), data_t));
  out = {g};
  return c.b.status();
}

// GatherElements(data, indices) {axis} of known values: out[..., i, ...] = data[..., indices[..., i, ...], ...]
// on the axis (the shape of indices; negative indices count from the end).
Status convert_gather_elements(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (!in[0].known() || !in[1].known())
    return c.unsupported("inputs", "values known when the model is imported", "ones computed from the graph's inputs");
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  const Shape& ds = in[0].type.shape;
  const Shape& is = in[1].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, ds.rank(), "attribute 'axis'"));
  if (is.rank() != ds.rank())
    return c.error("input 'indices'", "data's rank " + std::to_string(ds.rank()), is.to_string());
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> idx, c.ints(in[1], "input 'indices'"));
  const graph::HostArray x = graph::HostArray::from_tensor(*in[0].constant);
  graph::HostArray y(TensorType{in[0].type.dtype, is});
  for (int64_t i = 0; i < is.numel(); ++i) {
    int64_t rem = i, at = 0;
    for (int d = is.rank() - 1; d >= 0; --d) {
      int64_t coord = rem % is[d];
      rem /= is[d];
      if (d == axis) {
        coord = idx[size_t(i)];
        if (coord < -ds[d] || coord >= ds[d])
          return c.error("input 'indices'",
                         "indices in [" + std::to_string(-ds[d]) + ", " + std::to_string(ds[d]) + ")",
                         std::to_string(coord));
        if (coord < 0) coord += ds[d];
      } else if (coord >= ds[d]) {
        return c.error("input 'indices'", "a shape within data's " + ds.to_string() + " off the axis", is.to_string());
      }
      at += coord * ds.stride(d);
    }
    y.data[size_t(i)] = x.data[size_t(at)];
  }
  out = {Ctx::constant(y.to_tensor())};
  return Status();
}

// GatherND(data, indices) {batch_dims = 0} with known indices [..., k]: each index tuple names a row of
// data seen as [d0 ... d(k-1), rest], which Gather picks from data flattened to those rows.
Status convert_gather_nd(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t batch_dims, c.attr_i("batch_dims", 0));
  if (batch_dims != 0) return c.unsupported("attribute 'batch_dims'", "0", std::to_string(batch_dims));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> idx, c.ints(in[1], "input 'indices'"));
  const std::vector<int64_t> d = dims(in[0].type.shape), id = dims(in[1].type.shape);
  if (id.empty()) return c.error("input 'indices'", "rank 1 or more", "rank 0");
  const int64_t k = id.back();
  if (k < 1 || k > int64_t(d.size()))
    return c.error("input 'indices'", "a last extent in [1, data's rank]", std::to_string(k));
  int64_t rows = 1, rest = 1;
  for (int64_t i = 0; i < int64_t(d.size()); ++i) (i < k ? rows : rest) *= d[size_t(i)];
  std::vector<int64_t> flat;
  for (size_t t = 0; t + size_t(k) <= idx.size(); t += size_t(k)) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t v = idx[t + size_t(j)];
      const int64_t dim = d[size_t(j)];
      if (v < -dim || v >= dim)
        return c.error("input 'indices'", "indices in [-d, d) of each indexed axis", std::to_string(v));
      row = row * dim + (v < 0 ? v + dim : v);
    }
    flat.push_back(row);
  }
  std::vector<int64_t> data_rows = {rows};
  data_rows.insert(data_rows.end(), d.begin() + k, d.end());
  Value table = reshaped(c, in[0], data_rows);
  std::vector<Value> g_in{table, Ctx::constant(i64_tensor(flat))};
  std::vector<int64_t> out_d(id.begin(), id.end() - 1);
  out_d.insert(out_d.end(), d.begin() + k, d.end());
  ASPEN_RETURN_IF_ERROR(convert_gather(c, g_in, out));
  out = {reshaped(c, out[0], out_d)};
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
  if (!in[0].known())
    return c.unsupported("input 'x'", "a value known when the model is imported",
                         "one computed from the graph's inputs");
  const Shape& s = in[0].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(int64_t(a), s.rank(), "input 'axis'"));
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

// ---- reductions, normalizations -----------------------------------------------------------------------

// The axes of a reduction: an input from opset 18 (ReduceSum: 13), an attribute before.
Result<std::vector<int64_t>> reduce_axes(Ctx& c, std::vector<Value>& in, int64_t input_from, bool& all) {
  std::vector<int64_t> axes;
  if (c.opset >= input_from) {
    if (in.size() > 1 && in[1].present()) {
      ASPEN_ASSIGN_OR_RETURN(axes, c.ints(in[1], "input 'axes'"));
    }
  } else {
    ASPEN_ASSIGN_OR_RETURN(axes, c.attr_ints("axes", std::vector<int64_t>{}));
  }
  ASPEN_ASSIGN_OR_RETURN(const int64_t noop, c.attr_i("noop_with_empty_axes", 0));
  all = axes.empty() && !noop;
  const int r = in[0].type.shape.rank();
  std::vector<int64_t> out;
  if (all)
    for (int i = 0; i < r; ++i) out.push_back(i);
  for (int64_t a : axes) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(a, r, "axes"));
    out.push_back(ax);
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) return c.error("axes", "each axis once", "a repeat");
  return out;
}

// GlobalAveragePool(X [N, C, D1, ...]): the mean over D1, ... (kept as 1s).
Status convert_global_average_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape& s = in[0].type.shape;
  if (s.rank() < 2) return c.error("input 'X'", "rank 2 or more ([N, C, ...])", in[0].type.to_string());
  if (s.rank() == 2) {
    out = {in[0]};
    return Status();
  }
  std::vector<int64_t> axes;
  int64_t n = 1;
  for (int i = 2; i < s.rank(); ++i) {
    axes.push_back(i);
    n *= s[i];
  }
  out = {c.wrap(c.b.scale(c.b.reduce_sum(c.id(in[0]), axes, true), n ? 1.0 / double(n) : NAN))};
  return c.b.status();
}

// ReduceProd of known values (shape arithmetic: element counts), axes an attribute before opset 18.
Status convert_reduce_prod(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (!in[0].known())
    return c.unsupported("input 'data'", "a value known when the model is imported",
                         "one computed from the graph's inputs");
  std::vector<int64_t> axes;
  if (c.opset >= 18) {
    if (in.size() > 1 && in[1].present()) {
      ASPEN_ASSIGN_OR_RETURN(axes, c.ints(in[1], "input 'axes'"));
    }
  } else {
    ASPEN_ASSIGN_OR_RETURN(axes, c.attr_ints("axes", std::vector<int64_t>{}));
  }
  ASPEN_ASSIGN_OR_RETURN(const int64_t keep, c.attr_i("keepdims", 1));
  const Shape& s = in[0].type.shape;
  std::vector<bool> reduced(size_t(s.rank()), axes.empty());
  for (int64_t a : axes) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(a, s.rank(), "axes"));
    reduced[size_t(ax)] = true;
  }
  std::vector<int64_t> od;
  for (int i = 0; i < s.rank(); ++i)
    if (!reduced[size_t(i)])
      od.push_back(s[i]);
    else if (keep)
      od.push_back(1);
  ASPEN_ASSIGN_OR_RETURN(const Shape os, make_shape(c, od, "output"));
  const graph::HostArray x = graph::HostArray::from_tensor(*in[0].constant);
  graph::HostArray y(TensorType{in[0].type.dtype, os});
  std::fill(y.data.begin(), y.data.end(), 1.0);
  for (int64_t i = 0; i < s.numel(); ++i) {
    int64_t rem = i, at = 0, mul = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      const int64_t coord = rem % s[d];
      rem /= s[d];
      if (!reduced[size_t(d)]) {
        at += coord * mul;
        mul *= s[d];
      }
    }
    y.data[size_t(at)] *= x.data[size_t(i)];
  }
  out = {Ctx::constant(y.to_tensor())};
  return Status();
}

enum class Reduce { sum, mean, max, min };
Converter reduction(Reduce kind, int64_t input_from) {
  return [kind, input_from](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) -> Status {
    bool all = false;
    ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, reduce_axes(c, in, input_from, all));
    ASPEN_ASSIGN_OR_RETURN(const int64_t keep, c.attr_i("keepdims", 1));
    if (axes.empty()) {
      out = {in[0]};
      return Status();
    }
    ValueId x = c.id(in[0]);
    if (kind == Reduce::min) x = c.b.neg(x);
    ValueId y = kind == Reduce::max || kind == Reduce::min ? c.b.reduce_max(x, axes, keep != 0)
                                                           : c.b.reduce_sum(x, axes, keep != 0);
    if (kind == Reduce::min) y = c.b.neg(y);
    if (kind == Reduce::mean) {
      int64_t n = 1;
      for (int64_t a : axes) n *= in[0].type.shape[int(a)];
      y = c.b.scale(y, n ? 1.0 / double(n) : NAN);
    }
    out = {c.wrap(y)};
    return c.b.status();
  };
}

// Moves `axis` to the last position and back around `body` (softmax over an inner axis).
template <class F>
Status on_last_axis(Ctx& c, const Value& x, int axis, std::vector<Value>& out, F body) {
  const int r = x.type.shape.rank();
  if (axis == r - 1) {
    out = {c.wrap(body(c.id(x)))};
    return c.b.status();
  }
  std::vector<int64_t> perm;
  for (int i = 0; i < r; ++i)
    if (i != axis) perm.push_back(i);
  perm.push_back(axis);
  std::vector<int64_t> inverse(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) inverse[size_t(perm[size_t(i)])] = i;
  const ValueId y = body(c.b.transpose(c.id(x), perm));
  out = {c.wrap(c.b.transpose(y, inverse))};
  return c.b.status();
}

Status convert_softmax(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", -1));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  return on_last_axis(c, in[0], axis, out, [&](ValueId x) { return c.b.op1(OpKind::softmax, {x}); });
}

Status convert_log_softmax_axis(Ctx& c, const Value& x0, int axis, std::vector<Value>& out) {
  return on_last_axis(c, x0, axis, out, [&](ValueId x) {
    const std::vector<int64_t> d = dims(c.b.type(x).shape);
    const int64_t last = int64_t(d.size()) - 1;
    const ValueId z = c.b.sub(x, c.b.broadcast(c.b.reduce_max(x, {last}, true), d));
    const ValueId lse = c.b.op1(OpKind::log, {c.b.reduce_sum(c.b.exp(z), {last}, true)});
    return c.b.sub(z, c.b.broadcast(lse, d));
  });
}

Status convert_log_softmax(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", -1));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  return convert_log_softmax_axis(c, in[0], axis, out);
}

// SoftmaxCrossEntropyLoss(scores [N, C, d...], labels [N, d...]) {reduction, ignore_index}: what
// torch.onnx writes for torch.nn.functional.cross_entropy, often a model's own loss output (the Python
// package trains a module whose forward returns (output, loss)). The class axis (1) moves last and the
// cross_entropy op gives the mean over the labels not ignored (reduction "mean", which trains) and each
// row's loss (0 where ignored: "none", and "sum" over them; neither trains, the op's gradient being the
// mean's). The optional second output is log_softmax(scores) over the class axis. Class weights are
// refused by name.
Status convert_softmax_cross_entropy(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::string reduction, c.attr_s("reduction", std::string("mean")));
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return c.error("attribute 'reduction'", "mean, sum or none", "'" + reduction + "'");
  if (in.size() > 2 && in[2].present()) return c.unsupported("input 'weights'", "none (no class weights)", "one");
  // Without the attribute no label is ignored: class ids are never this.
  ASPEN_ASSIGN_OR_RETURN(const int64_t ignore, c.attr_i("ignore_index", std::numeric_limits<int32_t>::min()));
  if (ignore < std::numeric_limits<int32_t>::min() || ignore > std::numeric_limits<int32_t>::max())
    return c.unsupported("attribute 'ignore_index'", "a value in the int32 range", std::to_string(ignore));
  const std::vector<int64_t> d = dims(in[0].type.shape), l = dims(in[1].type.shape);
  if (d.size() < 2 || l.size() != d.size() - 1 || l[0] != d[0] || !std::equal(l.begin() + 1, l.end(), d.begin() + 2))
    return c.error("inputs 'scores' and 'labels'", "scores [N, C, d...] and labels [N, d...]",
                   in[0].type.to_string() + " and " + in[1].type.to_string());
  if (in[1].type.dtype != DType::i64 && in[1].type.dtype != DType::i32)
    return c.error("input 'labels'", "int64 or int32 class ids", in[1].type.to_string());
  const int64_t C = d[1], R = C ? in[0].type.shape.numel() / C : 0;
  ValueId scores = c.id(in[0]);
  if (d.size() > 2) {  // [N, C, d...] -> [N, d..., C]
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < int64_t(d.size()); ++i) perm.push_back(i);
    perm.push_back(1);
    scores = c.b.transpose(scores, perm);
  }
  std::vector<ValueId> ce =
      c.b.op(OpKind::cross_entropy, {c.b.reshape(scores, {R, C}), c.id(reshaped(c, in[1], {R}))},
             {{"ignore_index", ignore}});
  ASPEN_RETURN_IF_ERROR(c.b.status());
  Value loss = c.wrap(ce[0]);
  if (reduction == "none") loss = reshaped(c, c.wrap(ce[1]), l);
  if (reduction == "sum") loss = c.wrap(c.b.reduce_sum(ce[1], {0}));
  std::vector<Value> log_prob;
  ASPEN_RETURN_IF_ERROR(convert_log_softmax_axis(c, in[0], 1, log_prob));
  out = {loss, log_prob[0]};
  return c.b.status();
}

Status convert_layer_norm(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", -1));
  ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-5f));
  const std::vector<int64_t> d = dims(in[0].type.shape);
  const int r = int(d.size());
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, r, "attribute 'axis'"));
  int64_t inner = 1;
  for (int i = axis; i < r; ++i) inner *= d[size_t(i)];
  std::vector<int64_t> flat(d.begin(), d.begin() + axis);
  flat.push_back(inner);
  const DType dt = in[0].type.dtype;
  const Value scale = to_shape(c, in[1], shape_of(std::vector<int64_t>(d.begin() + axis, d.end())));
  Value bias = in.size() > 2 && in[2].present()
                   ? to_shape(c, in[2], shape_of(std::vector<int64_t>(d.begin() + axis, d.end())))
                   : filled(c, 0.0, dt, shape_of({inner}));
  std::vector<ValueId> y =
      c.b.op(OpKind::layernorm,
             {c.id(reshaped(c, in[0], flat)), c.id(reshaped(c, scale, {inner})), c.id(reshaped(c, bias, {inner}))},
             {{"eps", double(eps)}});
  if (!c.b.status().is_ok()) return c.b.status();
  std::vector<int64_t> stat(d.begin(), d.begin() + axis);
  stat.resize(size_t(r), 1);  // Mean and InvStdDev keep the normalized axes as 1
  out = {reshaped(c, c.wrap(y[0]), d), reshaped(c, c.wrap(y[1]), stat), reshaped(c, c.wrap(y[2]), stat)};
  return c.b.status();
}

Status convert_dropout(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (in.size() > 2 && in[2].present()) {
    ASPEN_ASSIGN_OR_RETURN(const double training, c.scalar(in[2], "input 'training_mode'"));
    if (training != 0) return c.unsupported("input 'training_mode'", "false (dropout in inference)", "true");
  }
  out = {in[0]};
  if (c.node.outputs.size() > 1) {  // the mask: all kept
    Tensor m(DType::boolean, in[0].type.shape);
    for (bool& v : m.span<bool>()) v = true;
    out.push_back(Ctx::constant(std::move(m)));
  }
  return Status();
}

}  // namespace

// ---- the table ----------------------------------------------------------------------------------------

const std::map<std::string, OpConverter>& converters() {
  static const std::map<std::string, OpConverter> table = [] {
    std::map<std::string, OpConverter> t;
    auto add = [&](const char* name, Converter f, int lo, int hi) { t[name] = OpConverter{std::move(f), lo, hi}; };
    auto add_unfolded = [&](const char* name, Converter f, int lo, int hi) {
      t[name] = OpConverter{std::move(f), lo, hi, /*foldable=*/false};
    };
    add("Identity", convert_identity, 1, 1);
    add("Neg", unary(OpKind::neg), 1, 1);
    add("Exp", unary(OpKind::exp), 1, 1);
    add("Log", unary(OpKind::log), 1, 1);
    add("Tanh", unary(OpKind::tanh), 1, 1);
    add("Sqrt", unary(OpKind::sqrt), 1, 1);
    add("Relu", unary(OpKind::relu), 1, 1);
    add("Sigmoid", unary(OpKind::sigmoid), 1, 1);
    add("Erf", unary(OpKind::erf), 1, 1);
    add("Not", unary(OpKind::logical_not), 1, 1);
    add("IsNaN", unary(OpKind::is_nan), 1, 1);
    add("Reciprocal", convert_reciprocal, 1, 1);
    add("Abs", convert_abs, 1, 1);
    add("GlobalAveragePool", convert_global_average_pool, 1, 1);
    add("ReduceProd", convert_reduce_prod, 1, 2);
    add("Gelu", convert_gelu, 1, 1);
    add("Add", binary(OpKind::add), 2, 2);
    add("Sub", binary(OpKind::sub), 2, 2);
    add("Mul", binary(OpKind::mul), 2, 2);
    add("Div", convert_div, 2, 2);
    add("Pow", convert_pow, 2, 2);
    add("Equal", binary(OpKind::equal), 2, 2);
    add("Less", binary(OpKind::less), 2, 2);
    add("Greater", binary(OpKind::greater), 2, 2);
    add("LessOrEqual", negated(OpKind::greater), 2, 2);
    add("GreaterOrEqual", negated(OpKind::less), 2, 2);
    add("And", binary(OpKind::logical_and), 2, 2);
    add("Or", binary(OpKind::logical_or), 2, 2);
    add("Max", variadic(OpKind::max), 1, -1);
    add("Min", variadic(OpKind::min), 1, -1);
    add("Sum", variadic(OpKind::add), 1, -1);
    add("Mean", variadic(OpKind::add, true), 1, -1);
    add("Where", convert_where, 3, 3);
    add("Trilu", convert_trilu, 1, 2);
    add("Clip", convert_clip, 1, 3);
    add("Cast", convert_cast, 1, 1);
    add("CastLike", convert_cast_like, 2, 2);
    add("MatMul", convert_matmul, 2, 2);
    add("Gemm", convert_gemm, 2, 3);
    add("Shape", convert_shape, 1, 1);
    add("Size", convert_size, 1, 1);
    add("Constant", convert_constant, 0, 0);
    add("ConstantOfShape", convert_constant_of_shape, 1, 1);
    add("Range", convert_range, 3, 3);
    add("Reshape", convert_reshape, 2, 2);
    add("Flatten", convert_flatten, 1, 1);
    add("Unsqueeze", convert_unsqueeze, 2, 2);
    add("Squeeze", convert_squeeze, 1, 2);
    add("Transpose", convert_transpose, 1, 1);
    add("Concat", convert_concat, 1, -1);
    add("Slice", convert_slice, 3, 5);
    add("Split", convert_split, 1, 2);
    add("Expand", convert_expand, 2, 2);
    add("Gather", convert_gather, 2, 2);
    add("GatherND", convert_gather_nd, 2, 2);
    add("GatherElements", convert_gather_elements, 2, 2);
    add("Mod", convert_mod, 2, 2);
    add_unfolded("SplitToSequence", convert_split_to_sequence, 1, 2);  // sequences are never folded
    add_unfolded("SequenceAt", convert_sequence_at, 2, 2);
    add("CumSum", convert_cumsum, 2, 2);
    add("ReduceSum", reduction(Reduce::sum, 13), 1, 2);
    add("ReduceMean", reduction(Reduce::mean, 18), 1, 2);
    add("ReduceMax", reduction(Reduce::max, 18), 1, 2);
    add("ReduceMin", reduction(Reduce::min, 18), 1, 2);
    add("Softmax", convert_softmax, 1, 1);
    add("SoftmaxCrossEntropyLoss", convert_softmax_cross_entropy, 2, 3);
    add("LogSoftmax", convert_log_softmax, 1, 1);
    add("LayerNormalization", convert_layer_norm, 2, 3);
    add("Dropout", convert_dropout, 1, 3);
    return t;
  }();
  return table;
}

const OpConverter* find_converter(const std::string& domain, const std::string& op_type) {
  const std::map<std::string, OpConverter>* table = domain.empty()              ? &converters()
                                                    : domain == kMicrosoftDomain ? &microsoft_converters()
                                                                                 : nullptr;
  if (!table) return nullptr;
  auto it = table->find(op_type);
  return it == table->end() ? nullptr : &it->second;
}

}  // namespace aspen::models::onnx
