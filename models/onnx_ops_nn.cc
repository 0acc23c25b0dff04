// models/onnx_ops_nn.cc: the ONNX importer's conversions of reductions, softmaxes, losses and normalizations
// (the converter table and the shared helpers: models/onnx_ops.h, onnx_ops.cc).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "graph/interpreter.h"
#include "models/onnx_import.h"
#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

namespace {

// ---- reductions, normalizations -----------------------------------------------------------------------

// The axes of a reduction: an input from opset 18 (ReduceSum: 13), an attribute before.
Result<std::vector<int64_t>> reduce_axes(Ctx& c, std::vector<Value>& in, int64_t input_from, bool& all) {
  std::vector<int64_t> axes;
  if (c.opset >= input_from) {
    if (in.size() > 1 && in[1].present()) {
      ASPEN_ASSIGN_OR_RETURN(axes, c.ints(in[1], "input 'axes'"));
    }
  } else {
    ASPEN_ASSIGN_OR_RETURN(axes, c.attr_ints("axes", std::vector<int64_t>{}));
  }
  ASPEN_ASSIGN_OR_RETURN(const int64_t noop, c.attr_i("noop_with_empty_axes", 0));
  all = axes.empty() && !noop;
  const int r = in[0].type.shape.rank();
  std::vector<int64_t> out;
  if (all)
    for (int i = 0; i < r; ++i) out.push_back(i);
  for (int64_t a : axes) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(a, r, "axes"));
    out.push_back(ax);
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) return c.error("axes", "each axis once", "a repeat");
  return out;
}

// GlobalAveragePool(X [N, C, D1, ...]): the mean over D1, ... (kept as 1s).
Status convert_global_average_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape& s = in[0].type.shape;
  if (s.rank() < 2) return c.error("input 'X'", "rank 2 or more ([N, C, ...])", in[0].type.to_string());
  if (s.rank() == 2) {
    out = {in[0]};
    return Status();
  }
  std::vector<int64_t> axes;
  int64_t n = 1;
  for (int i = 2; i < s.rank(); ++i) {
    axes.push_back(i);
    n *= s[i];
  }
  out = {c.wrap(c.b.scale(c.b.reduce_sum(c.id(in[0]), axes, true), n ? 1.0 / double(n) : NAN))};
  return c.b.status();
}

// ReduceProd of known values (shape arithmetic: element counts), axes an attribute before opset 18.
Status convert_reduce_prod(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (!in[0].known())
    return c.unsupported("input 'data'", "a value known when the model is imported",
                         "one computed from the graph's inputs");
  std::vector<int64_t> axes;
  if (c.opset >= 18) {
    if (in.size() > 1 && in[1].present()) {
      ASPEN_ASSIGN_OR_RETURN(axes, c.ints(in[1], "input 'axes'"));
    }
  } else {
    ASPEN_ASSIGN_OR_RETURN(axes, c.attr_ints("axes", std::vector<int64_t>{}));
  }
  ASPEN_ASSIGN_OR_RETURN(const int64_t keep, c.attr_i("keepdims", 1));
  const Shape& s = in[0].type.shape;
  std::vector<bool> reduced(size_t(s.rank()), axes.empty());
  for (int64_t a : axes) {
    ASPEN_ASSIGN_OR_RETURN(const int ax, c.axis(a, s.rank(), "axes"));
    reduced[size_t(ax)] = true;
  }
  std::vector<int64_t> od;
  for (int i = 0; i < s.rank(); ++i)
    if (!reduced[size_t(i)])
      od.push_back(s[i]);
    else if (keep)
      od.push_back(1);
  ASPEN_ASSIGN_OR_RETURN(const Shape os, make_shape(c, od, "output"));
  const graph::HostArray x = graph::HostArray::from_tensor(*in[0].constant);
  graph::HostArray y(TensorType{in[0].type.dtype, os});
  std::fill(y.data.begin(), y.data.end(), 1.0);
  for (int64_t i = 0; i < s.numel(); ++i) {
    int64_t rem = i, at = 0, mul = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      const int64_t coord = rem % s[d];
      rem /= s[d];
      if (!reduced[size_t(d)]) {
        at += coord * mul;
        mul *= s[d];
      }
    }
    y.data[size_t(at)] *= x.data[size_t(i)];
  }
  out = {Ctx::constant(y.to_tensor())};
  return Status();
}

enum class Reduce { sum, mean, max, min };
Converter reduction(Reduce kind, int64_t input_from) {
  return [kind, input_from](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) -> Status {
    bool all = false;
    ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, reduce_axes(c, in, input_from, all));
    ASPEN_ASSIGN_OR_RETURN(const int64_t keep, c.attr_i("keepdims", 1));
    if (axes.empty()) {
      out = {in[0]};
      return Status();
    }
    ValueId x = c.id(in[0]);
    if (kind == Reduce::min) x = c.b.neg(x);
    ValueId y = kind == Reduce::max || kind == Reduce::min ? c.b.reduce_max(x, axes, keep != 0)
                                                           : c.b.reduce_sum(x, axes, keep != 0);
    if (kind == Reduce::min) y = c.b.neg(y);
    if (kind == Reduce::mean) {
      int64_t n = 1;
      for (int64_t a : axes) n *= in[0].type.shape[int(a)];
      y = c.b.scale(y, n ? 1.0 / double(n) : NAN);
    }
    out = {c.wrap(y)};
    return c.b.status();
  };
}

// Moves `axis` to the last position and back around `body` (softmax over an inner axis).
template <class F>
Status on_last_axis(Ctx& c, const Value& x, int axis, std::vector<Value>& out, F body) {
  const int r = x.type.shape.rank();
  if (axis == r - 1) {
    out = {c.wrap(body(c.id(x)))};
    return c.b.status();
  }
  std::vector<int64_t> perm;
  for (int i = 0; i < r; ++i)
    if (i != axis) perm.push_back(i);
  perm.push_back(axis);
  std::vector<int64_t> inverse(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) inverse[size_t(perm[size_t(i)])] = i;
  const ValueId y = body(c.b.transpose(c.id(x), perm));
  out = {c.wrap(c.b.transpose(y, inverse))};
  return c.b.status();
}

// Before opset 13, Softmax, LogSoftmax (and Hardmax) coerced the input to 2-D at `axis` (default 1): one
// softmax over all the axes from `axis` on. Flattened to [.., prod(axes from axis)] and back.
template <class F>
Status softmax_like(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, F over_axis) {
  const Shape s = in[0].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", c.opset < 13 ? 1 : -1));
  if (c.opset >= 13 || s.rank() == 0) {
    ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, s.rank(), "attribute 'axis'"));
    return over_axis(in[0], axis, out);
  }
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, s.rank(), "attribute 'axis'"));
  std::vector<int64_t> flat(s.begin(), s.begin() + axis);
  int64_t rest = 1;
  for (int i = axis; i < s.rank(); ++i) rest *= s[i];
  flat.push_back(rest);
  ASPEN_RETURN_IF_ERROR(over_axis(reshaped(c, in[0], flat), int(flat.size()) - 1, out));
  out = {reshaped(c, out[0], dims(s))};
  return c.b.status();
}

Status convert_softmax(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  return softmax_like(c, in, out, [&](const Value& x, int axis, std::vector<Value>& o) {
    return on_last_axis(c, x, axis, o, [&](ValueId v) { return c.b.op1(OpKind::softmax, {v}); });
  });
}

Status convert_log_softmax_axis(Ctx& c, const Value& x0, int axis, std::vector<Value>& out) {
  return on_last_axis(c, x0, axis, out, [&](ValueId x) {
    const std::vector<int64_t> d = dims(c.b.type(x).shape);
    const int64_t last = int64_t(d.size()) - 1;
    const ValueId z = c.b.sub(x, c.b.broadcast(c.b.reduce_max(x, {last}, true), d));
    const ValueId lse = c.b.op1(OpKind::log, {c.b.reduce_sum(c.b.exp(z), {last}, true)});
    return c.b.sub(z, c.b.broadcast(lse, d));
  });
}

Status convert_log_softmax(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  return softmax_like(c, in, out,
                      [&](const Value& x, int axis, std::vector<Value>& o) { return convert_log_softmax_axis(c, x, axis, o); });
}

// SoftmaxCrossEntropyLoss(scores [N, C, d...], labels [N, d...]) {reduction, ignore_index}: what
// torch.onnx writes for torch.nn.functional.cross_entropy, often a model's own loss output (the Python
// package trains a module whose forward returns (output, loss)). The class axis (1) moves last and the
// cross_entropy op gives the mean over the labels not ignored (reduction "mean", which trains) and each
// row's loss (0 where ignored: "none", and "sum" over them; neither trains, the op's gradient being the
// mean's). The optional second output is log_softmax(scores) over the class axis. Class weights are
// refused by name.
Status nll_rows(Ctx& c, const Value& logp, const Value& target, const Value* weight, int64_t ignore,
                const std::string& reduction, Value& loss);

Status convert_softmax_cross_entropy(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::string reduction, c.attr_s("reduction", std::string("mean")));
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return c.error("attribute 'reduction'", "mean, sum or none", "'" + reduction + "'");
  // Class weights, or a sum or per-row loss (which the fused op's gradient, the mean's, does not train):
  // log_softmax, then the negative log-likelihood's decomposition.
  if ((in.size() > 2 && in[2].present()) || reduction != "mean") {
    ASPEN_ASSIGN_OR_RETURN(const int64_t ig, c.attr_i("ignore_index", -(int64_t(1) << 30)));
    if (ig <= -(int64_t(1) << 31) || ig >= (int64_t(1) << 24))
      return c.unsupported("attribute 'ignore_index'", "a value in (-2^31, 2^24)", std::to_string(ig));
    if (in[0].type.shape.rank() < 2) return c.error("input 'scores'", "scores [N, C, d...]", in[0].type.to_string());
    std::vector<Value> log_prob;
    ASPEN_RETURN_IF_ERROR(convert_log_softmax_axis(c, in[0], 1, log_prob));
    Value loss;
    ASPEN_RETURN_IF_ERROR(
        nll_rows(c, log_prob[0], in[1], in.size() > 2 && in[2].present() ? &in[2] : nullptr, ig, reduction, loss));
    out = {loss, log_prob[0]};
    return c.b.status();
  }
  // Without the attribute no label is ignored: class ids are never this.
  ASPEN_ASSIGN_OR_RETURN(const int64_t ignore, c.attr_i("ignore_index", std::numeric_limits<int32_t>::min()));
  if (ignore < std::numeric_limits<int32_t>::min() || ignore > std::numeric_limits<int32_t>::max())
    return c.unsupported("attribute 'ignore_index'", "a value in the int32 range", std::to_string(ignore));
  const std::vector<int64_t> d = dims(in[0].type.shape), l = dims(in[1].type.shape);
  if (d.size() < 2 || l.size() != d.size() - 1 || l[0] != d[0] || !std::equal(l.begin() + 1, l.end(), d.begin() + 2))
    return c.error("inputs 'scores' and 'labels'", "scores [N, C, d...] and labels [N, d...]",
                   in[0].type.to_string() + " and " + in[1].type.to_string());
  if (in[1].type.dtype != DType::i64 && in[1].type.dtype != DType::i32)
    return c.error("input 'labels'", "int64 or int32 class ids", in[1].type.to_string());
  const int64_t C = d[1], R = C ? in[0].type.shape.numel() / C : 0;
  ValueId scores = c.id(in[0]);
  if (d.size() > 2) {  // [N, C, d...] -> [N, d..., C]
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < int64_t(d.size()); ++i) perm.push_back(i);
    perm.push_back(1);
    scores = c.b.transpose(scores, perm);
  }
  std::vector<ValueId> ce =
      c.b.op(OpKind::cross_entropy, {c.b.reshape(scores, {R, C}), c.id(reshaped(c, in[1], {R}))},
             {{"ignore_index", ignore}});
  ASPEN_RETURN_IF_ERROR(c.b.status());
  Value loss = c.wrap(ce[0]);
  if (reduction == "none") loss = reshaped(c, c.wrap(ce[1]), l);
  if (reduction == "sum") loss = c.wrap(c.b.reduce_sum(ce[1], {0}));
  std::vector<Value> log_prob;
  ASPEN_RETURN_IF_ERROR(convert_log_softmax_axis(c, in[0], 1, log_prob));
  out = {loss, log_prob[0]};
  return c.b.status();
}

// NegativeLogLikelihoodLoss(input [N, C, d...] log-probabilities, target [N, d...], weight [C]?)
// {reduction, ignore_index}: what torch.onnx writes for F.nll_loss (the MNIST tutorials' loss). Decomposed
// into ops autodiff differentiates, so every reduction trains: the class axis moves last ([M, C]), a row's
// one-hot is equal(target, class) (both as f32: class ids below 2^24 are exact), its pick is
// sum(onehot * input) and its weight sum(onehot * weight) (1 without weights), times 0 where the target is
// ignore_index; then
//   none: -pick * weight per row ([N, d...]), sum: their sum, mean: their sum / the sum of the weights
// (ONNX's and PyTorch's weighted mean; 0 / 0 = NaN when every target is ignored, as in PyTorch).
Status nll_rows(Ctx& c, const Value& logp, const Value& target, const Value* weight, int64_t ignore,
                const std::string& reduction, Value& loss) {
  const std::vector<int64_t> d = dims(logp.type.shape), l = dims(target.type.shape);
  if (d.size() < 2 || l.size() != d.size() - 1 || l[0] != d[0] || !std::equal(l.begin() + 1, l.end(), d.begin() + 2))
    return c.error("inputs 'input' and 'target'", "input [N, C, d...] and target [N, d...]",
                   logp.type.to_string() + " and " + target.type.to_string());
  if (target.type.dtype != DType::i64 && target.type.dtype != DType::i32)
    return c.error("input 'target'", "int64 or int32 class ids", target.type.to_string());
  const DType ft = logp.type.dtype;
  const int64_t C = d[1], M = C ? logp.type.shape.numel() / C : 0;
  if (C >= (int64_t(1) << 24)) return c.unsupported("input 'input'", "fewer than 2^24 classes", std::to_string(C));
  if (weight && (weight->type.shape != Shape{C} || weight->type.dtype != ft))
    return c.error("input 'weight'", graph::TensorType{ft, Shape{C}}.to_string() + " (one weight per class)",
                   weight->type.to_string());
  ValueId x = c.id(logp);
  if (d.size() > 2) {  // [N, C, d...] -> [N, d..., C]
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < int64_t(d.size()); ++i) perm.push_back(i);
    perm.push_back(1);
    x = c.b.transpose(x, perm);
  }
  x = c.b.reshape(x, {M, C});
  const ValueId t = c.b.cast(c.id(reshaped(c, target, {M})), ft);
  ASPEN_ASSIGN_OR_RETURN(ValueId classes, positions(c, Shape{M, C}, 1));
  if (ft != DType::f32) classes = c.b.cast(classes, ft);
  const ValueId onehot = c.b.cast(c.b.op1(OpKind::equal, {c.b.broadcast(c.b.reshape(t, {M, 1}), {M, C}), classes}), ft);
  const ValueId pick = c.b.reduce_sum(c.b.mul(onehot, x), {1});
  ValueId w = weight ? c.b.reduce_sum(c.b.mul(onehot, c.b.broadcast(c.id(*weight), {M, C})), {1})
                     : c.id(filled(c, 1.0, ft, Shape{M}));
  const ValueId kept =
      c.b.cast(c.b.op1(OpKind::logical_not, {c.b.op1(OpKind::equal, {t, c.id(filled(c, double(ignore), ft, Shape{M}))})}),
               ft);
  w = c.b.mul(w, kept);
  const ValueId rows = c.b.neg(c.b.mul(pick, w));
  if (reduction == "none") {
    loss = reshaped(c, c.wrap(rows), l);
  } else if (reduction == "sum") {
    loss = c.wrap(c.b.reduce_sum(rows, {0}));
  } else {
    loss = c.wrap(c.b.div(c.b.reduce_sum(rows, {0}), c.b.reduce_sum(w, {0})));
  }
  return c.b.status();
}

Result<std::string> loss_reduction(Ctx& c) {
  ASPEN_ASSIGN_OR_RETURN(const std::string reduction, c.attr_s("reduction", std::string("mean")));
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return c.error("attribute 'reduction'", "mean, sum or none", "'" + reduction + "'");
  return reduction;
}

Status convert_nll_loss(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::string reduction, loss_reduction(c));
  // Without the attribute no target is ignored: a class id is never this (and f32 holds it exactly).
  ASPEN_ASSIGN_OR_RETURN(const int64_t ignore, c.attr_i("ignore_index", -(int64_t(1) << 30)));
  if (ignore <= -(int64_t(1) << 31) || ignore >= (int64_t(1) << 24))
    return c.unsupported("attribute 'ignore_index'", "a value in (-2^31, 2^24)", std::to_string(ignore));
  const Value* weight = in.size() > 2 && in[2].present() ? &in[2] : nullptr;
  out.resize(1);
  return nll_rows(c, in[0], in[1], weight, ignore, reduction, out[0]);
}

Status convert_layer_norm(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", -1));
  ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-5f));
  const std::vector<int64_t> d = dims(in[0].type.shape);
  const int r = int(d.size());
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, r, "attribute 'axis'"));
  int64_t inner = 1;
  for (int i = axis; i < r; ++i) inner *= d[size_t(i)];
  std::vector<int64_t> flat(d.begin(), d.begin() + axis);
  flat.push_back(inner);
  const DType dt = in[0].type.dtype;
  const Value scale = to_shape(c, in[1], shape_of(std::vector<int64_t>(d.begin() + axis, d.end())));
  Value bias = in.size() > 2 && in[2].present()
                   ? to_shape(c, in[2], shape_of(std::vector<int64_t>(d.begin() + axis, d.end())))
                   : filled(c, 0.0, dt, shape_of({inner}));
  std::vector<ValueId> y =
      c.b.op(OpKind::layernorm,
             {c.id(reshaped(c, in[0], flat)), c.id(reshaped(c, scale, {inner})), c.id(reshaped(c, bias, {inner}))},
             {{"eps", double(eps)}});
  if (!c.b.status().is_ok()) return c.b.status();
  std::vector<int64_t> stat(d.begin(), d.begin() + axis);
  stat.resize(size_t(r), 1);  // Mean and InvStdDev keep the normalized axes as 1
  out = {reshaped(c, c.wrap(y[0]), d), reshaped(c, c.wrap(y[1]), stat), reshaped(c, c.wrap(y[2]), stat)};
  return c.b.status();
}

// x [N, C, D...] normalized over groups of its elements: viewed as [rows, inner], layernorm with unit scale
// and zero shift (its fused kernel and gradient), back to x's shape.
ValueId normalized_rows(Ctx& c, const Value& x, int64_t rows, double eps) {
  const int64_t inner = rows ? x.type.shape.numel() / rows : 0;
  const DType dt = x.type.dtype;
  std::vector<ValueId> y = c.b.op(OpKind::layernorm,
                                  {c.id(reshaped(c, x, {rows, inner})), c.id(filled(c, 1.0, dt, Shape{inner})),
                                   c.id(filled(c, 0.0, dt, Shape{inner}))},
                                  {{"eps", eps}});
  return c.b.reshape(y.empty() ? c.id(x) : y[0], dims(x.type.shape));
}

// v [C] (per channel) broadcast over x's [N, C, D...].
ValueId per_channel(Ctx& c, const Value& v, const Shape& x) {
  std::vector<int64_t> one(size_t(x.rank()), 1);
  one[1] = x[1];
  return c.b.broadcast(c.b.reshape(c.id(v), one), dims(x));
}

Status check_channels(Ctx& c, const std::vector<Value>& in, const std::vector<std::string>& names, int64_t C) {
  for (size_t k = 1; k < in.size() && k <= names.size(); ++k)
    if (in[k].present() && (in[k].type.shape != Shape{C} || in[k].type.dtype != in[0].type.dtype))
      return c.error("input '" + names[k - 1] + "'",
                     graph::TensorType{in[0].type.dtype, Shape{C}}.to_string() + " (one value per channel)",
                     in[k].type.to_string());
  return Status();
}

// InstanceNormalization(x [N, C, D...], scale [C], B [C]) {epsilon}: each (n, c) over its D....
Status convert_instance_norm(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape s = in[0].type.shape;
  if (s.rank() < 3) return c.error("input 'input'", "[N, C, D...] with spatial axes", in[0].type.to_string());
  ASPEN_RETURN_IF_ERROR(check_channels(c, in, {"scale", "B"}, s[1]));
  ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-5f));
  const ValueId y = normalized_rows(c, in[0], s[0] * s[1], eps);
  out = {c.wrap(c.b.add(c.b.mul(y, per_channel(c, in[1], s)), per_channel(c, in[2], s)))};
  return c.b.status();
}

// GroupNormalization(x [N, C, D...], scale, bias) {epsilon, num_groups}: each (n, group of C / G channels)
// over its channels and D...; scale and bias per channel (opset 21) or per group (18, repeated over the
// group's channels).
Status convert_group_norm(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape s = in[0].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int64_t G, c.attr_i("num_groups"));
  if (s.rank() < 2 || G < 1 || s[1] % G != 0)
    return c.error("attribute 'num_groups'", "a divisor of the channels of " + in[0].type.to_string(), std::to_string(G));
  ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-5f));
  const int64_t C = s[1];
  std::vector<Value> per = in;
  if (c.opset < 21) {  // [G] -> [C]
    ASPEN_RETURN_IF_ERROR(check_channels(c, in, {"scale", "bias"}, G));
    for (size_t k = 1; k < 3; ++k)
      per[k] = c.wrap(c.b.reshape(c.b.broadcast(c.b.reshape(c.id(in[k]), {G, 1}), {G, C / G}), {C}));
  } else {
    ASPEN_RETURN_IF_ERROR(check_channels(c, in, {"scale", "bias"}, C));
  }
  const ValueId y = normalized_rows(c, in[0], s[0] * G, eps);
  out = {c.wrap(c.b.add(c.b.mul(y, per_channel(c, per[1], s)), per_channel(c, per[2], s)))};
  return c.b.status();
}

// NOTE [batch norm in training]: BatchNormalization with training_mode 1 normalizes by the batch's statistics
// (the mean and the population variance over every axis but the channels: the IR's batch_norm, one kernel
// each way) and updates the running ones,
// running = running momentum + batch (1 - momentum), as state: the importer makes them parameters (NOTE
// in onnx_import.cc), this conversion writes their new values with Builder::update, and the training
// programs keep a forward graph's updates, once per micro-batch (train/program.cc), without training them
// (a parameter the forward graph updates is not trained). The attribute aspen_unbiased_running_var (the
// Python package sets it on a torch module's batch norms) folds the unbiased variance into the running
// one, as PyTorch does. The optional outputs are the new running statistics.
Status convert_batch_norm_training(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape s = in[0].type.shape;
  if (s.rank() < 2) return c.error("input 'X'", "[N, C, D...]", in[0].type.to_string());
  ASPEN_RETURN_IF_ERROR(check_channels(c, in, {"scale", "B", "input_mean", "input_var"}, s[1]));
  ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-5f));
  ASPEN_ASSIGN_OR_RETURN(const float momentum, c.attr_f("momentum", 0.9f));
  ASPEN_ASSIGN_OR_RETURN(const int64_t unbiased, c.attr_i("aspen_unbiased_running_var", 0));
  const DType dt = in[0].type.dtype;
  int64_t count = s[0];
  for (int i = 2; i < s.rank(); ++i) count *= s[i];
  if (count < 1 || (unbiased && count < 2))
    return c.error("input 'X'", "at least " + std::string(unbiased ? "2" : "1") + " values per channel", in[0].type.to_string());
  // The IR's batch_norm (one kernel each way), the variance back from rstd: var = 1 / rstd^2 - eps.
  const std::vector<ValueId> f =
      c.b.op(OpKind::batch_norm, {c.id(in[0]), c.id(in[1]), c.id(in[2])}, {{"eps", double(eps)}});
  if (f.size() != 3) return c.b.status();
  const Shape cs{s[1]};
  ValueId batch_mean = f[1], batch_var = c.b.sub(c.b.div(c.id(filled(c, 1.0, DType::f32, cs)), c.b.mul(f[2], f[2])),
                                                 c.id(filled(c, eps, DType::f32, cs)));
  if (dt != DType::f32) batch_mean = c.b.cast(batch_mean, dt), batch_var = c.b.cast(batch_var, dt);
  const ValueId y = f[0];
  if (unbiased) batch_var = c.b.scale(batch_var, double(count) / double(count - 1));
  auto blend = [&](const Value& running, ValueId batch) {
    return c.b.add(c.b.scale(c.id(running), momentum), c.b.scale(batch, 1.0 - double(momentum)));
  };
  const ValueId new_mean = blend(in[3], batch_mean), new_var = blend(in[4], batch_var);
  for (auto [k, v] : {std::pair<size_t, ValueId>{3, new_mean}, {4, new_var}})
    if (in[k].parameter && in[k].id) c.b.update(*in[k].id, v);
  out = {c.wrap(y), c.wrap(new_mean), c.wrap(new_var)};
  return c.b.status();
}

// BatchNormalization in inference (training_mode 0: the running statistics): x a + (B - mean a) with
// a = scale / sqrt(var + epsilon), per channel; in training, the conversion above.
Status convert_batch_norm(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t training, c.attr_i("training_mode", 0));
  bool stats_out = false;
  for (size_t o = 1; o < c.node.outputs.size(); ++o) stats_out = stats_out || !c.node.outputs[o].empty();
  if (training || stats_out) return convert_batch_norm_training(c, in, out);
  const Shape s = in[0].type.shape;
  if (s.rank() < 2) return c.error("input 'X'", "[N, C, D...]", in[0].type.to_string());
  ASPEN_RETURN_IF_ERROR(check_channels(c, in, {"scale", "B", "input_mean", "input_var"}, s[1]));
  ASPEN_ASSIGN_OR_RETURN(const float eps, c.attr_f("epsilon", 1e-5f));
  const DType dt = in[0].type.dtype;
  const Shape cs{s[1]};
  const ValueId a = c.b.div(c.id(in[1]), c.b.sqrt(c.b.add(c.id(in[4]), c.id(filled(c, eps, dt, cs)))));
  const ValueId shift = c.b.sub(c.id(in[2]), c.b.mul(c.id(in[3]), a));
  out = {c.wrap(c.b.add(c.b.mul(c.id(in[0]), per_channel(c, c.wrap(a), s)), per_channel(c, c.wrap(shift), s)))};
  return c.b.status();
}

// ArgMax / ArgMin {axis = 0, keepdims = 1, select_last_index = 0} (int64), Hardmax {axis} (its one-hot,
// x's type) and TopK: through largest_along (below).
// x's position of the axis' largest (smallest, with min) value as f32, the axis kept as 1.
Result<ValueId> extreme_position(Ctx& c, ValueId x, int axis, bool min, bool last) {
  const Shape s = c.b.type(x).shape;
  if (c.b.type(x).dtype != DType::f32) x = c.b.cast(x, DType::f32);
  if (min) x = c.b.neg(x);
  ASPEN_ASSIGN_OR_RETURN(const ValueId pos, positions(c, s, axis));
  return largest_along(c, x, pos, axis, last).second;
}

Status convert_arg(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, bool min) {
  const Shape s = in[0].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", 0));
  ASPEN_ASSIGN_OR_RETURN(const int64_t keep, c.attr_i("keepdims", 1));
  ASPEN_ASSIGN_OR_RETURN(const int64_t last, c.attr_i("select_last_index", 0));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, s.rank(), "attribute 'axis'"));
  if (s[axis] == 0) return c.error("input 'data'", "a non-empty axis " + std::to_string(axis), s.to_string());
  ASPEN_ASSIGN_OR_RETURN(ValueId p, extreme_position(c, c.id(in[0]), axis, min, last != 0));
  p = c.b.cast(p, DType::i64);
  if (!keep) {
    std::vector<int64_t> d = dims(s);
    d.erase(d.begin() + axis);
    p = c.b.reshape(p, d);
  }
  out = {c.wrap(p)};
  return c.b.status();
}

Status convert_hardmax(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  return softmax_like(c, in, out, [&](const Value& x, int axis, std::vector<Value>& o) -> Status {
    const Shape s = x.type.shape;
    ASPEN_ASSIGN_OR_RETURN(const ValueId pos, positions(c, s, axis));
    ValueId x32 = c.id(x);
    if (x.type.dtype != DType::f32) x32 = c.b.cast(x32, DType::f32);
    const ValueId p = largest_along(c, x32, pos, axis, false).second;
    o = {c.wrap(c.b.cast(c.b.op1(OpKind::equal, {pos, c.b.broadcast(p, dims(s))}), x.type.dtype))};
    return c.b.status();
  });
}

// TopK(x, k) {axis = -1, largest = 1, sorted = 1}: k rounds of the axis' extreme (the first position among
// equal values, as ONNX orders ties by index), each taken out (set to -inf) for the next; values in order,
// their positions as int64. k is known at import and at most 256 (each round is a few ops).
Status convert_top_k(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape s = in[0].type.shape;
  const DType dt = in[0].type.dtype;
  if (!is_float(dt))
    return c.unsupported("input 'X'", "a float tensor", in[0].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const int64_t a, c.attr_i("axis", -1));
  ASPEN_ASSIGN_OR_RETURN(const int64_t largest, c.attr_i("largest", 1));
  ASPEN_ASSIGN_OR_RETURN(const int axis, c.axis(a, s.rank(), "attribute 'axis'"));
  int64_t k = 0;
  if (c.opset < 10) {
    ASPEN_ASSIGN_OR_RETURN(k, c.attr_i("k"));
  } else {
    ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> kk, c.ints(in[1], "input 'K'"));
    if (kk.size() != 1) return c.error("input 'K'", "one value", std::to_string(kk.size()));
    k = kk[0];
  }
  if (k < 0 || k > s[axis]) return c.error("input 'K'", "in [0, " + std::to_string(s[axis]) + "]", std::to_string(k));
  if (k > 256) return c.unsupported("input 'K'", "at most 256", std::to_string(k));
  const std::vector<int64_t> d = dims(s);
  ValueId x = c.id(in[0]);
  if (dt != DType::f32) x = c.b.cast(x, DType::f32);
  if (!largest) x = c.b.neg(x);
  ASPEN_ASSIGN_OR_RETURN(const ValueId pos, positions(c, s, axis));
  const ValueId gone = c.id(filled(c, -std::numeric_limits<double>::infinity(), DType::f32, s));
  std::vector<ValueId> values, indices;
  for (int64_t r = 0; r < k; ++r) {
    const auto [m, first] = largest_along(c, x, pos, axis, false);
    values.push_back(m);
    indices.push_back(first);
    x = c.b.where(c.b.op1(OpKind::equal, {pos, c.b.broadcast(first, d)}), gone, x);
  }
  std::vector<int64_t> od = d;
  od[size_t(axis)] = k;
  if (k == 0) {
    out = {c.wrap(c.b.constant(Tensor(dt, shape_of(od)))), c.wrap(c.b.constant(Tensor(DType::i64, shape_of(od))))};
    return c.b.status();
  }
  ValueId v = k == 1 ? values[0] : c.b.concat(values, axis);
  if (!largest) v = c.b.neg(v);
  if (dt != DType::f32) v = c.b.cast(v, dt);
  const ValueId i = c.b.cast(k == 1 ? indices[0] : c.b.concat(indices, axis), DType::i64);
  out = {c.wrap(v), c.wrap(i)};
  return c.b.status();
}

// LRN(x [N, C, D...]) {alpha = 1e-4, beta = 0.75, bias = 1, size}: x / (bias + alpha / size · Σ x²)^beta,
// the sum over the channels c - floor((size - 1) / 2) .. c + ceil((size - 1) / 2): the squares padded with
// zeros on the channel axis and `size` shifted slices added.
Status convert_lrn(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape s = in[0].type.shape;
  if (s.rank() < 3) return c.error("input 'X'", "[N, C, D...]", in[0].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 1e-4f));
  ASPEN_ASSIGN_OR_RETURN(const float beta, c.attr_f("beta", 0.75f));
  ASPEN_ASSIGN_OR_RETURN(const float bias, c.attr_f("bias", 1.0f));
  ASPEN_ASSIGN_OR_RETURN(const int64_t size, c.attr_i("size"));
  if (size < 1) return c.error("attribute 'size'", ">= 1", std::to_string(size));
  const DType dt = in[0].type.dtype;
  const int64_t C = s[1], before = (size - 1) / 2, after = size - 1 - before;
  const ValueId x = c.id(in[0]);
  ValueId sq = c.b.mul(x, x);
  std::vector<int64_t> d = dims(s);
  std::vector<ValueId> parts;
  if (before > 0) {
    d[1] = before;
    parts.push_back(c.id(filled(c, 0.0, dt, shape_of(d))));
  }
  parts.push_back(sq);
  if (after > 0) {
    d[1] = after;
    parts.push_back(c.id(filled(c, 0.0, dt, shape_of(d))));
  }
  const ValueId padded = parts.size() > 1 ? c.b.concat(parts, 1) : sq;
  ValueId sum = c.b.slice(padded, 1, 0, C);
  for (int64_t k = 1; k < size; ++k) sum = c.b.add(sum, c.b.slice(padded, 1, k, k + C));
  const ValueId base = c.b.add(c.id(filled(c, bias, dt, s)), c.b.scale(sum, double(alpha) / double(size)));
  out = {c.wrap(c.b.div(x, c.b.exp(c.b.scale(c.b.op1(OpKind::log, {base}), beta))))};
  return c.b.status();
}

// The run-time seed input training Dropout and RandomUniformLike share (NOTE [training dropout]).
Result<ValueId> dropout_seed(Ctx& c) {
  graph::Graph& g = c.b.graph();
  std::optional<ValueId> seed = g.find_input(kDropoutSeedInput);
  if (!seed) seed = c.b.input(kDropoutSeedInput, DType::i64, Shape{1});
  if (g.type(*seed) != graph::TensorType{DType::i64, Shape{1}})
    return c.error(std::string("graph input '") + kDropoutSeedInput + "'",
                   "i64 [1] (the name training Dropout's seed takes)", g.type(*seed).to_string());
  return *seed;
}

// NOTE [training dropout]: Dropout with training_mode true (what torch.onnx writes for a module exported in
// training mode) becomes the IR's dropout op: its mask is Philox stream `node index` under a run-time seed,
// the graph input "dropout_seed" (i64 [1], added once for all the file's Dropouts), which the trainer feeds
// per micro-batch (a hash of train.seed, the replica and the batch's position: the same on a resume) and
// -1 for validation (no dropout). The backward pass draws the same mask again. The optional mask output is
// the kept elements. Inference (training_mode absent or false) is the identity, as ONNX defines it.
Status convert_dropout(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  bool training = false;
  if (in.size() > 2 && in[2].present()) {
    ASPEN_ASSIGN_OR_RETURN(const double t, c.scalar(in[2], "input 'training_mode'"));
    training = t != 0;
  }
  double ratio = 0.5;
  if (in.size() > 1 && in[1].present()) {
    ASPEN_ASSIGN_OR_RETURN(ratio, c.scalar(in[1], "input 'ratio'"));
  }
  if (training && !(ratio >= 0.0 && ratio < 1.0))
    return c.error("input 'ratio'", "a ratio in [0, 1) (the share of elements dropped)", std::to_string(ratio));
  const TensorType t = in[0].type;
  if (!training || ratio == 0.0) {
    out = {in[0]};
    if (c.node.outputs.size() > 1) {  // the mask: all kept
      Tensor m(DType::boolean, t.shape);
      for (bool& v : m.span<bool>()) v = true;
      out.push_back(Ctx::constant(std::move(m)));
    }
    return Status();
  }
  ASPEN_ASSIGN_OR_RETURN(const ValueId seed, dropout_seed(c));
  const graph::Attrs attrs{{"ratio", ratio}, {"stream", int64_t(c.index())}};
  out = {c.wrap(c.b.op1(OpKind::dropout, {c.id(in[0]), seed}, attrs))};
  if (c.node.outputs.size() > 1) {  // the kept elements: where dropout of ones is not 0
    const ValueId kept = c.b.op1(OpKind::dropout, {c.id(filled(c, 1.0, t.dtype, t.shape)), seed}, attrs);
    out.push_back(c.wrap(c.b.op1(OpKind::greater, {kept, c.id(filled(c, 0.0, t.dtype, t.shape))})));
  }
  return c.b.status();
}

// RandomUniformLike(input) {dtype, low = 0, high = 1, seed} and RandomUniform {shape, dtype = float, ...}:
// the IR's random_uniform, Philox stream `node index` under the run-time dropout_seed (NOTE [training
// dropout]), or under the node's own `seed` when it has one. torch's bernoulli (in-place Dropout exported
// in training mode) writes Cast(Less(RandomUniformLike(x), keep)) / keep, which compiler/fusion.cc turns
// back into dropout (the identity in validation); any other use of the draws needs a seed >= 0, so a
// validation or inference run of it is refused at run time, by name.
Status random_uniform(Ctx& c, std::vector<Value>& out, const Shape& shape, DType like) {
  DType dt = like;
  if (c.has("dtype")) {
    ASPEN_ASSIGN_OR_RETURN(const int64_t code, c.attr_i("dtype"));
    if (code == 1) dt = DType::f32;
    else if (code == 10) dt = DType::f16;
    else if (code == 16) dt = DType::bf16;
    else return c.unsupported("attribute 'dtype'", "FLOAT, FLOAT16 or BFLOAT16 (1, 10, 16)", std::to_string(code));
  }
  if (!is_float(dt)) return c.error("output", "a float type", std::string(dtype_name(dt)));
  ASPEN_ASSIGN_OR_RETURN(const float low, c.attr_f("low", 0.0f));
  ASPEN_ASSIGN_OR_RETURN(const float high, c.attr_f("high", 1.0f));
  ValueId seed;
  if (c.has("seed")) {
    ASPEN_ASSIGN_OR_RETURN(const float s, c.attr_f("seed"));
    Tensor t(DType::i64, Shape{1});
    t.span<int64_t>()[0] = int64_t(std::abs(s));
    seed = c.b.constant(std::move(t));
  } else {
    ASPEN_ASSIGN_OR_RETURN(seed, dropout_seed(c));
  }
  const graph::Attrs attrs{{"low", double(low)}, {"high", double(high)}, {"stream", int64_t(c.index())}};
  out = {c.wrap(c.b.op1(OpKind::random_uniform, {c.id(filled(c, 0.0, dt, shape)), seed}, attrs))};
  return c.b.status();
}

Status convert_random_uniform_like(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  return random_uniform(c, out, in[0].type.shape, in[0].type.dtype);
}

Status convert_random_uniform(Ctx& c, std::vector<Value>&, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> d, c.attr_ints("shape"));
  ASPEN_ASSIGN_OR_RETURN(const Shape shape, make_shape(c, d, "attribute 'shape'"));
  return random_uniform(c, out, shape, DType::f32);
}

}  // namespace

std::pair<graph::ValueId, graph::ValueId> largest_along(Ctx& c, ValueId x, ValueId pos, int axis, bool last) {
  const Shape s = c.b.type(x).shape;
  const std::vector<int64_t> d = dims(s);
  const ValueId m = c.b.reduce_max(x, {axis}, true);
  const ValueId at = c.b.op1(OpKind::equal, {x, c.b.broadcast(m, d)});
  if (last) return {m, c.b.reduce_max(c.b.where(at, pos, c.id(filled(c, -1.0, DType::f32, s))), {axis}, true)};
  // The first: the smallest position, -max(-position).
  const ValueId none = c.id(filled(c, -double(s[axis]), DType::f32, s));
  return {m, c.b.neg(c.b.reduce_max(c.b.where(at, c.b.neg(pos), none), {axis}, true))};
}

void add_nn_converters(ConverterTable& t) {
  add_converter(t, "GlobalAveragePool", convert_global_average_pool, 1, 1);
  add_converter(t, "ReduceProd", convert_reduce_prod, 1, 2);
  add_converter(t, "ReduceSum", reduction(Reduce::sum, 13), 1, 2);
  add_converter(t, "ReduceMean", reduction(Reduce::mean, 18), 1, 2);
  add_converter(t, "ReduceMax", reduction(Reduce::max, 18), 1, 2);
  add_converter(t, "ReduceMin", reduction(Reduce::min, 18), 1, 2);
  add_converter(t, "Softmax", convert_softmax, 1, 1);
  add_converter(t, "SoftmaxCrossEntropyLoss", convert_softmax_cross_entropy, 2, 3);
  add_converter(t, "NegativeLogLikelihoodLoss", convert_nll_loss, 2, 3);
  add_converter(t, "InstanceNormalization", convert_instance_norm, 3, 3);
  add_converter(t, "ArgMax", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_arg(c, in, out, false);
  }, 1, 1);
  add_converter(t, "ArgMin", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_arg(c, in, out, true);
  }, 1, 1);
  add_converter(t, "Hardmax", convert_hardmax, 1, 1);
  add_converter(t, "LRN", convert_lrn, 1, 1);
  add_converter(t, "TopK", convert_top_k, 1, 2);
  add_converter(t, "GroupNormalization", convert_group_norm, 3, 3);
  add_converter(t, "BatchNormalization", convert_batch_norm, 5, 5);
  add_converter(t, "LogSoftmax", convert_log_softmax, 1, 1);
  add_converter(t, "LayerNormalization", convert_layer_norm, 2, 3);
  add_converter(t, "Dropout", convert_dropout, 1, 3);
  add_converter(t, "RandomUniformLike", convert_random_uniform_like, 1, 1, /*foldable=*/false);
  add_converter(t, "RandomUniform", convert_random_uniform, 0, 0, /*foldable=*/false);
}

}  // namespace aspen::models::onnx
