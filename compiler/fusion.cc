// compiler/fusion.cc: the fusion pass (O2).
//
// Patterns, each replacing nodes by one that runs as one kernel:
//   add(matmul(a, b), broadcast(bias [N]))   -> matmul(a, b, bias)        (oneDNN's bias epilogue)
//   gelu(add(x, broadcast(bias [C])))        -> bias_gelu(x, bias)
//   layernorm(add(x, r), gamma, beta)        -> add_layernorm(x, r, gamma, beta), whose first
//                                               output h replaces the add (the residual stream)
// A pattern applies only when the nodes it removes have no other users (the
// matmul, and the add under gelu) and, for add_layernorm, when no user of the
// sum comes before the layernorm (the fused node takes the layernorm's place).
// The fused node takes the place of the last node of its pattern, where all
// its inputs already exist.
#include <map>

#include "compiler/pass.h"
#include "compiler/rewrite.h"
#include "graph/verify.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::ValueId;

namespace {

class Fusion : public Pass {
 public:
  const char* name() const override { return "fusion"; }

  Status run(Graph& g, const CompileContext&) override {
    const int32_t n = int32_t(g.nodes().size());
    std::vector<std::vector<int32_t>> users(size_t(g.num_values()));
    for (int32_t i = 0; i < n; ++i)
      for (ValueId v : g.node(i).inputs) users[size_t(v.index)].push_back(i);
    std::vector<int32_t> is_output(size_t(g.num_values()), 0);
    for (ValueId v : g.roots()) is_output[size_t(v.index)] = 1;
    auto sole_user = [&](ValueId v) { return users[size_t(v.index)].size() == 1 && !is_output[size_t(v.index)]; };
    // A broadcast of a vector [last dim of `like`]: its source, else invalid.
    auto bias_of = [&](ValueId v, ValueId like) -> ValueId {
      const Node& b = g.producer(v);
      if (b.op != OpKind::broadcast) return {};
      const graph::TensorType& src = g.type(b.inputs[0]);
      const graph::TensorType& t = g.type(like);
      if (t.shape.rank() < 1 || src.shape != Shape{t.shape[-1]} || src.dtype != t.dtype) return {};
      return b.inputs[0];
    };

    std::vector<char> skip(size_t(n), 0);
    struct Emit {
      Node node;                         // inputs are values of the old graph
      std::vector<ValueId> old_outputs;  // old values its outputs stand for
    };
    std::map<int32_t, Emit> emit;

    for (int32_t i = 0; i < n; ++i) {
      const Node& node = g.node(i);
      if (node.op == OpKind::add) {  // matmul + bias
        for (int side = 0; side < 2; ++side) {
          const ValueId mm = node.inputs[size_t(side)], other = node.inputs[size_t(1 - side)];
          const int32_t mi = g.value(mm).producer;
          const Node& m = g.node(mi);
          if (m.op != OpKind::matmul || m.inputs.size() != 2 || skip[size_t(mi)] || !sole_user(mm)) continue;
          const ValueId bias = bias_of(other, mm);
          if (!bias.valid()) continue;
          Node fused = m;
          fused.inputs.push_back(bias);
          skip[size_t(mi)] = 1;
          skip[size_t(i)] = 1;
          emit[i] = Emit{std::move(fused), {node.outputs[0]}};
          break;
        }
      } else if (node.op == OpKind::gelu) {  // bias + gelu
        const ValueId sum = node.inputs[0];
        const int32_t ai = g.value(sum).producer;
        const Node& a = g.node(ai);
        if (a.op != OpKind::add || skip[size_t(ai)] || !sole_user(sum)) continue;
        for (int side = 0; side < 2; ++side) {
          const ValueId bias = bias_of(a.inputs[size_t(1 - side)], a.inputs[size_t(side)]);
          if (!bias.valid()) continue;
          Node fused;
          fused.op = OpKind::bias_gelu;
          fused.stage = node.stage;
          fused.inputs = {a.inputs[size_t(side)], bias};
          fused.attrs.set("tanh", node.attrs.i_or("tanh", 1));
          skip[size_t(ai)] = 1;
          skip[size_t(i)] = 1;
          emit[i] = Emit{std::move(fused), {node.outputs[0]}};
          break;
        }
      } else if (node.op == OpKind::layernorm) {  // residual add + layernorm
        const ValueId sum = node.inputs[0];
        const int32_t ai = g.value(sum).producer;
        const Node& a = g.node(ai);
        if (a.op != OpKind::add || skip[size_t(ai)]) continue;
        bool later = true;
        for (int32_t u : users[size_t(sum.index)]) later = later && u >= i;
        if (!later) continue;
        Node fused;
        fused.op = OpKind::add_layernorm;
        fused.stage = node.stage;
        fused.inputs = {a.inputs[0], a.inputs[1], node.inputs[1], node.inputs[2]};
        fused.attrs.set("eps", node.attrs.f("eps"));
        skip[size_t(ai)] = 1;
        skip[size_t(i)] = 1;
        emit[i] = Emit{std::move(fused), {sum, node.outputs[0], node.outputs[1], node.outputs[2]}};
      }
    }
    if (emit.empty()) return Status();

    Rewrite rw(g);
    for (int32_t i = 0; i < n; ++i) {
      auto e = emit.find(i);
      if (skip[size_t(i)] && e == emit.end()) continue;
      Node node = e != emit.end() ? e->second.node : g.node(i);
      const std::vector<ValueId> old_outputs = e != emit.end() ? e->second.old_outputs : g.node(i).outputs;
      for (ValueId& v : node.inputs) v = rw.map(v);
      auto types = graph::check_node(rw.out(), node);
      if (!types.is_ok()) return types.status().with_context("fusing at node " + std::to_string(i));
      rw.emit(std::move(node), *types, old_outputs);
    }
    g = std::move(rw).finish();
    return Status();
  }
};

}  // namespace

std::unique_ptr<Pass> make_fusion() { return std::make_unique<Fusion>(); }

}  // namespace aspen::compiler
