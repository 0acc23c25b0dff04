// kernels/attention_avx512.h: the AVX-512 block operations of attention (private to kernels/attention*.cc;
// defined in attention_avx512.cc, except the in-register helpers below). Call only when active_isa() >=
// Isa::avx512.
#pragma once

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic
// headers as maybe-uninitialized; the warning is silenced for those lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/attention_internal.h"
#include "kernels/cpu.h"

namespace aspen::kernels::attn {

ASPEN_TARGET_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

struct Avx512 {
  // NOTE [attention fused strips]: false when D is not a multiple of 16 or the tile has fewer than kBk keys.
  // lo, hi and kv null: every row may use every key (the caller knows); else the rows' ranges and the keys'
  // validity, applied as -inf.
  ASPEN_TARGET_AVX512 static bool fused_tile(const float* qs, const float* kt, const float* vb, int64_t rows,
                                             int64_t cols, int64_t D, const int* lo, const int* hi, const float* kv,
                                             float* m, float* l, float* o);
  // The keys each of `rows` rows may use, as 4 masks of 16 keys per row (allow[4 r + v], bit c: key 16 v + c):
  // inside [lo[r], hi[r]) and valid (kv[c] != 0). Past the tile's columns, hi keeps the bits clear.
  static void allow_masks(int64_t rows, const int* lo, const int* hi, const float* kv, __mmask16* allow);
  ASPEN_TARGET_AVX512 static void gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                       int64_t ldc, int64_t m, int64_t n, int64_t kk, bool accumulate);

  // In-register transpose of 16 rows of 16: unpack pairs of 32-bit and 64-bit
  // elements, then regroup 128-bit lanes; r[j] becomes column j.
  ASPEN_TARGET_AVX512 static void transpose16(__m512 r[16]) {
    __m512 u[16];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {  // rows 4g .. 4g + 3
      const __m512 t0 = _mm512_unpacklo_ps(r[4 * g], r[4 * g + 1]), t1 = _mm512_unpackhi_ps(r[4 * g], r[4 * g + 1]);
      const __m512 t2 = _mm512_unpacklo_ps(r[4 * g + 2], r[4 * g + 3]);
      const __m512 t3 = _mm512_unpackhi_ps(r[4 * g + 2], r[4 * g + 3]);
      // u[4g + k], lane L: column 4L + k of rows 4g .. 4g + 3
      u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
      u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
      u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
      u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512 x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
      const __m512 y0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44);
      const __m512 y1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
      r[k] = _mm512_shuffle_f32x4(x0, y0, 0x88);
      r[4 + k] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
      r[8 + k] = _mm512_shuffle_f32x4(x1, y1, 0x88);
      r[12 + k] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
    }
  }

  // Lane i of the result: the maximum (kMax) or the sum of the 16 lanes of r[i] (r is overwritten).
  template <bool kMax>
  ASPEN_TARGET_AVX512 static __m512 lanes_reduce(__m512 r[16]) {
    transpose16(r);
#pragma GCC unroll 8
    for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
      for (int i = 0; i < w; ++i) r[i] = kMax ? _mm512_max_ps(r[i], r[i + w]) : _mm512_add_ps(r[i], r[i + w]);
    return r[0];
  }

  ASPEN_TARGET_AVX512 static void transpose(const float* src, int64_t cols, int64_t D, float* dst);

  // 2^f for f in [-0.5, 0.5]: exp2_fast's polynomial on 16 lanes.
  ASPEN_TARGET_AVX512 static __m512 exp2_poly_512(__m512 f) {
    __m512 p = _mm512_set1_ps(kP6);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP1));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP0));
  }
  // exp2_512 for finite x only (no clamping: vscalefps takes any n; -inf would give NaN).
  ASPEN_TARGET_AVX512 static __m512 exp2_finite_512(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_scalef_ps(exp2_poly_512(_mm512_sub_ps(x, n)), n);
  }
  // exp2_fast on 16 lanes: the same polynomial, 2^n by vscalefps; x < -126 (and -inf) flushes to +0.
  ASPEN_TARGET_AVX512 static __m512 exp2_512(__m512 x) {
    const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(127.0f));
    const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
    return _mm512_maskz_scalef_ps(__mmask16(~under), exp2_poly_512(_mm512_sub_ps(xc, n)), n);
  }

  // NOTE [attention full tiles]: a full tile's rows take their max, probabilities and sums in registers;
  // others take softmax_tile_impl, and so does a partial layout tile (it may hold rows of -inf only).
  ASPEN_TARGET_AVX512 static void softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                               const float* kv, float* m, float* l, float* o, int64_t D, bool partial);
  ASPEN_TARGET_AVX512 static void decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                             const uint8_t* valid, int64_t D, float cs, float* out, float* lse);
  // NOTE [attention full tiles] for the backward's step.
  ASPEN_TARGET_AVX512 static void grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo,
                                            const int* hi, const float* kv, const float* lse2, const float* di,
                                            float cs);
};

}  // namespace aspen::kernels::attn
