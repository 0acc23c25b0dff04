#include "kernels/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

Status check(const MaxPoolShape& s, const char* k) {
  const bool ok = s.N >= 1 && s.C >= 1 && s.H >= 1 && s.W >= 1 && s.OH >= 1 && s.OW >= 1 && s.KH >= 1 &&
                  s.KW >= 1 && s.SH >= 1 && s.SW >= 1 && s.PH >= 0 && s.PW >= 0 && s.DH >= 1 && s.DW >= 1;
  if (!ok)
    return Status::invalid_argument(std::string(k) + ": shape",
                                    "extents, kernel, strides and dilations >= 1, pads >= 0",
                                    "N " + std::to_string(s.N) + ", C " + std::to_string(s.C) + ", " +
                                        std::to_string(s.H) + "x" + std::to_string(s.W) + " -> " +
                                        std::to_string(s.OH) + "x" + std::to_string(s.OW));
  return Status();
}

// The position (into the plane) of window (oh, ow)'s maximum, -1 for a window wholly in the padding.
template <class T>
int64_t argmax(const MaxPoolShape& s, const T* plane, int64_t oh, int64_t ow) {
  int64_t best = -1;
  T m = T(0);
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    const int64_t h = oh * s.SH - s.PH + kh * s.DH;
    if (h < 0 || h >= s.H) continue;
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const int64_t w = ow * s.SW - s.PW + kw * s.DW;
      if (w < 0 || w >= s.W) continue;
      const T v = plane[h * s.W + w];
      if (best < 0 || v > m || std::isnan(v)) best = h * s.W + w, m = v;
    }
  }
  return best;
}

// The outputs whose windows lie wholly inside the input along one axis: [lo, hi).
struct Inside {
  int64_t lo, hi;
};
Inside inside(int64_t O, int64_t S, int64_t P, int64_t K, int64_t D, int64_t extent) {
  const int64_t lo = std::min(O, (P + S - 1) / S);            // o S - P >= 0
  const int64_t last = extent - 1 - (K - 1) * D + P;           // o S <= last
  const int64_t hi = last < 0 ? lo : std::clamp(last / S + 1, lo, O);
  return {lo, hi};
}

// Output row oh's windows ow in [ow0, ow1), all inside the input: their maxima into m and (when `at` is given)
// each first maximum's offset from its window's first position. The windows are scanned together, one kernel
// position at a time, branch-free, so the loop runs across outputs (vectorizes; random data would mispredict a
// branch per comparison): a later position takes over when greater or NaN, as argmax's scan does. The offsets
// are int32, as wide as the values: with int64 the blend mixes lane widths, and GCC left the loop scalar and
// branching (the backward ran 6x slower than the forward on random data).
template <class T, int64_t kSW>  // kSW: the column stride when 1 or 2 (a constant: the loads vectorize), else 0
void row_max_at(const MaxPoolShape& s, const T* in, int64_t oh, int64_t ow0, int64_t ow1, T* m, int32_t* at) {
  const T* base = in + (oh * s.SH - s.PH) * s.W + (ow0 * s.SW - s.PW);
  const int64_t n = ow1 - ow0, SW = kSW ? kSW : s.SW;
  for (int64_t j = 0; j < n; ++j) m[j] = base[j * SW];
  if (at)
    for (int64_t j = 0; j < n; ++j) at[j] = 0;
  for (int64_t kh = 0; kh < s.KH; ++kh)
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      if (kh == 0 && kw == 0) continue;
      const int32_t off = int32_t(kh * s.DH * s.W + kw * s.DW);
      const T* q = base + off;
      if (at) {
        for (int64_t j = 0; j < n; ++j) {
          const T v = q[j * SW];
          const bool take = (v > m[j]) | (v != v);
          m[j] = take ? v : m[j];
          at[j] = take ? off : at[j];
        }
      } else {
        for (int64_t j = 0; j < n; ++j) {
          const T v = q[j * SW];
          m[j] = ((v > m[j]) | (v != v)) ? v : m[j];
        }
      }
    }
}

template <class T>
void row_max(const MaxPoolShape& s, const T* in, int64_t oh, int64_t ow0, int64_t ow1, T* m, int32_t* at) {
  if (s.SW == 1) return row_max_at<T, 1>(s, in, oh, ow0, ow1, m, at);
  if (s.SW == 2) return row_max_at<T, 2>(s, in, oh, ow0, ow1, m, at);
  row_max_at<T, 0>(s, in, oh, ow0, ow1, m, at);
}

// kFast: the windows inside the input go through row_max; the reference scans every window with argmax.
template <class T, bool kFast>
void forward_plane(const MaxPoolShape& s, int64_t p, const T* x, T* y) {
  const T* in = x + p * s.H * s.W;
  T* out = y + p * s.OH * s.OW;
  const Inside rows = inside(s.OH, s.SH, s.PH, s.KH, s.DH, s.H), cols = inside(s.OW, s.SW, s.PW, s.KW, s.DW, s.W);
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const bool fast = kFast && oh >= rows.lo && oh < rows.hi && cols.lo < cols.hi;
    if (fast) row_max<T>(s, in, oh, cols.lo, cols.hi, out + oh * s.OW + cols.lo, nullptr);
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      if (fast && ow == cols.lo) ow = cols.hi;
      if (ow >= s.OW) break;
      const int64_t at = argmax(s, in, oh, ow);
      out[oh * s.OW + ow] = at < 0 ? -std::numeric_limits<T>::infinity() : in[at];
    }
  }
}

// kFast: m and at hold OW values each (the row scratch); the reference passes none.
template <class T, bool kFast>
void backward_plane(const MaxPoolShape& s, int64_t p, const T* x, const T* dy, T* dx, T* m, int32_t* at) {
  const T* in = x + p * s.H * s.W;
  const T* g = dy + p * s.OH * s.OW;
  T* d = dx + p * s.H * s.W;
  for (int64_t i = 0; i < s.H * s.W; ++i) d[i] = T(0);
  const Inside rows = inside(s.OH, s.SH, s.PH, s.KH, s.DH, s.H), cols = inside(s.OW, s.SW, s.PW, s.KW, s.DW, s.W);
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    const bool fast = kFast && oh >= rows.lo && oh < rows.hi && cols.lo < cols.hi;
    if (fast) {
      row_max<T>(s, in, oh, cols.lo, cols.hi, m, at);
      const int64_t base = (oh * s.SH - s.PH) * s.W - s.PW;
      for (int64_t ow = cols.lo; ow < cols.hi; ++ow)  // in order: windows that share a maximum add in turn
        d[base + ow * s.SW + at[size_t(ow - cols.lo)]] += g[oh * s.OW + ow];
    }
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      if (fast && ow == cols.lo) ow = cols.hi;
      if (ow >= s.OW) break;
      const int64_t a = argmax(s, in, oh, ow);
      if (a >= 0) d[a] += g[oh * s.OW + ow];
    }
  }
}

// Each plane is one thread's; small pools stay on the calling thread.
bool parallel(const MaxPoolShape& s) { return s.N * s.C > 1 && s.N * s.C * s.H * s.W >= 4096 && !reference_mode(); }

}  // namespace

namespace ref {
template <class T>
void max_pool_forward(const MaxPoolShape& s, const T* x, T* y) {
  for (int64_t p = 0; p < s.N * s.C; ++p) forward_plane<T, false>(s, p, x, y);
}
template <class T>
void max_pool_backward(const MaxPoolShape& s, const T* x, const T* dy, T* dx) {
  for (int64_t p = 0; p < s.N * s.C; ++p) backward_plane<T, false>(s, p, x, dy, dx, nullptr, nullptr);
}
template void max_pool_forward<float>(const MaxPoolShape&, const float*, float*);
template void max_pool_forward<double>(const MaxPoolShape&, const double*, double*);
template void max_pool_backward<float>(const MaxPoolShape&, const float*, const float*, float*);
template void max_pool_backward<double>(const MaxPoolShape&, const double*, const double*, double*);
}  // namespace ref

Status max_pool_forward(const MaxPoolShape& s, const float* x, float* y) {
  ASPEN_RETURN_IF_ERROR(check(s, "max_pool_forward"));
#pragma omp parallel for schedule(static) if (parallel(s))
  for (int64_t p = 0; p < s.N * s.C; ++p) forward_plane<float, true>(s, p, x, y);
  return Status();
}

Status max_pool_backward(const MaxPoolShape& s, const float* x, const float* dy, float* dx) {
  ASPEN_RETURN_IF_ERROR(check(s, "max_pool_backward"));
  if (s.H * s.W > std::numeric_limits<int32_t>::max())  // the window offsets are int32 (row_max_at)
    return Status::invalid_argument("max_pool_backward: plane", "at most 2^31 - 1 elements",
                                    std::to_string(s.H) + "x" + std::to_string(s.W));
#pragma omp parallel if (parallel(s))
  {
    std::vector<float> m(size_t(s.OW));
    std::vector<int32_t> at(size_t(s.OW));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < s.N * s.C; ++p) backward_plane<float, true>(s, p, x, dy, dx, m.data(), at.data());
  }
  return Status();
}

}  // namespace aspen::kernels
