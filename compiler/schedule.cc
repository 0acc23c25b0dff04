// compiler/schedule.cc: the scheduling pass (O2).
//
// The node order is the schedule, and the memory plan follows liveness over
// it. Graphs arrive in build order: every forward node, then every backward
// node, with each value made wherever the builder happened to record it. This
// pass tries a depth-first order from the outputs (each node emitted right
// after the last of its inputs is ready, producers as late as their first
// consumer allows) and keeps whichever order gives the lower planned peak:
// the choice is made on the plan, so it never makes memory worse, and it is
// deterministic. Graphs with point-to-point or collective ops keep their order
// (their schedule is the parallel runtime's business, W1.5).
//
// NOTE [updates last]: a node that makes a parameter's update from the
// parameter itself (an optimizer step reading the weight) is moved after the
// last other reader of that parameter, in either order, so the memory plan
// can write the update into the parameter's own storage (no copy); see
// plan_memory. Depth-first would otherwise emit a layer's optimizer step
// before the backward matmul that still reads the old weight.
#include <algorithm>

#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "compiler/rewrite.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::ValueId;

namespace {

bool fixed_order(OpKind op) { return graph::op_has(op, graph::kCommunicates); }

// Nodes in depth-first post-order from the outputs (inputs visited in
// order), then every node not reached (in the original order).
std::vector<int32_t> depth_first_order(const Graph& g) {
  const int32_t n = int32_t(g.nodes().size());
  std::vector<char> state(size_t(n), 0);  // 0 new, 1 on the stack, 2 emitted
  std::vector<int32_t> order;
  order.reserve(size_t(n));
  std::vector<std::pair<int32_t, size_t>> stack;  // node, next input to visit
  auto visit = [&](int32_t root) {
    if (state[size_t(root)]) return;
    stack.push_back({root, 0});
    state[size_t(root)] = 1;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const Node& nd = g.node(node);
      if (next < nd.inputs.size()) {
        const int32_t p = g.value(nd.inputs[next++]).producer;
        if (!state[size_t(p)]) {
          state[size_t(p)] = 1;
          stack.push_back({p, 0});
        }
        continue;
      }
      state[size_t(node)] = 2;
      order.push_back(node);
      stack.pop_back();
    }
  };
  // Sources first, in their original order, so the interface keeps its order.
  for (int32_t i = 0; i < n; ++i)
    if (graph::op_has(g.node(i).op, graph::kSource)) visit(i);
  for (ValueId v : g.roots()) visit(g.value(v).producer);
  for (int32_t i = 0; i < n; ++i) visit(i);
  return order;
}

// NOTE [updates last]: order with every in-place-able update producer moved
// right after the last other reader of its parameter (when it was before).
std::vector<int32_t> delay_updates(const Graph& g, std::vector<int32_t> order) {
  std::vector<int32_t> readers_of_value_count(size_t(g.num_values()), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs) ++readers_of_value_count[size_t(v.index)];
  std::vector<char> root(size_t(g.num_values()), 0);
  for (ValueId v : g.roots()) root[size_t(v.index)] = 1;
  for (const auto& [name, value] : g.updates()) {
    const std::optional<ValueId> param = g.find_parameter(name);
    const int32_t x = g.value(value).producer;
    const Node& xn = g.node(x);
    if (!param || std::find(xn.inputs.begin(), xn.inputs.end(), *param) == xn.inputs.end()) continue;
    // Only a node whose outputs nobody else reads can move later freely.
    bool free_outputs = true;
    for (ValueId o : xn.outputs) free_outputs = free_outputs && readers_of_value_count[size_t(o.index)] == 0;
    if (!free_outputs) continue;
    std::vector<int32_t> position(g.nodes().size());
    for (size_t k = 0; k < order.size(); ++k) position[size_t(order[k])] = int32_t(k);
    int32_t last = -1;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (int32_t(i) == x) continue;
      const Node& n = g.node(int32_t(i));
      if (std::find(n.inputs.begin(), n.inputs.end(), *param) != n.inputs.end())
        last = std::max(last, position[i]);
    }
    if (last < position[size_t(x)]) continue;
    order.erase(order.begin() + position[size_t(x)]);
    order.insert(order.begin() + last, x);  // `last` shifted down by one: right after that reader
  }
  return order;
}

Graph reorder(const Graph& g, const std::vector<int32_t>& order) {
  Rewrite rw(g);
  for (int32_t i : order) rw.copy(i);
  return std::move(rw).finish();
}

class MemorySchedule : public Pass {
 public:
  const char* name() const override { return "memory-schedule"; }
  Status run(Graph& g, const CompileContext&) override {
    for (const Node& n : g.nodes())
      if (fixed_order(n.op)) return Status();
    std::vector<int32_t> build_order(g.nodes().size());
    for (size_t i = 0; i < build_order.size(); ++i) build_order[i] = int32_t(i);
    if (!g.updates().empty()) g = reorder(g, delay_updates(g, std::move(build_order)));
    Graph candidate = reorder(g, delay_updates(g, depth_first_order(g)));
    ASPEN_ASSIGN_OR_RETURN(MemoryPlan now, plan_memory(g));
    ASPEN_ASSIGN_OR_RETURN(MemoryPlan then, plan_memory(candidate));
    if (then.arena_bytes < now.arena_bytes) g = std::move(candidate);
    return Status();
  }
};

}  // namespace

std::unique_ptr<Pass> make_memory_schedule() { return std::make_unique<MemorySchedule>(); }

}  // namespace aspen::compiler
