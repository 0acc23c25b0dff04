// graph/ops_conv.cc: convolution, the graph form of kernels/conv.h.
//
//   conv(x, w[, bias]) {strides, dilations, pads_begin, pads_end, groups} -> y
//       x [N, C, D...] (1 to 3 spatial axes), w [M, C / groups, K...], bias [M], all one float dtype;
//       y [N, M, O...], O = floor((D + pads_begin + pads_end - ((K - 1) dilations + 1)) / strides) + 1;
//       positions outside x read zero.
//   conv_grad_input(dy, w) {the same, input_shape} -> dx [N, C, D...] with D = input_shape: the transpose of
//       conv in x (ONNX's ConvTranspose).
//   conv_grad_weight(x, dy) {the same, kernel} -> dw [M, C / groups, K...] with K = kernel.
//
// Gradients (each op is linear in each input, so the three are one family):
//   conv:             dx = conv_grad_input(g, w), dw = conv_grad_weight(x, g), dbias = reduce_sum(g, all but 1)
//   conv_grad_input:  ddy = conv(g, w), dw = conv_grad_weight(g, dy)
//   conv_grad_weight: dx = conv_grad_input(dy, g), ddy = conv(x, g)
// Fast kernels: oneDNN's convolution primitives (kernels/conv.h), f32, bf16 and f16 (the last two widened).
#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/conv.h"

namespace aspen::graph {

namespace {
using namespace nnutil;
using kernels::ConvShape;

// The convolution of x [N, C, D...] by w [M, C / groups, K...] under the node's attributes, checked.
Result<ConvShape> geometry(const Node& n, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  const int r = int(x.size());
  if (r < 3 || r > 5) return rule_error(n, "x", "[N, C, D...] with 1 to 3 spatial axes", dims_string(x));
  if (int(w.size()) != r) return rule_error(n, "w", "[M, C / groups, K...] of x's rank " + str(r), dims_string(w));
  const size_t k = size_t(r - 2);
  ConvShape s;
  s.spatial = int(k);
  s.N = x[0], s.C = x[1], s.M = w[0], s.groups = n.attrs.i("groups");
  if (s.groups < 1 || s.C % s.groups != 0 || s.M % s.groups != 0 || w[1] != s.C / s.groups)
    return rule_error(n, "x and w", "groups (" + str(s.groups) + ") dividing C and M, and w [M, C / groups, K...]",
                      dims_string(x) + " and " + dims_string(w));
  const std::vector<int64_t>&st = n.attrs.ints("strides"), &dil = n.attrs.ints("dilations"),
                            &pb = n.attrs.ints("pads_begin"), &pe = n.attrs.ints("pads_end");
  if (st.size() != k || dil.size() != k || pb.size() != k || pe.size() != k)
    return rule_error(n, "strides, dilations, pads_begin, pads_end", str(int64_t(k)) + " values each",
                      dims_string(st) + ", " + dims_string(dil) + ", " + dims_string(pb) + ", " + dims_string(pe));
  for (size_t i = 0; i < k; ++i) {
    const size_t a = 3 - k + i;
    s.D[a] = x[2 + i], s.K[a] = w[2 + i], s.S[a] = st[i], s.Dil[a] = dil[i], s.PadBegin[a] = pb[i], s.PadEnd[a] = pe[i];
    if (s.K[a] < 1 || s.S[a] < 1 || s.Dil[a] < 1 || s.PadBegin[a] < 0 || s.PadEnd[a] < 0)
      return rule_error(n, "kernel, strides, dilations, pads", "kernel, strides, dilations >= 1 and pads >= 0",
                        dims_string(w) + ", " + dims_string(st) + ", " + dims_string(dil) + ", " + dims_string(pb) + ", " + dims_string(pe));
    const int64_t room = s.D[a] + s.PadBegin[a] + s.PadEnd[a] - ((s.K[a] - 1) * s.Dil[a] + 1);
    if (room < 0)
      return rule_error(n, "x", "spatial extents at least the dilated kernel " + dims_string(w) + " after padding", dims_string(x));
    s.O[a] = room / s.S[a] + 1;
  }
  return s;
}

std::vector<int64_t> spatial_of(const std::vector<int64_t>& d) { return {d.begin() + 2, d.end()}; }

Status same_float(const Node& n, std::span<const TensorType> in) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "input 0", in[0]));
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      return rule_error(n, "input " + str(int64_t(i)), std::string(dtype_name(in[0].dtype)) + " (input 0's dtype)",
                        in[i].to_string());
  return Status();
}

// Each op's convolution: conv (x, w), conv_grad_input (dy, w; x from input_shape), conv_grad_weight (x, dy;
// w from kernel); the given gradient's shape is checked against the convolution's output.
Result<ConvShape> shape_of(const Node& n, std::span<const TensorType> in) {
  ASPEN_RETURN_IF_ERROR(same_float(n, in));
  const std::vector<int64_t> a = dims(in[0].shape), b = dims(in[1].shape);
  if (n.op == OpKind::conv) return geometry(n, a, b);
  if (a.size() < 3 || b.size() < 2) return rule_error(n, "inputs", "[N, channels, extents...] each", dims_string(a) + ", " + dims_string(b));
  std::vector<int64_t> x, w;
  const std::vector<int64_t>* dy;
  if (n.op == OpKind::conv_grad_input) {
    x = {a[0], b[1] * n.attrs.i("groups")};
    for (int64_t v : n.attrs.ints("input_shape")) x.push_back(v);
    w = b, dy = &a;
  } else {
    w = {b[1], a[1] / std::max<int64_t>(1, n.attrs.i("groups"))};
    for (int64_t v : n.attrs.ints("kernel")) w.push_back(v);
    x = a, dy = &b;
  }
  ASPEN_ASSIGN_OR_RETURN(const ConvShape s, geometry(n, x, w));
  if (s.y_dims() != *dy)
    return rule_error(n, n.op == OpKind::conv_grad_input ? "dy" : "dy (input 1)",
                      dims_string(s.y_dims()) + " (the convolution's output)", dims_string(*dy));
  return s;
}

Status infer_conv(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const ConvShape s, shape_of(n, in));
  if (n.op == OpKind::conv && in.size() > 2 && in[2].shape != Shape{s.M})
    return rule_error(n, "bias", TensorType{in[0].dtype, Shape{s.M}}.to_string(), in[2].to_string());
  const std::vector<int64_t> d = n.op == OpKind::conv             ? s.y_dims()
                                 : n.op == OpKind::conv_grad_input ? s.x_dims()
                                                                   : s.w_dims();
  ASPEN_ASSIGN_OR_RETURN(const Shape shape, Shape::make(d.data(), int(d.size())));
  out = {TensorType{in[0].dtype, shape}};
  return Status();
}

// The attributes every member of the family shares, plus one of input_shape / kernel.
Attrs family(const Node& n, const char* extra = nullptr, std::vector<int64_t> value = {}) {
  Attrs a;
  for (const char* k : {"strides", "dilations", "pads_begin", "pads_end"}) a.set(k, n.attrs.ints(k));
  a.set("groups", n.attrs.i("groups"));
  if (extra) a.set(extra, std::move(value));
  return a;
}

Grads grad_conv(Builder& b, const Node& n, OutGrads g) {
  std::vector<std::optional<ValueId>> d(n.inputs.size());
  if (!g[0]) return d;
  const ValueId a = n.inputs[0], c = n.inputs[1];  // (x, w), (dy, w) or (x, dy)
  const std::vector<int64_t> as = dims(b.type(a).shape), cs = dims(b.type(c).shape);
  if (n.op == OpKind::conv) {
    d[0] = b.op1(OpKind::conv_grad_input, {*g[0], c}, family(n, "input_shape", spatial_of(as)));
    d[1] = b.op1(OpKind::conv_grad_weight, {a, *g[0]}, family(n, "kernel", spatial_of(cs)));
    if (n.inputs.size() > 2) {
      std::vector<int64_t> axes = {0};
      for (size_t i = 2; i < as.size(); ++i) axes.push_back(int64_t(i));
      d[2] = b.reduce_sum(*g[0], axes);
    }
  } else if (n.op == OpKind::conv_grad_input) {  // (dy, w)
    d[0] = b.op1(OpKind::conv, {*g[0], c}, family(n));
    d[1] = b.op1(OpKind::conv_grad_weight, {*g[0], a}, family(n, "kernel", spatial_of(cs)));
  } else {  // conv_grad_weight (x, dy)
    d[0] = b.op1(OpKind::conv_grad_input, {c, *g[0]}, family(n, "input_shape", spatial_of(as)));
    d[1] = b.op1(OpKind::conv, {a, *g[0]}, family(n));
  }
  return d;
}

Status eval_conv(const Node& n, Ins in, Outs out) {
  std::vector<TensorType> types;
  for (const HostArray* a : in) types.push_back(a->type);
  ASPEN_ASSIGN_OR_RETURN(const ConvShape s, shape_of(n, types));
  const double* a = in[0]->data.data();
  const double* b = in[1]->data.data();
  double* o = out[0].data.data();
  if (n.op == OpKind::conv) kernels::ref::conv_forward<double>(s, a, b, in.size() > 2 ? in[2]->data.data() : nullptr, o);
  else if (n.op == OpKind::conv_grad_input) kernels::ref::conv_backward_data<double>(s, a, b, o);
  else kernels::ref::conv_backward_weights<double>(s, a, b, o);
  return Status();
}

// NOTE [fixed weights] (ops_matmul.cc): with the weights fixed, forward and backward_data keep them in oneDNN's
// layout, reordered once and again after fixed_inputs_changed().
Prepared prepare_conv_impl(const Node& n, Types in, bool w_fixed);
Prepared prepare_conv(const Node& n, Types in, Types) { return prepare_conv_impl(n, in, false); }
Prepared prepare_conv_fixed(const Node& n, Types in, Types, std::span<const char> fixed) {
  return prepare_conv_impl(n, in, n.op != OpKind::conv_grad_weight && fixed.size() > 1 && fixed[1]);
}

Prepared prepare_conv_impl(const Node& n, Types in, bool w_fixed) {
  ASPEN_ASSIGN_OR_RETURN(const ConvShape s, shape_of(n, in));
  const kernels::ConvPass pass = n.op == OpKind::conv              ? kernels::ConvPass::forward
                                 : n.op == OpKind::conv_grad_input ? kernels::ConvPass::backward_data
                                                                   : kernels::ConvPass::backward_weights;
  const bool bias = n.op == OpKind::conv && in.size() > 2;
  Result<kernels::ConvPlan> plan = kernels::ConvPlan::make(s, pass, in[0].dtype, bias, w_fixed);
  if (!plan.is_ok()) return no_fast_kernel();  // a shape oneDNN refuses runs the reference
  auto p = std::make_shared<kernels::ConvPlan>(std::move(*plan));
  return make_kernel([p, bias](In i, Out o) { return p->run(i[0], i[1], bias ? i[2] : nullptr, o[0]); },
                     [p] { p->b_changed(); });
}

// Odd shapes over 1, 2 and 3 spatial axes: strides, dilations, uneven pads, groups and depthwise, a bias;
// f32 tight, bf16 and f16 (widened to f32, rounded once) at their rounding. One pass's samples.
void conv_samples(SampleList& s, OpKind op) {
  struct Case {
    const char* label;
    std::vector<int64_t> x, w, st, dil, pb, pe;
    int64_t groups;
  };
  const std::vector<Case> cases = {
      {"2-D 3x3 pad 1", {2, 3, 7, 9}, {5, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, 1},
      {"2-D stride 2, uneven pads, dilation", {1, 4, 11, 8}, {6, 4, 3, 2}, {2, 3}, {2, 1}, {0, 2}, {1, 0}, 1},
      {"2-D groups", {2, 6, 5, 5}, {9, 2, 3, 3}, {1, 2}, {1, 1}, {1, 0}, {1, 1}, 3},
      {"2-D depthwise", {1, 5, 9, 7}, {5, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 5},
      {"1-D", {3, 4, 13}, {7, 4, 5}, {2}, {1}, {2}, {1}, 1},
      {"3-D", {1, 3, 5, 6, 4}, {4, 3, 2, 3, 2}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1}, {0, 1, 1}, 1},
      {"2-D 1x1 stride 2", {2, 16, 9, 9}, {24, 16, 1, 1}, {2, 2}, {1, 1}, {0, 0}, {0, 0}, 1},
  };
  for (const Case& c : cases)
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      Node probe;
      probe.op = OpKind::conv;
      probe.attrs = {{"strides", c.st}, {"dilations", c.dil}, {"pads_begin", c.pb}, {"pads_end", c.pe},
                     {"groups", c.groups}};
      const std::vector<int64_t> y = geometry(probe, c.x, c.w)->y_dims();
      const std::string name = std::string(dtype_name(t)) + " " + c.label;
      const double tol = t == DType::f32 ? 1e-5 : t == DType::bf16 ? 1e-2 : 2e-3;
      if (op == OpKind::conv) {
        s.add(name + " with bias", [&](Builder& b) {
           b.op(op, {b.input("x", t, sample_shape(c.x)), b.input("w", t, sample_shape(c.w)),
                     b.input("bias", t, Shape{c.w[0]})},
                probe.attrs);
         }).tol = tol;
      } else if (op == OpKind::conv_grad_input) {
        s.add(name, [&](Builder& b) {
           b.op(op, {b.input("dy", t, sample_shape(y)), b.input("w", t, sample_shape(c.w))},
                family(probe, "input_shape", spatial_of(c.x)));
         }).tol = tol;
      } else {
        s.add(name, [&](Builder& b) {
           b.op(op, {b.input("x", t, sample_shape(c.x)), b.input("dy", t, sample_shape(y))},
                family(probe, "kernel", spatial_of(c.w)));
         }).tol = tol;
      }
    }
}
void samples_conv(SampleList& s) { conv_samples(s, OpKind::conv); }
void samples_conv_grad_input(SampleList& s) { conv_samples(s, OpKind::conv_grad_input); }
void samples_conv_grad_weight(SampleList& s) { conv_samples(s, OpKind::conv_grad_weight); }

}  // namespace

void register_conv_ops(OpTable& t) {
  auto with = [](const char* extra) {  // the family's attributes, plus input_shape or kernel
    std::vector<AttrSpec> a = {{"strides", AttrKind::ints, true},
                               {"dilations", AttrKind::ints, true},
                               {"pads_begin", AttrKind::ints, true},
                               {"pads_end", AttrKind::ints, true},
                               {"groups", AttrKind::i64, true},
                               {extra, AttrKind::ints, true}};
    if (!extra) a.pop_back();
    return a;
  };
  t.define(OpKind::conv, {.min_inputs = 2,
                          .max_inputs = 3,
                          .attrs = with(nullptr),
                          .infer = infer_conv,
                          .grad = grad_conv,
                          .eval = eval_conv,
                          .prepare = prepare_conv,
                          .prepare_fixed = prepare_conv_fixed,
                          .samples = samples_conv});
  t.define(OpKind::conv_grad_input, {.min_inputs = 2,
                                     .max_inputs = 2,
                                     .attrs = with("input_shape"),
                                     .infer = infer_conv,
                                     .grad = grad_conv,
                                     .eval = eval_conv,
                                     .prepare = prepare_conv,
                                     .prepare_fixed = prepare_conv_fixed,
                                     .samples = samples_conv_grad_input});
  t.define(OpKind::conv_grad_weight, {.min_inputs = 2,
                                      .max_inputs = 2,
                                      .attrs = with("kernel"),
                                      .infer = infer_conv,
                                      .grad = grad_conv,
                                      .eval = eval_conv,
                                      .prepare = prepare_conv,
                                      .samples = samples_conv_grad_weight});
}

}  // namespace aspen::graph
