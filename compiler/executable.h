// compiler/executable.h: what compile() returns and a session runs.
//
// A Program is the device's instruction stream, in order:
//   host_write  one per input: the step's slice of the input, host -> its slot
//   kernel      one per graph node that computes something, bound at compile
//               time to a PreparedKernel for its exact types
//   collective  one per collective node (all_reduce, reduce_scatter,
//               all_gather, send, recv): a group of one is the identity; a
//               larger group runs on the device's communicator (W1.5)
//   copy        one per parameter update not done in place: value -> the
//               parameter's storage, after every reader of the old value
//   host_read   one per output: its slot -> the host, as the output mode says
// Execution only resolves slot pointers and runs: no planning, no allocation
// (DESIGN.md, "Lowering").
//
// Kernels that compute weight-only values (CompileOptions::hoist_weights)
// are marked `derived`: the session runs them on the first run and after a
// parameter they read changed, and skips them otherwise.
//
// Nodes without a fast kernel run their reference kernel through an adapter
// that converts to and from f64 (marked `reference` in the program listing
// and in traces): always correct, slow; the listing shows where.
//
// Thread-safety: an Executable is immutable once built, except that its
// prepared kernels carry per-run state: one session at a time may run it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compiler/memory_plan.h"
#include "compiler/pass.h"
#include "graph/graph.h"

namespace aspen::compiler {

enum class InstrKind : uint8_t { host_write, kernel, collective, copy, host_read };
const char* instr_kind_name(InstrKind kind);

struct Instruction {
  InstrKind kind = InstrKind::kernel;
  int32_t node = -1;             // the graph node it computes (kernel, collective)
  int32_t binding = -1;          // host_write: index into inputs; host_read: into outputs
  bool reference = false;        // runs the reference kernel (no fast one yet)
  bool derived = false;          // computes weight-only values: run when a parameter it reads changed
  bool keeps_fixed = false;      // its kernel keeps work made from weight-only inputs (OpInfo::prepare_fixed)
  std::vector<int32_t> inputs;   // value indices (slots in the memory plan)
  std::vector<int32_t> outputs;
  std::unique_ptr<graph::PreparedKernel> kernel;  // kernel instructions
};

struct Program {
  std::vector<Instruction> code;
};

struct Binding {
  std::string name;
  int32_t value = -1;
  graph::TensorType type;
};

struct Executable {
  graph::Graph graph;   // the graph after passes (what the program computes)
  Program program;
  MemoryPlan plan;
  std::vector<Binding> inputs, parameters, outputs;
  std::vector<Binding> updates;  // name: the parameter; value: its new value
  // By update: the instruction after which the parameter holds its new value
  // (-1: before the first; the program writes it no more after that).
  std::vector<int32_t> update_ready;
  std::vector<std::shared_ptr<const Tensor>> constants;  // by Slot::offset
  CompileOptions options;

  std::string listing() const;  // the program, one instruction per line
};

// The whole pipeline: verify, passes, memory plan, lowering.
Result<std::unique_ptr<Executable>> compile(const graph::Graph& graph, const CompileOptions& options = {});
// Memory planning and lowering only, for a graph that already went through
// the passes (an executable cache entry).
Result<std::unique_ptr<Executable>> lower_optimized(graph::Graph optimized, const CompileOptions& options);

}  // namespace aspen::compiler
