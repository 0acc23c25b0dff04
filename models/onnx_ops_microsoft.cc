// models/onnx_ops_microsoft.cc: the com.microsoft ops that onnxruntime's transformer optimizer
// (onnxruntime.transformers.optimizer) fuses exported BERT and GPT-2 graphs into, as onnxruntime's CPU
// kernels compute them (its contrib ops documentation, ContribOperators.md):
//   FastGelu(X, bias?):   gelu_tanh(X + bias)          BiasGelu(A, B): gelu_erf(A + B)     Gelu(X): gelu_erf
//   SkipLayerNormalization(input, skip, gamma, beta?, bias?) {epsilon}: s = input + skip + bias;
//       outputs layernorm(s)·gamma + beta, mean, inv_std_var, s (the last three optional)
//   SkipSimplifiedLayerNormalization(input, skip, gamma, bias?) {epsilon}: the same with rmsnorm
//       (outputs y, mean (not made), inv_std_var, s)
//   Attention(input [B, S, D], weights [D, Hq + Hk + Hv], bias?, mask_index?, past?, attention_bias?)
//       {num_heads, unidirectional, qkv_hidden_sizes, mask_filter_value, scale}: q, k, v from one product;
//       per head softmax(q·kᵀ·scale + mask + attention_bias)·v, heads concatenated [B, S, Hv].
//       mask_index: [B] key lengths (right padding), [2B] ends then starts, [B, T] or [B, S, T] raw 0/1
//       masks: a masked key adds mask_filter_value (default -10000), so a row with every key masked
//       attends to all of them evenly, as onnxruntime's does; unidirectional: a later key's score is the
//       lowest float plus the score, replacing the mask's value there (as onnxruntime's CPU kernel).
// Decomposed into the IR's ops exactly as written above (the fusion pass then finds the GELU and
// products); what these ops have that aspen does not convert (a KV cache `past`/`present`, rotary
// embeddings inside Attention, a 4-D Megatron mask) is refused naming the input or attribute.
#include <cmath>
#include <limits>

#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

namespace {

bool has(const std::vector<Value>& in, size_t k) { return in.size() > k && in[k].present(); }

// x + bias over the last axis (bias [C]).
Result<Value> plus_bias(Ctx& c, const Value& x, const Value& bias, const char* what) {
  const int64_t C = x.type.shape.rank() ? x.type.shape[-1] : 0;
  if (bias.type.shape.numel() != C || bias.type.dtype != x.type.dtype)
    return c.error(what, std::string(dtype_name(x.type.dtype)) + " [" + std::to_string(C) + "] (the last axis)",
                   bias.type.to_string());
  const Value b = to_shape(c, reshaped(c, bias, {C}), x.type.shape);
  return c.wrap(c.b.add(c.id(x), c.id(b)));
}

Converter gelu_of(bool tanh_form, const char* bias_name) {
  return [tanh_form, bias_name](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) -> Status {
    Value x = in[0];
    if (bias_name && has(in, 1)) {
      ASPEN_ASSIGN_OR_RETURN(x, plus_bias(c, x, in[1], bias_name));
    }
    out = {c.wrap(c.b.gelu(c.id(x), tanh_form))};
    return c.b.status();
  };
}

// SkipLayerNormalization and SkipSimplifiedLayerNormalization (rms: no mean, no beta).
Converter skip_norm(bool rms) {
  return [rms](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) -> Status {
    ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-12f));
    const Value& x = in[0];
    if (x.type.shape.rank() < 2 || !is_float(x.type.dtype))
      return c.error("input 'input'", "a float tensor [..., hidden]", x.type.to_string());
    const std::vector<int64_t> d = dims(x.type.shape);
    const int64_t C = d.back();
    // skip: input's shape, or one that broadcasts to it ([1, S, C], [S, C]).
    const Value& skip = in[1];
    if (skip.type.dtype != x.type.dtype || skip.type.shape.rank() > x.type.shape.rank() ||
        skip.type.shape.numel() == 0 || skip.type.shape[-1] != C)
      return c.error("input 'skip'", "input's type and shape, or one that broadcasts to it",
                     skip.type.to_string() + " (input " + x.type.to_string() + ")");
    std::vector<int64_t> ds = dims(skip.type.shape);
    ds.insert(ds.begin(), d.size() - ds.size(), 1);
    for (size_t i = 0; i < d.size(); ++i)
      if (ds[i] != d[i] && ds[i] != 1)
        return c.error("input 'skip'", "a shape that broadcasts to " + x.type.to_string(), skip.type.to_string());
    Value s = c.wrap(c.b.add(c.id(x), c.id(to_shape(c, reshaped(c, skip, ds), x.type.shape))));
    const size_t bias_at = rms ? 3 : 4;
    if (has(in, bias_at)) {
      ASPEN_ASSIGN_OR_RETURN(s, plus_bias(c, s, in[bias_at], "input 'bias'"));
    }
    for (size_t k : rms ? std::vector<size_t>{2} : std::vector<size_t>{2, 3})
      if (has(in, k) && (in[k].type.shape.numel() != C || in[k].type.dtype != x.type.dtype))
        return c.error(k == 2 ? "input 'gamma'" : "input 'beta'",
                       std::string(dtype_name(x.type.dtype)) + " [" + std::to_string(C) + "]", in[k].type.to_string());
    const int64_t R = x.type.shape.numel() / std::max<int64_t>(C, 1);
    const ValueId flat = c.id(reshaped(c, s, {R, C}));
    const ValueId gamma = c.id(reshaped(c, in[2], {C}));
    std::vector<int64_t> stat(d.begin(), d.end() - 1);
    stat.push_back(1);  // onnxruntime's mean and inv_std_var keep the normalized axis as 1
    if (rms) {
      std::vector<ValueId> y = c.b.op(OpKind::rmsnorm, {flat, gamma}, {{"eps", double(eps)}});
      ASPEN_RETURN_IF_ERROR(c.b.status());
      out = {reshaped(c, c.wrap(y[0]), d), Value{}, reshaped(c, c.wrap(y[1]), stat), s};
      return c.b.status();
    }
    const ValueId beta = has(in, 3) ? c.id(reshaped(c, in[3], {C})) : c.id(filled(c, 0.0, x.type.dtype, shape_of({C})));
    std::vector<ValueId> y = c.b.op(OpKind::layernorm, {flat, gamma, beta}, {{"eps", double(eps)}});
    ASPEN_RETURN_IF_ERROR(c.b.status());
    out = {reshaped(c, c.wrap(y[0]), d), reshaped(c, c.wrap(y[1]), stat), reshaped(c, c.wrap(y[2]), stat), s};
    return c.b.status();
  };
}

// The additive mask of Attention, [B, 1 or S, T] in the scores' type, from mask_index (see the header)
// and the causal rule; nullopt when nothing is masked.
Result<std::optional<ValueId>> attention_mask(Ctx& c, const std::vector<Value>& in, int64_t B, int64_t S, bool causal,
                                              float filter, DType dt) {
  const int64_t T = S;  // no past: the keys are the queries' positions
  const double lowest = double(std::numeric_limits<float>::lowest());
  // allowed [B, 1 or S, T] (bool), or none.
  std::optional<ValueId> allowed;
  bool three_d = false;
  if (has(in, 3)) {
    const Value& m = in[3];
    if (m.type.dtype != DType::i32 && m.type.dtype != DType::i64)
      return c.error("input 'mask_index'", "int32", m.type.to_string());
    const std::vector<int64_t> md = dims(m.type.shape);
    const ValueId mi = c.id(m);
    auto positions = [&](int64_t rows) {  // [rows, T] of 0 .. T-1 in the mask's type
      Tensor t(DType::i64, Shape{1, T});
      for (int64_t j = 0; j < T; ++j) t.span<int64_t>()[size_t(j)] = j;
      ValueId p = c.b.constant(std::move(t));
      if (m.type.dtype != DType::i64) p = c.b.cast(p, m.type.dtype);
      return c.b.broadcast(p, {rows, T});
    };
    if (md == std::vector<int64_t>{B} || md == std::vector<int64_t>{2 * B}) {
      // Key j of row b is kept when j < end[b] (and j >= start[b] with [2B]).
      const ValueId end = c.b.broadcast(c.b.reshape(c.b.slice(mi, 0, 0, B), {B, 1}), {B, T});
      ValueId keep = c.b.op1(OpKind::less, {positions(B), end});
      if (md[0] == 2 * B) {
        const ValueId start = c.b.broadcast(c.b.reshape(c.b.slice(mi, 0, B, 2 * B), {B, 1}), {B, T});
        keep = c.b.op1(OpKind::logical_and,
                       {keep, c.b.op1(OpKind::logical_not, {c.b.op1(OpKind::less, {positions(B), start})})});
      }
      allowed = c.b.reshape(keep, {B, 1, T});
    } else if (md == std::vector<int64_t>{B, T} || md == std::vector<int64_t>{B, S, T}) {
      three_d = md.size() == 3;
      const ValueId zero = c.id(filled(c, 0.0, m.type.dtype, m.type.shape));
      allowed = c.b.op1(OpKind::greater, {mi, zero});
      if (!three_d) allowed = c.b.reshape(*allowed, {B, 1, T});
    } else {
      return c.unsupported("input 'mask_index'",
                           "[B] key lengths, [2B] ends and starts, or a raw 0/1 mask [B, T] or [B, S, T] (B = " +
                               std::to_string(B) + ", S = T = " + std::to_string(S) + ")",
                           m.type.to_string());
    }
  }
  // The causal rule: key j > query i gets the lowest float, replacing the mask's value there.
  std::optional<ValueId> future;
  if (causal) {
    Tensor f(DType::boolean, Shape{1, S, T});
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < T; ++j) f.span<bool>()[size_t(i * T + j)] = j > i;
    future = c.b.constant(std::move(f));
  }
  if (!allowed && !future) return std::optional<ValueId>();
  const int64_t rows = (three_d || future) ? S : 1;
  const std::vector<int64_t> shape{B, rows, T};
  auto fill = [&](double v) { return c.id(filled(c, v, dt, shape_of(shape))); };
  ValueId bias;
  if (allowed) {
    bias = c.b.where(c.b.broadcast(*allowed, shape), fill(0.0), fill(filter));
    if (future) bias = c.b.where(c.b.broadcast(*future, shape), fill(lowest), bias);
  } else {
    bias = c.b.where(c.b.broadcast(*future, shape), fill(lowest), fill(0.0));
  }
  return std::optional<ValueId>(bias);
}

Status convert_attention(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t N, c.attr_i("num_heads"));
  ASPEN_ASSIGN_OR_RETURN(const int64_t unidirectional, c.attr_i("unidirectional", 0));
  ASPEN_ASSIGN_OR_RETURN(const float filter, c.attr_f("mask_filter_value", -10000.0f));
  ASPEN_ASSIGN_OR_RETURN(const float scale_attr, c.attr_f("scale", 0.0f));
  ASPEN_ASSIGN_OR_RETURN(const int64_t rotary, c.attr_i("do_rotary", 0));
  ASPEN_ASSIGN_OR_RETURN(const int64_t share, c.attr_i("past_present_share_buffer", 0));
  if (rotary) return c.unsupported("attribute 'do_rotary'", "0 (rotary embeddings as separate ops)", "1");
  if (share) return c.unsupported("attribute 'past_present_share_buffer'", "0 (no KV cache)", std::to_string(share));
  if (has(in, 4)) return c.unsupported("input 'past'", "none (a KV cache is not converted)", in[4].type.to_string());
  if (has(in, 6))
    return c.unsupported("input 'past_sequence_length'", "none (a KV cache is not converted)", in[6].type.to_string());
  if (c.node.outputs.size() > 1 && !c.node.outputs[1].empty())
    return c.unsupported("output 'present'", "none (a KV cache is not converted)", "'" + c.node.outputs[1] + "'");
  const Value& x = in[0];
  const Value& w = in[1];
  const DType dt = x.type.dtype;
  if (x.type.shape.rank() != 3) return c.error("input 'input'", "[batch, sequence, input_hidden]", x.type.to_string());
  const int64_t B = x.type.shape[0], S = x.type.shape[1], D = x.type.shape[2];
  if (w.type.shape.rank() != 2 || w.type.shape[0] != D || w.type.dtype != dt)
    return c.error("input 'weights'", std::string(dtype_name(dt)) + " [" + std::to_string(D) + ", Hq + Hk + Hv]",
                   w.type.to_string());
  const int64_t width = w.type.shape[1];
  std::vector<int64_t> sizes;
  if (c.has("qkv_hidden_sizes")) {
    ASPEN_ASSIGN_OR_RETURN(sizes, c.attr_ints("qkv_hidden_sizes"));
  } else {
    sizes = {width / 3, width / 3, width / 3};
  }
  if (N < 1 || sizes.size() != 3 || sizes[0] != sizes[1] || sizes[0] + sizes[1] + sizes[2] != width ||
      sizes[0] % N != 0 || sizes[2] % N != 0 || sizes[0] < N)
    return c.error("attribute 'num_heads' and the weights' width",
                   "q, k and v widths (qkv_hidden_sizes, else a third of the weights' " + std::to_string(width) +
                       " columns each) with q = k, each divisible by num_heads",
                   "num_heads " + std::to_string(N) + ", widths " + std::to_string(sizes.size() == 3 ? sizes[0] : 0) +
                       ", " + std::to_string(sizes.size() == 3 ? sizes[1] : 0) + ", " +
                       std::to_string(sizes.size() == 3 ? sizes[2] : 0));
  const int64_t Hq = sizes[0], Hv = sizes[2], h = Hq / N, hv = Hv / N;
  const double scale = scale_attr != 0.0f ? double(scale_attr) : 1.0 / std::sqrt(double(h));

  std::vector<ValueId> args{c.id(x), c.id(w)};
  if (has(in, 2)) {
    if (in[2].type.shape.numel() != width || in[2].type.dtype != dt)
      return c.error("input 'bias'", std::string(dtype_name(dt)) + " [" + std::to_string(width) + "]",
                     in[2].type.to_string());
    args.push_back(c.id(reshaped(c, in[2], {width})));
  }
  const ValueId qkv = c.b.op1(OpKind::matmul, args, {{"trans_a", int64_t(0)}, {"trans_b", int64_t(0)}});
  auto heads = [&](int64_t begin, int64_t H, int64_t size) {  // [B, S, H] columns -> [B, N, S, size]
    const ValueId part = c.b.slice(qkv, 2, begin, begin + H);
    return c.b.transpose(c.b.reshape(part, {B, S, N, size}), {0, 2, 1, 3});
  };
  const ValueId q = heads(0, Hq, h), k = heads(Hq, Hq, h), v = heads(2 * Hq, Hv, hv);
  ValueId scores =
      c.b.scale(c.b.op1(OpKind::matmul, {q, k}, {{"trans_a", int64_t(0)}, {"trans_b", int64_t(1)}}), scale);
  ASPEN_ASSIGN_OR_RETURN(const std::optional<ValueId> mask,
                         attention_mask(c, in, B, S, unidirectional != 0, filter, dt));
  if (mask) {
    const int64_t rows = c.b.type(*mask).shape[1];
    scores = c.b.add(scores, c.b.broadcast(c.b.reshape(*mask, {B, 1, rows, S}), {B, N, S, S}));
  }
  if (has(in, 5)) {  // attention_bias [B or 1, N or 1, S, T]
    const Value& ab = in[5];
    const std::vector<int64_t> ad = dims(ab.type.shape);
    if (ad.size() != 4 || (ad[0] != B && ad[0] != 1) || (ad[1] != N && ad[1] != 1) || ad[2] != S || ad[3] != S ||
        ab.type.dtype != dt)
      return c.error("input 'attention_bias'",
                     std::string(dtype_name(dt)) + " [" + std::to_string(B) + " or 1, " + std::to_string(N) +
                         " or 1, " + std::to_string(S) + ", " + std::to_string(S) + "]",
                     ab.type.to_string());
    scores = c.b.add(scores, c.id(to_shape(c, ab, shape_of({B, N, S, S}))));
  }
  const ValueId probs = c.b.op1(OpKind::softmax, {scores});
  const ValueId ctx = c.b.op1(OpKind::matmul, {probs, v}, {{"trans_a", int64_t(0)}, {"trans_b", int64_t(0)}});
  out = {c.wrap(c.b.reshape(c.b.transpose(ctx, {0, 2, 1, 3}), {B, S, Hv}))};
  return c.b.status();
}

}  // namespace

const std::map<std::string, OpConverter>& microsoft_converters() {
  static const std::map<std::string, OpConverter> table = [] {
    std::map<std::string, OpConverter> t;
    t["FastGelu"] = OpConverter{gelu_of(true, "input 'bias'"), 1, 2};
    t["BiasGelu"] = OpConverter{gelu_of(false, "input 'B'"), 2, 2};
    t["Gelu"] = OpConverter{gelu_of(false, nullptr), 1, 1};
    t["SkipLayerNormalization"] = OpConverter{skip_norm(false), 3, 5};
    t["SkipSimplifiedLayerNormalization"] = OpConverter{skip_norm(true), 3, 4};
    t["Attention"] = OpConverter{convert_attention, 2, 7};
    return t;
  }();
  return table;
}

}  // namespace aspen::models::onnx
