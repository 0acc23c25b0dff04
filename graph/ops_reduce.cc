// graph/ops_reduce.cc: broadcast and reductions, each the other's gradient.
//
//   broadcast(x, shape): x's dimensions align with the trailing dimensions of
//       `shape` (numpy rules: each equal, or 1 in x); out has `shape`.
//   reduce_sum / reduce_max (x, axes, keepdims): over the listed axes.
// Gradient rules:
//   broadcast:  dx = reduce_sum(g, the broadcast axes), reshaped to x
//   reduce_sum: dx = broadcast(g with the reduced axes kept as 1, x's shape)
//   reduce_max: dx = g (broadcast back) where x equals the max, shared evenly among ties (torch.amax's
//               rule); imported log-softmaxes subtract the max for stability, and its gradient there cancels
// Fast kernels (f32): broadcast, and one strided walk for both reductions
// (run_reduce: the sum in double, the max exact).
#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_registry.h"
#include "graph/ops_util.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using Grads = Result<std::vector<std::optional<ValueId>>>;
using OutGrads = std::span<const std::optional<ValueId>>;

Status infer_broadcast(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(Shape to, to_shape(n, "shape", n.attrs.ints("shape")));
  const Shape& from = in[0].shape;
  if (from.rank() > to.rank())
    return rule_error(n, "shape", "rank >= " + std::to_string(from.rank()) + " (the input's)", to.to_string());
  const int lead = to.rank() - from.rank();
  for (int i = 0; i < from.rank(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i])
      return rule_error(n, "dimension " + std::to_string(lead + i),
                        std::to_string(from[i]) + " or a 1 in the input to broadcast from",
                        "input " + from.to_string() + " against " + to.to_string());
  out = {TensorType{in[0].dtype, to}};
  return Status();
}

// For each flat index of `to`, the flat index of `from` it reads.
std::vector<int64_t> broadcast_index(const Shape& from, const Shape& to) {
  const int lead = to.rank() - from.rank();
  std::vector<int64_t> idx(size_t(to.numel()));
  std::vector<int64_t> coord(size_t(to.rank()), 0);
  for (int64_t flat = 0; flat < to.numel(); ++flat) {
    int64_t src = 0;
    for (int i = 0; i < from.rank(); ++i) src = src * from[i] + (from[i] == 1 ? 0 : coord[size_t(lead + i)]);
    idx[size_t(flat)] = src;
    for (int d = to.rank() - 1; d >= 0; --d) {
      if (++coord[size_t(d)] < to[d]) break;
      coord[size_t(d)] = 0;
    }
  }
  return idx;
}

Status eval_broadcast(const Node&, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<int64_t> idx = broadcast_index(in[0]->type.shape, out[0].type.shape);
  for (size_t i = 0; i < idx.size(); ++i) out[0].data[i] = in[0]->data[size_t(idx[i])];
  return Status();
}

Result<std::vector<char>> reduced_axes(const Node& n, const Shape& s) {
  std::vector<char> r(size_t(s.rank()), 0);
  for (int64_t a : n.attrs.ints("axes")) {
    ASPEN_ASSIGN_OR_RETURN(int ax, axis_of(n, "axes", a, s.rank()));
    if (r[size_t(ax)]) return rule_error(n, "axes", "each axis once", "axis " + std::to_string(a) + " twice");
    r[size_t(ax)] = 1;
  }
  return r;
}

Shape reduced_shape(const Shape& s, const std::vector<char>& axes, bool keepdims) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) {
    if (!axes[size_t(i)]) d.push_back(s[i]);
    else if (keepdims) d.push_back(1);
  }
  return *Shape::make(d.data(), int(d.size()));
}

Status infer_reduce(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "input", in[0]));
  ASPEN_ASSIGN_OR_RETURN(std::vector<char> axes, reduced_axes(n, in[0].shape));
  out = {TensorType{in[0].dtype, reduced_shape(in[0].shape, axes, n.attrs.i_or("keepdims", 0) != 0)}};
  return Status();
}

// Maps each flat input index to its flat output index (keepdims layout and
// squeezed layout have the same element order).
std::vector<int64_t> reduce_index(const Node& n, const Shape& s) {
  std::vector<char> axes = *reduced_axes(n, s);
  Shape kept = reduced_shape(s, axes, true);
  std::vector<int64_t> idx(size_t(s.numel()));
  std::vector<int64_t> coord(size_t(s.rank()), 0);
  for (int64_t flat = 0; flat < s.numel(); ++flat) {
    int64_t dst = 0;
    for (int i = 0; i < s.rank(); ++i) dst = dst * kept[i] + (axes[size_t(i)] ? 0 : coord[size_t(i)]);
    idx[size_t(flat)] = dst;
    for (int d = s.rank() - 1; d >= 0; --d) {
      if (++coord[size_t(d)] < s[d]) break;
      coord[size_t(d)] = 0;
    }
  }
  return idx;
}

Status eval_reduce_sum(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<int64_t> idx = reduce_index(n, in[0]->type.shape);
  std::fill(out[0].data.begin(), out[0].data.end(), 0.0);
  for (size_t i = 0; i < idx.size(); ++i) out[0].data[size_t(idx[i])] += in[0]->data[i];
  return Status();
}

Status eval_reduce_max(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<int64_t> idx = reduce_index(n, in[0]->type.shape);
  std::fill(out[0].data.begin(), out[0].data.end(), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < idx.size(); ++i)
    out[0].data[size_t(idx[i])] = std::max(out[0].data[size_t(idx[i])], in[0]->data[i]);
  return Status();
}

std::vector<int64_t> keepdims_shape(const Node& n, const Shape& s) {
  return dims(reduced_shape(s, *reduced_axes(n, s), true));
}

Grads grad_broadcast(Builder& b, const Node& n, OutGrads g) {
  // Copies: the builder appends values below, which may move the type table.
  const Shape from = b.type(n.inputs[0]).shape;
  const Shape to = b.type(n.outputs[0]).shape;
  const int lead = to.rank() - from.rank();
  std::vector<int64_t> axes;
  for (int i = 0; i < to.rank(); ++i)
    if (i < lead || from[i - lead] != to[i]) axes.push_back(i);
  ValueId s = axes.empty() ? *g[0] : b.reduce_sum(*g[0], axes, /*keepdims=*/true);
  return std::vector<std::optional<ValueId>>{b.reshape(s, dims(from))};
}

Grads grad_reduce_max(Builder& b, const Node& n, OutGrads g) {
  const ValueId x = n.inputs[0];
  const TensorType t = b.type(x);
  const std::vector<int64_t> to = dims(t.shape), kept = keepdims_shape(n, t.shape);
  const ValueId at_max = b.cast(b.op1(OpKind::equal, {x, b.broadcast(b.reshape(n.outputs[0], kept), to)}), t.dtype);
  const ValueId ties = b.reshape(b.op1(OpKind::reduce_sum, {at_max}, n.attrs), kept);
  const ValueId share = b.div(b.reshape(*g[0], kept), ties);
  return std::vector<std::optional<ValueId>>{b.mul(at_max, b.broadcast(share, to))};
}

Grads grad_reduce_sum(Builder& b, const Node& n, OutGrads g) {
  const Shape s = b.type(n.inputs[0]).shape;  // a copy (see grad_broadcast)
  ValueId kept = b.reshape(*g[0], keepdims_shape(n, s));
  return std::vector<std::optional<ValueId>>{b.broadcast(kept, dims(s))};
}

// ---- fast kernels (f32; other dtypes fall back to the reference) ---------------

using Prepared = Result<std::unique_ptr<PreparedKernel>>;
using In = std::span<const void* const>;
using Out = std::span<void* const>;
using Types = std::span<const TensorType>;
using Dims = std::array<int64_t, Shape::kMaxRank>;

constexpr int64_t kParallelElements = 1 << 15;  // below this, a kernel runs on the calling thread

bool all_f32(Types in, Types out) {
  return in[0].dtype == DType::f32 && out[0].dtype == DType::f32;
}

// broadcast: walks the output row by row (its last dimension); a broadcast dimension has input stride 0,
// so each row is a copy or a fill.
Prepared prepare_broadcast(const Node&, Types in, Types out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const Shape &from = in[0].shape, &to = out[0].shape;
  const int rank = to.rank(), lead = to.rank() - from.rank();
  const int64_t total = to.numel();
  Dims dim{}, step{};  // output extents; input stride of each output dimension
  for (int d = 0; d < rank; ++d) {
    dim[size_t(d)] = to[d];
    step[size_t(d)] = d < lead || from[d - lead] == 1 ? 0 : from.stride(d - lead);
  }
  const int64_t inner = rank ? to[-1] : 1, inner_step = rank ? step[size_t(rank - 1)] : 1;
  const int64_t rows = inner ? total / inner : 0;
  return make_kernel([=](In i, Out o) {
    const float* x = static_cast<const float*>(i[0]);
    float* y = static_cast<float*>(o[0]);
#pragma omp parallel for schedule(static) if (total > kParallelElements)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t src = 0, rem = r;
      for (int d = rank - 2; d >= 0; --d) {
        src += (rem % dim[size_t(d)]) * step[size_t(d)];
        rem /= dim[size_t(d)];
      }
      float* yr = y + r * inner;
      if (inner_step == 0) std::fill_n(yr, inner, x[src]);
      else std::copy_n(x + src, inner, yr);  // inner_step is 1: the last dimension is not broadcast
    }
    return Status();
  });
}

// reduce_sum, in a canonical form: dimensions of extent 1 dropped, neighbours of the same kind (kept or
// reduced) merged. The last remaining dimension is the innermost run, contiguous in the input: a run of
// output elements (kept) or a run summed into one (reduced). Each output element is summed by one
// thread, in f64, over its reduced coordinates in row-major order, whatever the thread count: the
// result is deterministic and thread-count independent. A reduced run's sum goes into kSumLanes f64
// partial sums (element c of every row into lane c mod kSumLanes), added in a fixed order at the end:
// one chain of dependent adds ran at one element per add latency (a conv's bias gradient, [N, C, H·W]
// summed to [C], at 1.2 GB/s); the lanes vectorize.
struct ReducePlan {
  int nk = 0, nr = 0;   // kept dimensions before the run; reduced dimensions (the run excluded)
  Dims kdim{}, kstep{}; // their extents and input strides
  Dims rdim{}, rstep{};
  int64_t outer = 1;    // product of kdim: output elements (kept run) or rows of them
  int64_t count = 1;    // product of rdim
  int64_t run = 1;      // the innermost run's extent
  bool run_kept = true;
  int64_t out_elements = 0, in_elements = 0;
};

ReducePlan reduce_plan(const Node& n, const Shape& s) {
  const std::vector<char> axes = *reduced_axes(n, s);
  ReducePlan p;
  p.in_elements = s.numel();
  p.out_elements = reduced_shape(s, axes, false).numel();
  struct Dim {
    int64_t extent, stride;
    bool reduced;
  };
  std::vector<Dim> d;
  for (int i = 0; i < s.rank(); ++i) {
    if (s[i] == 1) continue;
    const bool red = axes[size_t(i)] != 0;
    if (!d.empty() && d.back().reduced == red) {  // row-major: the merged stride is the inner one's
      d.back().extent *= s[i];
      d.back().stride = s.stride(i);
    } else {
      d.push_back({s[i], s.stride(i), red});
    }
  }
  if (d.empty()) return p;  // one element, copied
  p.run = d.back().extent;
  p.run_kept = !d.back().reduced;
  for (size_t i = 0; i + 1 < d.size(); ++i) {
    if (d[i].reduced) {
      p.rdim[size_t(p.nr)] = d[i].extent;
      p.rstep[size_t(p.nr++)] = d[i].stride;
      p.count *= d[i].extent;
    } else {
      p.kdim[size_t(p.nk)] = d[i].extent;
      p.kstep[size_t(p.nk++)] = d[i].stride;
      p.outer *= d[i].extent;
    }
  }
  return p;
}

// Input offset of the o-th coordinate of the kept dimensions.
int64_t kept_offset(const ReducePlan& p, int64_t o) {
  int64_t off = 0;
  for (int d = p.nk - 1; d >= 0; --d) {
    off += (o % p.kdim[size_t(d)]) * p.kstep[size_t(d)];
    o /= p.kdim[size_t(d)];
  }
  return off;
}

// Advances the reduced coordinates `idx` (row-major) and their input offset.
inline void next_reduced(const ReducePlan& p, Dims& idx, int64_t& off) {
  for (int d = p.nr - 1; d >= 0; --d) {
    off += p.rstep[size_t(d)];
    if (++idx[size_t(d)] < p.rdim[size_t(d)]) return;
    off -= idx[size_t(d)] * p.rstep[size_t(d)];
    idx[size_t(d)] = 0;
  }
}

constexpr int64_t kReduceBlock = 64;  // output columns one task sums together (kept run)
constexpr int64_t kSumLanes = 16;     // partial sums of a reduced run

// The sum accumulates in double; the max is exact in float and keeps the
// reference's std::max from -inf, so a NaN is passed over as it is there.
struct SumOf {
  using Acc = double;
  static constexpr double kStart = 0.0;
  static void add(double& acc, float v) { acc += double(v); }
};
struct MaxOf {
  using Acc = float;
  static constexpr float kStart = -std::numeric_limits<float>::infinity();
  static void add(float& acc, float v) { acc = std::max(acc, v); }
};

template <class R>
Status run_reduce(const ReducePlan& p, const float* x, float* y) {
  using Acc = typename R::Acc;
  if (p.in_elements == 0) {  // over nothing: 0 (sum), -inf (max)
    std::fill_n(y, p.out_elements, float(R::kStart));
    return Status();
  }
  if (p.run_kept) {
    // Task t: kept coordinate t / blocks, output columns [c0, c1) of the run.
    const int64_t blocks = (p.run + kReduceBlock - 1) / kReduceBlock, tasks = p.outer * blocks;
#pragma omp parallel for schedule(static) if (p.in_elements > kParallelElements)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t o = t / blocks, c0 = (t % blocks) * kReduceBlock, c1 = std::min(p.run, c0 + kReduceBlock);
      const float* base = x + kept_offset(p, o) + c0;
      Acc acc[kReduceBlock];
      std::fill_n(acc, kReduceBlock, Acc(R::kStart));
      Dims idx{};
      int64_t off = 0;
      for (int64_t r = 0; r < p.count; ++r) {
        const float* src = base + off;
        for (int64_t c = 0; c < c1 - c0; ++c) R::add(acc[c], src[c]);
        next_reduced(p, idx, off);
      }
      float* dst = y + o * p.run + c0;
      for (int64_t c = 0; c < c1 - c0; ++c) dst[c] = float(acc[c]);
    }
    return Status();
  }
  // A reduced run: output element o reduces its reduced rows, each a contiguous run.
  if constexpr (std::is_same_v<R, SumOf>) {
#pragma omp parallel for schedule(static) if (p.in_elements > kParallelElements)
    for (int64_t o = 0; o < p.outer; ++o) {
      const float* base = x + kept_offset(p, o);
      double lane[kSumLanes] = {};
      Dims idx{};
      int64_t off = 0;
      for (int64_t r = 0; r < p.count; ++r) {
        const float* src = base + off;
        int64_t c = 0;
        for (; c + kSumLanes <= p.run; c += kSumLanes)
          for (int64_t j = 0; j < kSumLanes; ++j) lane[j] += double(src[c + j]);
        for (int64_t j = 0; c + j < p.run; ++j) lane[j] += double(src[c + j]);
        next_reduced(p, idx, off);
      }
      for (int64_t w = kSumLanes / 2; w >= 1; w /= 2)  // pairwise, in a fixed order
        for (int64_t j = 0; j < w; ++j) lane[j] += lane[j + w];
      y[o] = float(lane[0]);
    }
    return Status();
  }
#pragma omp parallel for schedule(static) if (p.in_elements > kParallelElements)
  for (int64_t o = 0; o < p.outer; ++o) {
    const float* base = x + kept_offset(p, o);
    Acc acc = R::kStart;
    Dims idx{};
    int64_t off = 0;
    for (int64_t r = 0; r < p.count; ++r) {
      const float* src = base + off;
      for (int64_t c = 0; c < p.run; ++c) R::add(acc, src[c]);
      next_reduced(p, idx, off);
    }
    y[o] = float(acc);
  }
  return Status();
}

template <class R>
Prepared prepare_reduce(const Node& n, Types in, Types out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const ReducePlan p = reduce_plan(n, in[0].shape);
  return make_kernel(
      [p](In i, Out o) { return run_reduce<R>(p, static_cast<const float*>(i[0]), static_cast<float*>(o[0])); });
}

// Samples for the kernel sweep (graph/op_sample.h).
void samples_broadcast(SampleList& s) {
  const std::pair<std::vector<int64_t>, std::vector<int64_t>> cases[] = {
      {{3, 1}, {2, 3, 5}},    {{5}, {2, 3, 5}},      {{}, {4, 3}}, {{2, 1, 5}, {2, 3, 5}},
      {{1, 3, 1}, {2, 3, 4}}, {{131}, {3, 100, 131}}};  // the last one large enough for the parallel path
  for (const auto& [from, to] : cases)
    s.add("f32 " + sample_shape(from).to_string() + " to " + sample_shape(to).to_string(),
          [&](Builder& b) { b.broadcast(b.input("x", DType::f32, sample_shape(from)), to); });
  s.add("bf16", [](Builder& b) { b.broadcast(b.input("x", DType::bf16, Shape{3, 1}), {3, 4}); }).fast = false;
}

// Every pattern of reduced axes of an odd rank-4 shape, a unit dimension between reduced ones, a large
// input (the parallel path), and an empty reduced axis (zeros for the sum, -inf for the max).
std::string axes_label(const std::vector<int64_t>& axes) {
  std::string s = "axes {";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + std::to_string(axes[i]);
  return s + "}";
}
void reduce_samples(SampleList& s, OpKind op) {
  const std::pair<std::vector<int64_t>, bool> cases[] = {{{0, 2}, false}, {{0, 2}, true},        {{3}, false},
                                                         {{1, 3}, false}, {{0, 1, 2, 3}, false}, {{0}, false},
                                                         {{}, false},     {{-1}, true}};
  for (const auto& [axes, keepdims] : cases)
    s.add("f32 [3, 4, 5, 7] " + axes_label(axes) + (keepdims ? " kept" : ""), [&](Builder& b) {
      b.op(op, {b.input("x", DType::f32, Shape{3, 4, 5, 7})}, {{"axes", axes}, {"keepdims", int64_t(keepdims)}});
    });
  s.add("f32 large, a unit dimension", [&](Builder& b) {
    b.op(op, {b.input("x", DType::f32, Shape{67, 1, 9, 131})}, {{"axes", std::vector<int64_t>{0, 1}}});
  });
  s.add("f32 empty axis", [&](Builder& b) {
    b.op(op, {b.input("x", DType::f32, Shape{3, 0, 2})}, {{"axes", std::vector<int64_t>{1}}});
  });
  s.add("bf16", [&](Builder& b) {
     b.op(op, {b.input("x", DType::bf16, Shape{3, 4})}, {{"axes", std::vector<int64_t>{0}}});
   }).fast = false;
}
void samples_reduce_sum(SampleList& s) { reduce_samples(s, OpKind::reduce_sum); }
void samples_reduce_max(SampleList& s) { reduce_samples(s, OpKind::reduce_max); }

}  // namespace

void register_reduce_ops(OpTable& t) {
  t.define(OpKind::broadcast, {.min_inputs = 1,
                               .max_inputs = 1,
                               .attrs = {{"shape", AttrKind::ints, true}},
                               .infer = infer_broadcast,
                               .grad = grad_broadcast,
                               .eval = eval_broadcast,
                               .prepare = prepare_broadcast,
                               .samples = samples_broadcast});
  const std::vector<AttrSpec> reduce_attrs = {{"axes", AttrKind::ints, true}, {"keepdims", AttrKind::i64, false}};
  t.define(OpKind::reduce_sum, {.min_inputs = 1,
                                .max_inputs = 1,
                                .attrs = reduce_attrs,
                                .infer = infer_reduce,
                                .grad = grad_reduce_sum,
                                .eval = eval_reduce_sum,
                                .prepare = prepare_reduce<SumOf>,
                                .samples = samples_reduce_sum});
  t.define(OpKind::reduce_max, {.min_inputs = 1,
                                .max_inputs = 1,
                                .attrs = reduce_attrs,
                                .infer = infer_reduce,
                                .grad = grad_reduce_max,
                                .eval = eval_reduce_max,
                                .prepare = prepare_reduce<MaxOf>,
                                .samples = samples_reduce_max});
}

}  // namespace aspen::graph
