// graph/verify.h: the verifier.
//
// Checks every node against its op's table entry: input count, attribute
// schema (every required attribute present with its kind; no unknown ones),
// the shape/type rule, and that the recorded output types equal what the rule
// infers; that inputs refer to earlier values (so no cycles); that
// constants carry data of their type; that names of inputs, parameters and
// outputs are unique and non-empty. A failure names the node index, the op,
// the input types and the rule that failed:
//   node 7 (matmul) with inputs (f32[4, 8], f32[5, 3]): matmul: K: expected 8 (a's last dimension), found 5
// It runs after every compiler pass in tests and debug builds.
#pragma once

#include <vector>

#include "core/status.h"
#include "graph/graph.h"

namespace aspen::graph {

Status verify(const Graph& graph);

// Checks one node that is about to be added (or already is) and returns the
// output types its op's rule infers. The Builder uses this.
Result<std::vector<TensorType>> check_node(const Graph& graph, const Node& node);

}  // namespace aspen::graph
