// models/onnx_ops_index.cc: the ONNX importer's indexing conversions: Gather, GatherElements, GatherND and
// ScatterElements / Scatter / ScatterND (the converter table and the shared helpers: models/onnx_ops.h,
// onnx_ops.cc).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>

#include "graph/interpreter.h"
#include "models/onnx_import.h"
#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

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
  if (!is_float(data_t) && !narrow) {
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

namespace {

// Gather(data, indices, axis). Known data and indices are gathered here (shape arithmetic, any dtype);
// otherwise the axis moves to the front, the rest flattens into rows of a [V, C] table, the IR's gather
// picks rows, and the result takes its shape back. Negative known indices count from the end; at run time
// an index outside [0, V) is the gather's error.
Status convert_gather(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, in[0].type.shape.rank(), "attribute 'axis'"));
  return gather_on(c, in, axis, out);
}


// GatherElements(data, indices) {axis} of known values: out[..., i, ...] = data[..., indices[..., i, ...], ...]
// on the axis (the shape of indices; negative indices count from the end).
Status convert_gather_elements(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  const Shape& ds = in[0].type.shape;
  const Shape& is = in[1].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, ds.rank(), "attribute 'axis'"));
  if (is.rank() != ds.rank())
    return c.error("input 'indices'", "data's rank " + std::to_string(ds.rank()), is.to_string());
  if (!in[0].known() || !in[1].known()) {
    // On computed values (RoBERTa gathers its token types by computed position ids): data flattened to a
    // table of one-element rows, read at base + index * stride, where base holds every coordinate but the
    // axis' (known at import) and a negative index counts from the end.
    for (int d = 0; d < is.rank(); ++d)
      if (d != axis && is[d] > ds[d])
        return c.error("input 'indices'", "a shape within data's " + ds.to_string() + " off the axis", is.to_string());
    if (in[1].type.dtype != DType::i64 && in[1].type.dtype != DType::i32)
      return c.error("input 'indices'", "int64 or int32 indices", in[1].type.to_string());
    if (ds.numel() >= (int64_t(1) << 31))
      return c.unsupported("input 'data'", "fewer than 2^31 elements", ds.to_string());
    Tensor base(DType::i64, is);
    for (int64_t i = 0; i < is.numel(); ++i) {
      int64_t rem = i, at = 0;
      for (int d = is.rank() - 1; d >= 0; --d) {
        const int64_t coord = rem % is[d];
        rem /= is[d];
        if (d != axis) at += coord * ds.stride(d);
      }
      base.span<int64_t>()[size_t(i)] = at;
    }
    const DType it = in[1].type.dtype;
    ValueId idx = c.id(in[1]);
    const int64_t n = ds[axis];
    idx = c.b.where(c.b.op1(OpKind::less, {idx, c.id(filled(c, 0.0, it, is))}),
                    c.b.add(idx, c.id(filled(c, double(n), it, is))), idx);
    ValueId flat = c.b.add(c.b.mul(idx, c.id(filled(c, double(ds.stride(axis)), it, is))),
                           it == DType::i64 ? c.b.constant(std::move(base)) : c.b.cast(c.b.constant(std::move(base)), it));
    ValueId table = c.id(reshaped(c, in[0], {ds.numel(), 1}));
    const DType dt = in[0].type.dtype;
    const bool integer = !is_float(dt);
    if (integer) {  // the gather moves float rows: integers go through f32, exact below 2^24 (checked)
      bool small = in[0].readable();
      if (small) {
        const graph::HostArray h = graph::HostArray::from_tensor(*in[0].constant);
        for (double v : h.data) small = small && std::fabs(v) < double(int64_t(1) << 24);
      }
      if (!small)
        return c.unsupported("input 'data'", "float data, or known integers below 2^24 in magnitude",
                             in[0].type.to_string() + (in[0].readable() ? " with larger values" : " computed from the inputs"));
      table = c.b.cast(table, DType::f32);
    }
    ValueId y = c.b.gather(table, flat);
    if (integer) y = c.b.cast(y, dt);
    out = {reshaped(c, c.wrap(y), dims(is))};
    return c.b.status();
  }
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

// GatherND's and ScatterND's index tuples (k values each, negatives from the end) as rows of data's axes
// [first, first + k) flattened, each checked against its axis.
Result<std::vector<int64_t>> tuple_rows(const Ctx& c, const std::vector<int64_t>& idx, const std::vector<int64_t>& d,
                                        int64_t first, int64_t k) {
  std::vector<int64_t> rows;
  for (size_t t = 0; t + size_t(k) <= idx.size(); t += size_t(k)) {
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = idx[t + size_t(j)], n = d[size_t(first + j)];
      if (v < -n || v >= n)
        return c.error("input 'indices'", "indices in [-d, d) of each indexed axis", std::to_string(v));
      row = row * n + (v < 0 ? v + n : v);
    }
    rows.push_back(row);
  }
  return rows;
}

// GatherND(data, indices) {batch_dims = b} with known indices [B..., ..., k] (B the first b axes of both):
// each index tuple names a row of its batch's data seen as [d(b) ... d(b+k-1), rest]; with the batches
// numbered in front, Gather picks every tuple's row from data flattened to [ΠB · Πd, rest].
Status convert_gather_nd(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t b, c.attr_i("batch_dims", 0));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> idx, c.ints(in[1], "input 'indices'"));
  const std::vector<int64_t> d = dims(in[0].type.shape), id = dims(in[1].type.shape);
  if (id.empty()) return c.error("input 'indices'", "rank 1 or more", "rank 0");
  if (b < 0 || b >= int64_t(id.size()) || b >= int64_t(d.size()) ||
      !std::equal(d.begin(), d.begin() + b, id.begin()))
    return c.error("attribute 'batch_dims'", "b below both ranks, data's and indices' first b extents equal",
                   std::to_string(b) + " with data " + in[0].type.to_string() + ", indices " + in[1].type.to_string());
  const int64_t k = id.back();
  if (k < 1 || b + k > int64_t(d.size()))
    return c.error("input 'indices'", "a last extent in [1, data's rank - batch_dims]", std::to_string(k));
  int64_t batches = 1, rows = 1;
  for (int64_t i = 0; i < b; ++i) batches *= d[size_t(i)];
  for (int64_t i = b; i < b + k; ++i) rows *= d[size_t(i)];
  ASPEN_ASSIGN_OR_RETURN(std::vector<int64_t> flat, tuple_rows(c, idx, d, b, k));
  const size_t per_batch = std::max<size_t>(1, batches == 0 ? 1 : flat.size() / size_t(batches));
  for (size_t t = 0; t < flat.size(); ++t) flat[t] += int64_t(t / per_batch) * rows;
  std::vector<int64_t> data_rows = {batches * rows};
  data_rows.insert(data_rows.end(), d.begin() + b + k, d.end());
  Value table = reshaped(c, in[0], data_rows);
  std::vector<Value> g_in{table, Ctx::constant(i64_tensor(flat))};
  std::vector<int64_t> out_d(id.begin(), id.end() - 1);
  out_d.insert(out_d.end(), d.begin() + b + k, d.end());
  ASPEN_RETURN_IF_ERROR(convert_gather(c, g_in, out));
  out = {reshaped(c, out[0], out_d)};
  return c.b.status();
}

// NOTE [scatter of known indices]: ScatterElements, Scatter and ScatterND with indices known at import
// (data and updates may be computed). Data is seen as rows [rows, R] (R the trailing extent each index moves
// whole: 1 for ScatterElements, the indexed axes' rest for ScatterND), updates as rows [U, R], and update u
// aims at row target[u]. Without a reduction one gather picks, for every output row, its own data row or
// the last update aimed at it, from concat(data, updates). With one (add, mul, max, min), round k gathers
// each row's k-th update (or the reduction's identity, a last row) and combines it into the result, for as
// many rounds as a row has updates. Every piece is differentiable: autodiff trains data and updates.
Status scatter_rows(Ctx& c, const Value& data, const Value& updates, const std::vector<int64_t>& target,
                    int64_t rows, int64_t R, const std::string& reduction, std::vector<Value>& out) {
  const TensorType dt = data.type;
  if (updates.type.dtype != dt.dtype)
    return c.error("input 'updates'", std::string(dtype_name(dt.dtype)) + " (data's dtype)", updates.type.to_string());
  const int64_t U = int64_t(target.size());
  if (rows + U + 1 >= (int64_t(1) << 31))
    return c.unsupported("inputs 'data' and 'updates'", "fewer than 2^31 rows together", std::to_string(rows + U));
  const ValueId d = c.id(reshaped(c, data, {rows, R})), u = c.id(reshaped(c, updates, {U, R}));
  auto index = [&](const std::vector<int32_t>& v) {
    Tensor t(DType::i32, Shape{rows});
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return c.b.constant(std::move(t));
  };
  ValueId y;
  if (reduction == "none") {
    std::vector<int32_t> src(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) src[size_t(r)] = int32_t(r);
    for (int64_t k = 0; k < U; ++k) src[size_t(target[size_t(k)])] = int32_t(rows + k);
    y = c.b.gather(c.b.concat({d, u}, 0), index(src));
  } else {
    double identity = 0.0;
    OpKind combine = OpKind::add;
    if (reduction == "mul") identity = 1.0, combine = OpKind::mul;
    else if (reduction == "max") identity = -std::numeric_limits<double>::infinity(), combine = OpKind::max;
    else if (reduction == "min") identity = std::numeric_limits<double>::infinity(), combine = OpKind::min;
    else if (reduction != "add")
      return c.error("attribute 'reduction'", "none, add, mul, max or min", "'" + reduction + "'");
    std::vector<std::vector<int32_t>> rounds;
    std::vector<int64_t> seen(static_cast<size_t>(rows), 0);
    for (int64_t k = 0; k < U; ++k) {
      const int64_t t = target[size_t(k)], round = seen[size_t(t)]++;
      if (round == int64_t(rounds.size())) rounds.emplace_back(static_cast<size_t>(rows), int32_t(U));
      rounds[size_t(round)][size_t(t)] = int32_t(k);
    }
    const ValueId table = c.b.concat({u, c.id(filled(c, identity, dt.dtype, Shape{1, R}))}, 0);
    y = d;
    for (const std::vector<int32_t>& src : rounds) y = c.b.op1(combine, {y, c.b.gather(table, index(src))});
  }
  out = {reshaped(c, c.wrap(y), dims(dt.shape))};
  return c.b.status();
}

// ScatterElements(data, indices, updates) {axis = 0, reduction = none} (and Scatter, its older name):
// indices and updates of one shape; update p goes to data's position p with its axis coordinate replaced by
// indices[p] (negative: from the end). NOTE [scatter of known indices].
Status convert_scatter_elements(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  ASPEN_ASSIGN_OR_RETURN(const std::string reduction, c.attr_s("reduction", std::string("none")));
  const std::vector<int64_t> d = dims(in[0].type.shape), id = dims(in[1].type.shape);
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, int(d.size()), "attribute 'axis'"));
  if (id.size() != d.size() || in[2].type.shape != in[1].type.shape)
    return c.error("inputs 'indices' and 'updates'", "one shape, of data's rank",
                   in[1].type.to_string() + " and " + in[2].type.to_string());
  for (size_t i = 0; i < d.size(); ++i)
    if (id[i] > d[i]) return c.error("input 'indices'", "extents at most data's " + in[0].type.to_string(), in[1].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> idx, c.ints(in[1], "input 'indices'"));
  std::vector<int64_t> target(idx.size()), coord(d.size());
  for (size_t p = 0; p < idx.size(); ++p) {
    int64_t rest = int64_t(p);
    for (size_t j = d.size(); j-- > 0;) coord[j] = rest % id[j], rest /= id[j];
    int64_t v = idx[p];
    const int64_t n = d[size_t(axis)];
    if (v < -n || v >= n) return c.error("input 'indices'", "indices in [-d, d) of the axis", std::to_string(v));
    coord[size_t(axis)] = v < 0 ? v + n : v;
    int64_t flat = 0;
    for (size_t j = 0; j < d.size(); ++j) flat = flat * d[j] + coord[j];
    target[p] = flat;
  }
  return scatter_rows(c, in[0], in[2], target, in[0].type.shape.numel(), 1, reduction, out);
}

// ScatterND(data, indices [..., k], updates [..., data's axes from k]) {reduction = none}: each index tuple
// names a slice of data, replaced by (or combined with) its update slice. NOTE [scatter of known indices].
Status convert_scatter_nd(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::string reduction, c.attr_s("reduction", std::string("none")));
  const std::vector<int64_t> d = dims(in[0].type.shape), id = dims(in[1].type.shape);
  if (id.empty()) return c.error("input 'indices'", "rank 1 or more", "rank 0");
  const int64_t k = id.back();
  if (k < 1 || k > int64_t(d.size()))
    return c.error("input 'indices'", "a last extent in [1, data's rank]", std::to_string(k));
  std::vector<int64_t> ud(id.begin(), id.end() - 1);
  ud.insert(ud.end(), d.begin() + k, d.end());
  if (dims(in[2].type.shape) != ud)
    return c.error("input 'updates'", "indices' shape but its last, then data's from axis " + std::to_string(k),
                   in[2].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> idx, c.ints(in[1], "input 'indices'"));
  int64_t rows = 1, R = 1;
  for (int64_t i = 0; i < int64_t(d.size()); ++i) (i < k ? rows : R) *= d[size_t(i)];
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> target, tuple_rows(c, idx, d, 0, k));
  return scatter_rows(c, in[0], in[2], target, rows, R, reduction, out);
}

}  // namespace

void add_index_converters(ConverterTable& t) {
  add_converter(t, "Gather", convert_gather, 2, 2);
  add_converter(t, "GatherND", convert_gather_nd, 2, 2);
  add_converter(t, "GatherElements", convert_gather_elements, 2, 2);
  add_converter(t, "ScatterElements", convert_scatter_elements, 3, 3);
  add_converter(t, "Scatter", convert_scatter_elements, 3, 3);
  add_converter(t, "ScatterND", convert_scatter_nd, 3, 3);
}

}  // namespace aspen::models::onnx
