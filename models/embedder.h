// models/embedder.h: sentence embeddings from a BERT model directory, as
// sentence-transformers computes them (tokenize with [CLS]/[SEP] and
// truncation, BertModel, mean pooling over the attention mask, L2 normalize).
//
//   ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<Embedder> e, Embedder::open(dir, {.max_batch = 32}));
//   ASPEN_ASSIGN_OR_RETURN(auto vectors, e->embed({"A man is eating food.", "I love you."}));
//
// open() reads <dir>/config.json (model_type must be "bert"), the tokenizer
// (tokenizer.json or vocab.txt, io/tokenizer.h) and the safetensors weights
// (models/weights.h), builds the BERT graph with its sentence-embedding output
// for [max_batch, T] at a few lengths T (NOTE [embedder buckets]), compiles
// each once (O2) into one runtime::Session sharing the weights, and loads the
// weights. embed() tokenizes each text, sorts the texts longest first (as
// sentence-transformers does), fills batches of max_batch rows (a partial
// last batch is padded with rows whose outputs are dropped), runs each batch
// at the shortest compiled length that holds its longest row, and returns
// one unit-length vector of d_model floats per text, in input order.
//
// NOTE [embedder buckets] The compiled lengths are 16, 32, 64, ... below
// max_length, then max_length itself: a batch of short texts does not pay for
// max_length (padding changes no result: padded keys are never attended and
// mean pooling skips them). All programs share one set of weights and one
// arena (sized for the largest); compiling the extra ones costs little. A
// model trained with a sparse layout (config.json's aspen_sparse_attention)
// attends through it: each length rounded up to whole blocks, the layout's
// first blocks (models/config.h model_layout).
//
// NOTE [embedder max length] The sequence length, special tokens included:
//   1. options.max_length when > 0;
//   2. else max_seq_length of <dir>/sentence_bert_config.json (what
//      sentence-transformers truncates to: 256 for all-MiniLM-L6-v2);
//   3. else min(model_max_length of <dir>/tokenizer_config.json,
//      max_position_embeddings) (sentence-transformers' own fallback);
//   4. else max_position_embeddings.
// tokenizer.json's "truncation" block (128 for all-MiniLM-L6-v2) is ignored,
// as sentence-transformers overrides it. Longer texts keep their first
// max_length - 2 tokens between [CLS] and [SEP]. The length must lie in
// [2, max_position_embeddings].
//
// Every text is one row (token_type_ids 0). An empty text is [CLS] [SEP] and
// gets the mean of those two tokens, as sentence-transformers gives (it strips
// surrounding whitespace first, which never changes WordPiece ids). Text that
// is not valid UTF-8 is tokenized as the tokenizer does (lossily decoded).
//
// Why models/ and not api/: the embedder needs only runtime::Session (floor
// 5) and the models floor's config, weight and BERT code, so it sits here,
// below api/ (docs/layout.md); api::InferenceModel adds nothing it uses.
//
// Thread-safety: embed() is one call at a time (it runs the session).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/tokenizer.h"
#include "profile/trace.h"
#include "models/bert.h"

namespace aspen::runtime {
class Session;
}

namespace aspen::models {

struct EmbedderOptions {
  int64_t max_batch = 32;  // rows per run: the compiled batch
  int64_t max_length = 0;  // tokens per row, [CLS]/[SEP] included; 0: NOTE [embedder max length]
  int threads = 0;         // the session's threads; 0: the free cores
  profile::TraceRecorder* trace = nullptr;  // when set, every instruction of every run is recorded
};

class Embedder {
 public:
  // Errors name the directory or file: NotFound for a missing directory,
  // config.json, weights or tokenizer; InvalidArgument for a model_type
  // other than "bert", a tokenizer whose vocabulary or special tokens do not
  // fit the model, or options out of range.
  static Result<std::unique_ptr<Embedder>> open(const std::string& dir, const EmbedderOptions& options = {});
  ~Embedder();

  // One L2-normalized vector of dim() floats per text, in order.
  Result<std::vector<std::vector<float>>> embed(const std::vector<std::string>& texts);
  // The token ids a text runs with ([CLS] ... [SEP], truncated; no padding).
  std::vector<io::TokenId> token_ids(const std::string& text) const;

  int64_t dim() const { return config_.d_model; }
  int64_t max_batch() const { return max_batch_; }
  int64_t max_length() const { return max_length_; }
  // The compiled sequence lengths, ascending (the last is max_length()).
  const std::vector<int64_t>& compiled_lengths() const { return lengths_; }
  const io::Tokenizer& tokenizer() const { return *tokenizer_; }
  // The programs, one per compiled length (program i runs compiled_lengths()[i]).
  const runtime::Session& session() const { return *session_; }

 private:
  Embedder() = default;
  BertConfig config_;
  int64_t max_batch_ = 0, max_length_ = 0;
  std::vector<int64_t> lengths_;  // compiled lengths, ascending; program i runs lengths_[i]
  std::unique_ptr<io::Tokenizer> tokenizer_;
  std::unique_ptr<runtime::Session> session_;
};

}  // namespace aspen::models
