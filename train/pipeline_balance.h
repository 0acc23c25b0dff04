// train/pipeline_balance.h: measured costs for the automatic pipeline cut.
//
// train/pipeline.h balances an untagged graph's stages by node costs. The
// estimate (multiply-adds, elements) misjudges ops whose work is not their
// output's size (attention is O(T²) per output row) and ignores how fast each
// kernel runs here. measure_pipeline_costs() times the real programs instead:
// the forward graph is cut at every narrow point (the finest cut the stages
// can take), and each piece's forward and backward programs (the backward
// as a stage's runs: taking the forward's saved values, or recomputing them
// with ProgramOptions::recompute_stages) are compiled with the training
// model's options and run `repeats` times after a warm-up on `threads`
// threads; a piece's median time is spread over its nodes in proportion to
// their estimated costs (a cut only falls between pieces, so only the
// pieces' sums matter).
//
// The costs differ from run to run (this machine is shared and noisy), so
// processes of one job must use one process's measurement (the Runner
// broadcasts process 0's).
//
// Thread-safety: a pure function of its arguments (it makes its own sessions).
#pragma once

#include <vector>

#include "compiler/pass.h"
#include "core/status.h"
#include "graph/graph.h"
#include "train/program.h"

namespace aspen::train {

struct MeasuredCosts {
  std::vector<double> node_costs;  // by forward-graph node index (0 for inputs, parameters, constants)
  std::vector<double> piece_s;     // each piece's median seconds (forward + backward), in order
};

Result<MeasuredCosts> measure_pipeline_costs(const graph::Graph& forward, const train::ProgramOptions& options,
                                             const compiler::CompileOptions& compile, int threads, int repeats = 3);

}  // namespace aspen::train
