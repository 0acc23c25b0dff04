// models/blocks.h: the small graph builders every model family is made of.
//
// Each block records its parameters under the Hugging Face names it is given
// and relies on the Builder's sticky errors: model code calls blocks one after
// another and checks b.status() once at the end. The families (gpt2.h,
// gptj.h, bert.h) differ only in how they wire these blocks:
//   GPT-2: Conv1D weights (WeightLayout::in_out), fused c_attn sliced into
//          q, k, v, gelu_new, pre-LN, learned positions;
//   GPT-J: nn.Linear weights, rotary on q and k, parallel residual;
//   BERT:  nn.Linear weights with biases, erf GELU, no causal mask, post-LN.
//
// Thread-safety: builders record into the caller's Graph; one thread per Builder.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/builder.h"
#include "kernels/attention_layout.h"

namespace aspen::models {

// How a checkpoint stores a projection's weight.
enum class WeightLayout {
  out_in,  // [out, in]: torch.nn.Linear (GPT-J, BERT); read with trans_b
  in_out,  // [in, out]: GPT-2's Conv1D
};

// NOTE [quantized linears]: weights kept in llama.cpp's blocks (a GGUF file's Q8_0 / Q4_0 / Q4_K matrices): by
// parameter name ("<name>.weight"), the format (the graph's matmul_q: "q8_0", "q4_0", "q4_k"). Such a weight
// is a u8 parameter [out, in / block · block bytes], rows of blocks as GGUF stores them, whatever the family's
// float layout; linear() multiplies by it with matmul_q (f32 activations; inference only).
struct QuantizedWeights {
  std::map<std::string, std::string> format;
  const std::string* find(const std::string& weight) const {
    auto it = format.find(weight);
    return it == format.end() ? nullptr : &it->second;
  }
};
// Bytes per row of `in` values in `format` (0 for an unknown format or an in that is not whole blocks).
int64_t quantized_row_bytes(const std::string& format, int64_t in);

// y = x W (+ bias) over x's last axis: x [..., in] -> [..., out]. Parameters
// "<name>.weight" (in `dtype`) and, with bias, "<name>.bias" [out] (in x's
// dtype: bf16 weights under f32 activations keep f32 biases).
graph::ValueId linear(graph::Builder& b, graph::ValueId x, const std::string& name, int64_t in, int64_t out, bool bias,
                      DType dtype, WeightLayout layout = WeightLayout::out_in,
                      const QuantizedWeights* quantized = nullptr);

// LayerNorm over the last axis (C) with "<name>.weight" and "<name>.bias" [C].
// Returns y (the saved statistics stay in the graph for the backward pass).
graph::ValueId layer_norm(graph::Builder& b, graph::ValueId x, const std::string& name, int64_t C, double eps,
                          DType dtype);
// RMSNorm over the last axis (C) with "<name>.weight" [C]: x / sqrt(mean(x²) + eps) * weight.
graph::ValueId rms_norm(graph::Builder& b, graph::ValueId x, const std::string& name, int64_t C, double eps,
                        DType dtype);

// T5's relative position bias: the trainable `table` [num_buckets, H] gathered
// by kernels::t5_relative_buckets(T, S, kv_offset, bidirectional, num_buckets,
// max_distance) into [1, H, T, S], the attention op's bias input (its
// gradient reaches the table through the gather). Errors as the buckets'.
Result<graph::ValueId> t5_relative_bias(graph::Builder& b, graph::ValueId table, int64_t T, int64_t S,
                                        int64_t kv_offset, bool bidirectional, int64_t max_distance);

enum class Activation {
  gelu_tanh,  // HF "gelu_new" (GPT-2, GPT-J)
  gelu_erf,   // HF "gelu" (BERT)
};

struct MlpSpec {
  std::string fc_in, fc_out;  // parameter name prefixes, e.g. "transformer.h.0.mlp.fc_in"
  int64_t d_model = 0, d_ff = 0;
  Activation activation = Activation::gelu_tanh;
  bool bias = true;
  WeightLayout layout = WeightLayout::out_in;
  std::optional<DType> weight_dtype = {};  // the matrices' dtype; unset: x's
  const QuantizedWeights* quantized = nullptr;  // NOTE [quantized linears]
};
// fc_out(act(fc_in(x))): x [..., d_model] -> [..., d_model].
graph::ValueId mlp(graph::Builder& b, graph::ValueId x, const MlpSpec& spec);

// Rotary frequencies as Hugging Face's rope_parameters give them (the rotary
// op's base and scaling attributes; graph/ops_nn.cc).
struct RopeSpec {
  double theta = 10000.0;
  std::string scaling = "none";  // "none", "linear", "llama3" or "dynamic" (original_max_positions: the model's)
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct AttentionSpec {
  int64_t n_head = 0, head_dim = 0;
  int64_t n_kv_head = 0;                      // key/value heads (grouped-query attention); 0: n_head
  std::string mask = "causal";                // "causal" (decoders) or "none" (encoders)
  int64_t window = 0;                         // with "causal": > 0 attends the last `window` keys only
  int64_t rotary_dim = 0;                     // 0: no rotary embedding
  std::string rotary_layout = "interleaved";  // "interleaved" (GPT-J) or "half_split" (NeoX, Llama)
  RopeSpec rope = {};
  // Dropout on the attention probabilities (training): the op's dropout with Philox stream dropout_stream
  // (the layer's index: every layer its own pattern) under the run-time dropout_seed (attention_core's).
  double dropout = 0.0;
  int64_t dropout_stream = 0;
  // This spec with dropout p drawn from layer `layer`'s stream.
  AttentionSpec with_dropout(double p, int64_t layer) const {
    AttentionSpec s = *this;
    s.dropout = p;
    s.dropout_stream = layer;
    return s;
  }
};
// Multi-head attention on projected q [B, T, H*D] and k, v [B, T, Hk*D]
// (Hk = n_kv_head dividing H; the attention op reads the shared heads in
// place): splits heads, applies rotary to q and k when spec.rotary_dim > 0
// (positions i32 [B, T] required then), attends with scale 1/sqrt(D) and the
// spec's mask (key_valid u8/bool [B, T] optional: padding), and merges heads
// back to [B, T, H*D]. The output projection is the caller's (a linear()).
//
// With a KV cache (generation): the new keys and values [B, Hk, T, D] are
// written into the cache parameters (`cache->key`, `cache->value`,
// [B, Hk, len, D]) at the run-time position `cache->index` (i32[]), the cache
// is updated (in place), and the queries attend the whole cache, masked by
// key_valid [B, len] (required then): mask "none" for one new position,
// causal for several (which must then be written at index 0: a prefill). A
// sliding window in decoding is the caller's key_valid (the generator clears
// the slots that fell out of it).
struct KvCacheSpec {
  std::string key, value;  // parameter names ("state." + ...: not weights, see kStatePrefix)
  int64_t len = 0;
  graph::ValueId index;
  // With a layout: the model's whole layout (u8 [1 or H, N, N], N * layout_block >= len) looked up by each
  // row's positions, the queries' (i32 [B, T]) and the cache slots' (i32 [B, len]; a left-padded row's slot
  // j is position j - its padding), since a cache slot is not a position (graph/ops_attention.cc's
  // layout_positions).
  int64_t layout_block = 0;
  std::optional<graph::ValueId> query_positions, key_positions;
};
// segments (i32 [B, T], optional, no cache): packed documents, attended
// block-diagonally (graph/ops_attention.cc). layout (u8 [1 or H, T/block,
// T/block], optional; see causal_lm_inputs): a block-sparse layout; with a
// cache the model's whole layout, looked up by positions (KvCacheSpec).
// A Megatron tensor shard's place among the model's heads, for attention dropout: `index` (i32 [], the
// shard's; a run-time state, every shard runs one graph) and `heads` (the model's).
struct DropoutShard {
  graph::ValueId index;
  int64_t heads = 0;
};
// f() with the nodes it records in scope `path` (NOTE [name scopes]; models: the HF module path).
template <class F>
auto in_scope(graph::Builder& b, std::string_view path, F&& f) {
  const auto scope = graph::Builder::Scope::at(b, path);
  return f();
}

graph::ValueId attention_core(graph::Builder& b, graph::ValueId q, graph::ValueId k, graph::ValueId v,
                              const AttentionSpec& spec, std::optional<graph::ValueId> positions = std::nullopt,
                              std::optional<graph::ValueId> key_valid = std::nullopt,
                              const KvCacheSpec* cache = nullptr,
                              std::optional<graph::ValueId> segments = std::nullopt,
                              std::optional<graph::ValueId> layout = std::nullopt,
                              std::optional<graph::ValueId> dropout_seed = std::nullopt,
                              const DropoutShard* dropout_shard = nullptr);

// Parameters named with this prefix are a program's state (KV caches), not
// weights: checkpoints neither hold nor fill them; they start at zero.
inline constexpr const char* kStatePrefix = "state.";

// The mean cross-entropy of logits [B, T, V] against targets i32 [B*T] (no
// shift: targets[b*T + t] is the id to predict at (b, t)). Rank 0.
graph::ValueId lm_loss(graph::Builder& b, graph::ValueId logits, graph::ValueId targets);

// What a causal language model's graph is built for (GPT-2, GPT-J).
struct CausalLmOptions {
  int64_t batch = 1, seq = 1;
  bool with_loss = false;       // input "targets" i32 [batch*seq], output "loss" (rank 0)
  bool attention_mask = false;  // input "attention_mask" u8 [batch, seq]: 1 = token, 0 = padding (a key never attended)
  // Packed sequences: input "segments" i32 [batch, seq], non-decreasing document ids along each row; a token
  // attends only earlier tokens of its own document (block-diagonal causal mask). Positions stay an input:
  // the caller restarts them at each document. Not with a KV cache.
  bool segments = false;
  // Sparse attention: DeepSpeed's block layout for seq tokens (kernels/attention_layout.h; blocks * block ==
  // seq; one layout, or one per head of the model), a constant of the graph on top of the causal mask. Not
  // per head with tensor_parallel > 1. With a KV cache: the layout of the model's context (blocks * block >=
  // kv_cache_len), and an input "key_positions" i32 [batch, kv_cache_len] (each cache slot's position; the
  // queries' are "positions"). Owned by the caller.
  const kernels::BlockLayout* layout = nullptr;
  bool last_hidden_state = false;  // output "last_hidden_state" [batch, seq, d_model]: ln_f's output (HF's last
                                   // hidden_states entry)
  // Generation (models/generate.h). kv_cache_len > 0: a KV cache of that many
  // positions per layer, parameters "state.cache.<layer>.key" / ".value"
  // [batch, n_head, kv_cache_len, head_dim]; inputs "cache_index" i32[] (where
  // the seq new positions go) and "key_valid" u8 [batch, kv_cache_len] (1 = a
  // written, non-padding position, the new ones included) replace
  // attention_mask. See KvCacheSpec for the masking.
  int64_t kv_cache_len = 0;
  // Logits of the last position only: "logits" [batch, 1, vocab] (with left
  // padding that is every row's newest token).
  bool last_logits_only = false;
  // The dtype of the matrices (projections, embedding tables, the LM head);
  // unset: the config's. bf16 under an f32 config: bf16 weights read by f32
  // activations (half the bytes a decode step streams; norms and biases stay
  // f32; NOTE [mixed matmul] in graph/ops_matmul.cc).
  std::optional<DType> weight_dtype = {};
  // Matrices kept in llama.cpp's blocks (NOTE [quantized linears]; GPT-2 or Llama from a GGUF file), not owned.
  const QuantizedWeights* quantized = nullptr;
  // > 1: the graph of one shard of a Megatron tensor-parallel layout over this
  // many devices (models/tensor_parallel.h): attention heads and the MLP's
  // hidden units split, all-reduces over group "tensor" after the row-parallel
  // projections. Every shard's graph is the same; the weights differ.
  int64_t tensor_parallel = 1;
  // With tensor_parallel > 1: the vocabulary split too (Megatron's
  // vocab-parallel embedding and cross-entropy, models/tensor_parallel.h):
  // each shard holds vocab / T rows of the (tied) embedding, its logits are
  // [.., vocab / T] and the loss is made from the shards' partial sums, so no
  // shard holds a whole row of logits. The vocabulary must divide by T.
  bool vocab_parallel = false;
  // Dropout on every layer's attention probabilities (training; [0, 1)): input "dropout_seed" i64 [1], a new
  // value per micro-batch (negative: no dropout, for evaluation with the same program); layer i draws Philox
  // stream i. Not with a KV cache. With tensor_parallel > 1 each shard draws the whole model's pattern for its
  // heads: the state kTensorShardIndexName (i32 []) holds its index, set by the runtime owner.
  double attention_dropout = 0.0;
};
// The state naming a tensor shard's index (i32 []), with attention dropout.
inline constexpr const char* kTensorShardIndexName = "state.tensor.shard";
// The inputs a causal LM's kv-cache options add (invalid without them).
struct KvCacheInputs {
  graph::ValueId index, key_valid;
  std::optional<graph::ValueId> query_positions, key_positions;  // with a layout: "positions", "key_positions"
  int64_t layout_block = 0;
};
// What every causal LM records from its options, in this order: "input_ids"
// and "positions" i32 [batch, seq]; "attention_mask" u8 [batch, seq];
// "targets" i32 [batch*seq] (with_loss); "segments" i32 [batch, seq]; "dropout_seed" i64 [1]
// (attention_dropout > 0);
// options.layout as a u8 constant, checked against the graph (blocks * block
// == seq, heads 1 or `n_head`, 1 with tensor_parallel > 1, no KV cache;
// errors name `family`); with a cache "cache_index" and "key_valid". The
// optional ones are invalid (or nullopt) when not asked for; key_valid is what
// attention_core reads as the keys' mask (the cache's, else attention_mask).
struct CausalLmInputs {
  graph::ValueId input_ids, positions, attention_mask, targets;
  std::optional<graph::ValueId> key_valid, segments, layout, dropout_seed;
  std::optional<DropoutShard> dropout_shard;  // attention dropout in a tensor shard (kTensorShardIndexName)
  KvCacheInputs kv;
};
Result<CausalLmInputs> causal_lm_inputs(graph::Builder& b, const std::string& family, const CausalLmOptions& options,
                                        int64_t n_head);
// A block layout for seq tokens as the attention op's constant input: blocks * block == seq, heads 1 or
// n_head (errors name "<family>: attention layout").
Result<graph::ValueId> layout_constant(graph::Builder& b, const std::string& family, const kernels::BlockLayout& l,
                                       int64_t seq, int64_t n_head);
// Input "dropout_seed" i64 [1] for attention dropout p in (0, 1) (errors name "<family>: attention_dropout").
Result<graph::ValueId> dropout_seed_input(graph::Builder& b, const std::string& family, double p);
// Layer i's cache spec ("state.cache.<i>.key" / ".value").
KvCacheSpec layer_cache(const KvCacheInputs& in, const CausalLmOptions& options, int64_t layer);
// Rows of an embedding table (any float dtype) as `dtype`: gather, then a cast when they differ.
graph::ValueId embed(graph::Builder& b, graph::ValueId table, graph::ValueId ids, DType dtype);
// x [B, T, C] -> [B, 1, C] (its last position) when options.last_logits_only; else x.
graph::ValueId logits_input(graph::Builder& b, graph::ValueId x, const CausalLmOptions& options);

// batch >= 1 and seq in [1, max_positions]: errors "<family>: batch" and
// "<family>: seq" (naming the config key that bounds seq).
Status check_batch_seq(const std::string& family, int64_t batch, int64_t seq, const std::string& positions_key,
                       int64_t max_positions);

// kv_cache_len is 0, or in [seq, max_positions] without attention_mask, segments or loss.
Status check_kv_cache(const std::string& family, const CausalLmOptions& options, const std::string& positions_key,
                      int64_t max_positions);
// "<family> config: <key>: expected <expected>, found <found>".
// Ceilings on a model's dimensions: far beyond any released model, and low
// enough that no shape, index or byte count of the graph overflows (token ids
// are i32; V*C and T*T stay far below 2^63). Checked by each family's
// validate() before anything is built or allocated.
inline constexpr int64_t kMaxVocab = (int64_t(1) << 31) - 1, kMaxPositions = int64_t(1) << 24,
                         kMaxModelDim = int64_t(1) << 17, kMaxFfDim = int64_t(1) << 20, kMaxLayers = 4096;
struct DimLimit {
  const char* key;
  int64_t value, max;
};
Status check_dim_limits(const std::string& family, std::initializer_list<DimLimit> dims);

Status config_key_error(const std::string& family, const std::string& key, const std::string& expected,
                        const std::string& found);

}  // namespace aspen::models
