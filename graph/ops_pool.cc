// graph/ops_pool.cc: 2-D max pooling, the graph form of kernels/pool.h.
//
//   max_pool(x) {kernel, strides, dilations, pads_begin, pads_end} -> y
//       x [N, C, H, W] float; each of the five attributes two values (rows, columns); kernel, strides and
//       dilations >= 1, pads >= 0. y [N, C, OH, OW], O = floor((D + pads_begin + pads_end - ((K - 1)
//       dilations + 1)) / strides) + 1 (a ceil-mode pool is this with a longer pads_end); positions in the
//       padding never win, and a window wholly in it gives -inf.
//   max_pool_grad(x, dy) {the same} -> dx [N, C, H, W]: each dy added to its window's first maximum.
//
// Gradient: dx = max_pool_grad(x, g) (torch's: one position per window, ties to the first in the window's
// row-major scan); max_pool_grad is not differentiated again.
// Fast kernels: f32, and bf16 / f16 through widened copies (the outputs rounded once).
#include <cmath>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/convert.h"
#include "kernels/pool.h"
#include "kernels/scratch.h"

namespace aspen::graph {

namespace {
using namespace nnutil;
using kernels::MaxPoolShape;

// The pool of x [N, C, H, W] under the node's attributes, checked.
Result<MaxPoolShape> geometry(const Node& n, const TensorType& x) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", x));
  if (x.shape.rank() != 4) return rule_error(n, "x", "[N, C, H, W]", x.to_string());
  const std::vector<int64_t>&k = n.attrs.ints("kernel"), &st = n.attrs.ints("strides"),
                            &dil = n.attrs.ints("dilations"), &pb = n.attrs.ints("pads_begin"),
                            &pe = n.attrs.ints("pads_end");
  if (k.size() != 2 || st.size() != 2 || dil.size() != 2 || pb.size() != 2 || pe.size() != 2)
    return rule_error(n, "kernel, strides, dilations, pads_begin, pads_end", "2 values each",
                      dims_string(k) + ", " + dims_string(st) + ", " + dims_string(dil) + ", " + dims_string(pb) +
                          ", " + dims_string(pe));
  for (int i = 0; i < 2; ++i)
    if (k[size_t(i)] < 1 || st[size_t(i)] < 1 || dil[size_t(i)] < 1 || pb[size_t(i)] < 0 || pe[size_t(i)] < 0)
      return rule_error(n, "kernel, strides, dilations, pads", "kernel, strides, dilations >= 1 and pads >= 0",
                        dims_string(k) + ", " + dims_string(st) + ", " + dims_string(dil) + ", " + dims_string(pb) +
                            ", " + dims_string(pe));
  MaxPoolShape s;
  s.N = x.shape[0], s.C = x.shape[1], s.H = x.shape[2], s.W = x.shape[3];
  s.KH = k[0], s.KW = k[1], s.SH = st[0], s.SW = st[1], s.DH = dil[0], s.DW = dil[1], s.PH = pb[0], s.PW = pb[1];
  if (s.N < 1 || s.C < 1 || s.H < 1 || s.W < 1) return rule_error(n, "x", "no empty axis", x.to_string());
  const int64_t rooms[2] = {s.H + pb[0] + pe[0] - ((s.KH - 1) * s.DH + 1), s.W + pb[1] + pe[1] - ((s.KW - 1) * s.DW + 1)};
  if (rooms[0] < 0 || rooms[1] < 0)
    return rule_error(n, "x", "spatial extents at least the dilated kernel " + dims_string(k) + " after padding",
                      x.to_string());
  s.OH = rooms[0] / s.SH + 1, s.OW = rooms[1] / s.SW + 1;
  return s;
}

Status infer_max_pool(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const MaxPoolShape s, geometry(n, in[0]));
  out = {TensorType{in[0].dtype, Shape{s.N, s.C, s.OH, s.OW}}};
  return Status();
}

Status infer_max_pool_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const MaxPoolShape s, geometry(n, in[0]));
  ASPEN_RETURN_IF_ERROR(
      expect_type(n, "dy", in[1], TensorType{in[0].dtype, Shape{s.N, s.C, s.OH, s.OW}}, "the pool's output type"));
  out = {in[0]};
  return Status();
}

Grads grad_max_pool(Builder& b, const Node& n, OutGrads g) {
  if (!g[0]) return no_grads(n);
  const ValueId dx = b.op1(OpKind::max_pool_grad, {n.inputs[0], *g[0]}, n.attrs);
  return std::vector<std::optional<ValueId>>{dx};
}

Status eval_max_pool(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const MaxPoolShape s, geometry(n, in[0]->type));
  kernels::ref::max_pool_forward<double>(s, in[0]->data.data(), out[0].data.data());
  return Status();
}

Status eval_max_pool_grad(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const MaxPoolShape s, geometry(n, in[0]->type));
  kernels::ref::max_pool_backward<double>(s, in[0]->data.data(), in[1]->data.data(), out[0].data.data());
  return Status();
}

using kernels::narrow_from_f32;
using kernels::op_scratch_of;
using kernels::widen_to_f32;
Status no_scratch() { return Status::error(Code::kOutOfRange, "max pool scratch", "memory", "none left"); }

Prepared prepare_max_pool(const Node& n, Types in, Types) {
  const DType t = in[0].dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16) return no_fast_kernel();
  ASPEN_ASSIGN_OR_RETURN(const MaxPoolShape s, geometry(n, in[0]));
  const int64_t X = s.N * s.C * s.H * s.W, Y = s.N * s.C * s.OH * s.OW;
  const bool wide = t != DType::f32;
  if (n.op == OpKind::max_pool)
    return make_kernel([s, t, wide, X, Y](In i, Out o) {
      if (!wide) return kernels::max_pool_forward(s, f32_in(i, 0), static_cast<float*>(o[0]));
      float *xw = op_scratch_of<float>(0, X), *yw = op_scratch_of<float>(1, Y);
      if (!xw || !yw) return no_scratch();
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[0], xw, X));
      ASPEN_RETURN_IF_ERROR(kernels::max_pool_forward(s, xw, yw));
      return narrow_from_f32(t, yw, o[0], Y);
    });
  return make_kernel([s, t, wide, X, Y](In i, Out o) {
    if (!wide) return kernels::max_pool_backward(s, f32_in(i, 0), f32_in(i, 1), static_cast<float*>(o[0]));
    float *xw = op_scratch_of<float>(0, X), *dyw = op_scratch_of<float>(1, Y), *dxw = op_scratch_of<float>(2, X);
    if (!xw || !dyw || !dxw) return no_scratch();
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[0], xw, X));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[1], dyw, Y));
    ASPEN_RETURN_IF_ERROR(kernels::max_pool_backward(s, xw, dyw, dxw));
    return narrow_from_f32(t, dxw, o[0], X);
  });
}

// Odd shapes: overlapping windows, padding on one side, dilation, a ceil-mode end, a window wider than the
// stride; ties (inputs on a coarse grid) and every dtype.
void pool_samples(SampleList& s, bool grad) {
  struct Case {
    Shape x;
    std::vector<int64_t> k, st, dil, pb, pe;
    DType t;
    double quantum;
  };
  for (const Case& c : {Case{Shape{2, 3, 6, 6}, {2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0}, DType::f32, 0.0},
                        Case{Shape{1, 2, 7, 5}, {3, 3}, {2, 1}, {1, 1}, {1, 0}, {1, 2}, DType::f32, 0.25},
                        Case{Shape{3, 1, 9, 8}, {2, 3}, {1, 2}, {2, 1}, {0, 1}, {1, 1}, DType::f32, 0.5},
                        Case{Shape{2, 17, 5, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, DType::f32, 0.0},
                        Case{Shape{2, 3, 6, 7}, {2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 1}, DType::bf16, 0.25},
                        Case{Shape{1, 4, 5, 6}, {3, 2}, {2, 2}, {1, 1}, {1, 0}, {0, 0}, DType::f16, 0.0}}) {
    const Attrs attrs = {{"kernel", c.k}, {"strides", c.st}, {"dilations", c.dil}, {"pads_begin", c.pb},
                         {"pads_end", c.pe}};
    OpSample& o = s.add(std::string(dtype_name(c.t)) + " " + c.x.to_string() + " kernel " + dims_string(c.k) +
                            " strides " + dims_string(c.st),
                        [&](Builder& b) {
                          const ValueId x = b.input("x", c.t, c.x);
                          const ValueId y = b.op1(OpKind::max_pool, {x}, attrs);
                          if (grad) b.op1(OpKind::max_pool_grad, {x, b.input("dy", c.t, b.type(y).shape)}, attrs);
                        });
    o.feeds.quantum = c.quantum;
    if (c.t != DType::f32) o.tol = c.t == DType::bf16 ? 1e-2 : 2e-3;
  }
}
void samples_max_pool(SampleList& s) { pool_samples(s, false); }
void samples_max_pool_grad(SampleList& s) { pool_samples(s, true); }

const std::vector<AttrSpec> kPoolAttrs = {{"kernel", AttrKind::ints, true},
                                          {"strides", AttrKind::ints, true},
                                          {"dilations", AttrKind::ints, true},
                                          {"pads_begin", AttrKind::ints, true},
                                          {"pads_end", AttrKind::ints, true}};

}  // namespace

void register_pool_ops(OpTable& t) {
  t.define(OpKind::max_pool, {.min_inputs = 1,
                              .max_inputs = 1,
                              .attrs = kPoolAttrs,
                              .infer = infer_max_pool,
                              .grad = grad_max_pool,
                              .eval = eval_max_pool,
                              .prepare = prepare_max_pool,
                              .samples = samples_max_pool});
  t.define(OpKind::max_pool_grad, {.min_inputs = 2,
                                   .max_inputs = 2,
                                   .attrs = kPoolAttrs,
                                   .infer = infer_max_pool_grad,
                                   .eval = eval_max_pool_grad,
                                   .prepare = prepare_max_pool,
                                   .samples = samples_max_pool_grad});
}

}  // namespace aspen::graph
