// models/onnx_ops_conv.cc: the ONNX importer's convolutions and pooling (Conv, ConvTranspose, MaxPool,
// AveragePool, GlobalMaxPool), 1-D, 2-D and 3-D.
//
// Conv is the IR's `conv` (graph/ops_conv.cc: oneDNN's primitives, forward and both backward passes), with
// auto_pad resolved into explicit pads here. ConvTranspose is the transpose of a convolution, the IR's
// `conv_grad_input`, whenever that convolution's output is exactly X (pads >= 0, output_padding below the
// stride: every exporter's case); the rest, and the pools, are gathers:
//
// NOTE [convolution as a gather]: a window's input positions are known at import (shapes are static), so
// the importer writes the patch matrix (im2col) as one `gather`: the input moved channels-last, [N, D...,
// C], is a table of N·ΠD rows of C values plus one padding row (zeros for Conv and AveragePool, -inf for
// MaxPool), and a constant index tensor [N, ΠO, ΠK] names, for every output position and kernel offset,
// the row it reads (the padding row outside the input; strides, dilations, every auto_pad and ceil_mode are
// only index arithmetic). Then
//   ConvTranspose: the patches [N·ΠO, ΠK·C] times the weight moved to [ΠK·C, M] (per group a batched
//         product), plus the bias;
//   MaxPool: reduce_max over the window; AveragePool: reduce_sum over it / the count ONNX divides by.
// The backward pass comes from autodiff: the gather's gradient is the ordered scatter-add of the patches'
// gradients (col2im), reduce_max's goes to the window's maximum. Correct by construction and bit-stable, but
// the index tensor and the patch matrix cost memory ΠK times the input (kMaxWindowIndices bounds it). A 2-D
// MaxPool without Indices is one op instead (NOTE [max pool as one op]).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "models/onnx_import.h"
#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

namespace {

// The largest index tensor a convolution or pool may make (entries of [N, ΠO, ΠK]).
constexpr int64_t kMaxWindowIndices = int64_t(1) << 28;

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(1), std::multiplies<int64_t>());
}

// A window op's geometry over the k spatial axes of x [N, C, D...].
struct Window {
  int64_t N = 0, C = 0;
  std::vector<int64_t> D, K, S, Dil, PadBegin, PadEnd, O;
};

// Reads kernel_shape (or `kernel` from the weight), strides, dilations, pads, auto_pad and ceil_mode.
Result<Window> window_of(Ctx& c, const TensorType& x, std::vector<int64_t> kernel, bool ceil_allowed) {
  Window w;
  const int r = x.shape.rank();
  if (r < 3 || r > 5)
    return c.unsupported("input 'X'", "[N, C, D...] with 1 to 3 spatial axes", x.to_string());
  const size_t k = size_t(r - 2);
  w.N = x.shape[0];
  w.C = x.shape[1];
  for (int i = 2; i < r; ++i) w.D.push_back(x.shape[i]);
  if (c.has("kernel_shape")) {
    ASPEN_ASSIGN_OR_RETURN(kernel, c.attr_ints("kernel_shape"));
  }
  if (kernel.size() != k)
    return c.error("attribute 'kernel_shape'", std::to_string(k) + " extents (the input's spatial axes)", dims_string(kernel));
  w.K = kernel;
  ASPEN_ASSIGN_OR_RETURN(w.S, c.attr_ints("strides", std::vector<int64_t>(k, 1)));
  ASPEN_ASSIGN_OR_RETURN(w.Dil, c.attr_ints("dilations", std::vector<int64_t>(k, 1)));
  ASPEN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, c.attr_ints("pads", std::vector<int64_t>(2 * k, 0)));
  ASPEN_ASSIGN_OR_RETURN(const std::string auto_pad, c.attr_s("auto_pad", std::string("NOTSET")));
  int64_t ceil_mode = 0;
  if (ceil_allowed) {
    ASPEN_ASSIGN_OR_RETURN(ceil_mode, c.attr_i("ceil_mode", 0));
  }
  if (w.S.size() != k) return c.error("attribute 'strides'", std::to_string(k) + " values", dims_string(w.S));
  if (w.Dil.size() != k) return c.error("attribute 'dilations'", std::to_string(k) + " values", dims_string(w.Dil));
  if (pads.size() != 2 * k) return c.error("attribute 'pads'", std::to_string(2 * k) + " values", dims_string(pads));
  for (size_t i = 0; i < k; ++i) {
    if (w.K[i] < 1 || w.S[i] < 1 || w.Dil[i] < 1)
      return c.error("kernel_shape, strides and dilations", "values >= 1",
                     dims_string(w.K) + ", " + dims_string(w.S) + ", " + dims_string(w.Dil));
    if (pads[i] < 0 || pads[i + k] < 0) return c.unsupported("attribute 'pads'", "values >= 0", dims_string(pads));
  }
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER")
    return c.error("attribute 'auto_pad'", "NOTSET, VALID, SAME_UPPER or SAME_LOWER", "'" + auto_pad + "'");
  for (size_t i = 0; i < k; ++i) {
    const int64_t span = (w.K[i] - 1) * w.Dil[i] + 1;  // the window's extent on the input
    int64_t pb = pads[i], pe = pads[i + k], o = 0;
    if (auto_pad == "VALID") pb = pe = 0;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      o = (w.D[i] + w.S[i] - 1) / w.S[i];
      const int64_t total = std::max<int64_t>(0, (o - 1) * w.S[i] + span - w.D[i]);
      pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      const int64_t room = w.D[i] + pb + pe - span;
      if (room < 0)
        return c.error("input 'X'", "spatial extents at least the window's " + dims_string(w.K) + " (dilated, after padding)",
                       x.to_string());
      o = (ceil_mode ? (room + w.S[i] - 1) / w.S[i] : room / w.S[i]) + 1;
      if (ceil_mode && (o - 1) * w.S[i] >= w.D[i] + pb) --o;  // a last window starting in the end padding is left out
    }
    w.PadBegin.push_back(pb);
    w.PadEnd.push_back(pe);
    w.O.push_back(o);
  }
  return w;
}

// The gathered patches' index tensor [N, ΠO, ΠK] must stay within kMaxWindowIndices.
Status check_gather_size(Ctx& c, const Window& w, const TensorType& x) {
  if (w.N * product(w.O) * product(w.K) <= kMaxWindowIndices) return Status();
  return c.unsupported("input 'X'",
                       "at most 2^28 window positions (N x outputs x kernel) for the gathered patches "
                       "(NOTE [convolution as a gather])",
                       x.to_string() + " with kernel " + dims_string(w.K));
}

// The IR's conv family's attributes for a window (graph/ops_conv.cc).
graph::Attrs conv_attrs(const Window& w, int64_t groups) {
  return {{"strides", w.S}, {"dilations", w.Dil}, {"pads_begin", w.PadBegin}, {"pads_end", w.PadEnd},
          {"groups", groups}};
}

// The row of the channels-last table each (n, output position, kernel offset) reads: [N, ΠO, ΠK], i32;
// `pad_row` outside the input. A window reads input o s - pad_begin + q d; with `transposed`
// (ConvTranspose) output o takes input i where o = i s - pad_begin + q d, when that i is a whole number.
// With `counts`, the number of window positions inside the input (or inside input and pads,
// `count_pads`) per output position.
Tensor window_rows(const Window& w, int64_t pad_row, bool transposed = false, std::vector<double>* counts = nullptr,
                   bool count_pads = false) {
  const size_t k = w.D.size();
  const int64_t pO = product(w.O), pK = product(w.K), pD = product(w.D);
  Tensor ids(DType::i32, Shape{w.N, pO, pK});
  int32_t* p = ids.data<int32_t>();
  if (counts) counts->assign(size_t(pO), 0.0);
  std::vector<int64_t> o(k, 0), q(k, 0);
  for (int64_t oi = 0; oi < pO; ++oi) {
    int64_t rest = oi;
    for (size_t j = k; j-- > 0;) o[j] = rest % w.O[j], rest /= w.O[j];
    for (int64_t qi = 0; qi < pK; ++qi) {
      int64_t r2 = qi;
      for (size_t j = k; j-- > 0;) q[j] = r2 % w.K[j], r2 /= w.K[j];
      int64_t flat = 0;
      bool inside = true, in_pads = true;
      for (size_t j = 0; j < k; ++j) {
        int64_t at = o[j] * w.S[j] - w.PadBegin[j] + q[j] * w.Dil[j];
        bool whole = true;
        if (transposed) {
          const int64_t num = o[j] + w.PadBegin[j] - q[j] * w.Dil[j];
          whole = num >= 0 && num % w.S[j] == 0;
          at = whole ? num / w.S[j] : -1;
        }
        inside = inside && whole && at >= 0 && at < w.D[j];
        in_pads = in_pads && at >= -w.PadBegin[j] && at < w.D[j] + w.PadEnd[j];
        flat = flat * w.D[j] + at;
      }
      if (counts) (*counts)[size_t(oi)] += (count_pads ? in_pads : inside) ? 1.0 : 0.0;
      for (int64_t n = 0; n < w.N; ++n)
        p[(n * pO + oi) * pK + qi] = int32_t(inside ? n * pD + flat : pad_row);
    }
  }
  return ids;
}

// x [N, C, D...] as the channels-last table [N·ΠD + 1, C], its last row `pad`; gathered by `ids`.
ValueId gather_windows(Ctx& c, const Value& x, const Window& w, double pad, Tensor ids) {
  const int r = x.type.shape.rank();
  std::vector<int64_t> perm = {0};
  for (int i = 2; i < r; ++i) perm.push_back(i);
  perm.push_back(1);
  const int64_t rows = w.N * product(w.D);
  ValueId table = c.b.reshape(c.b.transpose(c.id(x), perm), {rows, w.C});
  table = c.b.concat({table, c.id(filled(c, pad, x.type.dtype, Shape{1, w.C}))}, 0);
  return c.b.gather(table, c.b.constant(std::move(ids)));  // [N, ΠO, ΠK, C]
}

// [N·ΠO, M] (rows in output order) as [N, M, O...].
ValueId channels_first(Ctx& c, ValueId y, const Window& w, int64_t M) {
  std::vector<int64_t> d = {w.N};
  d.insert(d.end(), w.O.begin(), w.O.end());
  d.push_back(M);
  std::vector<int64_t> perm = {0, int64_t(d.size()) - 1};
  for (int64_t i = 1; i + 1 < int64_t(d.size()); ++i) perm.push_back(i);
  return c.b.transpose(c.b.reshape(y, d), perm);
}

// The patches [N, ΠO, ΠK, C] times the weight as [G, Mg, ΠK·Cg] (each output channel's taps, input channels
// last: reached from either weight layout by one batched 2-D transpose, cheaper than a full reversal on the
// large layers), with trans_b; per group a batched product. Plus the bias: [P = N·ΠO, M].
ValueId patches_times_weight(Ctx& c, ValueId col, const Window& w, int64_t G, int64_t Mg, ValueId weight,
                             const Value* bias) {
  const int64_t P = w.N * product(w.O), pK = product(w.K), Cg = w.C / G, M = G * Mg;
  ValueId y;
  if (G == 1) {
    const ValueId a = c.b.reshape(col, {P, pK * w.C}), b = c.b.reshape(weight, {M, pK * w.C});
    return bias ? c.b.op1(OpKind::matmul, {a, b, c.id(*bias)}, {{"trans_a", int64_t(0)}, {"trans_b", int64_t(1)}})
                : c.b.matmul(a, b, false, true);
  }
  if (Cg == 1 && Mg == 1) {  // depthwise: y[p, g] = Σ_k col[p, k, g] w[g, k]
    const ValueId wk = c.b.transpose(c.b.reshape(weight, {M, pK}), {1, 0});  // [ΠK, C]
    y = c.b.reduce_sum(c.b.mul(c.b.reshape(col, {P, pK, w.C}), c.b.broadcast(wk, {P, pK, w.C})), {1});
  } else {  // [P, ΠK, G, Cg] -> [G, P, ΠK·Cg], times [G, Mg, ΠK·Cg]ᵀ -> [G, P, Mg] -> [P, G, Mg]
    const ValueId a = c.b.reshape(c.b.transpose(c.b.reshape(col, {P, pK, G, Cg}), {2, 0, 1, 3}), {G, P, pK * Cg});
    y = c.b.reshape(c.b.transpose(c.b.matmul(a, weight, false, true), {1, 0, 2}), {P, M});
  }
  return bias ? c.b.add(y, c.b.broadcast(c.id(*bias), {P, M})) : y;
}

Status convert_conv(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const TensorType xt = in[0].type, wt = in[1].type;
  if (!is_float(xt.dtype)) return c.error("input 'X'", "a float tensor", xt.to_string());
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  if (wt.shape.rank() != xt.shape.rank())
    return c.error("input 'W'", "[M, C / group, k...] of X's rank " + std::to_string(xt.shape.rank()), wt.to_string());
  ASPEN_ASSIGN_OR_RETURN(const int64_t G, c.attr_i("group", 1));
  const std::vector<int64_t> wd = dims(wt.shape);
  const int64_t M = wd[0], Cg = wd[1];
  if (G < 1 || xt.shape.rank() < 2 || xt.shape[1] != G * Cg || M % G != 0)
    return c.error("inputs 'X' and 'W'",
                   "X's channels = group (" + std::to_string(G) + ") x W's dimension 1, and W's output channels a "
                   "multiple of group",
                   xt.to_string() + " and " + wt.to_string());
  ASPEN_ASSIGN_OR_RETURN(const Window w, window_of(c, xt, std::vector<int64_t>(wd.begin() + 2, wd.end()), false));
  const Value* bias = in.size() > 2 && in[2].present() ? &in[2] : nullptr;
  if (bias && bias->type.shape != Shape{M})
    return c.error("input 'B'", TensorType{xt.dtype, Shape{M}}.to_string(), bias->type.to_string());
  std::vector<ValueId> args = {c.id(in[0]), c.id(in[1])};
  if (bias) args.push_back(c.id(*bias));
  out = {c.wrap(c.b.op1(OpKind::conv, args, conv_attrs(w, G)))};
  return c.b.status();
}

// ConvTranspose: output o on an axis takes input i through kernel offset q where o = i s - pad_begin + q d;
// the gather reads, for every (o, q), that i when it is a whole number inside the input, else the zero row,
// and the product with the weight [C, M / group, K...] sums over q and the input channels (the transpose
// of Conv's scatter, as a gather).
Status convert_conv_transpose(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const TensorType xt = in[0].type, wt = in[1].type;
  if (!is_float(xt.dtype)) return c.error("input 'X'", "a float tensor", xt.to_string());
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  const int r = xt.shape.rank();
  if (r < 3 || r > 5 || wt.shape.rank() != r)
    return c.unsupported("inputs 'X' and 'W'", "[N, C, D...] with 1 to 3 spatial axes and W of the same rank",
                         xt.to_string() + " and " + wt.to_string());
  ASPEN_ASSIGN_OR_RETURN(const int64_t G, c.attr_i("group", 1));
  const std::vector<int64_t> wd = dims(wt.shape);
  const int64_t C = xt.shape[1], Mg = wd[1], M = G * Mg;
  if (G < 1 || wd[0] != C || C % G != 0)
    return c.error("inputs 'X' and 'W'", "W [C, M / group, k...] with X's C channels, a multiple of group",
                   xt.to_string() + " and " + wt.to_string());
  const size_t k = size_t(r - 2);
  Window w;
  w.N = xt.shape[0];
  w.C = C;
  for (int i = 2; i < r; ++i) w.D.push_back(xt.shape[i]);
  w.K.assign(wd.begin() + 2, wd.end());
  ASPEN_ASSIGN_OR_RETURN(w.S, c.attr_ints("strides", std::vector<int64_t>(k, 1)));
  ASPEN_ASSIGN_OR_RETURN(w.Dil, c.attr_ints("dilations", std::vector<int64_t>(k, 1)));
  ASPEN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, c.attr_ints("pads", std::vector<int64_t>(2 * k, 0)));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> opad, c.attr_ints("output_padding", std::vector<int64_t>(k, 0)));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> oshape, c.attr_ints("output_shape", std::vector<int64_t>{}));
  ASPEN_ASSIGN_OR_RETURN(const std::string auto_pad, c.attr_s("auto_pad", std::string("NOTSET")));
  if (c.has("kernel_shape")) {
    ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> ks, c.attr_ints("kernel_shape"));
    if (ks != w.K) return c.error("attribute 'kernel_shape'", dims_string(w.K) + " (W's)", dims_string(ks));
  }
  if (w.S.size() != k || w.Dil.size() != k || pads.size() != 2 * k || opad.size() != k ||
      (!oshape.empty() && oshape.size() != k && oshape.size() != k + 2))
    return c.error("strides, dilations, pads, output_padding, output_shape",
                   std::to_string(k) + " values per spatial axis (pads 2)", dims_string(w.S) + ", " + dims_string(w.Dil) + ", " +
                   dims_string(pads) + ", " + dims_string(opad) + ", " + dims_string(oshape));
  for (size_t i = 0; i < k; ++i) {
    const int64_t span = (w.K[i] - 1) * w.Dil[i] + 1;
    const int64_t full = w.S[i] * (w.D[i] - 1) + opad[i] + span;  // before padding
    int64_t pb = pads[i], pe = pads[i + k], o;
    const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!oshape.empty() || same) {
      o = !oshape.empty() ? oshape[oshape.size() - k + i] : w.D[i] * w.S[i];
      const int64_t total = full - o;  // negative: the output extends past the last input's reach (zeros)
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor, as ONNX's reference
      if (auto_pad == "SAME_UPPER") pb = half, pe = total - half;
      else pb = total - half, pe = half;
    } else {
      o = full - pb - pe;
    }
    if (o < 0) return c.error("attribute 'pads'", "an output of at least 0", dims_string(pads));
    w.PadBegin.push_back(pb);
    w.PadEnd.push_back(pe);
    w.O.push_back(o);
  }
  const int64_t pK = product(w.K);
  const Value* bias = in.size() > 2 && in[2].present() ? &in[2] : nullptr;
  if (bias && bias->type.shape != Shape{M})
    return c.error("input 'B'", TensorType{xt.dtype, Shape{M}}.to_string(), bias->type.to_string());
  // The transpose of the convolution of the output by W back to X (conv_grad_input) when that convolution's
  // output is X's extent: pads >= 0 and output_padding below the stride. Otherwise the gather below.
  bool transposed_conv = true;
  for (size_t i = 0; i < k; ++i)
    transposed_conv = transposed_conv && w.PadBegin[i] >= 0 && w.PadEnd[i] >= 0 && opad[i] < w.S[i] &&
                      w.O[i] + w.PadBegin[i] + w.PadEnd[i] >= (w.K[i] - 1) * w.Dil[i] + 1;
  if (transposed_conv) {
    graph::Attrs a = conv_attrs(w, G);
    a.set("input_shape", w.O);
    ValueId y = c.b.op1(OpKind::conv_grad_input, {c.id(in[0]), c.id(in[1])}, a);
    if (bias) {
      std::vector<int64_t> yd = {w.N, M};
      yd.insert(yd.end(), w.O.begin(), w.O.end());
      std::vector<int64_t> shaped(yd.size(), 1);
      shaped[1] = M;
      y = c.b.add(y, c.b.broadcast(c.b.reshape(c.id(*bias), shaped), yd));
    }
    out = {c.wrap(y)};
    return c.b.status();
  }
  ASPEN_RETURN_IF_ERROR(check_gather_size(c, w, xt));
  const ValueId col = gather_windows(c, in[0], w, 0.0, window_rows(w, w.N * product(w.D), /*transposed=*/true));
  // W [G·Cg, Mg, K...] -> [G, Mg, ΠK, Cg]
  const ValueId weight = c.b.reshape(c.b.transpose(c.b.reshape(c.id(in[1]), {G, C / G, Mg, pK}), {0, 2, 3, 1}),
                                     {G, Mg, pK * (C / G)});
  const ValueId y = patches_times_weight(c, col, w, G, Mg, weight, bias);
  out = {c.wrap(channels_first(c, y, w, M))};
  return c.b.status();
}

Status pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, bool max) {
  const TensorType xt = in[0].type;
  if (!is_float(xt.dtype)) return c.error("input 'X'", "a float tensor", xt.to_string());
  const bool indices = max && c.node.outputs.size() > 1 && !c.node.outputs[1].empty();
  ASPEN_ASSIGN_OR_RETURN(const int64_t order, c.attr_i("storage_order", 0));
  if (order != 0 && order != 1) return c.error("attribute 'storage_order'", "0 or 1", std::to_string(order));
  if (!c.has("kernel_shape")) return c.error("attribute 'kernel_shape'", "present", "none");
  ASPEN_ASSIGN_OR_RETURN(const Window w, window_of(c, xt, {}, true));
  if (max && !indices && w.D.size() == 2) {
    // NOTE [max pool as one op]: a 2-D max pool without Indices is the IR's max_pool (graph/ops_pool.cc), whose
    // gradient goes to each window's first maximum as torch's does; pads_end is set so that the floor of the
    // op's extent formula gives w.O (a ceil-mode end is more padding, which never wins).
    std::vector<int64_t> pads_end(2);
    for (size_t i = 0; i < 2; ++i) {
      const int64_t base = (w.O[i] - 1) * w.S[i] + (w.K[i] - 1) * w.Dil[i] + 1 - w.D[i] - w.PadBegin[i];
      pads_end[i] = std::max<int64_t>(base, 0);  // base > -stride: the floor still gives w.O
    }
    out = {c.wrap(c.b.op1(OpKind::max_pool, {c.id(in[0])},
                          {{"kernel", w.K}, {"strides", w.S}, {"dilations", w.Dil}, {"pads_begin", w.PadBegin},
                           {"pads_end", pads_end}}))};
    return c.b.status();
  }
  ASPEN_RETURN_IF_ERROR(check_gather_size(c, w, xt));
  const int64_t P = w.N * product(w.O), pK = product(w.K), pad_row = w.N * product(w.D);
  ValueId y;
  if (max) {
    Tensor rows = window_rows(w, pad_row);
    if (indices) {
      // Indices: each window's first maximum in its row-major scan (ONNX's reference), as the index into X
      // (row-major spatial axes, or column-major with storage_order 1): the first position among the
      // window's maxima picks, by a masked sum, from a constant of every (window position, channel)'s index
      // into X, as f32 (exact below 2^24).
      const int64_t pD = product(w.D);
      if (w.N * w.C * pD >= (int64_t(1) << 24))
        return c.unsupported("output 'Indices'", "X of fewer than 2^24 elements", xt.to_string());
      Tensor at(DType::f32, Shape{P, pK, w.C});
      const int32_t* r = rows.data<int32_t>();
      float* a = at.data<float>();
      for (int64_t i = 0; i < P * pK; ++i) {
        const int64_t n = r[i] / std::max<int64_t>(pD, 1);
        int64_t sp = r[i] % std::max<int64_t>(pD, 1);
        if (order == 1) {  // the same coordinates, the first spatial axis fastest
          int64_t rest = sp, col_major = 0, stride = 1;
          std::vector<int64_t> coord(w.D.size());
          for (size_t j = w.D.size(); j-- > 0;) coord[j] = rest % w.D[j], rest /= w.D[j];
          for (size_t j = 0; j < w.D.size(); ++j) col_major += coord[j] * stride, stride *= w.D[j];
          sp = col_major;
        }
        for (int64_t ch = 0; ch < w.C; ++ch) a[i * w.C + ch] = r[i] == pad_row ? 0.0f : float((n * w.C + ch) * pD + sp);
      }
      ValueId col = gather_windows(c, in[0], w, -std::numeric_limits<double>::infinity(), std::move(rows));
      col = c.b.reshape(col, {P, pK, w.C});
      if (xt.dtype != DType::f32) col = c.b.cast(col, DType::f32);
      const Shape ws{P, pK, w.C};
      ASPEN_ASSIGN_OR_RETURN(const ValueId pos, positions(c, ws, 1));
      const auto [m, first] = largest_along(c, col, pos, 1, false);
      const ValueId hit = c.b.op1(OpKind::equal, {pos, c.b.broadcast(first, dims(ws))});
      const ValueId picked =
          c.b.reduce_sum(c.b.where(hit, c.b.constant(std::move(at)), c.id(filled(c, 0.0, DType::f32, ws))), {1});
      y = c.b.reshape(m, {P, w.C});
      if (xt.dtype != DType::f32) y = c.b.cast(y, xt.dtype);
      out = {c.wrap(channels_first(c, y, w, w.C)), c.wrap(c.b.cast(channels_first(c, picked, w, w.C), DType::i64))};
      return c.b.status();
    }
    const ValueId col = gather_windows(c, in[0], w, -std::numeric_limits<double>::infinity(), std::move(rows));
    y = c.b.reduce_max(c.b.reshape(col, {P, pK, w.C}), {1});
  } else {
    ASPEN_ASSIGN_OR_RETURN(const int64_t count_pads, c.attr_i("count_include_pad", 0));
    std::vector<double> counts;
    Tensor ids = window_rows(w, pad_row, false, &counts, count_pads != 0);
    const ValueId col = gather_windows(c, in[0], w, 0.0, std::move(ids));
    const int64_t pO = product(w.O);
    Tensor inv(DType::f32, Shape{pO, 1});
    for (int64_t i = 0; i < pO; ++i) inv.span<float>()[size_t(i)] = float(1.0 / counts[size_t(i)]);
    ValueId scale = c.b.constant(std::move(inv));
    if (xt.dtype != DType::f32) scale = c.b.cast(scale, xt.dtype);
    const ValueId sum = c.b.reshape(c.b.reduce_sum(c.b.reshape(col, {P, pK, w.C}), {1}), {w.N, pO, w.C});
    y = c.b.reshape(c.b.mul(sum, c.b.broadcast(scale, {w.N, pO, w.C})), {P, w.C});
  }
  out = {c.wrap(channels_first(c, y, w, w.C))};
  return c.b.status();
}

Status convert_max_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) { return pool(c, in, out, true); }
Status convert_average_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) { return pool(c, in, out, false); }

// LpPool {p = 2, kernel_shape, strides, pads, dilations, auto_pad, ceil_mode} and GlobalLpPool {p = 2}:
// (Σ |x|^p)^(1/p) over each window (pads count as zeros) or over all spatial positions; p an integer >= 1
// (|x|^p as products, the root as sqrt for 2, else exp(log(s) / p)).
ValueId lp_power(Ctx& c, ValueId x, int64_t p) {
  const ValueId a = abs_of(c, x);
  ValueId y = a;
  for (int64_t k = 1; k < p; ++k) y = c.b.mul(y, a);
  return y;
}
ValueId lp_root(Ctx& c, ValueId s, int64_t p) {
  if (p == 1) return s;
  if (p == 2) return c.b.sqrt(s);
  return c.b.exp(c.b.scale(c.b.op1(OpKind::log, {s}), 1.0 / double(p)));
}
Result<int64_t> lp_order(Ctx& c) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t p, c.attr_i("p", 2));
  if (p < 1 || p > 16) return c.unsupported("attribute 'p'", "an integer in [1, 16]", std::to_string(p));
  return p;
}

Status convert_lp_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const TensorType xt = in[0].type;
  if (!is_float(xt.dtype)) return c.error("input 'X'", "a float tensor", xt.to_string());
  if (!c.has("kernel_shape")) return c.error("attribute 'kernel_shape'", "present", "none");
  ASPEN_ASSIGN_OR_RETURN(const int64_t p, lp_order(c));
  ASPEN_ASSIGN_OR_RETURN(const Window w, window_of(c, xt, {}, true));
  ASPEN_RETURN_IF_ERROR(check_gather_size(c, w, xt));
  const int64_t P = w.N * product(w.O), pK = product(w.K);
  const ValueId col = gather_windows(c, in[0], w, 0.0, window_rows(w, w.N * product(w.D)));
  const ValueId sum = c.b.reduce_sum(lp_power(c, c.b.reshape(col, {P, pK, w.C}), p), {1});
  out = {c.wrap(channels_first(c, lp_root(c, sum, p), w, w.C))};
  return c.b.status();
}

Status convert_global_lp_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape& s = in[0].type.shape;
  if (s.rank() < 3 || !is_float(in[0].type.dtype))
    return c.error("input 'X'", "a float [N, C, D...] with spatial axes", in[0].type.to_string());
  ASPEN_ASSIGN_OR_RETURN(const int64_t p, lp_order(c));
  std::vector<int64_t> axes;
  for (int i = 2; i < s.rank(); ++i) axes.push_back(i);
  out = {c.wrap(lp_root(c, c.b.reduce_sum(lp_power(c, c.id(in[0]), p), axes, true), p))};
  return c.b.status();
}

Status convert_global_max_pool(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Shape& s = in[0].type.shape;
  if (s.rank() < 3) return c.error("input 'X'", "[N, C, D...] with spatial axes", in[0].type.to_string());
  std::vector<int64_t> axes;
  for (int i = 2; i < s.rank(); ++i) axes.push_back(i);
  out = {c.wrap(c.b.reduce_max(c.id(in[0]), axes, true))};
  return c.b.status();
}

}  // namespace

void add_conv_converters(ConverterTable& t) {
  add_converter(t, "Conv", convert_conv, 2, 3);
  add_converter(t, "ConvTranspose", convert_conv_transpose, 2, 3);
  add_converter(t, "MaxPool", convert_max_pool, 1, 1);
  add_converter(t, "AveragePool", convert_average_pool, 1, 1);
  add_converter(t, "GlobalMaxPool", convert_global_max_pool, 1, 1);
  add_converter(t, "LpPool", convert_lp_pool, 1, 1);
  add_converter(t, "GlobalLpPool", convert_global_lp_pool, 1, 1);
}

}  // namespace aspen::models::onnx
