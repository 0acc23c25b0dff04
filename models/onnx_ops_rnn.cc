// models/onnx_ops_rnn.cc: the ONNX importer's recurrent layers (LSTM, GRU, RNN), unrolled over the
// sequence (its length is static), in ops autodiff differentiates.
//
// NOTE [recurrent layers unrolled]: per direction, the input's part of every gate for every step is one
// matrix product, X [T·B, I] times Wᵀ plus both biases; each step then adds H_{t-1} Rᵀ and applies the
// gate equations of the ONNX definitions (LSTM: gates i, o, f, c in W's order, optional peepholes;
// GRU: z, r, h with linear_before_reset either way; RNN: one gate), with the activations the node names
// (Sigmoid, Tanh, Relu; the defaults), clip, both directions and the layouts. The steps' H become Y. A
// sequence_lens input other than every row at full length is refused by name (torch's exporter writes
// none); so is LSTM's input_forget.
#include <string>
#include <vector>

#include "models/onnx_import.h"
#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

namespace {

enum class Cell { lstm, gru, rnn };

Result<std::vector<std::string>> activations(Ctx& c, Cell cell, int dirs) {
  std::vector<std::string> def = cell == Cell::lstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                 : cell == Cell::gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                     : std::vector<std::string>{"Tanh"};
  const size_t per = def.size();
  std::vector<std::string> out;
  if (const io::OnnxAttribute* a = c.node.find("activations")) {
    out = a->strings;
    if (out.size() != per * size_t(dirs))
      return c.error("attribute 'activations'", std::to_string(per * size_t(dirs)) + " names (per direction)",
                     std::to_string(out.size()));
  } else {
    for (int d = 0; d < dirs; ++d) out.insert(out.end(), def.begin(), def.end());
  }
  for (const std::string& f : out)
    if (f != "Sigmoid" && f != "Tanh" && f != "Relu")
      return c.unsupported("attribute 'activations'", "Sigmoid, Tanh or Relu", "'" + f + "'");
  if (c.has("activation_alpha") || c.has("activation_beta"))
    return c.unsupported("attributes 'activation_alpha' / 'activation_beta'", "none (Sigmoid, Tanh, Relu)", "given");
  return out;
}

ValueId apply(Ctx& c, const std::string& f, ValueId x) {
  if (f == "Sigmoid") return c.b.op1(OpKind::sigmoid, {x});
  if (f == "Tanh") return c.b.tanh(x);
  return c.b.op1(OpKind::relu, {x});
}

Status convert_recurrent(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, Cell cell) {
  const int G = cell == Cell::lstm ? 4 : cell == Cell::gru ? 3 : 1;
  const TensorType xt = in[0].type;
  if (!is_float(xt.dtype))
    return c.error("input 'X'", "a float tensor", xt.to_string());
  ASPEN_RETURN_IF_ERROR(same_dtype(c, {in[0], in[1], in[2]}));
  ASPEN_ASSIGN_OR_RETURN(const int64_t H, c.attr_i("hidden_size"));
  ASPEN_ASSIGN_OR_RETURN(const std::string direction, c.attr_s("direction", std::string("forward")));
  ASPEN_ASSIGN_OR_RETURN(const int64_t layout, c.attr_i("layout", 0));
  ASPEN_ASSIGN_OR_RETURN(const float clip, c.attr_f("clip", 0.0f));
  int64_t linear_before_reset = 0, input_forget = 0;
  if (cell == Cell::gru) {
    ASPEN_ASSIGN_OR_RETURN(linear_before_reset, c.attr_i("linear_before_reset", 0));
  }
  if (cell == Cell::lstm) {
    ASPEN_ASSIGN_OR_RETURN(input_forget, c.attr_i("input_forget", 0));
  }
  if (input_forget) return c.unsupported("attribute 'input_forget'", "0", std::to_string(input_forget));
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return c.error("attribute 'direction'", "forward, reverse or bidirectional", "'" + direction + "'");
  const int dirs = direction == "bidirectional" ? 2 : 1;
  ASPEN_ASSIGN_OR_RETURN(const std::vector<std::string> acts, activations(c, cell, dirs));
  if (xt.shape.rank() != 3) return c.error("input 'X'", "rank 3", xt.to_string());
  const int64_t T = layout ? xt.shape[1] : xt.shape[0], B = layout ? xt.shape[0] : xt.shape[1], I = xt.shape[2];
  const DType dt = xt.dtype;
  auto expect = [&](size_t k, const char* name, std::vector<int64_t> d) -> Status {
    if (k >= in.size() || !in[k].present()) return Status();
    if (in[k].type.shape != shape_of(d))
      return c.error(std::string("input '") + name + "'", TensorType{in[k].type.dtype, shape_of(d)}.to_string(),
                     in[k].type.to_string());
    return Status();
  };
  ASPEN_RETURN_IF_ERROR(expect(1, "W", {dirs, G * H, I}));
  ASPEN_RETURN_IF_ERROR(expect(2, "R", {dirs, G * H, H}));
  ASPEN_RETURN_IF_ERROR(expect(3, "B", {dirs, 2 * G * H}));
  ASPEN_RETURN_IF_ERROR(expect(5, "initial_h", layout ? std::vector<int64_t>{B, dirs, H} : std::vector<int64_t>{dirs, B, H}));
  if (cell == Cell::lstm) {
    ASPEN_RETURN_IF_ERROR(expect(6, "initial_c", layout ? std::vector<int64_t>{B, dirs, H} : std::vector<int64_t>{dirs, B, H}));
    ASPEN_RETURN_IF_ERROR(expect(7, "P", {dirs, 3 * H}));
  }
  if (in.size() > 4 && in[4].present()) {  // sequence_lens: every row at full length, or refused
    if (!in[4].readable())
      return c.unsupported("input 'sequence_lens'", "a value known when the model is imported",
                           "one computed from the graph's inputs");
    ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> lens, c.ints(in[4], "input 'sequence_lens'"));
    for (int64_t l : lens)
      if (l != T)
        return c.unsupported("input 'sequence_lens'", "every row at the full length " + std::to_string(T),
                             "a row of " + std::to_string(l));
  }
  // X as [T, B, I]; states as [dirs, B, H].
  ValueId x = c.id(in[0]);
  if (layout) x = c.b.transpose(x, {1, 0, 2});
  auto state = [&](size_t k) -> ValueId {
    if (k < in.size() && in[k].present()) {
      ValueId s = c.id(in[k]);
      return layout ? c.b.transpose(s, {1, 0, 2}) : s;
    }
    return c.id(filled(c, 0.0, dt, Shape{dirs, B, H}));
  };
  const ValueId h0 = state(5), c0 = cell == Cell::lstm ? state(6) : h0;
  const bool has_bias = in.size() > 3 && in[3].present();
  const bool peep = cell == Cell::lstm && in.size() > 7 && in[7].present();
  // NOTE [one op per LSTM]: an LSTM with ONNX's default activations, no peepholes and no clip (what torch and
  // Keras export) runs its steps as one `lstm` op per direction (graph/ops_lstm.cc, kernels/lstm.h), not
  // ~10 ops per step: 2 bidirectional layers of 32 steps were ~7,000 ops a training step, most of its time.
  // The input's product stays a matmul; everything else (other activations, peepholes, clip, GRU, RNN) is
  // unrolled as below.
  bool fused = cell == Cell::lstm && !peep && !(clip > 0.0f) && T >= 1;
  for (size_t k = 0; k < acts.size(); ++k) fused = fused && acts[k] == (k % 3 == 0 ? "Sigmoid" : "Tanh");
  std::vector<ValueId> ys, hs, cs;  // per direction: Y [T, B, H], final h, final c
  for (int d = 0; d < dirs; ++d) {
    const bool rev = direction == "reverse" || d == 1;
    const ValueId w = c.b.reshape(c.b.slice(c.id(in[1]), 0, d, d + 1), {G * H, I});
    const ValueId r = c.b.reshape(c.b.slice(c.id(in[2]), 0, d, d + 1), {G * H, H});
    std::optional<ValueId> wb, rb;
    if (has_bias) {
      const ValueId bd = c.b.reshape(c.b.slice(c.id(in[3]), 0, d, d + 1), {2 * G * H});
      wb = c.b.slice(bd, 0, 0, G * H);
      rb = c.b.slice(bd, 0, G * H, 2 * G * H);
    }
    // The input's part of every gate of every step, one product: [T·B, G·H].
    ValueId xw = c.b.matmul(c.b.reshape(x, {T * B, I}), w, false, true);
    // GRU with linear_before_reset keeps R's bias of the h gate inside r (.); the other biases join X W.
    if (has_bias) {
      ValueId bias = *wb;
      if (!(cell == Cell::gru && linear_before_reset)) bias = c.b.add(bias, *rb);
      else bias = c.b.add(bias, c.b.concat({c.b.slice(*rb, 0, 0, 2 * H), c.id(filled(c, 0.0, dt, Shape{H}))}, 0));
      xw = c.b.add(xw, c.b.broadcast(bias, {T * B, G * H}));
    }
    xw = c.b.reshape(xw, {T, B, G * H});
    const std::string* f = &acts[size_t(d) * (cell == Cell::lstm ? 3 : cell == Cell::gru ? 2 : 1)];
    ValueId h = c.b.reshape(c.b.slice(h0, 0, d, d + 1), {B, H});
    ValueId cc = c.b.reshape(c.b.slice(c0, 0, d, d + 1), {B, H});
    if (fused) {  // NOTE [one op per LSTM]
      const std::vector<ValueId> lo = c.b.op(OpKind::lstm, {xw, r, h, cc}, {{"reverse", int64_t(rev)}});
      if (lo.size() != 3) return c.b.status();
      const int64_t last = rev ? 0 : T - 1;
      ys.push_back(lo[0]);
      hs.push_back(c.b.slice(lo[0], 0, last, last + 1));
      cs.push_back(c.b.slice(lo[1], 0, last, last + 1));
      continue;
    }
    std::vector<std::optional<ValueId>> p(3);
    if (peep) {
      const ValueId pd = c.b.reshape(c.b.slice(c.id(in[7]), 0, d, d + 1), {3 * H});
      for (int k = 0; k < 3; ++k) p[size_t(k)] = c.b.broadcast(c.b.slice(pd, 0, k * H, (k + 1) * H), {B, H});
    }
    auto clipped = [&](ValueId v) {
      if (!(clip > 0.0f)) return v;
      v = c.b.op1(OpKind::min, {v, c.id(filled(c, clip, dt, Shape{B, H}))});
      return c.b.op1(OpKind::max, {v, c.id(filled(c, -clip, dt, Shape{B, H}))});
    };
    std::vector<ValueId> steps(static_cast<size_t>(T));
    for (int64_t s = 0; s < T; ++s) {
      const int64_t t = rev ? T - 1 - s : s;
      const ValueId xt_g = c.b.reshape(c.b.slice(xw, 0, t, t + 1), {B, G * H});
      const ValueId hr = c.b.matmul(h, r, false, true);  // [B, G·H]
      auto gate = [&](ValueId m, int k) { return c.b.slice(m, 1, k * H, (k + 1) * H); };
      if (cell == Cell::lstm) {
        const ValueId z = c.b.add(xt_g, hr);
        ValueId gi = gate(z, 0), go = gate(z, 1), gf = gate(z, 2), gc = gate(z, 3);
        if (peep) {
          gi = c.b.add(gi, c.b.mul(*p[0], cc));
          gf = c.b.add(gf, c.b.mul(*p[2], cc));
        }
        const ValueId i_t = apply(c, f[0], clipped(gi)), f_t = apply(c, f[0], clipped(gf));
        const ValueId c_hat = apply(c, f[1], clipped(gc));
        cc = c.b.add(c.b.mul(f_t, cc), c.b.mul(i_t, c_hat));
        if (peep) go = c.b.add(go, c.b.mul(*p[1], cc));
        const ValueId o_t = apply(c, f[0], clipped(go));
        h = c.b.mul(o_t, apply(c, f[2], cc));
      } else if (cell == Cell::gru) {
        const ValueId zr = c.b.add(c.b.slice(xt_g, 1, 0, 2 * H), c.b.slice(hr, 1, 0, 2 * H));
        const ValueId z_t = apply(c, f[0], clipped(gate(zr, 0))), r_t = apply(c, f[0], clipped(gate(zr, 1)));
        ValueId hh;
        if (linear_before_reset) {
          ValueId hrh = gate(hr, 2);
          if (has_bias) hrh = c.b.add(hrh, c.b.broadcast(c.b.slice(*rb, 0, 2 * H, 3 * H), {B, H}));
          hh = c.b.add(gate(xt_g, 2), c.b.mul(r_t, hrh));
        } else {
          const ValueId rh = c.b.mul(r_t, h);
          const ValueId rr = c.b.reshape(c.b.slice(r, 0, 2 * H, 3 * H), {H, H});
          hh = c.b.add(gate(xt_g, 2), c.b.matmul(rh, rr, false, true));
        }
        const ValueId h_hat = apply(c, f[1], clipped(hh));
        const ValueId one = c.id(filled(c, 1.0, dt, Shape{B, H}));
        h = c.b.add(c.b.mul(c.b.sub(one, z_t), h_hat), c.b.mul(z_t, h));
      } else {
        h = apply(c, f[0], clipped(c.b.add(xt_g, hr)));
      }
      steps[size_t(t)] = c.b.reshape(h, {1, B, H});
    }
    ys.push_back(T > 0 ? c.b.concat(steps, 0) : c.id(filled(c, 0.0, dt, Shape{0, B, H})));
    hs.push_back(c.b.reshape(h, {1, B, H}));
    cs.push_back(c.b.reshape(cc, {1, B, H}));
  }
  // Y [T, dirs, B, H] (layout 1: [B, T, dirs, H]); Y_h, Y_c [dirs, B, H] (layout 1: [B, dirs, H]).
  std::vector<ValueId> y4;
  for (ValueId y : ys) y4.push_back(c.b.reshape(y, {T, 1, B, H}));
  ValueId y = dirs == 1 ? y4[0] : c.b.concat(y4, 1);
  ValueId yh = dirs == 1 ? hs[0] : c.b.concat(hs, 0), yc = dirs == 1 ? cs[0] : c.b.concat(cs, 0);
  if (layout) {
    y = c.b.transpose(y, {2, 0, 1, 3});
    yh = c.b.transpose(yh, {1, 0, 2});
    yc = c.b.transpose(yc, {1, 0, 2});
  }
  out = {c.wrap(y), c.wrap(yh)};
  if (cell == Cell::lstm) out.push_back(c.wrap(yc));
  return c.b.status();
}

}  // namespace

void add_rnn_converters(ConverterTable& t) {
  add_converter(t, "LSTM", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_recurrent(c, in, out, Cell::lstm);
  }, 3, 8);
  add_converter(t, "GRU", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_recurrent(c, in, out, Cell::gru);
  }, 3, 6);
  add_converter(t, "RNN", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_recurrent(c, in, out, Cell::rnn);
  }, 3, 6);
}

}  // namespace aspen::models::onnx
