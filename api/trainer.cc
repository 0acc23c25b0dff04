#include "api/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "api/run_profile.h"
#include "api/trainer_feed.h"
#include "api/trainer_live.h"
#include "compiler/memory_profile.h"
#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/thread_team.h"
#include "io/tokenizer.h"
#include "kernels/matmul_choice.h"
#include "models/blocks.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/init.h"
#include "models/onnx_import.h"
#include "models/weights.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/job.h"
#include "runtime/run_facts.h"
#include "train/checkpoint.h"
#include "train/report.h"

namespace aspen::api {

namespace fs = std::filesystem;

namespace {

Status config_error(const std::string& key, const std::string& expected, const std::string& found) {
  return Status::invalid_argument("config: " + key, expected, found);
}

Result<DType> dtype_of(const std::string& key, const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  return config_error(key, "f32, bf16 or f16", "'" + name + "'");
}

std::string lr_text(double lr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "lr %.2e", lr);
  return buf;
}

// data.max_predictions as the MLM head's rows per example (0: every position).
int64_t mlm_predictions(const train::TrainConfig& c) {
  if (c.data.max_predictions == 0) return models::default_mlm_predictions(c.data.seq, c.data.mlm_probability);
  return c.data.max_predictions >= c.data.seq ? 0 : c.data.max_predictions;
}

// The forward graph of `mc` for [batch.micro, data.seq] with a loss (one tensor-parallel shard's when tp > 1),
// with packed documents (data.packing) and a sparse layout (model.attention) as the config asks.
Status build_forward(graph::Graph& g, const models::ModelConfig& mc, const train::TrainConfig& c, int64_t tp = 1,
                     bool vocab_parallel = false) {
  graph::Builder b(g);
  ASPEN_ASSIGN_OR_RETURN(const std::optional<kernels::BlockLayout> layout,
                         models::model_layout(mc, c.data.seq, "model.attention"));
  if (const models::BertConfig* bert = mc.bert())  // masked language modelling (NOTE [bert fine-tuning])
    return models::build_bert(b, *bert,
                              {.batch = c.batch.micro,
                               .seq = c.data.seq,
                               .mlm_head = true,
                               .with_loss = true,
                               .mlm_predictions = mlm_predictions(c),
                               .layout = layout ? &*layout : nullptr,
                               .attention_dropout = c.model.attention_dropout})
        .status();
  const models::CausalLmOptions o{.batch = c.batch.micro,
                                  .seq = c.data.seq,
                                  .with_loss = true,
                                  .segments = c.data.packing,
                                  .layout = layout ? &*layout : nullptr,
                                  .tensor_parallel = tp,
                                  .vocab_parallel = vocab_parallel,
                                  .attention_dropout = c.model.attention_dropout};
  return models::build_causal_lm(b, mc, o);
}

// NOTE [bert fine-tuning]: a BERT from model.from trains as BertForMaskedLM does under Hugging Face's
// run_mlm.py: rows are windows of the token stream ([CLS] doc [SEP] per document, train/data.h), masked by the
// feed (NOTE [masked lm] in trainer_feed.cc), the loss the MLM head's cross-entropy over the masked tokens.
// A checkpoint without the head (BertModel, e.g. a sentence-transformers model) gets a fresh one, as
// transformers' from_pretrained initializes it (the decoder is the word embeddings in either case). For
// documents longer than the checkpoint's positions, model.max_positions grows the position embeddings by
// copying (Longformer's recipe: row i takes learned row i mod max_position_embeddings); a sparse layout
// (model.attention, bidirectional) keeps the attention at sequence 4096 within reach of a CPU.
// Not yet: tensor shards and pipeline stages (the BERT graph has no split), packed documents (no
// block-diagonal bidirectional mask here), samples (no generation for an encoder): refused by name.
//
// Reads the checkpoint's weights for training `mc` (updated: the grown positions) and says on `log` what was
// initialized fresh.
Status load_bert_for_mlm(const models::Checkpoint& ckpt, const train::TrainConfig& c, models::ModelConfig& mc,
                         std::map<std::string, Tensor>& weights, std::ostream& log) {
  const std::string from = "model.from " + c.model.from;
  if (c.parallel.tensor_parallel != 1)
    return config_error("parallel.tensor_parallel", "1 for a BERT (" + from + ": its layers have no split yet)",
                        std::to_string(c.parallel.tensor_parallel));
  if (c.parallel.pipeline_stages != 1)
    return config_error("parallel.pipeline_stages", "1 for a BERT (" + from + ": its layers have no stages yet)",
                        std::to_string(c.parallel.pipeline_stages));
  if (c.data.packing)
    return config_error("data.packing", "false for a BERT (" + from + ": masked rows are windows of the stream)",
                        "true");
  if (!c.sample.prompts.empty())
    return config_error("sample.prompts", "none for a BERT (" + from + ": an encoder generates no text)",
                        "a list of " + std::to_string(c.sample.prompts.size()));
  models::BertConfig bert = *mc.bert();
  const int64_t learned = bert.max_positions;
  if (c.model.max_positions != 0 && c.model.max_positions < learned)
    return config_error("model.max_positions",
                        "0 or at least the checkpoint's max_position_embeddings (" + std::to_string(learned) + ")",
                        std::to_string(c.model.max_positions));
  if (c.model.max_positions > models::kMaxPositions)
    return config_error("model.max_positions", "at most " + std::to_string(models::kMaxPositions),
                        std::to_string(c.model.max_positions));
  const int64_t positions = std::max(learned, c.model.max_positions);
  if (c.data.seq > positions)
    return Status::invalid_argument(
        "config: data.seq", "at most the model's positions (" + from + ": max_position_embeddings " +
                                std::to_string(learned) + (positions > learned ? ", grown to " + std::to_string(positions) : "") + ")",
        std::to_string(c.data.seq),
        "model.max_positions: " + std::to_string(c.data.seq) + " grows them by copying the learned ones");

  // The checkpoint's own shapes first (its positions; the head if it has one), then what training adds.
  const bool has_head = ckpt.find("cls.predictions.bias").second != nullptr;
  graph::Graph load;
  graph::Builder lb(load);
  ASPEN_RETURN_IF_ERROR(models::build_bert(lb, bert, {.batch = 1, .seq = 1, .mlm_head = has_head}).status());
  ASPEN_ASSIGN_OR_RETURN(weights, models::read_weights(load, ckpt));
  bert.max_positions = positions;
  mc.family = bert;
  if (!has_head) {
    graph::Graph fresh;
    graph::Builder fb(fresh);
    ASPEN_RETURN_IF_ERROR(models::build_bert(fb, bert, {.batch = 1, .seq = 1, .mlm_head = true}).status());
    ASPEN_ASSIGN_OR_RETURN(auto init, models::init_weights(fresh, {.seed = c.train.seed, .std = c.model.init_std}));
    std::string names;
    for (auto& [name, t] : init)
      if (!weights.count(name)) {
        names += (names.empty() ? "" : ", ") + name;
        weights.emplace(name, std::move(t));
      }
    log << c.model.from << " has no masked-LM head: initialized " << names << " (normal std " << c.model.init_std
        << ", LayerNorm ones, biases zeros)\n";
  }
  if (positions > learned) {
    const std::string name = "embeddings.position_embeddings.weight";
    const Tensor& old = weights.at(name);
    Result<Tensor> made = Tensor::make(old.dtype(), Shape{positions, bert.d_model});
    if (!made.is_ok())
      return config_error("model.max_positions", "position embeddings that fit in memory (" +
                                                     std::to_string(positions) + " x " + std::to_string(bert.d_model) +
                                                     " floats: " + made.status().expected() + ")",
                          std::to_string(c.model.max_positions));
    Tensor grown = std::move(made).value();
    const size_t row = size_t(bert.d_model) * dtype_size(old.dtype());
    for (int64_t i = 0; i < positions; ++i)
      std::memcpy(static_cast<char*>(grown.raw()) + size_t(i) * row,
                  static_cast<const char*>(old.raw()) + size_t(i % learned) * row, row);
    weights.insert_or_assign(name, std::move(grown));
    log << "position embeddings grown from " << learned << " to " << positions
        << " rows (copies of the learned ones: model.max_positions)\n";
  }
  return Status::ok();
}

// model.attention, when given, becomes the model's sparse layout (NOTE [model layouts] in models/config.cc:
// the export keeps it); else a model.from directory's own stays (a dense model stays dense).
Status apply_sparse_attention(models::ModelConfig& mc, const train::TrainConfig& c) {
  ASPEN_ASSIGN_OR_RETURN(const std::optional<kernels::SparsityConfig> sparse,
                         train::sparse_attention(c.model, mc.n_head(), c.train.seed, /*encoder=*/mc.bert() != nullptr));
  if (sparse) mc.sparse_attention = *sparse;
  return Status::ok();
}

// Before a graph is built: the weights, their gradients and the optimizer's
// state (AdamW and LAMB: two moments; SGD: momentum) must fit in memory.
// `model_devices` is how many processes share the model (stages x shards
// when the model spans processes, else 1) and `local` the replicas in this
// process: each holds the whole f32 weights once (loaded, then copied out),
// its share of weights, gradients and state, and a gradient per extra replica.
Status check_training_memory(const models::ModelConfig& mc, const train::TrainConfig& c, int64_t model_devices,
                             int64_t local) {
  const double state = c.optimizer.name == "sgd" ? 12.0 : 16.0;  // f32 weight + gradient + optimizer state
  const double per = (model_devices > 1 ? 4.0 + state / double(model_devices) : state) + 4.0 * double(local - 1);
  return models::check_fits_memory("config: model", models::min_parameter_count(mc), per,
                                   "training (f32 weights, gradients and " + c.optimizer.name + " state)");
}


}  // namespace

Trainer::~Trainer() = default;

namespace {

// The digest of weights so far (`crc`) with one more, by its name and bytes: what processes compare to be sure
// they start from the same bits.
uint32_t digest_add(uint32_t crc, const std::string& name, const Tensor& t) {
  crc = crc32c(name, crc);
  return crc32c(std::string_view(static_cast<const char*>(t.raw()), t.nbytes()), crc);
}

std::string weights_digest(const std::map<std::string, Tensor>& weights) {
  uint32_t crc = 0;
  for (const auto& [name, t] : weights) crc = digest_add(crc, name, t);
  return crc32c_hex(crc);
}

}  // namespace

Status Trainer::claim_directories() {
  ASPEN_ASSIGN_OR_RETURN(ClaimedDirectories claimed,
                         claim_run_directories(run_dir_, checkpoint_dir_, options_.run_lock,
                                               options_.resume || !options_.resume_from.empty(), options_.overwrite));
  run_lock_ = std::move(claimed.run_lock);
  checkpoint_lock_ = std::move(claimed.checkpoint_lock);
  replace_ = std::move(claimed.earlier_run);  // deleted at the end of create(), once the new run is known to start
  return Status::ok();
}

std::ostream& Trainer::out() const {
  static thread_local std::ostream quiet(nullptr);  // processes other than 0 print nothing
  if (!writer_) return quiet;
  return options_.out ? *options_.out : std::cerr;
}

Result<std::unique_ptr<Trainer>> Trainer::create(const train::TrainConfig& config, const TrainerOptions& options) {
  ASPEN_RETURN_IF_ERROR(config.validate());
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->options_ = options;
  const train::TrainConfig& c = t->config_;
  const int64_t iters = c.train.device_iterations;
  if (c.train.steps % iters != 0)
    return config_error("train.steps", "a multiple of train.device_iterations (" + std::to_string(iters) + ")",
                        std::to_string(c.train.steps));
  if (c.checkpoint.interval % iters != 0)
    return config_error("checkpoint.interval", "a multiple of train.device_iterations (" + std::to_string(iters) + ")",
                        std::to_string(c.checkpoint.interval));
  if (c.eval.interval % iters != 0)
    return config_error("eval.interval", "a multiple of train.device_iterations (" + std::to_string(iters) + ")",
                        std::to_string(c.eval.interval));
  int processes = 1, process = 0;
  if (options.mpi) {
    ASPEN_RETURN_IF_ERROR(parallel::job::init("training under MPI"));
    processes = parallel::job::size();
    process = parallel::job::rank();
  }
  // Each process holds whole replicas, or the model spans processes: one stage or tensor shard each
  // (parallel::place, the job's one layout).
  ASPEN_ASSIGN_OR_RETURN(const parallel::Placement placement,
                         parallel::place(train::mesh_shape(c), int(processes), "config: batch.replicas"));
  const bool across = placement.across;
  const int64_t model_devices = placement.model_devices(), local = placement.local_replicas();
  if (options.mpi) {
    ASPEN_ASSIGN_OR_RETURN(t->world_, parallel::job::world("training under MPI"));
    std::vector<std::pair<std::string, std::string>> keys;
    for (auto& [k, v] : train::config_entries(c))  // only process 0 writes and prints; threads do not change results
      if (k.rfind("log.", 0) != 0 && k != "checkpoint.dir" && k != "train.threads" && k != "train.executable_cache")
        keys.emplace_back(k, v);
    ASPEN_RETURN_IF_ERROR(parallel::check_same_fields(*t->world_, keys, "config key"));
  }
  t->writer_ = process == 0;
  t->across_ = across;
  if (c.data.train.empty())
    return config_error("data.train",
                        c.model.is_onnx() ? "token shards (aspen prepare-data --output DIR), an .npz file or a "
                                            "directory of .npy files"
                                          : "a token-shard directory (aspen prepare-data --output DIR)",
                        "nothing");

  t->run_dir_ = c.log.run_dir.empty() ? "runs/" + c.name : c.log.run_dir;
  t->checkpoint_dir_ = c.checkpoint.dir.empty() ? t->run_dir_ + "/checkpoints" : c.checkpoint.dir;
  if (t->writer_) {
    const Status claimed = t->claim_directories();
    if (t->world_) {  // the others learn of a refusal here rather than waiting for process 0 in a collective
      float ok = claimed.is_ok() ? 1.0f : 0.0f;
      ASPEN_RETURN_IF_ERROR(t->world_->broadcast(&ok, 1, DType::f32, 0));
    }
    ASPEN_RETURN_IF_ERROR(claimed);
  } else if (t->world_) {
    float ok = 0.0f;
    ASPEN_RETURN_IF_ERROR(t->world_->broadcast(&ok, 1, DType::f32, 0));
    if (ok != 1.0f)
      return Status::error(Code::kFailedPrecondition, "run directory '" + t->run_dir_ + "'",
                           "claimed by process 0", "a refusal (process 0 printed why)");
  }

  // Data: a loader per local replica, and the validation split.
  t->batch_ = c.batch.micro;
  t->seq_ = c.data.seq;
  train::DataLoaderOptions lo;
  lo.seq = c.data.seq;
  lo.micro_batch = c.batch.micro;
  lo.accumulation = c.batch.accumulation;
  lo.val_fraction = c.data.val_fraction;
  lo.seed = c.train.seed;
  lo.replicas = c.batch.replicas;
  std::vector<int64_t> replicas;
  for (int64_t l = 0; l < local; ++l) replicas.push_back(placement.replica(int(process), int(l)));
  if (std::error_code ec; !c.model.is_onnx() && fs::exists(c.data.train, ec) &&
                          !fs::exists(fs::path(c.data.train) / "index.json", ec))
    return Status::invalid_argument("config: data.train '" + c.data.train + "'",
                                    "a token-shard directory (index.json) for a language model of the built-in families",
                                    fs::is_directory(c.data.train, ec) ? "a directory without index.json" : "a file",
                                    "arrays (.npz, .npy) train a user's own ONNX model (model.from: model.onnx); "
                                    "aspen prepare-data writes token shards");
  Result<TrainFeed> feed = TrainFeed::open(c.data.train, lo, replicas, c.model.is_onnx());
  if (t->world_) {  // every process learns whether each opened the same data (none waits for one that failed)
    std::vector<std::pair<std::string, std::string>> data;
    if (!feed.is_ok()) {
      data = {{"data.train", "unreadable here: " + feed.status().message()}};
    } else if (feed->tokens()) {
      const train::TokenIndex& index = feed->token_index();
      data = {{"vocab_size", std::to_string(index.vocab_size)},
              {"total_tokens", std::to_string(index.total_tokens)},
              {"tokenizer_hash", index.tokenizer_hash}};
      for (const train::ShardInfo& s : index.shards) data.emplace_back("shard " + s.name, std::to_string(s.tokens));
    } else {
      data = {{"arrays", feed->arrays().describe()}, {"crc32c", weights_digest(feed->arrays().columns())}};
    }
    ASPEN_RETURN_IF_ERROR(parallel::check_same_fields(*t->world_, data, "training data (data.train)"));
  }
  ASPEN_RETURN_IF_ERROR(feed.status());
  t->feed_ = std::make_unique<TrainFeed>(std::move(feed).value());
  const train::TokenIndex no_index;
  const train::TokenIndex& index = t->feed_->tokens() ? t->feed_->token_index() : no_index;
  if (c.data.packing) t->feed_->set_packing(index.eos_id);  // config validation: token shards of a built-in family
  if (c.model.attention_dropout > 0) t->feed_->set_dropout_seed(c.train.seed);

  // The model: a user's ONNX file, a Hugging Face directory, or a fresh one.
  graph::Graph forward;
  std::map<std::string, Tensor> weights;
  // NOTE [fine-tuning loads in place]: a causal LM from model.from is bound here and read after the model is
  // made, each tensor straight into its parameter (models::load_weights), never the whole model on the host
  // beside the training state.
  std::optional<models::Checkpoint> from;
  std::optional<models::WeightPlan> plan;
  std::map<std::string, std::string> columns = {
      {"input_ids", "tokens"}, {"positions", "positions"}, {"targets", "targets"}};  // the built-in families' inputs
  if (c.model.is_onnx()) {
    ASPEN_ASSIGN_OR_RETURN(models::OnnxImport m, import_for_training(c, *t->feed_, columns));
    // A file's training Dropout draws from a seed the feed gives each micro-batch (NOTE [training dropout]).
    if (m.graph.find_input(models::kDropoutSeedInput)) {
      t->feed_->set_dropout_seed(c.train.seed);
      columns[models::kDropoutSeedInput] = models::kDropoutSeedInput;
    }
    t->onnx_parameters_ = m.parameter_types();
    forward = std::move(m.graph);
    weights = std::move(m.weights);
  } else if (!c.model.from.empty()) {
    ASPEN_ASSIGN_OR_RETURN(from, models::Checkpoint::open(c.model.from));
    const models::Checkpoint& ckpt = *from;
    t->model_config_ = ckpt.config();
    // Token ids the model has no embedding for would fail inside a kernel at step 1.
    if (const int64_t vocab = t->model_config_.vocab(); vocab > 0 && index.vocab_size > vocab)
      return Status::invalid_argument(
          "data.train '" + c.data.train + "'",
          "token ids the model knows (model.from " + c.model.from + " has a vocabulary of " + std::to_string(vocab) +
              " tokens)",
          "token shards of a " + std::to_string(index.vocab_size) + "-token vocabulary (tokenized with " +
              (index.tokenizer_dir.empty() ? std::string("another tokenizer") : index.tokenizer_dir) + ")",
          "prepare the data with the model's own tokenizer: aspen prepare-data --tokenizer " + c.model.from +
              " --input FILE --output DIR");
    ASPEN_RETURN_IF_ERROR(check_training_memory(t->model_config_, c, across ? model_devices : 1, local));
    ASPEN_RETURN_IF_ERROR(apply_sparse_attention(t->model_config_, c));
    if (t->model_config_.bert()) {
      ASPEN_RETURN_IF_ERROR(load_bert_for_mlm(ckpt, c, t->model_config_, weights, t->out()));
      ASPEN_RETURN_IF_ERROR(build_forward(forward, t->model_config_, c));
    } else {
      if (c.model.max_positions != 0)
        return config_error("model.max_positions", "0 for a causal LM (it grows a BERT's learned positions)",
                            std::to_string(c.model.max_positions));
      ASPEN_RETURN_IF_ERROR(build_forward(forward, t->model_config_, c));
      ASPEN_ASSIGN_OR_RETURN(plan, models::plan_weights(forward, ckpt));  // every parameter bound, or an error now
    }
  } else {
    const int64_t vocab = c.model.vocab > 0 ? c.model.vocab : index.vocab_size;
    if (vocab < index.vocab_size)
      return config_error("model.vocab", ">= the data's vocabulary (" + std::to_string(index.vocab_size) + ")",
                          std::to_string(vocab));
    models::ModelConfig mc;
    mc.model_type = c.model.family;
    if (c.model.family == "gpt2") {
      mc.family = models::Gpt2Config{.vocab = vocab, .n_positions = c.model.n_positions, .d_model = c.model.d_model,
                                     .n_layer = c.model.n_layer, .n_head = c.model.n_head, .d_ff = c.model.d_ff};
    } else if (c.model.family == "llama") {
      // HF's SwiGLU width for a model without one: 2/3 of 4 d_model, rounded up to a multiple of 8
      const int64_t d_ff = c.model.d_ff > 0 ? c.model.d_ff : (8 * c.model.d_model / 3 + 7) / 8 * 8;
      mc.family = models::LlamaConfig{.vocab = vocab, .n_positions = c.model.n_positions, .d_model = c.model.d_model,
                                      .n_layer = c.model.n_layer, .n_head = c.model.n_head,
                                      .n_kv_head = c.model.n_kv_head, .d_ff = d_ff};
    } else {
      const int64_t head_dim = c.model.d_model / c.model.n_head;
      mc.family = models::GptjConfig{.vocab = vocab, .n_positions = c.model.n_positions, .d_model = c.model.d_model,
                                     .n_layer = c.model.n_layer, .n_head = c.model.n_head,
                                     .rotary_dim = c.model.rotary_dim > 0 ? c.model.rotary_dim : head_dim,
                                     .d_ff = c.model.d_ff};
    }
    mc.bos_token_id = index.eos_id;
    mc.eos_token_ids = {index.eos_id};
    ASPEN_RETURN_IF_ERROR(apply_sparse_attention(mc, c));
    t->model_config_ = mc;
    ASPEN_RETURN_IF_ERROR(std::visit([](const auto& f) { return f.validate(); }, mc.family).with_context("config: model"));
    ASPEN_RETURN_IF_ERROR(check_training_memory(t->model_config_, c, across ? model_devices : 1, local));
    ASPEN_RETURN_IF_ERROR(build_forward(forward, t->model_config_, c));
    ASPEN_ASSIGN_OR_RETURN(weights, models::init_weights(forward, {.seed = c.train.seed,
                                                                   .std = c.model.init_std,
                                                                   .n_layer = c.model.n_layer,
                                                                   .scaled_residual = c.model.family == "gpt2"}));
  }
  if (c.parallel.tensor_parallel > 1) {  // the weights above are whole; the program is one shard's
    forward = graph::Graph();
    // The vocabulary split too (parallel.vocab_parallel): "auto" when it divides.
    const int64_t vocab = t->model_config_.vocab();
    const bool vp = c.parallel.vocab_parallel == "on" ||
                    (c.parallel.vocab_parallel == "auto" && vocab > 0 && vocab % c.parallel.tensor_parallel == 0);
    ASPEN_RETURN_IF_ERROR(
        build_forward(forward, t->model_config_, c, c.parallel.tensor_parallel, vp));
  }
  t->tokenizer_dir_ = !c.data.tokenizer.empty()                    ? c.data.tokenizer
                      : !c.model.from.empty() && !c.model.is_onnx() ? c.model.from
                                                                    : index.tokenizer_dir;
  // Shards tokenized by another tokenizer than the model's train without a word otherwise (BERT on GPT-2's
  // BPE ids, GPT-2 on WordPiece ids): the index records the fingerprint of the tokenizer that made them.
  if (t->feed_->tokens() && !c.model.is_onnx() && !index.tokenizer_hash.empty() && !t->tokenizer_dir_.empty()) {
    Result<std::string> ours = train::tokenizer_fingerprint(t->tokenizer_dir_);
    if (ours.is_ok() && *ours != index.tokenizer_hash)
      return Status::invalid_argument(
          "data.train '" + c.data.train + "'",
          "token shards made with the model's tokenizer (" + t->tokenizer_dir_ + ", fingerprint " + *ours + ")",
          "shards made with " + (index.tokenizer_dir.empty() ? std::string("another tokenizer") : index.tokenizer_dir) +
              " (fingerprint " + index.tokenizer_hash + ")",
          "prepare the data with the model's tokenizer: aspen prepare-data --tokenizer " + t->tokenizer_dir_ +
              " --input FILE --output DIR (or set data.tokenizer to the one that made them)");
  }
  if (t->model_config_.bert()) {  // masked language modelling: [MASK] and the special tokens from the tokenizer
    Result<std::unique_ptr<io::Tokenizer>> tok = io::load_tokenizer(t->tokenizer_dir_);
    if (!tok.is_ok())
      return tok.status().with_context("the tokenizer of the BERT to train (data.tokenizer, else model.from)");
    const io::SpecialTokenIds& special = (*tok)->special_ids();
    if (!special.mask)
      return Status::invalid_argument("tokenizer " + t->tokenizer_dir_, "a [MASK] token (masked language modelling)",
                                      "none");
    TrainFeed::MaskedLm mlm{.probability = c.data.mlm_probability,
                            .mask_id = *special.mask,
                            .vocab = t->model_config_.vocab(),
                            .special = {},
                            .seed = c.train.seed,
                            .predictions = mlm_predictions(c)};
    for (const std::optional<io::TokenId>& id : {special.cls, special.sep, special.pad, special.mask, special.unk})
      if (id) mlm.special.push_back(*id);
    t->feed_->set_masked_lm(std::move(mlm));
    columns = {{"input_ids", "tokens"}, {"token_type_ids", "token_types"}, {"attention_mask", "mask"},
               {"targets", "targets"}};
  }
  ASPEN_RETURN_IF_ERROR(
      t->feed_->bind(forward, columns, "config: model.inputs",
                     c.model.is_onnx() ? std::map<std::string, std::string>{{"targets", "config: model.targets"}}
                                       : std::map<std::string, std::string>{}));

  // The programs.
  Options o;
  o.device_iterations(iters).gradient_accumulation(c.batch.accumulation).output_mode(OutputMode::all);
  ASPEN_ASSIGN_OR_RETURN(const DType compute, dtype_of("precision.compute", c.precision.compute));
  ASPEN_ASSIGN_OR_RETURN(const DType partials, dtype_of("precision.partials", c.precision.partials));
  o.precision(compute, partials).threads(c.train.threads).random_seed(c.train.seed);
  o.replication_factor(local).mpi(options.mpi).tensor_parallel(c.parallel.tensor_parallel).model_across_processes(across);
  if (c.train.threads == 0 && options.mpi) {
    // Processes of one machine share its cores.
    const int on_node = parallel::job::local_size();
    const int devices = placement.process_devices();
    o.threads(std::max(1, CoreBudget::global().available() / on_node / devices));
  }
  ASPEN_ASSIGN_OR_RETURN(const TrainingOptions to, train::training_options(c));
  if (!c.train.executable_cache.empty()) o.executable_cache(c.train.executable_cache);
  if (options.resume || !options.resume_from.empty()) {
    // NOTE [matmul choice]: a resumed run runs the kernels the run it continues ran, whatever this machine's
    // cache holds (or a fresh one measured): the checkpoint's choices replace the remembered ones first.
    ASPEN_ASSIGN_OR_RETURN(train::Checkpoint ck, t->load_resume_checkpoint());
    std::string choices;
    try {
      const nlohmann::json j = nlohmann::json::parse(ck.trainer_json);
      if (j.contains("matmul_choices")) choices = j.at("matmul_choices").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      return Status::error(Code::kCorrupt, t->resume_from() + ": trainer.json", "the trainer state", e.what());
    }
    if (!choices.empty()) {
      Result<bool> adopted = kernels::adopt_matmul_choices(choices, "the checkpoint " + t->resume_from());
      if (!adopted.is_ok()) return Status::error(Code::kCorrupt, t->resume_from() + ": trainer.json: matmul_choices",
                                                 adopted.status().expected(), adopted.status().found());
    }
    t->resume_ = std::move(ck);
  }
  if (!options.profile.empty()) {
    if (options.profile_steps < 1)
      return Status::invalid_argument("profile_steps", "1 or more steps to record",
                                      std::to_string(options.profile_steps));
    if (options.profile_every < 1)
      return Status::invalid_argument("profile_every", "1 or more (record every N-th step)",
                                      std::to_string(options.profile_every));
    ASPEN_RETURN_IF_ERROR(profile::make_profile_dir(options.profile));
    t->trace_ = std::make_unique<profile::TraceRecorder>(/*enabled=*/false);  // on for the recorded steps
    o.trace_recorder(t->trace_.get());
  }
  kernels::clear_matmul_choices_used();  // from here, the run's own
  const auto compile_start = std::chrono::steady_clock::now();
  ASPEN_ASSIGN_OR_RETURN(t->model_, TrainingModel::create(forward, o, to));
  t->compile_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - compile_start).count();
  t->cache_hit_ = t->model_->cache_hit();
  t->cache_stored_ = t->model_->cache_stored();
  t->kernel_choices_ = kernels::matmul_choice() == kernels::MatmulChoice::rule
                           ? "the fixed rule (--kernel-choice rule)"
                           : kernels::matmul_choices_used_summary();
  std::string digest;  // of the initial weights: every process starts from the same bits
  if (plan) {  // NOTE [fine-tuning loads in place]
    uint32_t crc = 0;
    ASPEN_RETURN_IF_ERROR(models::load_weights(*plan, [&](const std::string& name, const Tensor& tensor) {
      crc = digest_add(crc, name, tensor);
      return t->model_->copy_weights_to_device({{name, &tensor}});
    }));
    digest = crc32c_hex(crc);
  } else {
    digest = weights_digest(weights);
    std::map<std::string, const Tensor*> w;
    for (const auto& [name, tensor] : weights) w.emplace(name, &tensor);
    ASPEN_RETURN_IF_ERROR(t->model_->copy_weights_to_device(w));
    weights.clear();
  }
  if (t->world_)  // the same seed, or the same model.from files
    ASPEN_RETURN_IF_ERROR(parallel::check_same_fields(*t->world_, {{"crc32c", digest}}, "initial weights"));

  if (t->writer_ && !t->replace_.empty()) {
    t->out() << "replacing the earlier run in " << t->run_dir_ << " (" << t->replace_ << ")\n";
    ASPEN_RETURN_IF_ERROR(remove_earlier_run(t->run_dir_, t->checkpoint_dir_));
  }
  if (t->writer_) ASPEN_RETURN_IF_ERROR(write_file_atomic(t->run_dir_ + "/config.yaml", train::to_yaml(c)));
  if (t->resume_) ASPEN_RETURN_IF_ERROR(t->restore());
  return t;
}

bool Trainer::tokens() const { return feed_->tokens(); }

std::string Trainer::trainer_json() const {
  nlohmann::json j;
  j["step"] = model_->steps_done();
  j["seed"] = config_.train.seed;
  const train::Position p = feed_->position();
  // examples_in_epoch: the whole job's, so that another layout (replicas,
  // micro-batch) can resume at the same place.
  j["data_position"] = {{"epoch", p.epoch},
                        {"step_in_epoch", p.step_in_epoch},
                        {"examples_in_epoch", p.step_in_epoch * config_.batch.micro * config_.batch.replicas}};
  const train::LossScaler::State s = model_->loss_scaler().state();
  j["loss_scaler"] = {{"scale", s.scale},
                      {"good_steps", s.good_steps},
                      {"hysteresis_left", s.hysteresis_left},
                      {"skipped", s.skipped}};
  j["config"] = train::to_yaml(config_);
  // The kernels this run's products ran on (NOTE [matmul choice]): a resumed run takes the same.
  j["matmul_choices"] = kernels::matmul_choice() == kernels::MatmulChoice::rule ? std::string()
                                                                                : kernels::matmul_choices_used_text();
  return j.dump();
}

Status Trainer::save() {
  if (!model_) return Status::error(Code::kFailedPrecondition, "Trainer", "a trainer that has not run", "one that finished");
  if (!writer_) {  // every process holds the same weights: process 0 writes them
    // The gathering is collective with the model across processes, and for
    // the optimizer state with ZeRO-1.
    if (model_->model_across_processes()) ASPEN_RETURN_IF_ERROR(model_->copy_weights_to_host().status());
    if (model_->optimizer_state_sharded() || model_->model_across_processes())
      return model_->copy_optimizer_state_to_host().status();
    return Status();
  }
  train::Checkpoint ck;
  ASPEN_ASSIGN_OR_RETURN(ck.weights, model_->copy_weights_to_host());
  ASPEN_ASSIGN_OR_RETURN(ck.optimizer, model_->copy_optimizer_state_to_host());
  ck.trainer_json = trainer_json();
  ck.step = model_->steps_done();
  return train::save_checkpoint(checkpoint_dir_, ck, config_.checkpoint.keep);
}

std::string Trainer::resume_from() const {
  return options_.resume_from.empty() ? checkpoint_dir_ : options_.resume_from;
}

Result<train::Checkpoint> Trainer::load_resume_checkpoint() const {
  const std::string from = resume_from();
  Result<train::Checkpoint> loaded = train::load_checkpoint(from);
  if (!loaded.is_ok() && loaded.status().code() == Code::kCorrupt) {
    // Never fall back silently: say which earlier checkpoint the user may choose.
    std::string earlier;
    // The root the damaged checkpoint lives in: the run's, or the one --resume-from names (or holds).
    std::string root = from;
    if (std::error_code ec; fs::exists(fs::path(from) / "trainer.json", ec)) root = fs::path(from).parent_path().string();
    if (auto steps = train::list_checkpoints(root); steps.is_ok()) {
      for (const std::string& s : *steps) {  // the newest before the damaged one
        if (loaded.status().subject().rfind(s + "/", 0) == 0) break;
        earlier = s;
      }
    }
    Status s = loaded.status();
    if (!earlier.empty())
      return Status::error(s.code(), s.subject(), s.expected(), s.found(),
                           "the checkpoint is damaged; to resume from the one before it: --resume-from " + earlier);
    return s;
  }
  return loaded;
}

Status Trainer::restore() {
  const std::string from = resume_from();
  train::Checkpoint ck = std::move(*resume_);
  resume_.reset();
  ASPEN_RETURN_IF_ERROR(train::check_compatible(ck, model_->weight_types(), model_->optimizer_state_types(), from));
  std::map<std::string, const Tensor*> w, s;
  for (const auto& [name, t] : ck.weights) w.emplace(name, &t);
  for (const auto& [name, t] : ck.optimizer) s.emplace(name, &t);
  ASPEN_RETURN_IF_ERROR(model_->copy_weights_to_device(w));
  ASPEN_RETURN_IF_ERROR(model_->copy_optimizer_state_to_device(s));
  const std::string where = from + ": trainer.json";
  try {
    const nlohmann::json j = nlohmann::json::parse(ck.trainer_json);
    const int64_t step = j.at("step").get<int64_t>();
    if (step != ck.step) return Status::error(Code::kCorrupt, where + ": step", std::to_string(ck.step), std::to_string(step));
    if (step > config_.train.steps)
      return Status::invalid_argument("resume: checkpoint step " + std::to_string(step),
                                      "at most train.steps (" + std::to_string(config_.train.steps) + ")",
                                      "a later step");
    if (step % config_.train.device_iterations != 0)
      return Status::invalid_argument("resume: checkpoint step " + std::to_string(step),
                                      "a multiple of train.device_iterations", std::to_string(step));
    if (const nlohmann::json& seed = j.at("seed"); !seed.is_number_unsigned() || seed.get<uint64_t>() != config_.train.seed)
      out() << "aspen: warning: " << where << ": seed " << seed.dump() << " differs from train.seed ("
            << config_.train.seed << "); from here the data order follows train.seed\n";
    train::Position p;
    p.epoch = j.at("data_position").at("epoch").get<int64_t>();
    p.step_in_epoch = j.at("data_position").at("step_in_epoch").get<int64_t>();
    if (p.epoch < 0 || p.step_in_epoch < 0)
      return Status::error(Code::kCorrupt, where + ": data_position",
                           "a non-negative epoch and step_in_epoch",
                           std::to_string(p.epoch) + " and " + std::to_string(p.step_in_epoch));
    if (j.at("data_position").contains("examples_in_epoch")) {
      const int64_t examples = j.at("data_position").at("examples_in_epoch").get<int64_t>();
      if (examples < 0)
        return Status::error(Code::kCorrupt, where + ": data_position.examples_in_epoch", "a count >= 0",
                             std::to_string(examples));
      const int64_t per = config_.batch.micro * config_.batch.replicas;  // examples per micro-batch of every replica
      if (examples % per != 0)
        return Status::invalid_argument(
            "resume: the checkpoint's data position (" + std::to_string(examples) + " examples into epoch " +
                std::to_string(p.epoch) + ")",
            "a multiple of batch.micro x batch.replicas = " + std::to_string(per), "a remainder of " +
                std::to_string(examples % per),
            "resume with a layout whose micro-batches of all replicas divide it");
      p.step_in_epoch = examples / per;
    }
    ASPEN_RETURN_IF_ERROR(feed_->restore(p));
    train::LossScaler::State s2;
    const nlohmann::json& ls = j.at("loss_scaler");
    s2.scale = ls.at("scale").get<double>();
    s2.good_steps = ls.at("good_steps").get<int64_t>();
    s2.hysteresis_left = ls.at("hysteresis_left").get<int64_t>();
    s2.skipped = ls.at("skipped").get<int64_t>();
    if (Status bad = model_->loss_scaler().check_state(s2, step); !bad.is_ok())
      return std::move(bad).with_context(where + ": loss_scaler");
    model_->loss_scaler().restore(s2);
    model_->set_steps_done(step);
    if (writer_ && j.contains("config") && j.at("config").get<std::string>() != train::to_yaml(config_))
      out() << "aspen: warning: resuming " << checkpoint_dir_ << " with a config that differs from the checkpoint's\n";
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kCorrupt, where, "the trainer state (step, data_position, loss_scaler)", e.what());
  }
  return Status();
}

Result<Trainer::Agreed> Trainer::stop_agreed(std::chrono::steady_clock::time_point last_save) {
  const double minutes = config_.checkpoint.minutes;
  float flags[2] = {options_.stop_requested && options_.stop_requested->load() ? 1.0f : 0.0f,
                    minutes > 0 && std::chrono::steady_clock::now() - last_save >=
                                       std::chrono::duration<double>(60.0 * minutes)
                        ? 1.0f
                        : 0.0f};
  // Under MPI every process stops (and saves) at the same step, or the collectives of the next would hang:
  // any process's stop or clock decides for all.
  if (world_) ASPEN_RETURN_IF_ERROR(world_->all_reduce(std::span<float>(flags, 2)));
  return Agreed{.stop = flags[0] > 0.0f, .checkpoint_due = flags[1] > 0.0f};
}

Result<double> Trainer::validate() {
  if (!model_) return Status::error(Code::kFailedPrecondition, "Trainer", "a trainer that has not run", "one that finished");
  const int64_t n = std::min(config_.eval.batches, feed_->val_steps());
  if (n < 1)
    return Status::error(Code::kFailedPrecondition, "validation", "validation examples (data.val_fraction > 0)", "none");
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    using Inputs = std::map<std::string, Tensor>;
    ASPEN_ASSIGN_OR_RETURN(const Inputs batch, feed_->val_batch(i));
    std::map<std::string, const Tensor*> inputs;
    for (const auto& [name, t] : batch) inputs.emplace(name, &t);
    ASPEN_ASSIGN_OR_RETURN(const float loss, model_->evaluate(inputs));
    sum += loss;
  }
  return sum / double(n);
}

Status Trainer::export_model(const std::string& dir) {
  ASPEN_ASSIGN_OR_RETURN(auto weights, model_->copy_weights_to_host());
  if (config_.model.is_onnx()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Status::error(Code::kIoError, dir, "a directory that can be created", ec.message());
    return models::export_onnx_weights(onnx_parameters_, config_.model.from, dir + "/model.onnx", weights);
  }
  return models::export_hf_model(dir, model_config_, weights, tokenizer_dir_);
}

Status Trainer::print_samples(const std::string& dir) {
  const train::SampleSection& s = config_.sample;
  if (s.prompts.empty()) return Status();
  ASPEN_ASSIGN_OR_RETURN(auto tok, io::load_tokenizer(dir));
  std::vector<std::vector<int32_t>> prompts;
  int64_t longest = 1;
  for (const std::string& p : s.prompts) {
    prompts.push_back((*tok).encode(p, false));
    if (prompts.back().empty()) return config_error("sample.prompts", "prompts of at least one token", "an empty prompt");
    longest = std::max<int64_t>(longest, int64_t(prompts.back().size()));
  }
  const int64_t positions = model_config_.n_positions();
  const int64_t new_tokens = std::min<int64_t>(s.max_new_tokens, positions - longest);
  if (new_tokens < 1)
    return config_error("sample.prompts", "prompts shorter than the model's positions (" + std::to_string(positions) + ")",
                        std::to_string(longest) + " tokens");
  models::GeneratorOptions go;
  go.max_batch = int64_t(prompts.size());
  go.max_prompt = longest;
  go.max_length = longest + new_tokens;
  go.threads = config_.train.threads;
  ASPEN_ASSIGN_OR_RETURN(auto gen, models::Generator::open(dir, go));
  models::SamplingOptions so;
  so.max_new_tokens = new_tokens;
  so.temperature = float(s.temperature);
  so.top_k = int32_t(s.top_k);
  so.top_p = float(s.top_p);
  so.seed = config_.train.seed;
  for (int64_t id : model_config_.eos_token_ids) so.stop_tokens.push_back(int32_t(id));
  ASPEN_ASSIGN_OR_RETURN(auto outs, gen->generate(prompts, so));
  out() << "samples (" << (s.temperature == 0.0 ? std::string("greedy") : "temperature " + std::to_string(s.temperature))
        << "):\n";
  for (size_t i = 0; i < outs.size(); ++i) {
    std::vector<int32_t> ids = outs[i];
    while (!ids.empty() && std::find(so.stop_tokens.begin(), so.stop_tokens.end(), ids.back()) != so.stop_tokens.end())
      ids.pop_back();
    out() << "  " << s.prompts[i] << "|" << (*tok).decode(ids, true) << "\n";
  }
  return Status();
}

Result<TrainResult> Trainer::run() {
  if (!model_)
    return Status::error(Code::kFailedPrecondition, "Trainer::run", "a trainer that has not run", "one that finished");
  const train::TrainConfig& c = config_;
  const int64_t iters = c.train.device_iterations, acc = c.batch.accumulation, micro = iters * acc;
  const int64_t start = model_->steps_done(), total = c.train.steps;
  const std::string metrics_path = run_dir_ + "/" + train::kMetricsFile;
  std::optional<train::MetricsLog> metrics;
  if (!writer_) {  // only process 0 writes; the others train and stay quiet
  } else if (start > 0) {
    ASPEN_ASSIGN_OR_RETURN(metrics, train::MetricsLog::resume(metrics_path, start));
    if (auto r = train::read_metric(metrics_path, "loss"); r.is_ok()) train_curve_ = *r;
    if (auto r = train::read_metric(metrics_path, "val_loss"); r.is_ok()) val_curve_ = *r;
  } else {
    ASPEN_ASSIGN_OR_RETURN(metrics, train::MetricsLog::create(metrics_path));
  }
  ASPEN_ASSIGN_OR_RETURN(train::ProgressMode mode, train::parse_progress_mode(c.log.progress));
  train::Progress progress(total, mode, out(), train::Progress::steady_seconds, start);
  const bool can_validate = feed_->val_steps() > 0;
  const bool tokens = feed_->tokens();
  if (!tokens) progress.set_rate_unit("ex/s");
  if (c.eval.interval > 0 && !can_validate)
    progress.message("note: no validation examples (data.val_fraction is 0 or the data is small); eval.interval ignored");

  TrainResult result;
  // The whole job's tokens (or examples) in one call.
  const double tokens_per_call = double(micro * feed_->units_per_micro_batch() * c.batch.replicas);
  double seconds = 0.0;
  int64_t last_saved = start > 0 ? start : -1;
  bool first = true;
  const std::string svg = run_dir_ + "/" + train::kLossSvgFile;
  const int64_t stop = options_.stop_at > 0 ? std::min(options_.stop_at, total) : total;
  // A failure between steps (data, metrics, validation): the model holds a
  // finished step, so it is saved before the error returns, where saving is
  // this process's own business (not a collective of a model across processes).
  // What a failure leaves on disk, in one phrasing for every way a run stops.
  auto kept = [&] {
    return last_saved >= 0
               ? "the checkpoint of step " + std::to_string(last_saved) + " in " + checkpoint_dir_ + " is intact"
               : std::string("no checkpoint was written");
  };
  auto stopped = [&](Status s) {
    progress.finish();
    const int64_t step = model_->steps_done();
    std::string what = kept();
    if (step != last_saved && step > 0 && writer_ && !model_->model_across_processes() &&
        !model_->optimizer_state_sharded()) {
      const Status saved = save();
      what = saved.is_ok() ? "a checkpoint of step " + std::to_string(step) + " was written to " + checkpoint_dir_
                           : "the checkpoint of step " + std::to_string(step) + " could not be written: " +
                                 saved.message() + "; " + what;
    }
    return std::move(s).with_context("training stopped at step " + std::to_string(step) + " (" + what + ")");
  };
#define ASPEN_OR_STOP(expr)                        \
  do {                                             \
    ::aspen::Status stop_status_ = (expr);         \
    if (!stop_status_.is_ok()) return stopped(std::move(stop_status_)); \
  } while (0)
  auto last_save = std::chrono::steady_clock::now();
  int64_t calls = 0;  // of the program, in this invocation
  const int64_t profile_calls = (options_.profile_steps + iters - 1) / iters;           // calls recorded
  const int64_t profile_every_calls = (options_.profile_every + iters - 1) / iters;     // one recorded in so many
  size_t moves_logged = 0, move_failures_logged = 0;  // of model_->stage_moves(), stage_move_failures()
  bool duplicates_warned = false;
  bool save_now = false;  // checkpoint.minutes have passed: a checkpoint after this step
  while (model_->steps_done() < stop) {
    Result<Agreed> agreed = stop_agreed(last_save);
    ASPEN_OR_STOP(agreed.status());
    if (agreed->stop) {
      result.interrupted = true;
      break;
    }
    save_now = agreed->checkpoint_due;
    // This process's micro-batches of one call: slot (step·acc + a)·L + l is
    // local replica l's micro-batch a (TrainingModel's order).
    Result<const std::map<std::string, Tensor>*> next = feed_->next_call(micro);
    ASPEN_OR_STOP(next.status());
    std::map<std::string, const Tensor*> inputs;
    for (const auto& [name, t] : **next) inputs.emplace(name, &t);
    if (trace_)  // options_.profile: profile_steps steps, every profile_every-th, from this invocation's second call
      trace_->set_enabled(calls >= 1 && (calls - 1) % profile_every_calls == 0 &&
                          (calls - 1) / profile_every_calls < profile_calls);
    ++calls;
    const auto t0 = std::chrono::steady_clock::now();
    auto run = model_->run(inputs);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!run.is_ok()) {  // the step may be half applied: nothing is saved
      progress.finish();
      return Status(run.status()).with_context("training stopped (" + kept() + ")");
    }
    seconds += dt;
    const double rate = tokens_per_call / dt;
    Result<std::vector<std::pair<std::string, double>>> load = device_load(*model_);
    ASPEN_OR_STOP(load.status());
    Result<std::vector<std::pair<std::string, double>>> data = data_consumed(*feed_, model_->job());
    ASPEN_OR_STOP(data.status());
    if (!data->empty() && data->back().second > 0 && !duplicates_warned) {  // NOTE [data per replica]
      duplicates_warned = true;
      progress.message("aspen: warning: data: " + std::to_string(int64_t(data->back().second)) + " examples of step " +
                       std::to_string(model_->steps_done()) +
                       " were drawn by more than one replica (the data are sharded wrong); see data.* in " +
                       metrics_path);
    }
    load->insert(load->end(), data->begin(), data->end());
    for (const StepStats& s : model_->last_steps()) {
      std::vector<std::pair<std::string, double>> nums = {
          {"loss", s.loss}, {"lr", s.lr}, {"loss_scale", s.loss_scale}, {tokens ? "tokens_per_s" : "examples_per_s", rate}};
      if (&s == &model_->last_steps().back()) nums.insert(nums.end(), load->begin(), load->end());
      if (s.grad_norm >= 0) nums.emplace_back("grad_norm", s.grad_norm);
      if (s.skipped) nums.emplace_back("skipped", 1.0);
      if (metrics) ASPEN_OR_STOP(metrics->append(s.step, nums));
      train_curve_.emplace_back(s.step, s.loss);
      if (first) result.first_loss = s.loss, first = false;
      result.last_loss = s.loss;
      result.skipped_steps += s.skipped;
    }
    ASPEN_OR_STOP(log_stage_moves(*model_, moves_logged, move_failures_logged, metrics ? &*metrics : nullptr, progress));
    const StepStats& last = model_->last_steps().back();
    const int64_t step = last.step;
    if (step % c.log.interval == 0 || step == stop || step - iters < start + 1)
      progress.update(step, last.loss, rate, lr_text(last.lr));
    if (c.eval.interval > 0 && can_validate && (step % c.eval.interval == 0 || step == total)) {
      Result<double> val = validate();
      ASPEN_OR_STOP(val.status());
      const double v = *val;
      if (metrics) ASPEN_OR_STOP(metrics->append(step, {{"val_loss", v}}));
      val_curve_.emplace_back(step, v);
      result.last_val_loss = v;
      char buf[96];
      std::snprintf(buf, sizeof buf, "step %lld: val_loss %.4f", static_cast<long long>(step), v);
      progress.message(buf);
      if (writer_) ASPEN_OR_STOP(train::write_loss_svg(svg, train_curve_, val_curve_, c.name));
    }
    const bool by_steps = c.checkpoint.interval > 0 && step % c.checkpoint.interval == 0;
    if (save_now || by_steps) {
      if (Status s = save(); !s.is_ok()) {
        progress.finish();
        return std::move(s).with_context("training stopped at step " + std::to_string(step) + " (" + kept() + ")");
      }
      last_saved = step;
      last_save = std::chrono::steady_clock::now();
      progress.message("step " + std::to_string(step) + ": checkpoint saved in " + checkpoint_dir_ +
                       (by_steps ? "" : " (checkpoint.minutes)"));
    }
  }
#undef ASPEN_OR_STOP
  progress.finish();
  result.steps = model_->steps_done();
  result.tokens_per_s = seconds > 0 ? tokens_per_call * double(result.steps - start) / double(iters) / seconds : 0.0;
  // NOTE [profiles across processes]: under MPI every process's devices go into process 0's profile. Whether
  // any process records decides the gather, which every process then joins (with no events, if it records none).
  parallel::Communicator* job = model_->job();
  bool profiled = trace_ != nullptr;
  if (job && job->size() > 1) {
    float any = profiled ? 1.0f : 0.0f;
    ASPEN_RETURN_IF_ERROR(job->all_reduce(&any, 1, DType::f32, parallel::ReduceOp::sum));
    profiled = any > 0;
  }
  std::vector<profile::TraceEvent> events;
  if (profiled) {
    if (trace_) trace_->set_enabled(false);
    ASPEN_ASSIGN_OR_RETURN(events, gather_process_events(job, trace_ ? trace_->events() : std::vector<profile::TraceEvent>{},
                                                         trace_.get()));
  }
  if (trace_ && writer_) {  // (disabled above)
    const int64_t recorded_calls = calls >= 2 ? std::min(profile_calls, (calls - 2) / profile_every_calls + 1) : 0;
    const int64_t recorded = std::min<int64_t>(recorded_calls * iters, options_.profile_steps);
    profile::RunFacts run =
        runtime::run_facts("train", c.train.threads,
                  {{"config", c.name},
                   {"steps_recorded", std::to_string(recorded)},
                   {"first_step_recorded", std::to_string(recorded > 0 ? start + iters + 1 : 0)},
                   {"profile_every", std::to_string(profile_every_calls * iters)},
                   {"tokens_per_s", std::to_string(result.tokens_per_s)}});
    if (job && job->size() > 1) run.facts.emplace_back("processes", std::to_string(job->size()));
    if (c.parallel.pipeline_stages > 1) {  // the report's bubble: (p - 1) / (m + p - 1)
      run.facts.emplace_back("pipeline_stages", std::to_string(c.parallel.pipeline_stages));
      run.facts.emplace_back("micro_batches", std::to_string(c.batch.accumulation));
    }
    const std::vector<std::string>& names = model_->program_names();
    for (int p = 0; p < model_->session().programs(); ++p)  // the memory view: every program this process runs
      if (size_t(p) < names.size() && !names[size_t(p)].empty())
        run.programs.push_back(compiler::program_memory(model_->session().executable(p), names[size_t(p)], p));
    runtime::add_planned_memory(run, model_->session());
    ASPEN_RETURN_IF_ERROR(write_run_profile(options_.profile, events, run, out()));
  }
  if (const TrainFeed::MaskedStats& m = feed_->masked_stats(); m.dropped > 0)
    out() << "masked LM: " << m.dropped << " of " << m.predicted
          << " chosen tokens went untrained (rows that chose more than data.max_predictions)\n";
  if (const TrainFeed::PackingStats& p = feed_->packing_stats(); p.rows > 0) {
    result.documents_per_row = double(p.documents) / double(p.rows);
    result.kept_attention_pairs = p.kept_pairs / p.causal_pairs;
  }
  // Interrupted before this run's first step: nothing new to save (a step-0
  // checkpoint would only make the directory look like a run).
  if (last_saved != result.steps && !(result.interrupted && result.steps == start)) ASPEN_RETURN_IF_ERROR(save());
  if (!writer_) {  // process 0 writes the model and prints the samples
    if (across_ && result.steps >= total) ASPEN_RETURN_IF_ERROR(model_->copy_weights_to_host().status());  // collective
    final_step_ = result.steps;
    model_.reset();
    return result;
  }
  if (result.steps < total) {  // stopped early: resumable, nothing else
    if (result.interrupted && result.steps == start)
      out() << "interrupted before this run's first step; nothing new to save\n";
    else
      out() << (result.interrupted ? "interrupted" : "stopped") << " at step " << result.steps << " of " << total
            << "; checkpoint of step " << result.steps << " in " << checkpoint_dir_ << " (resume with --resume)\n";
    return result;
  }
  ASPEN_RETURN_IF_ERROR(train::write_loss_svg(svg, train_curve_, val_curve_, c.name));
  result.model_dir = run_dir_ + "/model";
  ASPEN_RETURN_IF_ERROR(export_model(result.model_dir));
  final_step_ = result.steps;
  model_.reset();  // frees the training programs' memory and cores
  out() << "trained to step " << result.steps << "; model: " << result.model_dir << ", metrics: " << metrics_path
        << ", loss curve: " << svg << "\n";
  ASPEN_RETURN_IF_ERROR(print_samples(result.model_dir));
  return result;
}

}  // namespace aspen::api
