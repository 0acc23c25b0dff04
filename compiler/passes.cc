// compiler/passes.cc: graph clean-up passes.
//
//   dead-code elimination: drops nodes no output depends on (inputs and
//       parameters stay: they are the executable's interface).
//   common-subexpression elimination: one node per (op, inputs, attributes);
//       constants are merged when their data are equal.
//   constant folding: a node whose inputs are all constants becomes a
//       constant, computed by the op's reference kernel and rounded to its
//       dtype (exactly what the interpreter with rounding would produce).
#include <cstring>
#include <map>

#include "compiler/pass.h"
#include "compiler/rewrite.h"
#include "graph/interpreter.h"
#include "graph/verify.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::ValueId;

namespace {

// Copies the nodes `keep` selects into a new graph, following `alias` (value
// -> replacement value in the old graph) for inputs and outputs.
Graph rebuild(const Graph& g, const std::vector<char>& keep, const std::vector<ValueId>& alias) {
  auto target = [&](ValueId v) {
    while (alias[size_t(v.index)] != v) v = alias[size_t(v.index)];
    return v;
  };
  Rewrite rw(g);
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
    if (!keep[size_t(i)]) continue;
    Node n = g.node(i);
    for (ValueId& v : n.inputs) v = rw.map(target(v));
    rw.emit(std::move(n), i);
  }
  for (int32_t v = 0; v < g.num_values(); ++v)  // merged values stand for their survivors
    if (target(ValueId{v}) != ValueId{v}) rw.set(ValueId{v}, rw.map(target(ValueId{v})));
  return std::move(rw).finish();
}

std::vector<ValueId> identity_alias(const Graph& g) {
  std::vector<ValueId> a(size_t(g.num_values()));
  for (int32_t i = 0; i < g.num_values(); ++i) a[size_t(i)] = ValueId{i};
  return a;
}

class DeadCodeElimination : public Pass {
 public:
  const char* name() const override { return "dead-code-elimination"; }
  Status run(Graph& g, const CompileContext&) override {
    g = rebuild(g, g.live_nodes(), identity_alias(g));
    return Status();
  }
};

bool same_constant(const Node& a, const Node& b) {
  if (!a.constant || !b.constant) return false;
  if (a.constant->dtype() != b.constant->dtype() || a.constant->shape() != b.constant->shape()) return false;
  return std::memcmp(a.constant->raw(), b.constant->raw(), a.constant->nbytes()) == 0;
}

class CommonSubexpressionElimination : public Pass {
 public:
  const char* name() const override { return "common-subexpression-elimination"; }
  Status run(Graph& g, const CompileContext&) override {
    std::vector<ValueId> alias = identity_alias(g);
    std::vector<char> keep(g.nodes().size(), 1);
    // Key: op and resolved inputs; candidates are then compared attribute by attribute.
    std::map<std::pair<int, std::vector<int32_t>>, std::vector<size_t>> seen;
    auto resolve = [&](ValueId v) {
      while (alias[size_t(v.index)] != v) v = alias[size_t(v.index)];
      return v.index;
    };
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (graph::op_has(n.op, graph::kUnique) || n.outputs.empty()) continue;
      std::vector<int32_t> ins;
      for (ValueId v : n.inputs) ins.push_back(resolve(v));
      auto& bucket = seen[{int(n.op), ins}];
      bool merged = false;
      for (size_t j : bucket) {
        const Node& m = g.nodes()[j];
        if (m.attrs != n.attrs || m.stage != n.stage) continue;
        if (n.op == OpKind::constant && !same_constant(m, n)) continue;
        for (size_t k = 0; k < n.outputs.size(); ++k) alias[size_t(n.outputs[k].index)] = m.outputs[k];
        keep[i] = 0;
        merged = true;
        break;
      }
      if (!merged) bucket.push_back(i);
    }
    g = rebuild(g, keep, alias);
    return Status();
  }
};

class ConstantFolding : public Pass {
 public:
  const char* name() const override { return "constant-folding"; }
  Status run(Graph& g, const CompileContext& ctx) override {
    Rewrite rw(g);
    const Graph& out = rw.out();
    for (const Node& original : g.nodes()) {
      Node n = original;
      for (ValueId& v : n.inputs) v = rw.map(v);
      bool foldable = !n.inputs.empty() && !n.outputs.empty() && !graph::op_has(n.op, graph::kCommunicates);
      int64_t elements = 0;
      for (ValueId v : original.outputs) elements += g.type(v).shape.numel();
      foldable = foldable && elements <= ctx.options.max_folded_elements;
      for (ValueId v : n.inputs) foldable = foldable && out.producer(v).op == OpKind::constant;
      std::vector<graph::TensorType> types;
      for (ValueId v : original.outputs) types.push_back(g.type(v));
      if (!foldable) {
        rw.emit(std::move(n), types, original.outputs);
        continue;
      }
      std::vector<graph::HostArray> in_arrays;
      for (ValueId v : n.inputs) in_arrays.push_back(graph::HostArray::from_tensor(*out.producer(v).constant));
      std::vector<const graph::HostArray*> in_ptrs;
      for (const auto& a : in_arrays) in_ptrs.push_back(&a);
      std::vector<graph::HostArray> results;
      for (const auto& t : types) results.emplace_back(t);
      Status s = graph::op_info(n.op).eval(n, in_ptrs, results);
      if (!s.is_ok()) return std::move(s).with_context(std::string("constant folding ") + graph::op_name(n.op));
      for (size_t k = 0; k < results.size(); ++k) {
        Node c;
        c.op = OpKind::constant;
        c.stage = n.stage;
        c.scope = n.scope;
        c.constant = std::make_shared<const Tensor>(results[k].to_tensor());
        rw.emit(std::move(c), {types[k]}, {original.outputs[k]});
      }
    }
    g = std::move(rw).finish();
    return Status();
  }
};

}  // namespace

std::unique_ptr<Pass> make_dead_code_elimination() { return std::make_unique<DeadCodeElimination>(); }
std::unique_ptr<Pass> make_common_subexpression_elimination() {
  return std::make_unique<CommonSubexpressionElimination>();
}
std::unique_ptr<Pass> make_constant_folding() { return std::make_unique<ConstantFolding>(); }

std::vector<std::unique_ptr<Pass>> default_pipeline(const CompileOptions& options) {
  std::vector<std::unique_ptr<Pass>> passes;
  if (options.opt_level >= OptLevel::O1) {
    passes.push_back(make_constant_folding());
    passes.push_back(make_common_subexpression_elimination());
  }
  passes.push_back(make_dead_code_elimination());
  if (options.recompute) passes.push_back(make_recomputation());  // after CSE, which would undo it
  if (options.compute != DType::f32) passes.push_back(make_precision());  // before fusion (bias epilogue)
  if (options.opt_level >= OptLevel::O2) {
    passes.push_back(make_fusion());
    passes.push_back(make_dead_code_elimination());
    passes.push_back(make_memory_schedule());  // last: it judges orders by the memory plan
  }
  return passes;
}

Status run_passes(Graph& g, const std::vector<std::unique_ptr<Pass>>& passes, const CompileContext& ctx) {
  if (ctx.options.verify_each_pass) ASPEN_RETURN_IF_ERROR(Status(graph::verify(g)).with_context("before passes"));
  for (const auto& p : passes) {
    ASPEN_RETURN_IF_ERROR(p->run(g, ctx).with_context(std::string("pass ") + p->name()));
    if (ctx.options.verify_each_pass)
      ASPEN_RETURN_IF_ERROR(Status(graph::verify(g)).with_context(std::string("after pass ") + p->name()));
  }
  return Status();
}

}  // namespace aspen::compiler
