#include "kernels/pool.h"

#include <immintrin.h>

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

// NOTE [2x2 pools]: a 2x2 window at stride 2, unpadded and dense (the pool of nearly every CNN, the PopTorch
// tutorials' included) gets its own row kernels: the windows tile the plane, so the forward is one pass over
// pairs of rows, and the backward writes every dx once (the window's maximum gets 0 + dy, as the reference
// adds it, the other three 0) instead of zeroing the plane and scattering. The scan order and the NaN rule
// are the general path's: (0,0), (0,1), (1,0), (1,1), a later one wins when greater or NaN. The AVX-512 and
// AVX2 rows split each pair of rows into even and odd columns with permutes and pick by compare masks: the
// general path's per-row setup and strided scans cost 3-9x that on the tutorials' 24x24 and 8x8 planes, and
// plain C++ of the backward compiled to branches (0.74 ms for 230k inputs of random data, 6x the forward).
bool is_2x2(const MaxPoolShape& s) {
  return s.KH == 2 && s.KW == 2 && s.SH == 2 && s.SW == 2 && s.PH == 0 && s.PW == 0 && s.DH == 1 && s.DW == 1 &&
         s.OH == s.H / 2 && s.OW == s.W / 2;
}

// Windows [j0, OW) of one pair of rows, branch-free scalar code (the base ISA, and the AVX2 row's tail).
// kBack: dx rows d0, d1 from g; else the maxima into o.
template <bool kBack>
void row_2x2_scalar(const float* r0, const float* r1, int64_t j0, int64_t OW, const float* g, float* o, float* d0,
                    float* d1) {
  for (int64_t j = j0; j < OW; ++j) {
    float m = r0[2 * j];
    uint32_t at = 0;
    const float v[3] = {r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
    for (uint32_t k = 0; k < 3; ++k) {
      const uint32_t t = uint32_t((v[k] > m) | (v[k] != v[k]));
      m = t ? v[k] : m;
      at = at + t * (k + 1 - at);
    }
    if constexpr (kBack) {
      const float gv = 0.0f + g[j];
      d0[2 * j] = at == 0 ? gv : 0.0f;
      d0[2 * j + 1] = at == 1 ? gv : 0.0f;
      d1[2 * j] = at == 2 ? gv : 0.0f;
      d1[2 * j + 1] = at == 3 ? gv : 0.0f;
    } else {
      o[j] = m;
    }
  }
}

ASPEN_TARGET_AVX512 __mmask16 take512(__m512 v, __m512& m) {
  const __mmask16 t = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  m = _mm512_mask_mov_ps(m, t, v);
  return t;
}

// 16 windows at a time; the last lanes masked (loads read zeros there, stores skip them).
template <bool kBack>
ASPEN_TARGET_AVX512 void row_2x2_avx512(const float* r0, const float* r1, int64_t OW, const float* g, float* o,
                                        float* d0, float* d1) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (int64_t j = 0; j < OW; j += 16) {
    const int64_t n = std::min<int64_t>(16, OW - j);
    const __mmask16 k = __mmask16((1u << n) - 1);
    const __mmask16 k0 = __mmask16(n >= 8 ? 0xffffu : (1u << (2 * n)) - 1);
    const __mmask16 k1 = __mmask16(n > 8 ? (n == 16 ? 0xffffu : (1u << (2 * n - 16)) - 1) : 0u);
    const __m512 a0 = _mm512_maskz_loadu_ps(k0, r0 + 2 * j), a1 = _mm512_maskz_loadu_ps(k1, r0 + 2 * j + 16);
    const __m512 b0 = _mm512_maskz_loadu_ps(k0, r1 + 2 * j), b1 = _mm512_maskz_loadu_ps(k1, r1 + 2 * j + 16);
    __m512 m = _mm512_permutex2var_ps(a0, even, a1);
    const __mmask16 t1 = take512(_mm512_permutex2var_ps(a0, odd, a1), m);
    const __mmask16 t2 = take512(_mm512_permutex2var_ps(b0, even, b1), m);
    const __mmask16 t3 = take512(_mm512_permutex2var_ps(b0, odd, b1), m);
    if constexpr (kBack) {
      const __m512 v = _mm512_add_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(k, g + j));
      const __mmask16 w3 = t3, w2 = __mmask16(t2 & ~t3), w1 = __mmask16(t1 & ~t2 & ~t3),
                      w0 = __mmask16(~(t1 | t2 | t3));
      const __m512 e0 = _mm512_maskz_mov_ps(w0, v), o0 = _mm512_maskz_mov_ps(w1, v);
      const __m512 e1 = _mm512_maskz_mov_ps(w2, v), o1 = _mm512_maskz_mov_ps(w3, v);
      _mm512_mask_storeu_ps(d0 + 2 * j, k0, _mm512_permutex2var_ps(e0, lo, o0));
      _mm512_mask_storeu_ps(d0 + 2 * j + 16, k1, _mm512_permutex2var_ps(e0, hi, o0));
      _mm512_mask_storeu_ps(d1 + 2 * j, k0, _mm512_permutex2var_ps(e1, lo, o1));
      _mm512_mask_storeu_ps(d1 + 2 * j + 16, k1, _mm512_permutex2var_ps(e1, hi, o1));
    } else {
      _mm512_mask_storeu_ps(o + j, k, m);
    }
  }
}

ASPEN_TARGET_AVX2 __m256 take256(__m256 v, __m256& m) {
  const __m256 t = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  m = _mm256_blendv_ps(m, v, t);
  return t;
}

// The even and odd columns of 16 floats: shuffle_ps takes them per 128-bit lane (a0 a2 b0 b2 | a4 a6 b4 b6),
// permute4x64 puts the quarters in order.
ASPEN_TARGET_AVX2 void split256(const float* p, __m256& e, __m256& od) {
  const __m256 x0 = _mm256_loadu_ps(p), x1 = _mm256_loadu_ps(p + 8);
  e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0x88)), 0xd8));
  od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0xdd)), 0xd8));
}

// e0 od0 e1 od1 ... into p[0, 16).
ASPEN_TARGET_AVX2 void merge256(float* p, __m256 e, __m256 od) {
  const __m256 l = _mm256_unpacklo_ps(e, od), h = _mm256_unpackhi_ps(e, od);  // (0 1 | 4 5), (2 3 | 6 7)
  _mm256_storeu_ps(p, _mm256_permute2f128_ps(l, h, 0x20));
  _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(l, h, 0x31));
}

// 8 windows at a time, the rest scalar.
template <bool kBack>
ASPEN_TARGET_AVX2 void row_2x2_avx2(const float* r0, const float* r1, int64_t OW, const float* g, float* o,
                                    float* d0, float* d1) {
  int64_t j = 0;
  for (; j + 8 <= OW; j += 8) {
    __m256 m, a1, b0, b1;
    split256(r0 + 2 * j, m, a1);
    split256(r1 + 2 * j, b0, b1);
    const __m256 t1 = take256(a1, m), t2 = take256(b0, m), t3 = take256(b1, m);
    if constexpr (kBack) {
      const __m256 v = _mm256_add_ps(_mm256_setzero_ps(), _mm256_loadu_ps(g + j));
      const __m256 w3 = t3, w2 = _mm256_andnot_ps(t3, t2), w1 = _mm256_andnot_ps(_mm256_or_ps(t2, t3), t1);
      const __m256 w0 = _mm256_andnot_ps(_mm256_or_ps(t1, _mm256_or_ps(t2, t3)), v);
      merge256(d0 + 2 * j, w0, _mm256_and_ps(w1, v));
      merge256(d1 + 2 * j, _mm256_and_ps(w2, v), _mm256_and_ps(w3, v));
    } else {
      _mm256_storeu_ps(o + j, m);
    }
  }
  row_2x2_scalar<kBack>(r0, r1, j, OW, g, o, d0, d1);
}

using Row2x2 = void (*)(const float*, const float*, int64_t, const float*, float*, float*, float*);

template <bool kBack>
void row_2x2_base(const float* r0, const float* r1, int64_t OW, const float* g, float* o, float* d0, float* d1) {
  row_2x2_scalar<kBack>(r0, r1, 0, OW, g, o, d0, d1);
}

template <bool kBack>
Row2x2 pick_row_2x2() {
  const Isa isa = active_isa();
  return isa >= Isa::avx512 ? row_2x2_avx512<kBack> : isa == Isa::avx2 ? row_2x2_avx2<kBack> : row_2x2_base<kBack>;
}

void forward_2x2(const MaxPoolShape& s, int64_t p, const float* x, float* y, Row2x2 row) {
  const float* in = x + p * s.H * s.W;
  float* out = y + p * s.OH * s.OW;
  for (int64_t oh = 0; oh < s.OH; ++oh)
    row(in + 2 * oh * s.W, in + (2 * oh + 1) * s.W, s.OW, nullptr, out + oh * s.OW, nullptr, nullptr);
}

void backward_2x2(const MaxPoolShape& s, int64_t p, const float* x, const float* dy, float* dx, Row2x2 row) {
  const float* in = x + p * s.H * s.W;
  float* d = dx + p * s.H * s.W;
  for (int64_t oh = 0; oh < s.OH; ++oh) {
    float *d0 = d + 2 * oh * s.W, *d1 = d0 + s.W;
    row(in + 2 * oh * s.W, in + (2 * oh + 1) * s.W, s.OW, dy + (p * s.OH + oh) * s.OW, nullptr, d0, d1);
    if (s.W % 2) d0[s.W - 1] = d1[s.W - 1] = 0.0f;  // the odd last column is in no window
  }
  if (s.H % 2) std::fill_n(d + (s.H - 1) * s.W, s.W, 0.0f);  // nor the odd last row
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
  if (is_2x2(s)) {
    const Row2x2 row = pick_row_2x2<false>();
#pragma omp parallel for schedule(static) if (parallel(s))
    for (int64_t p = 0; p < s.N * s.C; ++p) forward_2x2(s, p, x, y, row);
    return Status();
  }
#pragma omp parallel for schedule(static) if (parallel(s))
  for (int64_t p = 0; p < s.N * s.C; ++p) forward_plane<float, true>(s, p, x, y);
  return Status();
}

Status max_pool_backward(const MaxPoolShape& s, const float* x, const float* dy, float* dx) {
  ASPEN_RETURN_IF_ERROR(check(s, "max_pool_backward"));
  if (s.H * s.W > std::numeric_limits<int32_t>::max())  // the window offsets are int32 (row_max_at)
    return Status::invalid_argument("max_pool_backward: plane", "at most 2^31 - 1 elements",
                                    std::to_string(s.H) + "x" + std::to_string(s.W));
  if (is_2x2(s)) {
    const Row2x2 row = pick_row_2x2<true>();
#pragma omp parallel for schedule(static) if (parallel(s))
    for (int64_t p = 0; p < s.N * s.C; ++p) backward_2x2(s, p, x, dy, dx, row);
    return Status();
  }
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
