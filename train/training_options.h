// train/training_options.h: what a training step does beside the model and
// its layout (api::TrainingOptions is this struct): the optimizer, the
// learning-rate schedule, clipping, loss scaling, the reduction of the
// micro-batches' and replicas' gradients, the pipeline's stages and schedule,
// and the data-parallel exchange; and what a step reports (StepStats,
// PipelineStats). One description from YAML (train/config.h), the CLI and C++
// down to the runner (train/runner.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/data_parallel.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/schedule.h"

namespace aspen::train {

// How the gradients of a step's micro-batches and replicas combine (poptorch
// accumulationAndReplicationReductionType): their mean (the loss of the whole
// batch) or their sum.
enum class Reduction { mean, sum };

// Balance::dynamic: when the stages move (train/rebalance.h).
struct RebalanceOptions {
  int window = 5;          // steps whose median busy time per stage a decision reads
  double min_gain = 0.05;  // a move must be predicted to shorten the step by this fraction
  int cooldown = 10;       // steps after a move before another may be decided (>= window)
  // The model proposing nothing worth a move, the dearest stage's median still this fraction above the stages'
  // mean: the next cut over is measured (a probe; 0: never).
  double probe_apart = 0.05;
};

struct TrainingOptions {
  OptimizerOptions optimizer;
  LrSchedule schedule;              // its lr is the base learning rate
  double clip_grad_norm = 0.0;      // > 0: clip the global gradient norm to this (torch.nn.utils.clip_grad_norm_)
  LossScaleOptions loss_scaling;
  std::string loss = "loss";        // the forward graph's output to minimise
  // Forward-graph outputs returned beside the loss, every micro-batch's (Runner::last_outputs; PopTorch's
  // `output, loss = model(x, y)`). Not with pipeline stages, tensor shards or a model across processes.
  std::vector<std::string> outputs;
  // Keep each trained parameter's gradient readable after a step (Runner::copy_gradients_to_host; PopTorch's
  // anchored "Gradient___" tensors): the split step, whose accumulators hold them. One device per replica,
  // one process.
  bool keep_gradients = false;
  Reduction reduction = Reduction::mean;
  // Pipeline parallel: the forward graph cut into `stages` stages, one device
  // each (train/pipeline.h: from the model's stage tags, or balanced); the
  // gradient_accumulation micro-batches of a step flow through them in the
  // schedule's order. With replicas (R per process) and tensor shards (T)
  // there are R x stages x T devices, device (r·stages + s)·T + t running
  // shard t of stage s of replica r (parallel/mesh.h's order), and each
  // stage's gradients are reduced over its replicas (in-process and across
  // processes) before replica 0 of the stage steps it.
  // An untagged model is cut where the stages' costs balance: `estimated`
  // (multiply-adds and elements, train/pipeline.h) or `measured` (each piece
  // of the finest cut compiled and timed on this machine first,
  // train/pipeline_balance.h; under MPI process 0's measurement is used).
  // `dynamic` starts from the measured cut and moves layers between the stages while training, at step boundaries,
  // when their measured times drift apart (train/rebalance.h; one process; the losses and weights stay those
  // of a run that never moved: NOTE [moving stages] in train/pipeline.cc).
  enum class Balance { estimated, measured, dynamic };
  struct Pipeline {
    int stages = 1;
    PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
    Balance balance = Balance::estimated;
    // Each stage's backward recomputes its forward instead of keeping what it reads from the forward pass
    // (NOTE [stashed activations] in train/pipeline.cc): less memory, one more forward per micro-batch.
    bool recompute = false;
    RebalanceOptions rebalance = {};  // Balance::dynamic's
  };
  Pipeline pipeline = {};
  // Data parallel: buckets and compression of the cross-process all-reduce,
  // and the collectives' timeout (local and mpi come from the layout).
  parallel::DataParallelOptions data_parallel = default_data_parallel();
  static parallel::DataParallelOptions default_data_parallel() {
    parallel::DataParallelOptions o;
    o.comm.timeout = std::chrono::minutes(5);  // a peer may be a whole micro-batch behind
    o.comm.name = "data";
    return o;
  }
};

// Where the time of the last step went: each device's seconds in its passes (a pipeline stage's programs, a
// replica's micro-batches), and the step's wall time (micro-batches only, not the optimizer); for a pipeline
// the bubble is 1 - mean(busy) / wall. Empty for a fused one-program step.
struct PipelineStats {
  // By device of this process, over the last step's passes (up to the host's decision): seconds in its passes,
  // waiting for a pipeline peer's values, and in gradient exchanges outside its passes (for an exchange
  // overlapped with the backward pass, the wait for it after the pass); `exchange_s` and `exchange_bytes` count
  // every exchange whole, overlapped or not (its achieved bandwidth).
  std::vector<double> busy_s, wait_s, comm_s, exchange_s;
  std::vector<int64_t> exchange_bytes;
  double wall_s = 0.0;
  double bubble() const;
  void reset(int devices);  // every device's times zero
};

// What the last run() did, step by step.
struct StepStats {
  int64_t step = 0;         // the optimizer step this was (1-based), counting skipped ones
  float loss = 0.0f;        // mean over the micro-batches
  double lr = 0.0;
  double grad_norm = -1.0;  // the global norm of the (unscaled, averaged) gradient; -1: not measured (fused step)
  double loss_scale = 1.0;
  bool skipped = false;     // an overflow under dynamic loss scaling
  // With pipeline stages: each stage's seconds in its passes (the mean over this process's replicas and shards
  // of it); what TrainingOptions::Balance::dynamic reads. Empty without stages or across processes.
  std::vector<double> stage_busy_s;
  double wall_s = 0.0;  // with pipeline stages: the step's wall seconds on its devices (the walk, not the update)
};

}  // namespace aspen::train
