// api/trainer.h: the training job behind `aspen train CONFIG.yaml`: a model
// (from scratch, a Hugging Face directory, or a user's own ONNX file), token
// shards or arrays, an optimizer and schedule, precision and batch sizes from
// a train::TrainConfig, run to the configured number of steps with
// validation, checkpoints, reports and samples.
//
//   api::TrainerOptions options;
//   options.resume = true;
//   ASPEN_ASSIGN_OR_RETURN(auto t, api::Trainer::create(config, options));
//   ASPEN_ASSIGN_OR_RETURN(api::TrainResult result, t->run());
//
// (examples/cpp/trainer.cc trains a small GPT-2 this way; CI runs it.)
//
// The run directory (log.run_dir, default runs/<name>) receives:
//   config.yaml     the config as run (every key)
//   metrics.jsonl   one line per step: loss, lr, grad_norm, loss_scale, tokens/s, skipped; val_loss lines
//   loss.svg        the loss curves, rewritten at every validation and at the end
//   checkpoints/    train::save_checkpoint's layout (checkpoint.dir overrides)
//   model/          the final weights as a Hugging Face directory (with the tokenizer), which
//                   transformers and `aspen generate` load; for an ONNX model, model/model.onnx:
//                   a copy of model.from with the trained initializers, nothing else changed
//
// An ONNX model (model.from: *.onnx, NOTE [onnx training] in trainer_feed.cc) is
// imported with its graph inputs shaped by the data's columns (a micro-batch
// of each: api/trainer_feed.h), and trained against model.loss over
// model.output, whose targets come from the column model.targets. Its data is
// token shards (columns tokens, targets, positions, mask) or arrays (an .npz
// or a directory of .npy files: one column per array). Everything else (the
// optimizers, precision, accumulation, clipping, checkpoints, replicas over
// threads and MPI, pipeline stages) is as for the built-in families; tensor
// shards and samples are not (the config refuses them).
//
// Batches: each optimizer step takes micro × accumulation examples of
// data.seq tokens (DeepSpeed's global batch with one replica); one call of
// the compiled program makes train.device_iterations steps, so train.steps,
// checkpoint.interval and eval.interval must be multiples of it.
//
// The run directory (and a checkpoint.dir outside it) is locked for the life
// of the trainer; a second job on it is refused naming the first one's pid.
// Every output directory is checked writable before step 1. A run directory
// that holds a run is refused unless resuming or overwriting.
//
// Failures after a step finished (a token shard truncated under the run, a
// full disk writing metrics) still write a checkpoint of that step before the
// error returns; the error says whether it was saved.
//
// Resuming (`--resume`) loads the latest checkpoint of the run: weights,
// optimizer state, the step, the data position and the loss scaler, so the
// run continues exactly as if it had not stopped (bitwise: the same programs
// and batches give the same bits). A checkpoint of a different model is an
// error naming the first differences.
//
// A non-finite loss without dynamic loss scaling stops the run with an error
// naming the step and tensor; the last checkpoint on disk is untouched.
//
// Under MPI the processes agree at start-up on every config key that changes
// the result (all but log.*, checkpoint.dir and train.threads), on the token
// data's index and on the initial weights' CRC-32C; a difference is an error
// naming the key (or the data, or the weights) on every process.
//
// Data parallel (batch.replicas R): R / P replicas in each of the P processes
// (P = 1 without MPI), replica g = p·(R/P) + l drawing its slice of every
// global batch from its own DataLoader (train/data.h); the devices of one
// process get train.threads threads each (0: the free cores shared out).
// Validation runs the whole validation split on one replica of each process.
// Checkpoints hold the full weights and optimizer state, the same for every
// layout, so a run may resume with other replicas.
//
// Thread-safety: one run at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/run_directory.h"
#include "api/training_model.h"
#include "core/file.h"
#include "core/status.h"
#include "models/config.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"

namespace aspen::parallel {
class Communicator;
}

namespace aspen::api {

class TrainFeed;

struct TrainerOptions {
  // Continue from the run's latest checkpoint (a damaged one is an error; it
  // never falls back by itself), or from `resume_from` when that is set: a
  // checkpoint root or one step directory (an earlier, good checkpoint).
  bool resume = false;
  std::ostream* out = nullptr;  // progress and messages; nullptr: std::cerr
  // > 0: stop after this step as if interrupted (a checkpoint is written; no
  // export, no samples); resuming later continues exactly. For time-limited
  // jobs and for the resume tests.
  int64_t stop_at = 0;
  // Join the MPI job this process was started in (mpirun; the CLI sets this
  // after parallel::mpi_init): batch.replicas are then spread over its
  // processes, and only process 0 writes the run directory, checkpoints and
  // messages.
  bool mpi = false;
  std::string resume_from = {};  // see `resume`
  // A run directory that holds a run (metrics, checkpoints or an exported
  // model) is refused unless resuming or `overwrite`: then that run's files
  // (metrics, loss curve, model, config, checkpoints) are deleted first.
  bool overwrite = false;
  // Set (from a signal handler, say) to stop at the end of the current call
  // of the program: the trainer writes a checkpoint of the last finished step
  // and returns with TrainResult::interrupted. Under MPI the processes agree
  // on it after every call, so all stop at the same step.
  const std::atomic<bool>* stop_requested = nullptr;
  // The run directory's lock when the caller took it already (the demo does,
  // before writing its corpus there); else create() takes it.
  std::shared_ptr<DirectoryLock> run_lock = {};
  // A directory for the run's profile (docs/profile.md: trace.json, profile.json), written when train()
  // returns; empty: none. Every instruction of `profile_steps` steps is recorded, from the second step of this
  // invocation (the first pays first touches and lazy setup), so a long run's profile stays small; with
  // `profile_every` N > 1, every N-th step from there (each recorded step whole: a sample of a long run).
  // Under device iterations, whole calls: N and the steps round up to multiples of the call's steps.
  std::string profile = {};
  int64_t profile_steps = 10;
  int64_t profile_every = 1;
};

struct TrainResult {
  int64_t steps = 0;                // the step the run ended at
  double first_loss = 0, last_loss = 0;  // of this invocation
  double last_val_loss = -1;        // -1: no validation ran
  double tokens_per_s = 0;          // training tokens (for arrays: examples) per second over this invocation
  int64_t skipped_steps = 0;
  std::string model_dir;            // the exported Hugging Face directory ("" when stopped early)
  bool interrupted = false;         // stopped by stop_requested (a checkpoint of `steps` was written)
  // data.packing: over this invocation's training rows, the documents per row and the share of causal
  // attention pairs (query, earlier key) the block-diagonal mask keeps; 0 without packing.
  double documents_per_row = 0, kept_attention_pairs = 0;
};

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> create(const train::TrainConfig& config, const TrainerOptions& options = {});
  ~Trainer();

  // Trains from the current step to train.steps; then checkpoints, exports
  // the model, releases the training programs and their cores (so that the
  // exported model can be run in this process), and prints the samples.
  // Once only: a second call is FailedPrecondition.
  Result<TrainResult> run();

  // The mean loss over eval.batches validation micro-batches (all when fewer).
  Result<double> validate();

  const train::TrainConfig& config() const { return config_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  int64_t step() const { return model_ ? model_->steps_done() : final_step_; }
  // The tensor shards split the vocabulary too (parallel.vocab_parallel).
  bool vocab_parallel() const { return model_ && model_->vocab_parallel(); }
  TrainingModel* model() { return model_.get(); }  // nullptr after run()
  const models::ModelConfig& model_config() const { return model_config_; }
  const std::string& tokenizer_dir() const { return tokenizer_dir_; }
  // The data is token shards (else arrays, counted in examples).
  bool tokens() const;
  // How long compiling the training programs took, and whether train.executable_cache held them.
  double compile_seconds() const { return compile_seconds_; }
  bool cache_hit() const { return cache_hit_; }
  bool cache_stored() const { return cache_stored_; }  // a miss whose programs were all written
  // The matrix products' backends the training programs took, and where each choice came from (NOTE
  // [matmul choice] in kernels/matmul_choice.cc): "12 matrix product shapes (12 on aspen; 12 from the
  // checkpoint runs/x/checkpoints/step-00000500)". Every checkpoint keeps them; a resumed run adopts them.
  const std::string& kernel_choices() const { return kernel_choices_; }

  // Writes a checkpoint of the current step now.
  Status save();

 private:
  Trainer() = default;
  std::string resume_from() const;  // --resume-from's path, else the run's checkpoint directory
  Result<train::Checkpoint> load_resume_checkpoint() const;  // the checkpoint --resume or --resume-from names
  Status restore();  // from resume_
  Status claim_directories();  // locks, the refusal of an old run, writability: before step 1
  // stop_requested, and whether checkpoint.minutes have passed since `last_save`, agreed by every process.
  struct Agreed {
    bool stop = false, checkpoint_due = false;
  };
  Result<Agreed> stop_agreed(std::chrono::steady_clock::time_point last_save);
  std::string trainer_json() const;
  Status export_model(const std::string& dir);
  Status print_samples(const std::string& dir);
  std::ostream& out() const;

  train::TrainConfig config_;
  TrainerOptions options_;
  std::string run_dir_, checkpoint_dir_, tokenizer_dir_;
  models::ModelConfig model_config_;
  std::unique_ptr<TrainFeed> feed_;  // a loader per local replica (in lockstep) and the validation split
  // model.from: *.onnx: its parameters, whose trained values export_model writes into a copy of the file.
  std::map<std::string, graph::TensorType> onnx_parameters_;
  bool writer_ = true;  // this process writes files and messages (process 0)
  std::shared_ptr<DirectoryLock> run_lock_, checkpoint_lock_;
  std::string replace_;  // with overwrite: the earlier run's files, deleted once create() has succeeded
  std::unique_ptr<parallel::Communicator> world_;  // under MPI: the job's processes (start-up agreement, stop)
  bool across_ = false;  // the model spans processes (Options::model_across_processes)
  std::unique_ptr<profile::TraceRecorder> trace_;  // options.profile: the recorded steps
  std::unique_ptr<TrainingModel> model_;
  int64_t batch_ = 0, seq_ = 0, final_step_ = 0;
  double compile_seconds_ = 0;
  bool cache_hit_ = false, cache_stored_ = false;
  std::string kernel_choices_;
  std::optional<train::Checkpoint> resume_;  // read before compiling (its kernel choices), restored after
  std::vector<std::pair<int64_t, double>> train_curve_, val_curve_;
};

}  // namespace aspen::api
