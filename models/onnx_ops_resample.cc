// models/onnx_ops_resample.cc: the ONNX importer's conversions that resample or pad the spatial axes:
// Resize / Upsample (NOTE [resize]), Pad (every mode), DepthToSpace / SpaceToDepth (the converter table and
// the shared helpers: models/onnx_ops.h, onnx_ops.cc).
#include <algorithm>
#include <cmath>
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

// Pad {mode: constant | edge | reflect | wrap}: the pads (an input from opset 11, with constant_value and,
// from 18, axes; attributes before) become, axis by axis, slices (negative pads) and concatenations of the
// constant, the edge broadcast, or single slices mirrored (reflect, without the edge) or wrapped around.
Status convert_pad(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const std::string mode, c.attr_s("mode", std::string("constant")));
  if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "wrap")
    return c.error("attribute 'mode'", "constant, edge, reflect or wrap", "'" + mode + "'");
  const int r = in[0].type.shape.rank();
  std::vector<int64_t> pads, axes;
  double value = 0.0;
  if (c.opset < 11) {
    ASPEN_ASSIGN_OR_RETURN(pads, c.attr_ints(c.opset < 2 ? "paddings" : "pads"));
    ASPEN_ASSIGN_OR_RETURN(const float v, c.attr_f("value", 0.0f));
    value = v;
  } else {
    ASPEN_ASSIGN_OR_RETURN(pads, c.ints(in[1], "input 'pads'"));
    if (in.size() > 2 && in[2].present()) {
      ASPEN_ASSIGN_OR_RETURN(value, c.scalar(in[2], "input 'constant_value'"));
    }
    if (in.size() > 3 && in[3].present()) {
      ASPEN_ASSIGN_OR_RETURN(axes, c.ints(in[3], "input 'axes'"));
    }
  }
  if (axes.empty())
    for (int i = 0; i < r; ++i) axes.push_back(i);
  if (pads.size() != 2 * axes.size())
    return c.error("input 'pads'", std::to_string(2 * axes.size()) + " values (begin and end for each axis)",
                   std::to_string(pads.size()));
  ValueId x = c.id(in[0]);
  const DType dt = in[0].type.dtype;
  for (size_t k = 0; k < axes.size(); ++k) {
    ASPEN_ASSIGN_OR_RETURN(const int a, c.axis(axes[k], r, "input 'axes'"));
    const int64_t pb = pads[k], pe = pads[k + axes.size()];
    int64_t n = c.b.type(x).shape[a];
    if (-std::min<int64_t>(pb, 0) - std::min<int64_t>(pe, 0) > n)
      return c.error("input 'pads'", "crops within axis " + std::to_string(a) + " (" + std::to_string(n) + ")",
                     std::to_string(pb) + " and " + std::to_string(pe));
    if (pb < 0 || pe < 0) {  // crops first: the pads extend what is left
      x = c.b.slice(x, a, std::max<int64_t>(-pb, 0), n + std::min<int64_t>(pe, 0));
      n = c.b.type(x).shape[a];
    }
    if (pb <= 0 && pe <= 0) continue;
    if (mode != "constant" && n == 0)
      return c.error("input 'data'", "a non-empty axis " + std::to_string(a) + " to pad in mode " + mode, "0");
    if (mode == "reflect" && std::max(pb, pe) > n - 1)
      return c.unsupported("input 'pads'", "reflect pads below the axis' extent (" + std::to_string(n) + ")",
                           std::to_string(std::max(pb, pe)));
    // The elements of one side, in order, from the axis as it is before padding: reflect, before x[p] ..
    // x[1] and after x[n-2] .. x[n-1-p]; wrap, before x[-p mod n] .. and after x[0] ..
    auto side = [&](int64_t p, bool end) -> std::vector<ValueId> {
      if (p <= 0) return {};
      std::vector<int64_t> d = dims(c.b.type(x).shape);
      d[size_t(a)] = p;
      if (mode == "constant") return {c.id(filled(c, value, dt, shape_of(d)))};
      if (mode == "edge") return {c.b.broadcast(end ? c.b.slice(x, a, n - 1, n) : c.b.slice(x, a, 0, 1), d)};
      std::vector<ValueId> parts;
      for (int64_t i = 0; i < p; ++i) {
        const int64_t at = mode == "reflect" ? (end ? n - 2 - i : p - i) : (end ? i % n : (n - p % n + i) % n);
        parts.push_back(c.b.slice(x, a, at, at + 1));
      }
      return parts;
    };
    std::vector<ValueId> parts = side(pb, false);
    parts.push_back(x);
    for (ValueId v : side(pe, true)) parts.push_back(v);
    x = c.b.concat(parts, a);
  }
  out = {c.wrap(x)};
  return c.b.status();
}

// DepthToSpace {blocksize, mode DCR | CRD} and SpaceToDepth {blocksize}: ONNX's reshape, transpose, reshape.
Status convert_depth_space(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, bool to_space) {
  const Shape s = in[0].type.shape;
  ASPEN_ASSIGN_OR_RETURN(const int64_t bs, c.attr_i("blocksize"));
  if (s.rank() != 4 || bs < 1) return c.error("input 'input' and attribute 'blocksize'", "[N, C, H, W] and >= 1",
                                               in[0].type.to_string() + " and " + std::to_string(bs));
  const int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  ValueId x = c.id(in[0]);
  if (to_space) {
    ASPEN_ASSIGN_OR_RETURN(const std::string mode, c.attr_s("mode", std::string("DCR")));
    if (C % (bs * bs) != 0 || (mode != "DCR" && mode != "CRD"))
      return c.error("channels and attribute 'mode'", "a multiple of blocksize^2 and DCR or CRD",
                     std::to_string(C) + " and '" + mode + "'");
    if (mode == "DCR")
      x = c.b.transpose(c.b.reshape(x, {N, bs, bs, C / (bs * bs), H, W}), {0, 3, 4, 1, 5, 2});
    else
      x = c.b.transpose(c.b.reshape(x, {N, C / (bs * bs), bs, bs, H, W}), {0, 1, 4, 2, 5, 3});
    x = c.b.reshape(x, {N, C / (bs * bs), H * bs, W * bs});
  } else {
    if (H % bs != 0 || W % bs != 0)
      return c.error("input 'input'", "height and width multiples of blocksize " + std::to_string(bs),
                     in[0].type.to_string());
    x = c.b.transpose(c.b.reshape(x, {N, C, H / bs, bs, W / bs, bs}), {0, 3, 5, 1, 2, 4});
    x = c.b.reshape(x, {N, C * bs * bs, H / bs, W / bs});
  }
  out = {c.wrap(x)};
  return c.b.status();
}

// NOTE [resize]: Resize (and the older Upsample) of known scales or sizes: per resized axis, each output
// index's source coordinate (ONNX's coordinate_transformation_mode) is known at import; nearest picks one
// input index (nearest_mode), linear blends the two neighbours (indices clamped into the axis, weights
// from the unclamped coordinate, as ONNX's reference pads the edge), cubic four (Keys' kernel). Each axis is
// a weighted sum of gathers of the axis moved first ([D, rest] rows), so autodiff trains through it.
// Antialias and tf_crop_and_resize are refused by name.
Status convert_resize(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, bool upsample) {
  const Shape s = in[0].type.shape;
  const int r = s.rank();
  ASPEN_ASSIGN_OR_RETURN(const std::string mode, c.attr_s("mode", std::string("nearest")));
  const std::string coord_default = upsample ? "asymmetric" : "half_pixel";
  std::string coord = coord_default, nearest = upsample ? "floor" : "round_prefer_floor";
  if (!upsample) {
    ASPEN_ASSIGN_OR_RETURN(coord, c.attr_s("coordinate_transformation_mode", coord_default));
    ASPEN_ASSIGN_OR_RETURN(nearest, c.attr_s("nearest_mode", std::string("round_prefer_floor")));
    ASPEN_ASSIGN_OR_RETURN(const int64_t antialias, c.attr_i("antialias", 0));
    if (antialias) return c.unsupported("attribute 'antialias'", "0", std::to_string(antialias));
    if (c.has("axes") || c.has("keep_aspect_ratio_policy")) {
      ASPEN_ASSIGN_OR_RETURN(const std::string policy, c.attr_s("keep_aspect_ratio_policy", std::string("stretch")));
      if (c.has("axes") || policy != "stretch")
        return c.unsupported("attributes 'axes' / 'keep_aspect_ratio_policy'", "none (every axis, stretch)", "given");
    }
  }
  if (mode != "nearest" && mode != "linear" && mode != "bilinear" && mode != "cubic")
    return c.unsupported("attribute 'mode'", "nearest, linear or cubic", "'" + mode + "'");
  float cubic_a = -0.75f;
  int64_t exclude_outside = 0;
  if (!upsample) {
    ASPEN_ASSIGN_OR_RETURN(cubic_a, c.attr_f("cubic_coeff_a", -0.75f));
    ASPEN_ASSIGN_OR_RETURN(exclude_outside, c.attr_i("exclude_outside", 0));
  }
  if (coord != "half_pixel" && coord != "pytorch_half_pixel" && coord != "align_corners" && coord != "asymmetric" &&
      coord != "tf_half_pixel_for_nn" && coord != "half_pixel_symmetric")
    return c.unsupported("attribute 'coordinate_transformation_mode'",
                         "half_pixel, pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn or "
                         "half_pixel_symmetric",
                         "'" + coord + "'");
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" && nearest != "ceil")
    return c.error("attribute 'nearest_mode'", "round_prefer_floor, round_prefer_ceil, floor or ceil", "'" + nearest + "'");
  // Scales or sizes: Upsample's attribute (opset 7) or input 1 (9); Resize's inputs 2 and 3 (scales at 1 at 10).
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  if (upsample && c.opset < 9) {
    ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, [&]() -> Result<const io::OnnxAttribute*> {
      const io::OnnxAttribute* at = c.node.find("scales");
      if (!at) return c.error("attribute 'scales'", "present", "none");
      return at;
    }());
    for (float f : a->floats) scales.push_back(f);
  } else {
    const size_t si = upsample || c.opset < 11 ? 1 : 2;
    if (si < in.size() && in[si].present() && in[si].type.shape.numel() > 0) {
      if (!in[si].readable())
        return c.unsupported("input 'scales'", "a value known when the model is imported", "one computed from the graph's inputs");
      graph::HostArray h = graph::HostArray::from_tensor(*in[si].constant);
      scales.assign(h.data.begin(), h.data.end());
    }
    if (!upsample && in.size() > 3 && in[3].present()) {
      ASPEN_ASSIGN_OR_RETURN(sizes, c.ints(in[3], "input 'sizes'"));
    }
    if (!upsample && in.size() > 1 && in[1].present() && in[1].type.shape.numel() > 0 && coord == "tf_crop_and_resize")
      return c.unsupported("input 'roi'", "none", "given");
  }
  if (scales.empty() == sizes.empty())
    return c.error("inputs 'scales' and 'sizes'", "one of them", scales.empty() ? "neither" : "both");
  if ((!scales.empty() && int(scales.size()) != r) || (!sizes.empty() && int(sizes.size()) != r))
    return c.error("scales or sizes", std::to_string(r) + " values (one per axis)",
                   std::to_string(scales.empty() ? sizes.size() : scales.size()));
  ValueId x = c.id(in[0]);
  std::vector<int64_t> cur = dims(s);
  for (int a = 0; a < r; ++a) {
    const int64_t n = s[a];
    const int64_t m = sizes.empty() ? int64_t(std::floor(double(n) * scales[size_t(a)])) : sizes[size_t(a)];
    const double scale = sizes.empty() ? scales[size_t(a)] : double(m) / double(n);
    if (m < 0 || !(scale > 0)) return c.error("scales or sizes", "positive", std::to_string(scale));
    if (m == n && scale == 1.0) continue;
    if (n == 0) return c.error("input 'X'", "a non-empty axis " + std::to_string(a), "0");
    // Per output index, its taps: input indices (clamped into the axis: ONNX's reference pads the edge) and
    // weights; nearest one, linear two, cubic four (Keys' kernel with cubic_coeff_a; exclude_outside drops
    // taps outside the axis and renormalizes).
    const int taps = mode == "nearest" ? 1 : mode == "cubic" ? 4 : 2;
    std::vector<std::vector<int32_t>> idx(size_t(taps), std::vector<int32_t>(static_cast<size_t>(m)));
    std::vector<std::vector<float>> wt(size_t(taps), std::vector<float>(static_cast<size_t>(m), 0.0f));
    const double L = sizes.empty() ? double(n) * scale : double(m);  // ONNX's resized length, unfloored
    for (int64_t o = 0; o < m; ++o) {
      double xo;
      if (coord == "half_pixel") xo = (double(o) + 0.5) / scale - 0.5;
      else if (coord == "pytorch_half_pixel") xo = L > 1 ? (double(o) + 0.5) / scale - 0.5 : 0.0;
      else if (coord == "align_corners") xo = L == 1 ? 0.0 : double(o) * double(n - 1) / (L - 1);
      else if (coord == "asymmetric") xo = double(o) / scale;
      else if (coord == "tf_half_pixel_for_nn") xo = (double(o) + 0.5) / scale;
      else {  // half_pixel_symmetric
        const double adj = double(m) / (scale * double(n)), offset = double(n) * (1.0 - adj) / 2.0;
        xo = offset + (double(o) + 0.5) / scale - 0.5;
      }
      auto clamp = [&](double v) { return int32_t(std::min<double>(std::max<double>(v, 0.0), double(n - 1))); };
      const size_t u = size_t(o);
      if (mode == "nearest") {
        double k;
        if (nearest == "floor") k = std::floor(xo);
        else if (nearest == "ceil") k = std::ceil(xo);
        else if (nearest == "round_prefer_ceil") k = std::floor(xo + 0.5);
        else k = std::ceil(xo - 0.5);  // round_prefer_floor
        idx[0][u] = clamp(k);
        wt[0][u] = 1.0f;
      } else if (mode != "cubic") {
        const double f = std::floor(xo);
        idx[0][u] = clamp(f);
        idx[1][u] = clamp(f + 1);
        wt[0][u] = float(1.0 - (xo - f));
        wt[1][u] = float(xo - f);
      } else {
        const double f = std::floor(xo), t = xo - f, A = cubic_a;
        const double w[4] = {((A * (t + 1) - 5 * A) * (t + 1) + 8 * A) * (t + 1) - 4 * A,
                             ((A + 2) * t - (A + 3)) * t * t + 1,
                             ((A + 2) * (1 - t) - (A + 3)) * (1 - t) * (1 - t) + 1,
                             ((A * (2 - t) - 5 * A) * (2 - t) + 8 * A) * (2 - t) - 4 * A};
        double sum = 0;
        for (int k = 0; k < 4; ++k) {
          const double at = f - 1 + k;
          const bool outside = at < 0 || at > double(n - 1);
          const double wk = exclude_outside && outside ? 0.0 : w[k];
          idx[size_t(k)][u] = clamp(at);
          wt[size_t(k)][u] = float(wk);
          sum += wk;
        }
        if (exclude_outside && sum != 0)
          for (int k = 0; k < 4; ++k) wt[size_t(k)][u] = float(double(wt[size_t(k)][u]) / sum);
      }
    }
    // The axis first: [n, rest] rows, gathered, back.
    std::vector<int64_t> perm = {a};
    for (int k = 0; k < r; ++k)
      if (k != a) perm.push_back(k);
    std::vector<int64_t> inverse(static_cast<size_t>(r));
    for (int k = 0; k < r; ++k) inverse[size_t(perm[size_t(k)])] = k;
    const int64_t rest = n ? c.b.type(x).shape.numel() / n : 0;
    const ValueId table = c.b.reshape(c.b.transpose(x, perm), {n, rest});
    auto gathered = [&](const std::vector<int32_t>& at) {
      Tensor t(DType::i32, Shape{m});
      std::copy(at.begin(), at.end(), t.span<int32_t>().begin());
      return c.b.gather(table, c.b.constant(std::move(t)));  // [m, rest]
    };
    auto weighted = [&](int k) {
      ValueId g = gathered(idx[size_t(k)]);
      if (taps == 1) return g;
      Tensor w(DType::f32, Shape{m, 1});
      std::copy(wt[size_t(k)].begin(), wt[size_t(k)].end(), w.span<float>().begin());
      ValueId wv = c.b.constant(std::move(w));
      if (in[0].type.dtype != DType::f32) wv = c.b.cast(wv, in[0].type.dtype);
      return c.b.mul(c.b.broadcast(wv, {m, rest}), g);
    };
    ValueId y = weighted(0);
    for (int k = 1; k < taps; ++k) y = c.b.add(y, weighted(k));
    std::vector<int64_t> moved = {m};
    for (int k = 0; k < r; ++k)
      if (k != a) moved.push_back(cur[size_t(k)]);
    cur[size_t(a)] = m;
    x = c.b.transpose(c.b.reshape(y, moved), inverse);
  }
  out = {c.wrap(x)};
  return c.b.status();
}

}  // namespace

void add_resample_converters(ConverterTable& t) {
  add_converter(t, "Resize", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_resize(c, in, out, false);
  }, 1, 4);
  add_converter(t, "Upsample", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_resize(c, in, out, true);
  }, 1, 2);
  add_converter(t, "Pad", convert_pad, 1, 4);
  add_converter(t, "DepthToSpace", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_depth_space(c, in, out, true);
  }, 1, 1);
  add_converter(t, "SpaceToDepth", [](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    return convert_depth_space(c, in, out, false);
  }, 1, 1);
}

}  // namespace aspen::models::onnx
