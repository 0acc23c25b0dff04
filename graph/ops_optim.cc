// graph/ops_optim.cc: optimizer steps as ops, so a training program holds its
// own update (W1.4 builds on them; train/optimizer.h records them).
//
//   adamw(param, grad, m, v, lr, step[, grad_scale]) {beta1, beta2, eps, weight_decay}
//       -> param', m', v'
//       param, grad, m, v: f32, one shape; lr, step, grad_scale: f32 rank 0,
//       runtime values (a learning-rate schedule or loss scale never
//       recompiles); step is the 1-based number of this update (PyTorch keeps
//       it as an f32 tensor too). The math is kernels/adamw.h's, PyTorch's
//       order of operations.
// Not differentiated. The outputs are meant for Builder::update(): the memory
// plan writes them into the parameter's and state's own storage.
#include <cmath>
#include <cstring>

#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/adamw.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

Status infer_adamw(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const char* names[] = {"param", "grad", "m", "v", "lr", "step", "grad_scale"};
  if (in[0].dtype != DType::f32) return rule_error(n, "param", "f32 (master weights)", in[0].to_string());
  for (size_t k = 1; k < 4; ++k)
    if (in[k] != in[0]) return rule_error(n, names[k], in[0].to_string() + " (param's type)", in[k].to_string());
  for (size_t k = 4; k < in.size(); ++k)
    if (in[k] != TensorType{DType::f32, Shape{}}) return rule_error(n, names[k], "f32[] (a scalar)", in[k].to_string());
  for (const char* a : {"beta1", "beta2"}) {
    const double b = n.attrs.f(a);
    if (!(b >= 0.0 && b < 1.0)) return rule_error(n, a, "in [0, 1)", std::to_string(b));
  }
  for (const char* a : {"eps", "weight_decay"}) {
    const double x = n.attrs.f(a);
    if (!(x >= 0.0)) return rule_error(n, a, ">= 0", std::to_string(x));
  }
  out = {in[0], in[0], in[0]};
  return Status();
}

// The step's configuration from the node's attributes and the scalar inputs.
Result<kernels::AdamWConfig> config_of(const Node& n, double lr, double step, double grad_scale) {
  kernels::AdamWConfig c;
  if (!(lr >= 0.0)) return Status::invalid_argument("adamw: lr", ">= 0", std::to_string(lr));
  c.lr = lr;
  c.beta1 = n.attrs.f("beta1");
  c.beta2 = n.attrs.f("beta2");
  c.eps = n.attrs.f("eps");
  c.weight_decay = n.attrs.f("weight_decay");
  if (!(step >= 1.0) || step != std::floor(step))
    return Status::invalid_argument("adamw: step", "a whole number >= 1", std::to_string(step));
  c.step = int64_t(step);
  c.grad_scale = float(grad_scale);
  return c;
}

Status eval_adamw(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  ASPEN_ASSIGN_OR_RETURN(const kernels::AdamWConfig c,
                         config_of(n, in[4]->data[0], in[5]->data[0], in.size() > 6 ? in[6]->data[0] : 1.0));
  out[0].data = in[0]->data;
  out[1].data = in[2]->data;
  out[2].data = in[3]->data;
  kernels::ref::adamw_step<double>(out[0].data.data(), in[1]->data.data(), out[1].data.data(), out[2].data.data(),
                                   in[0]->numel(), c);
  return Status();
}

Prepared prepare_adamw(const Node& n, std::span<const TensorType> in, std::span<const TensorType>) {
  const int64_t N = in[0].shape.numel();
  const bool scaled = in.size() > 6;
  return make_kernel([node = n, N, scaled](In i, Out o) -> Status {
    const float lr = *static_cast<const float*>(i[4]), step = *static_cast<const float*>(i[5]);
    const float scale = scaled ? *static_cast<const float*>(i[6]) : 1.0f;
    ASPEN_ASSIGN_OR_RETURN(const kernels::AdamWConfig c, config_of(node, lr, step, scale));
    // Outputs usually are the parameter's and state's own storage (planned in
    // place); otherwise start from copies of the inputs.
    for (size_t k = 0; k < 3; ++k) {
      const void* src = i[k == 0 ? 0 : k + 1];
      if (o[k] != src && N) std::memcpy(o[k], src, size_t(N) * sizeof(float));
    }
    return kernels::adamw_step(out_span<float>(o, 0, N), in_span<float>(i, 1, N), out_span<float>(o, 1, N),
                               out_span<float>(o, 2, N), N, c);
  });
}

}  // namespace

void register_optim_ops(OpTable& t) {
  t.define(OpKind::adamw, {.min_inputs = 6, .max_inputs = 7,
                           .attrs = {{"beta1", AttrKind::f64, true}, {"beta2", AttrKind::f64, true},
                                     {"eps", AttrKind::f64, true}, {"weight_decay", AttrKind::f64, true}},
                           .infer = infer_adamw, .eval = eval_adamw, .prepare = prepare_adamw});
}

}  // namespace aspen::graph
