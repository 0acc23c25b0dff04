// kernels/gemv_avx512.cc: the AVX-512 GEMV kernels (f32 and bf16 weights, both layouts).
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

// ---- AVX-512 -------------------------------------------------------------------------------------

ASPEN_TARGET_AVX512 inline __m512 ld16(const float* p) { return _mm512_loadu_ps(p); }
ASPEN_TARGET_AVX512 inline __m512 ld16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
ASPEN_TARGET_AVX512 inline __m512 ld16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
ASPEN_TARGET_AVX512 inline __m512 ld16(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Horizontal sum in a fixed order (not _mm512_reduce_add_ps: GCC 12 warns on it).
ASPEN_TARGET_AVX512 inline float hsum16(__m512 v) {
  __m512 s = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 b = _mm512_castps512_ps128(s);
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// [N, K]: R rows of w (from n) against MB rows of x (from m0); one vector
// accumulator per (row of x, row of w), each summing 16-lane partials over k
// in order, then a fixed horizontal sum. Each w row is its own stream.
template <class W, int MB, int R>
ASPEN_TARGET_AVX512 void nk_tile_avx512(const Job& j, int64_t m0, int64_t n) {
  const int64_t K = j.K;
  const W* w = static_cast<const W*>(j.w) + n * K;
  const float* x = j.x + m0 * K;
  __m512 acc[MB][R];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T1);
      wv[r] = ld16(w + r * K + k);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * K + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
  if (k < K) {
    const __mmask16 mask = __mmask16((1u << (K - k)) - 1);
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = ld16(w + r * K + k, mask);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * K + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      j.y[(m0 + m) * j.N + n + r] = hsum16(acc[m][r]) + (j.bias ? j.bias[n + r] : 0.0f);
}

// NOTE [bf16 pairs]: a 64-byte load holds 32 bf16 weights; shifting each
// 32-bit lane left by 16 gives the even elements as exact f32, masking off the
// low half gives the odd ones. Against x split the same way (Job::xp) that is
// one load and two single-cycle ops per two FMAs, instead of two loads, two
// widening shuffles and two shifts (the f32 path's conversion of 16 at a time).
// Lane i adds each pair's odd element before its even one: VDPBF16PS's order
// (NOTE [gemv bf16 dot]), so its kernels give these bits.
template <int MB, int R, bool Packed = false>
ASPEN_TARGET_AVX512 void nk_tile_bf16_avx512(const Job& j, int64_t m0, int64_t n) {
  static_assert(!Packed || R == 8, "packed groups are 8 rows");
  const int64_t K = j.K, Kp = j.Kp;
  const bf16* w = static_cast<const bf16*>(j.w) + n * K;
  const float* x = j.xp + m0 * Kp;
  const __m512i high = _mm512_set1_epi32(int32_t(0xffff0000u));
  __m512 acc[MB][R];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mask = K - k >= 32 ? ~__mmask32(0) : __mmask32((1u << (K - k)) - 1);
    __m512 lo[R], hi[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (!Packed) _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T1);
      const __m512i v = _mm512_maskz_loadu_epi16(mask, Packed ? packed_row(w, K, r, k) : w + r * K + k);
      lo[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      hi[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xe = _mm512_loadu_ps(x + m * Kp + k), xo = _mm512_loadu_ps(x + m * Kp + k + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(xe, lo[r], _mm512_fmadd_ps(xo, hi[r], acc[m][r]));
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      j.y[(m0 + m) * j.N + n + r] = hsum16(acc[m][r]) + (j.bias ? j.bias[n + r] : 0.0f);
}

template <int R>
ASPEN_TARGET_AVX512 void nk_rows_bf16_avx512(const Job& j, int64_t n) {
  static constexpr NkTile tiles[4] = {nk_tile_bf16_avx512<1, R>, nk_tile_bf16_avx512<2, R>,
                                      nk_tile_bf16_avx512<3, R>, nk_tile_bf16_avx512<4, R>};
  for (int64_t m0 = 0; m0 < j.M; m0 += 4) tiles[std::min<int64_t>(4, j.M - m0) - 1](j, m0, n);
}

// M > 1: up to 8 rows of x against R weight rows, so each weight vector is loaded (and widened) once for all of
// them (NOTE [gemv row blocks]); an output's sum is the same whatever the tile, so are its bits.
template <NkTile... Tiles>
ASPEN_TARGET_AVX512 void nk_rows8_avx512(const Job& j, int64_t n) {
  static constexpr NkTile tiles[8] = {Tiles...};
  for (int64_t m0 = 0; m0 < j.M; m0 += 8) tiles[std::min<int64_t>(8, j.M - m0) - 1](j, m0, n);
}

ASPEN_TARGET_AVX512 void nk_bf16_avx512_impl(const Job& j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (j.packed)  // n0 on a group's first row; 2 rows of x at a time (16 accumulators)
    for (; n + 8 <= std::min(n1, j.N / 8 * 8); n += 8)
      for (int64_t m0 = 0; m0 < j.M; m0 += 2)
        (j.M - m0 >= 2 ? nk_tile_bf16_avx512<2, 8, true> : nk_tile_bf16_avx512<1, 8, true>)(j, m0, n);
  if (j.M > 1) {
    for (; n + 2 <= n1; n += 2)
      nk_rows8_avx512<nk_tile_bf16_avx512<1, 2>, nk_tile_bf16_avx512<2, 2>, nk_tile_bf16_avx512<3, 2>,
                      nk_tile_bf16_avx512<4, 2>, nk_tile_bf16_avx512<5, 2>, nk_tile_bf16_avx512<6, 2>,
                      nk_tile_bf16_avx512<7, 2>, nk_tile_bf16_avx512<8, 2>>(j, n);
  }
  if (j.M == 1)
    for (; n + 8 <= n1; n += 8) nk_rows_bf16_avx512<8>(j, n);
  for (; n + 4 <= n1; n += 4) nk_rows_bf16_avx512<4>(j, n);
  for (; n < n1; ++n) nk_rows_bf16_avx512<1>(j, n);
}

// Rows of x are taken 4 at a time (16 accumulators); the first block streams
// the R weight rows from memory, the next blocks find them in L1/L2.
template <class W, int R>
ASPEN_TARGET_AVX512 void nk_rows_avx512(const Job& j, int64_t n) {
  static constexpr NkTile tiles[4] = {nk_tile_avx512<W, 1, R>, nk_tile_avx512<W, 2, R>, nk_tile_avx512<W, 3, R>,
                                      nk_tile_avx512<W, 4, R>};
  for (int64_t m0 = 0; m0 < j.M; m0 += 4) tiles[std::min<int64_t>(4, j.M - m0) - 1](j, m0, n);
}

template <class W>
ASPEN_TARGET_AVX512 void nk_avx512(const Job& j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (j.M > 1)
    for (; n + 3 <= n1; n += 3)
      nk_rows8_avx512<nk_tile_avx512<W, 1, 3>, nk_tile_avx512<W, 2, 3>, nk_tile_avx512<W, 3, 3>,
                      nk_tile_avx512<W, 4, 3>, nk_tile_avx512<W, 5, 3>, nk_tile_avx512<W, 6, 3>,
                      nk_tile_avx512<W, 7, 3>, nk_tile_avx512<W, 8, 3>>(j, n);
  if (j.M == 1)  // 8 weight rows in flight: more streams keep more lines in flight (bench/common.h's sweep)
    for (; n + 8 <= n1; n += 8) nk_rows_avx512<W, 8>(j, n);
  for (; n + 4 <= n1; n += 4) nk_rows_avx512<W, 4>(j, n);
  for (; n < n1; ++n) nk_rows_avx512<W, 1>(j, n);
}

// [K, N], one row of x: y[p0:p1) accumulates KB weight rows at a time (the broadcasts of x hoisted out of the
// column loop). y[n] gets its k terms in order whatever KB is, so the blocking changes speed, not results.
template <class W, int KB>
ASPEN_TARGET_AVX512 void kn_block_avx512(const Job& j, int64_t k, int64_t p0, int64_t p1) {
  const int64_t N = j.N;
  const W* w = static_cast<const W*>(j.w) + k * N;
  __m512 xb[KB];
#pragma GCC unroll 8
  for (int i = 0; i < KB; ++i) xb[i] = _mm512_set1_ps(j.x[k + i]);
  float* y = j.y;
  int64_t c = p0;
  for (; c + 16 <= p1; c += 16) {
    __m512 a = _mm512_loadu_ps(y + c);
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T1);
      a = _mm512_fmadd_ps(xb[i], ld16(w + i * N + c), a);
    }
    _mm512_storeu_ps(y + c, a);
  }
  if (c < p1) {
    const __mmask16 mask = __mmask16((1u << (p1 - c)) - 1);
    __m512 a = _mm512_maskz_loadu_ps(mask, y + c);
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) a = _mm512_fmadd_ps(xb[i], ld16(w + i * N + c, mask), a);
    _mm512_mask_storeu_ps(y + c, mask, a);
  }
}

// One block of weight rows [k0, k1) for MB rows of x from m0, over the columns [n0, n1): strips of 48, the last
// one masked (NV vectors of 16 with mask `last` on its last).
template <class W, int MB, int NV>
ASPEN_TARGET_AVX512 inline void kn_strip_avx512(const Job& j, const float* x, float* y, const W* w, int64_t k0,
                                                int64_t k1, __mmask16 last) {
  const int64_t N = j.N, ldx = j.ldx;
  __m512 acc[MB][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[m][v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : __mmask16(0xffff), y + m * N + 16 * v);
  for (int64_t k = k0; k < k1; ++k) {
    const W* wr = w + k * N;
    __m512 wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + kKnBlockRows * N + 16 * v), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(wr + kKnAhead + 16 * v), _MM_HINT_T0);
      wv[v] = ld16(wr + 16 * v, v == NV - 1 ? last : __mmask16(0xffff));
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * ldx + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(xb, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(y + m * N + 16 * v, v == NV - 1 ? last : __mmask16(0xffff), acc[m][v]);
}

template <class W, int MB>
ASPEN_TARGET_AVX512 void kn_strips_avx512(const Job& j, int64_t m0, int64_t k0, int64_t k1, int64_t n0, int64_t n1) {
  const float* x = j.x + m0 * j.ldx;
  float* y = j.y + m0 * j.N;
  const W* w = static_cast<const W*>(j.w);
  int64_t c = n0;
  for (; c + 48 <= n1; c += 48) kn_strip_avx512<W, MB, 3>(j, x, y + c, w + c, k0, k1, 0xffff);
  if (c == n1) return;
  const int64_t width = n1 - c, nv = (width + 15) / 16;
  const __mmask16 last = __mmask16((1u << (width - 16 * (nv - 1))) - 1);
  if (nv == 1) kn_strip_avx512<W, MB, 1>(j, x, y + c, w + c, k0, k1, last);
  else if (nv == 2) kn_strip_avx512<W, MB, 2>(j, x, y + c, w + c, k0, k1, last);
  else kn_strip_avx512<W, MB, 3>(j, x, y + c, w + c, k0, k1, last);
}

template <class W>
ASPEN_TARGET_AVX512 void kn_rows_avx512(const Job& j, int64_t n0, int64_t n1) {
  static constexpr KnStrips strips[8] = {kn_strips_avx512<W, 1>, kn_strips_avx512<W, 2>, kn_strips_avx512<W, 3>,
                                         kn_strips_avx512<W, 4>, kn_strips_avx512<W, 5>, kn_strips_avx512<W, 6>,
                                         kn_strips_avx512<W, 7>, kn_strips_avx512<W, 8>};
  kn_row_blocks(j, n0, n1, strips, 8);
}

// One row of x against bf16 [K, N] (NOTE [bf16 pairs]): 32 columns per load,
// the even columns' sums and the odd columns' kept apart in a panel of
// accumulators (per 32 columns: 16 even, then 16 odd) and put back in order
// at the end. Each column still starts from its bias and adds its k terms in
// order, as every [K, N] path does.
template <int KB, bool Packed = false>
ASPEN_TARGET_AVX512 void kn_bf16_block_avx512(const Job& j, int64_t k, int64_t p0, int64_t p1, float* acc) {
  static_assert(!Packed || KB == 8, "packed blocks are 8 rows");
  const int64_t N = j.N;
  const bf16* w = static_cast<const bf16*>(j.w) + k * N;
  const __m512i high = _mm512_set1_epi32(int32_t(0xffff0000u));
  __m512 xb[KB];
#pragma GCC unroll 8
  for (int i = 0; i < KB; ++i) xb[i] = _mm512_set1_ps(j.x[k + i]);
  for (int64_t c = p0; c < p1; c += 32, acc += 32) {
    const __mmask32 mask = p1 - c >= 32 ? ~__mmask32(0) : __mmask32((1u << (p1 - c)) - 1);
    __m512 e = _mm512_load_ps(acc), o = _mm512_load_ps(acc + 16);
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) {
      if (!Packed) _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T1);
      const __m512i v = _mm512_maskz_loadu_epi16(mask, Packed ? packed_row(w, N, i, c) : w + i * N + c);
      e = _mm512_fmadd_ps(xb[i], _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), e);
      o = _mm512_fmadd_ps(xb[i], _mm512_castsi512_ps(_mm512_and_si512(v, high)), o);
    }
    _mm512_store_ps(acc, e);
    _mm512_store_ps(acc + 16, o);
  }
}

ASPEN_TARGET_AVX512 void kn_bf16_row_avx512(const Job& j, int64_t n0, int64_t n1) {
  constexpr int64_t P = 4096;  // kn_panel(1)
  alignas(64) float acc[P];
  // Column c of the panel sits at slot(c - p0).
  auto slot = [](int64_t off) { return off / 32 * 32 + (off % 2) * 16 + off % 32 / 2; };
  for (int64_t p0 = n0; p0 < n1; p0 += P) {
    const int64_t p1 = std::min(n1, p0 + P);
    std::fill(acc + (p1 - p0 - 1) / 32 * 32, acc + (p1 - p0 + 31) / 32 * 32, 0.0f);  // the last chunk's spare lanes
    for (int64_t c = p0; c < p1; ++c) acc[slot(c - p0)] = j.bias ? j.bias[c] : 0.0f;
    int64_t k = 0;
    if (j.packed)
      for (; k + 8 <= j.K; k += 8) kn_bf16_block_avx512<8, true>(j, k, p0, p1, acc);
    for (; k + 8 <= j.K; k += 8) kn_bf16_block_avx512<8>(j, k, p0, p1, acc);
    for (; k < j.K; ++k) kn_bf16_block_avx512<1>(j, k, p0, p1, acc);
    for (int64_t c = p0; c < p1; ++c) j.y[c] = acc[slot(c - p0)];
  }
}

template <class W>
ASPEN_TARGET_AVX512 void kn_avx512(const Job& j, int64_t n0, int64_t n1) {
  if (j.M > 1) return kn_rows_avx512<W>(j, n0, n1);
  if constexpr (std::is_same_v<W, bf16>) return kn_bf16_row_avx512(j, n0, n1);
  // One row of x: 8 weight rows at once, y's panel in L1.
  const int64_t K = j.K, P = kn_panel(1);
  for (int64_t p0 = n0; p0 < n1; p0 += P) {
    const int64_t p1 = std::min(n1, p0 + P);
    for (int64_t n = p0; n < p1; ++n) j.y[n] = j.bias ? j.bias[n] : 0.0f;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) kn_block_avx512<W, 8>(j, k, p0, p1);
    for (; k < K; ++k) kn_block_avx512<W, 1>(j, k, p0, p1);
  }
}

// NOTE [gemv bf16 dot]: with bf16 weights, M > 1 rows of x and f32 FMAs the products are bound by the FMAs (16
// flops per 2 weight bytes at M = 8: above what a 2-core Zen 4 does at its read rate). VDPBF16PS does two
// multiply-adds per lane: acc += a[2i+1]·b[2i+1], then acc += a[2i]·b[2i], each rounded to f32, with exact
// products of bf16 values. Fed so that it adds each output's k terms in the order the FMA kernels do, with x's
// values already bf16 (x_bf16: the mixed matmul rounds them) the result has the FMA kernels' bits (the
// instruction flushes denormals: there alone they may differ).
//   [K, N]: rows k and k + 1 of a 32-column strip interleaved by one VPERMT2W per 16 columns (shared by the
//   MB rows of x), x's pair broadcast as one dword; blocks and strips as NOTE [gemv row blocks]; an odd last
//   row of a block by a widened FMA.
//   [N, K]: 32 k of a weight row as loaded against x's rows in bf16; lane i sums the pairs (2i + 1, then 2i)
//   of each 32-chunk in order, as the pairs kernel's lane does (NOTE [bf16 pairs]), then the same horizontal
//   sum. (Swapping each pair's halves instead, to keep the pairs kernel's first order, cost a VPROLD per
//   weight vector per 2 rows of x: the head at M = 8 ran at half the speed.)

template <int MB, int NV>
ASPEN_TARGET_AVX512_BF16 inline void kn_dot_strip(const Job& j, int64_t m0, float* y, const bf16* w, int64_t k0,
                                                  int64_t k1, __mmask32 cols, __m512i idx_lo, __m512i idx_hi) {
  const int64_t N = j.N;
  const __mmask16 mv[2] = {__mmask16(cols), __mmask16(cols >> 16)};
  __m512 acc[MB][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_maskz_loadu_ps(mv[v], y + m * N + 16 * v);
  const uint32_t* xd = j.xd + m0 * j.ldxd;
  int64_t k = k0;
  for (; k + 2 <= k1; k += 2) {
    const bf16* wr = w + k * N;
    _mm_prefetch(reinterpret_cast<const char*>(wr + kKnBlockRows * N), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(wr + (kKnBlockRows + 1) * N), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(wr + kKnAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wr + N + kKnAhead), _MM_HINT_T0);
    const __m512i a = _mm512_maskz_loadu_epi16(cols, wr), b = _mm512_maskz_loadu_epi16(cols, wr + N);
    __m512bh p[NV];
    p[0] = (__m512bh)_mm512_permutex2var_epi16(a, idx_lo, b);
    if constexpr (NV == 2) p[1] = (__m512bh)_mm512_permutex2var_epi16(a, idx_hi, b);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int32_t(xd[m * j.ldxd + k / 2]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], p[v], xb);
    }
  }
  if (k < k1) {  // an odd last row
    __m512 wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = ld16(w + k * N + 16 * v, mv[v]);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xb = _mm512_set1_ps(j.x[(m0 + m) * j.ldx + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(xb, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(y + m * N + 16 * v, mv[v], acc[m][v]);
}

// VPERMT2W's indices for a strip's pair vectors: word t holds row k + 1's column t / 2 in the even words (index
// 32 + : the second operand), row k's in the odd ones; `hi` the same for columns 16-31. Made once.
struct PairIndex {
  alignas(64) int16_t lo[32], hi[32];
};
constexpr PairIndex make_pair_index() {
  PairIndex p{};
  for (int t = 0; t < 32; ++t) {
    p.lo[t] = int16_t(t % 2 ? t / 2 : 32 + t / 2);
    p.hi[t] = int16_t(p.lo[t] + 16);
  }
  return p;
}
constexpr PairIndex kPairIndex = make_pair_index();

template <int MB>
ASPEN_TARGET_AVX512_BF16 void kn_dot_strips(const Job& j, int64_t m0, int64_t k0, int64_t k1, int64_t n0,
                                            int64_t n1) {
  const __m512i idx_lo = _mm512_load_si512(kPairIndex.lo), idx_hi = _mm512_load_si512(kPairIndex.hi);
  float* y = j.y + m0 * j.N;
  const bf16* w = static_cast<const bf16*>(j.w);
  int64_t c = n0;
  for (; c + 32 <= n1; c += 32) kn_dot_strip<MB, 2>(j, m0, y + c, w + c, k0, k1, ~__mmask32(0), idx_lo, idx_hi);
  if (c == n1) return;
  const __mmask32 cols = __mmask32((uint64_t(1) << (n1 - c)) - 1);
  if (n1 - c <= 16) kn_dot_strip<MB, 1>(j, m0, y + c, w + c, k0, k1, cols, idx_lo, idx_hi);
  else kn_dot_strip<MB, 2>(j, m0, y + c, w + c, k0, k1, cols, idx_lo, idx_hi);
}

ASPEN_TARGET_AVX512_BF16 void kn_dot(const Job& j, int64_t n0, int64_t n1) {
  static constexpr KnStrips strips[8] = {kn_dot_strips<1>, kn_dot_strips<2>, kn_dot_strips<3>, kn_dot_strips<4>,
                                         kn_dot_strips<5>, kn_dot_strips<6>, kn_dot_strips<7>, kn_dot_strips<8>};
  kn_row_blocks(j, n0, n1, strips, 8);
}

// out[i] = hsum16(a[i]) for 16 vectors at once, bit for bit: hsum16 adds lanes at distance 8, then 4, 2 and 1;
// so does this, pairing the vectors' halves at each step (two shuffles and an add per pair) instead of
// reducing each alone (5 shuffles and 4 adds each). Lane 4b + t of the last vector holds a[4t + b].
ASPEN_TARGET_AVX512 inline void hsum16x16(const __m512 (&a)[16], float* out) {
  __m512 c[8], d[4], e[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p)  // distance 8: c[p] = a[2p]'s 8 partial sums, then a[2p + 1]'s
    c[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q)  // distance 4: block b of d[q] holds a[4q + b]'s 4 partial sums
    d[q] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * q], c[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[2 * q], c[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
  for (int s = 0; s < 2; ++s)  // distance 2: block b of e[s] holds a[8s + b]'s 2, then a[8s + 4 + b]'s
    e[s] = _mm512_add_ps(_mm512_shuffle_ps(d[2 * s], d[2 * s + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(d[2 * s], d[2 * s + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  alignas(64) float f[16];  // distance 1
  _mm512_store_ps(f, _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1))));
  for (int i = 0; i < 16; ++i) out[i] = f[4 * (i % 4) + i / 4];
}

template <int MB, int R, bool Packed = false>
ASPEN_TARGET_AVX512_BF16 void nk_dot_tile(const Job& j, int64_t m0, int64_t n) {
  static_assert(!Packed || R == 8, "packed groups are 8 rows");
  const int64_t K = j.K, Kp = j.Kp;
  const bf16* w = static_cast<const bf16*>(j.w) + n * K;
  const bf16* x = j.xs + m0 * Kp;
  __m512 acc[MB * R];
#pragma GCC unroll 16
  for (int i = 0; i < MB * R; ++i) acc[i] = _mm512_setzero_ps();
  auto step = [&](const bf16* const (&row)[R], int64_t k, __mmask32 mask) ASPEN_TARGET_AVX512_BF16 {
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, row[r]);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * Kp + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m * R + r] = _mm512_dpbf16_ps(acc[m * R + r], wv[r], xv);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {  // whole chunks: a packed group's rows are 32 apart
    const bf16* row[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      row[r] = Packed ? w + k * 8 + r * 32 : w + r * K + k;
      // Ahead of the loads (4 KiB along a packed stream; the next tile's rows 512 B on): at M = 8 the products
      // take about as long as the reads, and the hardware's prefetch alone left them in turn (head 17.5 -> 20
      // GB/s packed, 14.6 -> 17.9 unpacked, 2 threads, Zen 4).
      _mm_prefetch(reinterpret_cast<const char*>(Packed ? row[r] + 2048 : w + (r + R) * K + k + 256), _MM_HINT_T0);
    }
    step(row, k, ~__mmask32(0));
  }
  if (k < K) {
    const bf16* row[R];
    for (int r = 0; r < R; ++r) row[r] = Packed ? packed_row(w, K, r, k) : w + r * K + k;
    step(row, k, __mmask32((1u << (K - k)) - 1));
  }
  float sum[MB * R];
  if constexpr (MB * R == 16) {
    hsum16x16(acc, sum);
  } else {
    for (int i = 0; i < MB * R; ++i) sum[i] = hsum16(acc[i]);
  }
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) j.y[(m0 + m) * j.N + n + r] = sum[m * R + r] + (j.bias ? j.bias[n + r] : 0.0f);
}

// 8 weight rows in flight (each its own stream: fewer left the head at ~0.35 of the read sweep), against 2 rows of x
// at a time (16 accumulators; the rows are read again from L1 for the next 2).
ASPEN_TARGET_AVX512_BF16 void nk_dot(const Job& j, int64_t n0, int64_t n1) {
  static constexpr NkTile by8[2] = {nk_dot_tile<1, 8>, nk_dot_tile<2, 8>};
  static constexpr NkTile by1[8] = {nk_dot_tile<1, 1>, nk_dot_tile<2, 1>, nk_dot_tile<3, 1>, nk_dot_tile<4, 1>,
                                    nk_dot_tile<5, 1>, nk_dot_tile<6, 1>, nk_dot_tile<7, 1>, nk_dot_tile<8, 1>};
  static constexpr NkTile packed8[2] = {nk_dot_tile<1, 8, true>, nk_dot_tile<2, 8, true>};
  int64_t n = n0;
  if (j.packed)  // n0 on a group's first row
    for (; n + 8 <= std::min(n1, j.N / 8 * 8); n += 8)
      for (int64_t m0 = 0; m0 < j.M; m0 += 2) packed8[std::min<int64_t>(2, j.M - m0) - 1](j, m0, n);
  for (; n + 8 <= n1; n += 8)
    for (int64_t m0 = 0; m0 < j.M; m0 += 2) by8[std::min<int64_t>(2, j.M - m0) - 1](j, m0, n);
  for (; n < n1; ++n)
    for (int64_t m0 = 0; m0 < j.M; m0 += 8) by1[std::min<int64_t>(8, j.M - m0) - 1](j, m0, n);
}

}  // namespace

void nk_f32_avx512(const Job& j, int64_t n0, int64_t n1) { nk_avx512<float>(j, n0, n1); }
void nk_bf16_avx512(const Job& j, int64_t n0, int64_t n1) { nk_bf16_avx512_impl(j, n0, n1); }
void kn_f32_avx512(const Job& j, int64_t n0, int64_t n1) { kn_avx512<float>(j, n0, n1); }
void kn_bf16_avx512(const Job& j, int64_t n0, int64_t n1) { kn_avx512<bf16>(j, n0, n1); }

void nk_bf16_dot(const Job& j, int64_t n0, int64_t n1) { nk_dot(j, n0, n1); }
void kn_bf16_dot(const Job& j, int64_t n0, int64_t n1) { kn_dot(j, n0, n1); }

}  // namespace aspen::kernels::gemv_detail
