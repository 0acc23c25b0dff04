// graph/ops_lstm.cc: the LSTM recurrence as one op each way, the graph form of kernels/lstm.h.
//
//   lstm(xw, r, h0, c0) {reverse} -> y, c, gates
//       xw [T, B, 4H] float (the input's part of the gates, both biases added; ONNX's gate order i, o, f, c),
//       r [4H, H], h0 and c0 [B, H], all of xw's dtype; T >= 1. y and c [T, B, H] hold every step's h and c
//       (in time order: reverse runs t = T-1 .. 0), gates [T, B, 4H] the activated gates the backward reads.
//   lstm_grad(dy, r, c0, c, gates[, dc]) {reverse} -> dxw [T, B, 4H], dh0, dc0 [B, H]
//
// Gradient: (dxw, dh0, dc0) = lstm_grad(g_y or zeros, r, c0, c, gates[, g_c]); dr = dxwᵀ h_{t-1}, one
// matmul over all steps of dxw [T·B, 4H] and the steps' previous h (h0, then y shifted by one step); none
// through gates (it only feeds the backward). lstm_grad is not differentiated again.
// Fast kernels: f32, and bf16 / f16 through widened copies (the outputs rounded once).
// The ONNX importer's LSTM uses it for the default activations without peepholes or clip (NOTE [recurrent
// layers unrolled], models/onnx_ops_rnn.cc); other cells stay unrolled into ops.
#include <cmath>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/convert.h"
#include "kernels/lstm.h"
#include "kernels/scratch.h"

namespace aspen::graph {

namespace {
using namespace nnutil;
using kernels::LstmShape;

Result<LstmShape> shape_of(const Node& n, const TensorType& xw) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "xw", xw));
  if (xw.shape.rank() != 3 || xw.shape[2] % 4 != 0 || xw.shape[0] < 1 || xw.shape[1] < 1 || xw.shape[2] < 4)
    return rule_error(n, "xw", "[T, B, 4H] with T, B, H >= 1", xw.to_string());
  ASPEN_ASSIGN_OR_RETURN(const bool rev, flag(n, "reverse"));
  return LstmShape{xw.shape[0], xw.shape[1], xw.shape[2] / 4, rev};
}

TensorType of(DType t, std::initializer_list<int64_t> d) { return TensorType{t, Shape(d)}; }

Status infer_lstm(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const LstmShape s, shape_of(n, in[0]));
  const DType t = in[0].dtype;
  ASPEN_RETURN_IF_ERROR(expect_type(n, "r", in[1], of(t, {4 * s.H, s.H}), "[4H, H] of xw's dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "h0", in[2], of(t, {s.B, s.H}), "[B, H] of xw's dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "c0", in[3], of(t, {s.B, s.H}), "[B, H] of xw's dtype"));
  const TensorType seq = of(t, {s.T, s.B, s.H});
  out = {seq, seq, in[0]};
  return Status();
}

// dy, r, c0, c, gates[, dc]: gates carries T, B, H.
Status infer_lstm_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const LstmShape s, shape_of(n, in[4]));
  const DType t = in[4].dtype;
  const TensorType seq = of(t, {s.T, s.B, s.H}), row = of(t, {s.B, s.H});
  ASPEN_RETURN_IF_ERROR(expect_type(n, "dy", in[0], seq, "[T, B, H] of the gates' dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "r", in[1], of(t, {4 * s.H, s.H}), "[4H, H] of the gates' dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "c0", in[2], row, "[B, H] of the gates' dtype"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "c", in[3], seq, "the forward's c"));
  if (in.size() > 5) ASPEN_RETURN_IF_ERROR(expect_type(n, "dc", in[5], seq, "[T, B, H] of the gates' dtype"));
  out = {in[4], row, row};
  return Status();
}

Grads grad_lstm(Builder& b, const Node& n, OutGrads g) {
  if (g[2])
    return Status::error(Code::kUnimplemented, "lstm: gradient of output 2 (gates)",
                         "none (the gates only feed the backward)", "one");
  if (!g[0] && !g[1]) return no_grads(n);
  const TensorType xt = b.graph().type(n.inputs[0]);
  const int64_t T = xt.shape[0], B = xt.shape[1], G = xt.shape[2], H = G / 4;
  const int64_t rev = n.attrs.i_or("reverse", 0);
  const ValueId y = n.outputs[0];
  const ValueId dy = g[0] ? *g[0] : b.broadcast(b.scalar(0.0f, xt.dtype), {T, B, H});
  std::vector<ValueId> ins = {dy, n.inputs[1], n.inputs[3], n.outputs[1], n.outputs[2]};
  if (g[1]) ins.push_back(*g[1]);
  const std::vector<ValueId> d = b.op(OpKind::lstm_grad, std::move(ins), {{"reverse", rev}});
  if (d.size() != 3) return no_grads(n);  // the builder's status holds the error
  // Each step's previous h: h0 for the first step processed, then y one step back.
  const ValueId h0 = b.reshape(n.inputs[2], {1, B, H});
  ValueId hprev = h0;
  if (T > 1) hprev = rev ? b.concat({b.slice(y, 0, 1, T), h0}, 0) : b.concat({h0, b.slice(y, 0, 0, T - 1)}, 0);
  const ValueId dr = b.matmul(b.reshape(d[0], {T * B, G}), b.reshape(hprev, {T * B, H}), true, false);
  return std::vector<std::optional<ValueId>>{d[0], dr, d[1], d[2]};
}

Status eval_lstm(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const LstmShape s, shape_of(n, in[0]->type));
  kernels::ref::lstm_forward<double>(s, in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                     in[3]->data.data(), out[0].data.data(), out[1].data.data(), out[2].data.data());
  return Status();
}

Status eval_lstm_grad(const Node& n, Ins in, Outs out) {
  ASPEN_ASSIGN_OR_RETURN(const LstmShape s, shape_of(n, in[4]->type));
  kernels::ref::lstm_backward<double>(s, in[0]->data.data(), in.size() > 5 ? in[5]->data.data() : nullptr,
                                      in[1]->data.data(), in[2]->data.data(), in[3]->data.data(), in[4]->data.data(),
                                      out[0].data.data(), out[1].data.data(), out[2].data.data());
  return Status();
}

// bf16 and f16 run the f32 kernels on widened copies, carved from one scratch slot (kernels/scratch.h), the
// outputs rounded once.
using kernels::narrow_from_f32;
using kernels::widen_to_f32;
Status no_scratch() { return Status::error(Code::kOutOfRange, "lstm scratch", "memory", "none left"); }

// Consecutive f32 buffers of the given sizes in slot 0, each 64-byte aligned; empty when none is left.
std::vector<float*> carve(std::initializer_list<int64_t> sizes) {
  int64_t total = 0;
  for (int64_t n : sizes) total += (n + 15) / 16 * 16;
  float* p = kernels::op_scratch_of<float>(0, total);
  std::vector<float*> out;
  if (!p) return out;
  for (int64_t n : sizes) out.push_back(p), p += (n + 15) / 16 * 16;
  return out;
}

Prepared prepare_lstm(const Node& n, Types in, Types) {
  const TensorType& x = n.op == OpKind::lstm ? in[0] : in[4];
  const DType t = x.dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16) return no_fast_kernel();
  ASPEN_ASSIGN_OR_RETURN(const LstmShape s, shape_of(n, x));
  const int64_t SG = s.T * s.B * 4 * s.H, SH = s.T * s.B * s.H, RH = 4 * s.H * s.H, BH = s.B * s.H;
  const bool wide = t != DType::f32;
  if (n.op == OpKind::lstm) {
    return make_kernel([s, t, wide, SG, SH, RH, BH](In i, Out o) {
      if (!wide) {
        float* work = kernels::op_scratch_of<float>(0, RH);
        if (!work) return no_scratch();
        return kernels::lstm_forward(s, f32_in(i, 0), f32_in(i, 1), f32_in(i, 2), f32_in(i, 3),
                                     static_cast<float*>(o[0]), static_cast<float*>(o[1]),
                                     static_cast<float*>(o[2]), work);
      }
      const std::vector<float*> w = carve({SG, RH, BH, BH, SH, SH, SG, RH});
      if (w.empty()) return no_scratch();
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[0], w[0], SG));
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[1], w[1], RH));
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[2], w[2], BH));
      ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[3], w[3], BH));
      ASPEN_RETURN_IF_ERROR(kernels::lstm_forward(s, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]));
      ASPEN_RETURN_IF_ERROR(narrow_from_f32(t, w[4], o[0], SH));
      ASPEN_RETURN_IF_ERROR(narrow_from_f32(t, w[5], o[1], SH));
      return narrow_from_f32(t, w[6], o[2], SG);
    });
  }
  const bool has_dc = in.size() > 5;
  return make_kernel([s, t, wide, has_dc, SG, SH, RH, BH](In i, Out o) {
    if (!wide)
      return kernels::lstm_backward(s, f32_in(i, 0), has_dc ? f32_in(i, 5) : nullptr, f32_in(i, 1), f32_in(i, 2),
                                    f32_in(i, 3), f32_in(i, 4), static_cast<float*>(o[0]),
                                    static_cast<float*>(o[1]), static_cast<float*>(o[2]));
    // dy, r, c0, c, gates, dc; dxw, dh0, dc0
    const std::vector<float*> w = carve({SH, RH, BH, SH, SG, has_dc ? SH : 0, SG, BH, BH});
    if (w.empty()) return no_scratch();
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[0], w[0], SH));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[1], w[1], RH));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[2], w[2], BH));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[3], w[3], SH));
    ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[4], w[4], SG));
    if (has_dc) ASPEN_RETURN_IF_ERROR(widen_to_f32(t, i[5], w[5], SH));
    ASPEN_RETURN_IF_ERROR(kernels::lstm_backward(s, w[0], has_dc ? w[5] : nullptr, w[1], w[2], w[3], w[4], w[6],
                                                 w[7], w[8]));
    ASPEN_RETURN_IF_ERROR(narrow_from_f32(t, w[6], o[0], SG));
    ASPEN_RETURN_IF_ERROR(narrow_from_f32(t, w[7], o[1], BH));
    return narrow_from_f32(t, w[8], o[2], BH);
  });
}

// Odd shapes (one step, one unit, a ragged row chunk, H past a vector), both directions, f32, bf16 and f16;
// the backward's samples run the forward first for its c and gates, with and without dc.
void lstm_samples(SampleList& s, bool grad) {
  struct Case {
    int64_t T, B, H;
    bool rev, dc;
    DType t;
  };
  for (const Case& c : {Case{1, 1, 1, false, false, DType::f32}, Case{3, 5, 7, false, true, DType::f32},
                        Case{4, 3, 17, true, false, DType::f32}, Case{2, 9, 33, true, true, DType::f32},
                        Case{3, 2, 5, false, true, DType::bf16}, Case{3, 2, 6, true, false, DType::f16}}) {
    const std::string label = std::string(dtype_name(c.t)) + " T=" + std::to_string(c.T) + " B=" +
                              std::to_string(c.B) + " H=" + std::to_string(c.H) + (c.rev ? " reverse" : "") +
                              (grad && c.dc ? " dc" : "");
    OpSample& o = s.add(label, [&](Builder& b) {
      const ValueId xw = b.input("xw", c.t, Shape{c.T, c.B, 4 * c.H});
      const ValueId r = b.input("r", c.t, Shape{4 * c.H, c.H});
      const ValueId h0 = b.input("h0", c.t, Shape{c.B, c.H}), c0 = b.input("c0", c.t, Shape{c.B, c.H});
      std::vector<ValueId> f = b.op(OpKind::lstm, {xw, r, h0, c0}, {{"reverse", int64_t(c.rev)}});
      if (grad && f.size() == 3) {
        std::vector<ValueId> ins = {b.input("dy", c.t, Shape{c.T, c.B, c.H}), r, c0, f[1], f[2]};
        if (c.dc) ins.push_back(b.input("dc", c.t, Shape{c.T, c.B, c.H}));
        b.op(OpKind::lstm_grad, std::move(ins), {{"reverse", int64_t(c.rev)}});
      }
    });
    if (c.t != DType::f32) o.tol = c.t == DType::bf16 ? 2e-2 : 3e-3;
  }
}
void samples_lstm(SampleList& s) { lstm_samples(s, false); }
void samples_lstm_grad(SampleList& s) { lstm_samples(s, true); }

}  // namespace

void register_lstm_ops(OpTable& t) {
  t.define(OpKind::lstm, {.min_inputs = 4,
                          .max_inputs = 4,
                          .attrs = {{"reverse", AttrKind::i64, false}},
                          .infer = infer_lstm,
                          .grad = grad_lstm,
                          .eval = eval_lstm,
                          .prepare = prepare_lstm,
                          .samples = samples_lstm});
  t.define(OpKind::lstm_grad, {.min_inputs = 5,
                               .max_inputs = 6,
                               .attrs = {{"reverse", AttrKind::i64, false}},
                               .infer = infer_lstm_grad,
                               .eval = eval_lstm_grad,
                               .prepare = prepare_lstm,
                               .samples = samples_lstm_grad});
}

}  // namespace aspen::graph
