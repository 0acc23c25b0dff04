// models/config.h: a model's configuration from a Hugging Face config.json.
//
//   ASPEN_ASSIGN_OR_RETURN(ModelConfig c, load_config("gpt2/config.json"));
//   if (const Gpt2Config* g = c.gpt2()) ...
//
// load_config dispatches on "model_type" ("gpt2", "gptj", "bert", and the
// Llama family: "llama", "mistral", "qwen2") and maps Hugging Face's key
// names onto the family's config (gpt2: n_embd -> d_model, n_inner -> d_ff,
// ...; bert and llama: hidden_size -> d_model, ...; see config.cc's readers).
// The Llama family reads rope_parameters (transformers 5) or rope_theta and
// rope_scaling (4.x): default, linear and llama3 scaling; dynamic, yarn and
// longrope are refused by name. The keys that size the model are required; the others take
// Hugging Face's defaults. Keys that do not change the forward pass in eval
// mode (dropout probabilities, architectures, dtype, transformers_version,
// initializer_range, generation settings, ...) are accepted silently; any
// other key is reported in unknown_keys and logged as a warning, since it may
// ask for behaviour this graph lacks. A setting the graphs cannot honour (an
// activation other than the family's GELU, relative position embeddings,
// GPT-2's scale_attn_by_inverse_layer_idx) is an error naming the key.
//
// Errors name the file, the key, what was expected and what was found.
// The graph dtype stays f32 (a caller choice, not the checkpoint's).
//
// to_hf_config_json is the inverse, for exporting a model: the config.json
// Hugging Face's transformers writes for the family (its key names, the
// architectures entry, torch_dtype float32), which parse_config reads back to
// the same family config and token ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "kernels/attention_layout.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "models/gptj.h"
#include "models/llama.h"

namespace aspen::models {

struct ModelConfig {
  std::string path;        // the config.json it was read from
  std::string model_type;  // "gpt2", "gptj", "bert", "llama", "mistral" or "qwen2"
  std::variant<Gpt2Config, GptjConfig, BertConfig, LlamaConfig> family;
  std::optional<int64_t> bos_token_id, pad_token_id;
  // The sparse attention layout the model was trained with (config.json's "aspen_sparse_attention", written
  // by aspen's export; DeepSpeed's sparsity config by its names, num_heads the model's); nullopt: dense.
  // Every program of the model attends through it (model_layout); transformers ignores the key.
  std::optional<kernels::SparsityConfig> sparse_attention;
  std::vector<int64_t> eos_token_ids;     // HF allows one id or a list
  std::vector<std::string> unknown_keys;  // sorted; logged as a warning when loaded

  const Gpt2Config* gpt2() const { return std::get_if<Gpt2Config>(&family); }
  const GptjConfig* gptj() const { return std::get_if<GptjConfig>(&family); }
  const BertConfig* bert() const { return std::get_if<BertConfig>(&family); }
  const LlamaConfig* llama() const { return std::get_if<LlamaConfig>(&family); }  // llama, mistral, qwen2
  // A causal language model (every family but bert): generation and training take it.
  bool causal_lm() const { return bert() == nullptr; }
  // Of whichever family: the vocabulary size, the longest context (n_positions, max_positions) and the
  // attention (query) heads.
  int64_t vocab() const;
  int64_t n_positions() const;
  int64_t n_head() const;
};

// The number of parameters the config describes, as a lower bound (the
// matrices and embeddings; biases and norms left out), in double so that no
// config overflows it. Checked against the weights on disk and against the
// machine's memory before a graph is built.
double min_parameter_count(const ModelConfig& config);

// InvalidArgument when `parameters` x `bytes_per_parameter` (the weights, and
// for training their gradients and optimizer state) exceeds this machine's
// physical memory: "<subject>: expected a model that fits in this machine's
// 23.4 GiB, found about 1.2 TiB for ..." naming `use`.
Status check_fits_memory(const std::string& subject, double parameters, double bytes_per_parameter,
                         const std::string& use);
// physical_memory_bytes() is in core/file.h.

// The layout a model with sparse_attention uses for rows of `seq` tokens (NOTE [model layouts] in
// config.cc): the first seq / block blocks of the layout made for its whole context (n_positions rounded up
// to a block), as DeepSpeed slices its master layout. nullopt for a dense model. InvalidArgument naming
// `what` when seq is not a multiple of the block or exceeds the context.
Result<std::optional<kernels::BlockLayout>> model_layout(const ModelConfig& config, int64_t seq,
                                                         const std::string& what);

// The model types load_config understands, in the order error messages list them.
const std::vector<std::string>& supported_model_types();

// Reads and parses `path`.
Result<ModelConfig> load_config(const std::string& path);
// Parses config.json text; `path` names it in errors and warnings.
Result<ModelConfig> parse_config(const std::string& json_text, const std::string& path);

// config.json text for the causal LMs (GPT2LMHeadModel, GPTJForCausalLM,
// LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM by model_type) and
// BERT with its masked-LM head (BertForMaskedLM). An absent bos, eos or pad id
// is written as null, not left to Hugging Face's family default (50256).
Result<std::string> to_hf_config_json(const ModelConfig& config);

}  // namespace aspen::models
