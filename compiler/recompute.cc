// compiler/recompute.cc: recomputation (PopTorch's recomputationCheckpoint).
//
// Without it, every forward activation that the backward reads stays live
// from the forward pass to its backward use: the activation memory of the
// whole model at once. With it, only checkpointed values (outputs of nodes
// marked `checkpoint`, graph inputs, parameters and constants) are kept; any
// other forward value a backward node reads is recomputed from the nearest
// kept values just before its first backward use, so forward activations die
// in the forward pass and each segment's live again only briefly.
//
// Clones are made once and shared by all later backward readers; ops with
// side effects or randomness (send, recv, collectives) are never cloned: a
// value that would need one is kept instead. The pass runs after CSE (which
// would merge the clones back) and before fusion.
#include <functional>
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

bool clonable(OpKind op) { return !graph::op_has(op, graph::kSource) && !graph::op_has(op, graph::kCommunicates); }

class Recompute : public Pass {
 public:
  const char* name() const override { return "recomputation"; }

  Status run(Graph& g, const CompileContext&) override {
    bool any_checkpoint = false, any_backward = false;
    for (const Node& n : g.nodes()) {
      any_checkpoint = any_checkpoint || (n.checkpoint && !n.backward);
      any_backward = any_backward || n.backward;
    }
    if (!any_checkpoint || !any_backward) return Status();  // nothing marked: keep everything

    Rewrite rw(g);                        // old value -> new value (the original)
    std::map<int32_t, ValueId> clone_of;  // old value -> its recomputed copy
    auto kept = [&](ValueId v) {
      const Node& p = g.producer(v);
      return p.backward || p.checkpoint || !clonable(p.op);
    };
    // Emits the recomputation of old value v (and what it needs) into `out`.
    std::function<Result<ValueId>(ValueId)> recompute = [&](ValueId v) -> Result<ValueId> {
      if (kept(v)) return rw.map(v);
      auto it = clone_of.find(v.index);
      if (it != clone_of.end()) return it->second;
      const int32_t pi = g.value(v).producer;
      Node n = g.node(pi);
      for (ValueId& in : n.inputs) {
        ASPEN_ASSIGN_OR_RETURN(in, recompute(in));
      }
      n.backward = true;  // it runs in the backward section now
      auto types = graph::check_node(rw.out(), n);
      if (!types.is_ok()) return types.status().with_context("recomputing node " + std::to_string(pi));
      const Node& added = rw.out().node(rw.out().add_node(std::move(n), *types));
      const Node& orig = g.node(pi);
      for (size_t k = 0; k < orig.outputs.size(); ++k) clone_of[orig.outputs[k].index] = added.outputs[k];
      return clone_of.at(v.index);
    };

    for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
      Node n = g.node(i);
      for (ValueId& in : n.inputs) {
        if (n.backward) {
          ASPEN_ASSIGN_OR_RETURN(in, recompute(in));
        } else {
          in = rw.map(in);
        }
      }
      rw.emit(std::move(n), i);
    }
    g = std::move(rw).finish();
    return Status();
  }
};

}  // namespace

std::unique_ptr<Pass> make_recomputation() { return std::make_unique<Recompute>(); }

}  // namespace aspen::compiler
