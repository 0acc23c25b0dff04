// graph/ops_batchnorm.cc: batch normalization in training, the graph form of kernels/batchnorm.h.
//
//   batch_norm(x, gamma, beta) {eps} -> y (x's type), mean, rstd (f32 [C])
//       x [N, C, D...] float (rank >= 2), gamma and beta [C] of x's dtype: every channel normalized by the
//       batch's mean and population variance over its N ΠD values, then scaled and shifted.
//   batch_norm_grad(dy, x, gamma, mean, rstd) -> dx (x's type), dgamma, dbeta (gamma's type)
//
// Gradient: (dx, dgamma, dbeta) = batch_norm_grad(g, x, gamma, mean, rstd); none through the statistics
// outputs (the running statistics they update are state, not trained). batch_norm_grad is not
// differentiated again.
// Fast kernels: f32, and bf16 / f16 through widened copies (the outputs rounded once).
#include <cmath>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/batchnorm.h"
#include "kernels/convert.h"
#include "kernels/scratch.h"

namespace aspen::graph {

namespace {
using namespace nnutil;
using kernels::BatchNormShape;

// x [N, C, D...] as [N, C, ΠD].
Result<BatchNormShape> shape_of(const Node& n, const TensorType& x) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", x));
  if (x.shape.rank() < 2) return rule_error(n, "x", "[N, C, D...] (rank 2 or more)", x.to_string());
  BatchNormShape s;
  s.N = x.shape[0], s.C = x.shape[1];
  for (int i = 2; i < x.shape.rank(); ++i) s.S *= x.shape[i];
  if (s.N < 1 || s.C < 1 || s.S < 1) return rule_error(n, "x", "no empty axis", x.to_string());
  return s;
}

Status infer_batch_norm(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const BatchNormShape s, shape_of(n, in[0]));
  const TensorType channel{in[0].dtype, Shape{s.C}};
  ASPEN_RETURN_IF_ERROR(expect_type(n, "gamma", in[1], channel, "x's channels and dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "beta", in[2], channel, "x's channels and dtype"));
  ASPEN_RETURN_IF_ERROR(expect_eps(n));
  const TensorType stat{kStat, Shape{s.C}};
  out = {in[0], stat, stat};
  return Status();
}

Status infer_batch_norm_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const BatchNormShape s, shape_of(n, in[1]));
  const TensorType channel{in[1].dtype, Shape{s.C}}, stat{kStat, Shape{s.C}};
  ASPEN_RETURN_IF_ERROR(expect_type(n, "dy", in[0], in[1], "x's type"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "gamma", in[2], channel, "x's channels and dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "mean", in[3], stat, "the forward's saved statistic"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "rstd", in[4], stat, "the forward's saved statistic"));
  out = {in[1], channel, channel};
  return Status();
}

Grads grad_batch_norm(Builder& b, const Node& n, OutGrads g) {
  ASPEN_RETURN_IF_ERROR(first_output_only(n, g, {"y", "mean", "rstd"}));
  if (!g[0]) return no_grads(n);
  std::vector<ValueId> d =
      b.op(OpKind::batch_norm_grad, {*g[0], n.inputs[0], n.inputs[1], n.outputs[1], n.outputs[2]});
  if (d.size() != 3) return no_grads(n);  // the builder's status holds the error
  return std::vector<std::optional<ValueId>>{d[0], d[1], d[2]};
}

Status eval_batch_norm(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const BatchNormShape s, shape_of(n, in[0]->type));
  kernels::ref::batchnorm_forward<double>(s, in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                          out[0].data.data(), out[1].data.data(), out[2].data.data(),
                                          n.attrs.f("eps"));
  return Status();
}

Status eval_batch_norm_grad(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const BatchNormShape s, shape_of(n, in[1]->type));
  kernels::ref::batchnorm_backward<double>(s, in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                           in[3]->data.data(), in[4]->data.data(), out[0].data.data(),
                                           out[1].data.data(), out[2].data.data());
  return Status();
}

// bf16 and f16 run the f32 kernels on widened copies (kernels/scratch.h), rounding the outputs once.
using kernels::narrow_from_f32;
using kernels::op_scratch_of;
using kernels::widen_to_f32;
Status no_scratch() { return Status::error(Code::kOutOfRange, "batch norm scratch", "memory", "none left"); }

Prepared prepare_batch_norm(const Node& n, Types in, Types) {
  const TensorType& x = n.op == OpKind::batch_norm ? in[0] : in[1];
  const DType t = x.dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16) return no_fast_kernel();
  ASPEN_ASSIGN_OR_RETURN(const BatchNormShape s, shape_of(n, x));
  const int64_t N = s.N * s.C * s.S, C = s.C;
  const bool wide = t != DType::f32;
  if (n.op == OpKind::batch_norm) {
    const float eps = float(n.attrs.f("eps"));
    return make_kernel([s, eps, t, N, C, wide](In i, Out o) {
      if (!wide)
        return kernels::batchnorm_forward(s, f32_in(i, 0), f32_in(i, 1), f32_in(i, 2), static_cast<float*>(o[0]),
                                          static_cast<float*>(o[1]), static_cast<float*>(o[2]), eps);
      float *xw = op_scratch_of<float>(0, N), *gw = op_scratch_of<float>(1, C), *bw = op_scratch_of<float>(2, C),
            *yw = op_scratch_of<float>(3, N);
      if (!xw || !gw || !bw || !yw) return no_scratch();
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[0], xw, N));
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[1], gw, C));
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[2], bw, C));
      ASPEN_RETURN_IF_ERROR(kernels::batchnorm_forward(s, xw, gw, bw, yw, static_cast<float*>(o[1]),
                                                       static_cast<float*>(o[2]), eps));
      return narrow_from_f32(t, yw, o[0], N);
    });
  }
  return make_kernel([s, t, N, C, wide](In i, Out o) {
    if (!wide)
      return kernels::batchnorm_backward(s, f32_in(i, 0), f32_in(i, 1), f32_in(i, 2), f32_in(i, 3), f32_in(i, 4),
                                         static_cast<float*>(o[0]), static_cast<float*>(o[1]),
                                         static_cast<float*>(o[2]));
    float *dyw = op_scratch_of<float>(0, N), *xw = op_scratch_of<float>(1, N), *gw = op_scratch_of<float>(2, C),
          *dxw = op_scratch_of<float>(3, N), *dgw = op_scratch_of<float>(4, C), *dbw = op_scratch_of<float>(5, C);
    if (!dyw || !xw || !gw || !dxw || !dgw || !dbw) return no_scratch();
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[0], dyw, N));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[1], xw, N));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[2], gw, C));
    ASPEN_RETURN_IF_ERROR(
        kernels::batchnorm_backward(s, dyw, xw, gw, f32_in(i, 3), f32_in(i, 4), dxw, dgw, dbw));
    ASPEN_RETURN_IF_ERROR(narrow_from_f32(t, dxw, o[0], N));
    ASPEN_RETURN_IF_ERROR(narrow_from_f32(t, dgw, o[1], C));
    return narrow_from_f32(t, dbw, o[2], C);
  });
}

// Odd shapes (one spatial value, a rank-2 batch, 3-D spatial axes, a channel count past a vector), f32, bf16
// and f16. The backward's samples run the forward first for its statistics.
void bn_samples(SampleList& s, bool grad) {
  struct Case {
    Shape x;
    DType t;
  };
  for (const Case& c : {Case{Shape{2, 3, 5, 7}, DType::f32}, Case{Shape{5, 17}, DType::f32},
                        Case{Shape{3, 4, 2, 3, 5}, DType::f32}, Case{Shape{4, 130, 3, 3}, DType::f32},
                        Case{Shape{2, 3, 4}, DType::bf16}, Case{Shape{3, 5, 6}, DType::f16}}) {
    OpSample& o = s.add(std::string(dtype_name(c.t)) + " " + c.x.to_string(), [&](Builder& b) {
      const ValueId x = b.input("x", c.t, c.x);
      const ValueId gamma = b.input("gamma", c.t, Shape{c.x[1]}), beta = b.input("beta", c.t, Shape{c.x[1]});
      std::vector<ValueId> f = b.op(OpKind::batch_norm, {x, gamma, beta}, {{"eps", 1e-5}});
      if (grad && f.size() == 3)
        b.op(OpKind::batch_norm_grad, {b.input("dy", c.t, c.x), x, gamma, f[1], f[2]});
    });
    if (c.t != DType::f32) o.tol = c.t == DType::bf16 ? 1e-2 : 2e-3;
  }
}
void samples_batch_norm(SampleList& s) { bn_samples(s, false); }
void samples_batch_norm_grad(SampleList& s) { bn_samples(s, true); }

}  // namespace

void register_batchnorm_ops(OpTable& t) {
  t.define(OpKind::batch_norm, {.min_inputs = 3,
                                .max_inputs = 3,
                                .attrs = {{"eps", AttrKind::f64, true}},
                                .infer = infer_batch_norm,
                                .grad = grad_batch_norm,
                                .eval = eval_batch_norm,
                                .prepare = prepare_batch_norm,
                                .samples = samples_batch_norm});
  t.define(OpKind::batch_norm_grad, {.min_inputs = 5,
                                     .max_inputs = 5,
                                     .infer = infer_batch_norm_grad,
                                     .eval = eval_batch_norm_grad,
                                     .prepare = prepare_batch_norm,
                                     .samples = samples_batch_norm_grad});
}

}  // namespace aspen::graph
