// graph/ops_dropout.cc: dropout in training, the graph form of kernels/dropout.h.
//
//   dropout(x float, seed i64 [1] or []) {ratio in [0, 1), stream} -> y, x's type
//       y = x / (1 - ratio) where Philox element n of `stream` under the run-time seed keeps element n, else
//       0; a negative seed: y = x (validation, inference). The seed is an input, not an attribute: each
//       micro-batch feeds its own and nothing recompiles.
//
//   random_uniform(like float, seed i64 [1] or []) {low, high, stream} -> like's type
//       element n = low + (high - low) u, u the 24 bits dropout compares for element n, / 2^24: the draws
//       of ONNX's RandomUniformLike (torch's bernoulli in a training-mode export; compiler/fusion.cc turns
//       its dropout form back into dropout). A negative seed is an error: the graph means random values,
//       and validation or inference has none to give.
//
// Gradients: dropout's dx = dropout(g, seed) {ratio, stream}: the same mask, drawn again (never stored).
// No gradient to the seed; none through random_uniform (its values do not depend on `like`'s).
// Fast kernels: f32 (other float types run the reference, the same draws).
#include <cmath>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/dropout.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

// The run-time seed input both ops take.
Status expect_seed(const Node& n, const TensorType& seed) {
  if (seed.dtype == DType::i64 && seed.shape.numel() == 1 && seed.shape.rank() <= 1) return Status();
  return rule_error(n, "seed", "an i64 [1] or [] (the run-time seed)", seed.to_string());
}

Status infer_dropout(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_seed(n, in[1]));
  const double ratio = n.attrs.f("ratio");
  if (!(ratio >= 0.0 && ratio < 1.0)) return rule_error(n, "attribute 'ratio'", "in [0, 1)", std::to_string(ratio));
  if (n.attrs.i_or("stream", 0) < 0) return rule_error(n, "attribute 'stream'", ">= 0", str(n.attrs.i_or("stream", 0)));
  out = {in[0]};
  return Status();
}

Grads grad_dropout(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::dropout, {*g[0], n.inputs[1]}, n.attrs), std::nullopt};
}

Status eval_dropout(const Node& n, Ins in, Outs out) {
  const double seed = in[1]->data[0];  // the interpreter's f64: exact below 2^53
  kernels::ref::dropout_forward<double>(in[0]->data.data(), out[0].data.data(), in[0]->numel(), int64_t(seed),
                                        uint64_t(n.attrs.i_or("stream", 0)), n.attrs.f("ratio"));
  return Status();
}

Prepared prepare_dropout(const Node& n, Types in, Types) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t N = in[0].shape.numel();
  const double ratio = n.attrs.f("ratio");
  const uint64_t stream = uint64_t(n.attrs.i_or("stream", 0));
  return make_kernel([N, ratio, stream](In i, Out o) {
    const int64_t seed = in_span<int64_t>(i, 1, 1)[0];
    return kernels::dropout_forward(in_span<float>(i, 0, N), out_span<float>(o, 0, N), N, seed, stream, ratio);
  });
}

// Exact against the reference (the same draws): odd and chunked shapes, a seed, no dropout (seed -1), and
// a ratio whose threshold is not a whole number of 2^-24.
void samples_dropout(SampleList& s) {
  for (const Shape& shape : {Shape{3, 5, 7}, Shape{2, 130, 131}})
    for (double seed : {12345.0, -1.0})
      for (double ratio : {0.1, 1.0 / 3.0})
        s.add(
             "f32 " + shape.to_string() + " seed " + std::to_string(int64_t(seed)) + " ratio " + std::to_string(ratio),
             [&](Builder& b) {
               b.op(OpKind::dropout, {b.input("x", DType::f32, shape), b.input("seed", DType::i64, Shape{1})},
                    {{"ratio", ratio}, {"stream", int64_t(7)}});
             },
             SampleFeeds{.values = {{"seed", {seed}}}})
            .tol = 0;
}

Status infer_random_uniform(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "like", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_seed(n, in[1]));
  const double lo = n.attrs.f("low"), hi = n.attrs.f("high");
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo <= hi))
    return rule_error(n, "attributes 'low' and 'high'", "finite, low <= high", std::to_string(lo) + ", " + std::to_string(hi));
  out = {in[0]};
  return Status();
}

Grads grad_random_uniform(Builder&, const Node&, OutGrads) {
  return std::vector<std::optional<ValueId>>{std::nullopt, std::nullopt};
}

Status negative_seed(int64_t seed) {
  return Status::invalid_argument("random_uniform: seed",
                                  ">= 0 (the graph draws random values: a training step; export the model in eval "
                                  "mode for validation or inference)",
                                  std::to_string(seed));
}

Status eval_random_uniform(const Node& n, Ins in, Outs out) {
  const int64_t seed = int64_t(in[1]->data[0]);
  if (seed < 0) return negative_seed(seed);
  kernels::ref::uniform_draw<double>(out[0].data.data(), out[0].numel(), seed, uint64_t(n.attrs.i_or("stream", 0)),
                                     n.attrs.f("low"), n.attrs.f("high"));
  return Status();
}

Prepared prepare_random_uniform(const Node& n, Types in, Types) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t N = in[0].shape.numel();
  const double lo = n.attrs.f("low"), hi = n.attrs.f("high");
  const uint64_t stream = uint64_t(n.attrs.i_or("stream", 0));
  return make_kernel([N, lo, hi, stream](In i, Out o) {
    const int64_t seed = in_span<int64_t>(i, 1, 1)[0];
    if (seed < 0) return negative_seed(seed);
    return kernels::uniform_draw(out_span<float>(o, 0, N), N, seed, stream, lo, hi);
  });
}

void samples_random_uniform(SampleList& s) {
  for (const Shape& shape : {Shape{3, 5, 7}, Shape{2, 130, 131}})
    s.add("f32 " + shape.to_string(), [&](Builder& b) {
       b.op(OpKind::random_uniform, {b.input("x", DType::f32, shape), b.input("seed", DType::i64, Shape{1})},
            {{"low", -2.0}, {"high", 3.0}, {"stream", int64_t(5)}});
     }, SampleFeeds{.values = {{"seed", {98765.0}}}}).tol = 1e-7;
}

}  // namespace

void register_dropout_ops(OpTable& t) {
  t.define(OpKind::random_uniform,
           {.min_inputs = 2,
            .max_inputs = 2,
            .attrs = {{"low", AttrKind::f64, true}, {"high", AttrKind::f64, true}, {"stream", AttrKind::i64, false}},
            .infer = infer_random_uniform,
            .grad = grad_random_uniform,
            .eval = eval_random_uniform,
            .prepare = prepare_random_uniform,
            .samples = samples_random_uniform});
  t.define(OpKind::dropout, {.min_inputs = 2,
                             .max_inputs = 2,
                             .attrs = {{"ratio", AttrKind::f64, true}, {"stream", AttrKind::i64, false}},
                             .infer = infer_dropout,
                             .grad = grad_dropout,
                             .eval = eval_dropout,
                             .prepare = prepare_dropout,
                             .samples = samples_dropout});
}

}  // namespace aspen::graph
