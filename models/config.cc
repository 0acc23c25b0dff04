#include "models/config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/log.h"

namespace aspen::models {

namespace {

using json = nlohmann::json;

// Keys every Hugging Face config may carry that do not change an eval-mode
// forward pass: PretrainedConfig's own attributes, generation settings older
// configs keep inline, training-only settings (dropout, init, checkpointing).
const std::set<std::string>& harmless_keys() {
  static const std::set<std::string> keys = {
      "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "initializer_range", "use_cache", "task_specific_params", "id2label", "label2id", "num_labels",
      "problem_type", "finetuning_task", "tokenizer_class", "prefix", "output_hidden_states",
      "output_attentions", "return_dict", "torchscript", "use_bfloat16", "pruned_heads", "is_decoder",
      "is_encoder_decoder", "add_cross_attention", "cross_attention_hidden_size", "tie_encoder_decoder",
      "chunk_size_feed_forward", "gradient_checkpointing", "tf_legacy_loss", "_attn_implementation",
      "attn_implementation", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
      "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
      "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
      "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
      "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
      "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
      // dropout and GPT-2's sequence-summary head (GPT2DoubleHeadsModel), unused in eval mode
      "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob",
      "classifier_dropout", "summary_type", "summary_use_proj", "summary_activation", "summary_first_dropout",
      "summary_proj_to_labels", "reorder_and_upcast_attn" /* numerics of f16 training only */};
  return keys;
}

// Reads keys of one config object; the first error sticks (later reads
// return defaults), as the Builder's errors do.
class Keys {
 public:
  Keys(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const Status& status() const { return status_; }

  // Absent or null: nullopt.
  const json* find(const std::string& key) {
    used_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t required_int(const std::string& key) {
    const json* v = find(key);
    if (!v) {
      fail(Code::kNotFound, key, "present (it sizes the model)", "none");
      return 0;
    }
    return as_int(key, *v);
  }
  int64_t int_or(const std::string& key, int64_t fallback) {
    const json* v = find(key);
    return v ? as_int(key, *v) : fallback;
  }
  std::optional<int64_t> optional_int(const std::string& key) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    return as_int(key, *v);
  }
  double number_or(const std::string& key, double fallback) {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) {
      fail(Code::kInvalidArgument, key, "a number", v->dump());
      return fallback;
    }
    return v->get<double>();
  }
  bool bool_or(const std::string& key, bool fallback) {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) {
      fail(Code::kInvalidArgument, key, "true or false", v->dump());
      return fallback;
    }
    return v->get<bool>();
  }
  // A string among `allowed` (the first is the default when absent).
  std::string choice(const std::string& key, const std::vector<std::string>& allowed) {
    const json* v = find(key);
    if (!v) return allowed.front();
    if (v->is_string() && std::find(allowed.begin(), allowed.end(), v->get<std::string>()) != allowed.end())
      return v->get<std::string>();
    std::string want;
    for (const std::string& a : allowed) want += (want.empty() ? "" : " or ") + ("\"" + a + "\"");
    fail(Code::kUnimplemented, key, want + " (what the graph computes)", v->dump());
    return allowed.front();
  }
  // A boolean that must have `want` (the graph has no other behaviour).
  void require_bool(const std::string& key, bool want) {
    if (bool_or(key, want) != want)
      fail(Code::kUnimplemented, key, std::string(want ? "true" : "false") + " (what the graph computes)",
           want ? "false" : "true");
  }
  // eos_token_id: one id or a list.
  std::vector<int64_t> ids(const std::string& key) {
    const json* v = find(key);
    std::vector<int64_t> out;
    if (!v) return out;
    if (v->is_array()) {
      for (const json& e : *v) out.push_back(as_int(key, e));
    } else {
      out.push_back(as_int(key, *v));
    }
    return out;
  }
  // Keys neither read nor harmless, sorted.
  std::vector<std::string> unknown() const {
    std::vector<std::string> out;
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!used_.count(it.key()) && !harmless_keys().count(it.key())) out.push_back(it.key());
    std::sort(out.begin(), out.end());
    return out;
  }
  void fail(Code code, const std::string& key, const std::string& expected, const std::string& found) {
    if (status_.is_ok()) status_ = Status::error(code, path_ + ": key '" + key + "'", expected, found);
  }

 private:
  int64_t as_int(const std::string& key, const json& v) {
    if (v.is_number_integer()) return v.get<int64_t>();
    fail(Code::kInvalidArgument, key, "an integer", v.dump());
    return 0;
  }

  const json& j_;
  std::string path_;
  std::set<std::string> used_;
  Status status_;
};

Gpt2Config read_gpt2(Keys& k) {
  Gpt2Config c;
  c.vocab = k.required_int("vocab_size");
  c.n_positions = k.required_int("n_positions");
  c.d_model = k.required_int("n_embd");
  c.n_layer = k.required_int("n_layer");
  c.n_head = k.required_int("n_head");
  c.d_ff = k.int_or("n_inner", 0);  // null: 4 * n_embd
  c.layer_norm_eps = k.number_or("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = k.bool_or("tie_word_embeddings", true);
  k.choice("activation_function", {"gelu_new"});
  k.require_bool("scale_attn_weights", true);
  k.require_bool("scale_attn_by_inverse_layer_idx", false);
  if (const json* n_ctx = k.find("n_ctx"); n_ctx && *n_ctx != json(c.n_positions))  // old configs repeat n_positions
    k.fail(Code::kUnimplemented, "n_ctx", "n_positions (" + std::to_string(c.n_positions) + ")", n_ctx->dump());
  return c;
}

GptjConfig read_gptj(Keys& k) {
  GptjConfig c;
  c.vocab = k.required_int("vocab_size");
  c.n_positions = k.required_int("n_positions");
  c.d_model = k.required_int("n_embd");
  c.n_layer = k.required_int("n_layer");
  c.n_head = k.required_int("n_head");
  c.rotary_dim = k.int_or("rotary_dim", c.n_head > 0 ? c.d_model / c.n_head : 0);  // null: the whole head
  c.d_ff = k.int_or("n_inner", 0);
  c.layer_norm_eps = k.number_or("layer_norm_epsilon", 1e-5);
  k.choice("activation_function", {"gelu_new"});
  k.require_bool("tie_word_embeddings", false);  // the graph has its own lm_head (with a bias)
  k.bool_or("rotary", true);                      // GPT-J 6B's config says so; rotary is always on
  k.require_bool("scale_attn_weights", true);
  return c;
}

// The rotary frequencies: transformers 5's rope_parameters (rope_theta
// inside), or 4.x's rope_theta beside rope_scaling.
RopeSpec read_rope(Keys& k, double default_theta) {
  RopeSpec r;
  r.theta = k.number_or("rope_theta", default_theta);
  const json* top_theta = k.find("rope_theta");
  const json* rope = k.find("rope_parameters");
  const char* key = "rope_parameters";
  // Both forms in one file, saying different things: which one a reader takes differs between transformers
  // releases, so neither is guessed.
  if (const json* legacy = k.find("rope_scaling"); rope && legacy && !legacy->is_null() && rope->is_object() &&
                                                   legacy->is_object()) {
    for (auto it = legacy->begin(); it != legacy->end(); ++it) {
      const std::string name = it.key() == "type" ? "rope_type" : it.key();
      auto mine = rope->find(name);
      if (mine == rope->end() && name == "rope_type") mine = rope->find("type");
      if (mine != rope->end() && *mine != *it) {
        k.fail(Code::kInvalidArgument, "rope_scaling." + it.key(),
               "the value rope_parameters." + name + " gives (" + mine->dump() + "), or no rope_scaling",
               it->dump());
        return r;
      }
    }
  }
  if (!rope) {
    rope = k.find("rope_scaling");
    key = "rope_scaling";
  }
  if (!rope || rope->is_null()) return r;
  if (!rope->is_object()) {
    k.fail(Code::kInvalidArgument, key, "an object", rope->dump());
    return r;
  }
  std::string type = "default";
  for (const char* t : {"rope_type", "type"})
    if (auto it = rope->find(t); it != rope->end()) type = it->is_string() ? it->get<std::string>() : it->dump();
  if (type == "default") r.scaling = "none";
  else if (type == "linear" || type == "llama3" || type == "dynamic") r.scaling = type;
  else k.fail(Code::kUnimplemented, std::string(key) + ".rope_type",
              "\"default\", \"linear\", \"llama3\" or \"dynamic\" (yarn and longrope: not in this build)",
              "\"" + type + "\"");
  for (auto it = rope->begin(); it != rope->end(); ++it) {
    const std::string& name = it.key();
    if (name == "rope_type" || name == "type") continue;
    const bool known = name == "rope_theta" || name == "factor" || name == "low_freq_factor" ||
                       name == "high_freq_factor" || name == "original_max_position_embeddings";
    if (!known) {
      k.fail(Code::kUnimplemented, std::string(key) + "." + name, "none (not part of " + type + " scaling here)",
             it->dump());
      continue;
    }
    if (!it->is_number()) {
      k.fail(Code::kInvalidArgument, std::string(key) + "." + name, "a number", it->dump());
      continue;
    }
    const double v = it->get<double>();
    if (name == "rope_theta" && top_theta && top_theta->is_number() && top_theta->get<double>() != v) {
      k.fail(Code::kInvalidArgument, "rope_theta", "the value " + std::string(key) + ".rope_theta gives (" + it->dump() + ")",
             top_theta->dump());
      continue;
    }
    if (name == "rope_theta") r.theta = v;
    else if (name == "factor") r.factor = v;
    else if (name == "low_freq_factor") r.low_freq_factor = v;
    else if (name == "high_freq_factor") r.high_freq_factor = v;
    else r.original_max_positions = int64_t(v);
  }
  // Scaling without its factor: transformers refuses it; aspen once scaled by a default.
  if (r.scaling != "none" && !rope->contains("factor"))
    k.fail(Code::kInvalidArgument, std::string(key) + ".factor", "a number (" + r.scaling + " scaling needs one)", "none");
  return r;
}

// Llama, Mistral and Qwen2: one graph, their defaults and switches differ.
LlamaConfig read_llama(Keys& k, const std::string& type) {
  LlamaConfig c;
  c.vocab = k.required_int("vocab_size");
  c.d_model = k.required_int("hidden_size");
  c.d_ff = k.required_int("intermediate_size");
  c.n_layer = k.required_int("num_hidden_layers");
  c.n_head = k.required_int("num_attention_heads");
  c.n_positions = k.required_int("max_position_embeddings");
  c.n_kv_head = k.int_or("num_key_value_heads", 0);  // null: n_head
  c.head_dim = k.int_or("head_dim", 0);              // null: hidden_size / num_attention_heads
  c.rms_norm_eps = k.number_or("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = k.bool_or("tie_word_embeddings", false);
  c.rope = read_rope(k, 10000.0);
  if (c.rope.scaling == "dynamic") c.rope.original_max_positions = c.n_positions;  // HF's: max_position_embeddings
  k.choice("hidden_act", {"silu"});
  k.number_or("attention_dropout", 0.0);  // training only
  if (type == "llama") {
    if (k.int_or("pretraining_tp", 1) != 1)
      k.fail(Code::kUnimplemented, "pretraining_tp", "1 (the projections whole)", k.find("pretraining_tp")->dump());
    c.qkv_bias = c.o_bias = k.bool_or("attention_bias", false);
    c.mlp_bias = k.bool_or("mlp_bias", false);
  } else if (type == "mistral") {
    c.sliding_window = k.int_or("sliding_window", 0);  // null: none (save_pretrained always writes the key)
  } else {  // qwen2: q, k, v biases; a window only with use_sliding_window (and then on some layers only)
    c.qkv_bias = true;
    k.require_bool("use_sliding_window", false);
    k.int_or("sliding_window", 0);      // unused without use_sliding_window
    k.int_or("max_window_layers", 0);   // likewise
  }
  if (const json* types = k.find("layer_types"); types) {
    const bool sliding = c.sliding_window > 0;
    const std::string want = sliding ? "sliding_attention" : "full_attention";
    bool same = types->is_array() && int64_t(types->size()) == c.n_layer;
    if (same)
      for (const json& t : *types) same = same && t.is_string() && t.get<std::string>() == want;
    if (!same)
      k.fail(Code::kUnimplemented, "layer_types", std::to_string(c.n_layer) + " times \"" + want + "\" (every layer alike)",
             types->dump());
  }
  return c;
}

// NOTE [model layouts]: a model trained with a sparse layout keeps it: the export writes the sparsity config
// (DeepSpeed's names, the seed of its random blocks) as config.json's "aspen_sparse_attention", and every
// program built from the config (training, embedding, generation) attends through model_layout(): the
// layout made once for the model's whole context, cut to the rows' length. A row of any length so sees the
// start of the one pattern (DeepSpeed's SparseSelfAttention slices its master layout the same way), and a
// random block is where it was in training.
Result<kernels::SparsityConfig> sparsity_from_json(const json& j, int64_t n_head, const std::string& what) {
  if (!j.is_object()) return Status::invalid_argument(what, "an object (a sparsity config)", j.dump());
  auto kind_it = j.find("kind");
  if (kind_it == j.end() || !kind_it->is_string())
    return Status::invalid_argument(what + ".kind", "a sparsity kind's name", kind_it == j.end() ? "none" : kind_it->dump());
  const Result<kernels::SparsityConfig::Kind> kind = kernels::parse_sparsity_kind(kind_it->get<std::string>());
  if (!kind.is_ok()) return kind.status().with_context(what);
  kernels::SparsityConfig c = kernels::SparsityConfig::of(*kind, n_head);
  for (const auto& [key, v] : j.items()) {
    const std::string where = what + "." + key;
    auto integer = [&](int64_t* out) -> Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) return Status::invalid_argument(where, "an integer >= 0", v.dump());
      *out = v.get<int64_t>();
      return Status();
    };
    auto flag = [&](bool* out) -> Status {
      if (!v.is_boolean()) return Status::invalid_argument(where, "true or false", v.dump());
      *out = v.get<bool>();
      return Status();
    };
    auto list = [&](std::vector<int64_t>* out) -> Status {
      if (!v.is_array()) return Status::invalid_argument(where, "a list of integers", v.dump());
      out->clear();
      for (const json& x : v) {
        if (!x.is_number_integer()) return Status::invalid_argument(where, "a list of integers", v.dump());
        out->push_back(x.get<int64_t>());
      }
      return Status();
    };
    Status s;
    if (key == "kind") {
      continue;
    } else if (key == "block") {
      s = integer(&c.block);
    } else if (key == "attention") {
      if (!v.is_string()) return Status::invalid_argument(where, "unidirectional or bidirectional", v.dump());
      const Result<kernels::SparsityConfig::Attention> a = kernels::parse_attention(v.get<std::string>());
      if (!a.is_ok()) return Status::invalid_argument(where, "unidirectional or bidirectional", v.dump());
      c.attention = *a;
    } else if (key == "different_layout_per_head") {
      s = flag(&c.different_layout_per_head);
    } else if (key == "horizontal_global_attention") {
      s = flag(&c.horizontal_global_attention);
    } else if (key == "num_local_blocks") {
      s = integer(&c.num_local_blocks);
    } else if (key == "num_global_blocks") {
      s = integer(&c.num_global_blocks);
    } else if (key == "num_different_global_patterns") {
      s = integer(&c.num_different_global_patterns);
    } else if (key == "num_random_blocks") {
      s = integer(&c.num_random_blocks);
    } else if (key == "num_sliding_window_blocks") {
      s = integer(&c.num_sliding_window_blocks);
    } else if (key == "local_window_blocks") {
      s = list(&c.local_window_blocks);
    } else if (key == "global_block_indices") {
      s = list(&c.global_block_indices);
    } else if (key == "global_block_end_indices") {
      s = list(&c.global_block_end_indices);
    } else if (key == "seed") {
      if (!v.is_number_unsigned()) return Status::invalid_argument(where, "an integer >= 0", v.dump());
      c.seed = v.get<uint64_t>();
    } else {
      return Status::invalid_argument(where, "a key of DeepSpeed's sparsity configs (kind, " + kernels::sparsity_keys() + ", seed)",
                                      "an unknown key");
    }
    ASPEN_RETURN_IF_ERROR(s);
  }
  ASPEN_RETURN_IF_ERROR(kernels::validate(c).with_context(what));
  return c;
}

nlohmann::ordered_json sparsity_to_json(const kernels::SparsityConfig& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["kind"] = kernels::sparsity_kind_name(c.kind);
  j["block"] = c.block;
  j["attention"] = kernels::attention_name(c.attention);
  j["different_layout_per_head"] = c.different_layout_per_head;
  j["num_local_blocks"] = c.num_local_blocks;
  j["num_global_blocks"] = c.num_global_blocks;
  j["horizontal_global_attention"] = c.horizontal_global_attention;
  j["num_different_global_patterns"] = c.num_different_global_patterns;
  j["num_random_blocks"] = c.num_random_blocks;
  j["local_window_blocks"] = c.local_window_blocks;
  j["global_block_indices"] = c.global_block_indices;
  j["global_block_end_indices"] = c.global_block_end_indices;
  j["num_sliding_window_blocks"] = c.num_sliding_window_blocks;
  j["seed"] = c.seed;
  return j;
}

BertConfig read_bert(Keys& k) {
  BertConfig c;
  c.vocab = k.required_int("vocab_size");
  c.d_model = k.required_int("hidden_size");
  c.n_layer = k.required_int("num_hidden_layers");
  c.n_head = k.required_int("num_attention_heads");
  c.d_ff = k.required_int("intermediate_size");
  c.max_positions = k.required_int("max_position_embeddings");
  c.type_vocab = k.int_or("type_vocab_size", 2);
  c.layer_norm_eps = k.number_or("layer_norm_eps", 1e-12);
  c.activation = k.choice("hidden_act", {"gelu", "gelu_new"}) == "gelu" ? Activation::gelu_erf : Activation::gelu_tanh;
  k.choice("position_embedding_type", {"absolute"});
  k.bool_or("tie_word_embeddings", true);  // BertModel has no head to tie
  return c;
}

}  // namespace

int64_t ModelConfig::vocab() const {
  return std::visit([](const auto& f) { return f.vocab; }, family);
}

int64_t ModelConfig::n_positions() const {
  if (const BertConfig* b = bert()) return b->max_positions;
  if (const LlamaConfig* l = llama()) return l->context();
  if (const GptjConfig* j = gptj()) return j->n_positions;
  return gpt2()->n_positions;
}

int64_t ModelConfig::n_head() const {
  return std::visit([](const auto& f) { return f.n_head; }, family);
}

double min_parameter_count(const ModelConfig& config) {
  if (const Gpt2Config* g = config.gpt2()) {
    const double C = double(g->d_model), F = double(g->ff_dim());
    return double(g->vocab) * C + double(g->n_positions) * C + double(g->n_layer) * (4 * C * C + 2 * C * F);
  }
  if (const GptjConfig* g = config.gptj()) {
    const double C = double(g->d_model), F = double(g->ff_dim());
    return 2 * double(g->vocab) * C + double(g->n_layer) * (4 * C * C + 2 * C * F);  // wte and lm_head
  }
  if (const LlamaConfig* l = config.llama()) {
    const double C = double(l->d_model), F = double(l->d_ff), Q = double(l->n_head * l->head_size()),
                 KV = double(l->kv_heads() * l->head_size());
    return (l->tie_word_embeddings ? 1 : 2) * double(l->vocab) * C +
           double(l->n_layer) * (2 * C * Q + 2 * C * KV + 3 * C * F);
  }
  if (const BertConfig* b = config.bert()) {
    const double C = double(b->d_model), F = double(b->d_ff);
    return (double(b->vocab) + double(b->max_positions) + double(b->type_vocab)) * C +
           double(b->n_layer) * (4 * C * C + 2 * C * F);
  }
  return 0;
}

Status check_fits_memory(const std::string& subject, double parameters, double bytes_per_parameter,
                         const std::string& use) {
  const double have = physical_memory_bytes(), need = parameters * bytes_per_parameter;
  if (have <= 0 || need <= have) return Status();
  auto gib = [](double b) {
    char buf[48];
    if (b >= 0x1p50) std::snprintf(buf, sizeof buf, "%.3g PiB", b / 0x1p50);
    else if (b >= 0x1p40) std::snprintf(buf, sizeof buf, "%.3g TiB", b / 0x1p40);
    else std::snprintf(buf, sizeof buf, "%.3g GiB", b / 0x1p30);
    return std::string(buf);
  };
  char count[48];
  std::snprintf(count, sizeof count, "%.3g", parameters);
  return Status::invalid_argument(subject, "a model that fits in this machine's " + gib(have) + " of memory",
                                  "at least " + std::string(count) + " parameters, " + gib(need) + " for " + use,
                                  "check the model's dimensions (n_layer, n_embd / d_model, vocab_size, "
                                  "n_positions, d_ff)");
}

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = {"gpt2", "gptj", "bert", "llama", "mistral", "qwen2"};
  return types;
}

Result<ModelConfig> parse_config(const std::string& text, const std::string& path) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(Code::kCorrupt, path, "well-formed JSON", "a parse error");
  if (!j.is_object()) return Status::error(Code::kCorrupt, path, "a JSON object", std::string(j.type_name()));
  ModelConfig c;
  c.path = path;
  Keys k(j, path);
  const json* type = k.find("model_type");
  if (!type) return Status::error(Code::kNotFound, path + ": key 'model_type'", "present", "none");
  std::string types;
  for (const std::string& t : supported_model_types()) types += (types.empty() ? "" : ", ") + t;
  c.model_type = type->is_string() ? type->get<std::string>() : type->dump();
  if (c.model_type == "gpt2") {
    c.family = read_gpt2(k);
  } else if (c.model_type == "gptj") {
    c.family = read_gptj(k);
  } else if (c.model_type == "bert") {
    c.family = read_bert(k);
  } else if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2") {
    c.family = read_llama(k, c.model_type);
  } else {
    return Status::error(Code::kUnimplemented, path + ": model_type", "one of " + types, "\"" + c.model_type + "\"");
  }
  if (const json* a = k.find("aspen_sparse_attention")) {
    Result<kernels::SparsityConfig> sc = sparsity_from_json(*a, c.n_head(), path + ": key 'aspen_sparse_attention'");
    if (!sc.is_ok()) return sc.status();
    c.sparse_attention = *sc;
  }
  c.bos_token_id = k.optional_int("bos_token_id");
  c.pad_token_id = k.optional_int("pad_token_id");
  c.eos_token_ids = k.ids("eos_token_id");
  ASPEN_RETURN_IF_ERROR(k.status());
  Status valid = std::visit([](const auto& f) { return f.validate(); }, c.family);
  ASPEN_RETURN_IF_ERROR(std::move(valid).with_context(path));
  c.unknown_keys = k.unknown();
  if (!c.unknown_keys.empty()) {
    std::string list;
    for (const std::string& key : c.unknown_keys) list += (list.empty() ? "" : ", ") + key;
    ASPEN_LOG(warning) << path << ": unknown " << c.model_type << " config keys ignored: " << list;
  }
  return c;
}

namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json id_or_null(const std::optional<int64_t>& id) { return id ? ordered_json(*id) : ordered_json(nullptr); }

// The keys GPT-2 and GPT-J share, in the order transformers writes them.
void write_decoder_keys(ordered_json& j, int64_t vocab, int64_t n_positions, int64_t d_model, int64_t n_layer,
                        int64_t n_head, int64_t d_ff, double layer_norm_eps) {
  j["vocab_size"] = vocab;
  j["n_positions"] = n_positions;
  j["n_embd"] = d_model;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_inner"] = d_ff > 0 ? ordered_json(d_ff) : ordered_json(nullptr);  // null: 4 * n_embd
  j["layer_norm_epsilon"] = layer_norm_eps;
  j["activation_function"] = "gelu_new";
  j["scale_attn_weights"] = true;
}

// The Llama family's keys as transformers 5 writes them (rope_parameters with rope_theta inside).
void write_llama_keys(ordered_json& j, const std::string& type, const LlamaConfig& l) {
  j["model_type"] = type;
  j["architectures"] = {type == "llama" ? "LlamaForCausalLM" : type == "mistral" ? "MistralForCausalLM"
                                                                                 : "Qwen2ForCausalLM"};
  j["vocab_size"] = l.vocab;
  j["hidden_size"] = l.d_model;
  j["intermediate_size"] = l.d_ff;
  j["num_hidden_layers"] = l.n_layer;
  j["num_attention_heads"] = l.n_head;
  j["num_key_value_heads"] = l.kv_heads();
  if (type != "qwen2") j["head_dim"] = l.head_size();  // Qwen2Config has no head_dim: hidden / heads
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = l.n_positions;
  j["rms_norm_eps"] = l.rms_norm_eps;
  ordered_json rope = ordered_json::object();
  rope["rope_type"] = l.rope.scaling == "none" ? "default" : l.rope.scaling;
  rope["rope_theta"] = l.rope.theta;
  if (l.rope.scaling != "none") rope["factor"] = l.rope.factor;
  if (l.rope.scaling == "llama3") {
    rope["low_freq_factor"] = l.rope.low_freq_factor;
    rope["high_freq_factor"] = l.rope.high_freq_factor;
    rope["original_max_position_embeddings"] = l.rope.original_max_positions;
  }
  j["rope_parameters"] = rope;
  if (type == "llama") {
    j["attention_bias"] = l.qkv_bias;
    j["mlp_bias"] = l.mlp_bias;
    j["pretraining_tp"] = 1;
  } else if (type == "mistral") {
    j["sliding_window"] = l.sliding_window > 0 ? ordered_json(l.sliding_window) : ordered_json(nullptr);
  } else {
    j["use_sliding_window"] = false;
  }
  j["tie_word_embeddings"] = l.tie_word_embeddings;
}

}  // namespace

Result<std::string> to_hf_config_json(const ModelConfig& config) {
  Status valid = std::visit([](const auto& f) { return f.validate(); }, config.family);
  ASPEN_RETURN_IF_ERROR(std::move(valid).with_context("to_hf_config_json"));
  ordered_json j = ordered_json::object();
  if (const Gpt2Config* g = config.gpt2()) {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    write_decoder_keys(j, g->vocab, g->n_positions, g->d_model, g->n_layer, g->n_head, g->d_ff, g->layer_norm_eps);
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["tie_word_embeddings"] = g->tie_word_embeddings;
  } else if (const GptjConfig* gj = config.gptj()) {
    j["model_type"] = "gptj";
    j["architectures"] = {"GPTJForCausalLM"};
    write_decoder_keys(j, gj->vocab, gj->n_positions, gj->d_model, gj->n_layer, gj->n_head, gj->d_ff,
                       gj->layer_norm_eps);
    j["rotary_dim"] = gj->rotary_dim;
    j["tie_word_embeddings"] = false;
  } else if (const LlamaConfig* l = config.llama()) {
    write_llama_keys(j, config.model_type, *l);
  } else {
    const BertConfig& b = *config.bert();
    j["model_type"] = "bert";
    j["architectures"] = {"BertForMaskedLM"};  // export_hf_model writes BERT with its masked-LM head
    j["vocab_size"] = b.vocab;
    j["hidden_size"] = b.d_model;
    j["num_hidden_layers"] = b.n_layer;
    j["num_attention_heads"] = b.n_head;
    j["intermediate_size"] = b.d_ff;
    j["hidden_act"] = b.activation == Activation::gelu_erf ? "gelu" : "gelu_new";
    j["max_position_embeddings"] = b.max_positions;
    j["type_vocab_size"] = b.type_vocab;
    j["layer_norm_eps"] = b.layer_norm_eps;
    j["position_embedding_type"] = "absolute";
    j["tie_word_embeddings"] = true;  // the MLM decoder is the word embeddings
  }
  if (config.sparse_attention) j["aspen_sparse_attention"] = sparsity_to_json(*config.sparse_attention);
  j["bos_token_id"] = id_or_null(config.bos_token_id);
  if (config.eos_token_ids.size() == 1) {
    j["eos_token_id"] = config.eos_token_ids[0];
  } else if (config.eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else {
    j["eos_token_id"] = config.eos_token_ids;
  }
  j["pad_token_id"] = id_or_null(config.pad_token_id);
  j["torch_dtype"] = "float32";  // the master weights; newer transformers read it as "dtype"
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

Result<std::optional<kernels::BlockLayout>> model_layout(const ModelConfig& config, int64_t seq,
                                                         const std::string& what) {
  if (!config.sparse_attention) return std::optional<kernels::BlockLayout>();
  const kernels::SparsityConfig& c = *config.sparse_attention;
  const int64_t positions = config.n_positions();
  const int64_t context = (positions + c.block - 1) / c.block * c.block;  // whole blocks
  const std::string rows = what + ": rows of " + std::to_string(seq) + " tokens";
  if (c.block < 1 || seq < 1 || seq % c.block != 0)
    return Status::invalid_argument(rows,
                                    "whole blocks of the sparse layout (block: " + std::to_string(c.block) + " tokens)",
                                    c.block < 1 || seq < 1 ? std::to_string(seq)
                                                           : std::to_string(seq / c.block) + " blocks and " +
                                                                 std::to_string(seq % c.block) + " tokens over");
  if (seq > context)
    return Status::invalid_argument(rows,
                                    "at most the model's context (" + std::to_string(positions) +
                                        " positions, whole blocks of " + std::to_string(c.block) + ": " +
                                        std::to_string(context) + ")",
                                    std::to_string(seq));
  Result<kernels::BlockLayout> master = kernels::make_layout(c, context);
  if (!master.is_ok()) return master.status().with_context(what + ": sparse layout");
  ASPEN_ASSIGN_OR_RETURN(kernels::BlockLayout l, kernels::layout_prefix(*master, seq / c.block));
  return std::optional<kernels::BlockLayout>(std::move(l));
}

Result<ModelConfig> load_config(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(const std::string text, read_regular_file(path, kMaxTextFileBytes));
  return parse_config(text, path);
}

}  // namespace aspen::models
