// graph/ops_shape.cc: ops that move data without changing values, and
// indexing.
//
//   reshape(x) {shape}: same elements in the same row-major order, new shape
//       (explicit extents, no -1; the element counts must match).
//   transpose(x) {perm}: out dimension i is x's dimension perm[i]; perm is a
//       permutation of [0, rank).
//   slice(x) {axis, begin, end}: x[..., begin:end, ...] on `axis` (negative
//       counts from the back); 0 <= begin <= end <= that dimension.
//   concat(x0, x1, ...) {axis}: joined along `axis`; equal dtypes, equal
//       dimensions off the axis.
//   gather(table, ids[, offset]): table [V, C] float, ids i32/i64 [...] -> [..., C];
//       out[..., :] = table[ids[...], :]. An id outside [0, V) is an eval error.
//       With offset (an i32/i64 scalar, a run-time value) the table holds the
//       rows [offset, offset + V) of a larger one (a vocab-parallel embedding's
//       shard, models/tensor_parallel.h): out = table[id - offset] for the ids
//       in that range and zeros for every other id; attribute vocab (the whole
//       table's rows), when given, makes an id outside [0, vocab) an error.
//   gather_grad(ids, g[, offset]) {vocab}: ids [...], g [..., C] -> [vocab, C];
//       scatter-add of g's rows into the rows named by ids (embedding backward);
//       with offset, into row id - offset of the ids in [offset, offset + vocab).
// Gradient rules:
//   reshape:     dx = reshape(g, x's shape)
//   transpose:   dx = transpose(g, inverse of perm)
//   slice:       dx = concat(zeros before, g, zeros after) on the axis (empty pieces left out)
//   concat:      dx_k = slice(g, axis, offset_k, offset_k + x_k's size on the axis)
//   gather:      dtable = gather_grad(ids, g[, offset]) {vocab: V}; no gradient to ids or offset
//   gather_grad: none (backward-only)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_registry.h"
#include "graph/ops_util.h"
#include "kernels/embedding.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using Grads = Result<std::vector<std::optional<ValueId>>>;
using OutGrads = std::span<const std::optional<ValueId>>;

// ---------------------------------------------------------------------------
// reshape

Status infer_reshape(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(Shape to, to_shape(n, "shape", n.attrs.ints("shape")));
  const Shape& from = in[0].shape;
  if (to.numel() != from.numel())
    return rule_error(n, "shape", std::to_string(from.numel()) + " elements (the input's " + from.to_string() + ")",
                      to.to_string() + " with " + std::to_string(to.numel()) + " elements");
  out = {TensorType{in[0].dtype, to}};
  return Status();
}

Status eval_reshape(const Node&, std::span<const HostArray* const> in, std::span<HostArray> out) {
  out[0].data = in[0]->data;
  return Status();
}

Grads grad_reshape(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.reshape(*g[0], dims(b.type(n.inputs[0]).shape))};
}

// ---------------------------------------------------------------------------
// transpose

Status infer_transpose(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const std::vector<int64_t>& perm = n.attrs.ints("perm");
  const Shape& s = in[0].shape;
  std::vector<char> seen(size_t(s.rank()), 0);
  bool ok = int(perm.size()) == s.rank();
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    ok = perm[i] >= 0 && perm[i] < s.rank() && !seen[size_t(perm[i])];
    if (ok) seen[size_t(perm[i])] = 1;
  }
  if (!ok)
    return rule_error(n, "perm", "a permutation of [0, " + std::to_string(s.rank()) + ") (the input's rank)",
                      dims_string(perm));
  std::vector<int64_t> d;
  for (int64_t p : perm) d.push_back(s[int(p)]);
  out = {TensorType{in[0].dtype, *Shape::make(d.data(), int(d.size()))}};
  return Status();
}

Status eval_transpose(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const std::vector<int64_t>& perm = n.attrs.ints("perm");
  const Shape& from = in[0]->type.shape;
  const Shape& to = out[0].type.shape;
  const int rank = to.rank();
  // Walk the output in order, keeping the flat input offset of its coordinate.
  std::vector<int64_t> step(static_cast<size_t>(rank)), coord(static_cast<size_t>(rank), 0);
  for (int i = 0; i < rank; ++i) step[size_t(i)] = from.stride(int(perm[size_t(i)]));
  int64_t src = 0;
  for (int64_t flat = 0; flat < to.numel(); ++flat) {
    out[0].data[size_t(flat)] = in[0]->data[size_t(src)];
    for (int d = rank - 1; d >= 0; --d) {
      src += step[size_t(d)];
      if (++coord[size_t(d)] < to[d]) break;
      src -= coord[size_t(d)] * step[size_t(d)];
      coord[size_t(d)] = 0;
    }
  }
  return Status();
}

Grads grad_transpose(Builder& b, const Node& n, OutGrads g) {
  const std::vector<int64_t>& perm = n.attrs.ints("perm");
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i);
  return std::vector<std::optional<ValueId>>{b.transpose(*g[0], inverse)};
}

// ---------------------------------------------------------------------------
// slice

Status infer_slice(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const Shape& s = in[0].shape;
  ASPEN_ASSIGN_OR_RETURN(int axis, axis_of(n, "axis", n.attrs.i("axis"), s.rank()));
  const int64_t begin = n.attrs.i("begin"), end = n.attrs.i("end"), dim = s[axis];
  if (begin < 0 || begin > end || end > dim)
    return rule_error(n, "range",
                      "0 <= begin <= end <= " + std::to_string(dim) + " (dimension " + std::to_string(axis) +
                          " of " + s.to_string() + ")",
                      "begin " + std::to_string(begin) + ", end " + std::to_string(end));
  std::vector<int64_t> d = dims(s);
  d[size_t(axis)] = end - begin;
  out = {TensorType{in[0].dtype, *Shape::make(d.data(), int(d.size()))}};
  return Status();
}

// Elements before the axis (outer) and after it (inner) of shape s.
void split_at(const Shape& s, int axis, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
}

Status eval_slice(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const Shape& s = in[0]->type.shape;
  const int axis = *axis_of(n, "axis", n.attrs.i("axis"), s.rank());
  const int64_t begin = n.attrs.i("begin"), end = n.attrs.i("end");
  int64_t outer = 0, inner = 0;
  split_at(s, axis, outer, inner);
  const int64_t src_row = s[axis] * inner, dst_row = (end - begin) * inner;
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(in[0]->data.begin() + o * src_row + begin * inner, dst_row, out[0].data.begin() + o * dst_row);
  return Status();
}

Grads grad_slice(Builder& b, const Node& n, OutGrads g) {
  const TensorType t = b.type(n.inputs[0]);  // a copy: the builder's appends move the value table
  const int axis = *axis_of(n, "axis", n.attrs.i("axis"), t.shape.rank());
  const int64_t begin = n.attrs.i("begin"), end = n.attrs.i("end"), dim = t.shape[axis];
  auto zeros = [&](int64_t extent) {
    std::vector<int64_t> d = dims(t.shape);
    d[size_t(axis)] = extent;
    return b.broadcast(b.scalar(0.0f, t.dtype), d);
  };
  std::vector<ValueId> pieces;
  if (begin > 0) pieces.push_back(zeros(begin));
  if (end > begin) pieces.push_back(*g[0]);
  if (dim > end) pieces.push_back(zeros(dim - end));
  if (pieces.empty()) return std::vector<std::optional<ValueId>>{zeros(0)};  // x has no elements
  if (pieces.size() == 1) return std::vector<std::optional<ValueId>>{pieces[0]};
  return std::vector<std::optional<ValueId>>{b.concat(pieces, axis)};
}

// ---------------------------------------------------------------------------
// concat

Status infer_concat(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const TensorType& first = in[0];
  ASPEN_ASSIGN_OR_RETURN(int axis, axis_of(n, "axis", n.attrs.i("axis"), first.shape.rank()));
  // in[0]'s type with "*" on the axis: what every input must look like.
  std::string pattern = std::string(dtype_name(first.dtype)) + "[";
  for (int i = 0; i < first.shape.rank(); ++i)
    pattern += (i ? ", " : "") + (i == axis ? std::string("*") : std::to_string(first.shape[i]));
  pattern += "]";
  int64_t total = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    bool ok = in[k].dtype == first.dtype && in[k].shape.rank() == first.shape.rank();
    for (int i = 0; ok && i < first.shape.rank(); ++i) ok = i == axis || in[k].shape[i] == first.shape[i];
    if (!ok)
      return rule_error(n, "input " + std::to_string(k),
                        pattern + " (input 0's type, any size on axis " + std::to_string(axis) + ")",
                        in[k].to_string());
    total += in[k].shape[axis];
  }
  std::vector<int64_t> d = dims(first.shape);
  d[size_t(axis)] = total;
  ASPEN_ASSIGN_OR_RETURN(Shape s, to_shape(n, "output shape", d));
  out = {TensorType{first.dtype, s}};
  return Status();
}

Status eval_concat(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const Shape& s = out[0].type.shape;
  const int axis = *axis_of(n, "axis", n.attrs.i("axis"), s.rank());
  int64_t outer = 0, inner = 0;
  split_at(s, axis, outer, inner);
  auto dst = out[0].data.begin();
  for (int64_t o = 0; o < outer; ++o)
    for (const HostArray* x : in) {
      const int64_t row = x->type.shape[axis] * inner;
      dst = std::copy_n(x->data.begin() + o * row, row, dst);
    }
  return Status();
}

Grads grad_concat(Builder& b, const Node& n, OutGrads g) {
  const int axis = *axis_of(n, "axis", n.attrs.i("axis"), b.type(n.outputs[0]).shape.rank());
  std::vector<std::optional<ValueId>> r;
  int64_t offset = 0;
  for (ValueId x : n.inputs) {
    const int64_t size = b.type(x).shape[axis];
    r.push_back(b.slice(*g[0], axis, offset, offset + size));
    offset += size;
  }
  return r;
}

// ---------------------------------------------------------------------------
// gather and gather_grad

Status infer_gather(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "table", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "table", in[0], 2, 2));
  ASPEN_RETURN_IF_ERROR(expect_int(n, "ids", in[1]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "ids", in[1], 0, Shape::kMaxRank - 1));
  if (in.size() == 3) {
    ASPEN_RETURN_IF_ERROR(expect_int(n, "offset", in[2]));
    ASPEN_RETURN_IF_ERROR(expect_rank(n, "offset", in[2], 0, 0));
  }
  std::vector<int64_t> d = dims(in[1].shape);
  d.push_back(in[0].shape[1]);
  ASPEN_ASSIGN_OR_RETURN(Shape s, to_shape(n, "output shape", d));
  out = {TensorType{in[0].dtype, s}};
  return Status();
}

Status infer_gather_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_int(n, "ids", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_float(n, "g", in[1]));
  const Shape& ids = in[0].shape;
  const Shape& g = in[1].shape;
  bool ok = g.rank() == ids.rank() + 1;
  for (int i = 0; ok && i < ids.rank(); ++i) ok = g[i] == ids[i];
  if (!ok) return rule_error(n, "g", "shape " + ids.to_string() + " + [C] (the ids' shape, then C)", g.to_string());
  if (in.size() == 3) {
    ASPEN_RETURN_IF_ERROR(expect_int(n, "offset", in[2]));
    ASPEN_RETURN_IF_ERROR(expect_rank(n, "offset", in[2], 0, 0));
  }
  const int64_t vocab = n.attrs.i("vocab");
  if (vocab < 0) return rule_error(n, "vocab", ">= 0", std::to_string(vocab));
  std::vector<int64_t> d = {vocab, g[-1]};
  ASPEN_ASSIGN_OR_RETURN(Shape s, to_shape(n, "output shape", d));
  out = {TensorType{in[1].dtype, s}};
  return Status();
}

// "ids[1, 0] = 7": the id at flat position `flat` of an ids array shaped s.
std::string id_at(const Shape& s, int64_t flat, double value) {
  std::vector<int64_t> coord(size_t(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    coord[size_t(d)] = s[d] == 0 ? 0 : flat % s[d];
    flat = s[d] == 0 ? 0 : flat / s[d];
  }
  std::string v = std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 9.0e18
                      ? std::to_string(int64_t(value))
                      : std::to_string(value);
  return "ids" + (s.rank() == 0 ? std::string() : dims_string(coord)) + " = " + v;
}

// Checks every id against [0, vocab) and converts them to the kernels' int32.
Status ids_to_i32(const Node& n, const HostArray& ids, int64_t vocab, std::vector<int32_t>& out) {
  out.resize(ids.data.size());
  for (size_t i = 0; i < ids.data.size(); ++i) {
    const double v = ids.data[i];
    if (!(v >= 0 && v < double(vocab)))
      return Status::error(Code::kOutOfRange, std::string(op_name(n.op)) + ": ids",
                           "every id in [0, V) = [0, " + std::to_string(vocab) + ")",
                           id_at(ids.type.shape, int64_t(i), v));
    if (v > double(std::numeric_limits<int32_t>::max()))
      return Status::error(Code::kUnimplemented, std::string(op_name(n.op)) + ": ids",
                           "ids below 2^31 (the reference kernel takes int32 ids)", id_at(ids.type.shape, int64_t(i), v));
    out[i] = int32_t(v);
  }
  return Status();
}

Status eval_gather(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const int64_t V = in[0]->type.shape[0], C = in[0]->type.shape[1];
  if (in.size() == 3) {  // a shard's rows: other ids give zeros
    const double offset = in[2]->data[0];
    const size_t N = in[1]->data.size();
    if (n.attrs.has("vocab")) {
      std::vector<int32_t> checked;
      ASPEN_RETURN_IF_ERROR(ids_to_i32(n, *in[1], n.attrs.i("vocab"), checked));
    }
    for (size_t k = 0; k < N; ++k) {
      const double local = in[1]->data[k] - offset;
      for (int64_t c = 0; c < C; ++c)
        out[0].data[k * size_t(C) + size_t(c)] =
            local >= 0 && local < double(V) ? in[0]->data[size_t(local) * size_t(C) + size_t(c)] : 0.0;
    }
    return Status();
  }
  std::vector<int32_t> ids;
  ASPEN_RETURN_IF_ERROR(ids_to_i32(n, *in[1], V, ids));
  kernels::ref::embedding_forward<double>(ids.data(), in[0]->data.data(), out[0].data.data(), int64_t(ids.size()), V,
                                          C);
  return Status();
}

Status eval_gather_grad(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const int64_t V = out[0].type.shape[0], C = out[0].type.shape[1];
  if (in.size() == 3) {  // a shard's rows: other ids add nothing
    std::fill(out[0].data.begin(), out[0].data.end(), 0.0);
    const double offset = in[2]->data[0];
    for (size_t k = 0; k < in[0]->data.size(); ++k) {
      const double local = in[0]->data[k] - offset;
      if (!(local >= 0 && local < double(V))) continue;
      for (int64_t c = 0; c < C; ++c)
        out[0].data[size_t(local) * size_t(C) + size_t(c)] += in[1]->data[k * size_t(C) + size_t(c)];
    }
    return Status();
  }
  std::vector<int32_t> ids;
  ASPEN_RETURN_IF_ERROR(ids_to_i32(n, *in[0], V, ids));
  std::fill(out[0].data.begin(), out[0].data.end(), 0.0);
  kernels::ref::embedding_backward<double>(ids.data(), in[1]->data.data(), out[0].data.data(), int64_t(ids.size()), V,
                                           C);
  return Status();
}

Grads grad_gather(Builder& b, const Node& n, OutGrads g) {
  const int64_t vocab = b.type(n.inputs[0]).shape[0];
  std::vector<ValueId> in = {n.inputs[1], *g[0]};
  if (n.inputs.size() == 3) in.push_back(n.inputs[2]);
  std::vector<std::optional<ValueId>> out(n.inputs.size());
  out[0] = b.op1(OpKind::gather_grad, std::move(in), {{"vocab", vocab}});
  return out;
}

// ---------------------------------------------------------------------------
// Fast kernels: f32 data only (a bf16 or f16 node falls back to the reference). ids may be i32 (passed to
// the embedding kernels as they are) or i64 (narrowed into an int32 scratch buffer the kernel owns, sized
// at prepare: run() does not allocate). Copies run in parallel over rows when there is enough work.

using Prepared = Result<std::unique_ptr<PreparedKernel>>;
using In = std::span<const void* const>;
using Out = std::span<void* const>;
using Types = std::span<const TensorType>;

constexpr int64_t kParallelElements = 1 << 15;  // below this, a copy runs on the calling thread

bool all_f32(Types in, Types out) {
  for (const auto& t : in)
    if (t.dtype != DType::f32) return false;
  for (const auto& t : out)
    if (t.dtype != DType::f32) return false;
  return true;
}

const float* f32_in(In i, size_t k) { return static_cast<const float*>(i[k]); }
float* f32_out(Out o, size_t k) { return static_cast<float*>(o[k]); }

Prepared prepare_reshape(const Node&, Types in, Types out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const size_t bytes = size_t(out[0].shape.numel()) * sizeof(float);
  return make_kernel([bytes](In i, Out o) {
    if (bytes && o[0] != i[0]) std::memcpy(o[0], i[0], bytes);
    return Status();
  });
}

// The permutation with runs of axes that stay adjacent (and in order) merged: NCHW -> NHWC, (0, 2, 3, 1)
// over [N, C, H, W], is (0, 2, 1) over [N, C, H·W]. Returns the merged input extents and permutation.
std::pair<std::vector<int64_t>, std::vector<int64_t>> merged_permutation(const Shape& from,
                                                                        const std::vector<int64_t>& perm) {
  std::vector<std::vector<int64_t>> runs;  // output order: runs of consecutive input axes
  for (int64_t p : perm) {
    if (from[int(p)] == 1) continue;  // an axis of one element moves nothing
    if (!runs.empty() && runs.back().back() + 1 == p) runs.back().push_back(p);
    else runs.push_back({p});
  }
  // Each run's rank in input order is its axis in the merged input.
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return runs[a][0] < runs[b][0]; });
  std::vector<int64_t> dims_in(runs.size()), merged_perm(runs.size());
  for (size_t k = 0; k < order.size(); ++k) {
    int64_t e = 1;
    for (int64_t a : runs[order[k]]) e *= from[int(a)];
    dims_in[k] = e;
    merged_perm[order[k]] = int64_t(k);
  }
  return {dims_in, merged_perm};
}

// Walks the output row by row (its last dimension); each row reads the input at a fixed stride. A
// permutation that is a batch of 2-D transposes once adjacent axes merge (channels first <-> last, the
// layout moves of imported convolutions) is done in 32 x 32 tiles instead: both sides' cache lines used.
Prepared prepare_transpose(const Node& n, Types in, Types out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const std::vector<int64_t>& perm = n.attrs.ints("perm");
  const Shape &from = in[0].shape, &to = out[0].shape;
  {
    const auto [md, mp] = merged_permutation(from, perm);
    const size_t r = md.size();
    bool batched_2d = r >= 2 && mp[r - 1] == int64_t(r - 2) && mp[r - 2] == int64_t(r - 1);
    for (size_t k = 0; batched_2d && k + 2 < r; ++k) batched_2d = mp[k] == int64_t(k);
    if (batched_2d && md[r - 1] >= 8 && md[r - 2] >= 8) {
      const int64_t A = md[r - 2], B = md[r - 1];  // input [batch, A, B] -> output [batch, B, A]
      int64_t batch = 1;
      for (size_t k = 0; k + 2 < r; ++k) batch *= md[k];
      constexpr int64_t T = 32;
      const int64_t ta = (A + T - 1) / T, tb = (B + T - 1) / T, total = batch * A * B;
      return make_kernel([=](In i, Out o) {
        const float* x = f32_in(i, 0);
        float* y = f32_out(o, 0);
#pragma omp parallel for schedule(static) if (total > kParallelElements)
        for (int64_t t = 0; t < batch * ta * tb; ++t) {
          const int64_t bi = t / (ta * tb), a0 = (t / tb) % ta * T, b0 = t % tb * T;
          const float* xs = x + bi * A * B;
          float* ys = y + bi * A * B;
          const int64_t a1 = std::min(A, a0 + T), b1 = std::min(B, b0 + T);
          for (int64_t b = b0; b < b1; ++b)
            for (int64_t a = a0; a < a1; ++a) ys[b * A + a] = xs[a * B + b];
        }
        return Status();
      });
    }
  }
  const int rank = to.rank();
  const int64_t total = to.numel();
  std::array<int64_t, Shape::kMaxRank> dim{}, step{};  // output extents; input stride of each output dimension
  for (int d = 0; d < rank; ++d) {
    dim[size_t(d)] = to[d];
    step[size_t(d)] = from.stride(int(perm[size_t(d)]));
  }
  const int64_t inner = rank ? to[-1] : 1, inner_step = rank ? step[size_t(rank - 1)] : 1;
  const int64_t rows = inner ? total / inner : 0;
  return make_kernel([=](In i, Out o) {
    const float* x = f32_in(i, 0);
    float* y = f32_out(o, 0);
#pragma omp parallel for schedule(static) if (total > kParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t src = 0, rem = r;
      for (int d = rank - 2; d >= 0; --d) {
        src += (rem % dim[size_t(d)]) * step[size_t(d)];
        rem /= dim[size_t(d)];
      }
      const float* xr = x + src;
      float* yr = y + r * inner;
      for (int64_t j = 0; j < inner; ++j) yr[j] = xr[j * inner_step];
    }
    return Status();
  });
}

Prepared prepare_slice(const Node& n, Types in, Types out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const Shape& s = in[0].shape;
  const int axis = *axis_of(n, "axis", n.attrs.i("axis"), s.rank());
  int64_t outer = 0, inner = 0;
  split_at(s, axis, outer, inner);
  const int64_t src_row = s[axis] * inner, dst_row = (n.attrs.i("end") - n.attrs.i("begin")) * inner;
  const int64_t first = n.attrs.i("begin") * inner, total = outer * dst_row;
  return make_kernel([=](In i, Out o) {
    if (total == 0) return Status();
    const float* x = f32_in(i, 0);
    float* y = f32_out(o, 0);
#pragma omp parallel for schedule(static) if (total > kParallelElements)
    for (int64_t r = 0; r < outer; ++r)
      std::memcpy(y + r * dst_row, x + r * src_row + first, size_t(dst_row) * sizeof(float));
    return Status();
  });
}

// Output row r (of the dimensions before the axis) is input 0's row r, then input 1's, ...
Prepared prepare_concat(const Node& n, Types in, Types out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const Shape& s = out[0].shape;
  const int axis = *axis_of(n, "axis", n.attrs.i("axis"), s.rank());
  int64_t outer = 0, inner = 0;
  split_at(s, axis, outer, inner);
  std::vector<int64_t> row(in.size()), at(in.size());  // each input's row length and offset in the output row
  int64_t out_row = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    row[k] = in[k].shape[axis] * inner;
    at[k] = out_row;
    out_row += row[k];
  }
  const int64_t total = outer * out_row;
  return make_kernel([outer, out_row, total, row = std::move(row), at = std::move(at)](In i, Out o) {
    if (total == 0) return Status();
    float* y = f32_out(o, 0);
#pragma omp parallel for schedule(static) if (total > kParallelElements)
    for (int64_t r = 0; r < outer; ++r)
      for (size_t k = 0; k < row.size(); ++k)
        if (row[k]) std::memcpy(y + r * out_row + at[k], f32_in(i, k) + r * row[k], size_t(row[k]) * sizeof(float));
    return Status();
  });
}

// ids as the embedding kernels' int32: i32 ones as they are, i64 ones narrowed into `scratch` (N
// elements, allocated at prepare). An i64 id outside [0, V) is the kernels' OutOfRange error, worded as
// theirs; one in [0, V) but above int32 (V > 2^31) is Unimplemented, as in the reference.
Result<std::span<const int32_t>> ids_i32(const void* p, bool wide, int64_t N, int64_t V, std::vector<int32_t>& scratch,
                                         const char* op) {
  if (!wide) return std::span<const int32_t>(static_cast<const int32_t*>(p), size_t(N));
  const int64_t* ids = static_cast<const int64_t*>(p);
  for (int64_t k = 0; k < N; ++k) {
    const int64_t v = ids[k];
    if (v < 0 || v >= V)
      return Status::error(Code::kOutOfRange, std::string(op) + ": argument 'ids'",
                           "every id in [0, V) = [0, " + std::to_string(V) + ")",
                           "ids[" + std::to_string(k) + "] = " + std::to_string(v));
    if (v > std::numeric_limits<int32_t>::max())
      return Status::error(Code::kUnimplemented, std::string(op) + ": ids", "ids below 2^31 (int32 kernels)",
                           "ids[" + std::to_string(k) + "] = " + std::to_string(v));
    scratch[size_t(k)] = int32_t(v);
  }
  return std::span<const int32_t>(scratch);
}

int64_t int_scalar(const void* p, DType t) {
  return t == DType::i64 ? *static_cast<const int64_t*>(p) : int64_t(*static_cast<const int32_t*>(p));
}
int64_t int_at(const void* p, DType t, int64_t k) {
  return t == DType::i64 ? static_cast<const int64_t*>(p)[k] : int64_t(static_cast<const int32_t*>(p)[k]);
}

// gather(table [V, C], ids, offset) and gather_grad(ids, g, offset): a shard's rows (f32).
Prepared prepare_shard_gather(const Node& n, Types in, Types out) {
  const bool grad = n.op == OpKind::gather_grad;
  if (in[grad ? 1 : 0].dtype != DType::f32 || out[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t V = grad ? out[0].shape[0] : in[0].shape[0], C = grad ? out[0].shape[1] : in[0].shape[1];
  const int64_t N = in[grad ? 0 : 1].shape.numel();
  const DType id_t = in[grad ? 0 : 1].dtype, off_t = in[2].dtype;
  const int64_t whole = !grad && n.attrs.has("vocab") ? n.attrs.i("vocab") : -1;  // checked ids (see the file comment)
  const char* op = op_name(n.op);
  return make_kernel([grad, V, C, N, id_t, off_t, whole, op](In i, Out o) -> Status {
    const int64_t offset = int_scalar(i[2], off_t);
    for (int64_t k = 0; k < N && whole >= 0; ++k) {
      const int64_t id = int_at(i[1], id_t, k);
      if (id < 0 || id >= whole)
        return Status::error(Code::kOutOfRange, std::string(op) + ": argument 'ids'",
                             "every id in [0, V) = [0, " + std::to_string(whole) + ")",
                             "ids[" + std::to_string(k) + "] = " + std::to_string(id));
    }
    float* y = f32_out(o, 0);
    if (!grad) {
      const float* table = f32_in(i, 0);
#pragma omp parallel for schedule(static) if (N * C > kParallelElements)
      for (int64_t k = 0; k < N; ++k) {
        const int64_t local = int_at(i[1], id_t, k) - offset;
        if (local >= 0 && local < V) {
          std::memcpy(y + k * C, table + local * C, size_t(C) * sizeof(float));
        } else {
          std::fill_n(y + k * C, C, 0.0f);
        }
      }
      return Status();
    }
    std::fill_n(y, V * C, 0.0f);
    const float* g = f32_in(i, 1);
    for (int64_t k = 0; k < N; ++k) {  // in order: the same sums as the reference's
      const int64_t local = int_at(i[0], id_t, k) - offset;
      if (local < 0 || local >= V) continue;
      float* row = y + local * C;
      const float* src = g + k * C;
      for (int64_t c = 0; c < C; ++c) row[c] += src[c];
    }
    return Status();
  });
}

// gather(table [V, C], ids) -> [..., C]: kernels::embedding_forward.
Prepared prepare_gather(const Node& n, Types in, Types out) {
  if (in.size() == 3) return prepare_shard_gather(n, in, out);
  const int64_t V = in[0].shape[0], C = in[0].shape[1], N = in[1].shape.numel();
  const bool wide = in[1].dtype == DType::i64;
  std::vector<int32_t> scratch(wide ? size_t(N) : 0);
  const char* op = op_name(n.op);
  if (in[0].dtype == DType::bf16 || in[0].dtype == DType::f16) {  // rows copied as they are (bf16 weight tables)
    const size_t row = size_t(C) * 2;
    return make_kernel([V, N, row, wide, scratch = std::move(scratch), op](In i, Out o) mutable -> Status {
      ASPEN_ASSIGN_OR_RETURN(const auto ids, ids_i32(i[1], wide, N, V, scratch, op));
      const char* table = static_cast<const char*>(i[0]);
      char* y = static_cast<char*>(o[0]);
      for (int64_t k = 0; k < N; ++k) std::memcpy(y + size_t(k) * row, table + size_t(ids[size_t(k)]) * row, row);
      return Status();
    });
  }
  if (in[0].dtype != DType::f32 || out[0].dtype != DType::f32) return no_fast_kernel();
  return make_kernel([V, C, N, wide, scratch = std::move(scratch), op](In i, Out o) mutable {
    ASPEN_ASSIGN_OR_RETURN(const auto ids, ids_i32(i[1], wide, N, V, scratch, op));
    return kernels::embedding_forward(ids, in_span<float>(i, 0, V * C), out_span<float>(o, 0, N * C), N, V, C);
  });
}

// gather_grad(ids, g) -> [vocab, C]: zeros, then kernels::embedding_backward's ordered scatter-add.
Prepared prepare_gather_grad(const Node& n, Types in, Types out) {
  if (in.size() == 3) return prepare_shard_gather(n, in, out);
  if (in[1].dtype != DType::f32 || out[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t V = out[0].shape[0], C = out[0].shape[1], N = in[0].shape.numel();
  const bool wide = in[0].dtype == DType::i64;
  std::vector<int32_t> scratch(wide ? size_t(N) : 0);
  const char* op = op_name(n.op);
  return make_kernel([V, C, N, wide, scratch = std::move(scratch), op](In i, Out o) mutable {
    ASPEN_ASSIGN_OR_RETURN(const auto ids, ids_i32(i[0], wide, N, V, scratch, op));
    float* dtable = f32_out(o, 0);
    const int64_t total = V * C;
#pragma omp parallel for simd schedule(static) if (total > kParallelElements)
    for (int64_t k = 0; k < total; ++k) dtable[k] = 0.0f;
    return kernels::embedding_backward(ids, in_span<float>(i, 1, N * C), out_span<float>(o, 0, total), N, V, C);
  });
}

// Samples for the kernel sweep (graph/op_sample.h): every axis and permutation of odd shapes, one copy large
// enough for the parallel path, and bf16 (the reference, except gather's bf16 rows).
void samples_reshape(SampleList& s) {
  s.add("f32", [](Builder& b) { b.reshape(b.input("x", DType::f32, Shape{2, 3, 5}), {5, 6}); });
  s.add("f32 to rank 0", [](Builder& b) { b.reshape(b.input("x", DType::f32, Shape{1, 1}), {}); });
  s.add("bf16", [](Builder& b) { b.reshape(b.input("x", DType::bf16, Shape{2, 3}), {6}); }).fast = false;
}

void samples_transpose(SampleList& s) {
  // The op itself, whatever the permutation (Builder::transpose makes unit-axis moves reshapes: NOTE
  // [unit-axis transposes]).
  static const auto transpose = [](Builder& b, ValueId x, std::vector<int64_t> perm) {
    return b.op1(OpKind::transpose, {x}, {{"perm", std::move(perm)}});
  };
  for (const std::vector<int64_t>& perm : {std::vector<int64_t>{2, 0, 1}, {0, 2, 1}, {1, 0, 2}, {2, 1, 0}, {0, 1, 2}})
    s.add("f32 [2, 3, 5] perm " + std::to_string(perm[0]) + std::to_string(perm[1]) + std::to_string(perm[2]),
          [&](Builder& b) {
            transpose(b, b.input("x", DType::f32, Shape{2, 3, 5}), perm);
          });
  s.add("f32 rank 4", [](Builder& b) { transpose(b, b.input("x", DType::f32, Shape{2, 3, 5, 7}), {0, 2, 1, 3}); });
  s.add("f32 large", [](Builder& b) { transpose(b, b.input("x", DType::f32, Shape{2, 130, 131}), {0, 2, 1}); });
  // The tiled path: channels first <-> last with odd extents (tiles cut at the edges), and a 1 axis.
  s.add("f32 NCHW to NHWC", [](Builder& b) {
    transpose(b, b.input("x", DType::f32, Shape{3, 37, 5, 9}), {0, 2, 3, 1});
  });
  s.add("f32 NHWC to NCHW", [](Builder& b) {
    transpose(b, b.input("x", DType::f32, Shape{2, 7, 11, 45}), {0, 3, 1, 2});
  });
  s.add("f32 with a 1 axis", [](Builder& b) {
    transpose(b, b.input("x", DType::f32, Shape{1, 40, 1, 33}), {3, 2, 0, 1});
  });
  s.add("bf16", [](Builder& b) { transpose(b, b.input("x", DType::bf16, Shape{2, 3}), {1, 0}); }).fast = false;
}

void samples_slice(SampleList& s) {
  for (int64_t axis : {0, 1, 2, -1})
    s.add("f32 axis " + std::to_string(axis), [&](Builder& b) {
      b.slice(b.input("x", DType::f32, Shape{3, 5, 7}), axis, 1, 3);
    });
  s.add("f32 empty", [](Builder& b) { b.slice(b.input("x", DType::f32, Shape{3, 5}), 1, 2, 2); });
  s.add("f32 large", [](Builder& b) { b.slice(b.input("x", DType::f32, Shape{4, 130, 131}), 1, 3, 120); });
  s.add("bf16", [](Builder& b) { b.slice(b.input("x", DType::bf16, Shape{3, 5}), 1, 1, 3); }).fast = false;
}

void samples_concat(SampleList& s) {
  for (int64_t axis : {0, 1, 2})
    s.add("f32 axis " + std::to_string(axis), [&](Builder& b) {
      std::vector<int64_t> d0{2, 3, 5}, d1 = d0, d2 = d0;
      d0[size_t(axis)] = 1;
      d1[size_t(axis)] = 4;
      d2[size_t(axis)] = 2;
      b.concat({b.input("x0", DType::f32, sample_shape(d0)), b.input("x1", DType::f32, sample_shape(d1)),
                b.input("x2", DType::f32, sample_shape(d2))},
               axis);
    });
  s.add("f32 one input", [](Builder& b) { b.concat({b.input("x", DType::f32, Shape{3, 4})}, 1); });
  s.add("f32 large", [](Builder& b) {
    b.concat({b.input("x0", DType::f32, Shape{130, 131}), b.input("x1", DType::f32, Shape{130, 7})}, 1);
  });
  s.add("bf16", [](Builder& b) {
     b.concat({b.input("x0", DType::bf16, Shape{2, 3}), b.input("x1", DType::bf16, Shape{2, 1})}, 1);
   }).fast = false;
}

// Ids drawn from [0, V); the shard forms take rows [offset, offset + 7) of a vocabulary of 21, with ids
// drawn from all 21, so most fall outside (zero rows; no gradient), and repeated ids inside sum.
void samples_gather(SampleList& s) {
  for (DType ids : {DType::i32, DType::i64}) {
    const std::string id(dtype_name(ids));
    for (DType table : {DType::f32, DType::bf16})
      s.add(std::string(dtype_name(table)) + " table, " + id + " ids",
            [&](Builder& b) {
              b.gather(b.input("table", table, Shape{7, 5}), b.input("ids", ids, Shape{2, 3}));
            },
            {.int_hi = 7});
    for (double offset : {0.0, 7.0, 14.0})
      s.add("shard at " + std::to_string(int(offset)) + ", " + id + " ids",
            [&](Builder& b) {
              b.op(OpKind::gather,
                   {b.input("table", DType::f32, Shape{7, 5}), b.input("ids", ids, Shape{3, 5}),
                    b.input("offset", ids, Shape{})},
                   {{"vocab", int64_t(21)}});
            },
            {.int_hi = 21, .values = {{"offset", {offset}}}});
  }
  s.add("f32 large",
        [](Builder& b) {
          b.gather(b.input("table", DType::f32, Shape{50, 131}), b.input("ids", DType::i32, Shape{3, 100}));
        },
        {.int_hi = 50});
  s.add("bf16 shard",
        [](Builder& b) {
          b.op(OpKind::gather, {b.input("table", DType::bf16, Shape{7, 5}), b.input("ids", DType::i32, Shape{3}),
                                b.input("offset", DType::i32, Shape{})});
        },
        {.int_hi = 7, .values = {{"offset", {0.0}}}})
      .fast = false;
}

void samples_gather_grad(SampleList& s) {
  for (DType ids : {DType::i32, DType::i64}) {
    const std::string id(dtype_name(ids));
    s.add(id + " ids from 4 of 7 rows",  // repeated ids sum, unused rows are zero
          [&](Builder& b) {
            b.op(OpKind::gather_grad, {b.input("ids", ids, Shape{3, 4}), b.input("g", DType::f32, Shape{3, 4, 5})},
                 {{"vocab", int64_t(7)}});
          });
    for (double offset : {0.0, 7.0, 14.0})
      s.add("shard at " + std::to_string(int(offset)) + ", " + id + " ids",
            [&](Builder& b) {
              b.op(OpKind::gather_grad,
                   {b.input("ids", ids, Shape{4, 5}), b.input("g", DType::f32, Shape{4, 5, 3}),
                    b.input("offset", ids, Shape{})},
                   {{"vocab", int64_t(7)}});
            },
            {.int_hi = 21, .values = {{"offset", {offset}}}});
  }
  s.add("f32 large",
        [](Builder& b) {
          b.op(OpKind::gather_grad,
               {b.input("ids", DType::i32, Shape{3, 100}), b.input("g", DType::f32, Shape{3, 100, 131})},
               {{"vocab", int64_t(300)}});
        },
        {.int_hi = 300});
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::gather_grad, {b.input("ids", DType::i32, Shape{3}), b.input("g", DType::bf16, Shape{3, 5})},
          {{"vocab", int64_t(7)}});
   }).fast = false;
}

}  // namespace

void register_shape_ops(OpTable& t) {
  t.define(OpKind::reshape, {.min_inputs = 1,
                             .max_inputs = 1,
                             .attrs = {{"shape", AttrKind::ints, true}},
                             .infer = infer_reshape,
                             .grad = grad_reshape,
                             .eval = eval_reshape,
                             .prepare = prepare_reshape,
                             .samples = samples_reshape});
  t.define(OpKind::transpose, {.min_inputs = 1,
                               .max_inputs = 1,
                               .attrs = {{"perm", AttrKind::ints, true}},
                               .infer = infer_transpose,
                               .grad = grad_transpose,
                               .eval = eval_transpose,
                               .prepare = prepare_transpose,
                               .samples = samples_transpose});
  t.define(OpKind::slice,
           {.min_inputs = 1,
            .max_inputs = 1,
            .attrs = {{"axis", AttrKind::i64, true}, {"begin", AttrKind::i64, true}, {"end", AttrKind::i64, true}},
            .infer = infer_slice,
            .grad = grad_slice,
            .eval = eval_slice,
            .prepare = prepare_slice,
            .samples = samples_slice});
  t.define(OpKind::concat, {.min_inputs = 1,
                            .max_inputs = -1,
                            .attrs = {{"axis", AttrKind::i64, true}},
                            .infer = infer_concat,
                            .grad = grad_concat,
                            .eval = eval_concat,
                            .prepare = prepare_concat,
                            .samples = samples_concat});
  t.define(OpKind::gather, {.min_inputs = 2,
                            .max_inputs = 3,
                            .attrs = {{"vocab", AttrKind::i64, false}},
                            .infer = infer_gather,
                            .grad = grad_gather,
                            .eval = eval_gather,
                            .prepare = prepare_gather,
                            .samples = samples_gather});
  // gather_grad is backward-only: not differentiated again.
  t.define(OpKind::gather_grad, {.min_inputs = 2,
                                 .max_inputs = 3,
                                 .attrs = {{"vocab", AttrKind::i64, true}},
                                 .infer = infer_gather_grad,
                                 .eval = eval_gather_grad,
                                 .prepare = prepare_gather_grad,
                                 .samples = samples_gather_grad});
}

}  // namespace aspen::graph
