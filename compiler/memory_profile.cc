#include "compiler/memory_profile.h"

#include <algorithm>

namespace aspen::compiler {

profile::ProgramMemory program_memory(const Executable& exe, const std::string& name, int64_t program) {
  const graph::Graph& g = exe.graph;
  const MemoryPlan& p = exe.plan;
  profile::ProgramMemory m;
  m.name = name;
  m.program = program;
  const int32_t n = int32_t(g.nodes().size());
  m.nodes = n;
  m.arena_bytes = p.arena_bytes;
  m.naive_bytes = p.naive_bytes;
  m.derived_bytes = p.derived_bytes;
  m.peak_node = p.peak_node;
  for (const Slot& s : p.slots)
    if (s.storage == Storage::parameter) m.parameter_bytes += s.bytes;
  // Each value's last reader; a view's readers read its input's bytes.
  std::vector<int32_t> last(size_t(g.num_values()), -1);
  for (int32_t i = 0; i < n; ++i)
    for (graph::ValueId v : g.node(i).inputs) last[size_t(v.index)] = std::max(last[size_t(v.index)], i);
  for (graph::ValueId v : g.roots()) last[size_t(v.index)] = n - 1;
  auto is_view = [&](int32_t i) { return size_t(i) < p.views.size() && p.views[size_t(i)]; };
  for (int32_t i = n - 1; i >= 0; --i)
    if (is_view(i)) {
      const graph::Node& node = g.node(i);
      int32_t& in = last[size_t(node.inputs[0].index)];
      in = std::max(in, last[size_t(node.outputs[0].index)]);
    }
  std::vector<int64_t> delta(size_t(n) + 1, 0);
  for (int32_t i = 0; i < n; ++i) {
    if (is_view(i)) continue;  // its output is its input's bytes
    for (graph::ValueId v : g.node(i).outputs) {
      const Slot& s = p.slots[size_t(v.index)];
      if (s.storage != Storage::arena || s.bytes <= 0) continue;
      int32_t end = std::max(i, last[size_t(v.index)]);
      // Written over by an output of its last reader (in place): that output takes its bytes from there on.
      if (end > i)
        for (graph::ValueId o : g.node(end).outputs) {
          const Slot& so = p.slots[size_t(o.index)];
          if (so.storage == Storage::arena && so.offset == s.offset && !is_view(end)) {
            --end;
            break;
          }
        }
      delta[size_t(i)] += s.bytes;
      delta[size_t(end) + 1] -= s.bytes;
    }
  }
  m.stride = std::max<int64_t>(1, (int64_t(n) + profile::ProgramMemory::kMaxPoints - 1) /
                                       profile::ProgramMemory::kMaxPoints);
  int64_t live = 0;
  for (int32_t i = 0; i < n; ++i) {
    live += delta[size_t(i)];
    if (i % m.stride == 0) m.live_bytes.push_back(live);
    else m.live_bytes.back() = std::max(m.live_bytes.back(), live);
  }
  for (int32_t v : p.live_at_peak) {
    const Slot& s = p.slots[size_t(v)];
    const graph::ValueId id{v};
    m.at_peak.push_back({graph::op_name(g.producer(id).op), g.type(id).to_string(), s.bytes});
  }
  std::stable_sort(m.at_peak.begin(), m.at_peak.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  if (m.at_peak.size() > 20) m.at_peak.resize(20);
  return m;
}

}  // namespace aspen::compiler
