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
//   lamb(param, grad, m, v, lr, step[, grad_scale]) {beta1, beta2, eps, weight_decay}
//       -> param', m', v'      (kernels/optimizers.h: LAMB, per-tensor trust ratio)
//   sgd(param, grad, [buf,] lr[, grad_scale]) {momentum, weight_decay, nesterov}
//       -> param' [, buf']     (torch.optim.SGD; buf only when momentum > 0)
//   sum_squares(x) -> f32[]    Σ x² of an f32 tensor, summed in f64 in a fixed
//       order (the same bits for any thread count); Inf or NaN anywhere makes it
//       non-finite. Gradient clipping and overflow checks read it.
// Not differentiated. The optimizer outputs are meant for Builder::update():
// the memory plan writes them into the parameter's and state's own storage.
#include <cmath>
#include <cstring>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/adamw.h"
#include "kernels/optimizers.h"

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

// Copies input `src` into output `dst` unless the plan made them one buffer.
void copy_unless_same(void* dst, const void* src, int64_t n) {
  if (dst != src && n) std::memcpy(dst, src, size_t(n) * sizeof(float));
}

// ---- lamb: adamw's signature and checks, kernels::lamb_step.
Result<kernels::LambConfig> lamb_config_of(const Node& n, double lr, double step, double grad_scale) {
  ASPEN_ASSIGN_OR_RETURN(const kernels::AdamWConfig a, config_of(n, lr, step, grad_scale));
  kernels::LambConfig c;
  c.lr = a.lr, c.beta1 = a.beta1, c.beta2 = a.beta2, c.eps = a.eps, c.weight_decay = a.weight_decay;
  c.step = a.step, c.grad_scale = a.grad_scale;
  return c;
}

Status eval_lamb(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  ASPEN_ASSIGN_OR_RETURN(const kernels::LambConfig c,
                         lamb_config_of(n, in[4]->data[0], in[5]->data[0], in.size() > 6 ? in[6]->data[0] : 1.0));
  out[0].data = in[0]->data;
  out[1].data = in[2]->data;
  out[2].data = in[3]->data;
  kernels::ref::lamb_step<double>(out[0].data.data(), in[1]->data.data(), out[1].data.data(), out[2].data.data(),
                                  in[0]->numel(), c);
  return Status();
}

Prepared prepare_lamb(const Node& n, std::span<const TensorType> in, std::span<const TensorType>) {
  const int64_t N = in[0].shape.numel();
  const bool scaled = in.size() > 6;
  return make_kernel([node = n, N, scaled](In i, Out o) -> Status {
    const float lr = *static_cast<const float*>(i[4]), step = *static_cast<const float*>(i[5]);
    const float scale = scaled ? *static_cast<const float*>(i[6]) : 1.0f;
    ASPEN_ASSIGN_OR_RETURN(const kernels::LambConfig c, lamb_config_of(node, lr, step, scale));
    copy_unless_same(o[0], i[0], N);
    copy_unless_same(o[1], i[2], N);
    copy_unless_same(o[2], i[3], N);
    return kernels::lamb_step(out_span<float>(o, 0, N), in_span<float>(i, 1, N), out_span<float>(o, 1, N),
                              out_span<float>(o, 2, N), N, c);
  });
}

// ---- sgd: the buffer is an input and an output only with momentum.
bool has_momentum(const Node& n) { return n.attrs.f("momentum") != 0.0; }

Status infer_sgd(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const double momentum = n.attrs.f("momentum"), wd = n.attrs.f("weight_decay");
  const int64_t nesterov = n.attrs.i("nesterov");
  if (!(momentum >= 0.0 && momentum < 1.0)) return rule_error(n, "momentum", "in [0, 1)", std::to_string(momentum));
  if (!(wd >= 0.0)) return rule_error(n, "weight_decay", ">= 0", std::to_string(wd));
  if (nesterov != 0 && nesterov != 1) return rule_error(n, "nesterov", "0 or 1", std::to_string(nesterov));
  if (nesterov && momentum == 0.0) return rule_error(n, "nesterov", "momentum > 0", "momentum 0");
  const size_t tensors = has_momentum(n) ? 3 : 2;
  if (in.size() < tensors + 1 || in.size() > tensors + 2)
    return rule_error(n, "inputs", has_momentum(n) ? "param, grad, buf, lr[, grad_scale] (momentum > 0)"
                                                   : "param, grad, lr[, grad_scale] (momentum 0)",
                      std::to_string(in.size()) + " inputs");
  if (in[0].dtype != DType::f32) return rule_error(n, "param", "f32 (master weights)", in[0].to_string());
  const char* names[] = {"param", "grad", "buf"};
  for (size_t k = 1; k < tensors; ++k)
    if (in[k] != in[0]) return rule_error(n, names[k], in[0].to_string() + " (param's type)", in[k].to_string());
  for (size_t k = tensors; k < in.size(); ++k)
    if (in[k] != TensorType{DType::f32, Shape{}})
      return rule_error(n, k == tensors ? "lr" : "grad_scale", "f32[] (a scalar)", in[k].to_string());
  out.assign(tensors - 1, in[0]);
  return Status();
}

Result<kernels::SgdConfig> sgd_config_of(const Node& n, double lr, double grad_scale) {
  if (!(lr >= 0.0)) return Status::invalid_argument("sgd: lr", ">= 0", std::to_string(lr));
  kernels::SgdConfig c;
  c.lr = lr;
  c.momentum = n.attrs.f("momentum");
  c.weight_decay = n.attrs.f("weight_decay");
  c.nesterov = n.attrs.i("nesterov") != 0;
  c.grad_scale = float(grad_scale);
  return c;
}

Status eval_sgd(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const size_t lr_at = has_momentum(n) ? 3 : 2;
  ASPEN_ASSIGN_OR_RETURN(const kernels::SgdConfig c,
                         sgd_config_of(n, in[lr_at]->data[0], in.size() > lr_at + 1 ? in[lr_at + 1]->data[0] : 1.0));
  out[0].data = in[0]->data;
  double* buf = nullptr;
  if (has_momentum(n)) {
    out[1].data = in[2]->data;
    buf = out[1].data.data();
  }
  kernels::ref::sgd_step<double>(out[0].data.data(), in[1]->data.data(), buf, in[0]->numel(), c);
  return Status();
}

Prepared prepare_sgd(const Node& n, std::span<const TensorType> in, std::span<const TensorType>) {
  const int64_t N = in[0].shape.numel();
  const bool momentum = has_momentum(n);
  const size_t lr_at = momentum ? 3 : 2;
  const bool scaled = in.size() > lr_at + 1;
  return make_kernel([node = n, N, momentum, lr_at, scaled](In i, Out o) -> Status {
    const float lr = *static_cast<const float*>(i[lr_at]);
    const float scale = scaled ? *static_cast<const float*>(i[lr_at + 1]) : 1.0f;
    ASPEN_ASSIGN_OR_RETURN(const kernels::SgdConfig c, sgd_config_of(node, lr, scale));
    copy_unless_same(o[0], i[0], N);
    if (momentum) copy_unless_same(o[1], i[2], N);
    return kernels::sgd_step(out_span<float>(o, 0, N), in_span<float>(i, 1, N),
                             momentum ? out_span<float>(o, 1, N) : std::span<float>(), N, c);
  });
}

// ---- sum_squares
Status infer_sum_squares(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  if (in[0].dtype != DType::f32) return rule_error(n, "x", "an f32 tensor", in[0].to_string());
  out = {TensorType{DType::f32, Shape{}}};
  return Status();
}

Status eval_sum_squares(const Node&, std::span<const HostArray* const> in, std::span<HostArray> out) {
  double s = 0.0;
  for (double x : in[0]->data) s += x * x;
  out[0].data = {s};
  return Status();
}

Prepared prepare_sum_squares(const Node&, std::span<const TensorType> in, std::span<const TensorType>) {
  const int64_t N = in[0].shape.numel();
  return make_kernel([N](In i, Out o) -> Status {
    ASPEN_ASSIGN_OR_RETURN(const double s, kernels::sum_squares(in_span<float>(i, 0, N), N));
    *static_cast<float*>(o[0]) = float(s);
    return Status();
  });
}

// Samples for the kernel sweep (graph/op_sample.h): an odd size and one large enough for the parallel
// path, with and without the loss scale's grad_scale; v drawn non-negative, as a second moment is.
constexpr int64_t kOptimSizes[] = {37, 5003};

void adam_samples(SampleList& s, OpKind op) {
  for (int64_t n : kOptimSizes)
    for (bool scaled : {false, true})
      s.add("f32 [" + std::to_string(n) + "]" + (scaled ? " grad_scale" : ""),
            [&](Builder& b) {
              const Shape t{n};
              std::vector<ValueId> in{b.input("param", DType::f32, t),    b.input("grad", DType::f32, t),
                                      b.input("m", DType::f32, t),        b.input("v", DType::f32, t),
                                      b.input("lr", DType::f32, Shape{}), b.input("step", DType::f32, Shape{})};
              if (scaled) in.push_back(b.input("grad_scale", DType::f32, Shape{}));
              b.op(op, in, {{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}});
            },
            {.ranges = {{"v", {0.0, 0.1}}}, .values = {{"lr", {0.01}}, {"step", {3}}, {"grad_scale", {0.25}}}});
}
void samples_adamw(SampleList& s) { adam_samples(s, OpKind::adamw); }
void samples_lamb(SampleList& s) { adam_samples(s, OpKind::lamb); }

void samples_sgd(SampleList& s) {
  struct Case {
    double momentum;
    int64_t nesterov;
  };
  for (int64_t n : kOptimSizes)
    for (const Case& c : {Case{0.0, 0}, Case{0.9, 0}, Case{0.9, 1}})
      for (bool scaled : {false, true})
        s.add("f32 [" + std::to_string(n) + "] momentum " + std::to_string(c.momentum) + " nesterov " +
                  std::to_string(c.nesterov) + (scaled ? " grad_scale" : ""),
              [&](Builder& b) {
                const Shape t{n};
                std::vector<ValueId> in{b.input("param", DType::f32, t), b.input("grad", DType::f32, t)};
                if (c.momentum > 0) in.push_back(b.input("buf", DType::f32, t));
                in.push_back(b.input("lr", DType::f32, Shape{}));
                if (scaled) in.push_back(b.input("grad_scale", DType::f32, Shape{}));
                b.op(OpKind::sgd, in, {{"momentum", c.momentum}, {"weight_decay", 0.01}, {"nesterov", c.nesterov}});
              },
              {.values = {{"lr", {0.05}}, {"grad_scale", {0.25}}}});
}

void samples_sum_squares(SampleList& s) {
  for (const Shape& x : {Shape{3, 5, 7}, Shape{130, 131}, Shape{}, Shape{0}})
    s.add("f32 " + x.to_string(), [&](Builder& b) { b.op(OpKind::sum_squares, {b.input("x", DType::f32, x)}); });
}

}  // namespace

void register_optim_ops(OpTable& t) {
  // AdamW and LAMB take the same inputs and hyper-parameters.
  const std::vector<AttrSpec> adam_attrs = {{"beta1", AttrKind::f64, true},
                                            {"beta2", AttrKind::f64, true},
                                            {"eps", AttrKind::f64, true},
                                            {"weight_decay", AttrKind::f64, true}};
  t.define(OpKind::lamb, {.flags = kWritesInPlace,
                          .min_inputs = 6,
                          .max_inputs = 7,
                          .attrs = adam_attrs,
                          .infer = infer_adamw,
                          .eval = eval_lamb,
                          .prepare = prepare_lamb,
                          .samples = samples_lamb});
  t.define(OpKind::sgd, {.flags = kWritesInPlace,
                         .min_inputs = 3,
                         .max_inputs = 5,
                         .attrs = {{"momentum", AttrKind::f64, true},
                                   {"weight_decay", AttrKind::f64, true},
                                   {"nesterov", AttrKind::i64, true}},
                         .infer = infer_sgd,
                         .eval = eval_sgd,
                         .prepare = prepare_sgd,
                         .samples = samples_sgd});
  t.define(OpKind::sum_squares, {.min_inputs = 1,
                                 .max_inputs = 1,
                                 .infer = infer_sum_squares,
                                 .eval = eval_sum_squares,
                                 .prepare = prepare_sum_squares,
                                 .samples = samples_sum_squares});
  t.define(OpKind::adamw, {.flags = kWritesInPlace,
                           .min_inputs = 6,
                           .max_inputs = 7,
                           .attrs = adam_attrs,
                           .infer = infer_adamw,
                           .eval = eval_adamw,
                           .prepare = prepare_adamw,
                           .samples = samples_adamw});
}

}  // namespace aspen::graph
