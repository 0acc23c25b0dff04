#include "models/gpt2.h"

#include <cmath>
#include <optional>
#include <string>

#include "models/tensor_parallel.h"

namespace aspen::models {

using graph::Builder;
using graph::OpKind;
using graph::ValueId;

Status Gpt2Config::validate() const {
  const std::pair<const char*, int64_t> positive[] = {{"vocab", vocab},     {"n_positions", n_positions},
                                                      {"d_model", d_model}, {"n_layer", n_layer},
                                                      {"n_head", n_head}};
  for (const auto& [key, v] : positive)
    if (v <= 0) return config_key_error("gpt2", key, "a number > 0", std::to_string(v));
  if (d_ff < 0) return config_key_error("gpt2", "d_ff", "a number > 0, or 0 for 4*d_model", std::to_string(d_ff));
  ASPEN_RETURN_IF_ERROR(check_dim_limits("gpt2", {{"vocab", vocab, kMaxVocab},
                                                  {"n_positions", n_positions, kMaxPositions},
                                                  {"d_model", d_model, kMaxModelDim},
                                                  {"n_layer", n_layer, kMaxLayers},
                                                  {"d_ff", d_ff, kMaxFfDim}}));
  if (d_model % n_head != 0)
    return config_key_error("gpt2", "d_model", "a multiple of n_head (" + std::to_string(n_head) + ")",
                            std::to_string(d_model));
  if (!std::isfinite(layer_norm_eps) || layer_norm_eps < 0)
    return config_key_error("gpt2", "layer_norm_eps", "a finite number >= 0", std::to_string(layer_norm_eps));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return config_key_error("gpt2", "dtype", "f32, bf16 or f16", std::string(dtype_name(dtype)));
  return Status();
}

Result<Gpt2Graph> build_gpt2(Builder& b, const Gpt2Config& c, const CausalLmOptions& o) {
  ASPEN_RETURN_IF_ERROR(c.validate());
  ASPEN_RETURN_IF_ERROR(check_batch_seq("gpt2", o.batch, o.seq, "n_positions", c.n_positions));
  ASPEN_RETURN_IF_ERROR(check_kv_cache("gpt2", o, "n_positions", c.n_positions));
  const DType dt = c.dtype;
  const int64_t C = c.d_model;
  const int64_t T = o.tensor_parallel;
  ASPEN_RETURN_IF_ERROR(check_tensor_parallel("gpt2", c.n_head, c.ff_dim(), c.vocab, o));
  const bool vp = T > 1 && o.vocab_parallel;
  if (vp && !c.tie_word_embeddings)
    return Status::unimplemented("gpt2: vocab_parallel with an untied lm_head", "layout in this build (wte ties it)");
  const int64_t Cl = C / T, Fl = c.ff_dim() / T;  // this shard's attention width and MLP width
  // Row-parallel: this shard's partial product, summed over the shards, then the bias once.
  auto row_parallel = [&](ValueId x, const std::string& name, int64_t in) {
    ValueId y = linear(b, x, name, in, C, /*bias=*/false, o.weight_dtype.value_or(dt), WeightLayout::in_out);
    if (T > 1)
      y = b.op1(OpKind::all_reduce, {y},
                {{"group", std::string("tensor")}, {"group_size", T}, {"reduce", std::string("sum")}});
    const ValueId bias = b.parameter(name + ".bias", dt, Shape{C});
    const Shape ys = b.type(y).shape;
    return b.add(y, b.broadcast(bias, std::vector<int64_t>(ys.begin(), ys.end())));
  };
  const WeightLayout conv1d = WeightLayout::in_out;
  ASPEN_ASSIGN_OR_RETURN(const CausalLmInputs in, causal_lm_inputs(b, "gpt2", o, c.n_head));
  Gpt2Graph m;
  m.input_ids = in.input_ids;
  m.positions = in.positions;
  m.attention_mask = in.attention_mask;
  m.targets = in.targets;

  const DType wdt = o.weight_dtype.value_or(dt);
  const ValueId wte = b.parameter("transformer.wte.weight", wdt, Shape{vp ? c.vocab / T : c.vocab, C});
  const ValueId wpe = b.parameter("transformer.wpe.weight", wdt, Shape{c.n_positions, C});
  const ValueId offset = vp ? b.parameter(kVocabOffsetName, DType::i32, Shape{}) : ValueId{};
  ValueId x = in_scope(b, "transformer.wte", [&] {
    const ValueId tokens =
        vp ? vocab_parallel_embed(b, wte, m.input_ids, offset, dt, T) : embed(b, wte, m.input_ids, dt);
    return b.add(tokens, embed(b, wpe, m.positions, dt));  // [B, T, C]
  });
  const AttentionSpec attn{.n_head = c.n_head / T, .head_dim = c.head_dim(), .mask = "causal"};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    const auto layer = graph::Builder::Scope::at(b, p.substr(0, p.size() - 1));  // NOTE [name scopes]
    ValueId h = layer_norm(b, x, p + "ln_1", C, c.layer_norm_eps, dt);
    // [B, T, 3C/T]: this shard's heads of q | k | v (column parallel)
    ValueId qkv = linear(b, h, p + "attn.c_attn", C, 3 * Cl, /*bias=*/true, wdt, conv1d, o.quantized);
    ValueId q = b.slice(qkv, -1, 0, Cl), k = b.slice(qkv, -1, Cl, 2 * Cl), v = b.slice(qkv, -1, 2 * Cl, 3 * Cl);
    const KvCacheSpec cache = layer_cache(in.kv, o, i);
    const ValueId heads = in_scope(b, p + "attn", [&] {
      return attention_core(b, q, k, v, attn.with_dropout(o.attention_dropout, i), std::nullopt, in.key_valid,
                            o.kv_cache_len ? &cache : nullptr, in.segments, in.layout, in.dropout_seed,
                            in.dropout_shard ? &*in.dropout_shard : nullptr);
    });
    ValueId a = T > 1 ? row_parallel(heads, p + "attn.c_proj", Cl)
                      : linear(b, heads, p + "attn.c_proj", C, C, true, wdt, conv1d, o.quantized);
    x = b.add(a, x);  // HF: attn_output + residual
    h = layer_norm(b, x, p + "ln_2", C, c.layer_norm_eps, dt);
    if (T > 1) {  // c_fc column parallel, c_proj row parallel
      ValueId u = b.gelu(linear(b, h, p + "mlp.c_fc", C, Fl, /*bias=*/true, wdt, conv1d), /*tanh_form=*/true);
      x = b.add(x, row_parallel(u, p + "mlp.c_proj", Fl));
      continue;
    }
    ValueId f = mlp(b, h,
                    {.fc_in = p + "mlp.c_fc",
                     .fc_out = p + "mlp.c_proj",
                     .d_model = C,
                     .d_ff = c.ff_dim(),
                     .activation = Activation::gelu_tanh,
                     .layout = conv1d,
                     .weight_dtype = wdt,
                     .quantized = o.quantized});
    x = b.add(x, f);  // HF: residual + feed_forward_hidden_states
  }
  x = layer_norm(b, x, "transformer.ln_f", C, c.layer_norm_eps, dt);
  if (o.last_hidden_state) b.output("last_hidden_state", x);
  x = logits_input(b, x, o);
  // A quantized head is its own parameter even when tied (the embedding is read as floats: NOTE [quantized
  // linears]); llama.cpp multiplies by the token embedding's blocks there too.
  const bool quantized_head = o.quantized && o.quantized->find("lm_head.weight");
  if (c.tie_word_embeddings && !quantized_head)
    m.logits = in_scope(b, "lm_head", [&] {  // [B, T, V]: ln_f(x) wte^T
      return b.op1(OpKind::matmul, {x, wte}, {{"trans_b", int64_t(1)}});
    });
  else
    m.logits = linear(b, x, "lm_head", C, c.vocab, /*bias=*/false, wdt, WeightLayout::out_in, o.quantized);
  // Vocab parallel: the loss from this shard's columns; the whole logits only
  // as an output (training programs drop it, and the gather with it).
  b.output("logits", vp ? vocab_parallel_gather_logits(b, m.logits, T) : m.logits);
  if (o.with_loss) {
    m.loss = in_scope(b, "loss", [&] {
      return vp ? vocab_parallel_loss(b, m.logits, m.targets, offset, T) : lm_loss(b, m.logits, m.targets);
    });
    b.output("loss", m.loss);
  }
  ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context("gpt2"));
  return m;
}

}  // namespace aspen::models
