// graph/interpreter.h: the reference interpreter, the definition of what every
// op means.
//
// It runs a graph node by node with each op's reference kernel (OpInfo::eval).
// Every value is held as f64 whatever its dtype (integers exactly, up to
// 2^53), so finite-difference gradient checks run in f64 too. With
// round_to_dtype, every output is rounded to its declared dtype after each op
// (f32 through float, bf16 and f16 by round-to-nearest-even), which is the
// meaning a compiled program must reproduce within tolerance.
//
// Thread-safety: interpret() is a pure function of its arguments.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/graph.h"

namespace aspen::graph {

struct HostArray {
  TensorType type;
  std::vector<double> data;  // numel() elements, row-major

  HostArray() = default;
  explicit HostArray(TensorType t) : type(std::move(t)), data(size_t(type.shape.numel())) {}
  HostArray(TensorType t, std::vector<double> d) : type(std::move(t)), data(std::move(d)) {}
  int64_t numel() const { return type.shape.numel(); }

  static HostArray from_tensor(const Tensor& t);
  Tensor to_tensor() const;  // rounds to the dtype
};

// Rounds v to what `dtype` can hold (integers: toward zero; bool: != 0).
double round_to(DType dtype, double v);

struct InterpretOptions {
  bool round_to_dtype = false;
};

// Feeds give every input and parameter by name. Returns the graph's named
// outputs. A missing or mistyped feed is a Status naming it.
Result<std::map<std::string, HostArray>> interpret(const Graph& graph, const std::map<std::string, HostArray>& feeds,
                                                   const InterpretOptions& options = {});

// One step of a graph with updates: its outputs, and each updated parameter's
// new value by name (what a session's parameter holds after the step).
struct StepResult {
  std::map<std::string, HostArray> outputs, updates;
};
Result<StepResult> interpret_step(const Graph& graph, const std::map<std::string, HostArray>& feeds,
                                  const InterpretOptions& options = {});

// As interpret(), returning every value (indexed by ValueId::index).
Result<std::vector<HostArray>> interpret_all(const Graph& graph, const std::map<std::string, HostArray>& feeds,
                                             const InterpretOptions& options = {});

}  // namespace aspen::graph
