// train/program.h: the programs a training step is made of, built from a
// forward graph that outputs a scalar loss.
//
// One step is `gradient_accumulation` micro-batches, then one optimizer
// update. Two shapes of step, picked by what the host must decide in between:
//
//  * fused (accumulation 1, no clipping, no dynamic loss scaling): one program
//    runs forward, backward and the optimizer. Each gradient is consumed by
//    its parameter's update as soon as it is made, so no gradient outlives
//    its update (the smallest memory plan), and device_iterations steps run
//    in one call.
//
//  * split (otherwise): gradients are accumulated into state
//    "train.grad.<param>" by
//      micro_first  forward + backward, acc = g         (write_slice: planned in place)
//      micro_next   forward + backward, acc = acc + g   (in place)
//    then
//      norm         "train.grad_sq_norm" f32[n]: Σ acc² of each parameter
//                   (the same bits for any thread count), which the host
//                   adds in parameter order (the same bits for any sharding)
//    lets the host see the global gradient norm, detect Inf/NaN (a skipped
//    step under dynamic loss scaling) and compute the clipping factor, and
//      step         the optimizer, reading the accumulators
//    applies the update. With ProgramOptions::shards > 1 there is one norm
//    and one step program per shard of the parameters; the shards' step
//    programs read "optimizer.step" without advancing it (they run at once),
//    and the caller adds one to it after them. micro_first overwrites the accumulators, so nothing
//    needs zeroing after a skipped step.
//
// Every program that differentiates multiplies the loss by the input
// "train.loss_scale" f32[] first when loss scaling is on; the optimizer's
// input "optimizer.grad_scale" then carries 1 / (loss_scale · accumulation)
// times the clipping factor. The forward graph's other outputs are dropped
// but ProgramOptions::outputs; "loss" (unscaled) and those are each
// differentiating program's outputs.
//
// Parameters named "state.*" (program state such as KV caches) and non-f32
// parameters are not trained.
//
// Thread-safety: pure function of its arguments.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "graph/graph.h"
#include "train/optimizer.h"

namespace aspen::train {

inline constexpr const char* kLossScaleName = "train.loss_scale";
inline constexpr const char* kGradSqNormName = "train.grad_sq_norm";
inline constexpr const char* kTrainPrefix = "train.";
std::string grad_accumulator_name(const std::string& param);  // "train.grad.<param>"

// Whether a parameter name is program state rather than a model weight:
// "state.*" (KV caches), "optimizer.*", "train.*" (gradient accumulators).
bool is_state_name(std::string_view name);
// `forward` with output `loss` its only output (the others dropped; dead-code
// elimination removes what only they needed).
graph::Graph loss_only(const graph::Graph& forward, const std::string& loss);
// The same, keeping `outputs` too (each must be an output of `forward`: an error names a missing one).
Result<graph::Graph> loss_and(const graph::Graph& forward, const std::string& loss,
                              const std::vector<std::string>& outputs);

struct ProgramOptions {
  OptimizerOptions optimizer;
  int64_t gradient_accumulation = 1;
  bool clip = false;                // the host clips by the global norm (needs the norm program)
  bool dynamic_loss_scale = false;  // the host skips overflowing steps (needs the norm program)
  bool loss_scale_input = false;    // record "train.loss_scale" (static or dynamic loss scaling)
  std::string loss = "loss";        // the forward graph's output to minimise
  std::vector<std::string> outputs;  // forward outputs the differentiating programs output too
  bool split = false;               // the split step even when the fused one would do (data parallel)
  // The split step's norm and step programs in this many shards: contiguous
  // groups of the parameters (graph order) of about equal size, so that
  // data-parallel replicas each update one (ZeRO-1's division of the work).
  int shards = 1;
  // Pipeline stages (train/pipeline.h): each stage's backward recomputes its forward instead of taking the
  // values its forward pass kept (NOTE [stashed activations]): less memory, one more forward per micro-batch.
  bool recompute_stages = false;
};

// Each of `grads` (values of `g`) replaced by itself rounded to `dtype` (OptimizerOptions::gradient_dtype,
// PopTorch's accum_type; f32: left as they are).
Status round_gradients(graph::Graph& g, std::span<graph::ValueId> grads, DType dtype);

struct TrainingPrograms {
  std::vector<graph::Graph> graphs;  // the programs, in the order the indices below name
  int fused = -1;                    // >= 0: the one-program step
  int micro_first = -1, micro_next = -1, norm = -1, step = -1;  // the split step (micro_next only with accumulation)
  std::vector<std::string> params;   // the trained parameters, in graph order
  // Split step: shard k's norm program ("train.grad_sq_norm" of params
  // [begin, end)) and step program; -1 for an empty shard (more shards than
  // parameters). norm and step above are shard 0's.
  struct Shard {
    size_t begin = 0, end = 0;
    int norm = -1, step = -1;
  };
  std::vector<Shard> shards;
  bool split() const { return fused < 0; }
};

// A forward graph without output options.loss (or with a non-scalar, non-f32
// one), without trainable parameters, or bad optimizer options: a Status
// naming it.
Result<TrainingPrograms> build_training_programs(const graph::Graph& forward, const ProgramOptions& options);

}  // namespace aspen::train
