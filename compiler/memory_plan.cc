#include "compiler/memory_plan.h"

#include <algorithm>
#include <map>

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;

namespace {

int64_t align(int64_t b) { return (b + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

// An output may overwrite a same-shaped input that dies at its node: the op
// table says which ops allow it.
bool elementwise(OpKind op) { return graph::op_has(op, graph::kElementwise); }
bool writes_in_place(OpKind op) { return elementwise(op) || graph::op_has(op, graph::kWritesInPlace); }

// Free arena ranges, by offset; merged on release.
class FreeList {
 public:
  // Best fit: the smallest gap that holds `bytes`; else the end of the arena.
  int64_t take(int64_t bytes) {
    auto best = gaps_.end();
    for (auto it = gaps_.begin(); it != gaps_.end(); ++it)
      if (it->second >= bytes && (best == gaps_.end() || it->second < best->second)) best = it;
    if (best == gaps_.end()) {
      // Grow, reusing a gap that touches the end.
      int64_t start = end_;
      if (!gaps_.empty()) {
        auto last = std::prev(gaps_.end());
        if (last->first + last->second == end_) {
          start = last->first;
          gaps_.erase(last);
        }
      }
      end_ = start + bytes;
      return start;
    }
    const int64_t off = best->first, size = best->second;
    gaps_.erase(best);
    if (size > bytes) gaps_[off + bytes] = size - bytes;
    return off;
  }
  void give(int64_t off, int64_t bytes) {
    auto [it, inserted] = gaps_.emplace(off, bytes);
    (void)inserted;
    auto next = std::next(it);
    if (next != gaps_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      gaps_.erase(next);
    }
    if (it != gaps_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        gaps_.erase(it);
      }
    }
  }
  int64_t end() const { return end_; }

 private:
  std::map<int64_t, int64_t> gaps_;
  int64_t end_ = 0;
};

// The values of updates, and the parameters they write, by value index.
struct Updates {
  std::vector<char> value, parameter;
};
Updates updates_of(const Graph& g) {
  Updates u{std::vector<char>(size_t(g.num_values()), 0), std::vector<char>(size_t(g.num_values()), 0)};
  for (const auto& [name, v] : g.updates()) {
    u.value[size_t(v.index)] = 1;
    if (const std::optional<graph::ValueId> p = g.find_parameter(name)) u.parameter[size_t(p->index)] = 1;
  }
  return u;
}

// By value: weight-only (see memory_plan.h).
std::vector<char> weight_only_values(const Graph& g, const Updates& updates) {
  std::vector<char> fixed(size_t(g.num_values()), 0);
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::constant || n.op == OpKind::parameter) {
      for (graph::ValueId v : n.outputs) fixed[size_t(v.index)] = !updates.parameter[size_t(v.index)];
      continue;
    }
    if (n.inputs.empty() || n.outputs.empty() || graph::op_has(n.op, graph::kSource) ||
        graph::op_has(n.op, graph::kCommunicates))
      continue;
    bool ok = true;
    for (graph::ValueId v : n.inputs) ok = ok && fixed[size_t(v.index)];
    for (graph::ValueId v : n.outputs) ok = ok && !updates.value[size_t(v.index)];
    if (ok)
      for (graph::ValueId v : n.outputs) fixed[size_t(v.index)] = 1;
  }
  return fixed;
}

}  // namespace

bool MemoryPlan::derived(const Graph& g, int32_t node) const {
  const Node& n = g.node(node);
  return !weight_only.empty() && n.op != OpKind::constant && n.op != OpKind::parameter && !n.outputs.empty() &&
         weight_only[size_t(n.outputs[0].index)];
}

Result<MemoryPlan> plan_memory(const Graph& g, bool hoist) {
  MemoryPlan plan;
  const int32_t nv = g.num_values();
  plan.slots.resize(size_t(nv));
  const Updates updates = updates_of(g);
  if (hoist) plan.weight_only = weight_only_values(g, updates);
  const int32_t end = int32_t(g.nodes().size());
  const std::vector<graph::ValueId> no_values;
  // Views: a reshape's output is its input's bytes (row-major: the same
  // elements in the same order), unless the bytes are a parameter an update
  // writes (a reader of the view must see the old value) or an update's value
  // (which may land in its parameter's storage). `root` is the value that owns
  // a view's bytes; lifetimes are the roots'.
  std::vector<int32_t> root(static_cast<size_t>(nv));
  for (int32_t v = 0; v < nv; ++v) root[size_t(v)] = v;
  plan.views.assign(size_t(end), 0);
  for (int32_t i = 0; i < end; ++i) {
    const Node& n = g.node(i);
    if (n.op != OpKind::reshape || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
    const int32_t r = root[size_t(n.inputs[0].index)];
    if (updates.value[size_t(r)] || updates.parameter[size_t(r)] ||
        g.type(n.outputs[0]).bytes() != g.type(n.inputs[0]).bytes())
      continue;
    root[size_t(n.outputs[0].index)] = r;
    plan.views[size_t(i)] = 1;
  }
  auto root_of = [&](graph::ValueId v) { return root[size_t(v.index)]; };
  std::vector<int32_t> last_use(size_t(nv), -1);
  for (int32_t i = 0; i < end; ++i)
    for (graph::ValueId v : g.node(i).inputs) last_use[size_t(root_of(v))] = i;
  for (graph::ValueId v : g.roots()) last_use[size_t(root_of(v))] = end;  // read after the run

  // Updates written in place: value index -> the parameter value it lands on.
  std::vector<int32_t> lands_on(size_t(nv), -1);
  for (const auto& [name, v] : g.updates()) {
    const std::optional<graph::ValueId> p = g.find_parameter(name);
    const int32_t x = g.value(v).producer;
    const Node& xn = g.node(x);
    if (!p || !writes_in_place(xn.op) || lands_on[size_t(v.index)] >= 0) continue;
    bool last_reader = true;
    for (int32_t i = x + 1; i < end && last_reader; ++i)
      for (graph::ValueId in : g.node(i).inputs) last_reader = last_reader && root_of(in) != p->index;
    if (last_reader) lands_on[size_t(v.index)] = p->index;
  }

  int64_t parameters = 0, constants = 0;
  FreeList free;
  int64_t in_use = 0;
  std::vector<std::vector<int32_t>> dies_at(size_t(end) + 1);
  std::vector<int32_t> live;
  // Inputs are written by the host before the first instruction, wherever
  // their nodes sit: they are live from the start.
  std::vector<int32_t> order;
  for (int32_t i = 0; i < end; ++i)
    if (g.node(i).op == OpKind::input) order.push_back(i);
  for (int32_t i = 0; i < end; ++i)
    if (g.node(i).op != OpKind::input) order.push_back(i);
  for (int32_t i : order) {
    const Node& n = g.node(i);
    if (plan.views[size_t(i)]) {
      plan.slots[size_t(n.outputs[0].index)] = plan.slots[size_t(root_of(n.outputs[0]))];
      ++plan.views_made;
    }
    for (graph::ValueId v : plan.views[size_t(i)] ? no_values : n.outputs) {  // a view's slot is its root's
      Slot& s = plan.slots[size_t(v.index)];
      s.bytes = g.type(v).bytes();
      if (n.op == OpKind::parameter) {
        s.storage = Storage::parameter;
        s.offset = parameters++;
        continue;
      }
      if (n.op == OpKind::constant) {
        s.storage = Storage::constant;
        s.offset = constants++;
        continue;
      }
      if (plan.derived(g, i)) {
        s.storage = Storage::derived;
        s.offset = plan.derived_bytes;
        plan.derived_bytes += align(std::max<int64_t>(s.bytes, 1));
        continue;
      }
      if (lands_on[size_t(v.index)] >= 0) {
        s = plan.slots[size_t(lands_on[size_t(v.index)])];
        ++plan.updates_in_place;
        continue;
      }
      s.storage = Storage::arena;
      plan.naive_bytes += align(s.bytes);
      // In place: an elementwise op over an arena input of equal size that dies here.
      bool placed = false;
      if (elementwise(n.op) && last_use[size_t(v.index)] >= 0) {
        for (graph::ValueId in : n.inputs) {
          const Slot& is = plan.slots[size_t(in.index)];
          const int32_t r = root_of(in);
          if (is.storage == Storage::arena && is.bytes == s.bytes && last_use[size_t(r)] == i) {
            auto& d = dies_at[size_t(i)];
            auto it = std::find(d.begin(), d.end(), r);
            if (it == d.end()) continue;  // already handed to another output
            d.erase(it);
            s.offset = is.offset;
            // The input's bytes now belong to this value; it dies when this value dies.
            placed = true;
            ++plan.in_place;
            live.erase(std::find(live.begin(), live.end(), r));
            break;
          }
        }
      }
      if (!placed) {
        s.offset = free.take(align(std::max<int64_t>(s.bytes, 1)));
        in_use += align(std::max<int64_t>(s.bytes, 1));
      }
      live.push_back(v.index);
      // A value nobody reads dies right after its node.
      const int32_t dies = last_use[size_t(v.index)] < 0 ? i : last_use[size_t(v.index)];
      dies_at[size_t(dies)].push_back(v.index);
    }
    if (free.end() > plan.arena_bytes || plan.peak_node < 0) {
      if (free.end() > plan.arena_bytes) {
        plan.arena_bytes = free.end();
        plan.peak_node = i;
        plan.live_at_peak = live;
      }
    }
    for (int32_t v : dies_at[size_t(i)]) {
      const Slot& s = plan.slots[size_t(v)];
      free.give(s.offset, align(std::max<int64_t>(s.bytes, 1)));
      in_use -= align(std::max<int64_t>(s.bytes, 1));
      live.erase(std::find(live.begin(), live.end(), v));
    }
  }
  plan.arena_bytes = std::max(plan.arena_bytes, free.end());
  return plan;
}

std::string MemoryPlan::report(const Graph& g) const {
  std::string s = "memory plan: arena " + std::to_string(arena_bytes) + " bytes (naive sum " +
                  std::to_string(naive_bytes) + "), " + std::to_string(in_place) + " outputs in place, " +
                  std::to_string(views_made) + " reshapes as views";
  if (derived_bytes) s += ", " + std::to_string(derived_bytes) + " bytes of weight-only values kept between runs";
  if (peak_node >= 0) {
    s += "\npeak at node " + std::to_string(peak_node) + " (" + graph::op_name(g.node(peak_node).op) + "), live:";
    for (int32_t v : live_at_peak)
      s += " %" + std::to_string(v) + " " + g.type(graph::ValueId{v}).to_string();
  }
  return s;
}

}  // namespace aspen::compiler
