// graph/graph.h: the IR. A Graph is a list of nodes in topological order;
// each node's outputs are values with a static type.
//
// Graphs are append-only: a node only refers to values made before it, so
// the node order is always a valid schedule and cycles cannot be built
// through the public API (the verifier still checks, for graphs read from
// disk). Passes that remove or rewrite nodes build a new Graph.
//
// Sources: `input` nodes (named batch data), `parameter` nodes (named
// weights; Hugging Face-compatible names such as "h.0.attn.c_attn.weight")
// and `constant` nodes (a tensor held by the graph). Named outputs are what a
// session returns.
//
// Updates are how a program changes its state: update(p, v) says that after
// a step, parameter p holds v (same type). An optimizer step is the graph's
// updates of its weights and its optimizer state; a KV cache is a parameter
// that decode updates. Within the step every reader of p sees the old value.
//
// Thread-safety: a Graph is a value; concurrent reads are fine, writes need
// exclusive access.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/tensor.h"
#include "graph/op.h"
#include "graph/types.h"

namespace aspen::graph {

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

// A node's attributes: a small map from name to value, kept sorted by name so
// equal attribute sets compare and hash equal.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);
  void set(std::string name, AttrValue value);
  bool has(std::string_view name) const;
  const AttrValue* find(std::string_view name) const;
  // Typed reads; reading a missing or differently typed attribute is a bug
  // (the verifier checks every node against its op's schema first).
  int64_t i(std::string_view name) const;
  double f(std::string_view name) const;
  const std::string& s(std::string_view name) const;
  const std::vector<int64_t>& ints(std::string_view name) const;
  int64_t i_or(std::string_view name, int64_t fallback) const;
  double f_or(std::string_view name, double fallback) const;
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool operator==(const Attrs&) const = default;
  std::string to_string() const;  // "axis=1, perm=[0, 2, 1]"

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

struct Node {
  OpKind op = OpKind::input;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  std::string name;                         // inputs and parameters: their public name
  std::shared_ptr<const Tensor> constant;   // constant nodes only
  int32_t stage = -1;                       // pipeline stage tag (W1.5); -1: untagged
  std::string scope;                        // the model layer that made it ("h.3.attn"; Builder::Scope), or empty
  bool checkpoint = false;                  // its outputs are kept for backward, not recomputed
  bool backward = false;                    // made by autodiff (graph/autodiff.h)
};

struct ValueInfo {
  TensorType type;
  int32_t producer = -1;  // node index
  int32_t output = 0;     // which output of the producer
};

class Graph {
 public:
  // Appends a node whose output types are `out_types`; fills node.outputs and
  // returns its index. Inputs must already exist (checked).
  int32_t add_node(Node node, const std::vector<TensorType>& out_types);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int32_t index) const { return nodes_.at(size_t(index)); }
  Node& mutable_node(int32_t index) { return nodes_.at(size_t(index)); }
  int32_t num_values() const { return int32_t(values_.size()); }
  const ValueInfo& value(ValueId v) const { return values_.at(size_t(v.index)); }
  const TensorType& type(ValueId v) const { return value(v).type; }
  const Node& producer(ValueId v) const { return node(value(v).producer); }

  void add_output(std::string name, ValueId v);
  const std::vector<std::pair<std::string, ValueId>>& outputs() const { return outputs_; }
  std::optional<ValueId> find_output(std::string_view name) const;
  // Drops a named output (the value stays; dead-code elimination may remove it).
  void remove_output(std::string_view name);

  // Parameter `name` holds `v` after each step (see the header comment).
  void add_update(std::string name, ValueId v);
  const std::vector<std::pair<std::string, ValueId>>& updates() const { return updates_; }
  std::optional<ValueId> find_update(std::string_view name) const;
  // Values that must survive to the end of a step: outputs, then updates.
  std::vector<ValueId> roots() const;
  // By node index: whether a root depends on the node or its op must run anyway (kKeep). Dead-code
  // elimination keeps these.
  std::vector<char> live_nodes() const;

  // Node indices of inputs and parameters, in creation order.
  std::vector<int32_t> input_nodes() const;
  std::vector<int32_t> parameter_nodes() const;
  std::optional<ValueId> find_parameter(std::string_view name) const;
  std::optional<ValueId> find_input(std::string_view name) const;

  // One line per node: "%3 = matmul(%1, %2) {trans_b=1} : f32[4, 8]".
  std::string to_string() const;

 private:
  std::vector<Node> nodes_;
  std::vector<ValueInfo> values_;
  std::vector<std::pair<std::string, ValueId>> outputs_;
  std::vector<std::pair<std::string, ValueId>> updates_;
};

}  // namespace aspen::graph
