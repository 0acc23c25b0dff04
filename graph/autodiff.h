// graph/autodiff.h: reverse-mode differentiation over a graph.
//
// append_gradients() walks the nodes that lie between `wrt` and `loss` in
// reverse order and calls each op's gradient rule (OpInfo::grad), which
// records the backward nodes with a Builder. Gradients of a value used in
// several places are summed (in the fixed order of its uses, last use
// first, so the graph is deterministic). Backward nodes take the pipeline
// stage of the forward node they differentiate.
#pragma once

#include <span>
#include <vector>

#include "core/status.h"
#include "graph/graph.h"

namespace aspen::graph {

// Appends the nodes computing d loss / d wrt[i] and returns their values (a
// value that does not influence the loss gets zeros). `loss` must be a float
// value with one element. A gradient needed through an op without a gradient
// rule is a Status naming the node.
Result<std::vector<ValueId>> append_gradients(Graph& graph, ValueId loss, std::span<const ValueId> wrt);

}  // namespace aspen::graph
