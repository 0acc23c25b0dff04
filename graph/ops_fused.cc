// graph/ops_fused.cc: ops the fusion pass makes (compiler/fusion.cc). Each is
// exactly the composition it replaces, so the reference kernels define it by
// that composition; they run after autodiff and are never differentiated.
//
//   bias_gelu(x, bias) {tanh}: gelu(x + broadcast(bias)); x [..., C], bias [C]
//   add_layernorm(x, residual, gamma, beta) {eps}: h = x + residual, then
//       layernorm(h): outputs h, y, mean, rstd (mean and rstd f32, like layernorm)
#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/activation.h"
#include "kernels/norm.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

int64_t last_dim(const TensorType& t) { return t.shape.rank() ? t.shape[-1] : 1; }

Status infer_bias_gelu(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "x", in[0], 1));
  if (in[1] != TensorType{in[0].dtype, Shape{last_dim(in[0])}})
    return rule_error(n, "bias", TensorType{in[0].dtype, Shape{last_dim(in[0])}}.to_string(), in[1].to_string());
  out = {in[0]};
  return Status();
}

kernels::GeluKind kind_of(const Node& n) {
  return n.attrs.i_or("tanh", 1) ? kernels::GeluKind::tanh : kernels::GeluKind::erf;
}

Status eval_bias_gelu(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const int64_t C = last_dim(in[0]->type), R = in[0]->numel() / std::max<int64_t>(C, 1);
  kernels::ref::bias_gelu_forward<double>(in[0]->data.data(), in[1]->data.data(), out[0].data.data(), R, C,
                                          kind_of(n));
  return Status();
}

Prepared prepare_bias_gelu(const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t C = last_dim(in[0]), R = in[0].shape.numel() / std::max<int64_t>(C, 1);
  const kernels::GeluKind kind = kind_of(n);
  return make_kernel([R, C, kind](In i, Out o) {
    return kernels::bias_gelu_forward(in_span<float>(i, 0, R * C), in_span<float>(i, 1, C),
                                      out_span<float>(o, 0, R * C), R, C, kind);
  });
}

Status infer_add_layernorm(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "x", in[0], 1));
  ASPEN_RETURN_IF_ERROR(expect_same(n, in, 0, 1));
  const TensorType vec{in[0].dtype, Shape{last_dim(in[0])}};
  if (in[2] != vec) return rule_error(n, "gamma", vec.to_string(), in[2].to_string());
  if (in[3] != vec) return rule_error(n, "beta", vec.to_string(), in[3].to_string());
  const TensorType stat{kStat, drop_last(in[0].shape)};
  out = {in[0], in[0], stat, stat};
  return Status();
}

Status eval_add_layernorm(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const int64_t C = last_dim(in[0]->type), R = in[0]->numel() / std::max<int64_t>(C, 1);
  kernels::ref::add_layernorm_forward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                              in[3]->data.data(), out[0].data.data(), out[1].data.data(),
                                              out[2].data.data(), out[3].data.data(), R, C, n.attrs.f("eps"));
  return Status();
}

Prepared prepare_add_layernorm(const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t C = last_dim(in[0]), R = in[0].shape.numel() / std::max<int64_t>(C, 1);
  const float eps = float(n.attrs.f("eps"));
  return make_kernel([R, C, eps](In i, Out o) {
    return kernels::add_layernorm_forward(in_span<float>(i, 0, R * C), in_span<float>(i, 1, R * C),
                                          in_span<float>(i, 2, C), in_span<float>(i, 3, C),
                                          out_span<float>(o, 0, R * C), out_span<float>(o, 1, R * C),
                                          out_span<float>(o, 2, R), out_span<float>(o, 3, R), R, C, eps);
  });
}

// Samples for the kernel sweep (graph/op_sample.h): odd widths, one size large enough to split into row
// chunks, and bf16 (the reference).
void samples_bias_gelu(SampleList& s) {
  for (int64_t tanh_form : {1, 0})
    for (const Shape& x : {Shape{3, 5, 7}, Shape{260, 131}})
      s.add("f32 " + x.to_string() + (tanh_form ? " tanh" : " erf"),
            [&](Builder& b) {
              b.op(OpKind::bias_gelu, {b.input("x", DType::f32, x), b.input("bias", DType::f32, Shape{x[-1]})},
                   {{"tanh", tanh_form}});
            },
            {.lo = -4.0, .hi = 4.0});
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::bias_gelu, {b.input("x", DType::bf16, Shape{3, 4}), b.input("bias", DType::bf16, Shape{4})});
   }).fast = false;
}

void samples_add_layernorm(SampleList& s) {
  for (const Shape& x : {Shape{2, 3, 13}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) {
      b.op(OpKind::add_layernorm,
           {b.input("x", DType::f32, x), b.input("residual", DType::f32, x), b.input("gamma", DType::f32, Shape{x[-1]}),
            b.input("beta", DType::f32, Shape{x[-1]})},
           {{"eps", 1e-5}});
    });
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::add_layernorm,
          {b.input("x", DType::bf16, Shape{3, 4}), b.input("residual", DType::bf16, Shape{3, 4}),
           b.input("gamma", DType::bf16, Shape{4}), b.input("beta", DType::bf16, Shape{4})},
          {{"eps", 1e-5}});
   }).fast = false;
}

}  // namespace

void register_fused_ops(OpTable& t) {
  t.define(OpKind::bias_gelu, {.min_inputs = 2,
                               .max_inputs = 2,
                               .attrs = {{"tanh", AttrKind::i64, false}},
                               .infer = infer_bias_gelu,
                               .eval = eval_bias_gelu,
                               .prepare = prepare_bias_gelu,
                               .samples = samples_bias_gelu});
  t.define(OpKind::add_layernorm, {.min_inputs = 4,
                                   .max_inputs = 4,
                                   .attrs = {{"eps", AttrKind::f64, true}},
                                   .infer = infer_add_layernorm,
                                   .eval = eval_add_layernorm,
                                   .prepare = prepare_add_layernorm,
                                   .samples = samples_add_layernorm});
}

}  // namespace aspen::graph
