// train/runner.h: the training runtime (DESIGN.md, train/: "the one runner
// that executes plans over a Transport"). A Runner owns one training model's
// layout on this process: the job's groups (parallel/job.h: data, pipe,
// tensor), the compiled programs in one runtime::Session (one device per
// mesh coordinate in this process), and the step's plan (train/plan.h). Each
// run() executes device_iterations optimizer steps: every device walks its
// instructions of the plan (its passes, the transfers through a
// parallel::Transport, the reductions and norms), the host decides (the
// step's loss over every process, the gradient norm, loss scaling, skip or
// clip), and every device runs the rest of its plan (its optimizer shard's
// step, ZeRO-1's broadcasts, the tied weights' new values).
//
// api::TrainingModel is the facade users hold (api/training_model.h says
// what each call means for them: input layouts, output modes, what is
// collective across processes); this class is what it runs on. The model
// family's rule for cutting weights over tensor shards comes in as a
// TensorSharding (models/tensor_parallel.h's, passed by the API), so the
// runtime knows no model's parameter names.
//
// Source files: runner.cc (making the groups, compiling, the session, the
// plan; weights and state in and out), runner_step.cc (the fused step, the
// host's part of every other: inputs, the loss, the norm, the decision),
// runner_walk.cc (each device's walk of its plan, one for every layout),
// runner_overlap.cc (the exchange overlapped with the last backward pass),
// runner_spread.cc (stages in other processes: evaluation, gathers).
//
// Thread-safety: one call at a time.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compiler/pass.h"
#include "graph/graph.h"
#include "parallel/mesh.h"
#include "parallel/transport.h"
#include "parallel/data_parallel.h"
#include "profile/trace.h"
#include "runtime/session.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/plan.h"
#include "train/program.h"
#include "train/schedule.h"
#include "train/training_options.h"

namespace aspen::train {

// The layout and the compilation a runner is made for (api::Options binds to it: api/training_model.cc).
struct RunnerOptions {
  int64_t device_iterations = 1;      // optimizer steps per run()
  int64_t gradient_accumulation = 1;  // micro-batches per step
  int64_t replication_factor = 1;     // data-parallel replicas in this process
  bool mpi = false;                   // the replicas of every process of the job form one group
  int64_t tensor_parallel = 1;        // tensor shards
  bool model_across_processes = false;  // one device per process: a stage or shard each
  uint64_t random_seed = 0;
  std::string profile;                // Chrome trace written after each run(); empty: off
  // With `profile` empty: every instruction recorded into this recorder (while it is enabled), which the caller
  // writes out (the trainer's --profile DIR); null: off.
  profile::TraceRecorder* trace = nullptr;
  std::string executable_cache;       // empty: off
  compiler::CompileOptions compile;   // opt level, precision, partials, recompute
  int threads = 0;                    // 0: every free core
};

// How a model family's weights are cut over tensor shards
// (models/tensor_parallel.h): whole on every shard, or cut by rows or columns.
class TensorSharding {
 public:
  virtual ~TensorSharding() = default;
  // Whole on every shard: its gradient is summed over them.
  virtual bool whole(const std::string& name) const = 0;
  // Shard `shard` of `shards` of a whole parameter, and the whole one from every shard's part.
  virtual Result<Tensor> cut(const std::string& name, const Tensor& full, int shard, int shards) const = 0;
  virtual Result<Tensor> gather(const std::string& name, std::span<const Tensor* const> parts) const = 0;
  // The whole parameter's shape from one shard's.
  virtual Shape whole_shape(const std::string& name, const Shape& part, int shards) const = 0;
  // Sets device `device`'s per-shard state (which shard it is, its rows of the vocabulary).
  virtual Status prepare(runtime::Session& session, int device, int shard) const = 0;
};

class Runner {
 public:
  // Makes the job's groups (collective over the job under MPI: every process calls it with the same
  // layout, checked field by field), compiles the programs, loads them and plans the step.
  // `sharding`: with tensor shards, the model's rule (it must outlive the runner).
  static Result<std::unique_ptr<Runner>> create(const graph::Graph& forward, const RunnerOptions& options,
                                                const TrainingOptions& training, const TensorSharding* sharding);

  const RunnerOptions& options() const { return options_; }
  const TrainingOptions& training_options() const { return training_; }
  const train::TrainingPrograms& programs() const { return programs_; }
  const runtime::Session& session() const { return *session_; }
  // By session program: its name for profiles ("step", "stage 1 backward", "evaluation", ...; "" for a
  // placeholder this process compiles in another's place and never runs).
  const std::vector<std::string>& program_names() const { return program_names_; }
  // The job's communicator over every process (null in one process).
  parallel::Communicator* job() const { return job_.get(); }
  bool cache_hit() const { return cache_hit_; }
  bool cache_stored() const { return cache_stored_; }  // every program the cache missed was written to it
  // Data-parallel replicas in the whole job (local × processes), and this
  // process's index among the processes (0 without MPI).
  int replicas() const { return dp_ ? dp_->replicas() : 1; }
  int process() const { return dp_ ? dp_->process() : 0; }
  int processes() const { return dp_ ? dp_->processes() : 1; }
  // ZeRO-1 across processes is on: this process keeps only its shards' optimizer state.
  bool optimizer_state_sharded() const { return zero_; }
  // The model spans processes (Options::model_across_processes): copying
  // weights and state to the host is collective.
  bool model_across_processes() const { return placement_.across; }

  // Weights and optimizer state in and out as whole tensors by name, whatever the layout (cut over tensor
  // shards, spread over stages, ZeRO-1's shards gathered); collective across processes where
  // api/training_model.h says so.
  Status copy_weights_to_device(const std::map<std::string, const Tensor*>& weights);
  Result<std::map<std::string, Tensor>> copy_weights_to_host() const;
  // TrainingOptions::keep_gradients: the last step's gradient of each trained parameter, as the optimizer
  // took it before clipping (the mean over micro-batches and replicas, or their sum; loss scale removed).
  Result<std::map<std::string, Tensor>> copy_gradients_to_host() const;
  Status copy_optimizer_state_to_device(const std::map<std::string, const Tensor*>& state);
  Result<std::map<std::string, Tensor>> copy_optimizer_state_to_host() const;
  std::map<std::string, std::pair<DType, Shape>> weight_types() const;
  std::map<std::string, std::pair<DType, Shape>> optimizer_state_types() const;

  void set_learning_rate(double lr) { training_.schedule.lr = lr; }

  // device_iterations steps; each step's loss.
  Result<std::vector<float>> run(const std::map<std::string, const Tensor*>& inputs);
  const std::vector<StepStats>& last_steps() const { return last_; }
  // The last run()'s TrainingOptions::outputs, handed over (a second call gets none): each [micro-batches,
  // ...] with this process's micro-batches in the order the inputs hold them ((step · accumulation + micro) ·
  // local replicas + replica).
  std::map<std::string, Tensor> take_last_outputs() { return std::exchange(last_outputs_, {}); }
  const PipelineStats& last_pipeline_stats() const { return pipe_stats_; }
  int pipeline_stages() const { return pipe_ ? int(pipe_->stages.size()) : 1; }
  // The stage of each forward-graph node (-1: inputs, parameters, constants): where the cut fell.
  std::vector<int> pipeline_stage_of() const { return pipe_ ? pipe_->split.stage_of : std::vector<int>{}; }
  // The node costs the cut balanced (by forward node): measured ones (Balance::measured, dynamic), or empty
  // (the estimate, or stage tags).
  const std::vector<double>& pipeline_node_costs() const { return node_costs_; }
  // The loss of one micro-batch (inputs in the forward graph's own shapes)
  // with the current weights, changing nothing: validation (on the first
  // replica, inputs of one micro-batch). A program of the
  // same session, so the weights are not copied.
  Result<float> evaluate(const std::map<std::string, const Tensor*>& inputs);

  // Optimizer steps made so far (skipped ones included), and the loss scaler;
  // both are host state a checkpoint keeps.
  int64_t steps_done() const { return steps_done_; }
  void set_steps_done(int64_t n) { steps_done_ = n; }
  const train::LossScaler& loss_scaler() const { return scaler_; }
  train::LossScaler& loss_scaler() { return scaler_; }

  std::string profile_summary() const { return recording_ ? profile::summary(recording_->events()) : ""; }

  // One optimizer step of this model's layout as per-device instruction lists (train/plan.h):
  // what `aspen train --print-plan` shows, and what a pipelined step's devices run.
  const train::Plan& plan() const { return plan_; }

 private:
  Runner() = default;
  // The fused step: one program of device_iterations steps (train/runner_step.cc).
  Result<std::vector<float>> run_fused(const std::map<std::string, const Tensor*>& inputs);
  // Every other step (accumulation, replicas, stages, shards, across processes): each device walks its
  // plan (train/runner_walk.cc), the host decides between the two halves (train/runner_step.cc).
  Result<std::vector<float>> run_steps(const std::map<std::string, const Tensor*>& inputs);
  // What one step holds while its devices walk their plans.
  struct StepState {
    int64_t iteration = 0;                                  // within this run()
    const std::map<std::string, const Tensor*>* inputs = nullptr;
    const std::map<std::string, Shape>* per = nullptr;      // each data input's per-micro-batch shape
    Tensor loss_scale;
    // By pipe group (its first mesh rank: a replica's shard t of every stage): the edges' and tied
    // parameters' transport, whose endpoints are the stages. None without stages.
    std::map<int, std::unique_ptr<parallel::Transport>> transports;
    std::vector<std::vector<float>> losses;  // by device: each micro-batch's loss where the device computes it
    // By device, by micro-batch: TrainingOptions::outputs of its pass.
    std::vector<std::vector<std::map<std::string, Tensor>>> outputs;
    std::vector<std::vector<float>> sq;      // by device: Σg² by parameter of the reduced gradients it holds
    PipelineStats stats;                     // by device: its passes', waits' and exchanges' times
  };
  // The data inputs' per-micro-batch shapes, each input checked against them.
  Result<std::map<std::string, Shape>> data_inputs(const std::map<std::string, const Tensor*>& inputs) const;
  Status open_transports(StepState& step);
  // Device d's pipe group's transport (null without stages).
  parallel::Transport* transport_of(StepState& step, int device);
  // Device d's instructions up to the host's decision, and after it.
  Status walk_to_decision(int device, StepState& step);
  Status walk_after_decision(int device, StepState& step, const Tensor& lr, const Tensor& grad_scale);
  // fn on every device at once; a failure fails the step's transports and aborts the device's groups at once
  // (the others stop rather than wait for their timeout).
  Status on_devices(StepState& step, const std::function<Status(int)>& fn);
  // The step's global gradient norm squared (scaled), added in parameter order; 0 when not measured.
  Result<double> step_norm(const StepState& step);
  Status check_finite_weights(int64_t step, float loss) const;
  Result<std::string> first_non_finite(const std::string& prefix) const;
  Result<std::string> first_non_finite_gradient() const;
  // After a step's micro-batches: the norm, the non-finite check, the loss
  // scaler and clipping, then apply(lr, grad_scale) runs the optimizer;
  // records the step.
  Status finish_step(StepStats& s, double sq,
                     const std::function<Status(const Tensor& lr, const Tensor& grad_scale)>& apply);
  void advance_step_count();
  // The split step measures the gradient norm when the host needs it
  // (clipping, dynamic loss scaling) or when there is one device (where the
  // split step exists because of accumulation, and the norm is cheap beside
  // it). Data-parallel, pipeline and tensor-parallel steps otherwise skip that
  // pass over the gradients, as the fused step does; a non-finite gradient is
  // then applied and shows as a non-finite loss in the next step.
  bool needs_norm() const {
    return training_.clip_grad_norm > 0.0 || training_.loss_scaling.mode == train::LossScaling::dynamic ||
           (!dp_ && session_->replicas() == 1);
  }
  // A step's loss from this process's micro-batch losses ([acc][local
  // replicas]): the mean over every process's, in global batch order.
  Result<float> step_loss(const std::vector<float>& local);
  // The gradient exchange overlapped with the last micro-batch's backward pass (train/runner_overlap.cc;
  // where it applies is the plan's: a reduce marked overlapped): `program` on `device`, each update's piece
  // (by update index; data null: not exchanged) handed to a helper thread when final, `expected` of them in
  // all, reduced by `exchange` in buckets of bucket_bytes; `abort` fails the groups when either side fails.
  struct ExchangePiece {
    float* data = nullptr;
    int64_t count = 0;
    int owner = 0;
  };
  using ExchangeFn =
      std::function<Status(std::span<float* const>, std::span<const int64_t>, std::span<const int>)>;
  // `exchanged_s`, `exchanged_bytes`: the exchanges' seconds and bytes, added to; `exposed_s`: the seconds the
  // device waited for them after its program had finished, added to.
  Result<std::map<std::string, Tensor>> run_overlapped(int device, const std::map<std::string, const Tensor*>& feeds,
                                                       int program, const std::vector<ExchangePiece>& pieces,
                                                       size_t expected, const ExchangeFn& exchange,
                                                       const std::function<void(const std::string&)>& abort,
                                                       double& exchanged_s, int64_t& exchanged_bytes,
                                                       double& exposed_s);
  // What every process of a job must agree on, by name: the layout (checked before any group is made) and
  // what decides each step's result beside the programs (checked after compiling).
  static std::vector<std::pair<std::string, std::string>> layout_fields(const RunnerOptions& o,
                                                                       const TrainingOptions& t);
  static std::vector<std::pair<std::string, std::string>> step_fields(const RunnerOptions& o,
                                                                     const TrainingOptions& t);
  // The plan (train/plan.h) of this model's step, made once by create().
  Result<train::Plan> make_plan() const;
  train::Plan plan_;
  // The job's mesh and where it lives (parallel/mesh.h): the one source of every device's coordinates. This
  // process drives mesh ranks first_rank_ .. first_rank_ + placement_.process_devices() - 1 as its devices
  // 0, 1, ...; across processes one device, the process's rank.
  parallel::Placement placement_;
  std::optional<parallel::Mesh> mesh_;
  int first_rank_ = 0;
  // The mesh rank of this process's device d (the plan's device index), its coordinates, and the device of
  // this process at coordinates c.
  int mesh_rank(int device) const { return first_rank_ + device; }
  parallel::Coord coord_of(int device) const { return mesh_->coord(mesh_rank(device)); }
  int device_at(const parallel::Coord& c) const { return mesh_->rank(c) - first_rank_; }
  // The devices of this process in device d's group along `axis` (d's own included), by their coordinate.
  std::vector<int> local_group(parallel::Axis axis, int device) const;
  // The accumulator of parameter `param` on pipeline stage `stage` (a tied copy's on a later stage: "@<stage>").
  std::string accumulator_name(int param, int stage) const;

  RunnerOptions options_;
  TrainingOptions training_;
  const TensorSharding* sharding_ = nullptr;  // with tensor shards
  train::TrainingPrograms programs_;
  bool cache_hit_ = false, cache_stored_ = false;
  std::unique_ptr<profile::TraceRecorder> trace_;  // options.profile's (written after each run)
  profile::TraceRecorder* recording_ = nullptr;    // trace_, or options.trace
  std::unique_ptr<runtime::Session> session_;
  train::LossScaler scaler_;
  int64_t steps_done_ = 0;
  std::vector<StepStats> last_;
  std::map<std::string, Tensor> last_outputs_;
  // The run's outputs as they come, by name: tensors of whole micro-batches of shape `per`, joined into
  // last_outputs_ at the end of run().
  struct OutputPieces {
    Shape per;
    int64_t count = 0;  // micro-batches in `parts`
    std::vector<Tensor> parts;
  };
  std::map<std::string, OutputPieces> output_pieces_;
  void add_output(const std::string& name, Tensor t, const Shape& per);
  Status join_outputs();
  std::vector<std::string> input_names_;  // the forward graph's inputs
  int eval_program_ = -1;
  std::vector<std::string> program_names_;
  std::unique_ptr<parallel::DataParallelGroup> dp_;  // null: one replica, no MPI
  // By trained parameter: the pipeline stage that steps it, or (without stages) the local replica whose
  // optimizer shard does.
  std::vector<int> owner_;
  // The device of this process's first replica that holds parameter `param`'s reduced gradient (tensor
  // shard `shard`'s part): the owning stage's, or the owning local replica's (not across processes).
  int holder(size_t param, int shard) const {
    const int d0 = coord_of(0).data;
    return pipe_ ? device_at({.data = d0, .pipe = owner_[param], .tensor = shard})
                 : device_at({.data = d0 + owner_[param], .pipe = 0, .tensor = shard});
  }
  // Device d's accumulators of `params` on its stage.
  std::vector<Tensor*> accumulators(int device, std::span<const int> params) const;
  bool broken_ = false;                     // a data-parallel step failed: the group is aborted
  std::unique_ptr<train::PipelinePrograms> pipe_;  // pipeline stages (null: none)
  std::vector<double> node_costs_;                 // pipeline_node_costs()
  bool zero_ = false;  // ZeRO-1 across processes (DataParallelOptions::shard_optimizer_state)
  // Tensor parallel: the shards' communicators (group "tensor") and, by
  // trained parameter, whether it is replicated (its gradient is summed over
  // the shards) rather than cut.
  std::vector<std::unique_ptr<parallel::Communicator>> tensor_comms_;
  std::vector<bool> tp_replicated_;
  int tensor_shards() const { return placement_.shape.tensor; }
  int data_replicas() const { return placement_.local_replicas(); }  // replicas in this process
  // The local replica a device belongs to (its data coordinate among this process's).
  int data_replica(int device) const { return coord_of(device).data - coord_of(0).data; }
  // A parameter as the API sees it (whole), cut into or gathered from the
  // tensor shards' parts.
  Status set_full(const std::string& name, const Tensor& full);
  Result<Tensor> get_full(const std::string& name) const;
  std::pair<DType, Shape> full_type(const compiler::Binding& b) const;
  std::pair<DType, Shape> full_type(const std::string& name, const std::pair<DType, Shape>& shard) const;
  // The whole model's weights (or optimizer state) by name and full type.
  std::map<std::string, std::pair<DType, Shape>> full_types(bool weights) const;
  // With replicas of pipeline stages or tensor shards: one data-parallel group per position k in a replica
  // (the mesh rank of (stage, tensor rank) in replica 0), dp_ for k = 0 and more_dp_[k - 1] after; across
  // processes dp_ is the group of this process's position.
  std::vector<std::unique_ptr<parallel::DataParallelGroup>> more_dp_;
  parallel::DataParallelGroup* data_group(int device) {
    if (spread()) return dp_.get();
    const int k = replica_position(device);
    return k == 0 ? dp_.get() : more_dp_[size_t(k - 1)].get();
  }
  // Device d's position in its replica: the mesh rank of its (stage, tensor rank) in replica 0.
  int replica_position(int device) const {
    const parallel::Coord c = coord_of(device);
    return mesh_->rank({.data = 0, .pipe = c.pipe, .tensor = c.tensor});
  }
  std::map<std::string, std::pair<DType, Shape>> state_types_;  // the whole optimizer state (every shard)
  std::vector<std::vector<std::string>> shard_state_;           // by shard: its state's names (not the step count)
  PipelineStats pipe_stats_;
  // NOTE [slowed device]: a test hook (live monitoring's trials): ASPEN_TEST_SLOW_DEVICE="<device>:<fraction>"
  // makes every pass of that device of this process take (1 + fraction) times its time (spinning, as a slow
  // core would: before each pass, runner_walk.cc); "p<process>/<device>:<fraction>" only that process's (under
  // MPI). Read when the model is made and at each run() (a bench turns it on mid-run); unset: off.
  int slow_device_ = -1;
  double slow_fraction_ = 0;
  Status read_slow_hook();
  bool slow_before(int d, int program) const;  // spun
  void slow_after(int d, int program, std::chrono::steady_clock::time_point began, double excluded_s,
                  bool spun) const;
  // By device (only the slowed one's used), by program: its last pass's seconds. Sized by run_steps().
  mutable std::vector<std::map<int, double>> pass_s_;
  // Options::mpi: every process of the job (the start-up checks).
  std::unique_ptr<parallel::Communicator> job_;
  // A model across processes (train/runner_spread.cc; its one device's coordinates are coord_of(0)), and
  // for pipeline stages the replica's stages' group ("pipe").
  std::unique_ptr<parallel::Communicator> pipe_group_;
  bool spread() const { return placement_.across; }
  // Every weight and optimizer state of the whole model, by name, and with
  // pipeline stages the names each stage's programs use.
  std::map<std::string, std::pair<DType, Shape>> all_types_;
  std::vector<std::set<std::string>> stage_uses_;
  // The stage that holds a name's value (its owner for a trained parameter's).
  int holding_stage(const std::string& name) const;
  // Evaluation through the stages' forward programs (stages across processes, or tensor shards of stages in
  // one process, where no device holds every stage's weights): train/runner_spread.cc.
  Result<float> evaluate_stages(const std::map<std::string, const Tensor*>& inputs);
  // Every input of `exe` (but pipeline edges) given with its exact type, before any device starts.
  static Status check_eval_inputs(const compiler::Executable& exe, const std::map<std::string, const Tensor*>& inputs);
  // A tied parameter's instruction of device d: its gradient to (or added into) the owner's accumulator, its
  // new value from the owner (through `transport`), or copied into the other stages' copies (copy_tied, on
  // device d's replica).
  Status tied_transfer(int d, const train::Instr& in, parallel::Transport& transport);
  Result<std::map<std::string, Tensor>> gather_spread_pipeline(bool weights) const;
};

}  // namespace aspen::train
