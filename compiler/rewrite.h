// compiler/rewrite.h: what every graph-rewriting pass shares (private to
// compiler/). Graphs are append-only, so a pass builds a new graph node by
// node; `remap` says which new value stands for each old one.
#pragma once

#include <vector>

#include "graph/graph.h"

namespace aspen::compiler {

class Rewrite {
 public:
  explicit Rewrite(const graph::Graph& old) : old_(old), remap_(size_t(old.num_values())) {}

  graph::Graph& out() { return out_; }
  graph::ValueId map(graph::ValueId old_value) const { return remap_[size_t(old_value.index)]; }
  void set(graph::ValueId old_value, graph::ValueId new_value) { remap_[size_t(old_value.index)] = new_value; }

  // Appends `node` (its inputs already new values) in place of old node
  // `old_index`, with that node's output types; its outputs stand for the old ones.
  const graph::Node& emit(graph::Node node, int32_t old_index) {
    std::vector<graph::TensorType> types;
    for (graph::ValueId v : old_.node(old_index).outputs) types.push_back(old_.type(v));
    return emit(std::move(node), types, old_.node(old_index).outputs);
  }
  // Appends `node` with output `types`; output k stands for old value old_outputs[k].
  const graph::Node& emit(graph::Node node, const std::vector<graph::TensorType>& types,
                          const std::vector<graph::ValueId>& old_outputs) {
    const graph::Node& added = out_.node(out_.add_node(std::move(node), types));
    for (size_t k = 0; k < old_outputs.size(); ++k) set(old_outputs[k], added.outputs[k]);
    return added;
  }
  // Copies old node `old_index` unchanged but for its inputs, mapped.
  const graph::Node& copy(int32_t old_index) {
    graph::Node n = old_.node(old_index);
    for (graph::ValueId& v : n.inputs) v = map(v);
    return emit(std::move(n), old_index);
  }
  // The new graph, with the old graph's named outputs and updates mapped.
  graph::Graph finish() && {
    for (const auto& [name, v] : old_.outputs()) out_.add_output(name, map(v));
    for (const auto& [name, v] : old_.updates()) out_.add_update(name, map(v));
    return std::move(out_);
  }

 private:
  const graph::Graph& old_;
  graph::Graph out_;
  std::vector<graph::ValueId> remap_;
};

}  // namespace aspen::compiler
