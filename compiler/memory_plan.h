// compiler/memory_plan.h: where every value of a device's program lives.
//
// State (parameters, constants) lives outside the arena, owned by the session
// and the executable. Every other value is transient: it gets a fixed offset
// in the device's one arena, assigned by liveness over the schedule (the node
// order): a value is live from the node that makes it to its last reader
// (outputs stay live to the end). Offsets are chosen best-fit among the gaps
// free during the whole lifetime, 64-byte aligned. An elementwise node may
// write its output over an input whose life ends at that node (in place).
// A reshape is a view: its output is its input's bytes, which then live as
// long as either is read; it has no instruction. (Not over a parameter that
// an update writes: the view must keep the old value.)
//
// Updates: a parameter's new value is planned into the parameter's own
// storage (no copy at the end of the step) when the node making it may write
// there: it is elementwise over the parameter (or an optimizer step), and no
// other node reads the parameter after it. Otherwise the program copies the
// value in after the last kernel.
//
// Weight-only values (plan_memory's `hoist`, CompileOptions::hoist_weights):
// a node whose inputs are all constants, parameters the program does not
// update, or other such values computes the same thing on every run until a
// parameter changes (the cast of a weight to bf16, a transposed weight). Its
// outputs are `derived`: they live outside the arena, each at its own offset
// of a buffer the session holds per device and program, and the session runs
// their instructions only when a parameter they read has changed since.
//
// The plan reports its peak (the arena size) beside the naive sum (every
// transient in its own buffer) and what is live at the peak.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/graph.h"

namespace aspen::compiler {

enum class Storage : uint8_t { none, arena, parameter, constant, derived };

struct Slot {
  Storage storage = Storage::none;
  int64_t offset = 0;  // arena, derived: byte offset; parameter/constant: index into the executable's lists
  int64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<Slot> slots;  // by ValueId::index
  int64_t arena_bytes = 0;  // the planned peak
  int64_t naive_bytes = 0;  // sum of all transient values
  int32_t peak_node = -1;   // the node at which the arena is fullest
  std::vector<int32_t> live_at_peak;  // values live there
  int64_t in_place = 0;     // outputs that reuse an input's bytes
  int64_t updates_in_place = 0;  // parameter updates written into the parameter
  int64_t views_made = 0;        // reshapes planned as views
  std::vector<char> views;       // by node: a reshape planned as a view (no instruction)
  int64_t derived_bytes = 0;     // the buffer the derived values take (see above)
  // With hoist, by value: weight-only (a constant, a parameter no update
  // writes, or an output of a node that neither talks to other devices nor
  // is a source, makes no update's value, and reads only such values).
  std::vector<char> weight_only;
  // Whether node's outputs are derived: weight-only values a node computes.
  bool derived(const graph::Graph& g, int32_t node) const;
  std::string report(const graph::Graph& g) const;  // a few lines for humans
};

inline constexpr int64_t kArenaAlignment = 64;

// Plans memory for `g` executed in node order. With `hoist`, weight-only
// values are derived (see above).
Result<MemoryPlan> plan_memory(const graph::Graph& g, bool hoist = false);

}  // namespace aspen::compiler
