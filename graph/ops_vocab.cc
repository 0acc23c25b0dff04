// graph/ops_vocab.cc: the vocab-parallel cross-entropy of tensor-parallel
// language models (models/tensor_parallel.h), Megatron's layout.
//
// Shard t of a group of T holds the logits z [R, Vl] of the classes
// [offset, offset + Vl) of a vocabulary of V = T·Vl. The mean loss
//   L = mean over counted rows r of  log Σ_v exp(z_rv - M_r) + M_r - z_r,target
// needs three quantities over the whole vocabulary, which the graph makes with
// collectives between these ops (models/blocks.cc, vocab_parallel_lm_loss):
//   m     = reduce_max(z, {1})                            this shard's row maxima
//   M     = reduce_max(all_gather(m) as [T, R], {0})      the global maxima
//   s, zt = vocab_ce_stats(z, targets, offset, M)
//   S, Zt = all_reduce(s), all_reduce(zt)                 sums over the shards
//   loss  = vocab_ce_loss(z, targets, offset, M, S, Zt)
//
//   vocab_ce_stats(z [R, Vl] float, targets i32/i64 [R], offset i32/i64 [], M f32 [R])
//       {group_size, ignore_index = -100} -> s f32 [R], zt f32 [R]
//       s_r = Σ_v exp(z_rv - M_r) over this shard's classes; zt_r = z_r,(target - offset)
//       when the target is one of them, else 0 (also for ignored rows).
//   vocab_ce_loss(z, targets, offset, M, S, Zt) {group_size, ignore_index} -> mean loss (z's dtype, rank 0)
//       over the rows whose target is not ignore_index (0 when there are none).
//       z is an input for the gradient rule only.
//   vocab_ce_grad(z, targets, offset, M, S, g) {group_size, ignore_index} -> dz [R, Vl]
//       dz_rv = group_size · (exp(z_rv - M_r) / S_r - [v + offset == target_r]) · g / counted
// Targets must lie in [0, group_size·Vl) or be ignore_index (checked by every op).
//
// Gradients: vocab_ce_loss gives z its total derivative (M cancels; S and Zt
// are z's own sums) and nothing to M, S and Zt, which only carry the sums
// across the shards, so autodiff never differentiates the stats, the maxima or
// their collectives. The factor group_size: every shard computes the same
// loss and, as with the all-reduce's gradient rule that the other
// tensor-parallel values follow, differentiates the sum of the group's T
// identical losses (the trainer divides every gradient by T). vocab_ce_stats
// and vocab_ce_grad are not differentiated.
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

constexpr int64_t kIgnoreDefault = -100;

struct VocabArgs {
  int64_t R = 0, Vl = 0, T = 1;
  int64_t ignore = kIgnoreDefault;
};

Result<VocabArgs> vocab_args(const Node& n, std::span<const TensorType> in) {
  VocabArgs a;
  ASPEN_RETURN_IF_ERROR(expect_float(n, "z", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "z", in[0], 2, 2));
  a.R = in[0].shape[0];
  a.Vl = in[0].shape[1];
  if (a.Vl < 1) return rule_error(n, "z: dimension 1 (this shard's classes)", ">= 1", in[0].to_string());
  ASPEN_RETURN_IF_ERROR(expect_int(n, "targets", in[1]));
  if (in[1].shape != Shape{a.R})
    return rule_error(n, "targets", Shape{a.R}.to_string() + " (one per row of z)", in[1].to_string());
  ASPEN_RETURN_IF_ERROR(expect_int(n, "offset", in[2]));
  if (in[2].shape.rank() != 0) return rule_error(n, "offset", "a scalar (rank 0)", in[2].to_string());
  a.T = n.attrs.i("group_size");
  if (a.T < 1) return rule_error(n, "group_size", ">= 1", str(a.T));
  a.ignore = n.attrs.i_or("ignore_index", kIgnoreDefault);
  if (a.ignore < std::numeric_limits<int32_t>::min() || a.ignore > std::numeric_limits<int32_t>::max())
    return rule_error(n, "ignore_index", "a value in the int32 range", str(a.ignore));
  for (size_t k = 3; k < in.size(); ++k)
    if (k != 5 || n.op != OpKind::vocab_ce_grad)
      ASPEN_RETURN_IF_ERROR(expect_type(n, "input " + std::to_string(k), in[k], TensorType{DType::f32, Shape{a.R}},
                                        "one f32 statistic per row"));
  return a;
}

Status infer_vocab_ce_stats(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const VocabArgs a, vocab_args(n, in));
  out = {TensorType{DType::f32, Shape{a.R}}, TensorType{DType::f32, Shape{a.R}}};
  return Status();
}

Status infer_vocab_ce_loss(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(vocab_args(n, in).status());
  out = {TensorType{in[0].dtype, Shape{}}};
  return Status();
}

Status infer_vocab_ce_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(vocab_args(n, in).status());
  ASPEN_RETURN_IF_ERROR(expect_type(n, "g", in[5], TensorType{in[0].dtype, Shape{}}, "the mean loss's type"));
  out = {in[0]};
  return Status();
}

// A target's class on this shard, -1 when another shard holds it or the row
// is ignored; a target outside [0, T·Vl) is an error naming the row.
struct Local {
  std::vector<int64_t> cls;  // by row
  int64_t counted = 0;
};
Result<Local> local_classes(const Node& n, const VocabArgs& a, auto target_at, int64_t offset) {
  Local l;
  l.cls.assign(size_t(a.R), -1);
  const int64_t V = a.T * a.Vl;
  for (int64_t r = 0; r < a.R; ++r) {
    const int64_t t = target_at(r);
    if (t == a.ignore) continue;
    if (t < 0 || t >= V)
      return Status::error(Code::kOutOfRange, std::string(op_name(n.op)) + ": targets row " + str(r),
                           "a class index in [0, " + str(V) + ") (group_size x this shard's classes) or ignore_index " +
                               str(a.ignore),
                           str(t));
    ++l.counted;
    if (t >= offset && t < offset + a.Vl) l.cls[size_t(r)] = t - offset;
  }
  return l;
}

// ---- reference (the interpreter, f64)

std::vector<TensorType> types_of(Ins in) {
  std::vector<TensorType> t;
  for (const HostArray* h : in) t.push_back(h->type);
  return t;
}


Result<Local> ref_local(const Node& n, const VocabArgs& a, Ins in) {
  const HostArray& t = *in[1];
  return local_classes(n, a, [&](int64_t r) { return int64_t(t.data[size_t(r)]); }, int64_t(in[2]->data[0]));
}

Status eval_vocab_ce_stats(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const VocabArgs a, vocab_args(n, types_of(in)));
  ASPEN_ASSIGN_OR_RETURN(const Local l, ref_local(n, a, in));
  const std::vector<double>& z = in[0]->data;
  for (int64_t r = 0; r < a.R; ++r) {
    double s = 0.0;
    for (int64_t v = 0; v < a.Vl; ++v) s += std::exp(z[size_t(r * a.Vl + v)] - in[3]->data[size_t(r)]);
    out[0].data[size_t(r)] = s;
    out[1].data[size_t(r)] = l.cls[size_t(r)] >= 0 ? z[size_t(r * a.Vl + l.cls[size_t(r)])] : 0.0;
  }
  return Status();
}

Status eval_vocab_ce_loss(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const VocabArgs a, vocab_args(n, types_of(in)));
  ASPEN_ASSIGN_OR_RETURN(const Local l, ref_local(n, a, in));
  double sum = 0.0;
  for (int64_t r = 0; r < a.R; ++r) {
    if (int64_t(in[1]->data[size_t(r)]) == a.ignore) continue;
    sum += std::log(in[4]->data[size_t(r)]) + in[3]->data[size_t(r)] - in[5]->data[size_t(r)];
  }
  out[0].data[0] = l.counted > 0 ? sum / double(l.counted) : 0.0;
  return Status();
}

Status eval_vocab_ce_grad(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const VocabArgs a, vocab_args(n, types_of(in)));
  ASPEN_ASSIGN_OR_RETURN(const Local l, ref_local(n, a, in));
  const double scale = l.counted > 0 ? double(a.T) * in[5]->data[0] / double(l.counted) : 0.0;
  for (int64_t r = 0; r < a.R; ++r) {
    const bool ignored = int64_t(in[1]->data[size_t(r)]) == a.ignore;
    for (int64_t v = 0; v < a.Vl; ++v) {
      const size_t k = size_t(r * a.Vl + v);
      const double p = std::exp(in[0]->data[k] - in[3]->data[size_t(r)]) / in[4]->data[size_t(r)];
      out[0].data[k] = ignored ? 0.0 : scale * (p - (v == l.cls[size_t(r)] ? 1.0 : 0.0));
    }
  }
  return Status();
}

Grads grad_vocab_ce_loss(Builder& b, const Node& n, OutGrads g) {
  if (!g[0]) return no_grads(n);
  Attrs a;
  a.set("group_size", n.attrs.i("group_size"));
  if (n.attrs.has("ignore_index")) a.set("ignore_index", n.attrs.i("ignore_index"));
  const std::vector<ValueId>& x = n.inputs;
  ValueId dz = b.op1(OpKind::vocab_ce_grad, {x[0], x[1], x[2], x[3], x[4], *g[0]}, std::move(a));
  std::vector<std::optional<ValueId>> out(n.inputs.size());
  out[0] = dz;  // M, S and Zt only carry the sums across the shards (see the file comment)
  return out;
}

// ---- fast kernels: f32 z; i32 or i64 targets and offset

int64_t int_at(const void* p, DType t, int64_t k) {
  return t == DType::i64 ? static_cast<const int64_t*>(p)[k] : int64_t(static_cast<const int32_t*>(p)[k]);
}

// A fast kernel for one of the ops (f32 z): the arguments checked at prepare,
// the shard's classes found at each run, then body(a, l, i, o, targets dtype).
template <class Body>
Prepared vocab_kernel(const Node& n, Types in, Types out, Body body) {
  if (!floats_are_f32(in, out)) return no_fast_kernel();
  ASPEN_ASSIGN_OR_RETURN(const VocabArgs a, vocab_args(n, in));
  const DType tt = in[1].dtype, ot = in[2].dtype;
  return make_kernel([a, tt, ot, node = n, body](In i, Out o) -> Status {
    ASPEN_ASSIGN_OR_RETURN(const Local l, local_classes(node, a, [&](int64_t r) { return int_at(i[1], tt, r); },
                                                        int_at(i[2], ot, 0)));
    return body(a, l, i, o, tt);
  });
}

Prepared prepare_vocab_ce_stats(const Node& n, Types in, Types out) {
  return vocab_kernel(n, in, out, [](const VocabArgs& a, const Local& l, In i, Out o, DType) -> Status {
    const float *z = f32_in(i, 0), *M = f32_in(i, 3);
    float *s = static_cast<float*>(o[0]), *zt = static_cast<float*>(o[1]);
#pragma omp parallel for schedule(static) if (a.R * a.Vl > (1 << 15))
    for (int64_t r = 0; r < a.R; ++r) {
      const float* row = z + r * a.Vl;
      double sum = 0.0;  // f64: a fixed order, and no loss over a wide vocabulary
      for (int64_t v = 0; v < a.Vl; ++v) sum += double(std::exp(row[v] - M[r]));
      s[r] = float(sum);
      zt[r] = l.cls[size_t(r)] >= 0 ? row[l.cls[size_t(r)]] : 0.0f;
    }
    return Status();
  });
}

Prepared prepare_vocab_ce_loss(const Node& n, Types in, Types out) {
  return vocab_kernel(n, in, out, [](const VocabArgs& a, const Local& l, In i, Out o, DType tt) -> Status {
    const float *M = f32_in(i, 3), *S = f32_in(i, 4), *Zt = f32_in(i, 5);
    double sum = 0.0;
    for (int64_t r = 0; r < a.R; ++r)
      if (int_at(i[1], tt, r) != a.ignore) sum += std::log(double(S[r])) + double(M[r]) - double(Zt[r]);
    *static_cast<float*>(o[0]) = l.counted > 0 ? float(sum / double(l.counted)) : 0.0f;
    return Status();
  });
}

Prepared prepare_vocab_ce_grad(const Node& n, Types in, Types out) {
  return vocab_kernel(n, in, out, [](const VocabArgs& a, const Local& l, In i, Out o, DType tt) -> Status {
    const float *z = f32_in(i, 0), *M = f32_in(i, 3), *S = f32_in(i, 4);
    const float g = *f32_in(i, 5);
    const float scale = l.counted > 0 ? float(double(a.T) * double(g) / double(l.counted)) : 0.0f;
    float* dz = static_cast<float*>(o[0]);
#pragma omp parallel for schedule(static) if (a.R * a.Vl > (1 << 15))
    for (int64_t r = 0; r < a.R; ++r) {
      float* d = dz + r * a.Vl;
      if (int_at(i[1], tt, r) == a.ignore) {
        std::fill_n(d, a.Vl, 0.0f);
        continue;
      }
      const float* row = z + r * a.Vl;
      const float inv = 1.0f / S[r];
      for (int64_t v = 0; v < a.Vl; ++v) d[v] = scale * (std::exp(row[v] - M[r]) * inv);
      if (l.cls[size_t(r)] >= 0) d[l.cls[size_t(r)]] -= scale;
    }
    return Status();
  });
}

// Samples for the kernel sweep (graph/op_sample.h): shard 1 of 3 (offset 11 of 33 classes), an odd row
// count, an ignored row, targets inside and outside the shard, i32 and i64 targets; the statistics M, S and
// Zt drawn as a maximum above z and positive sums.
SampleFeeds vocab_feeds() {
  return {.lo = -3.0,
          .hi = 3.0,
          .ranges = {{"M", {3.0, 6.0}}, {"S", {3.0, 6.0}}, {"Zt", {3.0, 6.0}}},
          .values = {{"targets", {5, 12, -100, 20, 11, 32, 0, 21, 15}}, {"offset", {11}}, {"g", {0.75}}}};
}
void vocab_samples(SampleList& s, OpKind op) {
  for (DType tdt : {DType::i32, DType::i64})
    s.add(
        std::string("targets ") + std::string(dtype_name(tdt)),
        [&](Builder& b) {
          std::vector<ValueId> in{b.input("z", DType::f32, Shape{9, 11}), b.input("targets", tdt, Shape{9}),
                                  b.input("offset", tdt, Shape{}), b.input("M", DType::f32, Shape{9})};
          if (op != OpKind::vocab_ce_stats) {
            in.push_back(b.input("S", DType::f32, Shape{9}));
            in.push_back(op == OpKind::vocab_ce_loss ? b.input("Zt", DType::f32, Shape{9})
                                                     : b.input("g", DType::f32, Shape{}));
          }
          b.op(op, in, {{"group_size", int64_t(3)}});
        },
        vocab_feeds());
}
void samples_vocab_ce_stats(SampleList& s) { vocab_samples(s, OpKind::vocab_ce_stats); }
void samples_vocab_ce_loss(SampleList& s) { vocab_samples(s, OpKind::vocab_ce_loss); }
void samples_vocab_ce_grad(SampleList& s) { vocab_samples(s, OpKind::vocab_ce_grad); }

}  // namespace

void register_vocab_ops(OpTable& t) {
  const std::vector<AttrSpec> attrs = {{"group_size", AttrKind::i64, true}, {"ignore_index", AttrKind::i64, false}};
  t.define(OpKind::vocab_ce_stats, {.min_inputs = 4,
                                    .max_inputs = 4,
                                    .attrs = attrs,
                                    .infer = infer_vocab_ce_stats,
                                    .eval = eval_vocab_ce_stats,
                                    .prepare = prepare_vocab_ce_stats,
                                    .samples = samples_vocab_ce_stats});
  t.define(OpKind::vocab_ce_loss, {.min_inputs = 6,
                                   .max_inputs = 6,
                                   .attrs = attrs,
                                   .infer = infer_vocab_ce_loss,
                                   .grad = grad_vocab_ce_loss,
                                   .eval = eval_vocab_ce_loss,
                                   .prepare = prepare_vocab_ce_loss,
                                   .samples = samples_vocab_ce_loss});
  t.define(OpKind::vocab_ce_grad, {.min_inputs = 6,
                                   .max_inputs = 6,
                                   .attrs = attrs,
                                   .infer = infer_vocab_ce_grad,
                                   .eval = eval_vocab_ce_grad,
                                   .prepare = prepare_vocab_ce_grad,
                                   .samples = samples_vocab_ce_grad});
}

}  // namespace aspen::graph
