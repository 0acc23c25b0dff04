#include "graph/builder.h"

#include "graph/verify.h"

namespace aspen::graph {

std::string common_scope(std::string_view a, std::string_view b) {
  size_t end = 0;
  for (size_t i = 0;; ++i) {
    const bool a_ends = i == a.size() || a[i] == '.', b_ends = i == b.size() || b[i] == '.';
    if (a_ends && b_ends) end = i;
    if (i == a.size() || i == b.size() || a[i] != b[i]) break;
  }
  return std::string(a.substr(0, end));
}

ValueId Builder::source(OpKind kind, std::string name, TensorType type, std::shared_ptr<const Tensor> data) {
  if (!status_.is_ok()) return {};
  Node n;
  n.op = kind;
  n.name = std::move(name);
  n.constant = std::move(data);
  n.stage = stage_;
  n.scope = scope_;
  n.backward = backward_;
  Attrs attrs;
  if (kind != OpKind::constant) {
    attrs.set("dtype", int64_t(type.dtype));
    attrs.set("shape", std::vector<int64_t>(type.shape.begin(), type.shape.end()));
  }
  n.attrs = std::move(attrs);
  auto types = check_node(g_, n);
  if (!types.is_ok()) {
    status_ = types.status();
    return {};
  }
  return g_.nodes()[size_t(g_.add_node(std::move(n), *types))].outputs[0];
}

ValueId Builder::input(std::string name, DType dtype, Shape shape) {
  if (g_.find_input(name)) {
    if (status_.is_ok()) status_ = Status::invalid_argument("input '" + name + "'", "a unique name", "it twice");
    return {};
  }
  return source(OpKind::input, std::move(name), TensorType{dtype, shape}, nullptr);
}

ValueId Builder::parameter(std::string name, DType dtype, Shape shape) {
  if (g_.find_parameter(name)) {
    if (status_.is_ok()) status_ = Status::invalid_argument("parameter '" + name + "'", "a unique name", "it twice");
    return {};
  }
  return source(OpKind::parameter, std::move(name), TensorType{dtype, shape}, nullptr);
}

ValueId Builder::constant(Tensor value) {
  TensorType t{value.dtype(), value.shape()};
  return source(OpKind::constant, "", t, std::make_shared<const Tensor>(std::move(value)));
}

ValueId Builder::scalar(float value, DType dtype) {
  Tensor t(DType::f32, Shape{});
  t.data<float>()[0] = value;
  ValueId c = constant(std::move(t));
  return dtype == DType::f32 ? c : cast(c, dtype);
}

void Builder::output(std::string name, ValueId v) {
  if (!status_.is_ok()) return;
  if (!v.valid() || v.index >= g_.num_values()) {
    status_ = Status::invalid_argument("output '" + name + "'", "a value of this graph", "an invalid id");
    return;
  }
  if (g_.find_output(name)) {
    status_ = Status::invalid_argument("output '" + name + "'", "a unique name", "it twice");
    return;
  }
  g_.add_output(std::move(name), v);
}

void Builder::update(ValueId param, ValueId value) {
  if (!status_.is_ok()) return;
  if (!param.valid() || param.index >= g_.num_values() || !value.valid() || value.index >= g_.num_values()) {
    status_ = Status::invalid_argument("update", "values of this graph", "an invalid id");
    return;
  }
  const Node& p = g_.producer(param);
  if (p.op != OpKind::parameter) {
    status_ = Status::invalid_argument("update of %" + std::to_string(param.index), "a parameter",
                                       "a value made by " + std::string(op_name(p.op)));
    return;
  }
  if (g_.type(param) != g_.type(value)) {
    status_ = Status::invalid_argument("update of parameter '" + p.name + "'", g_.type(param).to_string(),
                                       g_.type(value).to_string());
    return;
  }
  if (g_.find_update(p.name)) {
    status_ = Status::invalid_argument("update of parameter '" + p.name + "'", "one update per step", "a second one");
    return;
  }
  g_.add_update(p.name, value);
}

std::vector<ValueId> Builder::op(OpKind kind, std::vector<ValueId> inputs, Attrs attrs) {
  if (!status_.is_ok()) return {};
  for (ValueId v : inputs)
    if (!v.valid()) {
      status_ = Status::invalid_argument(std::string(op_name(kind)), "valid inputs", "an invalid ValueId");
      return {};
    }
  Node n;
  n.op = kind;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.stage = stage_;
  n.scope = scope_;
  n.backward = backward_;
  auto types = check_node(g_, n);
  if (!types.is_ok()) {
    status_ = types.status();
    return {};
  }
  return g_.nodes()[size_t(g_.add_node(std::move(n), *types))].outputs;
}

// NOTE [unit-axis transposes]: a permutation that keeps the axes of extent > 1 in their order moves no element:
// every offset stays, so the transpose is a reshape to the permuted extents, which the memory plan makes a view
// of its input (no copy, no instruction). A decoding step's heads, [B, 1, H, D] <-> [B, H, 1, D] for q, k, v
// and the attention's output, were four copies per layer. Anything else (an invalid value or permutation)
// goes to the transpose op, whose checks name it.
ValueId Builder::transpose(ValueId x, std::vector<int64_t> perm) {
  if (status_.is_ok() && x.valid()) {
    const Shape& s = type(x).shape;
    bool unit_moves = int64_t(perm.size()) == s.rank();
    std::vector<char> seen(perm.size(), 0);
    int64_t last = -1;  // the last axis of extent > 1 placed
    std::vector<int64_t> dims;
    for (int64_t a : perm) {
      if (!unit_moves || a < 0 || a >= s.rank() || seen[size_t(a)]) {
        unit_moves = false;
        break;
      }
      seen[size_t(a)] = 1;
      dims.push_back(s[int(a)]);
      if (s[int(a)] == 1) continue;
      if (a < last) unit_moves = false;
      last = a;
    }
    if (unit_moves) return reshape(x, std::move(dims));
  }
  return op1(OpKind::transpose, {x}, {{"perm", perm}});
}

ValueId Builder::op1(OpKind kind, std::vector<ValueId> inputs, Attrs attrs) {
  std::vector<ValueId> out = op(kind, std::move(inputs), std::move(attrs));
  return out.empty() ? ValueId{} : out[0];
}

void Builder::checkpoint(ValueId v) {
  if (status_.is_ok() && v.valid()) g_.mutable_node(g_.value(v).producer).checkpoint = true;
}

}  // namespace aspen::graph
