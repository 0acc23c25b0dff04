// graph/ops_attention.cc: scaled dot-product attention and its gradient,
// the graph form of kernels/attention.h (see ops_nn.cc's header for the
// meaning of every NN op and its gradient rule).
//
//   attention(q [B, H, T, D], k, v [B, Hk, S, D][, key_valid u8/bool [B, S]][, segments i32 [B, S]]
//       [, layout u8 [1 or H, ceil((kv_offset + T) / layout_block), ceil(S / layout_block)]]
//       [, bias (q's dtype) [1 or B, 1 or H, T, S]])
//       {scale, mask: "none" | "causal" | "local", window, window_right, kv_offset, align: "top_left" |
//       "bottom_right", layout_block, alibi_bias_max}: outputs out [B, H, T, D], lse (f32 [B, H, T]); Hk divides H
//       (grouped-query attention: query head h reads key/value head h / (H / Hk), no copy of k and v). The mask
//       is kernels::AttentionMask: align "bottom_right" is kv_offset = S - T (xformers' "from bottom right");
//       segments, non-decreasing document ids, make it block-diagonal (packed sequences); layout is a
//       block-sparse layout of layout_block tokens (kernels/attention_layout.h makes DeepSpeed's); alibi_bias_max
//       (> 0) adds ALiBi with kernels::alibi_slopes(H, alibi_bias_max) (MPT's; 8 is BLOOM's). key_valid,
//       segments and layout are run-time inputs: a new padding, packing or layout never recompiles. bias is
//       added to the scores after the scale (scale > 0; -inf entries mask), broadcast over batch and heads:
//       xformers' tensor attn_bias, or T5's relative position bias gathered from a trainable table.
//   gradient: (dq, dk, dv[, dbias [B, H, T, S]]) = attention_grad(q, k, v, out, lse, g[, key_valid][, segments]
//       [, layout][, bias]) {same attributes}; the bias's gradient is dbias summed over the dimensions it
//       broadcasts; a gradient reaching lse is Unimplemented; attention_grad is not differentiated again.
//   {out_dtype}: q, k and v bf16 with out_dtype f32 (compiler/precision.cc's compute = bf16, as a matmul's):
//       out, the bias, and attention_grad's out, g, dq, dk, dv and dbias are f32; kernels/attention.h's bf16
//       kernels (AMX tiles where the CPU has them).
#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/attention.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

// ---- attention ------------------------------------------------------------------------------

// The mask of the attributes for T queries and S keys (key_valid and segments are bound at evaluation).
Result<kernels::AttentionMask> mask_of(const Node& n, int64_t T, int64_t S) {
  using Kind = kernels::AttentionMask::Kind;
  kernels::AttentionMask m;
  const std::string& kind = n.attrs.s("mask");
  if (kind == "none")
    m.kind = Kind::none;
  else if (kind == "causal")
    m.kind = Kind::causal;
  else if (kind == "local")
    m.kind = Kind::local;
  else
    return rule_error(n, "mask", "\"none\", \"causal\" or \"local\"", "\"" + kind + "\"");
  if (m.kind == Kind::local) {
    if (!n.attrs.has("window")) return rule_error(n, "window", "present with mask \"local\"", "none");
    m.window = n.attrs.i("window");
    if (m.window < 1) return rule_error(n, "window", ">= 1", str(m.window));
    m.window_right = n.attrs.i_or("window_right", 0);
    if (m.window_right < 0) return rule_error(n, "window_right", ">= 0", str(m.window_right));
    if (m.window > (int64_t(1) << 53) || m.window_right > (int64_t(1) << 53))
      return rule_error(n, "window, window_right", "at most 2^53", str(m.window) + ", " + str(m.window_right));
  } else {
    for (const char* key : {"window", "window_right"})
      if (n.attrs.has(key))
        return rule_error(n, key, "none (it applies to mask \"local\" only)", str(n.attrs.i(key)));
  }
  const std::string align = n.attrs.has("align") ? n.attrs.s("align") : "top_left";
  if (align != "top_left" && align != "bottom_right")
    return rule_error(n, "align", "\"top_left\" or \"bottom_right\"", "\"" + align + "\"");
  if (align == "bottom_right") {
    if (n.attrs.has("kv_offset"))
      return rule_error(n, "kv_offset", "none with align \"bottom_right\" (it is S - T)", str(n.attrs.i("kv_offset")));
    if (S < T) return rule_error(n, "align", "\"top_left\" when S < T (bottom right needs S >= T)", "\"bottom_right\"");
    m.kv_offset = S - T;
  } else {
    m.kv_offset = n.attrs.i_or("kv_offset", 0);
  }
  if (m.kv_offset < 0 || m.kv_offset > (int64_t(1) << 53))
    return rule_error(n, "kv_offset", "a number in [0, 2^53]", str(m.kv_offset));
  if (n.attrs.has("alibi_bias_max")) {
    const double bias_max = n.attrs.f("alibi_bias_max");
    if (!(bias_max > 0 && bias_max < 1e4))
      return rule_error(n, "alibi_bias_max", "a number in (0, 1e4)", std::to_string(bias_max));
    if (!(n.attrs.f("scale") > 0)) return rule_error(n, "scale", "> 0 with ALiBi", std::to_string(n.attrs.f("scale")));
  }
  return m;
}

// ALiBi's slopes for the node's query heads (empty without alibi_bias_max).
std::vector<float> slopes_of(const Node& n, int64_t H) {
  return n.attrs.has("alibi_bias_max") ? kernels::alibi_slopes(H, n.attrs.f("alibi_bias_max")) : std::vector<float>{};
}

// Where the optional inputs after the fixed ones (v, or g for the gradient) sit: key_valid (u8 or bool,
// rank 2) first, then segments (i32), then layout (u8, rank 3), then bias (float, rank 4); -1 when absent.
struct MaskInputs {
  int key_valid = -1, segments = -1, layout = -1, bias = -1;
};
Result<MaskInputs> mask_inputs(const Node& n, std::span<const TensorType> in, size_t first) {
  MaskInputs m;
  for (size_t i = first; i < in.size(); ++i) {
    const DType t = in[i].dtype;
    const int rank = in[i].shape.rank();
    const bool free = m.bias < 0;  // nothing may follow the bias
    if ((t == DType::u8 || t == DType::boolean) && rank == 2 && m.key_valid < 0 && m.segments < 0 && m.layout < 0 &&
        free) {
      m.key_valid = int(i);
    } else if (t == DType::i32 && m.segments < 0 && m.layout < 0 && free) {
      m.segments = int(i);
    } else if (t == DType::u8 && rank == 3 && m.layout < 0 && free) {
      m.layout = int(i);
    } else if (is_float(t) && rank == 4 && free) {
      m.bias = int(i);
    } else {
      return rule_error(n, "input " + str(int64_t(i)),
                        "key_valid (u8 or bool [B, S]), then segments (i32 [B, S]), then layout (u8 [heads, query "
                        "blocks, key blocks]), then bias (q's dtype [1 or B, 1 or H, T, S]), each at most once",
                        in[i].to_string());
    }
  }
  return m;
}

// q [B, H, T, D], k and v [B, Hk, S, D] (Hk divides H); key_valid and segments [B, S] from in[kv_index] on.
// The dtype of out (and of the bias, and the gradients): q's, or out_dtype (f32, with bf16 q).
Result<DType> attention_out_dtype(const Node& n, const TensorType& q) {
  if (!n.attrs.has("out_dtype")) return q.dtype;
  const int64_t od = n.attrs.i("out_dtype");
  if (q.dtype != DType::bf16) return rule_error(n, "q", "bf16 (with out_dtype)", q.to_string());
  if (od != int64_t(DType::f32)) return rule_error(n, "out_dtype", "f32", std::to_string(od));
  return DType::f32;
}

Status check_attention(const Node& n, std::span<const TensorType> in, size_t kv_index) {
  const TensorType &q = in[0], &k = in[1];
  ASPEN_RETURN_IF_ERROR(expect_float(n, "q", q));
  ASPEN_ASSIGN_OR_RETURN(const DType out_dtype, attention_out_dtype(n, q));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "q", q, 4, 4));
  ASPEN_RETURN_IF_ERROR(expect_dtype(n, "k", k, q.dtype, "q's"));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "k", k, 4, 4));
  static const char* const kDim[] = {"0 (B)", "1 (Hk)", "2 (S)", "3 (D)"};
  for (int d : {0, 3})
    if (k.shape[d] != q.shape[d])
      return rule_error(n, std::string("k: dimension ") + kDim[d], str(q.shape[d]) + " (q's)", str(k.shape[d]));
  if (k.shape[1] < 1 ? q.shape[1] != 0 : q.shape[1] % k.shape[1] != 0)
    return rule_error(n, std::string("k: dimension ") + kDim[1], "a divisor of q's heads (" + str(q.shape[1]) + ")",
                      str(k.shape[1]));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "v", in[2], k, "k's type"));
  ASPEN_ASSIGN_OR_RETURN(const MaskInputs mi, mask_inputs(n, in, kv_index));
  const Shape want{q.shape[0], k.shape[2]};
  if (mi.key_valid >= 0 && in[size_t(mi.key_valid)].shape != want)
    return rule_error(n, "key_valid", "u8 or bool " + want.to_string() + " ([B, S])", in[size_t(mi.key_valid)].to_string());
  if (mi.segments >= 0 && in[size_t(mi.segments)].shape != want)
    return rule_error(n, "segments", "i32 " + want.to_string() + " ([B, S])", in[size_t(mi.segments)].to_string());
  if ((mi.layout >= 0) != n.attrs.has("layout_block"))
    return rule_error(n, "layout_block", mi.layout >= 0 ? "present with a layout input" : "none without a layout input",
                      n.attrs.has("layout_block") ? str(n.attrs.i("layout_block")) : "none");
  const double scale = n.attrs.f("scale");
  if (!std::isfinite(scale)) return rule_error(n, "scale", "a finite number", std::to_string(scale));
  ASPEN_ASSIGN_OR_RETURN(const kernels::AttentionMask m, mask_of(n, q.shape[2], k.shape[2]));
  if (mi.layout >= 0) {
    const int64_t bs = n.attrs.i("layout_block");
    if (bs < 1) return rule_error(n, "layout_block", ">= 1", str(bs));
    const int64_t H = q.shape[1];
    const Shape want_layout{in[size_t(mi.layout)].shape[0], (m.kv_offset + q.shape[2] + bs - 1) / bs,
                            (k.shape[2] + bs - 1) / bs};
    if ((want_layout[0] != 1 && want_layout[0] != H) || in[size_t(mi.layout)].shape != want_layout)
      return rule_error(n, "layout",
                        "u8 [1 or " + str(H) + ", " + str(want_layout[1]) + ", " + str(want_layout[2]) +
                            "] (heads, query blocks, key blocks of " + str(bs) + ")",
                        in[size_t(mi.layout)].to_string());
  }
  if (mi.bias >= 0) {
    const TensorType& bias = in[size_t(mi.bias)];
    const Shape& bs = bias.shape;
    if (bias.dtype != out_dtype || (bs[0] != 1 && bs[0] != q.shape[0]) || (bs[1] != 1 && bs[1] != q.shape[1]) ||
        bs[2] != q.shape[2] || bs[3] != k.shape[2])
      return rule_error(n, "bias",
                        std::string(dtype_name(out_dtype)) + " [1 or " + str(q.shape[0]) + ", 1 or " + str(q.shape[1]) +
                            ", " + str(q.shape[2]) + ", " + str(k.shape[2]) + "] ([batch, heads, T, S], broadcast)",
                        bias.to_string());
    if (!(scale > 0)) return rule_error(n, "scale", "> 0 with a bias", std::to_string(scale));
  }
  if (mi.segments >= 0 && q.shape[2] > 0 && m.kv_offset + q.shape[2] > k.shape[2])
    return rule_error(n, "kv_offset", "kv_offset + T <= S with segments (each query's segment is its position's)",
                      str(m.kv_offset) + " + " + str(q.shape[2]) + " > " + str(k.shape[2]));
  return Status();
}

TensorType lse_type(const TensorType& q) { return TensorType{kStat, Shape{q.shape[0], q.shape[1], q.shape[2]}}; }

Status infer_attention(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(check_attention(n, in, 3));
  ASPEN_ASSIGN_OR_RETURN(const DType od, attention_out_dtype(n, in[0]));
  out = {TensorType{od, in[0].shape}, lse_type(in[0])};
  return Status();
}

// attention_grad(q, k, v, out, lse, g[, key_valid][, segments]).
Status infer_attention_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(check_attention(n, in, 6));
  ASPEN_ASSIGN_OR_RETURN(const DType od, attention_out_dtype(n, in[0]));
  const TensorType out_type{od, in[0].shape};
  const char* what = n.attrs.has("out_dtype") ? "q's shape in out_dtype" : "q's type";
  ASPEN_RETURN_IF_ERROR(expect_type(n, "out", in[3], out_type, what));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "lse", in[4], lse_type(in[0]), "the forward's saved statistic"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "g", in[5], out_type, what));
  out = {out_type, TensorType{od, in[1].shape}, TensorType{od, in[1].shape}};
  ASPEN_ASSIGN_OR_RETURN(const MaskInputs mi, mask_inputs(n, in, 6));
  if (mi.bias >= 0) {  // dbias, before the sum over the broadcast dimensions
    const Shape &q = in[0].shape, &k = in[1].shape;
    out.push_back(TensorType{od, Shape{q[0], q[1], q[2], k[2]}});
  }
  return Status();
}

struct AttentionCall {
  kernels::AttentionMask mask;
  std::vector<uint8_t> key_valid, layout;
  std::vector<float> slopes;
  const double* bias = nullptr;  // [bias_batch, bias_heads, T, S], or null
  std::vector<int32_t> segments;
  int64_t B, H, Hk, T, S, D;
  double scale;
};

// The types of the inputs, for mask_inputs.
std::vector<TensorType> types_of(Ins in) {
  std::vector<TensorType> t;
  for (const auto* x : in) t.push_back(x->type);
  return t;
}

// The reference's call; segments are checked as the kernels check them (non-decreasing along each row).
Result<AttentionCall> attention_call(const Node& n, Ins in, size_t kv_index) {
  AttentionCall c;
  const Shape &q = in[0]->type.shape, &k = in[1]->type.shape;
  c.B = q[0], c.H = q[1], c.Hk = k[1], c.T = q[2], c.S = k[2], c.D = q[3];
  ASPEN_ASSIGN_OR_RETURN(c.mask, mask_of(n, c.T, c.S));
  c.scale = n.attrs.f("scale");
  const std::vector<TensorType> types = types_of(in);
  ASPEN_ASSIGN_OR_RETURN(const MaskInputs mi, mask_inputs(n, types, kv_index));
  if (mi.key_valid >= 0) {
    for (double v : in[size_t(mi.key_valid)]->data) c.key_valid.push_back(v != 0 ? 1 : 0);
    c.mask.key_valid = c.key_valid;
  }
  if (mi.segments >= 0) {
    for (double v : in[size_t(mi.segments)]->data) c.segments.push_back(int32_t(v));
    c.mask.segments = c.segments;
  }
  if (mi.layout >= 0) {
    for (double v : in[size_t(mi.layout)]->data) c.layout.push_back(v != 0 ? 1 : 0);
    c.mask.layout = c.layout;
    c.mask.layout_block = n.attrs.i("layout_block");
    c.mask.layout_heads = in[size_t(mi.layout)]->type.shape[0];
  }
  c.slopes = slopes_of(n, c.H);
  c.mask.alibi_slopes = c.slopes;
  if (mi.bias >= 0) {  // the values go to the reference in f64 (bias below); the mask says how they broadcast
    c.bias = in[size_t(mi.bias)]->data.data();
    c.mask.bias_batch = in[size_t(mi.bias)]->type.shape[0];
    c.mask.bias_heads = in[size_t(mi.bias)]->type.shape[1];
  }
  // The run-time inputs as the fast kernels check them (segments non-decreasing, ...): the reference
  // assumes what they check.
  ASPEN_RETURN_IF_ERROR(kernels::check_attention_mask(c.B, c.H, c.Hk, c.T, c.S, c.D, float(c.scale), c.mask));
  return c;
}

Status eval_attention(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const AttentionCall c, attention_call(n, in, 3));
  kernels::ref::attention_forward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                          out[0].data.data(), out[1].data.data(), c.B, c.H, c.Hk, c.T, c.S, c.D, c.scale,
                                          c.mask, c.bias);
  return Status();
}

Status eval_attention_grad(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const AttentionCall c, attention_call(n, in, 6));
  kernels::ref::attention_backward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                           in[3]->data.data(), in[4]->data.data(), in[5]->data.data(),
                                           out[0].data.data(), out[1].data.data(), out[2].data.data(), c.B, c.H,
                                           c.Hk, c.T, c.S, c.D, c.scale, c.mask, c.bias ? out[3].data.data() : nullptr,
                                           c.bias);
  return Status();
}

Grads grad_attention(Builder& b, const Node& n, OutGrads g) {
  ASPEN_RETURN_IF_ERROR(first_output_only(n, g, {"out", "lse"}));
  if (!g[0]) return no_grads(n);
  std::vector<ValueId> ins{n.inputs[0], n.inputs[1], n.inputs[2], n.outputs[0], n.outputs[1], *g[0]};
  for (size_t i = 3; i < n.inputs.size(); ++i) ins.push_back(n.inputs[i]);  // key_valid, segments, layout, bias
  std::vector<ValueId> d = b.op(OpKind::attention_grad, std::move(ins), n.attrs);
  if (d.size() != 3 && d.size() != 4) return no_grads(n);
  std::vector<std::optional<ValueId>> r{d[0], d[1], d[2]};
  for (size_t i = 3; i < n.inputs.size(); ++i) r.push_back(std::nullopt);
  if (d.size() == 4) {  // the bias is the last input: dbias summed over the dimensions it broadcasts
    const Shape bias = b.type(n.inputs.back()).shape, full = b.type(d[3]).shape;
    std::vector<int64_t> axes;
    for (int a : {0, 1})
      if (bias[a] != full[a]) axes.push_back(a);
    r.back() = axes.empty() ? d[3] : b.reduce_sum(d[3], axes, /*keepdims=*/true);
  }
  return r;
}

// attention(q, k, v[, key_valid][, segments]) -> (out, lse); attention_grad(q, k, v, out, lse, g[, key_valid]
// [, segments]) -> (dq, dk, dv). The mask is decided here; key_valid (u8 or bool) and segments (i32) are bound
// to it at each run.
Prepared prepare_attention(const Node& n, Types in, Types out) {
  // f32 throughout, or q, k, v bf16 with out_dtype f32 (everything else f32)
  const bool half = n.attrs.has("out_dtype") && in[0].dtype == DType::bf16;
  if (half ? !floats_are_f32(in.subspan(3), out) : !floats_are_f32(in, out)) return no_fast_kernel();
  const Shape &q = in[0].shape, &k = in[1].shape;
  const int64_t B = q[0], H = q[1], Hk = k[1], T = q[2], S = k[2], D = q[3];
  ASPEN_ASSIGN_OR_RETURN(const kernels::AttentionMask mask, mask_of(n, T, S));
  const int64_t nq = q.numel(), nk = k.numel(), nl = B * H * T;
  const float scale = float(n.attrs.f("scale"));
  const bool forward = n.op == OpKind::attention;
  ASPEN_ASSIGN_OR_RETURN(const MaskInputs mi, mask_inputs(n, in, forward ? 3 : 6));
  const int kv = mi.key_valid, seg = mi.segments, lay = mi.layout;
  const int64_t layout_n = lay >= 0 ? in[size_t(lay)].shape.numel() : 0;
  const int64_t layout_heads = lay >= 0 ? in[size_t(lay)].shape[0] : 1;
  const int64_t layout_block = lay >= 0 ? n.attrs.i("layout_block") : 0;
  const std::vector<float> slopes = slopes_of(n, H);
  const int bi = mi.bias;
  const int64_t bias_n = bi >= 0 ? in[size_t(bi)].shape.numel() : 0;
  const int64_t bias_batch = bi >= 0 ? in[size_t(bi)].shape[0] : 1, bias_heads = bi >= 0 ? in[size_t(bi)].shape[1] : 1;
  const auto bind = [=](In i) {  // slopes copied in: the span below points into this lambda
    kernels::AttentionMask m = mask;
    m.alibi_slopes = slopes;
    if (bi >= 0) {
      m.bias = in_span<float>(i, size_t(bi), bias_n);
      m.bias_batch = bias_batch;
      m.bias_heads = bias_heads;
    }
    if (kv >= 0) m.key_valid = in_span<uint8_t>(i, size_t(kv), B * S);
    if (seg >= 0) m.segments = in_span<int32_t>(i, size_t(seg), B * S);
    if (lay >= 0) {
      m.layout = in_span<uint8_t>(i, size_t(lay), layout_n);
      m.layout_block = layout_block;
      m.layout_heads = layout_heads;
    }
    return m;
  };
  // q, k and v in their dtype E (float, or bf16 with out_dtype f32); everything else f32
  const auto kernel = [=]<class E>(E) {
    if (forward)
      return make_kernel([=](In i, Out o) {
        const kernels::AttentionMask m = bind(i);
        return kernels::attention_forward(in_span<E>(i, 0, nq), in_span<E>(i, 1, nk), in_span<E>(i, 2, nk),
                                          out_span<float>(o, 0, nq), out_span<float>(o, 1, nl), B, H, Hk, T, S, D,
                                          scale, m);
      });
    return make_kernel([=](In i, Out o) {
      const kernels::AttentionMask m = bind(i);
      return kernels::attention_backward(in_span<E>(i, 0, nq), in_span<E>(i, 1, nk), in_span<E>(i, 2, nk),
                                         in_span<float>(i, 3, nq), in_span<float>(i, 4, nl), in_span<float>(i, 5, nq),
                                         out_span<float>(o, 0, nq), out_span<float>(o, 1, nk),
                                         out_span<float>(o, 2, nk), B, H, Hk, T, S, D, scale, m,
                                         bi >= 0 ? out_span<float>(o, 3, nl * S) : std::span<float>{});
    });
  };
  return half ? kernel(bf16{}) : kernel(float{});
}

// Samples for the kernel sweep (graph/op_sample.h). FlashAttention's online softmax rounds differently
// from the materialized f64 reference, but at these sizes the error stays near 3e-7 of the output's scale
// (measured), so the common 1e-5 holds. Batch 0 has no valid key (out 0, lse -inf, zero gradients)
// whenever key_valid is given; batch 1 has key 0 valid, so every causal row has one.
struct AttentionCase {
  int64_t T, S;
  const char* mask;
  int64_t kv_offset, window;
  DType key_valid;  // f32: none
  int64_t Hk = 3;   // key/value heads (q has 3): 1 is multi-query attention
  bool segments = false;  // documents of 3, 2 and the rest of the keys (block-diagonal)
  int64_t window_right = 0;
  bool bottom_right = false;  // align "bottom_right" instead of kv_offset
  int64_t layout_block = 0;   // > 0: a block layout [H, ., .] with a checkerboard of blocks on
  double alibi = 0;           // > 0: alibi_bias_max
  int bias = 0;               // a bias input: 1 [1, H, T, S], 2 [B, 1, T, S], 3 [B, H, T, S]
};
constexpr AttentionCase kAttentionCases[] = {{5, 5, "none", 0, 0, DType::f32},   {3, 7, "causal", 4, 0, DType::f32},
                                             {6, 6, "causal", 0, 0, DType::u8},  {4, 9, "causal", 5, 0, DType::boolean},
                                             {7, 7, "local", 0, 3, DType::f32},  {5, 5, "none", 0, 0, DType::boolean},
                                             {1, 11, "causal", 10, 0, DType::u8},
                                             {6, 6, "causal", 0, 0, DType::u8, 1},    {7, 7, "local", 0, 3, DType::f32, 1},
                                             {1, 11, "causal", 10, 0, DType::f32, 1},
                                             {7, 7, "causal", 0, 0, DType::f32, 3, true},
                                             {6, 6, "local", 0, 2, DType::u8, 1, true, 1},
                                             {8, 8, "none", 0, 0, DType::boolean, 3, true},
                                             {4, 9, "causal", 0, 0, DType::f32, 3, false, 0, true},
                                             {3, 8, "local", 0, 4, DType::f32, 3, true, 2, true},
                                             {9, 9, "causal", 0, 0, DType::f32, 3, false, 0, false, 2},
                                             {7, 10, "none", 0, 0, DType::u8, 1, true, 0, false, 3},
                                             {6, 9, "causal", 3, 0, DType::u8, 1, false, 0, false, 0, 8.0},
                                             {5, 5, "local", 0, 2, DType::f32, 3, true, 0, false, 0, 4.0},
                                             {4, 6, "causal", 2, 0, DType::f32, 3, false, 0, false, 0, 0, 1},
                                             {5, 5, "none", 0, 0, DType::u8, 1, false, 0, false, 0, 0, 2},
                                             {6, 6, "local", 0, 3, DType::f32, 3, true, 0, false, 2, 0, 3}};

// attention(q, k, v[, key_valid]) and, with grad, attention_grad after it (so that out and lse are the
// forward's, as the fast backward requires).
void attention_samples(SampleList& s, bool grad) {
  constexpr int64_t B = 2, H = 3, D = 9;
  for (const AttentionCase& c : kAttentionCases) {
    SampleFeeds f{.seed = 5, .int_hi = 2};
    if (c.key_valid != DType::f32) {
      std::vector<double>& kv = f.values["key_valid"];
      kv.assign(size_t(c.S), 0.0);
      for (int64_t j = 0; j < c.S; ++j) kv.push_back(j % 3 != 1 ? 1.0 : 0.0);
    }
    if (c.segments) {  // batch 0: documents of 3, 2 and the rest; batch 1: one document, ids from 4
      std::vector<double>& sg = f.values["segments"];
      for (int64_t j = 0; j < c.S; ++j) sg.push_back(j < 3 ? 0.0 : j < 5 ? 1.0 : 2.0);
      for (int64_t j = 0; j < c.S; ++j) sg.push_back(4.0);
    }
    const int64_t lrows = c.layout_block ? (c.kv_offset + c.T + c.layout_block - 1) / c.layout_block : 0,
                  lcols = c.layout_block ? (c.S + c.layout_block - 1) / c.layout_block : 0;
    if (c.layout_block) {  // a checkerboard per head, shifted by the head; the diagonal always on
      std::vector<double>& l = f.values["layout"];
      for (int64_t h = 0; h < H; ++h)
        for (int64_t r = 0; r < lrows; ++r)
          for (int64_t k = 0; k < lcols; ++k) l.push_back((r + k + h) % 2 == 0 || r == k ? 1.0 : 0.0);
    }
    s.add(
        std::string(c.mask) + " T " + std::to_string(c.T) + " S " + std::to_string(c.S) + " key_valid " +
            std::string(dtype_name(c.key_valid)) + " Hk " + std::to_string(c.Hk) + (c.segments ? " segments" : "") +
            " window_right " + std::to_string(c.window_right) + (c.bottom_right ? " bottom_right" : "") +
            " layout_block " + std::to_string(c.layout_block) + " alibi " + std::to_string(c.alibi) + " bias " +
            std::to_string(c.bias),
        [&](Builder& b) {
          const ValueId q = b.input("q", DType::f32, Shape{B, H, c.T, D});
          const ValueId k = b.input("k", DType::f32, Shape{B, c.Hk, c.S, D}),
                        v = b.input("v", DType::f32, Shape{B, c.Hk, c.S, D});
          std::vector<ValueId> in{q, k, v};
          if (c.key_valid != DType::f32) in.push_back(b.input("key_valid", c.key_valid, Shape{B, c.S}));
          if (c.segments) in.push_back(b.input("segments", DType::i32, Shape{B, c.S}));
          if (c.layout_block) in.push_back(b.input("layout", DType::u8, Shape{H, lrows, lcols}));
          if (c.bias) in.push_back(b.input("bias", DType::f32, Shape{c.bias == 1 ? 1 : B, c.bias == 2 ? 1 : H, c.T, c.S}));
          Attrs a{{"scale", 1.0 / std::sqrt(double(D))}, {"mask", std::string(c.mask)}};
          if (c.bottom_right)
            a.set("align", std::string("bottom_right"));
          else
            a.set("kv_offset", c.kv_offset);
          if (c.window) a.set("window", c.window);
          if (c.window_right) a.set("window_right", c.window_right);
          if (c.layout_block) a.set("layout_block", c.layout_block);
          if (c.alibi > 0) a.set("alibi_bias_max", c.alibi);
          std::vector<ValueId> y = b.op(OpKind::attention, in, a);
          if (!grad || y.size() != 2) return;
          std::vector<ValueId> gin{q, k, v, y[0], y[1], b.input("g", DType::f32, Shape{B, H, c.T, D})};
          gin.insert(gin.end(), in.begin() + 3, in.end());
          b.op(OpKind::attention_grad, gin, a);
        },
        std::move(f));
  }
}
// bf16 q, k and v with out_dtype f32 (the bf16 kernels: p, and in the backward dout and ds, rounded to bf16,
// so the worst element is further from the f64 reference than f32's 1e-5): causal with padding, a local
// window with grouped-query heads, a bias (and its gradient).
void bf16_attention_samples(SampleList& s, bool grad) {
  struct Bf16Case {
    const char* mask;
    int64_t T, S, Hk, window;
    bool key_valid, bias;
  };
  for (const Bf16Case& c : {Bf16Case{"causal", 70, 70, 2, 0, true, false}, Bf16Case{"local", 40, 90, 1, 17, false, false},
                            Bf16Case{"none", 33, 65, 2, 0, false, true}}) {
    s.add(std::string("bf16 out_dtype f32 ") + c.mask + " T " + std::to_string(c.T) + " S " + std::to_string(c.S),
          [c, grad](Builder& b) {
            const int64_t B = 2, H = 2, D = 16;
            const ValueId q = b.input("q", DType::bf16, Shape{B, H, c.T, D});
            const ValueId k = b.input("k", DType::bf16, Shape{B, c.Hk, c.S, D}),
                          v = b.input("v", DType::bf16, Shape{B, c.Hk, c.S, D});
            std::vector<ValueId> in{q, k, v};
            if (c.key_valid) in.push_back(b.input("key_valid", DType::u8, Shape{B, c.S}));
            if (c.bias) in.push_back(b.input("bias", DType::f32, Shape{1, H, c.T, c.S}));
            Attrs a{{"scale", 0.25}, {"mask", std::string(c.mask)}, {"out_dtype", int64_t(DType::f32)}};
            if (c.window) a.set("window", c.window);
            if (std::string(c.mask) != "none") a.set("kv_offset", c.S - c.T);
            std::vector<ValueId> y = b.op(OpKind::attention, in, a);
            if (!grad || y.size() != 2) return;
            std::vector<ValueId> gin{q, k, v, y[0], y[1], b.input("g", DType::f32, Shape{B, H, c.T, D})};
            gin.insert(gin.end(), in.begin() + 3, in.end());
            b.op(OpKind::attention_grad, gin, a);
          },
          SampleFeeds{.seed = 9, .int_hi = 2})
        .tol = grad ? 3e-2 : 1e-2;
  }
}

void samples_attention(SampleList& s) {
  attention_samples(s, false);
  bf16_attention_samples(s, false);
  s.add("bf16", [](Builder& b) {
     const Shape t{1, 2, 3, 4};
     b.op(OpKind::attention, {b.input("q", DType::bf16, t), b.input("k", DType::bf16, t), b.input("v", DType::bf16, t)},
          {{"scale", 0.5}, {"mask", std::string("causal")}});
   }).fast = false;
}
void samples_attention_grad(SampleList& s) {
  attention_samples(s, true);
  bf16_attention_samples(s, true);
}

}  // namespace

void register_attention_ops(OpTable& t) {
  const std::vector<AttrSpec> attention_attrs = {{"scale", AttrKind::f64, true},
                                                 {"mask", AttrKind::str, true},
                                                 {"window", AttrKind::i64, false},
                                                 {"window_right", AttrKind::i64, false},
                                                 {"kv_offset", AttrKind::i64, false},
                                                 {"align", AttrKind::str, false},
                                                 {"layout_block", AttrKind::i64, false},
                                                 {"alibi_bias_max", AttrKind::f64, false},
                                                 {"out_dtype", AttrKind::i64, false}};
  t.define(OpKind::attention, {.min_inputs = 3,
                               .max_inputs = 7,
                               .attrs = attention_attrs,
                               .infer = infer_attention,
                               .grad = grad_attention,
                               .eval = eval_attention,
                               .prepare = prepare_attention,
                               .samples = samples_attention});
  t.define(OpKind::attention_grad, {.min_inputs = 6,
                                    .max_inputs = 10,
                                    .attrs = attention_attrs,
                                    .infer = infer_attention_grad,
                                    .eval = eval_attention_grad,
                                    .prepare = prepare_attention,
                                    .samples = samples_attention_grad});
}

}  // namespace aspen::graph
