#include "graph/verify.h"

#include <set>

namespace aspen::graph {

namespace {

const char* kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::i64: return "an integer";
    case AttrKind::f64: return "a float";
    case AttrKind::str: return "a string";
    case AttrKind::ints: return "a list of integers";
  }
  return "?";
}

bool has_kind(const AttrValue& v, AttrKind k) {
  switch (k) {
    case AttrKind::i64: return std::holds_alternative<int64_t>(v);
    case AttrKind::f64: return std::holds_alternative<double>(v);
    case AttrKind::str: return std::holds_alternative<std::string>(v);
    case AttrKind::ints: return std::holds_alternative<std::vector<int64_t>>(v);
  }
  return false;
}

std::string input_types(const Graph& g, const Node& n, int32_t limit) {
  std::string s = "(";
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (i) s += ", ";
    s += n.inputs[i].index >= 0 && n.inputs[i].index < limit ? g.type(n.inputs[i]).to_string()
                                                               : "%" + std::to_string(n.inputs[i].index) + "?";
  }
  return s + ")";
}

Status check_schema(const OpInfo& info, const Node& n) {
  const int count = int(n.inputs.size());
  if (count < info.min_inputs || (info.max_inputs >= 0 && count > info.max_inputs)) {
    std::string want = info.max_inputs < 0 ? "at least " + std::to_string(info.min_inputs)
                       : info.min_inputs == info.max_inputs
                           ? std::to_string(info.min_inputs)
                           : std::to_string(info.min_inputs) + " to " + std::to_string(info.max_inputs);
    return Status::invalid_argument(std::string(info.name) + ": inputs", want + " inputs", std::to_string(count));
  }
  for (const AttrSpec& spec : info.attrs) {
    const AttrValue* v = n.attrs.find(spec.name);
    if (!v) {
      if (spec.required)
        return Status::invalid_argument(std::string(info.name) + ": attribute '" + spec.name + "'",
                                        std::string("present (") + kind_name(spec.kind) + ")", "none");
      continue;
    }
    if (!has_kind(*v, spec.kind))
      return Status::invalid_argument(std::string(info.name) + ": attribute '" + spec.name + "'",
                                      kind_name(spec.kind), "another kind");
  }
  for (const auto& [name, value] : n.attrs.items()) {
    bool known = false;
    for (const AttrSpec& spec : info.attrs) known = known || name == spec.name;
    if (!known) {
      std::string list;
      for (const AttrSpec& spec : info.attrs) list += (list.empty() ? "" : ", ") + std::string(spec.name);
      return Status::invalid_argument(std::string(info.name) + ": attribute '" + name + "'",
                                      "one of {" + list + "}", "an unknown attribute");
    }
  }
  return Status();
}

Result<std::vector<TensorType>> check_node_upto(const Graph& g, const Node& n, int32_t value_limit) {
  const OpInfo& info = op_info(n.op);
  for (ValueId v : n.inputs)
    if (v.index < 0 || v.index >= value_limit)
      return Status::invalid_argument(std::string(info.name) + ": input %" + std::to_string(v.index),
                                      "a value defined earlier in the graph",
                                      v.index < 0 ? "an invalid id" : "a later or missing value (a cycle?)");
  ASPEN_RETURN_IF_ERROR(check_schema(info, n));
  std::vector<TensorType> in;
  for (ValueId v : n.inputs) in.push_back(g.type(v));
  std::vector<TensorType> out;
  ASPEN_RETURN_IF_ERROR(info.infer(n, in, out));
  return out;
}

Status with_node(Status s, const Graph& g, const Node& n, size_t index, int32_t limit) {
  return std::move(s).with_context("node " + std::to_string(index) + " (" + op_name(n.op) + ") with inputs " +
                                   input_types(g, n, limit));
}

}  // namespace

Result<std::vector<TensorType>> check_node(const Graph& g, const Node& n) {
  auto r = check_node_upto(g, n, g.num_values());
  if (!r.is_ok()) return with_node(r.status(), g, n, g.nodes().size(), g.num_values());
  return r;
}

Status verify(const Graph& g) {
  std::set<std::string> inputs, params, outputs;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const int32_t limit = n.outputs.empty() ? g.num_values() : n.outputs.front().index;
    auto r = check_node_upto(g, n, limit);
    if (!r.is_ok()) return with_node(r.status(), g, n, i, limit);
    if (r->size() != n.outputs.size())
      return with_node(Status::error(Code::kInternal, "outputs", std::to_string(r->size()) + " outputs",
                                     std::to_string(n.outputs.size())),
                       g, n, i, limit);
    for (size_t k = 0; k < r->size(); ++k)
      if ((*r)[k] != g.type(n.outputs[k]))
        return with_node(Status::invalid_argument("output " + std::to_string(k), (*r)[k].to_string(),
                                                  g.type(n.outputs[k]).to_string() + " recorded"),
                         g, n, i, limit);
    if (n.op == OpKind::input || n.op == OpKind::parameter) {
      auto& names = n.op == OpKind::input ? inputs : params;
      if (n.name.empty() || !names.insert(n.name).second)
        return with_node(Status::invalid_argument("name", "a unique, non-empty name",
                                                  n.name.empty() ? "an empty one" : "'" + n.name + "' twice"),
                         g, n, i, limit);
    }
  }
  for (const auto& [name, v] : g.outputs()) {
    if (name.empty() || !outputs.insert(name).second)
      return Status::invalid_argument("graph output", "a unique, non-empty name",
                                      name.empty() ? "an empty one" : "'" + name + "' twice");
    if (v.index < 0 || v.index >= g.num_values())
      return Status::invalid_argument("graph output '" + name + "'", "an existing value",
                                      "%" + std::to_string(v.index));
  }
  std::set<std::string> updated;
  for (const auto& [name, v] : g.updates()) {
    const auto param = g.find_parameter(name);
    if (!param) return Status::invalid_argument("update '" + name + "'", "a parameter of the graph", "none");
    if (!updated.insert(name).second)
      return Status::invalid_argument("update '" + name + "'", "one update per parameter", "two");
    if (v.index < 0 || v.index >= g.num_values())
      return Status::invalid_argument("update '" + name + "'", "an existing value", "%" + std::to_string(v.index));
    if (g.type(v) != g.type(*param))
      return Status::invalid_argument("update '" + name + "'", g.type(*param).to_string(),
                                      g.type(v).to_string() + " (%" + std::to_string(v.index) + ")");
  }
  return Status();
}

}  // namespace aspen::graph
