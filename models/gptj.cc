#include "models/gptj.h"

#include <cmath>
#include <optional>
#include <vector>

#include "core/check.h"
#include "models/tensor_parallel.h"

namespace aspen::models {

using graph::Builder;
using graph::ValueId;

namespace {

Status bad_key(const std::string& key, const std::string& expected, const std::string& found) {
  return config_key_error("gptj", key, expected, found);
}

}  // namespace

Status GptjConfig::validate() const {
  const std::pair<const char*, int64_t> positive[] = {{"vocab", vocab},     {"n_positions", n_positions},
                                                      {"d_model", d_model}, {"n_layer", n_layer},
                                                      {"n_head", n_head},   {"rotary_dim", rotary_dim}};
  for (const auto& [key, v] : positive)
    if (v <= 0) return bad_key(key, "a number > 0", std::to_string(v));
  if (d_ff < 0) return bad_key("d_ff", "a number > 0, or 0 for 4*d_model", std::to_string(d_ff));
  ASPEN_RETURN_IF_ERROR(check_dim_limits("gptj", {{"vocab", vocab, kMaxVocab},
                                                  {"n_positions", n_positions, kMaxPositions},
                                                  {"d_model", d_model, kMaxModelDim},
                                                  {"n_layer", n_layer, kMaxLayers},
                                                  {"d_ff", d_ff, kMaxFfDim}}));
  if (d_model % n_head != 0)
    return bad_key("d_model", "a multiple of n_head (" + std::to_string(n_head) + ")", std::to_string(d_model));
  if (rotary_dim % 2 != 0) return bad_key("rotary_dim", "an even number", std::to_string(rotary_dim));
  if (rotary_dim > head_dim())
    return bad_key("rotary_dim", "at most head_dim = d_model / n_head = " + std::to_string(head_dim()),
                   std::to_string(rotary_dim));
  if (!std::isfinite(layer_norm_eps) || layer_norm_eps < 0)
    return bad_key("layer_norm_eps", "a finite number >= 0", std::to_string(layer_norm_eps));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return bad_key("dtype", "f32, bf16 or f16", std::string(dtype_name(dtype)));
  return Status();
}

Result<GptjGraph> build_gptj(Builder& b, const GptjConfig& c, const CausalLmOptions& o) {
  ASPEN_RETURN_IF_ERROR(c.validate());
  ASPEN_RETURN_IF_ERROR(check_batch_seq("gptj", o.batch, o.seq, "n_positions", c.n_positions));
  ASPEN_RETURN_IF_ERROR(check_kv_cache("gptj", o, "n_positions", c.n_positions));
  const DType dt = c.dtype;
  const int64_t C = c.d_model;
  // Tensor parallel (models/tensor_parallel.h): heads and MLP units split.
  const int64_t T = o.tensor_parallel;
  ASPEN_RETURN_IF_ERROR(check_tensor_parallel("gptj", c.n_head, c.ff_dim(), c.vocab, o));
  const bool vp = T > 1 && o.vocab_parallel;
  const int64_t Cl = C / T, Fl = c.ff_dim() / T, Vl = vp ? c.vocab / T : c.vocab;
  ASPEN_ASSIGN_OR_RETURN(const CausalLmInputs in, causal_lm_inputs(b, "gptj", o, c.n_head));
  GptjGraph m;
  m.input_ids = in.input_ids;
  m.positions = in.positions;
  m.attention_mask = in.attention_mask;
  m.targets = in.targets;

  const DType wdt = o.weight_dtype.value_or(dt);
  const ValueId wte = b.parameter("transformer.wte.weight", wdt, Shape{Vl, C});
  const ValueId offset = vp ? b.parameter(kVocabOffsetName, DType::i32, Shape{}) : ValueId{};
  ValueId x = in_scope(b, "transformer.wte", [&] {  // [B, T, C]
    return vp ? vocab_parallel_embed(b, wte, m.input_ids, offset, dt, T) : embed(b, wte, m.input_ids, dt);
  });
  const AttentionSpec attn{.n_head = c.n_head / T,
                           .head_dim = c.head_dim(),
                           .mask = "causal",
                           .rotary_dim = c.rotary_dim,
                           .rotary_layout = "interleaved"};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    const auto layer = graph::Builder::Scope::at(b, p.substr(0, p.size() - 1));  // NOTE [name scopes]
    ValueId h = layer_norm(b, x, p + "ln_1", C, c.layer_norm_eps, dt);
    ValueId q = linear(b, h, p + "attn.q_proj", C, Cl, /*bias=*/false, wdt);
    ValueId k = linear(b, h, p + "attn.k_proj", C, Cl, false, wdt);
    ValueId v = linear(b, h, p + "attn.v_proj", C, Cl, false, wdt);
    const KvCacheSpec cache = layer_cache(in.kv, o, i);
    const ValueId heads = in_scope(b, p + "attn", [&] {
      return attention_core(b, q, k, v, attn.with_dropout(o.attention_dropout, i), m.positions, in.key_valid,
                            o.kv_cache_len ? &cache : nullptr, in.segments, in.layout, in.dropout_seed,
                            in.dropout_shard ? &*in.dropout_shard : nullptr);
    });
    ValueId a = linear(b, heads, p + "attn.out_proj", Cl, C, false, wdt);
    if (T > 1) {  // both row-parallel products summed by one all-reduce, then fc_out's bias once
      ValueId u = b.gelu(linear(b, h, p + "mlp.fc_in", C, Fl, /*bias=*/true, wdt), /*tanh_form=*/true);
      ValueId y = b.add(a, linear(b, u, p + "mlp.fc_out", Fl, C, /*bias=*/false, wdt));
      y = b.op1(graph::OpKind::all_reduce, {y},
                {{"group", std::string("tensor")}, {"group_size", T}, {"reduce", std::string("sum")}});
      const ValueId bias = b.parameter(p + "mlp.fc_out.bias", dt, Shape{C});
      const Shape ys = b.type(y).shape;
      x = b.add(b.add(y, b.broadcast(bias, std::vector<int64_t>(ys.begin(), ys.end()))), x);
      continue;
    }
    ValueId f = mlp(b, h, {.fc_in = p + "mlp.fc_in", .fc_out = p + "mlp.fc_out", .d_model = C, .d_ff = c.ff_dim(),
                           .weight_dtype = wdt});
    x = b.add(b.add(a, f), x);  // HF: attn_output + feed_forward_hidden_states + residual
  }
  x = layer_norm(b, x, "transformer.ln_f", C, c.layer_norm_eps, dt);
  if (o.last_hidden_state) b.output("last_hidden_state", x);
  x = logits_input(b, x, o);
  m.logits = linear(b, x, "lm_head", C, Vl, /*bias=*/true, wdt);  // [B, T, V] (vocab parallel: the shard's V/T)
  b.output("logits", vp ? vocab_parallel_gather_logits(b, m.logits, T) : m.logits);
  if (o.with_loss) {
    m.loss = in_scope(b, "loss", [&] {
      return vp ? vocab_parallel_loss(b, m.logits, m.targets, offset, T) : lm_loss(b, m.logits, m.targets);
    });
    b.output("loss", m.loss);
  }
  ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context("gptj"));
  return m;
}

}  // namespace aspen::models
