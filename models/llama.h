// models/llama.h: the Llama family's graph (Hugging Face LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM), built from the blocks of
// models/blocks.h.
//
//   graph::Graph g;
//   graph::Builder b(g);
//   ASPEN_ASSIGN_OR_RETURN(LlamaGraph m, build_llama(b, LlamaConfig::tiny(), {.batch = 1, .seq = 64}));
//
// The graph, as Hugging Face's modeling_llama computes it (dropout off):
//   x = embed_tokens[input_ids]                                   (no position embedding: rotary)
//   per layer i:  h = input_layernorm(x)                          (RMSNorm: x / sqrt(mean(x²) + eps) * w)
//                 q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
//                     q [B, T, n_head * head_dim], k and v [B, T, n_kv_head * head_dim]
//                 rotary on every channel of each head of q and k, half-split pairs (HF rotate_half),
//                     inv_freq from rope_theta and rope_scaling (default, linear, llama3, dynamic)
//                 grouped-query attention: query head h reads kv head h / (n_head / n_kv_head) (no copy),
//                     causal, or causal within sliding_window keys (Mistral), scale 1/sqrt(head_dim)
//                 x = x + o_proj(heads) (+bo)
//                 x = x + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = post_attention_layernorm(x)
//   logits = lm_head(norm(x))                     (lm_head tied to embed_tokens when tie_word_embeddings)
//   loss = mean cross_entropy(logits [B*T, V], targets [B*T])    (no shift, as the other families)
//
// The variants are settings, not code: Llama 2/3 (attention_bias, mlp_bias, rope_scaling), Mistral
// (sliding_window on every layer), Qwen2 (q/k/v biases without an o bias).
//
// Parameter names are Hugging Face's (a checkpoint loads by name), [out, in] (nn.Linear):
//   model.embed_tokens.weight                                  [vocab, d_model]
//   model.layers.{i}.input_layernorm.weight                    [d_model]
//   model.layers.{i}.self_attn.q_proj.{weight,bias}            [n_head*head_dim, d_model]
//   model.layers.{i}.self_attn.{k,v}_proj.{weight,bias}        [n_kv_head*head_dim, d_model]
//   model.layers.{i}.self_attn.o_proj.{weight,bias}            [d_model, n_head*head_dim]
//   model.layers.{i}.post_attention_layernorm.weight           [d_model]
//   model.layers.{i}.mlp.{gate,up}_proj.weight                 [d_ff, d_model]
//   model.layers.{i}.mlp.down_proj.weight                      [d_model, d_ff]
//   model.norm.weight                                          [d_model]
//   lm_head.weight                                             [vocab, d_model] (absent when tied)
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/builder.h"
#include "models/blocks.h"

namespace aspen::models {

struct LlamaConfig {
  int64_t vocab = 32000, n_positions = 4096, d_model = 4096, n_layer = 32, n_head = 32,
          n_kv_head = 0 /*0: n_head*/, head_dim = 0 /*0: d_model / n_head*/, d_ff = 11008;
  double rms_norm_eps = 1e-6;
  RopeSpec rope = {};
  bool tie_word_embeddings = false;
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  int64_t sliding_window = 0;  // 0: none; else every layer attends the last sliding_window keys (Mistral)
  DType dtype = DType::f32;

  // Llama-2-7B's shape (the defaults above).
  static LlamaConfig llama2_7b() { return LlamaConfig{}; }
  // A tiny random configuration for tests: grouped-query attention, every dimension distinct.
  static LlamaConfig tiny() {
    return LlamaConfig{.vocab = 37, .n_positions = 16, .d_model = 24, .n_layer = 2, .n_head = 4, .n_kv_head = 2,
                       .head_dim = 0, .d_ff = 40};
  }

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // The longest sequence: n_positions (max_position_embeddings), or with dynamic rope scaling, which exists
  // to run past it, n_positions * factor.
  int64_t context() const {
    return rope.scaling == "dynamic" ? int64_t(double(n_positions) * rope.factor) : n_positions;
  }
  int64_t head_size() const { return head_dim > 0 ? head_dim : (n_head > 0 ? d_model / n_head : 0); }
  // Every key in range: a Status naming the key ("llama config: n_kv_head"),
  // what was expected and what was found.
  Status validate() const;
};

struct LlamaGraph {
  graph::ValueId input_ids, positions, logits;
  graph::ValueId attention_mask;  // invalid unless built with options.attention_mask
  graph::ValueId loss;            // invalid unless built with_loss
  graph::ValueId targets;         // invalid unless built with_loss
};

// Records the forward graph for fixed [batch, seq], with the inputs and
// outputs of the other causal LMs (models/gpt2.h): "input_ids", "positions"
// i32 [batch, seq] (+ "attention_mask", "targets", the KV cache's inputs) ->
// "logits" (+ "loss", "last_hidden_state"). The KV cache holds n_kv_head
// heads per layer ([batch, n_kv_head, kv_cache_len, head_dim]). Tensor
// parallel splits the query and kv heads (both must divide by the shards)
// and the MLP's units, and with vocab_parallel the rows of embed_tokens and
// of an untied lm_head (models/tensor_parallel.h). A bad config or shape is
// a Status; so is the builder's first error.
Result<LlamaGraph> build_llama(graph::Builder& b, const LlamaConfig& c, const CausalLmOptions& options);

}  // namespace aspen::models
