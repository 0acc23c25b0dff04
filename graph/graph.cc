#include "graph/graph.h"

#include <algorithm>

#include "core/check.h"

namespace aspen::graph {

std::string TensorType::to_string() const { return std::string(dtype_name(dtype)) + shape.to_string(); }

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [k, v] : items) set(k, v);
}

void Attrs::set(std::string name, AttrValue value) {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  if (it != items_.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items_.insert(it, {std::move(name), std::move(value)});
  }
}

const AttrValue* Attrs::find(std::string_view name) const {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, std::string_view n) { return item.first < n; });
  return it != items_.end() && it->first == name ? &it->second : nullptr;
}

bool Attrs::has(std::string_view name) const { return find(name) != nullptr; }

template <class T>
static const T& get(const Attrs& a, std::string_view name) {
  const AttrValue* v = a.find(name);
  ASPEN_CHECK(v != nullptr) << "missing attribute '" << name << "'";
  ASPEN_CHECK(std::holds_alternative<T>(*v)) << "attribute '" << name << "' has another type";
  return std::get<T>(*v);
}

int64_t Attrs::i(std::string_view name) const { return get<int64_t>(*this, name); }
double Attrs::f(std::string_view name) const { return get<double>(*this, name); }
const std::string& Attrs::s(std::string_view name) const { return get<std::string>(*this, name); }
const std::vector<int64_t>& Attrs::ints(std::string_view name) const { return get<std::vector<int64_t>>(*this, name); }
int64_t Attrs::i_or(std::string_view name, int64_t fallback) const { return has(name) ? i(name) : fallback; }
double Attrs::f_or(std::string_view name, double fallback) const { return has(name) ? f(name) : fallback; }

std::string Attrs::to_string() const {
  std::string s;
  for (const auto& [k, v] : items_) {
    if (!s.empty()) s += ", ";
    s += k + "=";
    if (auto* i = std::get_if<int64_t>(&v)) s += std::to_string(*i);
    if (auto* f = std::get_if<double>(&v)) s += std::to_string(*f);
    if (auto* t = std::get_if<std::string>(&v)) s += "\"" + *t + "\"";
    if (auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      s += "[";
      for (size_t j = 0; j < l->size(); ++j) s += (j ? ", " : "") + std::to_string((*l)[j]);
      s += "]";
    }
  }
  return s;
}

int32_t Graph::add_node(Node node, const std::vector<TensorType>& out_types) {
  for (ValueId v : node.inputs)
    ASPEN_CHECK(v.index >= 0 && v.index < num_values()) << "input %" << v.index << " does not exist";
  const int32_t index = int32_t(nodes_.size());
  node.outputs.clear();
  for (size_t i = 0; i < out_types.size(); ++i) {
    node.outputs.push_back(ValueId{int32_t(values_.size())});
    values_.push_back(ValueInfo{out_types[i], index, int32_t(i)});
  }
  nodes_.push_back(std::move(node));
  return index;
}

void Graph::add_output(std::string name, ValueId v) {
  ASPEN_CHECK(v.index >= 0 && v.index < num_values()) << "output '" << name << "' names no value";
  outputs_.emplace_back(std::move(name), v);
}

void Graph::remove_output(std::string_view name) {
  std::erase_if(outputs_, [&](const auto& o) { return o.first == name; });
}

std::optional<ValueId> Graph::find_output(std::string_view name) const {
  for (const auto& [n, v] : outputs_)
    if (n == name) return v;
  return std::nullopt;
}

void Graph::add_update(std::string name, ValueId v) {
  ASPEN_CHECK(v.index >= 0 && v.index < num_values()) << "update of '" << name << "' names no value";
  updates_.emplace_back(std::move(name), v);
}

std::optional<ValueId> Graph::find_update(std::string_view name) const {
  for (const auto& [n, v] : updates_)
    if (n == name) return v;
  return std::nullopt;
}

std::vector<ValueId> Graph::roots() const {
  std::vector<ValueId> r;
  for (const auto& [n, v] : outputs_) r.push_back(v);
  for (const auto& [n, v] : updates_) r.push_back(v);
  return r;
}

std::vector<char> Graph::live_nodes() const {
  std::vector<char> live_value(values_.size(), 0), live(nodes_.size(), 0);
  for (ValueId v : roots()) live_value[size_t(v.index)] = 1;
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& n = nodes_[i];
    bool keep = op_has(n.op, kKeep);
    for (ValueId v : n.outputs) keep = keep || live_value[size_t(v.index)];
    if (!keep) continue;
    live[i] = 1;
    for (ValueId v : n.inputs) live_value[size_t(v.index)] = 1;
  }
  return live;
}

std::vector<int32_t> Graph::input_nodes() const {
  std::vector<int32_t> r;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == OpKind::input) r.push_back(int32_t(i));
  return r;
}

std::vector<int32_t> Graph::parameter_nodes() const {
  std::vector<int32_t> r;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == OpKind::parameter) r.push_back(int32_t(i));
  return r;
}

static std::optional<ValueId> find_named(const std::vector<Node>& nodes, OpKind op, std::string_view name) {
  for (const Node& n : nodes)
    if (n.op == op && n.name == name) return n.outputs.at(0);
  return std::nullopt;
}

std::optional<ValueId> Graph::find_parameter(std::string_view name) const {
  return find_named(nodes_, OpKind::parameter, name);
}
std::optional<ValueId> Graph::find_input(std::string_view name) const { return find_named(nodes_, OpKind::input, name); }

std::string Graph::to_string() const {
  std::string s;
  for (const Node& n : nodes_) {
    for (size_t i = 0; i < n.outputs.size(); ++i) s += (i ? ", %" : "%") + std::to_string(n.outputs[i].index);
    s += std::string(" = ") + op_name(n.op) + "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) s += (i ? ", %" : "%") + std::to_string(n.inputs[i].index);
    s += ")";
    if (!n.name.empty()) s += " \"" + n.name + "\"";
    if (!n.attrs.items().empty()) s += " {" + n.attrs.to_string() + "}";
    s += " :";
    for (size_t i = 0; i < n.outputs.size(); ++i) s += (i ? ", " : " ") + type(n.outputs[i]).to_string();
    s += "\n";
  }
  for (const auto& [name, v] : outputs_) s += "output \"" + name + "\" = %" + std::to_string(v.index) + "\n";
  for (const auto& [name, v] : updates_) s += "update \"" + name + "\" = %" + std::to_string(v.index) + "\n";
  return s;
}

}  // namespace aspen::graph
