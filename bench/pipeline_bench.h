// bench/pipeline_bench.h: `aspen bench pipeline`.
//
// The pipeline bubble measured on real programs beside the ideal
// (p - 1) / (m + p - 1), for p stages and m micro-batches per step, with the
// GPipe and 1F1B schedules. The model is `stages` x `blocks` identical blocks
// (h = h + tanh(h · W), W [width, width]) on a batch of rows, tagged so every
// stage gets the same number, and a sum-of-squares loss: balanced stages, as
// the formula assumes. Each stage is a device of one thread
// (api::TrainingModel with TrainingOptions::pipeline, SGD). A step's bubble
// is 1 - mean over stages of (seconds in programs) / (the step's wall time
// through the micro-batches); the median over `steps` steps after one
// warm-up is reported.
//
// With more stages than cores the stages share cores and the measurement
// says more about the scheduler than about the pipeline; the table says so.
//
// Balance (`--balance`, on by default): an untagged model whose cost the
// estimate misjudges, `attention_blocks` blocks of a [C, C] projection and
// causal self-attention (O(T²) work for [T, C] outputs: the estimate counts
// the outputs) then as many matmul blocks of the same projection's cost, cut into 2 stages by the estimated and by the measured
// costs (TrainingOptions::pipeline.balance). Each row: the stages' busy
// seconds, their max / mean (1 is balanced), and the step's wall time; the
// ratio of the two walls is the measured cut's speed-up.
//
// Rebalance (`--no-rebalance` skips it): the same model with parallel.balance:
// dynamic, on even devices and with stage 1's device slowed; the share of
// the lost throughput the moves won back within `rebalance_steps` steps,
// against the best cut near the one they reached, and what a move costs in
// steps.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct PipelineBenchOptions {
  bool json = false;
  std::vector<int> stages = {2, 4};
  std::vector<int> micro = {4, 8};
  int64_t width = 1024, rows = 128, blocks = 4;  // per stage: blocks of [rows, width] x [width, width]
  int64_t steps = 3;
  bool quick = false;  // width 64, rows 8, 1 block, 1 step: a smoke test
  bool balance = true;  // also the estimated-against-measured cut (see above)
  int64_t seq = 1024, heads = 4, head_dim = 64, attention_blocks = 4;
  // Rebalance (on with the balance rows; `--no-rebalance` skips it): parallel.balance: dynamic on the balance model, on even
  // devices and with stage 1's device slowed by `slow_stage` (a test hook that spins), against the estimated
  // cut and the best cut near the one it reached (NOTE [rebalance rows] in pipeline_bench.cc).
  bool rebalance = true;
  double slow_stage = 0.5;
  int64_t rebalance_steps = 50;
};

Status run_pipeline_bench(const PipelineBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
