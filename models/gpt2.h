// models/gpt2.h: the GPT-2 graph (Hugging Face GPT2LMHeadModel), built from
// the blocks of models/blocks.h.
//
//   graph::Graph g;
//   graph::Builder b(g);
//   ASPEN_ASSIGN_OR_RETURN(Gpt2Graph m, build_gpt2(b, Gpt2Config::gpt2_small(), {.batch = 1, .seq = 1024}));
//
// The graph, as Hugging Face's modeling_gpt2 computes it (eval mode, dropout off):
//   x = wte[input_ids] + wpe[positions]                  (learned positions, given as an input so that
//                                                         left-padded rows can start counting at their first token)
//   per layer i:  x = x + attn(ln_1(x))                   (pre-LN, sequential residuals)
//                 x = x + mlp(ln_2(x))
//   attn(h):      q, k, v = split(h W_attn + b_attn)      (one fused Conv1D c_attn, sliced in three)
//                 causal attention, scale 1/sqrt(D), padding keys masked when attention_mask is given;
//                 heads merged; c_proj (Conv1D with bias)
//   mlp(h):       c_proj(gelu_new(c_fc(h)))
//   logits = ln_f(x) wte^T                               (lm_head tied to wte), or lm_head.weight untied
//   loss = mean cross_entropy(logits [B*T, V], targets [B*T])   (no shift, as GPT-J)
//
// Parameter names are Hugging Face's:
//   transformer.wte.weight                       [vocab, d_model]
//   transformer.wpe.weight                       [n_positions, d_model]
//   transformer.h.{i}.ln_{1,2}.{weight,bias}     [d_model]
//   transformer.h.{i}.attn.c_attn.weight         [d_model, 3 d_model]   (Conv1D: [in, out])
//   transformer.h.{i}.attn.c_attn.bias           [3 d_model]
//   transformer.h.{i}.attn.c_proj.{weight,bias}  [d_model, d_model], [d_model]
//   transformer.h.{i}.mlp.c_fc.{weight,bias}     [d_model, d_ff], [d_ff]
//   transformer.h.{i}.mlp.c_proj.{weight,bias}   [d_ff, d_model], [d_model]
//   transformer.ln_f.{weight,bias}               [d_model]
//   lm_head.weight                               [vocab, d_model]   (only when tie_word_embeddings is false)
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/builder.h"
#include "models/blocks.h"

namespace aspen::models {

struct Gpt2Config {
  int64_t vocab = 50257, n_positions = 1024, d_model = 768, n_layer = 12, n_head = 12, d_ff = 0 /*0: 4*d_model*/;
  double layer_norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  DType dtype = DType::f32;

  // openai-community/gpt2 (the defaults above).
  static Gpt2Config gpt2_small() { return Gpt2Config{}; }
  // A tiny random configuration for tests: every dimension distinct.
  static Gpt2Config tiny() {
    return Gpt2Config{.vocab = 41, .n_positions = 11, .d_model = 18, .n_layer = 2, .n_head = 3, .d_ff = 22};
  }

  int64_t head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  int64_t ff_dim() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  // Every key in range: a Status naming the key ("gpt2 config: n_head"),
  // what was expected and what was found.
  Status validate() const;
};

struct Gpt2Graph {
  graph::ValueId input_ids, positions, logits;
  graph::ValueId attention_mask;  // invalid unless built with options.attention_mask
  graph::ValueId loss, targets;   // invalid unless built with options.with_loss
};

// Records the GPT-2 forward graph for fixed [batch, seq]:
//   inputs  "input_ids" i32 [batch, seq], "positions" i32 [batch, seq] (each < n_positions)
//           (with_loss: "targets" i32 [batch*seq]; attention_mask: "attention_mask" u8 [batch, seq]),
//   outputs "logits" [batch, seq, vocab] (with_loss: "loss", rank 0; last_hidden_state: "last_hidden_state").
// A bad config or shape is a Status; so is the builder's first error.
Result<Gpt2Graph> build_gpt2(graph::Builder& b, const Gpt2Config& c, const CausalLmOptions& options);

}  // namespace aspen::models
