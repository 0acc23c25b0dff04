#include "models/gptj.h"

#include <cmath>
#include <vector>

#include "core/check.h"

namespace aspen::models {

using graph::Builder;
using graph::OpKind;
using graph::ValueId;

// ---- blocks ------------------------------------------------------------------------

ValueId linear(Builder& b, ValueId x, const std::string& name, int64_t in, int64_t out, bool bias, DType dtype,
               WeightLayout layout) {
  const bool out_in = layout == WeightLayout::out_in;
  ValueId w = b.parameter(name + ".weight", dtype, out_in ? Shape{out, in} : Shape{in, out});
  std::vector<ValueId> args{x, w};
  if (bias) args.push_back(b.parameter(name + ".bias", dtype, Shape{out}));
  graph::Attrs attrs;
  if (out_in) attrs.set("trans_b", int64_t(1));
  return b.op1(OpKind::matmul, std::move(args), std::move(attrs));
}

ValueId layer_norm(Builder& b, ValueId x, const std::string& name, int64_t C, double eps, DType dtype) {
  ValueId gamma = b.parameter(name + ".weight", dtype, Shape{C});
  ValueId beta = b.parameter(name + ".bias", dtype, Shape{C});
  std::vector<ValueId> outs = b.op(OpKind::layernorm, {x, gamma, beta}, {{"eps", eps}});
  return outs.empty() ? ValueId{} : outs[0];
}

ValueId mlp(Builder& b, ValueId x, const MlpSpec& s) {
  if (!b.status().is_ok()) return ValueId{};
  const DType dtype = b.type(x).dtype;
  ValueId h = linear(b, x, s.fc_in, s.d_model, s.d_ff, s.bias, dtype, s.layout);
  h = b.gelu(h, /*tanh_form=*/s.activation == Activation::gelu_tanh);
  return linear(b, h, s.fc_out, s.d_ff, s.d_model, s.bias, dtype, s.layout);
}

ValueId attention_core(Builder& b, ValueId q, ValueId k, ValueId v, const AttentionSpec& s,
                       std::optional<ValueId> positions, std::optional<ValueId> key_valid) {
  if (!b.status().is_ok()) return ValueId{};
  const Shape qs = b.type(q).shape;  // [B, T, H*D]
  const int64_t B = qs[0], T = qs[1], H = s.n_head, D = s.head_dim;
  const std::vector<int64_t> bthd{B, T, H, D}, to_bhtd{0, 2, 1, 3};
  const bool rotate = s.rotary_dim > 0;
  ASPEN_CHECK(!rotate || positions.has_value());  // a caller's bug, not input: rotary needs positions
  auto heads = [&](ValueId x, bool rot) {
    ValueId r = b.reshape(x, bthd);
    if (rot)  // [B, T, H, D] is the rotary op's layout: one position row serves every head
      r = b.op1(OpKind::rotary, {r, *positions},
                {{"rotary_dim", s.rotary_dim}, {"layout", s.rotary_layout}, {"base", s.rotary_base}});
    return b.transpose(r, to_bhtd);  // [B, H, T, D]
  };
  std::vector<ValueId> args{heads(q, rotate), heads(k, rotate), heads(v, false)};
  if (key_valid) args.push_back(*key_valid);
  std::vector<ValueId> outs =
      b.op(OpKind::attention, std::move(args), {{"scale", 1.0 / std::sqrt(double(D))}, {"mask", s.mask}});
  if (outs.empty()) return ValueId{};
  return b.reshape(b.transpose(outs[0], to_bhtd), {B, T, H * D});  // merge heads: [B, T, H*D]
}

// ---- GPT-J -------------------------------------------------------------------------

namespace {

Status bad_key(const std::string& key, const std::string& expected, const std::string& found) {
  return Status::invalid_argument("gptj config: " + key, expected, found);
}

}  // namespace

Status GptjConfig::validate() const {
  const std::pair<const char*, int64_t> positive[] = {{"vocab", vocab},     {"n_positions", n_positions},
                                                      {"d_model", d_model}, {"n_layer", n_layer},
                                                      {"n_head", n_head},   {"rotary_dim", rotary_dim}};
  for (const auto& [key, v] : positive)
    if (v <= 0) return bad_key(key, "a number > 0", std::to_string(v));
  if (d_ff < 0) return bad_key("d_ff", "a number > 0, or 0 for 4*d_model", std::to_string(d_ff));
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

Result<GptjGraph> build_gptj(Builder& b, const GptjConfig& c, int64_t batch, int64_t seq, bool with_loss) {
  ASPEN_RETURN_IF_ERROR(c.validate());
  if (batch < 1) return Status::invalid_argument("gptj: batch", "a number > 0", std::to_string(batch));
  if (seq < 1 || seq > c.n_positions)
    return Status::invalid_argument("gptj: seq", "a number in [1, n_positions = " + std::to_string(c.n_positions) + "]",
                                    std::to_string(seq));
  const DType dt = c.dtype;
  const int64_t C = c.d_model;
  GptjGraph m;
  m.input_ids = b.input("input_ids", DType::i32, Shape{batch, seq});
  m.positions = b.input("positions", DType::i32, Shape{batch, seq});
  if (with_loss) m.targets = b.input("targets", DType::i32, Shape{batch * seq});

  ValueId x = b.gather(b.parameter("transformer.wte.weight", dt, Shape{c.vocab, C}), m.input_ids);  // [B, T, C]
  const AttentionSpec attn{.n_head = c.n_head,
                           .head_dim = c.head_dim(),
                           .mask = "causal",
                           .rotary_dim = c.rotary_dim,
                           .rotary_layout = "interleaved"};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    ValueId h = layer_norm(b, x, p + "ln_1", C, c.layer_norm_eps, dt);
    ValueId q = linear(b, h, p + "attn.q_proj", C, C, /*bias=*/false, dt);
    ValueId k = linear(b, h, p + "attn.k_proj", C, C, false, dt);
    ValueId v = linear(b, h, p + "attn.v_proj", C, C, false, dt);
    ValueId a = linear(b, attention_core(b, q, k, v, attn, m.positions), p + "attn.out_proj", C, C, false, dt);
    ValueId f = mlp(b, h, {.fc_in = p + "mlp.fc_in", .fc_out = p + "mlp.fc_out", .d_model = C, .d_ff = c.ff_dim()});
    x = b.add(b.add(a, f), x);  // HF: attn_output + feed_forward_hidden_states + residual
  }
  x = layer_norm(b, x, "transformer.ln_f", C, c.layer_norm_eps, dt);
  m.logits = linear(b, x, "lm_head", C, c.vocab, /*bias=*/true, dt);  // [B, T, V]
  b.output("logits", m.logits);
  if (with_loss) {
    std::vector<ValueId> ce = b.op(OpKind::cross_entropy, {b.reshape(m.logits, {batch * seq, c.vocab}), m.targets});
    if (!ce.empty()) m.loss = ce[0];  // the mean over rows; per-row losses and lse stay for the backward
    b.output("loss", m.loss);
  }
  ASPEN_RETURN_IF_ERROR(Status(b.status()).with_context("gptj"));
  return m;
}

}  // namespace aspen::models
