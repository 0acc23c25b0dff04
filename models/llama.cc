#include "models/llama.h"

#include <cmath>
#include <optional>
#include <vector>

#include "models/tensor_parallel.h"

namespace aspen::models {

using graph::Builder;
using graph::OpKind;
using graph::ValueId;

namespace {

Status bad_key(const std::string& key, const std::string& expected, const std::string& found) {
  return config_key_error("llama", key, expected, found);
}

}  // namespace

Status LlamaConfig::validate() const {
  const std::pair<const char*, int64_t> positive[] = {{"vocab", vocab},     {"n_positions", n_positions},
                                                      {"d_model", d_model}, {"n_layer", n_layer},
                                                      {"n_head", n_head},   {"d_ff", d_ff}};
  for (const auto& [key, v] : positive)
    if (v <= 0) return bad_key(key, "a number > 0", std::to_string(v));
  if (n_kv_head < 0) return bad_key("n_kv_head", "a number > 0, or 0 for n_head", std::to_string(n_kv_head));
  if (head_dim < 0) return bad_key("head_dim", "a number > 0, or 0 for d_model / n_head", std::to_string(head_dim));
  ASPEN_RETURN_IF_ERROR(check_dim_limits("llama", {{"vocab", vocab, kMaxVocab},
                                                   {"n_positions", n_positions, kMaxPositions},
                                                   {"d_model", d_model, kMaxModelDim},
                                                   {"n_layer", n_layer, kMaxLayers},
                                                   {"n_head", n_head, kMaxModelDim},
                                                   {"head_dim", head_dim, kMaxModelDim},
                                                   {"d_ff", d_ff, kMaxFfDim}}));
  if (head_dim == 0 && d_model % n_head != 0)
    return bad_key("d_model", "a multiple of n_head (" + std::to_string(n_head) + ") when head_dim is not given",
                   std::to_string(d_model));
  if (n_head % kv_heads() != 0)
    return bad_key("n_kv_head", "a divisor of n_head (" + std::to_string(n_head) + ")", std::to_string(n_kv_head));
  if (head_size() % 2 != 0) return bad_key("head_dim", "an even number (rotary pairs)", std::to_string(head_size()));
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps < 0)
    return bad_key("rms_norm_eps", "a finite number >= 0", std::to_string(rms_norm_eps));
  if (!(rope.theta > 0) || !std::isfinite(float(rope.theta)))
    return bad_key("rope_theta", "a number > 0, finite in f32", std::to_string(rope.theta));
  if (rope.scaling != "none" && rope.scaling != "linear" && rope.scaling != "llama3" && rope.scaling != "dynamic")
    return bad_key("rope_scaling", "none, linear, llama3 or dynamic", rope.scaling);
  if (rope.scaling == "dynamic" && (rope.original_max_positions != n_positions || !(rope.factor >= 1)))
    return bad_key("rope_scaling", "dynamic with factor >= 1 over max_position_embeddings (" +
                                       std::to_string(n_positions) + ")",
                   "factor " + std::to_string(rope.factor) + " over " + std::to_string(rope.original_max_positions));
  if (rope.scaling != "none" && !(rope.factor > 0 && std::isfinite(rope.factor)))
    return bad_key("rope_scaling.factor", "a finite number > 0", std::to_string(rope.factor));
  if (rope.scaling == "llama3" &&
      !(rope.low_freq_factor > 0 && rope.high_freq_factor > rope.low_freq_factor &&
        std::isfinite(rope.high_freq_factor) && rope.original_max_positions > 0))
    return bad_key("rope_scaling", "0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0",
                   std::to_string(rope.low_freq_factor) + ", " + std::to_string(rope.high_freq_factor) + ", " +
                       std::to_string(rope.original_max_positions));
  if (sliding_window < 0)
    return bad_key("sliding_window", "a number > 0, or 0 for none", std::to_string(sliding_window));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return bad_key("dtype", "f32, bf16 or f16", std::string(dtype_name(dtype)));
  return Status();
}

Result<LlamaGraph> build_llama(Builder& b, const LlamaConfig& c, const CausalLmOptions& o) {
  ASPEN_RETURN_IF_ERROR(c.validate());
  ASPEN_RETURN_IF_ERROR(check_batch_seq("llama", o.batch, o.seq, "n_positions", c.context()));
  ASPEN_RETURN_IF_ERROR(check_kv_cache("llama", o, "n_positions", c.context()));
  const DType dt = c.dtype, wdt = o.weight_dtype.value_or(dt);
  const int64_t C = c.d_model, D = c.head_size(), T = o.tensor_parallel;
  ASPEN_RETURN_IF_ERROR(check_tensor_parallel("llama", c.n_head, c.d_ff, c.vocab, o));
  if (T > 1 && c.kv_heads() % T != 0)
    return Status::invalid_argument("llama: tensor_parallel",
                                    "a divisor of n_kv_head = " + std::to_string(c.kv_heads()) + " (kv heads split)",
                                    std::to_string(T));
  // This shard's heads (all of them without tensor parallel) and MLP units.
  const int64_t H = c.n_head / T, Hk = c.kv_heads() / T, F = c.d_ff / T;
  // Vocab parallel (models/tensor_parallel.h): the shard's rows of embed_tokens (and of an untied lm_head).
  const bool vp = T > 1 && o.vocab_parallel;
  const int64_t V = vp ? c.vocab / T : c.vocab;
  // Row parallel: this shard's partial product summed over the shards, then the bias once.
  auto row_parallel = [&](ValueId x, const std::string& name, int64_t in, bool bias) {
    ValueId y = linear(b, x, name, in, C, /*bias=*/false, wdt, WeightLayout::out_in, o.quantized);
    if (T > 1)
      y = b.op1(OpKind::all_reduce, {y},
                {{"group", std::string("tensor")}, {"group_size", T}, {"reduce", std::string("sum")}});
    if (!bias) return y;
    const Shape ys = b.type(y).shape;
    return b.add(y, b.broadcast(b.parameter(name + ".bias", dt, Shape{C}), std::vector<int64_t>(ys.begin(), ys.end())));
  };

  ASPEN_ASSIGN_OR_RETURN(const CausalLmInputs in, causal_lm_inputs(b, "llama", o, c.n_head));
  LlamaGraph m;
  m.input_ids = in.input_ids;
  m.positions = in.positions;
  m.attention_mask = in.attention_mask;
  m.targets = in.targets;

  const ValueId embed_tokens = b.parameter("model.embed_tokens.weight", wdt, Shape{V, C});
  const ValueId offset = vp ? b.parameter(kVocabOffsetName, DType::i32, Shape{}) : ValueId{};
  ValueId x = in_scope(b, "model.embed_tokens", [&] {
    return vp ? vocab_parallel_embed(b, embed_tokens, m.input_ids, offset, dt, T)
              : embed(b, embed_tokens, m.input_ids, dt);  // [B, T, C]
  });
  const AttentionSpec attn{.n_head = H,
                           .head_dim = D,
                           .n_kv_head = Hk,
                           .mask = "causal",
                           .window = c.sliding_window,
                           .rotary_dim = D,
                           .rotary_layout = "half_split",
                           .rope = c.rope};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const auto layer = graph::Builder::Scope::at(b, p.substr(0, p.size() - 1));  // NOTE [name scopes]
    ValueId h = rms_norm(b, x, p + "input_layernorm", C, c.rms_norm_eps, dt);
    ValueId q = linear(b, h, p + "self_attn.q_proj", C, H * D, c.qkv_bias, wdt, WeightLayout::out_in, o.quantized);
    ValueId k = linear(b, h, p + "self_attn.k_proj", C, Hk * D, c.qkv_bias, wdt, WeightLayout::out_in, o.quantized);
    ValueId v = linear(b, h, p + "self_attn.v_proj", C, Hk * D, c.qkv_bias, wdt, WeightLayout::out_in, o.quantized);
    const KvCacheSpec cache = layer_cache(in.kv, o, i);
    const ValueId heads = in_scope(b, p + "self_attn", [&] {
      return attention_core(b, q, k, v, attn.with_dropout(o.attention_dropout, i), m.positions, in.key_valid,
                            o.kv_cache_len ? &cache : nullptr, in.segments, in.layout, in.dropout_seed,
                            in.dropout_shard ? &*in.dropout_shard : nullptr);
    });
    x = b.add(x, row_parallel(heads, p + "self_attn.o_proj", H * D, c.o_bias));
    h = rms_norm(b, x, p + "post_attention_layernorm", C, c.rms_norm_eps, dt);
    const ValueId gate = linear(b, h, p + "mlp.gate_proj", C, F, c.mlp_bias, wdt, WeightLayout::out_in, o.quantized);
    const ValueId up = linear(b, h, p + "mlp.up_proj", C, F, c.mlp_bias, wdt, WeightLayout::out_in, o.quantized);
    x = b.add(x, row_parallel(b.mul(b.silu(gate), up), p + "mlp.down_proj", F, c.mlp_bias));
  }
  x = rms_norm(b, x, "model.norm", C, c.rms_norm_eps, dt);
  if (o.last_hidden_state) b.output("last_hidden_state", x);
  x = logits_input(b, x, o);
  // A quantized head is its own parameter even when tied (the embedding is read as floats: NOTE [quantized
  // linears]).
  const bool quantized_head = o.quantized && o.quantized->find("lm_head.weight");
  m.logits = c.tie_word_embeddings && !quantized_head
                 ? b.op1(OpKind::matmul, {x, embed_tokens}, {{"trans_b", int64_t(1)}})
                 : linear(b, x, "lm_head", C, V, /*bias=*/false, wdt, WeightLayout::out_in, o.quantized);  // [B, T, V]
  b.output("logits", vp ? vocab_parallel_gather_logits(b, m.logits, T) : m.logits);
  if (o.with_loss) {
    m.loss = in_scope(b, "loss", [&] {
      return vp ? vocab_parallel_loss(b, m.logits, m.targets, offset, T) : lm_loss(b, m.logits, m.targets);
    });
    b.output("loss", m.loss);
  }
  ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context("llama"));
  return m;
}

}  // namespace aspen::models
