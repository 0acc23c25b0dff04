// models/gptj.h: the GPT-J graph (Hugging Face GPTJForCausalLM), and the
// blocks it is made of.
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
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/builder.h"

namespace aspen::models {

// ---- blocks ------------------------------------------------------------------------
// Small builders shared by the model families: GPT-J uses them here, and
// GPT-2 and BERT (W1.3) are meant to reuse them as they are (GPT-2's Conv1D
// weights through WeightLayout::in_out and its fused c_attn through
// attention_core on slices; BERT's erf GELU, biased q/k/v and padding mask
// through MlpSpec and AttentionSpec). They may move to models/blocks.h then.
// Each records parameters under the given Hugging Face names and relies on
// the Builder's sticky errors (check b.status() once at the end).

// How a checkpoint stores a projection's weight.
enum class WeightLayout {
  out_in,  // [out, in]: torch.nn.Linear (GPT-J, BERT); read with trans_b
  in_out,  // [in, out]: GPT-2's Conv1D
};

// y = x W (+ bias) over x's last axis: x [..., in] -> [..., out]. Parameters
// "<name>.weight" and, with bias, "<name>.bias" [out].
graph::ValueId linear(graph::Builder& b, graph::ValueId x, const std::string& name, int64_t in, int64_t out, bool bias,
                      DType dtype, WeightLayout layout = WeightLayout::out_in);

// LayerNorm over the last axis (C) with "<name>.weight" and "<name>.bias" [C].
// Returns y (the saved statistics stay in the graph for the backward pass).
graph::ValueId layer_norm(graph::Builder& b, graph::ValueId x, const std::string& name, int64_t C, double eps,
                          DType dtype);

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
};
// fc_out(act(fc_in(x))): x [..., d_model] -> [..., d_model].
graph::ValueId mlp(graph::Builder& b, graph::ValueId x, const MlpSpec& spec);

struct AttentionSpec {
  int64_t n_head = 0, head_dim = 0;
  std::string mask = "causal";                // "causal" (decoders) or "none" (encoders)
  int64_t rotary_dim = 0;                     // 0: no rotary embedding
  std::string rotary_layout = "interleaved";  // "interleaved" (GPT-J) or "half_split" (NeoX, Llama)
  double rotary_base = 10000.0;
};
// Multi-head attention on projected q, k, v, each [B, T, H*D]: splits heads,
// applies rotary to q and k when spec.rotary_dim > 0 (positions i32 [B, T]
// required then), attends with scale 1/sqrt(D) and the spec's mask (key_valid
// u8/bool [B, T] optional: padding), and merges heads back to [B, T, H*D]. The
// output projection is the caller's (it is a linear()).
graph::ValueId attention_core(graph::Builder& b, graph::ValueId q, graph::ValueId k, graph::ValueId v,
                              const AttentionSpec& spec, std::optional<graph::ValueId> positions = std::nullopt,
                              std::optional<graph::ValueId> key_valid = std::nullopt);

// ---- GPT-J -------------------------------------------------------------------------

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
  graph::ValueId loss;     // invalid unless built with_loss
  graph::ValueId targets;  // invalid unless built with_loss
};

// Records the GPT-J forward graph for fixed [batch, seq]:
//   inputs  "input_ids" i32 [batch, seq], "positions" i32 [batch, seq]
//           (and with_loss "targets" i32 [batch*seq]),
//   outputs "logits" [batch, seq, vocab] (and with_loss "loss", rank 0).
// A bad config or shape is a Status; so is the builder's first error.
Result<GptjGraph> build_gptj(graph::Builder& b, const GptjConfig& c, int64_t batch, int64_t seq, bool with_loss);

}  // namespace aspen::models
