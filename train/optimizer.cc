#include "train/optimizer.h"

namespace aspen::train {

using graph::OpKind;
using graph::ValueId;

std::string exp_avg_name(const std::string& name) { return "optimizer.exp_avg." + name; }
std::string exp_avg_sq_name(const std::string& name) { return "optimizer.exp_avg_sq." + name; }

Result<OptimizerGraph> append_adamw(graph::Builder& b, std::span<const ValueId> params,
                                    std::span<const ValueId> grads, const AdamWOptions& options) {
  ASPEN_RETURN_IF_ERROR(b.status());
  if (params.size() != grads.size())
    return Status::invalid_argument("append_adamw: grads", std::to_string(params.size()) + " (one per parameter)",
                                    std::to_string(grads.size()));
  const graph::Graph& g = b.graph();
  OptimizerGraph out;
  out.lr = b.input(kLrName, DType::f32, Shape{});
  const ValueId step_state = b.parameter(kStepName, DType::f32, Shape{});
  out.step = b.add(step_state, b.scalar(1.0f));
  b.update(step_state, out.step);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].valid() || params[i].index >= g.num_values() || g.producer(params[i]).op != OpKind::parameter)
      return Status::invalid_argument("append_adamw: params[" + std::to_string(i) + "]", "a parameter value",
                                      "something else");
    const std::string name = g.producer(params[i]).name;  // a copy: recording moves the node table
    const graph::TensorType type = g.type(params[i]);
    if (type.dtype != DType::f32)
      return Status::invalid_argument("append_adamw: parameter '" + name + "'", "f32 (master weights)",
                                      type.to_string());
    if (!grads[i].valid() || grads[i].index >= g.num_values() || g.type(grads[i]) != type)
      return Status::invalid_argument("append_adamw: gradient of '" + name + "'", type.to_string(),
                                      grads[i].valid() && grads[i].index < g.num_values()
                                          ? g.type(grads[i]).to_string()
                                          : std::string("an invalid value"));
    double decay = options.weight_decay;
    for (const std::string& pattern : options.no_decay)
      if (name.find(pattern) != std::string::npos) decay = 0.0;
    const ValueId m = b.parameter(exp_avg_name(name), type.dtype, type.shape);
    const ValueId v = b.parameter(exp_avg_sq_name(name), type.dtype, type.shape);
    std::vector<ValueId> r = b.op(OpKind::adamw, {params[i], grads[i], m, v, out.lr, out.step},
                                  {{"beta1", options.beta1},
                                   {"beta2", options.beta2},
                                   {"eps", options.eps},
                                   {"weight_decay", decay}});
    ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context("append_adamw: parameter '" + name + "'"));
    b.update(params[i], r[0]);
    b.update(m, r[1]);
    b.update(v, r[2]);
  }
  ASPEN_RETURN_IF_ERROR(b.status());
  return out;
}

}  // namespace aspen::train
