// api/training_model.h: a forward graph with a scalar loss, compiled with its
// backward pass and optimizer into programs on a device (PopTorch's
// trainingModel).
//
//   api::Options opts;
//   opts.device_iterations(4).gradient_accumulation(2).precision(DType::bf16);
//   api::TrainingOptions t;
//   t.optimizer.kind = train::OptimizerKind::adamw;
//   t.schedule = {.kind = train::ScheduleKind::cosine, .lr = 3e-4, .warmup_steps = 100, .total_steps = 5000,
//                 .min_lr_ratio = 0.0};
//   ASPEN_ASSIGN_OR_RETURN(auto model, api::TrainingModel::create(forward_graph, opts, t));
//   ASPEN_RETURN_IF_ERROR(model->copy_weights_to_device(weights));
//   ASPEN_ASSIGN_OR_RETURN(auto out, model->run({{"input_ids", &ids}, {"targets", &targets}}));
//
// (examples/cpp/training_model.cc trains a small model this way with replicas; CI runs it.)
//
// One run() makes device_iterations optimizer steps, each of
// gradient_accumulation micro-batches: every input carries a leading
// dimension of device_iterations × gradient_accumulation micro-batches in
// front of the forward graph's own shape (or the same bytes with the first
// two dimensions merged, PopTorch's combined batch). The micro-batches of one
// step are consecutive. Output "loss" is each step's loss (the mean of its
// micro-batches' losses) by the output mode: all → [device_iterations],
// final → the last step's, sum → their sum. TrainingOptions::outputs come
// beside it, each [micro-batches, ...] with every micro-batch this process
// ran, in the inputs' order (the output mode is the caller's to apply).
//
// What runs is train/program.h's fused or split step. The host decides, per
// step, the learning rate (the schedule at the step about to be made), the
// loss scale, the clipping factor and whether an overflowing step is skipped;
// none of these recompiles.
//
// Non-finite numbers: with dynamic loss scaling an overflowing step is
// skipped and counted. Otherwise a non-finite loss or gradient stops the run
// with a FailedPrecondition naming the step and the first non-finite tensor;
// the model is then unusable and must be reloaded from a checkpoint (with the
// fused step the update has already been applied).
//
// Data parallel (Options::replication_factor R per process, times the
// processes of an MPI job with Options::mpi): every replica runs the
// micro-batches of its own slice of each step, its gradients are reduced
// over all replicas (parallel/data_parallel.h: inside the process to the
// replica that owns each tensor, then across processes), and each local
// replica's optimizer step updates its shard of the parameters, which the
// process's replicas share. Inputs then carry device_iterations ×
// gradient_accumulation × R micro-batches (replica fastest: slice
// (step·accumulation + micro)·R + r is replica r's), or the same bytes with
// the leading dimensions merged. Losses are the mean over every replica.
// With the mean reduction, R replicas equal one device with R times the
// gradient accumulation on the same data (up to the order of additions).
// After a failed step the group is aborted and the model unusable.
//
// A model across processes (Options::model_across_processes, under mpirun):
// each process is one device, one pipeline stage or one tensor shard of a
// replica (process (d·stages + s)·shards + t), and inputs are its replica's
// micro-batches (device_iterations × gradient_accumulation). Every process
// keeps only its stage's or shard's weights and state, so copying weights or
// optimizer state to the host, evaluate() and run() are collectives: every
// process of the job calls them, in the same order.
//
// Thread-safety: one call at a time.
//
// The model is a facade: train/runner.h's Runner holds the layout, the
// programs, the plan and the groups, and runs the steps.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/options.h"
#include "graph/graph.h"
#include "train/rebalance.h"
#include "train/training_options.h"

namespace aspen::runtime {
class Session;
}
namespace aspen::train {
class Runner;
class TensorSharding;
struct Plan;
struct TrainingPrograms;
}  // namespace aspen::train

namespace aspen::api {

using train::Reduction;
using train::TrainingOptions;
using train::PipelineStats;
using train::StepStats;

class TrainingModel {
 public:
  static Result<std::unique_ptr<TrainingModel>> create(const graph::Graph& forward, const Options& options,
                                                       const TrainingOptions& training);
  ~TrainingModel();

  const Options& options() const { return options_; }
  const TrainingOptions& training_options() const;
  const train::TrainingPrograms& programs() const;
  const runtime::Session& session() const;
  // By session program: its name ("step", "stage 1 backward", "evaluation"; "" for a placeholder never run).
  const std::vector<std::string>& program_names() const;
  // Every process of the job (Options::mpi), for what the processes do together; null in one process.
  parallel::Communicator* job() const;
  bool cache_hit() const;
  bool cache_stored() const;  // every program executable_cache missed was written to it
  // Data-parallel replicas in the whole job (local × processes), and this
  // process's index among the processes (0 without MPI).
  int replicas() const;
  int process() const;
  int processes() const;
  // ZeRO-1 across processes is on: this process keeps only its shards' optimizer state.
  bool optimizer_state_sharded() const;
  // The model spans processes (Options::model_across_processes): copying
  // weights and state to the host is collective.
  bool model_across_processes() const;
  // Tensor shards that split the vocabulary too (models/tensor_parallel.h).
  bool vocab_parallel() const { return vocab_parallel_; }

  // Model weights by name (f32 master weights; not "optimizer.*", "train.*" or "state.*").
  Status copy_weights_to_device(const std::map<std::string, const Tensor*>& weights);
  Result<std::map<std::string, Tensor>> copy_weights_to_host() const;
  // With TrainingOptions::keep_gradients: the last step's gradients by parameter (train/runner.h).
  Result<std::map<std::string, Tensor>> copy_gradients_to_host() const;
  // The optimizer state ("optimizer.*": moments, momentum buffers, the step
  // count). With ZeRO-1 across processes (DataParallelOptions::
  // shard_optimizer_state) each process keeps its shards only: copying to the
  // host is then a collective that every process calls (it gathers the whole
  // state), and copying to the device keeps this process's part.
  Status copy_optimizer_state_to_device(const std::map<std::string, const Tensor*>& state);
  Result<std::map<std::string, Tensor>> copy_optimizer_state_to_host() const;
  // Name → type of the weights and of the optimizer state (what a checkpoint must match).
  std::map<std::string, std::pair<DType, Shape>> weight_types() const;
  std::map<std::string, std::pair<DType, Shape>> optimizer_state_types() const;

  // PopTorch's setOptimizer: a new base learning rate (the schedule keeps its shape).
  void set_learning_rate(double lr);

  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs);
  const std::vector<StepStats>& last_steps() const;
  const PipelineStats& last_pipeline_stats() const;
  int pipeline_stages() const;
  // The stage of each forward-graph node (-1: inputs, parameters, constants): where the cut fell.
  std::vector<int> pipeline_stage_of() const;
  // The loss of one micro-batch (inputs in the forward graph's own shapes)
  // with the current weights, changing nothing: validation (on the first
  // replica, inputs of one micro-batch). A program of the same session, so
  // the weights are not copied.
  Result<float> evaluate(const std::map<std::string, const Tensor*>& inputs);

  // Optimizer steps made so far (skipped ones included), and the loss scaler;
  // both are host state a checkpoint keeps.
  int64_t steps_done() const;
  void set_steps_done(int64_t n);
  const train::LossScaler& loss_scaler() const;
  train::LossScaler& loss_scaler();

  std::string profile_summary() const;

  // One optimizer step of this model's layout as per-device instruction lists (train/plan.h):
  // what `aspen train --print-plan` shows, and what every device runs.
  const train::Plan& plan() const;

  // TrainingOptions::Balance::dynamic (train/rebalance.h): the moves of layers between pipeline stages made
  // so far, in order (each made at the start of the run() after the step that decided it), and the index of
  // the move whose measured gain the last run() learnt (-1: none).
  const std::vector<train::StageMove>& stage_moves() const;
  int stage_move_just_measured() const;
  // Moves that could not be made (the error of each; training went on at the old cut, which is not proposed
  // again). When the old cut could not be made again either, run() fails and the model holds its weights and
  // optimizer state on the host only: copy_weights_to_host() and copy_optimizer_state_to_host() still give
  // them, every other call but steps_done() is then undefined.
  const std::vector<std::string>& stage_move_failures() const { return move_failures_; }

 private:
  TrainingModel() = default;
  // Moves the stages to `stage_of` (by forward node): the weights, optimizer state, step count and loss scaler
  // through the host into a runner compiled for the new cut. On failure the old runner stays.
  Status move_stages(const std::vector<int>& stage_of);
  std::unique_ptr<train::StageBalancer> balancer_;  // Balance::dynamic with stages
  std::optional<std::vector<int>> next_cut_;        // decided after the last run(), made before the next
  int just_measured_ = -1;
  std::vector<std::string> move_failures_;
  struct Stranded {  // a move that left no runner: the state it had
    std::map<std::string, Tensor> weights, state;
    int64_t steps = 0;
  };
  std::unique_ptr<Stranded> stranded_;
  Status stranded_error() const;
  static std::map<std::string, Tensor> copy_of(const std::map<std::string, Tensor>& m);
  Options options_;
  bool vocab_parallel_ = false;
  std::unique_ptr<train::TensorSharding> sharding_;  // with tensor shards: the model family's rule
  std::unique_ptr<train::Runner> runner_;
};

}  // namespace aspen::api
