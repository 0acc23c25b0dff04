// kernels/attention_avx2.cc: attention's block operations for AVX2 + FMA: the block products, the softmax
// and gradient steps of full tiles in registers, the decode rows. The drivers that call them are in
// attention.cc; the other tiles take the shared loops of attention_internal.h, compiled here for 8 lanes.
//
// Before this variant such CPUs ran the portable one at the baseline ISA (SSE2, no FMA): attention was 18 %
// of a GPT-2 124M training step on a Zen 3, at about 25 GFLOP/s.
#include "kernels/attention_avx2.h"

#include <algorithm>

namespace aspen::kernels::attn {

namespace {

ASPEN_TARGET_AVX2 inline __m256i tail_mask8(int64_t left) {
  const int n = int(std::clamp<int64_t>(left, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <bool kWhole>
ASPEN_TARGET_AVX2 inline __m256 load_panel256(const float* p, const __m256i* mk, int v) {
  if constexpr (kWhole)
    return _mm256_loadu_ps(p);
  else
    return _mm256_maskload_ps(p, mk[v]);
}

// The block product keeps MR rows x 16 columns of C (two vectors per row, at most 12 accumulators of the 16
// ymm registers) over k. kWhole: all 16 columns, plain loads and stores; else mk masks each vector (a ragged
// last panel). AMD's masked stores (vmaskmovps to memory) are microcoded, one per ~12 cycles on Zen 2-4: a
// tile's 12 of them cost about a third of its 64 k-steps of FMAs.
template <int MR, bool kWhole>
ASPEN_TARGET_AVX2 void gemm_tile_256(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                     int64_t ldc, int64_t kk, const __m256i* mk, bool accumulate) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v)
      acc[r][v] = accumulate ? load_panel256<kWhole>(c + r * ldc + 8 * v, mk, v) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kk; ++k) {
    const float* bk = b + k * ldb;
    const __m256 b0 = load_panel256<kWhole>(bk, mk, 0), b1 = load_panel256<kWhole>(bk + 8, mk, 1);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_set1_ps(a[r * ars + k * aks]);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      if constexpr (kWhole)
        _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
      else
        _mm256_maskstore_ps(c + r * ldc + 8 * v, mk[v], acc[r][v]);
    }
}

using GemmTile256 = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                             const __m256i*, bool);
constexpr GemmTile256 kGemmTiles256[6] = {gemm_tile_256<1, false>, gemm_tile_256<2, false>, gemm_tile_256<3, false>,
                                          gemm_tile_256<4, false>, gemm_tile_256<5, false>, gemm_tile_256<6, false>};
constexpr GemmTile256 kGemmPanels256[6] = {gemm_tile_256<1, true>, gemm_tile_256<2, true>, gemm_tile_256<3, true>,
                                           gemm_tile_256<4, true>, gemm_tile_256<5, true>, gemm_tile_256<6, true>};

// exp2_fast on 8 lanes: the same rounding (to nearest, ties to even), polynomial and exponent add, so the
// same value; x < -126 (and -inf) flushes to +0.
ASPEN_TARGET_AVX2 inline __m256 exp2_256(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(kP6);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kP0));
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ), y);
}

// In-register transpose of 8 rows of 8: r[j] becomes column j.
ASPEN_TARGET_AVX2 inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    t[2 * g] = _mm256_unpacklo_ps(r[2 * g], r[2 * g + 1]);
    t[2 * g + 1] = _mm256_unpackhi_ps(r[2 * g], r[2 * g + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3; u[4h + k], 128-bit lane L: column 4L + k
    u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}

// Lane i of the result: the maximum (kMax) or the sum of the 8 lanes of r[i] (r is overwritten).
template <bool kMax>
ASPEN_TARGET_AVX2 inline __m256 lanes_reduce8(__m256 r[8]) {
  transpose8(r);
#pragma GCC unroll 4
  for (int w = 4; w >= 1; w /= 2)
#pragma GCC unroll 4
    for (int i = 0; i < w; ++i) r[i] = kMax ? _mm256_max_ps(r[i], r[i + w]) : _mm256_add_ps(r[i], r[i + w]);
  return r[0];
}

}  // namespace

ASPEN_TARGET_AVX2 void Avx2::gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                  int64_t ldc, int64_t m, int64_t n, int64_t kk, bool accumulate) {
  for (int64_t j = 0; j < n; j += 16) {  // a 16-column panel of B stays in L1 across the rows
    if (n - j >= 16) {
      for (int64_t i = 0; i < m; i += 6)
        kGemmPanels256[std::min<int64_t>(6, m - i) - 1](a + i * ars, ars, aks, b + j, ldb, c + i * ldc + j, ldc, kk,
                                                        nullptr, accumulate);
      continue;
    }
    const __m256i mk[2] = {tail_mask8(n - j), tail_mask8(n - j - 8)};
    for (int64_t i = 0; i < m; i += 6)
      kGemmTiles256[std::min<int64_t>(6, m - i) - 1](a + i * ars, ars, aks, b + j, ldb, c + i * ldc + j, ldc, kk, mk,
                                                     accumulate);
  }
}

ASPEN_TARGET_AVX2 void Avx2::transpose(const float* src, int64_t cols, int64_t D, float* dst) {
  transpose_impl(src, cols, D, dst);
}

// NOTE [attention avx2 tiles]: the shared loops (softmax_tile_impl, grad_tile_impl) test every score against
// its row's range and the key's validity, and reduce each row through memory: on a Zen 4 at AVX2 they were
// 37 % of a causal forward at T = 4096, beside 49 % for the block products. A full tile (NOTE [attention full
// tiles]) needs no test: its rows' scores are loaded once into 8 vectors; the maxima and sums of 8 rows are
// one in-register transpose and 7 vector operations each (row by row, the horizontal reductions and the
// scalar steps between them form a chain), and the exponentials are independent vectors. The arithmetic is
// the shared loops' (exp2_fast's polynomial, the same reference max and rescaling); only the order of a row's
// sum differs.
ASPEN_TARGET_AVX2 void Avx2::softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                          const float* kv, float* m, float* l, float* o, int64_t D, bool partial) {
  if (partial || !full_tile(rows, cols, lo, hi, kv)) {
    softmax_tile_impl(s, rows, cols, lo, hi, kv, m, l, o, D);
    return;
  }
  for (int64_t g = 0; g < rows; g += 8) {
    const int64_t nr = std::min<int64_t>(8, rows - g);
    const __m256i live = tail_mask8(nr);
    __m256 part[8];
    for (int64_t r = 0; r < 8; ++r) {
      const float* sr = s + (g + std::min(r, nr - 1)) * kBk;  // past the group: the last row again, unused
      __m256 x = _mm256_loadu_ps(sr);
#pragma GCC unroll 7
      for (int v = 1; v < 8; ++v) x = _mm256_max_ps(x, _mm256_loadu_ps(sr + 8 * v));
      part[r] = x;
    }
    const __m256 m_old = _mm256_maskload_ps(m + g, live);
    const __m256 m_new = _mm256_max_ps(m_old, lanes_reduce8<true>(part));  // finite: every score of a full tile is
    const __m256 alpha = exp2_256(_mm256_sub_ps(m_old, m_new));            // m = -inf before the first block: 0
    alignas(32) float mn[8], al[8];
    _mm256_store_ps(mn, m_new);
    _mm256_store_ps(al, alpha);
    for (int64_t r = 0; r < 8; ++r) {
      float* sr = s + (g + std::min(r, nr - 1)) * kBk;
      const __m256 mv = _mm256_set1_ps(mn[r]);
      __m256 sum = _mm256_setzero_ps();
      if (r < nr) {
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v) {
          const __m256 p = exp2_256(_mm256_sub_ps(_mm256_loadu_ps(sr + 8 * v), mv));
          _mm256_storeu_ps(sr + 8 * v, p);
          sum = _mm256_add_ps(sum, p);
        }
      }
      part[r] = sum;
    }
    const __m256 l_old = _mm256_maskload_ps(l + g, live);
    // Stores through the live mask are rare (once per 8 rows) beside the tile's loads: the masked store's
    // cost (gemm_tile_256) does not matter here.
    _mm256_maskstore_ps(l + g, live, _mm256_fmadd_ps(l_old, alpha, lanes_reduce8<false>(part)));
    _mm256_maskstore_ps(m + g, live, m_new);
    for (int64_t r = 0; r < nr; ++r) {  // o = o * alpha
      if (al[r] == 1.0f) continue;
      float* orow = o + (g + r) * D;
      const __m256 av = _mm256_set1_ps(al[r]);
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) _mm256_storeu_ps(orow + d, _mm256_mul_ps(_mm256_loadu_ps(orow + d), av));
      for (; d < D; ++d) orow[d] *= al[r];
    }
  }
}

ASPEN_TARGET_AVX2 void Avx2::decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                        const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
  decode_row_impl(q, kh, vh, lo, hi, valid, D, cs, out, lse);
}

// NOTE [attention avx2 tiles] for the backward's step.
ASPEN_TARGET_AVX2 void Avx2::grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                       const float* kv, const float* lse2, const float* di, float cs) {
  if (!full_tile(rows, cols, lo, hi, kv)) {
    grad_tile_impl(s, dp, rows, cols, lo, hi, kv, lse2, di, cs);
    return;
  }
  const __m256 csv = _mm256_set1_ps(cs);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBk;
    float* dr = dp + r * kBk;
    const __m256 l2 = _mm256_set1_ps(lse2[r]), dir = _mm256_set1_ps(di[r]);
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      const __m256 p = exp2_256(_mm256_fmsub_ps(csv, _mm256_loadu_ps(sr + 8 * v), l2));
      _mm256_storeu_ps(sr + 8 * v, p);
      _mm256_storeu_ps(dr + 8 * v, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dr + 8 * v), dir)));
    }
  }
}

}  // namespace aspen::kernels::attn
