#include "train/optimizer.h"

#include <cmath>
#include <map>

namespace aspen::train {

using graph::OpKind;
using graph::ValueId;

std::string exp_avg_name(const std::string& name) { return "optimizer.exp_avg." + name; }
std::string exp_avg_sq_name(const std::string& name) { return "optimizer.exp_avg_sq." + name; }
std::string momentum_buffer_name(const std::string& name) { return "optimizer.momentum_buffer." + name; }

const char* optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::lamb: return "lamb";
    case OptimizerKind::rmsprop: return "rmsprop";
  }
  return "?";
}

Result<OptimizerKind> parse_optimizer_kind(std::string_view name) {
  for (OptimizerKind k : {OptimizerKind::adamw, OptimizerKind::sgd, OptimizerKind::lamb, OptimizerKind::rmsprop})
    if (name == optimizer_kind_name(k)) return k;
  return Status::invalid_argument("optimizer", "adamw, sgd, lamb or rmsprop", "'" + std::string(name) + "'");
}

namespace {

// A scalar (lr, grad_scale) as a value of the parameter's shape.
ValueId like_param(graph::Builder& b, ValueId scalar, const graph::TensorType& param) {
  const std::vector<int64_t> dims(param.shape.begin(), param.shape.end());
  return dims.empty() ? scalar : b.broadcast(scalar, dims);
}

// A piece of optimizer state kept in `dtype`: the parameter, and its value widened to f32 for the update.
struct State {
  ValueId stored, value;
};

State state(graph::Builder& b, const std::string& name, const graph::TensorType& like, DType dtype) {
  const ValueId stored = b.parameter(name, dtype, like.shape);
  return {stored, dtype == DType::f32 ? stored : b.cast(stored, DType::f32)};
}

// The state's new value (f32), kept rounded to its dtype.
void keep(graph::Builder& b, const State& s, ValueId next) {
  const DType dtype = b.type(s.stored).dtype;
  b.update(s.stored, dtype == DType::f32 ? next : b.cast(next, dtype));
}

// grad · grad_scale + weight_decay · p: the gradient an L2 weight decay steps on (torch's RMSprop and Adam).
ValueId l2_gradient(graph::Builder& b, ValueId p, ValueId grad, ValueId grad_scale, double weight_decay) {
  const graph::TensorType type = b.type(p);
  ValueId g = grad;
  if (grad_scale.valid()) g = b.mul(g, like_param(b, grad_scale, type));
  return weight_decay != 0.0 ? b.add(g, b.scale(p, weight_decay)) : g;
}

struct RmspropSettings {
  double alpha, eps, weight_decay, momentum;
  bool centered;
  DType first_order, second_order;
};

// torch.optim.RMSprop's step of one parameter, as elementwise ops (lr and grad_scale scalars broadcast):
//   g = grad · grad_scale + weight_decay · p;  v = alpha v + (1 - alpha) g²
//   avg = sqrt(v - m²) + eps with m = alpha m + (1 - alpha) g (centered), else sqrt(v) + eps
//   momentum > 0: buf = momentum buf + g / avg, p -= lr buf;  else p -= lr g / avg
Status append_rmsprop_step(graph::Builder& b, ValueId p, ValueId grad, const std::string& name, ValueId lr,
                           ValueId grad_scale, const RmspropSettings& s) {
  for (double v : {s.alpha, s.momentum})
    if (!(v >= 0.0 && v < 1.0))
      return Status::invalid_argument("append_rmsprop: parameter '" + name + "' alpha and momentum",
                                      "in [0, 1)", std::to_string(s.alpha) + ", " + std::to_string(s.momentum));
  if (!(s.eps >= 0.0) || !(s.weight_decay >= 0.0))
    return Status::invalid_argument("append_rmsprop: parameter '" + name + "' eps and weight_decay", ">= 0",
                                    std::to_string(s.eps) + ", " + std::to_string(s.weight_decay));
  const graph::TensorType type = b.type(p);
  auto wide = [&](ValueId scalar) { return like_param(b, scalar, type); };
  const ValueId g = l2_gradient(b, p, grad, grad_scale, s.weight_decay);
  const State v = state(b, "optimizer.square_avg." + name, type, s.second_order);
  const ValueId v2 = b.add(b.scale(v.value, s.alpha), b.scale(b.mul(g, g), 1.0 - s.alpha));
  keep(b, v, v2);
  ValueId avg;
  if (s.centered) {
    const State m = state(b, "optimizer.grad_avg." + name, type, s.first_order);
    const ValueId m2 = b.add(b.scale(m.value, s.alpha), b.scale(g, 1.0 - s.alpha));
    keep(b, m, m2);
    avg = b.sqrt(b.sub(v2, b.mul(m2, m2)));
  } else {
    avg = b.sqrt(v2);
  }
  avg = b.add(avg, wide(b.scalar(float(s.eps))));
  ValueId step = b.div(g, avg);
  if (s.momentum != 0.0) {
    const State buf = state(b, momentum_buffer_name(name), type, s.first_order);
    step = b.add(b.scale(buf.value, s.momentum), step);
    keep(b, buf, step);
  }
  b.update(p, b.sub(p, b.mul(wide(lr), step)));
  return b.status();
}

}  // namespace

ValueId round_to(graph::Builder& b, ValueId x, DType dtype) {
  return dtype == DType::f32 ? x : b.cast(b.cast(x, dtype), DType::f32);
}

Result<OptimizerGraph> append_optimizer(graph::Builder& b, std::span<const ValueId> params,
                                        std::span<const ValueId> grads, const OptimizerOptions& options) {
  ASPEN_RETURN_IF_ERROR(b.status());
  const char* who = optimizer_kind_name(options.kind);
  const std::string fn = std::string("append_") + who;
  if (params.size() != grads.size())
    return Status::invalid_argument(fn + ": grads", std::to_string(params.size()) + " (one per parameter)",
                                    std::to_string(grads.size()));
  for (const auto& [what, dtype] : {std::pair{"gradient_dtype", options.gradient_dtype},
                                    {"first_order_dtype", options.first_order_dtype},
                                    {"second_order_dtype", options.second_order_dtype}})
    if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
      return Status::invalid_argument(fn + ": " + what, "f32, f16 or bf16", std::string(dtype_name(dtype)));
  const graph::Graph& g = b.graph();
  OptimizerGraph out;
  out.lr = b.input(kLrName, DType::f32, Shape{});
  if (options.grad_scale_input) out.grad_scale = b.input(kGradScaleName, DType::f32, Shape{});
  const ValueId step_state = b.parameter(kStepName, DType::f32, Shape{});
  out.step = b.add(step_state, b.scalar(1.0f));
  if (options.update_step) b.update(step_state, out.step);
  // Each parameter's group (-1: none) and each group's learning rate (made at its first parameter).
  std::map<std::string, int> group_of;
  for (size_t k = 0; k < options.groups.size(); ++k) {
    const ParamGroup& grp = options.groups[k];
    if (!(grp.lr_scale >= 0.0) || !std::isfinite(grp.lr_scale))
      return Status::invalid_argument(fn + ": parameter group " + std::to_string(k + 1) + " lr_scale",
                                      "a finite number >= 0", std::to_string(grp.lr_scale));
    for (const std::string& p : grp.params)
      if (!group_of.emplace(p, int(k)).second)
        return Status::invalid_argument(fn + ": parameter '" + p + "'", "in one parameter group",
                                        "in groups " + std::to_string(group_of[p] + 1) + " and " +
                                            std::to_string(k + 1));
  }
  std::vector<ValueId> group_lr(options.groups.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].valid() || params[i].index >= g.num_values() || g.producer(params[i]).op != OpKind::parameter)
      return Status::invalid_argument(fn + ": params[" + std::to_string(i) + "]", "a parameter value",
                                      "something else");
    const std::string name = g.producer(params[i]).name;  // a copy: recording moves the node table
    const graph::TensorType type = g.type(params[i]);
    if (type.dtype != DType::f32)
      return Status::invalid_argument(fn + ": parameter '" + name + "'", "f32 (master weights)", type.to_string());
    if (!grads[i].valid() || grads[i].index >= g.num_values() || g.type(grads[i]) != type)
      return Status::invalid_argument(fn + ": gradient of '" + name + "'", type.to_string(),
                                      grads[i].valid() && grads[i].index < g.num_values()
                                          ? g.type(grads[i]).to_string()
                                          : std::string("an invalid value"));
    double decay = options.weight_decay;
    for (const std::string& pattern : options.no_decay)
      if (name.find(pattern) != std::string::npos) decay = 0.0;
    double beta1 = options.beta1, beta2 = options.beta2, eps = options.eps, momentum = options.momentum;
    double alpha = options.alpha;
    ValueId lr = out.lr;
    if (auto it = group_of.find(name); it != group_of.end()) {
      const ParamGroup& grp = options.groups[size_t(it->second)];
      decay = grp.weight_decay.value_or(decay);
      beta1 = grp.beta1.value_or(beta1), beta2 = grp.beta2.value_or(beta2), eps = grp.eps.value_or(eps);
      momentum = grp.momentum.value_or(momentum), alpha = grp.alpha.value_or(alpha);
      ValueId& glr = group_lr[size_t(it->second)];
      if (!glr.valid()) glr = grp.lr_scale == 1.0 ? out.lr : b.mul(out.lr, b.scalar(float(grp.lr_scale)));
      lr = glr;
    }
    std::vector<ValueId> scale;
    if (out.grad_scale.valid()) scale.push_back(out.grad_scale);
    if (options.kind == OptimizerKind::rmsprop) {
      ASPEN_RETURN_IF_ERROR(append_rmsprop_step(b, params[i], grads[i], name, lr, out.grad_scale,
                                                {alpha, eps, decay, momentum, options.centered,
                                                 options.first_order_dtype, options.second_order_dtype}));
      ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context(fn + ": parameter '" + name + "'"));
      continue;
    }
    if (options.kind == OptimizerKind::sgd) {
      std::vector<ValueId> in = {params[i], grads[i]};
      State buf;
      if (momentum != 0.0) {
        buf = state(b, momentum_buffer_name(name), type, options.first_order_dtype);
        in.push_back(buf.value);
      }
      in.push_back(lr);
      in.insert(in.end(), scale.begin(), scale.end());
      std::vector<ValueId> r = b.op(OpKind::sgd, std::move(in),
                                    {{"momentum", momentum},
                                     {"weight_decay", decay},
                                     {"nesterov", int64_t(options.nesterov)}});
      ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context(fn + ": parameter '" + name + "'"));
      b.update(params[i], r[0]);
      if (buf.stored.valid()) keep(b, buf, r[1]);
      continue;
    }
    const State m = state(b, exp_avg_name(name), type, options.first_order_dtype);
    const State v = state(b, exp_avg_sq_name(name), type, options.second_order_dtype);
    ValueId grad = grads[i];
    if (options.kind == OptimizerKind::adamw && options.l2_weight_decay && decay != 0.0) {
      // torch.optim.Adam's weight decay: added to the (unscaled) gradient before the moments, not decoupled.
      grad = l2_gradient(b, params[i], grad, out.grad_scale, decay);
      scale.clear();
      decay = 0.0;
    }
    std::vector<ValueId> in = {params[i], grad, m.value, v.value, lr, out.step};
    in.insert(in.end(), scale.begin(), scale.end());
    std::vector<ValueId> r = b.op(options.kind == OptimizerKind::lamb ? OpKind::lamb : OpKind::adamw, std::move(in),
                                  {{"beta1", beta1},
                                   {"beta2", beta2},
                                   {"eps", eps},
                                   {"weight_decay", decay}});
    ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context(fn + ": parameter '" + name + "'"));
    b.update(params[i], r[0]);
    keep(b, m, r[1]);
    keep(b, v, r[2]);
  }
  ASPEN_RETURN_IF_ERROR(b.status());
  return out;
}

Result<OptimizerGraph> append_adamw(graph::Builder& b, std::span<const ValueId> params,
                                    std::span<const ValueId> grads, const AdamWOptions& options) {
  OptimizerOptions o;
  o.kind = OptimizerKind::adamw;
  o.beta1 = options.beta1, o.beta2 = options.beta2, o.eps = options.eps, o.weight_decay = options.weight_decay;
  o.no_decay = options.no_decay;
  return append_optimizer(b, params, grads, o);
}

}  // namespace aspen::train
