// train/config.h: the training job's config file (YAML) as a TrainConfig.
//
// A config file is a map of sections (model, data, optimizer, schedule,
// precision, batch, parallel, train, checkpoint, eval, log, sample) plus the top-level
// `name`. Every key is optional; a missing key keeps the default written
// below, and an empty file is the all-defaults config. docs/training.md ("The
// config file") documents every key.
//
// Reading is strict, because a mistyped key that is silently ignored costs a
// whole run:
//   * an unknown key at any level is an error naming the file, the line, the
//     key path and, when one is close, the known key meant ("did you mean
//     'warmup_steps'?");
//   * a value of the wrong type (a string where a number goes, a map where a
//     list goes, a float for an integer, a key given twice) is an error with
//     file:line, key path, what was expected and what was found;
//   * a value out of range or an unknown choice (optimizer.name: adam) is an
//     error from validate(), located at the key's line, that lists the range
//     or the choices.
// Errors are InvalidArgument with the subject "<origin>:<line>: <key path>"
// (NotFound / IoError for an unreadable file).
//
// to_yaml() writes every key; parse_train_config(to_yaml(c)) == c for every
// valid c (doubles are written in their shortest exact form).
//
// Thread-safety: plain values and free functions; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kernels/attention_layout.h"
#include "parallel/mesh.h"
#include "train/training_options.h"

namespace aspen::train {

struct ModelSection {
  // A Hugging Face directory (config.json + model.safetensors) to fine-tune, or a user's own ONNX model
  // (a path ending in .onnx); empty: from scratch.
  std::string from;
  std::string family = "gpt2";  // from scratch: "gpt2", "gptj" or "llama"
  int64_t n_layer = 4, n_head = 4, d_model = 128, n_positions = 256;
  int64_t d_ff = 0;        // 0: 4 * d_model (llama: the SwiGLU width, 0: 8/3 * d_model rounded up to 8)
  int64_t rotary_dim = 0;  // gptj only; 0: head_dim
  int64_t n_kv_head = 0;   // llama only; 0: n_head (a divisor of n_head: grouped-query attention)
  int64_t vocab = 0;       // 0: the tokenizer's / data index's vocabulary size
  double init_std = 0.02;
  // An ONNX model (model.from: *.onnx) trains against a loss over one of its outputs
  // (models::add_onnx_loss); these keys are for it alone.
  std::string loss = "cross_entropy";         // cross_entropy | mse
  std::string output;                         // the graph output the loss reads; empty: the model's first
  std::string targets = "targets";            // the data column holding the loss's targets
  int64_t ignore_index = -100;                // cross_entropy: targets of this id count for nothing
  std::map<std::string, std::string> inputs;  // graph input -> data column; an input not named reads its own name
  // Sparse attention for the built-in families (empty: dense): DeepSpeed's sparsity config by its names,
  // {kind: fixed|variable|bigbird|bslongformer|local_sliding_window|dense, block: 64, attention:
  // unidirectional|bidirectional, num_random_blocks, num_sliding_window_blocks, num_global_blocks,
  // num_local_blocks, num_different_global_patterns, horizontal_global_attention, different_layout_per_head}
  // (kernels/attention_layout.h; sparse_attention() reads it).
  std::map<std::string, std::string> attention;
  // Dropout on the attention probabilities of every layer during training steps ([0, 1); the built-in
  // families, tensor shards too): a fresh Philox seed per micro-batch and replica from train.seed and the
  // data position (so a resumed run draws what the uninterrupted one would); none in validation.
  double attention_dropout = 0.0;
  // A BERT from model.from for sequences longer than its learned positions: the position embeddings grown to
  // this many rows, each new row a copy of a learned one (row i takes row i mod max_position_embeddings, the
  // Longformer recipe); the exported model keeps them. 0: the checkpoint's.
  int64_t max_positions = 0;
  std::vector<std::string> frozen;            // initializers kept constant, by name pattern ('*', '?', '[...]')
  std::vector<std::string> trainable;         // one-element initializers trained all the same, by name pattern
  bool is_onnx() const;                       // `from` names an .onnx file
  bool operator==(const ModelSection&) const = default;
};

struct DataSection {
  // A token-shard directory written by `aspen prepare-data`; for an ONNX model also arrays: an .npz file
  // or a directory of .npy files, one per column, examples along the first axis (train/arrays.h).
  std::string train;
  std::string tokenizer;  // for samples; empty: the model directory, else the shard index's tokenizer_dir
  int64_t seq = 128;
  double val_fraction = 0.05;
  // Packed documents: each row's tokens keep their documents apart (the eos token ends one): a token attends
  // only its own document (block-diagonal causal mask), positions restart at each document, and the
  // prediction across a boundary is not trained. Built-in families only.
  bool packing = false;
  // Masked language modelling (a BERT from model.from): the share of tokens each row predicts, chosen at
  // random among the non-special ones; of those, 80 % read [MASK], 10 % a random token, 10 % themselves
  // (Hugging Face's DataCollatorForLanguageModeling).
  double mlm_probability = 0.15;
  // Masked language modelling: the MLM head runs on at most this many predicted tokens per row, not on every
  // position (the loss is the same mean over the predicted tokens; the head's work shrinks by seq / this).
  // 0: mlm_probability * seq plus six standard deviations of the count (a row exceeds it with probability
  // below 1e-9; its extra tokens go untrained, and aspen train says how many); seq or more: every position.
  int64_t max_predictions = 0;
  bool operator==(const DataSection&) const = default;
};

struct OptimizerSection {
  std::string name = "adamw";  // adamw | sgd | lamb
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01, momentum = 0.0;
  bool nesterov = false;
  std::vector<std::string> no_decay = {"bias", "ln_", "norm"};  // parameters whose name contains one: no weight decay
  double clip_grad_norm = 0.0;                                  // 0: off
  bool operator==(const OptimizerSection&) const = default;
};

struct ScheduleSection {
  // constant | cosine | linear (decay after warm-up, to min_lr_ratio * lr at the last step)
  std::string name = "constant";
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
  bool operator==(const ScheduleSection&) const = default;
};

struct PrecisionSection {
  std::string compute = "f32", partials = "f32";  // f32 | bf16 | f16; partials f32 or the compute type
  std::string loss_scaling = "none";              // none | static | dynamic
  double loss_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000, hysteresis = 2;
  bool operator==(const PrecisionSection&) const = default;
};

struct BatchSection {
  int64_t micro = 4, accumulation = 1, replicas = 1;
  // 0: micro*accumulation*replicas; otherwise must equal that product (DeepSpeed's train_batch_size)
  int64_t global = 0;
  bool operator==(const BatchSection&) const = default;
};

struct ParallelSection {
  // How the gradients of a step's micro-batches and replicas combine: mean
  // (the whole batch's loss) or sum (PopTorch's accumulationAndReplicationReductionType).
  std::string reduction = "mean";
  int64_t bucket_mb = 25;             // cross-process all-reduce buckets, MiB (DDP's bucket_cap_mb)
  std::string compression = "none";   // none | bf16 | topk: the cross-process gradients' wire form
  double topk_ratio = 0.01;           // topk: the fraction of each bucket sent, in (0, 1]
  int64_t timeout_s = 300;            // the longest a replica waits for its peers in a collective
  bool shard_optimizer_state = false;  // ZeRO-1 across processes: each keeps and updates its shard's state
  bool overlap = true;                 // reduce gradient buckets while the last backward pass runs
  int64_t pipeline_stages = 1;        // > 1: the model cut into this many stages (train/pipeline.h)
  int64_t tensor_parallel = 1;        // > 1: Megatron tensor shards over this many devices (gpt2)
  std::string schedule = "1f1b";      // 1f1b | gpipe: the pipeline's order of micro-batches
  std::string balance = "estimated";  // estimated | measured | dynamic: what the automatic cut balances
  bool recompute = false;             // each stage's backward recomputes its forward (less memory) instead of
                                      // taking what the forward kept (NOTE [stashed activations])
  std::string vocab_parallel = "auto";  // auto | on | off: tensor shards split the vocabulary (auto: when it divides)
  bool operator==(const ParallelSection&) const = default;
};
struct TrainSection {
  int64_t steps = 1000;
  uint64_t seed = 0;
  int threads = 0;  // 0: all cores the process may use
  int64_t device_iterations = 1;
  std::string executable_cache;  // a directory for compiled programs, reused by later runs; empty: off
  bool operator==(const TrainSection&) const = default;
};

struct CheckpointSection {
  std::string dir;       // empty: <run_dir>/checkpoints
  int64_t interval = 0;  // steps; 0: none by step count (at the end, and by `minutes`)
  // NOTE [checkpoint minutes]: also a checkpoint whenever this much wall time has passed since the last
  // (or the start), so a crash, a kill or a launcher that does not wait loses at most this much work. 0: off.
  double minutes = 30;
  int64_t keep = 2;      // the newest `keep` checkpoints stay on disk
  bool operator==(const CheckpointSection&) const = default;
};

struct EvalSection {
  int64_t interval = 0;  // 0: off
  int64_t batches = 8;
  bool operator==(const EvalSection&) const = default;
};

struct LogSection {
  std::string run_dir;  // empty: runs/<name>
  int64_t interval = 10;
  std::string progress = "auto";  // auto | bar | lines | off
  bool operator==(const LogSection&) const = default;
};

struct SampleSection {
  std::vector<std::string> prompts;
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  bool operator==(const SampleSection&) const = default;
};

struct TrainConfig {
  std::string name = "run";
  ModelSection model = {};
  DataSection data = {};
  OptimizerSection optimizer = {};
  ScheduleSection schedule = {};
  PrecisionSection precision = {};
  BatchSection batch = {};
  ParallelSection parallel = {};
  TrainSection train = {};
  CheckpointSection checkpoint = {};
  EvalSection eval = {};
  LogSection log = {};
  SampleSection sample = {};

  // Every value in range, every choice known, and the keys consistent with
  // each other (batch.global, precision.partials, heads dividing d_model, ...).
  // An error's subject is the key path ("optimizer.lr"); it says what was
  // expected and what was found. Keys that need files (data.train,
  // model.from) are checked by whoever opens them, not here.
  [[nodiscard]] Status validate() const;
  int64_t global_batch() const;  // micro * accumulation * replicas
  bool operator==(const TrainConfig&) const = default;
};

// The job's mesh: batch.replicas x parallel.pipeline_stages x parallel.tensor_parallel (parallel/mesh.h).
parallel::MeshShape mesh_shape(const TrainConfig& config);

// config.model.attention as DeepSpeed's sparsity config for `n_head` heads (random blocks seeded by `seed`);
// nullopt when it is empty. InvalidArgument naming "model.attention.<key>", what was expected and what was
// found, for an unknown key, a value of the wrong kind or a config DeepSpeed would reject.
// `encoder`: the model attends both ways (BERT): the layouts are bidirectional, and a unidirectional one is
// refused; else unidirectional unless model.attention.attention says otherwise.
Result<std::optional<kernels::SparsityConfig>> sparse_attention(const ModelSection& model, int64_t n_head,
                                                                 uint64_t seed, bool encoder = false);

// Parses and validates a config. `origin` names the text in errors (the file
// path). Empty text (or only comments) gives the defaults.
Result<TrainConfig> parse_train_config(std::string_view yaml_text, const std::string& origin);
// Reads `path` and parses it; NotFound / IoError name the path.
Result<TrainConfig> load_train_config(const std::string& path);

// Applies one "key.path=value" assignment (the value is YAML: "1e-3",
// "[a, b]", "{n_layer: 2}" for a whole section) with the same checks as the
// file: known key, type, range, choice. Keys that must agree with others
// (batch.global, ...) are checked by validate(), which the caller runs after
// the last override. On error `c` is unchanged.
[[nodiscard]] Status apply_override(TrainConfig& c, std::string_view assignment);

// The config as YAML with every key, in the order of the structs above.
std::string to_yaml(const TrainConfig& c);

// Every key with its value as YAML text, in the same order: {"train.seed", "1"}.
std::vector<std::pair<std::string, std::string>> config_entries(const TrainConfig& c);

// The step's options (train/training_options.h) the config describes: the optimizer, the schedule over
// train.steps, clipping, loss scaling, the reduction, the pipeline and the data-parallel exchange. The one
// binding of the config's keys to what the runner reads (the CLI's flags are overrides of these keys).
Result<TrainingOptions> training_options(const TrainConfig& c);

}  // namespace aspen::train
