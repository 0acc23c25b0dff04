// models/embedder.cc: see embedder.h.
#include "models/embedder.h"

#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "compiler/executable.h"
#include "core/check.h"
#include "core/file.h"
#include "core/tensor.h"
#include "graph/builder.h"
#include "models/weights.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// An integer key of a small JSON file in the model directory: nullopt when
// the file or the key is absent; a malformed file is an error naming it.
Result<std::optional<int64_t>> json_int(const std::string& path, const std::string& key) {
  Result<std::string> text = read_regular_file(path, kMaxTextFileBytes);
  if (!text.is_ok() && text.status().code() == Code::kNotFound) return std::optional<int64_t>();
  if (!text.is_ok()) return text.status();
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::error(Code::kCorrupt, path, "a JSON object", "text that does not parse as one");
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  // HF writes a huge float (1e30) for "no limit" in model_max_length.
  if (it->is_number_integer() || it->is_number_unsigned()) return std::optional<int64_t>(it->get<int64_t>());
  if (it->is_number_float()) return std::optional<int64_t>();
  return Status::error(Code::kCorrupt, path + ": key '" + key + "'", "an integer", it->dump());
}

// NOTE [embedder max length] in embedder.h.
Result<int64_t> choose_max_length(const std::string& dir, int64_t requested, int64_t max_positions) {
  if (requested > 0) return requested;
  ASPEN_ASSIGN_OR_RETURN(std::optional<int64_t> st, json_int(dir + "/sentence_bert_config.json", "max_seq_length"));
  if (st) return *st;
  ASPEN_ASSIGN_OR_RETURN(std::optional<int64_t> tok, json_int(dir + "/tokenizer_config.json", "model_max_length"));
  if (tok && *tok > 0) return std::min(*tok, max_positions);
  return max_positions;
}

// The shortest compiled length (NOTE [embedder buckets]).
constexpr int64_t kSmallestBucket = 16;

}  // namespace

Embedder::~Embedder() = default;

Result<std::unique_ptr<Embedder>> Embedder::open(const std::string& dir, const EmbedderOptions& options) {
  if (!is_directory(dir))
    return Status::error(Code::kNotFound, dir, "a model directory (config.json, model.safetensors, tokenizer)",
                         "no such directory");
  if (options.max_batch < 1)
    return Status::invalid_argument("embedder: max_batch", "at least 1", std::to_string(options.max_batch));
  if (options.threads < 0)
    return Status::invalid_argument("embedder: threads", "0 (the free cores) or more", std::to_string(options.threads));

  ASPEN_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  const BertConfig* bert = ckpt.config().bert();
  if (!bert)
    return Status::invalid_argument(ckpt.config().path + ": key 'model_type'", "\"bert\" (embeddings use BertModel)",
                                    "\"" + ckpt.config().model_type + "\"");
  std::unique_ptr<Embedder> e(new Embedder());
  e->config_ = *bert;
  e->max_batch_ = options.max_batch;
  ASPEN_ASSIGN_OR_RETURN(e->max_length_, choose_max_length(dir, options.max_length, bert->max_positions));
  if (e->max_length_ < 2 || e->max_length_ > bert->max_positions)
    return Status::invalid_argument(
        "embedder: max_length",
        "2 ([CLS] [SEP]) to " + std::to_string(bert->max_positions) + " (max_position_embeddings)",
        std::to_string(e->max_length_));

  ASPEN_ASSIGN_OR_RETURN(e->tokenizer_, io::load_tokenizer(dir));
  const io::SpecialTokenIds& sp = e->tokenizer_->special_ids();
  if (!sp.cls || !sp.sep || !sp.pad)
    return Status::invalid_argument(dir + ": tokenizer", "a BERT vocabulary with [CLS], [SEP] and [PAD]",
                                    "one without them");
  if (int64_t(e->tokenizer_->vocab_size()) > bert->vocab)
    return Status::invalid_argument(dir + ": tokenizer",
                                    "at most vocab_size = " + std::to_string(bert->vocab) + " ids (config.json)",
                                    std::to_string(e->tokenizer_->vocab_size()));

  // NOTE [embedder buckets] in embedder.h: one program per length, sharing the weights. A model with a sparse
  // layout (NOTE [model layouts] in config.cc) runs whole blocks: each length rounded up to its block.
  const int64_t unit = ckpt.config().sparse_attention ? ckpt.config().sparse_attention->block : 1;
  auto whole_blocks = [unit](int64_t t) { return (t + unit - 1) / unit * unit; };
  for (int64_t t = kSmallestBucket; t < e->max_length_; t *= 2)
    if (e->lengths_.empty() || whole_blocks(t) > e->lengths_.back()) e->lengths_.push_back(whole_blocks(t));
  if (e->lengths_.empty() || whole_blocks(e->max_length_) > e->lengths_.back())
    e->lengths_.push_back(whole_blocks(e->max_length_));
  if (e->lengths_.back() > bert->max_positions)
    return Status::invalid_argument("embedder: max_length " + std::to_string(e->max_length_),
                                    "whole blocks of the model's sparse layout (" + std::to_string(unit) +
                                        " tokens) within max_position_embeddings " +
                                        std::to_string(bert->max_positions),
                                    std::to_string(e->lengths_.back()) + " tokens");
  std::vector<std::unique_ptr<compiler::Executable>> programs;
  std::optional<WeightPlan> plan;
  for (int64_t t : e->lengths_) {
    graph::Graph g;
    graph::Builder b(g);
    ASPEN_ASSIGN_OR_RETURN(const std::optional<kernels::BlockLayout> layout,
                           model_layout(ckpt.config(), t, "embedder"));
    const BertOptions shape{
        .batch = e->max_batch_, .seq = t, .sentence_embedding = true, .layout = layout ? &*layout : nullptr};
    ASPEN_RETURN_IF_ERROR(build_bert(b, *bert, shape).status());
    if (t == e->lengths_.back()) {
      ASPEN_ASSIGN_OR_RETURN(plan, plan_weights(g, ckpt));
    }
    ASPEN_ASSIGN_OR_RETURN(auto exe,
                           compiler::compile(g, {.opt_level = compiler::OptLevel::O2, .hoist_weights = true}));
    programs.push_back(std::move(exe));
  }
  ASPEN_ASSIGN_OR_RETURN(e->session_,
                         runtime::Session::create(std::move(programs), {.threads = options.threads, .trace = options.trace}));
  runtime::Session& s = *e->session_;
  ASPEN_RETURN_IF_ERROR(
      load_weights(*plan, [&s](const std::string& name, const Tensor& t) { return s.set_parameter(name, t); },
                   [&s](const std::string& name) { return s.replicas() == 1 ? s.parameter_of(0, name) : nullptr; }));
  return e;
}

std::vector<io::TokenId> Embedder::token_ids(const std::string& text) const {
  auto enc = tokenizer_->encode_padded(text, size_t(max_length_));
  ASPEN_CHECK(enc.is_ok());  // open() checked the pad token
  const auto n = std::count(enc->attention_mask.begin(), enc->attention_mask.end(), 1);
  enc->ids.resize(size_t(n));
  return std::move(enc->ids);
}

Result<std::vector<std::vector<float>>> Embedder::embed(const std::vector<std::string>& texts) {
  const int64_t B = max_batch_, C = config_.d_model;
  std::vector<std::vector<io::TokenId>> tokens;
  tokens.reserve(texts.size());
  for (const std::string& text : texts) tokens.push_back(token_ids(text));
  // Longest first, as sentence-transformers batches, so that each batch runs
  // at the shortest length its rows allow; results go back in input order.
  std::vector<size_t> order(texts.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tokens[a].size() > tokens[b].size(); });
  std::vector<std::vector<float>> out(texts.size());
  // Rows past the last text hold [CLS] [SEP] (an empty text) so that every
  // row has a token to average; their outputs are dropped.
  const std::vector<io::TokenId> filler = token_ids("");
  for (size_t start = 0; start < texts.size(); start += size_t(B)) {
    const size_t rows = std::min(texts.size() - start, size_t(B));
    const size_t longest = tokens[order[start]].size();
    const int program = int(std::lower_bound(lengths_.begin(), lengths_.end(), int64_t(longest)) - lengths_.begin());
    ASPEN_CHECK(size_t(program) < lengths_.size());
    const int64_t T = lengths_[size_t(program)];
    Tensor ids(DType::i32, Shape{B, T}), types(DType::i32, Shape{B, T}), mask(DType::u8, Shape{B, T});
    std::fill_n(ids.data<int32_t>(), B * T, *tokenizer_->special_ids().pad);
    std::fill_n(types.data<int32_t>(), B * T, 0);
    std::fill_n(mask.data<uint8_t>(), B * T, uint8_t(0));
    for (int64_t r = 0; r < B; ++r) {
      const std::vector<io::TokenId>& tok = size_t(r) < rows ? tokens[order[start + size_t(r)]] : filler;
      for (size_t t = 0; t < tok.size(); ++t) {
        ids.data<int32_t>()[r * T + int64_t(t)] = tok[t];
        mask.data<uint8_t>()[r * T + int64_t(t)] = 1;
      }
    }
    ASPEN_ASSIGN_OR_RETURN(auto result,
                           session_->run({{"input_ids", &ids}, {"token_type_ids", &types}, {"attention_mask", &mask}},
                                         runtime::RunOptions{}, program));
    const Tensor& e = result.at("sentence_embedding");
    ASPEN_CHECK(e.shape() == (Shape{B, C}));
    for (size_t r = 0; r < rows; ++r) {
      const float* row = e.data<float>() + int64_t(r) * C;
      out[order[start + r]].assign(row, row + C);
    }
  }
  return out;
}

}  // namespace aspen::models
