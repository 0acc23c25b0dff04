#include "graph/autodiff.h"

#include <optional>

#include "graph/builder.h"
#include "graph/ops_util.h"

namespace aspen::graph {

Result<std::vector<ValueId>> append_gradients(Graph& g, ValueId loss, std::span<const ValueId> wrt) {
  const int32_t num_nodes = int32_t(g.nodes().size());
  if (!loss.valid() || loss.index >= g.num_values())
    return Status::invalid_argument("autodiff: loss", "a value of the graph", "an invalid id");
  const TensorType loss_type = g.type(loss);
  if (!is_float(loss_type.dtype) || loss_type.shape.numel() != 1)
    return Status::invalid_argument("autodiff: loss", "a float value with one element", loss_type.to_string());

  // needed[v]: v depends on some wrt value, so a gradient must reach it.
  std::vector<char> needed(size_t(g.num_values()), 0);
  for (ValueId w : wrt) {
    if (!w.valid() || w.index >= g.num_values())
      return Status::invalid_argument("autodiff: wrt", "values of the graph", "an invalid id");
    needed[size_t(w.index)] = 1;
  }
  for (const Node& n : g.nodes()) {
    bool any = false;
    for (ValueId v : n.inputs) any = any || needed[size_t(v.index)];
    if (any)
      for (ValueId v : n.outputs) needed[size_t(v.index)] = 1;
  }

  Builder b(g);
  b.set_backward(true);
  std::vector<std::optional<ValueId>> grad(size_t(g.num_values()));
  grad[size_t(loss.index)] = b.broadcast(b.scalar(1.0f, loss_type.dtype), opsutil::dims(loss_type.shape));

  for (int32_t ni = num_nodes - 1; ni >= 0; --ni) {
    const Node node = g.node(ni);  // a copy: the builder appends to g.nodes()
    std::vector<std::optional<ValueId>> out_grads;
    bool any_out = false, any_in = false;
    for (ValueId v : node.outputs) {
      out_grads.push_back(grad[size_t(v.index)]);
      any_out = any_out || grad[size_t(v.index)].has_value();
    }
    for (ValueId v : node.inputs) any_in = any_in || needed[size_t(v.index)];
    if (!any_out || !any_in) continue;
    const OpInfo& info = op_info(node.op);
    const std::string where = "autodiff: node " + std::to_string(ni) + " (" + op_name(node.op) + ")";
    if (!info.grad)
      return Status::error(Code::kUnimplemented, where, "a gradient rule", "none, and an input needs a gradient");
    b.set_stage(node.stage);
    b.set_scope(node.scope);
    auto in_grads = info.grad(b, node, out_grads);
    if (!in_grads.is_ok()) return in_grads.status().with_context(where);
    ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context(where));
    if (in_grads->size() != node.inputs.size())
      return Status::error(Code::kInternal, where, std::to_string(node.inputs.size()) + " input gradients",
                           std::to_string(in_grads->size()));
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId in = node.inputs[i];
      const std::optional<ValueId>& gi = (*in_grads)[i];
      if (!gi || !needed[size_t(in.index)]) continue;
      if (g.type(*gi) != g.type(in))
        return Status::error(Code::kInternal, where + ": gradient of input " + std::to_string(i),
                             g.type(in).to_string(), g.type(*gi).to_string());
      std::optional<ValueId>& acc = grad[size_t(in.index)];
      acc = acc ? b.add(*acc, *gi) : *gi;
    }
    ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context(where));
  }
  b.set_stage(-1);
  b.set_scope({});
  std::vector<ValueId> result;
  for (ValueId w : wrt) {
    const std::optional<ValueId>& gw = grad[size_t(w.index)];
    result.push_back(gw ? *gw : opsutil::zeros_like(b, w));
  }
  ASPEN_RETURN_IF_ERROR(b.status());
  return result;
}

}  // namespace aspen::graph
