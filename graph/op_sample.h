// graph/op_sample.h: the cases an op's table entry gives the kernel sweep.
//
// An op with a fast kernel (OpInfo::prepare) also lists samples
// (OpInfo::samples): small graphs whose last node is the op, at odd shapes,
// with the attributes and in every dtype its fast kernel takes, plus the
// dtypes that fall back to the reference (marked `fast = false`). The sweep in
// graph/ops_fast_test.cc prepares each sample's last node and checks it
// against the reference interpreter; an op with a fast kernel and no samples
// fails it. So a new op is tested by its own entry, not by a hand list.
//
//   void samples_exp(SampleList& s) {
//     s.add("f32 odd shape", [](Builder& b) { b.exp(b.input("x", DType::f32, {3, 5, 7})); }, {.lo = -30, .hi = 30});
//   }
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "graph/graph.h"

namespace aspen::graph {

class Builder;

// How the sweep fills a sample's inputs: floats uniform in [lo, hi),
// integers uniform in [0, int_hi), all from `seed`. `ranges` gives some inputs
// (by name) their own [lo, hi) (integers: the integer part of a draw in it);
// `values` gives some inputs whole, row-major.
struct SampleFeeds {
  uint64_t seed = 1;
  double lo = -1.0, hi = 1.0;
  int64_t int_hi = 4;
  std::map<std::string, std::pair<double, double>> ranges = {};
  std::map<std::string, std::vector<double>> values = {};
  double quantum = 0.0;  // > 0: float inputs rounded to multiples of it (rounding ops meet their ties)
};

struct OpSample {
  std::string label;  // names the case in a failure
  Graph graph;        // its last node is the op under test
  Status built;       // the builder's status: a sample that does not build fails the sweep
  SampleFeeds feeds;
  // Allowed max |fast - reference| / max |reference| per output (the error
  // relative to the output's scale).
  double tol = 1e-5;
  // false: these types have no fast kernel, and prepare must say so (null),
  // so lowering runs the reference.
  bool fast = true;
};

// A shape from dimensions computed at run time (a sample's shapes are valid by construction).
Shape sample_shape(const std::vector<int64_t>& dims);

// Collects an op's samples.
class SampleList {
 public:
  explicit SampleList(std::vector<OpSample>& out) : out_(out) {}
  // build adds the sample's inputs and, last, the op's node.
  OpSample& add(std::string label, const std::function<void(Builder&)>& build, SampleFeeds feeds = {});

 private:
  std::vector<OpSample>& out_;
};

}  // namespace aspen::graph
