// models/gptj.h: the GPT-J graph (Hugging Face GPTJForCausalLM), built from
// the blocks of models/blocks.h.
//
//   graph::Graph g;
//   graph::Builder b(g);
//   ASPEN_ASSIGN_OR_RETURN(GptjGraph m, build_gptj(b, GptjConfig::gptj_6b(), /*batch=*/1, /*seq=*/1024,
//                                                  /*with_loss=*/true));
//
// The graph, as Hugging Face's modeling_gptj computes it (dropout off):
//   x = wte[input_ids]                                      (no position embedding: rotary instead)
//   per layer i:  h = ln_1(x)
//                 x = (attn(h) + mlp(h)) + x                (parallel residual, one LayerNorm)
//   attn(h):      q, k, v = h Wq^T, h Wk^T, h Wv^T          (no biases), split into [B, T, H, D]
//                 rotary on the first rotary_dim channels of each head of q and k, interleaved pairs
//                 (HF rotate_every_two), angle = position * 10000^(-2p / rotary_dim)
//                 causal attention, scale 1/sqrt(D); heads merged; out_proj (no bias)
//   mlp(h):       fc_out(gelu_new(fc_in(h)))                (gelu_new: the tanh form)
//   logits = lm_head(ln_f(x))                               (lm_head has a bias)
//   loss = mean cross_entropy(logits [B*T, V], targets [B*T])
//
// The loss does not shift: targets[b*T + t] is the id to predict at (b, t),
// so a caller training a language model passes input_ids shifted by one (HF
// shifts inside the model; aspen leaves it to the data pipeline).
//
// Parameter names are Hugging Face's (a GPT-J checkpoint loads by name):
//   transformer.wte.weight                           [vocab, d_model]
//   transformer.h.{i}.ln_1.{weight,bias}             [d_model]
//   transformer.h.{i}.attn.{q,k,v,out}_proj.weight   [d_model, d_model]
//   transformer.h.{i}.mlp.fc_in.{weight,bias}        [d_ff, d_model], [d_ff]
//   transformer.h.{i}.mlp.fc_out.{weight,bias}       [d_model, d_ff], [d_model]
//   transformer.ln_f.{weight,bias}                   [d_model]
//   lm_head.{weight,bias}                            [vocab, d_model], [vocab]
// Weights are stored as Hugging Face stores them, [out, in] (nn.Linear); the
// matmuls read them with trans_b.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/builder.h"
#include "models/blocks.h"

namespace aspen::models {

struct GptjConfig {
  int64_t vocab = 50400, n_positions = 2048, d_model = 4096, n_layer = 28, n_head = 16, rotary_dim = 64,
          d_ff = 0 /*0: 4*d_model*/;
  double layer_norm_eps = 1e-5;
  DType dtype = DType::f32;

  // EleutherAI/gpt-j-6b (the defaults above).
  static GptjConfig gptj_6b() { return GptjConfig{}; }
  // A tiny random configuration for tests: every dimension distinct, partial rotary.
  static GptjConfig tiny() {
    return GptjConfig{
        .vocab = 37, .n_positions = 16, .d_model = 24, .n_layer = 2, .n_head = 3, .rotary_dim = 4, .d_ff = 0};
  }

  int64_t head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  int64_t ff_dim() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  // Every key in range: a Status naming the key ("gptj config: rotary_dim"),
  // what was expected and what was found.
  Status validate() const;
};

struct GptjGraph {
  graph::ValueId input_ids, positions, logits;
  graph::ValueId attention_mask;  // invalid unless built with options.attention_mask
  graph::ValueId loss;     // invalid unless built with_loss
  graph::ValueId targets;  // invalid unless built with_loss
};

// Records the GPT-J forward graph for fixed [batch, seq]:
//   inputs  "input_ids" i32 [batch, seq], "positions" i32 [batch, seq]
//           (with_loss: "targets" i32 [batch*seq]; attention_mask:
//           "attention_mask" u8 [batch, seq], 0 marks padding keys),
//   outputs "logits" [batch, seq, vocab] (with_loss: "loss", rank 0; last_hidden_state: "last_hidden_state").
// A bad config or shape is a Status; so is the builder's first error.
Result<GptjGraph> build_gptj(graph::Builder& b, const GptjConfig& c, const CausalLmOptions& options);
inline Result<GptjGraph> build_gptj(graph::Builder& b, const GptjConfig& c, int64_t batch, int64_t seq,
                                    bool with_loss) {
  return build_gptj(b, c, CausalLmOptions{.batch = batch, .seq = seq, .with_loss = with_loss});
}

}  // namespace aspen::models
