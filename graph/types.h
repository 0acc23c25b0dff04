// graph/types.h: what flows along the edges of a graph.
//
// A ValueId names one output of one node; a TensorType is its dtype and shape.
// Shapes are static: aspen compiles for fixed shapes, as Poplar does.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/shape.h"

namespace aspen::graph {

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
  std::string to_string() const;  // "f32[2, 3]"
  int64_t bytes() const { return shape.numel() * dtype_size(dtype); }
};

// Index into Graph::values(). Stable for the life of the graph.
struct ValueId {
  int32_t index = -1;
  bool valid() const { return index >= 0; }
  bool operator==(const ValueId&) const = default;
};

}  // namespace aspen::graph
