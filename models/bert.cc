#include "models/bert.h"

#include <cmath>
#include <optional>
#include <string>

namespace aspen::models {

using graph::Builder;
using graph::ValueId;

Status BertConfig::validate() const {
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab", vocab},     {"type_vocab", type_vocab}, {"max_positions", max_positions}, {"d_model", d_model},
      {"n_layer", n_layer}, {"n_head", n_head},         {"d_ff", d_ff}};
  for (const auto& [key, v] : positive)
    if (v <= 0) return config_key_error("bert", key, "a number > 0", std::to_string(v));
  ASPEN_RETURN_IF_ERROR(check_dim_limits("bert", {{"vocab", vocab, kMaxVocab},
                                                  {"type_vocab", type_vocab, kMaxVocab},
                                                  {"max_positions", max_positions, kMaxPositions},
                                                  {"d_model", d_model, kMaxModelDim},
                                                  {"n_layer", n_layer, kMaxLayers},
                                                  {"d_ff", d_ff, kMaxFfDim}}));
  if (d_model % n_head != 0)
    return config_key_error("bert", "d_model", "a multiple of n_head (" + std::to_string(n_head) + ")",
                            std::to_string(d_model));
  if (!std::isfinite(layer_norm_eps) || layer_norm_eps < 0)
    return config_key_error("bert", "layer_norm_eps", "a finite number >= 0", std::to_string(layer_norm_eps));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return config_key_error("bert", "dtype", "f32, bf16 or f16", std::string(dtype_name(dtype)));
  return Status();
}

int64_t default_mlm_predictions(int64_t seq, double probability) {
  const double T = double(seq), p = probability;
  const int64_t k = int64_t(std::ceil(p * T + 6.0 * std::sqrt(T * p * (1.0 - p)))) + 1;
  return k >= seq ? 0 : k;
}

int64_t gather_mlm_predictions(const int32_t* targets, int64_t B, int64_t T, int64_t K, int32_t* positions,
                               int32_t* kept) {
  constexpr int32_t kIgnore = -100;  // HF's ignored label
  int64_t dropped = 0;
  for (int64_t r = 0; r < B; ++r) {
    int64_t k = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (targets[r * T + t] == kIgnore) continue;
      if (k == K) {
        ++dropped;
        continue;
      }
      positions[r * K + k] = int32_t(r * T + t);
      kept[r * K + k++] = targets[r * T + t];
    }
    for (; k < K; ++k) {
      positions[r * K + k] = int32_t(r * T);
      kept[r * K + k] = kIgnore;
    }
  }
  return dropped;
}

Result<BertGraph> build_bert(Builder& b, const BertConfig& c, const BertOptions& o) {
  ASPEN_RETURN_IF_ERROR(c.validate());
  ASPEN_RETURN_IF_ERROR(check_batch_seq("bert", o.batch, o.seq, "max_positions", c.max_positions));
  const DType dt = c.dtype;
  const int64_t B = o.batch, T = o.seq, C = c.d_model;
  const double eps = c.layer_norm_eps;
  BertGraph m;
  m.input_ids = b.input("input_ids", DType::i32, Shape{B, T});
  m.token_type_ids = b.input("token_type_ids", DType::i32, Shape{B, T});
  m.attention_mask = b.input("attention_mask", DType::u8, Shape{B, T});
  if (o.with_loss && !o.mlm_head)
    return Status::invalid_argument("bert: with_loss", "the MLM head (mlm_head) to train", "no head");
  const int64_t K = o.mlm_predictions;
  if (K < 0 || K > T || (K > 0 && !o.with_loss))
    return Status::invalid_argument("bert: mlm_predictions", "0, or 1 to seq = " + std::to_string(T) + " with with_loss",
                                    std::to_string(K));
  if (o.with_loss) m.targets = b.input("targets", DType::i32, Shape{B * (K > 0 ? K : T)});
  if (K > 0) m.mlm_positions = b.input("mlm_positions", DType::i32, Shape{B * K});
  std::optional<ValueId> layout, seed;
  if (o.layout) {
    ASPEN_ASSIGN_OR_RETURN(layout, layout_constant(b, "bert", *o.layout, T, c.n_head));
  }
  if (o.attention_dropout != 0) {
    ASPEN_ASSIGN_OR_RETURN(m.dropout_seed, dropout_seed_input(b, "bert", o.attention_dropout));
    seed = m.dropout_seed;
  }

  // Embeddings: (word + token_type) + position, then LayerNorm (HF's order of additions).
  b.set_scope("embeddings");  // NOTE [name scopes]
  const ValueId word = b.parameter("embeddings.word_embeddings.weight", dt, Shape{c.vocab, C});
  ValueId x = b.add(b.gather(word, m.input_ids),
                    b.gather(b.parameter("embeddings.token_type_embeddings.weight", dt, Shape{c.type_vocab, C}),
                             m.token_type_ids));
  ValueId pos = b.slice(b.parameter("embeddings.position_embeddings.weight", dt, Shape{c.max_positions, C}), 0, 0, T);
  x = layer_norm(b, b.add(x, b.broadcast(pos, {B, T, C})), "embeddings.LayerNorm", C, eps, dt);
  b.set_scope({});

  const AttentionSpec attn{.n_head = c.n_head, .head_dim = c.head_dim(), .mask = "none"};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "encoder.layer." + std::to_string(i) + ".";
    const auto layer = graph::Builder::Scope::at(b, p.substr(0, p.size() - 1));  // NOTE [name scopes]
    ValueId q = linear(b, x, p + "attention.self.query", C, C, /*bias=*/true, dt);
    ValueId k = linear(b, x, p + "attention.self.key", C, C, true, dt);
    ValueId v = linear(b, x, p + "attention.self.value", C, C, true, dt);
    const ValueId heads = in_scope(b, p + "attention.self", [&] {
      return attention_core(b, q, k, v, attn.with_dropout(o.attention_dropout, i), std::nullopt, m.attention_mask,
                            nullptr, std::nullopt, layout, seed);
    });
    ValueId a = linear(b, heads, p + "attention.output.dense", C, C, true, dt);
    x = layer_norm(b, b.add(a, x), p + "attention.output.LayerNorm", C, eps, dt);
    ValueId f = mlp(b, x,
                    {.fc_in = p + "intermediate.dense",
                     .fc_out = p + "output.dense",
                     .d_model = C,
                     .d_ff = c.d_ff,
                     .activation = c.activation});
    x = layer_norm(b, b.add(f, x), p + "output.LayerNorm", C, eps, dt);
  }
  m.last_hidden_state = x;
  b.output("last_hidden_state", x);

  if (o.pooler) {
    ValueId cls = b.reshape(b.slice(x, 1, 0, 1), {B, C});  // [B, C]: the first token of each row
    m.pooler_output = b.tanh(linear(b, cls, "pooler.dense", C, C, true, dt));
    b.output("pooler_output", m.pooler_output);
  }
  if (o.sentence_embedding) {
    // sentence-transformers: mean over the tokens the mask keeps, then x / ||x||_2.
    const auto pooling = graph::Builder::Scope::at(b, "pooling");
    ValueId mask = b.cast(m.attention_mask, dt);                                   // [B, T]
    ValueId kept = b.mul(x, b.broadcast(b.reshape(mask, {B, T, 1}), {B, T, C}));  // [B, T, C]
    ValueId count = b.broadcast(b.reduce_sum(mask, {1}, /*keepdims=*/true), {B, C});
    ValueId mean = b.div(b.reduce_sum(kept, {1}), count);  // [B, C]
    ValueId norm = b.sqrt(b.reduce_sum(b.mul(mean, mean), {1}, /*keepdims=*/true));
    m.sentence_embedding = b.div(mean, b.broadcast(norm, {B, C}));
    b.output("sentence_embedding", m.sentence_embedding);
  }
  if (o.mlm_head) {  // BertOnlyMLMHead: transform, then the decoder tied to the word embeddings
    const int64_t rows = K > 0 ? K : T;  // the head's rows per example
    const auto head = graph::Builder::Scope::at(b, "cls.predictions");
    ValueId in = b.reshape(x, {B * T, C});
    if (K > 0) in = b.gather(in, m.mlm_positions);  // [B * K, C]: the predicted tokens only
    ValueId h = linear(b, in, "cls.predictions.transform.dense", C, C, true, dt);
    h = layer_norm(b, b.gelu(h, /*tanh_form=*/c.activation == Activation::gelu_tanh),
                   "cls.predictions.transform.LayerNorm", C, eps, dt);
    const ValueId bias = b.parameter("cls.predictions.bias", dt, Shape{c.vocab});
    m.logits = b.op1(graph::OpKind::matmul, {h, word, bias}, {{"trans_b", int64_t(1)}});
    if (o.with_loss) {
      m.loss = b.op(graph::OpKind::cross_entropy, {m.logits, m.targets})[0];  // -100: HF's ignored labels
      b.output("loss", m.loss);
    }
    m.logits = b.reshape(m.logits, {B, rows, c.vocab});
    b.output("logits", m.logits);
  }
  ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context("bert"));
  return m;
}

}  // namespace aspen::models
