// graph/ops_nn.cc: neural-network blocks, each the graph form of a kernel of
// kernels/ (its reference template, in f64, is the op's meaning).
//
//   matmul: ops_matmul.cc
//   layernorm(x, gamma, beta) {eps}: over the last axis C; outputs y (x's type), mean, rstd (f32, x's shape
//       without the last dimension)                                                  (kernels/norm.h)
//   rmsnorm(x, gamma) {eps}: outputs y, rstd (f32 [R...])                           (kernels/norm.h)
//   softmax(x): over the last axis                                                   (kernels/softmax.h)
//   cross_entropy(logits [R, V], targets i32/i64 [R]) {ignore_index = -100}: outputs the mean loss over
//       non-ignored rows (rank 0), loss per row [R] (logits' dtype), lse [R] (f32)    (kernels/softmax.h)
//   rotary(x [B, T, H, D], positions i32 [B, T]) {rotary_dim, layout: "interleaved" | "half_split",
//       base = 10000, inverse = 0, scaling: "none" | "linear" | "llama3" | "dynamic", factor, low_freq_factor,
//       high_freq_factor, original_max_positions}: rotates by +angle, or by -angle with inverse; the
//       frequencies are kernels::RotaryFrequencies (HF's rope_scaling; dynamic from the largest of the
//       positions)                                                                  (kernels/rotary.h)
//   attention(q [B, H, T, D], k, v [B, H, S, D][, key_valid u8/bool [B, S]]) {scale, mask: "none" | "causal" |
//       "local", window, kv_offset}: outputs out [B, H, T, D], lse (f32 [B, H, T])   (ops_attention.cc)
// Saved statistics (mean, rstd, lse) are f32 whatever the input's float type,
// as the kernels keep them; every other input of an op shares one dtype.
//
// Gradient rules (only the first output is differentiated; a gradient
// reaching a statistic or per-row loss is Unimplemented):
//   layernorm:     (dx, dgamma, dbeta) = layernorm_grad(x, gamma, mean, rstd, g)
//   rmsnorm:       (dx, dgamma) = rmsnorm_grad(x, gamma, rstd, g)
//   softmax:       dx = softmax_grad(y, g)
//   cross_entropy: dlogits = cross_entropy_grad(logits, targets, lse, g) {ignore_index}; none to targets
//   rotary:        dx = rotary(g, positions) {inverse = !inverse} (the rotation is orthogonal); none to positions
//   attention:     (dq, dk, dv) = attention_grad(q, k, v, out, lse, g[, key_valid]) {same attributes}
//   *_grad ops:    not differentiated again.
#include <cmath>
#include <limits>
#include <memory>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "graph/ops_util.h"
#include "kernels/norm.h"
#include "kernels/rotary.h"
#include "kernels/softmax.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using namespace nnutil;

// ---- layernorm / rmsnorm --------------------------------------------------------

Status infer_layernorm(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t C, last_axis(n, "x", in[0]));
  const TensorType row{in[0].dtype, Shape{C}};
  ASPEN_RETURN_IF_ERROR(expect_type(n, "gamma", in[1], row, "x's last dimension and dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "beta", in[2], row, "x's last dimension and dtype"));
  ASPEN_RETURN_IF_ERROR(expect_eps(n));
  const TensorType stat{kStat, drop_last(in[0].shape)};
  out = {in[0], stat, stat};
  return Status();
}

Status infer_rmsnorm(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t C, last_axis(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(
      expect_type(n, "gamma", in[1], TensorType{in[0].dtype, Shape{C}}, "x's last dimension and dtype"));
  ASPEN_RETURN_IF_ERROR(expect_eps(n));
  out = {in[0], TensorType{kStat, drop_last(in[0].shape)}};
  return Status();
}

// layernorm_grad(x, gamma, mean, rstd, g) and rmsnorm_grad(x, gamma, rstd, g).
Status infer_norm_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t C, last_axis(n, "x", in[0]));
  const TensorType row{in[0].dtype, Shape{C}};
  ASPEN_RETURN_IF_ERROR(expect_type(n, "gamma", in[1], row, "x's last dimension and dtype"));
  const TensorType stat{kStat, drop_last(in[0].shape)};
  const bool ln = n.op == OpKind::layernorm_grad;
  if (ln) ASPEN_RETURN_IF_ERROR(expect_type(n, "mean", in[2], stat, "the forward's saved statistic"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "rstd", in[ln ? 3 : 2], stat, "the forward's saved statistic"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "g", in[ln ? 4 : 3], in[0], "x's type"));
  out = ln ? std::vector<TensorType>{in[0], row, row} : std::vector<TensorType>{in[0], row};
  return Status();
}

Status eval_layernorm(const Node& n, Ins in, Outs out) {
  const Shape& s = in[0]->type.shape;
  kernels::ref::layernorm_forward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                          out[0].data.data(), out[1].data.data(), out[2].data.data(), rows_of(s),
                                          s[-1], n.attrs.f("eps"));
  return Status();
}

Status eval_layernorm_grad(const Node&, Ins in, Outs out) {
  const Shape& s = in[0]->type.shape;
  kernels::ref::layernorm_backward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                           in[3]->data.data(), in[4]->data.data(), out[0].data.data(),
                                           out[1].data.data(), out[2].data.data(), rows_of(s), s[-1]);
  return Status();
}

Status eval_rmsnorm(const Node& n, Ins in, Outs out) {
  const Shape& s = in[0]->type.shape;
  kernels::ref::rmsnorm_forward<double>(in[0]->data.data(), in[1]->data.data(), out[0].data.data(),
                                        out[1].data.data(), rows_of(s), s[-1], n.attrs.f("eps"));
  return Status();
}

Status eval_rmsnorm_grad(const Node&, Ins in, Outs out) {
  const Shape& s = in[0]->type.shape;
  kernels::ref::rmsnorm_backward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                         in[3]->data.data(), out[0].data.data(), out[1].data.data(), rows_of(s),
                                         s[-1]);
  return Status();
}

Grads grad_layernorm(Builder& b, const Node& n, OutGrads g) {
  ASPEN_RETURN_IF_ERROR(first_output_only(n, g, {"y", "mean", "rstd"}));
  if (!g[0]) return no_grads(n);
  std::vector<ValueId> d = b.op(OpKind::layernorm_grad, {n.inputs[0], n.inputs[1], n.outputs[1], n.outputs[2], *g[0]});
  if (d.size() != 3) return no_grads(n);  // the builder's status holds the error
  return std::vector<std::optional<ValueId>>{d[0], d[1], d[2]};
}

Grads grad_rmsnorm(Builder& b, const Node& n, OutGrads g) {
  ASPEN_RETURN_IF_ERROR(first_output_only(n, g, {"y", "rstd"}));
  if (!g[0]) return no_grads(n);
  std::vector<ValueId> d = b.op(OpKind::rmsnorm_grad, {n.inputs[0], n.inputs[1], n.outputs[1], *g[0]});
  if (d.size() != 2) return no_grads(n);
  return std::vector<std::optional<ValueId>>{d[0], d[1]};
}

// ---- softmax ------------------------------------------------------------------------

Status infer_softmax(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(last_axis(n, "x", in[0]).status());
  out = {in[0]};
  return Status();
}

// softmax_grad(y, g).
Status infer_softmax_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(last_axis(n, "y", in[0]).status());
  ASPEN_RETURN_IF_ERROR(expect_type(n, "g", in[1], in[0], "y's type"));
  out = {in[0]};
  return Status();
}

Status eval_softmax(const Node&, Ins in, Outs out) {
  const Shape& s = in[0]->type.shape;
  kernels::ref::softmax_forward<double>(in[0]->data.data(), out[0].data.data(), rows_of(s), s[-1]);
  return Status();
}

Status eval_softmax_grad(const Node&, Ins in, Outs out) {
  const Shape& s = in[0]->type.shape;
  kernels::ref::softmax_backward<double>(in[0]->data.data(), in[1]->data.data(), out[0].data.data(), rows_of(s),
                                         s[-1]);
  return Status();
}

Grads grad_softmax(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::softmax_grad, {n.outputs[0], *g[0]})};
}

// ---- cross_entropy --------------------------------------------------------------------

Result<int32_t> ignore_index_of(const Node& n) {
  const int64_t v = n.attrs.i_or("ignore_index", kernels::kIgnoreIndex);
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    return rule_error(n, "ignore_index", "a value in the int32 range", str(v));
  return int32_t(v);
}

// logits [R, V] float with V >= 1, targets i32/i64 [R]. Returns R.
Result<int64_t> check_logits_targets(const Node& n, const TensorType& logits, const TensorType& targets) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "logits", logits));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "logits", logits, 2, 2));
  if (logits.shape[1] < 1) return rule_error(n, "logits: dimension 1 (V)", ">= 1", logits.to_string());
  ASPEN_RETURN_IF_ERROR(expect_int(n, "targets", targets));
  const int64_t R = logits.shape[0];
  if (targets.shape != Shape{R})
    return rule_error(n, "targets", Shape{R}.to_string() + " (one per row of logits)", targets.to_string());
  ASPEN_RETURN_IF_ERROR(ignore_index_of(n).status());
  return R;
}

Status infer_cross_entropy(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t R, check_logits_targets(n, in[0], in[1]));
  out = {TensorType{in[0].dtype, Shape{}}, TensorType{in[0].dtype, Shape{R}}, TensorType{kStat, Shape{R}}};
  return Status();
}

// cross_entropy_grad(logits, targets, lse, g).
Status infer_cross_entropy_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t R, check_logits_targets(n, in[0], in[1]));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "lse", in[2], TensorType{kStat, Shape{R}}, "the forward's saved statistic"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "g", in[3], TensorType{in[0].dtype, Shape{}}, "the mean loss's type"));
  out = {in[0]};
  return Status();
}

std::string int_string(double v) {
  return std::fabs(v) < 9e18 && v == std::trunc(v) ? str(int64_t(v)) : std::to_string(v);
}

// The targets as int32, each a class in [0, V) or ignore_index.
Result<std::vector<int32_t>> targets_of(const Node& n, const HostArray& t, int64_t V, int32_t ignore) {
  std::vector<int32_t> r(t.data.size());
  for (size_t i = 0; i < r.size(); ++i) {
    const double v = t.data[i];
    if (v != double(ignore) && !(v >= 0 && v < double(V)))
      return Status::error(Code::kOutOfRange, std::string(op_name(n.op)) + ": targets row " + std::to_string(i),
                           "a class index in [0, " + str(V) + ") or ignore_index " + str(ignore), int_string(v));
    r[i] = int32_t(v);
  }
  return r;
}

Status eval_cross_entropy(const Node& n, Ins in, Outs out) {
  const int64_t R = in[0]->type.shape[0], V = in[0]->type.shape[1];
  ASPEN_ASSIGN_OR_RETURN(const int32_t ignore, ignore_index_of(n));
  ASPEN_ASSIGN_OR_RETURN(std::vector<int32_t> t, targets_of(n, *in[1], V, ignore));
  kernels::ref::cross_entropy_forward<double>(in[0]->data.data(), t.data(), out[1].data.data(), out[2].data.data(),
                                              out[0].data.data(), R, V, ignore);
  return Status();
}

Status eval_cross_entropy_grad(const Node& n, Ins in, Outs out) {
  const int64_t R = in[0]->type.shape[0], V = in[0]->type.shape[1];
  ASPEN_ASSIGN_OR_RETURN(const int32_t ignore, ignore_index_of(n));
  ASPEN_ASSIGN_OR_RETURN(std::vector<int32_t> t, targets_of(n, *in[1], V, ignore));
  kernels::ref::cross_entropy_backward<double>(in[0]->data.data(), t.data(), in[2]->data.data(), out[0].data.data(),
                                               R, V, in[3]->data[0], ignore);
  return Status();
}

Grads grad_cross_entropy(Builder& b, const Node& n, OutGrads g) {
  ASPEN_RETURN_IF_ERROR(first_output_only(n, g, {"mean loss", "loss", "lse"}));
  if (!g[0]) return no_grads(n);
  Attrs a;
  if (n.attrs.has("ignore_index")) a.set("ignore_index", n.attrs.i("ignore_index"));
  ValueId d = b.op1(OpKind::cross_entropy_grad, {n.inputs[0], n.inputs[1], n.outputs[2], *g[0]}, std::move(a));
  return std::vector<std::optional<ValueId>>{d, std::nullopt};
}

// ---- rotary ------------------------------------------------------------------------------

struct RotaryArgs {
  int64_t rotary_dim = 0;
  kernels::RotaryLayout layout = kernels::RotaryLayout::interleaved;
  kernels::RotaryFrequencies freq;
  bool inverse = false;
};

Result<RotaryArgs> rotary_args(const Node& n, int64_t D) {
  RotaryArgs r;
  r.rotary_dim = n.attrs.i("rotary_dim");
  if (r.rotary_dim < 0 || r.rotary_dim > D || r.rotary_dim % 2 != 0)
    return rule_error(n, "rotary_dim", "an even number in [0, " + str(D) + "] (D = x's last dimension)",
                      str(r.rotary_dim));
  const std::string& layout = n.attrs.s("layout");
  if (layout == "interleaved") r.layout = kernels::RotaryLayout::interleaved;
  else if (layout == "half_split") r.layout = kernels::RotaryLayout::half_split;
  else return rule_error(n, "layout", "\"interleaved\" or \"half_split\"", "\"" + layout + "\"");
  const double base = n.attrs.f_or("base", 10000.0);
  r.freq.base = float(base);
  if (!(base > 0) || !std::isfinite(r.freq.base) || !(r.freq.base > 0))
    return rule_error(n, "base", "a number > 0, finite in f32", std::to_string(base));
  using Scaling = kernels::RotaryFrequencies::Scaling;
  const std::string scaling = n.attrs.has("scaling") ? n.attrs.s("scaling") : "none";
  if (scaling == "none") r.freq.scaling = Scaling::none;
  else if (scaling == "linear") r.freq.scaling = Scaling::linear;
  else if (scaling == "llama3") r.freq.scaling = Scaling::llama3;
  else if (scaling == "dynamic") r.freq.scaling = Scaling::dynamic;
  else return rule_error(n, "scaling", "\"none\", \"linear\", \"llama3\" or \"dynamic\"", "\"" + scaling + "\"");
  r.freq.factor = n.attrs.f_or("factor", 1.0);
  r.freq.low_freq_factor = n.attrs.f_or("low_freq_factor", 1.0);
  r.freq.high_freq_factor = n.attrs.f_or("high_freq_factor", 4.0);
  r.freq.original_max_positions = n.attrs.i_or("original_max_positions", 8192);
  if (r.freq.scaling != Scaling::none && !(r.freq.factor > 0 && std::isfinite(r.freq.factor)))
    return rule_error(n, "factor", "a finite number > 0", std::to_string(r.freq.factor));
  if (r.freq.scaling == Scaling::llama3 &&
      !(r.freq.low_freq_factor > 0 && r.freq.high_freq_factor > r.freq.low_freq_factor &&
        std::isfinite(r.freq.high_freq_factor) && r.freq.original_max_positions > 0))
    return rule_error(n, "low_freq_factor, high_freq_factor, original_max_positions",
                      "0 < low_freq_factor < high_freq_factor (finite) and original_max_positions > 0",
                      std::to_string(r.freq.low_freq_factor) + ", " + std::to_string(r.freq.high_freq_factor) + ", " +
                          str(r.freq.original_max_positions));
  if (r.freq.scaling == Scaling::dynamic && r.freq.original_max_positions <= 0)
    return rule_error(n, "original_max_positions", "> 0 with dynamic scaling", str(r.freq.original_max_positions));
  ASPEN_ASSIGN_OR_RETURN(r.inverse, flag(n, "inverse"));
  return r;
}

Status infer_rotary(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "x", in[0], 4, 4));
  const Shape& x = in[0].shape;
  ASPEN_RETURN_IF_ERROR(
      expect_type(n, "positions", in[1], TensorType{DType::i32, Shape{x[0], x[1]}}, "i32 [B, T] of x [B, T, H, D]"));
  ASPEN_RETURN_IF_ERROR(rotary_args(n, x[3]).status());
  out = {in[0]};
  return Status();
}

Status eval_rotary(const Node& n, Ins in, Outs out) {
  const Shape& x = in[0]->type.shape;
  ASPEN_ASSIGN_OR_RETURN(const RotaryArgs r, rotary_args(n, x[3]));
  std::vector<int32_t> pos(in[1]->data.size());
  for (size_t i = 0; i < pos.size(); ++i) {
    const double v = in[1]->data[i];
    if (!(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()))
      return Status::error(Code::kOutOfRange, "rotary: positions element " + std::to_string(i), "an int32 value",
                           int_string(v));
    pos[i] = int32_t(v);
  }
  auto* f = r.inverse ? &kernels::ref::rotary_backward<double> : &kernels::ref::rotary_forward<double>;
  f(in[0]->data.data(), pos.data(), out[0].data.data(), x[0], x[1], x[2], x[3], r.rotary_dim, r.layout,
    kernels::rotary_run_frequencies(r.freq, pos));
  return Status();
}

Grads grad_rotary(Builder& b, const Node& n, OutGrads g) {
  Attrs a = n.attrs;
  a.set("inverse", int64_t(n.attrs.i_or("inverse", 0) == 0 ? 1 : 0));
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::rotary, {*g[0], n.inputs[1]}, std::move(a)),
                                             std::nullopt};
}

// ---- fast kernels ---------------------------------------------------------------------------
// f32 only: a node with any bf16 or f16 value gets no fast kernel, and lowering runs the reference.
// Index inputs are adapted, not refused: i64 targets are narrowed to the kernels' int32 into a scratch
// buffer the kernel owns (sized at prepare: run() does not allocate); bool and u8 key_valid are both one
// byte per flag, nonzero meaning "attend", which is how the attention kernels read a uint8 mask.


// layernorm(x, gamma, beta) -> (y, mean, rstd); layernorm_grad(x, gamma, mean, rstd, g) -> (dx, dgamma, dbeta).
Prepared prepare_layernorm(const Node& n, Types in, Types out) {
  if (!floats_are_f32(in, out)) return no_fast_kernel();
  const Shape& s = in[0].shape;
  const int64_t R = rows_of(s), C = s[-1], N = s.numel();
  if (n.op == OpKind::layernorm) {
    const float eps = float(n.attrs.f("eps"));
    return make_kernel([R, C, N, eps](In i, Out o) {
      return kernels::layernorm_forward(in_span<float>(i, 0, N), in_span<float>(i, 1, C), in_span<float>(i, 2, C),
                                        out_span<float>(o, 0, N), out_span<float>(o, 1, R), out_span<float>(o, 2, R),
                                        R, C, eps);
    });
  }
  return make_kernel([R, C, N](In i, Out o) {
    return kernels::layernorm_backward(in_span<float>(i, 0, N), in_span<float>(i, 1, C), in_span<float>(i, 2, R),
                                       in_span<float>(i, 3, R), in_span<float>(i, 4, N), out_span<float>(o, 0, N),
                                       out_span<float>(o, 1, C), out_span<float>(o, 2, C), R, C);
  });
}

// rmsnorm(x, gamma) -> (y, rstd); rmsnorm_grad(x, gamma, rstd, g) -> (dx, dgamma).
Prepared prepare_rmsnorm(const Node& n, Types in, Types out) {
  if (!floats_are_f32(in, out)) return no_fast_kernel();
  const Shape& s = in[0].shape;
  const int64_t R = rows_of(s), C = s[-1], N = s.numel();
  if (n.op == OpKind::rmsnorm) {
    const float eps = float(n.attrs.f("eps"));
    return make_kernel([R, C, N, eps](In i, Out o) {
      return kernels::rmsnorm_forward(in_span<float>(i, 0, N), in_span<float>(i, 1, C), out_span<float>(o, 0, N),
                                      out_span<float>(o, 1, R), R, C, eps);
    });
  }
  return make_kernel([R, C, N](In i, Out o) {
    return kernels::rmsnorm_backward(in_span<float>(i, 0, N), in_span<float>(i, 1, C), in_span<float>(i, 2, R),
                                     in_span<float>(i, 3, N), out_span<float>(o, 0, N), out_span<float>(o, 1, C), R,
                                     C);
  });
}

// softmax(x) -> y; softmax_grad(y, g) -> dx.
Prepared prepare_softmax(const Node& n, Types in, Types out) {
  if (!floats_are_f32(in, out)) return no_fast_kernel();
  const Shape& s = in[0].shape;
  const int64_t R = rows_of(s), C = s[-1], N = s.numel();
  if (n.op == OpKind::softmax)
    return make_kernel([R, C, N](In i, Out o) {
      return kernels::softmax_forward(in_span<float>(i, 0, N), out_span<float>(o, 0, N), R, C);
    });
  return make_kernel([R, C, N](In i, Out o) {
    return kernels::softmax_backward(in_span<float>(i, 0, N), in_span<float>(i, 1, N), out_span<float>(o, 0, N), R,
                                     C);
  });
}

// The targets as the kernels' int32: i32 ones as they are, i64 ones narrowed into `scratch` (R elements,
// allocated at prepare). A value outside int32 is never a class (V is checked by the kernel) nor
// ignore_index (an int32): it is the OutOfRange error the reference reports.
Result<std::span<const int32_t>> targets_i32(const void* p, bool wide, int64_t R, int64_t V, int32_t ignore,
                                              std::vector<int32_t>& scratch, const char* op) {
  if (!wide) return std::span<const int32_t>(static_cast<const int32_t*>(p), size_t(R));
  const int64_t* t = static_cast<const int64_t*>(p);
  for (int64_t r = 0; r < R; ++r) {
    if (t[r] < std::numeric_limits<int32_t>::min() || t[r] > std::numeric_limits<int32_t>::max())
      return Status::error(Code::kOutOfRange, std::string(op) + ": targets row " + str(r),
                           "a class index in [0, " + str(V) + ") or ignore_index " + str(ignore), str(t[r]));
    scratch[size_t(r)] = int32_t(t[r]);
  }
  return std::span<const int32_t>(scratch);
}

// cross_entropy(logits, targets) -> (mean loss, loss, lse), the kernel's mean_loss being output 0;
// cross_entropy_grad(logits, targets, lse, g) -> dlogits, with g (the mean loss's gradient) as dloss_scale.
Prepared prepare_cross_entropy(const Node& n, Types in, Types out) {
  if (!floats_are_f32(in, out)) return no_fast_kernel();
  const int64_t R = in[0].shape[0], V = in[0].shape[1], N = R * V;
  ASPEN_ASSIGN_OR_RETURN(const int32_t ignore, ignore_index_of(n));
  const bool wide = in[1].dtype == DType::i64;
  std::vector<int32_t> scratch(wide ? size_t(R) : 0);
  const char* op = op_name(n.op);
  if (n.op == OpKind::cross_entropy)
    return make_kernel([R, V, N, ignore, wide, scratch = std::move(scratch), op](In i, Out o) mutable {
      ASPEN_ASSIGN_OR_RETURN(const auto targets, targets_i32(i[1], wide, R, V, ignore, scratch, op));
      return kernels::cross_entropy_forward(in_span<float>(i, 0, N), targets, out_span<float>(o, 1, R),
                                            out_span<float>(o, 2, R), out_span<float>(o, 0, 1), R, V, ignore);
    });
  return make_kernel([R, V, N, ignore, wide, scratch = std::move(scratch), op](In i, Out o) mutable {
    ASPEN_ASSIGN_OR_RETURN(const auto targets, targets_i32(i[1], wide, R, V, ignore, scratch, op));
    return kernels::cross_entropy_backward(in_span<float>(i, 0, N), targets, in_span<float>(i, 2, R),
                                           out_span<float>(o, 0, N), R, V, *f32_in(i, 3), ignore);
  });
}

// rotary(x, positions): the forward kernel, or with inverse the backward one (rotation by -angle).
Prepared prepare_rotary(const Node& n, Types in, Types out) {
  if (!floats_are_f32(in, out)) return no_fast_kernel();
  const Shape& x = in[0].shape;
  ASPEN_ASSIGN_OR_RETURN(const RotaryArgs r, rotary_args(n, x[3]));
  const int64_t B = x[0], T = x[1], H = x[2], D = x[3], N = x.numel();
  auto* f = r.inverse ? &kernels::rotary_backward : &kernels::rotary_forward;
  return make_kernel([f, r, B, T, H, D, N](In i, Out o) {
    return f(in_span<float>(i, 0, N), in_span<int32_t>(i, 1, B * T), out_span<float>(o, 0, N), B, T, H, D,
             r.rotary_dim, r.layout, r.freq);
  });
}

// Samples for the kernel sweep (graph/op_sample.h).

void samples_layernorm(SampleList& s) {
  for (const Shape& x : {Shape{2, 3, 13}, Shape{7, 1}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) {
      b.op(OpKind::layernorm,
           {b.input("x", DType::f32, x), b.input("gamma", DType::f32, Shape{x[-1]}),
            b.input("beta", DType::f32, Shape{x[-1]})},
           {{"eps", 1e-5}});
    });
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::layernorm,
          {b.input("x", DType::bf16, Shape{3, 4}), b.input("gamma", DType::bf16, Shape{4}),
           b.input("beta", DType::bf16, Shape{4})},
          {{"eps", 1e-5}});
   }).fast = false;
}

// The backward reads the forward's statistics: each sample runs layernorm first.
void samples_layernorm_grad(SampleList& s) {
  for (const Shape& x : {Shape{2, 3, 13}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) {
      const ValueId in = b.input("x", DType::f32, x), gamma = b.input("gamma", DType::f32, Shape{x[-1]});
      std::vector<ValueId> y =
          b.op(OpKind::layernorm, {in, gamma, b.input("beta", DType::f32, Shape{x[-1]})}, {{"eps", 1e-5}});
      if (y.size() == 3) b.op(OpKind::layernorm_grad, {in, gamma, y[1], y[2], b.input("g", DType::f32, x)});
    });
}

void samples_rmsnorm(SampleList& s) {
  for (const Shape& x : {Shape{5, 11}, Shape{2, 3, 1}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) {
      b.op(OpKind::rmsnorm, {b.input("x", DType::f32, x), b.input("gamma", DType::f32, Shape{x[-1]})}, {{"eps", 1e-6}});
    });
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::rmsnorm, {b.input("x", DType::bf16, Shape{3, 4}), b.input("gamma", DType::bf16, Shape{4})},
          {{"eps", 1e-6}});
   }).fast = false;
}

void samples_rmsnorm_grad(SampleList& s) {
  for (const Shape& x : {Shape{5, 11}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) {
      const ValueId in = b.input("x", DType::f32, x), gamma = b.input("gamma", DType::f32, Shape{x[-1]});
      std::vector<ValueId> y = b.op(OpKind::rmsnorm, {in, gamma}, {{"eps", 1e-6}});
      if (y.size() == 2) b.op(OpKind::rmsnorm_grad, {in, gamma, y[1], b.input("g", DType::f32, x)});
    });
}

// Softmax's fast exp is a few f32 ulps from the C library's; 1e-5 of the output's scale holds with margin
// (about 2.5e-7 measured), for cross-entropy and attention too.
void samples_softmax(SampleList& s) {
  for (const Shape& x : {Shape{3, 5, 11}, Shape{4, 1}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) { b.op(OpKind::softmax, {b.input("x", DType::f32, x)}); },
          {.lo = -4.0, .hi = 4.0});
  s.add("bf16", [](Builder& b) { b.op(OpKind::softmax, {b.input("x", DType::bf16, Shape{3, 5})}); }).fast = false;
}

void samples_softmax_grad(SampleList& s) {
  for (const Shape& x : {Shape{3, 5, 11}, Shape{130, 131}})
    s.add("f32 " + x.to_string(),
          [&](Builder& b) {
            const ValueId y = b.op1(OpKind::softmax, {b.input("x", DType::f32, x)});
            b.op(OpKind::softmax_grad, {y, b.input("g", DType::f32, x)});
          },
          {.lo = -4.0, .hi = 4.0});
}

// i32 targets reach the kernel as they are; i64 ones through the kernel's scratch. Row 1 is ignored
// (-100), and with ignore_index 2 every row whose class is 2.
std::vector<double> ce_targets() { return {3, -100, 6, 0, 2}; }
void samples_cross_entropy(SampleList& s) {
  for (DType tdt : {DType::i32, DType::i64})
    for (int64_t ignore : {-100, 2})
      s.add(std::string("targets ") + std::string(dtype_name(tdt)) + " ignore_index " + std::to_string(ignore),
            [&](Builder& b) {
              b.op(OpKind::cross_entropy,
                   {b.input("logits", DType::f32, Shape{5, 7}), b.input("targets", tdt, Shape{5})},
                   {{"ignore_index", ignore}});
            },
            {.lo = -3.0,
             .hi = 3.0,
             .values = {{"targets", ignore == 2 ? std::vector<double>{3, 2, 6, 0, 2} : ce_targets()}}});
  s.add("bf16 logits", [](Builder& b) {
     b.op(OpKind::cross_entropy,
          {b.input("logits", DType::bf16, Shape{5, 7}), b.input("targets", DType::i32, Shape{5})});
   }).fast = false;
}

void samples_cross_entropy_grad(SampleList& s) {
  for (DType tdt : {DType::i32, DType::i64})
    s.add(std::string("targets ") + std::string(dtype_name(tdt)),
          [&](Builder& b) {
            const ValueId logits = b.input("logits", DType::f32, Shape{5, 7}),
                          targets = b.input("targets", tdt, Shape{5});
            std::vector<ValueId> y = b.op(OpKind::cross_entropy, {logits, targets});
            if (y.size() == 3)
              b.op(OpKind::cross_entropy_grad, {logits, targets, y[2], b.input("g", DType::f32, Shape{})});
          },
          {.lo = -3.0, .hi = 3.0, .values = {{"targets", ce_targets()}}});
}

void samples_rotary(SampleList& s) {
  struct Case {
    const char* layout;
    int64_t rotary_dim, inverse;
    const char* scaling = "none";
  };
  for (const Case& c : {Case{"interleaved", 6, 0}, Case{"interleaved", 8, 1}, Case{"half_split", 8, 1},
                        Case{"half_split", 4, 0}, Case{"half_split", 8, 0, "linear"}, Case{"half_split", 8, 1, "llama3"}})
    s.add(
        std::string(c.layout) + " rotary_dim " + std::to_string(c.rotary_dim) + " inverse " +
            std::to_string(c.inverse) + " scaling " + c.scaling,
        [&](Builder& b) {
          Attrs a{{"rotary_dim", c.rotary_dim}, {"layout", std::string(c.layout)}, {"inverse", c.inverse}, {"base", 500.0}};
          if (std::string(c.scaling) != "none") {
            // llama3 with original_max_positions 40: the 4 frequencies of rotary_dim 8 at base 500 have
            // wavelengths 6.3, 30, 140 and 664 against the bands' 10 and 40: kept, blended, divided, divided
            a.set("scaling", std::string(c.scaling));
            a.set("factor", 3.0);
            a.set("low_freq_factor", 1.0);
            a.set("high_freq_factor", 4.0);
            a.set("original_max_positions", int64_t(40));
          }
          b.op(OpKind::rotary, {b.input("x", DType::f32, Shape{2, 3, 5, 8}), b.input("pos", DType::i32, Shape{2, 3})},
               std::move(a));
        },
        {.int_hi = 37});
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::rotary, {b.input("x", DType::bf16, Shape{1, 2, 1, 4}), b.input("pos", DType::i32, Shape{1, 2})},
          {{"rotary_dim", int64_t(4)}, {"layout", std::string("half_split")}});
   }).fast = false;
}

}  // namespace

void register_nn_ops(OpTable& t) {
  const AttrSpec eps{"eps", AttrKind::f64, true};
  t.define(OpKind::layernorm, {.min_inputs = 3,
                               .max_inputs = 3,
                               .attrs = {eps},
                               .infer = infer_layernorm,
                               .grad = grad_layernorm,
                               .eval = eval_layernorm,
                               .prepare = prepare_layernorm,
                               .samples = samples_layernorm});
  t.define(OpKind::rmsnorm, {.min_inputs = 2,
                             .max_inputs = 2,
                             .attrs = {eps},
                             .infer = infer_rmsnorm,
                             .grad = grad_rmsnorm,
                             .eval = eval_rmsnorm,
                             .prepare = prepare_rmsnorm,
                             .samples = samples_rmsnorm});
  t.define(OpKind::softmax, {.min_inputs = 1,
                             .max_inputs = 1,
                             .infer = infer_softmax,
                             .grad = grad_softmax,
                             .eval = eval_softmax,
                             .prepare = prepare_softmax,
                             .samples = samples_softmax});
  const AttrSpec ignore{"ignore_index", AttrKind::i64, false};
  t.define(OpKind::cross_entropy, {.min_inputs = 2,
                                   .max_inputs = 2,
                                   .attrs = {ignore},
                                   .infer = infer_cross_entropy,
                                   .grad = grad_cross_entropy,
                                   .eval = eval_cross_entropy,
                                   .prepare = prepare_cross_entropy,
                                   .samples = samples_cross_entropy});
  t.define(OpKind::rotary, {.min_inputs = 2,
                            .max_inputs = 2,
                            .attrs = {{"rotary_dim", AttrKind::i64, true},
                                      {"layout", AttrKind::str, true},
                                      {"base", AttrKind::f64, false},
                                      {"inverse", AttrKind::i64, false},
                                      {"scaling", AttrKind::str, false},
                                      {"factor", AttrKind::f64, false},
                                      {"low_freq_factor", AttrKind::f64, false},
                                      {"high_freq_factor", AttrKind::f64, false},
                                      {"original_max_positions", AttrKind::i64, false}},
                            .infer = infer_rotary,
                            .grad = grad_rotary,
                            .eval = eval_rotary,
                            .prepare = prepare_rotary,
                            .samples = samples_rotary});
  t.define(OpKind::layernorm_grad, {.min_inputs = 5,
                                    .max_inputs = 5,
                                    .infer = infer_norm_grad,
                                    .eval = eval_layernorm_grad,
                                    .prepare = prepare_layernorm,
                                    .samples = samples_layernorm_grad});
  t.define(OpKind::rmsnorm_grad, {.min_inputs = 4,
                                  .max_inputs = 4,
                                  .infer = infer_norm_grad,
                                  .eval = eval_rmsnorm_grad,
                                  .prepare = prepare_rmsnorm,
                                  .samples = samples_rmsnorm_grad});
  t.define(OpKind::softmax_grad, {.min_inputs = 2,
                                  .max_inputs = 2,
                                  .infer = infer_softmax_grad,
                                  .eval = eval_softmax_grad,
                                  .prepare = prepare_softmax,
                                  .samples = samples_softmax_grad});
  t.define(OpKind::cross_entropy_grad, {.min_inputs = 4,
                                        .max_inputs = 4,
                                        .attrs = {ignore},
                                        .infer = infer_cross_entropy_grad,
                                        .eval = eval_cross_entropy_grad,
                                        .prepare = prepare_cross_entropy,
                                        .samples = samples_cross_entropy_grad});
}

}  // namespace aspen::graph
