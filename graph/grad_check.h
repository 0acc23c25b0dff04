// graph/grad_check.h: gradient checking for graph tests (tests only).
//
// check_gradients() differentiates a scalar loss with append_gradients and
// compares every gradient against central finite differences of the
// reference interpreter, all in f64. Op tests build  y = op(inputs), turn it
// into a scalar with weighted_loss (a fixed random weighting, so every output
// element matters differently), and call check_gradients.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "graph/builder.h"
#include "graph/interpreter.h"

namespace aspen::graph::testing {

// A feed for every input and parameter of g: floats uniform in [lo, hi);
// integer ones uniform in [0, int_hi).
std::map<std::string, HostArray> random_feeds(const Graph& g, uint64_t seed, double lo = -1.0, double hi = 1.0,
                                              int64_t int_hi = 4);

// loss = sum(y * W), W a constant of y's type drawn from `seed`.
ValueId weighted_loss(Builder& b, ValueId y, uint64_t seed);

// Gradients of `loss` w.r.t. every float input and parameter, analytic vs
// numeric: NMSE <= max_nmse for each.
::testing::AssertionResult check_gradients(const Graph& g, ValueId loss, const std::map<std::string, HostArray>& feeds,
                                           double max_nmse = 1e-8, double h = 1e-6);

}  // namespace aspen::graph::testing
