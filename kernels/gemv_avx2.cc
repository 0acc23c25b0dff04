// kernels/gemv_avx2.cc: the AVX2 GEMV kernels (f32 and bf16 weights, both layouts).
// See gemv.h for the contract and docs/kernels.md ("GEMV") for the design and measurements.
// GCC 12 reports -Wmaybe-uninitialized inside AVX-512 intrinsics built on
// _mm512_undefined_*() (GCC bug 105593; see kernels/convert.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/gemv_internal.h"

namespace aspen::kernels::gemv_detail {
namespace {

// ---- AVX2 -----------------------------------------------------------------------------------------

// The AVX2 paths for f32 weights; bf16 weights have their own further down
// (NOTE [bf16 pairs] at AVX2).
ASPEN_TARGET_AVX2 inline __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }
// The first n (< 8) elements, zero-filled to 8.
ASPEN_TARGET_AVX2 inline __m256 ld8(const float* p, int64_t n) {
  float buf[8] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(float));
  return ld8(buf);
}
ASPEN_TARGET_AVX2 inline float hsum8(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

template <int MB, int R>
ASPEN_TARGET_AVX2 void nk_tile_avx2(const Job& j, int64_t m0, int64_t n) {
  const int64_t K = j.K;
  const float* w = static_cast<const float*>(j.w) + n * K;
  const float* x = j.x + m0 * K;
  __m256 acc[MB][R];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T1);
      wv[r] = ld8(w + r * K + k);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * K + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
  if (k < K) {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = ld8(w + r * K + k, K - k);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 xv = ld8(x + m * K + k, K - k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      j.y[(m0 + m) * j.N + n + r] = hsum8(acc[m][r]) + (j.bias ? j.bias[n + r] : 0.0f);
}

template <int R>
ASPEN_TARGET_AVX2 void nk_rows_avx2(const Job& j, int64_t n) {
  static constexpr NkTile tiles[3] = {nk_tile_avx2<1, R>, nk_tile_avx2<2, R>, nk_tile_avx2<3, R>};
  for (int64_t m0 = 0; m0 < j.M; m0 += 3) tiles[std::min<int64_t>(3, j.M - m0) - 1](j, m0, n);
}

ASPEN_TARGET_AVX2 void nk_avx2(const Job& j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) nk_rows_avx2<4>(j, n);
  for (; n < n1; ++n) nk_rows_avx2<1>(j, n);
}

// NOTE [bf16 pairs] at AVX2: a 32-byte load holds 16 bf16 weights, the even
// ones widened by a shift, the odd ones by a mask. `n` (< 16 at a ragged
// end) elements are valid; the rest read as zero and nothing past them is read.
ASPEN_TARGET_AVX2 inline __m256i ld16_bf16(const bf16* p, int64_t n) {
  if (n >= 16) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) bf16 buf[16] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(bf16));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}
ASPEN_TARGET_AVX2 inline __m256 bf16_even(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
ASPEN_TARGET_AVX2 inline __m256 bf16_odd(__m256i v, __m256i high) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, high));
}

// [N, K] bf16 against x split into 16-element chunks of 8 even then 8 odd
// elements (Job::xp, rows of Kp = K rounded up to 16).
template <int MB, int R, bool Packed = false>
ASPEN_TARGET_AVX2 void nk_tile_bf16_avx2(const Job& j, int64_t m0, int64_t n) {
  static_assert(!Packed || R == 8, "packed groups are 8 rows");
  const int64_t K = j.K, Kp = j.Kp;
  const bf16* w = static_cast<const bf16*>(j.w) + n * K;
  const float* x = j.xp + m0 * Kp;
  const __m256i high = _mm256_set1_epi32(int32_t(0xffff0000u));
  __m256 acc[MB][R];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m256 xe[MB], xo[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      xe[m] = _mm256_loadu_ps(x + m * Kp + k);
      xo[m] = _mm256_loadu_ps(x + m * Kp + k + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (!Packed) _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T1);
      const __m256i v = ld16_bf16(Packed ? packed_row(w, K, r, k) : w + r * K + k, K - k);
      const __m256 lo = bf16_even(v), hi = bf16_odd(v, high);
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) acc[m][r] = _mm256_fmadd_ps(xe[m], lo, _mm256_fmadd_ps(xo[m], hi, acc[m][r]));
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      j.y[(m0 + m) * j.N + n + r] = hsum8(acc[m][r]) + (j.bias ? j.bias[n + r] : 0.0f);
}

template <int R>
ASPEN_TARGET_AVX2 void nk_rows_bf16_avx2(const Job& j, int64_t n) {
  int64_t m0 = 0;
  if constexpr (R <= 4)
    for (; m0 + 2 <= j.M; m0 += 2) nk_tile_bf16_avx2<2, R>(j, m0, n);
  for (; m0 < j.M; ++m0) nk_tile_bf16_avx2<1, R>(j, m0, n);
}

ASPEN_TARGET_AVX2 void nk_bf16_avx2_impl(const Job& j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (j.packed)  // n0 on a group's first row; each row of x reads the group again (from L1)
    for (; n + 8 <= std::min(n1, j.N / 8 * 8); n += 8)
      for (int64_t m0 = 0; m0 < j.M; ++m0) nk_tile_bf16_avx2<1, 8, true>(j, m0, n);
  if (j.M == 1)  // 8 weight rows in flight, as at AVX-512
    for (; n + 8 <= n1; n += 8) nk_rows_bf16_avx2<8>(j, n);
  for (; n + 4 <= n1; n += 4) nk_rows_bf16_avx2<4>(j, n);
  for (; n < n1; ++n) nk_rows_bf16_avx2<1>(j, n);
}

// [K, N] f32, one row of x: KB weight rows at a time, the broadcasts of x hoisted out of the column loop.
// y[n] gets its k terms in order whatever KB is.
template <int KB>
ASPEN_TARGET_AVX2 void kn_block_avx2(const Job& j, int64_t k, int64_t p0, int64_t p1) {
  const int64_t N = j.N;
  const float* w = static_cast<const float*>(j.w) + k * N;
  __m256 xb[KB];
#pragma GCC unroll 8
  for (int i = 0; i < KB; ++i) xb[i] = _mm256_set1_ps(j.x[k + i]);
  float* y = j.y;
  int64_t c = p0;
  for (; c + 8 <= p1; c += 8) {
    __m256 a = _mm256_loadu_ps(y + c);
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T1);
      a = _mm256_fmadd_ps(xb[i], ld8(w + i * N + c), a);
    }
    _mm256_storeu_ps(y + c, a);
  }
  for (; c < p1; ++c) {  // scalar tail: fmaf keeps the vector lanes' rounding
    float a = y[c];
    for (int i = 0; i < KB; ++i) a = __builtin_fmaf(j.x[k + i], w[i * N + c], a);
    y[c] = a;
  }
}

// NOTE [gemv row blocks] at AVX2: a strip of up to 24 columns of MB <= 4 rows in registers (12 of the 16) across a
// block of kKnBlockRows weight rows; bf16 widened 8 at a time (a zero-extend and a shift). The columns past the
// last whole 8 take fmaf, which rounds as the vector FMA does: every path adds y[m, n]'s k terms in order.
ASPEN_TARGET_AVX2 inline __m256 ld8w(const float* p) { return _mm256_loadu_ps(p); }
ASPEN_TARGET_AVX2 inline __m256 ld8w(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <class W, int MB, int NV>
ASPEN_TARGET_AVX2 inline void kn_strip_avx2(const Job& j, const float* x, float* y, const W* w, int64_t k0,
                                            int64_t k1) {
  const int64_t N = j.N, ldx = j.ldx;
  __m256 acc[MB][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_loadu_ps(y + m * N + 8 * v);
  for (int64_t k = k0; k < k1; ++k) {
    const W* wr = w + k * N;
    __m256 wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + kKnBlockRows * N + 8 * v), _MM_HINT_T1);
      wv[v] = ld8w(wr + 8 * v);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(xb, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(y + m * N + 8 * v, acc[m][v]);
}

template <class W, int MB>
ASPEN_TARGET_AVX2 void kn_strips_avx2(const Job& j, int64_t m0, int64_t k0, int64_t k1, int64_t n0, int64_t n1) {
  const float* x = j.x + m0 * j.ldx;
  float* y = j.y + m0 * j.N;
  const W* w = static_cast<const W*>(j.w);
  int64_t c = n0;
  for (; c + 24 <= n1; c += 24) kn_strip_avx2<W, MB, 3>(j, x, y + c, w + c, k0, k1);
  if (c + 16 <= n1) kn_strip_avx2<W, MB, 2>(j, x, y + c, w + c, k0, k1), c += 16;
  if (c + 8 <= n1) kn_strip_avx2<W, MB, 1>(j, x, y + c, w + c, k0, k1), c += 8;
  for (; c < n1; ++c)
    for (int m = 0; m < MB; ++m) {
      float a = y[m * j.N + c];
      for (int64_t k = k0; k < k1; ++k) a = __builtin_fmaf(x[m * j.ldx + k], widen(w[k * j.N + c]), a);
      y[m * j.N + c] = a;
    }
}

template <class W>
ASPEN_TARGET_AVX2 void kn_rows_avx2(const Job& j, int64_t n0, int64_t n1) {
  static constexpr KnStrips strips[4] = {kn_strips_avx2<W, 1>, kn_strips_avx2<W, 2>, kn_strips_avx2<W, 3>,
                                         kn_strips_avx2<W, 4>};
  kn_row_blocks(j, n0, n1, strips, 4);
}

ASPEN_TARGET_AVX2 void kn_avx2(const Job& j, int64_t n0, int64_t n1) {  // one row of x (M > 1: kn_rows_avx2)
  const int64_t K = j.K, P = kn_panel(1);
  for (int64_t p0 = n0; p0 < n1; p0 += P) {
    const int64_t p1 = std::min(n1, p0 + P);
    for (int64_t n = p0; n < p1; ++n) j.y[n] = j.bias ? j.bias[n] : 0.0f;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) kn_block_avx2<4>(j, k, p0, p1);
    for (; k < K; ++k) kn_block_avx2<1>(j, k, p0, p1);
  }
}

// [K, N] bf16 (NOTE [bf16 pairs]): the panel's sums live in `acc`, MB rows of
// `stride` floats, each 16 columns as 8 even then 8 odd; 16 columns per load.
// Registers: MB * KB broadcasts, 2 * MB sums, the load and its two halves.
template <int MB, int KB>
ASPEN_TARGET_AVX2 void kn_bf16_block_avx2(const Job& j, int64_t m0, int64_t k, int64_t p0, int64_t p1, float* acc,
                                          int64_t stride) {
  const int64_t N = j.N;
  const bf16* w = static_cast<const bf16*>(j.w) + k * N;
  const __m256i high = _mm256_set1_epi32(int32_t(0xffff0000u));
  __m256 xb[MB][KB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) xb[m][i] = _mm256_set1_ps(j.x[(m0 + m) * j.ldx + k + i]);
  acc += m0 * stride;
  for (int64_t c = p0; c < p1; c += 16, acc += 16) {
    __m256 e[MB], o[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      e[m] = _mm256_loadu_ps(acc + m * stride);
      o[m] = _mm256_loadu_ps(acc + m * stride + 8);
    }
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T1);
      const __m256i v = ld16_bf16(w + i * N + c, p1 - c);
      const __m256 lo = bf16_even(v), hi = bf16_odd(v, high);
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        e[m] = _mm256_fmadd_ps(xb[m][i], lo, e[m]);
        o[m] = _mm256_fmadd_ps(xb[m][i], hi, o[m]);
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      _mm256_storeu_ps(acc + m * stride, e[m]);
      _mm256_storeu_ps(acc + m * stride + 8, o[m]);
    }
  }
}

// 16 columns in natural order <-> the pair layout (8 even, then 8 odd), by
// shuffles. Scalar, the panel's set-up and write-back took 5.4 % of the
// samples against the blocks' 34 % (perf, M = 8, K = 768 cut in two slices).
ASPEN_TARGET_AVX2 inline void to_pairs(const float* src, float* dst) {
  const __m256 b0 = _mm256_loadu_ps(src), b1 = _mm256_loadu_ps(src + 8);
  const __m256 e = _mm256_shuffle_ps(b0, b1, 0x88), o = _mm256_shuffle_ps(b0, b1, 0xDD);  // per lane: 0 2 | 0 2
  _mm256_storeu_ps(dst, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)));
  _mm256_storeu_ps(dst + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8)));
}
ASPEN_TARGET_AVX2 inline void from_pairs(const float* src, float* dst) {
  const __m256 e = _mm256_loadu_ps(src), o = _mm256_loadu_ps(src + 8);
  const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);  // per lane: e0 o0 e1 o1 | e4 o4 ..
  _mm256_storeu_ps(dst, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

ASPEN_TARGET_AVX2 void kn_bf16_avx2_impl(const Job& j, int64_t n0, int64_t n1) {  // M = 1 (M > 1: kn_rows_avx2)
  const int64_t M = j.M, K = j.K, P = kn_panel(M);
  const int64_t stride = (P + 15) / 16 * 16;
  thread_local std::vector<float> panel;  // per thread, grown once
  panel.resize(size_t(M * stride));
  float* acc = panel.data();
  for (int64_t p0 = n0; p0 < n1; p0 += P) {
    const int64_t p1 = std::min(n1, p0 + P);
    // Each row starts from the bias (zero past p1: the last chunk's spare lanes).
    for (int64_t c = p0; c < p1; c += 16) {
      alignas(32) float b[16] = {};
      const int64_t n = std::min<int64_t>(16, p1 - c);
      if (j.bias) std::copy(j.bias + c, j.bias + c + n, b);
      for (int64_t m = 0; m < M; ++m) to_pairs(b, acc + m * stride + (c - p0));
    }
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) kn_bf16_block_avx2<1, 8>(j, 0, k, p0, p1, acc, stride);
    for (; k < K; ++k)
      for (int64_t m = 0; m < M; ++m) kn_bf16_block_avx2<1, 1>(j, m, k, p0, p1, acc, stride);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = p0; c < p1; c += 16) {
        float* y = j.y + m * j.N + c;
        if (p1 - c >= 16) {
          from_pairs(acc + m * stride + (c - p0), y);
        } else {
          alignas(32) float t[16];
          from_pairs(acc + m * stride + (c - p0), t);
          std::copy(t, t + (p1 - c), y);
        }
      }
  }
}

}  // namespace

void nk_f32_avx2(const Job& j, int64_t n0, int64_t n1) { nk_avx2(j, n0, n1); }
void nk_bf16_avx2(const Job& j, int64_t n0, int64_t n1) { nk_bf16_avx2_impl(j, n0, n1); }
void kn_f32_avx2(const Job& j, int64_t n0, int64_t n1) {
  if (j.M > 1) return kn_rows_avx2<float>(j, n0, n1);
  kn_avx2(j, n0, n1);
}
void kn_bf16_avx2(const Job& j, int64_t n0, int64_t n1) {
  if (j.M > 1) return kn_rows_avx2<bf16>(j, n0, n1);
  kn_bf16_avx2_impl(j, n0, n1);
}

}  // namespace aspen::kernels::gemv_detail
