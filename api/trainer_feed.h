// api/trainer_feed.h: what the trainer feeds its programs (private to api/). The data is token shards
// (train/data.h) or arrays (train/arrays.h, for a user's own ONNX model); either is cut into
// micro-batches per local replica and mapped, by name, onto the forward graph's inputs. A user's ONNX
// model is imported here too (import_for_training), since its inputs take their shapes from the data.
//
// A micro-batch is a set of columns with its B examples on axis 0:
//   token shards: tokens [B, T] (each example's T tokens), targets [B, T] (the same shifted left by one
//                 token), positions [B, T] (0 .. T-1) and mask [B, T] (ones: shards have no padding);
//                 with packing (set_packing), positions restart after each eos token, targets whose token
//                 is eos are ignored (-100: the next document's first token), and segments [B, T] numbers
//                 each row's documents; with masked language modelling (set_masked_lm) tokens are the
//                 row with some tokens masked, targets the ids to predict there (-100 elsewhere), and
//                 token_types [B, T] zeros (BERT's segment A);
//   arrays:       every array of the dataset, by its name.
// Each model input reads one column: its elements in order (a [B, T] column feeds a [B·T] input), so
// the input must hold exactly as many; converted to the input's element type (integers to integers,
// checked for range; floats to floats, rounded to f16/bf16 inputs; integers to floats, which f16 and
// bf16 inputs round as any value).
//
//   ASPEN_ASSIGN_OR_RETURN(TrainFeed feed, TrainFeed::open(config.data.train, options, replicas));
//   ASPEN_RETURN_IF_ERROR(feed.bind(forward, {{"input_ids", "tokens"}, {"targets", "targets"}}, "data.train"));
//   ASPEN_ASSIGN_OR_RETURN(const auto* inputs, feed.next_call(micro));  // for TrainingModel::run
//
// Thread-safety: one thread at a time.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "models/onnx_import.h"
#include "train/config.h"
#include "train/arrays.h"
#include "train/data.h"

namespace aspen::api {

class TrainFeed {
 public:
  // Opens `path` with one loader per entry of `replicas` (the global replica indices this process feeds,
  // in local order) and a validation loader (the whole validation split on one replica). `path` is a
  // token-shard directory, or with `arrays_allowed` arrays when it holds no index.json.
  static Result<TrainFeed> open(const std::string& path, const train::DataLoaderOptions& options,
                                const std::vector<int64_t>& replicas, bool arrays_allowed);

  bool tokens() const { return !token_loaders_.empty(); }
  // Packed documents (token shards only; data.packing): `eos` ends a document. Before bind().
  void set_packing(int32_t eos);
  // Over the micro-batches drawn for training so far: documents per row and the share of causal
  // attention pairs the block-diagonal mask keeps.
  struct PackingStats {
    int64_t rows = 0, documents = 0;
    double kept_pairs = 0, causal_pairs = 0;
  };
  const PackingStats& packing_stats() const { return packing_stats_; }
  // Attention dropout (model.attention_dropout; token shards): a column "dropout_seed" (i64 [1]) per
  // micro-batch, a Philox hash of `seed`, the global replica and the data position it is drawn at (so a
  // resumed run draws the uninterrupted one's seeds; below 2^53); -1 (no dropout) in validation batches.
  // Before bind().
  void set_dropout_seed(uint64_t seed);
  // Masked language modelling (a BERT; token shards): a share `probability` of each row's tokens, drawn
  // among those not in `special`, become targets (the others -100); the input there reads `mask_id` (80 %),
  // a random id below `vocab` (10 %) or the token itself (10 %), as Hugging Face's
  // DataCollatorForLanguageModeling. Philox draws from `seed`, the global replica and the data position, so
  // a resumed run masks what the uninterrupted one would; validation batch i is masked the same way at
  // every evaluation. Adds the column token_types. With `predictions` K > 0 the head reads the predicted
  // rows only (models/bert.h mlm_predictions): targets become [B, K], each row's predicted tokens in order
  // then -100, beside mlm_positions [B, K] (b * T + t; padding b * T); a row with more than K keeps its
  // first K (MaskedStats::dropped counts the rest). Before bind().
  struct MaskedLm {
    double probability = 0.15;
    int32_t mask_id = 0;
    int64_t vocab = 0;
    std::vector<int32_t> special;
    uint64_t seed = 0;
    int64_t predictions = 0;
  };
  void set_masked_lm(MaskedLm m);
  // Over the micro-batches drawn for training so far: the tokens masked language modelling chose to predict,
  // and those a too small `predictions` left out.
  struct MaskedStats {
    int64_t predicted = 0, dropped = 0;
  };
  const MaskedStats& masked_stats() const { return masked_stats_; }
  const train::TokenIndex& token_index() const;  // tokens() only
  const train::ArrayDataset& arrays() const;     // !tokens() only
  // Every column of a micro-batch, with its type ([B, ...]).
  std::map<std::string, graph::TensorType> columns() const;
  // "tokens, targets, positions, mask" or the arrays' names, for messages.
  std::string column_names() const;

  // InvalidArgument naming `origin`, the input and the columns there are when no column is named
  // `column`; `mapped`: the user named it (else the hint says how to).
  [[nodiscard]] Status check_column(const std::string& input, const std::string& column, bool mapped,
                                    const std::string& origin) const;
  // Which column feeds each input of `forward`: `mapping` (input -> column) where it names the input,
  // else the column of the input's own name. InvalidArgument naming the config key (`origins` by input,
  // else `origin`), the input and the columns there are, for a missing column, one whose elements do not
  // fit the input, or (arrays, checked here once rather than at step N) an integer the input's type
  // cannot hold.
  [[nodiscard]] Status bind(const graph::Graph& forward, const std::map<std::string, std::string>& mapping,
                            const std::string& origin, const std::map<std::string, std::string>& origins = {});

  // One call of the training program: micro × L micro-batches, slot m·L + l from local replica l's
  // loader (TrainingModel's order), each bound input stacked on a merged leading axis. Valid until the
  // next call. After an error every loader's position is where it was before the call.
  Result<const std::map<std::string, Tensor>*> next_call(int64_t micro);
  // Validation micro-batch i, shaped as the forward graph's inputs.
  int64_t val_steps() const;
  Result<std::map<std::string, Tensor>> val_batch(int64_t i);

  // NOTE [data per replica]: what each local replica drew for training in this invocation, and in the last
  // call (api/trainer_live.h data_consumed reads them).
  struct DataStats {
    std::vector<int64_t> replicas;  // the global replica of each local loader
    std::vector<int64_t> examples;  // examples drawn per local loader
    std::vector<std::pair<int64_t, int64_t>> last_call;  // (epoch * train_examples + example, global replica)
  };
  const DataStats& data_stats() const { return data_stats_; }

  train::Position position() const;
  [[nodiscard]] Status restore(const train::Position& p);
  // What a micro-batch counts for the rate: B·T tokens, or B examples of arrays.
  int64_t units_per_micro_batch() const;

 private:
  struct Binding {
    std::string input, column;
    graph::TensorType type;  // the input's, per micro-batch
  };
  // The next micro-batch of local loader `local`, which stands at `drawn`.
  Result<train::Columns> next_of(size_t local, const train::Position& drawn);
  // `mlm_key`: the Philox key of this batch's masked-LM draws (with set_masked_lm).
  train::Columns token_columns(train::Batch b, PackingStats* stats, uint64_t mlm_key = 0,
                               MaskedStats* masked = nullptr) const;
  [[nodiscard]] Status put(const train::Columns& batch, int64_t slot, std::map<std::string, Tensor>& out) const;

  std::string path_;
  int64_t micro_batch_ = 0, seq_ = 0;
  std::vector<std::unique_ptr<train::DataLoader>> token_loaders_;
  std::unique_ptr<train::DataLoader> token_val_;
  std::shared_ptr<const train::ArrayDataset> arrays_;
  std::vector<std::unique_ptr<train::ArrayLoader>> array_loaders_;
  std::unique_ptr<train::ArrayLoader> array_val_;
  std::vector<Binding> bindings_;
  bool packing_ = false;
  int32_t eos_ = 0;
  bool dropout_ = false;
  uint64_t dropout_seed_ = 0;
  std::vector<int64_t> replicas_;  // the global replica of each local loader
  DataStats data_stats_;
  PackingStats packing_stats_;
  std::optional<MaskedLm> mlm_;
  MaskedStats masked_stats_;
  std::map<std::string, Tensor> call_;  // next_call's tensors, reused
  int64_t call_slots_ = 0;
};

// NOTE [onnx training] in trainer_feed.cc: config.model.from (an .onnx file) imported for training on
// `feed`'s columns, with config.model's loss added; `columns` receives which column feeds each input.
Result<models::OnnxImport> import_for_training(const train::TrainConfig& config, const TrainFeed& feed,
                                               std::map<std::string, std::string>& columns);

}  // namespace aspen::api
