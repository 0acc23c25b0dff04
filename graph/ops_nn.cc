// graph/ops_nn.cc: neural-network blocks, each the graph form of a kernel of
// kernels/ (its reference template, in f64, is the op's meaning).
//
//   matmul(a, b[, bias]) {trans_a, trans_b}: a [..., M, K] ([..., K, M] with trans_a), b [K, N] ([N, K] with
//       trans_b) shared by the batch or with a's batch dimensions, bias [N]; out [..., M, N] (kernels/matmul.h)
//       {out_dtype}: a and b bf16 (or f16), bias and out in out_dtype: f32, or a's dtype (narrow partials)
//       a and b share a dtype, with one exception: a f32, b bf16 (no out_dtype) -> bias and out f32, the
//       product of a rounded to bf16 (nearest even) with b, accumulated in f32: bf16 weights under f32
//       activations, rounded as autocast rounds them (NOTE [mixed matmul])
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
//   matmul:        da = g op(b)^T, db = op(a)^T g (transposes folded into trans flags; a shared b sums over
//                  the batch by one matmul of a and g reshaped to [batch*M, .]), dbias = reduce_sum(g, all but last);
//                  none with out_dtype (Unimplemented: precision runs after autodiff) or mixed dtypes
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
#include "kernels/convert.h"
#include "kernels/gemv.h"
#include "kernels/matmul.h"
#include "kernels/scratch.h"
#include "kernels/norm.h"
#include "kernels/rotary.h"
#include "kernels/softmax.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using namespace nnutil;

// ---- matmul -------------------------------------------------------------------

struct MatmulDims {
  kernels::MatmulShape shape;
  std::vector<int64_t> out;  // [..., M, N]
  DType out_dtype = DType::f32;
  DType b_dtype = DType::f32;  // a's, or bf16 in the mixed case (NOTE [mixed matmul])
};

// The output dtype: a's, or the out_dtype attribute (f32 or a's dtype, with
// bf16 or f16 a and b: the partials type of compiler/precision.cc).
Result<DType> matmul_out_dtype(const Node& n, const TensorType& a) {
  if (!n.attrs.has("out_dtype")) return a.dtype;
  const int64_t od = n.attrs.i("out_dtype");
  if (a.dtype != DType::bf16 && a.dtype != DType::f16)
    return rule_error(n, "a", "bf16 or f16 (with out_dtype)", a.to_string());
  if (od != int64_t(DType::f32) && od != int64_t(a.dtype))
    return rule_error(n, "out_dtype",
                      "f32 (" + str(int64_t(DType::f32)) + ") or a's dtype (" + str(int64_t(a.dtype)) + ")", str(od));
  return DType(od);
}

bool is_mixed_matmul(const Node& n, const TensorType& a, const TensorType& b) {
  return a.dtype == DType::f32 && b.dtype == DType::bf16 && !n.attrs.has("out_dtype");
}

Result<MatmulDims> matmul_dims(const Node& n, std::span<const TensorType> in) {
  const TensorType &ta_type = in[0], &tb_type = in[1];
  ASPEN_RETURN_IF_ERROR(expect_float(n, "a", ta_type));
  ASPEN_ASSIGN_OR_RETURN(const DType out_dtype, matmul_out_dtype(n, ta_type));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "a", ta_type, 2));
  // NOTE [mixed matmul]: a f32 with b bf16 (weights kept in bf16, activations in f32) is the one mixed
  // case; a is rounded to bf16 and the product is f32, with no out_dtype.
  const bool mixed = is_mixed_matmul(n, ta_type, tb_type);
  if (!mixed) ASPEN_RETURN_IF_ERROR(expect_dtype(n, "b", tb_type, ta_type.dtype, "a's"));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "b", tb_type, 2));
  ASPEN_ASSIGN_OR_RETURN(const bool trans_a, flag(n, "trans_a"));
  ASPEN_ASSIGN_OR_RETURN(const bool trans_b, flag(n, "trans_b"));
  const Shape &a = ta_type.shape, &b = tb_type.shape;
  const int ra = a.rank(), rb = b.rank();
  if (rb != 2 && rb != ra)
    return rule_error(n, "b", "rank 2 (shared across the batch) or rank " + str(ra) + " (a's)", tb_type.to_string());
  for (int i = 0; i < rb - 2; ++i)
    if (b[i] != a[i]) return rule_error(n, "batch dimension " + str(i), str(a[i]) + " (a's)", str(b[i]));
  MatmulDims d;
  kernels::MatmulShape& s = d.shape;
  s.M = trans_a ? a[-1] : a[-2];
  s.K = trans_a ? a[-2] : a[-1];
  s.N = trans_b ? b[-2] : b[-1];
  const int64_t bk = trans_b ? b[-1] : b[-2];
  if (bk != s.K)
    return rule_error(n, "K", str(s.K) + (trans_a ? " (a's second-to-last dimension)" : " (a's last dimension)"),
                      str(bk));
  if (in.size() > 2)
    ASPEN_RETURN_IF_ERROR(expect_type(n, "bias", in[2], TensorType{out_dtype, Shape{s.N}},
                                      n.attrs.has("out_dtype") ? "[N] in out_dtype" : "[N] in a's dtype"));
  s.batch = 1;
  for (int i = 0; i < ra - 2; ++i) {
    s.batch *= a[i];
    d.out.push_back(a[i]);
  }
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.broadcast_b = rb == 2;
  s.has_bias = in.size() > 2;
  s.input = ta_type.dtype;
  d.b_dtype = tb_type.dtype;
  d.out_dtype = out_dtype;
  d.out.push_back(s.M);
  d.out.push_back(s.N);
  return d;
}

Status infer_matmul(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(MatmulDims d, matmul_dims(n, in));
  ASPEN_ASSIGN_OR_RETURN(Shape s, to_shape(n, "output shape", d.out));
  out = {TensorType{d.out_dtype, s}};
  return Status();
}

Status eval_matmul(const Node& n, Ins in, Outs out) {
  std::vector<TensorType> types;
  for (const HostArray* a : in) types.push_back(a->type);
  ASPEN_ASSIGN_OR_RETURN(MatmulDims d, matmul_dims(n, types));
  const double* a = in[0]->data.data();
  std::vector<double> rounded;
  if (is_mixed_matmul(n, types[0], types[1])) {  // NOTE [mixed matmul]: a rounded to bf16 first
    rounded.resize(in[0]->data.size());
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = double(bf16_to_f32(f32_to_bf16(float(a[i]))));
    a = rounded.data();
  }
  kernels::ref::matmul<double, double>(a, in[1]->data.data(), in.size() > 2 ? in[2]->data.data() : nullptr,
                                       out[0].data.data(), d.shape);
  return Status();
}

ValueId mm(Builder& b, ValueId x, ValueId y, bool trans_a, bool trans_b) {
  Attrs a;
  if (trans_a) a.set("trans_a", int64_t(1));
  if (trans_b) a.set("trans_b", int64_t(1));
  return b.op1(OpKind::matmul, {x, y}, std::move(a));
}

// Swaps the last two axes of a rank-r value.
std::vector<int64_t> swap_last_two(int r) {
  std::vector<int64_t> p;
  for (int i = 0; i < r; ++i) p.push_back(i);
  std::swap(p[size_t(r - 2)], p[size_t(r - 1)]);
  return p;
}

// With op(x) = x or x^T as the flags say and C = op(A) op(B):
//   dop(A) = G op(B)^T, dop(B) = op(A)^T G; each transpose folds into a trans flag.
Grads grad_matmul(Builder& b, const Node& n, OutGrads g) {
  if (n.attrs.has("out_dtype"))
    return Status::error(Code::kUnimplemented, "matmul: gradient with out_dtype",
                         "a matmul without out_dtype (precision runs after autodiff)", "out_dtype");
  if (b.type(n.inputs[0]).dtype != b.type(n.inputs[1]).dtype)
    return Status::error(Code::kUnimplemented, "matmul: gradient with a " + b.type(n.inputs[0]).to_string() +
                         " and b " + b.type(n.inputs[1]).to_string(),
                         "a and b of one dtype (bf16 weights with f32 activations are for inference)", "mixed dtypes");
  const ValueId A = n.inputs[0], B = n.inputs[1], G = *g[0];
  const bool ta = n.attrs.i_or("trans_a", 0) != 0, tb = n.attrs.i_or("trans_b", 0) != 0;
  const Shape as = b.type(A).shape;
  const int ra = as.rank();
  const bool fold = b.type(B).shape.rank() == 2 && ra > 2;  // b shared by a batch
  ValueId da, db;
  if (!ta) da = mm(b, G, B, false, !tb);                                       // [.., M, K] = G op(B)^T
  else if (!fold) da = mm(b, B, G, tb, true);                                  // [.., K, M] = op(B) G^T
  else da = b.transpose(mm(b, G, B, false, !tb), swap_last_two(ra));           // (G op(B)^T)^T per entry
  if (!fold) {
    db = tb ? mm(b, G, A, true, ta)   // [.., N, K] = G^T op(A)
            : mm(b, A, G, !ta, false);  // [.., K, N] = op(A)^T G
  } else {
    const Shape gs = b.type(G).shape;
    const int64_t rows = gs.numel() / gs[-1];
    ValueId a2 = b.reshape(ta ? b.transpose(A, swap_last_two(ra)) : A, {rows, ta ? as[-2] : as[-1]});
    ValueId g2 = b.reshape(G, {rows, gs[-1]});
    db = tb ? mm(b, g2, a2, true, false) : mm(b, a2, g2, true, false);
  }
  std::vector<std::optional<ValueId>> r{da, db};
  if (n.inputs.size() > 2) {
    std::vector<int64_t> axes;
    for (int i = 0; i < ra - 1; ++i) axes.push_back(i);
    r.push_back(b.reduce_sum(G, axes));
  }
  return r;
}

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


// A plan made once here (oneDNN primitive creation is the expensive part); run() binds pointers. The plan
// is made for the preparing thread's OpenMP team size. Empty extents (which oneDNN refuses) fall back.
// bf16 a and b with f32 out (out_dtype) use the plan's bf16 input.
// The rest of the mixed-precision family, for which oneDNN 2.6 has no CPU
// primitive (f16 matmul) or we keep one plan shape (narrow partials):
//   f16 a, b:         widened to f32 in scratch, then the f32 plan. Products of
//                     f16 values are exact in f32, so this is an f16 matmul with
//                     f32 accumulation, at f32 speed (no f16 arithmetic here).
//   out bf16 / f16:   the f32 result rounded (RNE) to the partials type; the
//                     accumulation itself is f32 inside oneDNN either way.
// Scratch is per leader thread and grows once (the first run), so steady
// state allocates nothing. A bias in a narrow out_dtype falls back.
float* matmul_scratch(int which, int64_t n) {
  float* p = kernels::op_scratch_of<float>(which, n);
  ASPEN_CHECK(p != nullptr) << "matmul: out of memory for " << n << " floats of scratch";
  return p;
}

// NOTE [gemv route]: a decode step's matmuls (f32 activations, a few rows, one weight matrix shared by
// the batch, no trans_a) go to kernels/gemv.h: they are bound by weight bytes per second, and the GEMV
// kernel streams them near the memory's read rate where oneDNN's M = 1 path reaches about half of it.
// The batch folds into M (a is [batch, M, K] contiguous and b is shared), up to kGemvMaxRows rows.
// NOTE [mixed matmul]: a mixed matmul (a f32, b bf16: bf16 weights under f32 activations) rounds a to
// bf16 (to nearest even, as autocast rounds activations) and multiplies bf16 by bf16 with f32
// accumulation, on every path: the decode rows round a into scratch for the GEMV; other shapes (prefill)
// round it into scratch and run the bf16 plan, on AMX or AVX512-BF16 where the CPU has them. Widening b
// to f32 on every call instead (what this did first) made bf16 prefill slower than f32. Where the CPU
// has no bf16 arithmetic the bf16 plan widens both (NOTE [bf16 without AVX-512]), so the result is the
// same on every machine up to summation order, and the reference (eval_matmul) rounds a the same way.
constexpr int64_t kGemvMaxRows = 8;

// NOTE [fixed weights]: with b fixed (prepare_fixed: a weight, under
// CompileOptions::hoist_weights) the plan is made for a fixed B (aspen's
// kernels pack it once: kernels/matmul_aspen.cc, NOTE [fixed b]; the backend
// choice measures that), and fixed_inputs_changed() tells the plan to pack it
// again. The GEMV route streams B as it is, except a bf16 [N, K] B for one row (NOTE [packed gemv]: regrouped
// once into 8-row streams, again after fixed_inputs_changed()).
Prepared prepare_matmul_impl(const Node& n, Types in, Types out, bool b_fixed);
Prepared prepare_matmul(const Node& n, Types in, Types out) { return prepare_matmul_impl(n, in, out, false); }
Prepared prepare_matmul_fixed(const Node& n, Types in, Types out, std::span<const char> fixed) {
  return prepare_matmul_impl(n, in, out, fixed.size() > 1 && fixed[1]);
}

}  // namespace

std::optional<kernels::GemvShape> matmul_gemv_route(const Node& n, std::span<const TensorType> in,
                                                    std::span<const TensorType> out) {
  const DType in_t = in[0].dtype, out_t = out[0].dtype;
  const bool plain = floats_are_f32(in, out);
  const bool mixed = in_t == DType::f32 && in[1].dtype == DType::bf16 && out_t == DType::f32;
  if (!plain && !mixed) return std::nullopt;
  const Result<MatmulDims> d = matmul_dims(n, in);
  if (!d.is_ok()) return std::nullopt;
  const kernels::MatmulShape& s = d->shape;
  if (s.batch < 1 || s.M < 1 || s.N < 1 || s.K < 1 || s.trans_a || !s.broadcast_b || s.batch * s.M > kGemvMaxRows)
    return std::nullopt;
  const kernels::GemvShape g{.M = s.batch * s.M, .N = s.N, .K = s.K, .trans_b = s.trans_b,
                             .has_bias = s.has_bias, .weight = d->b_dtype, .x_bf16 = mixed};
  if (!kernels::gemv_validate(g).is_ok()) return std::nullopt;
  return g;
}

const float* gemv_rows_of(const kernels::GemvShape& g, const float* a) {
  if (!g.x_bf16) return a;
  // NOTE [mixed matmul]: a rounded to bf16 (a few rows: cheap beside the weights' stream)
  const int64_t na = g.M * g.K;
  float* ra = matmul_scratch(0, na);
  for (int64_t j = 0; j < na; ++j) ra[j] = bf16_to_f32(f32_to_bf16(a[j]));
  return ra;
}

namespace {

Prepared prepare_matmul_impl(const Node& n, Types in, Types out, bool b_fixed) {
  const DType in_t = in[0].dtype, out_t = out[0].dtype;
  const bool plain = floats_are_f32(in, out);
  const bool bf16_in = in_t == DType::bf16 && (out_t == DType::f32 || out_t == DType::bf16);
  const bool f16_in = in_t == DType::f16 && (out_t == DType::f32 || out_t == DType::f16);
  const bool mixed = in_t == DType::f32 && in[1].dtype == DType::bf16 && out_t == DType::f32;
  if (!plain && !bf16_in && !f16_in && !mixed) return no_fast_kernel();
  ASPEN_ASSIGN_OR_RETURN(const MatmulDims d, matmul_dims(n, in));
  kernels::MatmulShape s = d.shape;
  if (s.batch < 1 || s.M < 1 || s.N < 1 || s.K < 1) return no_fast_kernel();
  if (s.has_bias && out_t != DType::f32) return no_fast_kernel();
  if (const std::optional<kernels::GemvShape> route = matmul_gemv_route(n, in, out)) {
    const kernels::GemvShape g = *route;
    auto round_a = [g](const float* a) { return gemv_rows_of(g, a); };
    if (b_fixed && kernels::gemv_packable(g)) {  // NOTE [packed gemv]: a fixed bf16 [N, K] regrouped once
      auto packed = std::make_shared<PackedWeights>(size_t(g.weight_bytes()));
      return make_kernel(
          [g, round_a, packed](In i, Out o) {
            const void* p = packed->of(i[1], [&g](const void* w, void* to) { kernels::gemv_pack(g, w, to); });
            kernels::gemv_run_packed(g, round_a(f32_in(i, 0)), p, g.has_bias ? f32_in(i, 2) : nullptr,
                                     static_cast<float*>(o[0]));
            return Status();
          },
          [packed] { packed->changed(); });
    }
    return make_kernel([g, round_a](In i, Out o) {
      kernels::gemv_run(g, round_a(f32_in(i, 0)), i[1], g.has_bias ? f32_in(i, 2) : nullptr,
                        static_cast<float*>(o[0]));
      return Status();
    });
  }
  if (f16_in) s.input = DType::f32;
  if (mixed) s.input = DType::bf16;  // NOTE [mixed matmul]
  s.b_fixed = b_fixed && !f16_in && (s.broadcast_b || s.batch == 1);  // f16: b is widened into scratch per run
  ASPEN_ASSIGN_OR_RETURN(kernels::MatmulPlan made, kernels::MatmulPlan::create(s));
  auto plan = std::make_shared<kernels::MatmulPlan>(std::move(made));
  const bool bias = s.has_bias;
  auto changed = [plan] { plan->b_changed(); };
  if (plain || (bf16_in && out_t == DType::f32))
    return make_kernel(
        [plan, bias](In i, Out o) {
          plan->run(i[0], i[1], bias ? f32_in(i, 2) : nullptr, static_cast<float*>(o[0]));
          return Status();
        },
        changed);
  const int64_t na = in[0].shape.numel(), nb = in[1].shape.numel(), nc = out[0].shape.numel();
  return make_kernel(
      [plan, bias, f16_in, mixed, out_t, na, nb, nc](In i, Out o) {
        const void *a = i[0], *b = i[1];
        if (mixed) {  // NOTE [mixed matmul]: a rounded to bf16, then the bf16 plan
          bf16* ra = reinterpret_cast<bf16*>(matmul_scratch(0, (na + 1) / 2));
          ASPEN_RETURN_IF_ERROR(kernels::convert_f32_to_bf16(in_span<float>(i, 0, na), {ra, size_t(na)}, na));
          a = ra;
        }
        if (f16_in) {
          float* wa = matmul_scratch(0, na);
          float* wb = matmul_scratch(1, nb);
          ASPEN_RETURN_IF_ERROR(kernels::convert_f16_to_f32(in_span<f16>(i, 0, na), {wa, size_t(na)}, na));
          ASPEN_RETURN_IF_ERROR(kernels::convert_f16_to_f32(in_span<f16>(i, 1, nb), {wb, size_t(nb)}, nb));
          a = wa;
          b = wb;
        }
        float* c = out_t == DType::f32 ? static_cast<float*>(o[0]) : matmul_scratch(2, nc);
        plan->run(a, b, bias ? f32_in(i, 2) : nullptr, c);
        const std::span<const float> cs(c, size_t(nc));
        if (out_t == DType::bf16) return kernels::convert_f32_to_bf16(cs, out_span<bf16>(o, 0, nc), nc);
        if (out_t == DType::f16) return kernels::convert_f32_to_f16(cs, out_span<f16>(o, 0, nc), nc);
        return Status();
      },
      changed);
}

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

// NOTE [matmul backends]: every transpose and batching, with and without bias, on oneDNN; products big
// enough for the OpenBLAS backend (N >= 2048, 256+ rows once the batch folds, no b^T); decode-shaped
// products (a few rows, shared weights, f32 or bf16 b: the GEMV kernel, NOTE [gemv route]); bf16 inputs
// with f32 or bf16 out (the bf16 plan, rounded).
// A bf16 (f16) out: the reference rounds the exact sum, the kernel its f32 sum; where the two straddle a
// rounding boundary they land one ulp apart (bf16: 2^-7 of the value's power of two, below its scale).
constexpr double kNarrowTol = 1.6e-2;
void samples_matmul(SampleList& s) {
  constexpr int64_t M = 3, K = 5, N = 7;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int batching = 0; batching < 3; ++batching) {  // 0: none, 1: batched b, 2: b shared by the batch
        std::vector<int64_t> batch = batching ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{};
        std::vector<int64_t> as = batch, bs = batching == 1 ? batch : std::vector<int64_t>{};
        as.push_back(ta ? K : M);
        as.push_back(ta ? M : K);
        bs.push_back(tb ? N : K);
        bs.push_back(tb ? K : N);
        const bool bias = ta != tb;  // half the cases
        s.add("ta " + std::to_string(ta) + " tb " + std::to_string(tb) + " batching " + std::to_string(batching) +
                  (bias ? " bias" : ""),
              [&](Builder& b) {
                std::vector<ValueId> in{b.input("a", DType::f32, sample_shape(as)),
                                        b.input("b", DType::f32, sample_shape(bs))};
                if (bias) in.push_back(b.input("bias", DType::f32, Shape{N}));
                b.op(OpKind::matmul, in, {{"trans_a", int64_t(ta)}, {"trans_b", int64_t(tb)}});
              });
      }
  for (bool ta : {false, true})  // OpenBLAS-sized: a [2, 130, 33] folding into 260 rows, or a^T [33, 300]
    s.add(std::string("large, bias") + (ta ? ", ta" : ", batch folded"), [&](Builder& b) {
      b.op(OpKind::matmul,
           {b.input("a", DType::f32, ta ? Shape{33, 300} : Shape{2, 130, 33}),
            b.input("b", DType::f32, Shape{33, 2100}), b.input("bias", DType::f32, Shape{2100})},
           {{"trans_a", int64_t(ta)}});
    });
  constexpr int64_t DK = 37, DN = 19;
  const std::vector<std::vector<int64_t>> decode_a = {{1, DK}, {5, DK}, {2, 4, DK}, {9, DK}, {3, 3, DK}};
  for (DType wt : {DType::f32, DType::bf16})
    for (bool tb : {false, true})
      for (const auto& as : decode_a)
        for (bool bias : {false, true})
          s.add("decode " + std::string(dtype_name(wt)) + " weights, tb " + std::to_string(tb) + ", rows " +
                    std::to_string(sample_shape(as).numel() / DK) + (bias ? ", bias" : ""),
                [&](Builder& b) {
                  std::vector<ValueId> in{b.input("a", DType::f32, sample_shape(as)),
                                          b.input("b", wt, tb ? Shape{DN, DK} : Shape{DK, DN})};
                  if (bias) in.push_back(b.input("bias", DType::f32, Shape{DN}));
                  b.op(OpKind::matmul, in, {{"trans_b", int64_t(tb)}});
                });
  for (DType in : {DType::bf16, DType::f16})  // the narrow plan (bf16) or widened to f32 (f16)
    for (DType out : {DType::f32, in})
      for (bool tb : {false, true})
        for (bool bias : {false, true}) {
          OpSample& c = s.add(std::string(dtype_name(in)) + " in, " + std::string(dtype_name(out)) + " out, tb " +
                                  std::to_string(tb) + (bias ? ", bias" : ""),
                              [&](Builder& b) {
                                std::vector<ValueId> x{b.input("a", in, Shape{2, 9, K}),
                                                       b.input("b", in, tb ? Shape{N, K} : Shape{K, N})};
                                if (bias) x.push_back(b.input("bias", out, Shape{N}));
                                b.op(OpKind::matmul, x, {{"trans_b", int64_t(tb)}, {"out_dtype", int64_t(out)}});
                              });
          if (out != DType::f32) c.tol = kNarrowTol;
          c.fast = !bias || out == DType::f32;  // a bias in a narrow out_dtype falls back
        }
  s.add("bf16 without out_dtype", [](Builder& b) {
     b.op(OpKind::matmul, {b.input("a", DType::bf16, Shape{3, 4}), b.input("b", DType::bf16, Shape{4, 5})});
   }).tol = kNarrowTol;
}

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
  t.define(OpKind::matmul, {.min_inputs = 2,
                            .max_inputs = 3,
                            .attrs = {{"trans_a", AttrKind::i64, false},
                                      {"trans_b", AttrKind::i64, false},
                                      {"out_dtype", AttrKind::i64, false}},
                            .infer = infer_matmul,
                            .grad = grad_matmul,
                            .eval = eval_matmul,
                            .prepare = prepare_matmul,
                            .prepare_fixed = prepare_matmul_fixed,
                            .samples = samples_matmul});
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
