// kernels/attention_avx512.cc: attention's block operations for AVX-512 (Skylake-SP and later, Zen 4):
// the block products, the fused strips of a full tile, the softmax and gradient steps in registers and the
// decode rows. The drivers that call them are in attention.cc.
#include "kernels/attention_avx512.h"

namespace aspen::kernels::attn {

namespace {

// kWhole: all 64 columns, plain loads and stores; else mk masks each vector
// (a ragged last panel: a fully masked vector costs FMAs but touches no
// memory). The masked loads cost the whole-panel case 12 % of the backward.
template <bool kWhole>
ASPEN_TARGET_AVX512 inline __m512 load_panel(const float* p, const __mmask16* mk, int v) {
  if constexpr (kWhole)
    return _mm512_loadu_ps(p);
  else
    return _mm512_maskz_loadu_ps(mk[v], p);
}

template <int MR, bool kWhole>
ASPEN_TARGET_AVX512 void gemm_tile_512(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                       int64_t ldc, int64_t kk, const __mmask16* mk, bool accumulate) {
  __m512 acc[MR][4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v)
      acc[r][v] = accumulate ? load_panel<kWhole>(c + r * ldc + 16 * v, mk, v) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kk; ++k) {
    const float* bk = b + k * ldb;
    const __m512 bv[4] = {load_panel<kWhole>(bk, mk, 0), load_panel<kWhole>(bk + 16, mk, 1),
                          load_panel<kWhole>(bk + 32, mk, 2), load_panel<kWhole>(bk + 48, mk, 3)};
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * ars + k * aks]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      if constexpr (kWhole)
        _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
      else
        _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mk[v], acc[r][v]);
    }
}

using GemmTile512 = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                             const __mmask16*, bool);
constexpr GemmTile512 kGemmTiles512[4] = {gemm_tile_512<1, false>, gemm_tile_512<2, false>, gemm_tile_512<3, false>,
                                          gemm_tile_512<4, false>};
constexpr GemmTile512 kGemmPanels512[4] = {gemm_tile_512<1, true>, gemm_tile_512<2, true>, gemm_tile_512<3, true>,
                                           gemm_tile_512<4, true>};

// NOTE [attention fused strips]: a full tile (every row uses all kBk keys, no
// layout cut, no bias) runs 16 query rows at a time through all three steps.
// The scores come MR = 4 rows at a time from registers (s = q k^T, 4 x 64
// accumulators) into a 16 x 64 buffer, with each row's 16-lane maximum; the
// 16 rows' maxima and sums are then one in-register transpose and 15 vector
// operations each, and the 64 exponentials are independent, where row by
// row the horizontal reductions and the scalar steps between them form a
// chain of about 130 cycles per row that the block products wait on (26 %
// of the tile's time before this). o = o * alpha + p v follows in 4-row
// strips with o's rows in registers. The three-step path also writes the
// whole 64 x 64 score tile between steps: q, K^T, s, V and o (16 KiB each at
// D = 64) are more than L1 holds. Here the working set is K^T and V plus
// 16 rows of q, p and o.
template <int MR>
ASPEN_TARGET_AVX512 void strip_scores_512(const float* qs, int64_t D, const float* kt, float* s, float* rmax,
                                          const __mmask16* allow);

// NOTE [attention decode rows], AVX-512 with D = 16 * NV: q and the row's o stay in registers; 16 keys'
// scores at a time are 16 dot products accumulated lane-wise, then one 16 x 16 transpose and 15 adds (a
// key at a time, each score needed a horizontal sum); the block's exponentials are vectors.
template <int NV>
ASPEN_TARGET_AVX512 void decode_row_512(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                        const uint8_t* valid, float cs, float* out, float* lse) {
  constexpr int64_t D = 16 * NV;
  __m512 qv[NV], o[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(q + 16 * v), o[v] = _mm512_setzero_ps();
  const __m512 neg_inf = _mm512_set1_ps(kNegInf),
               lanes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  float m = kNegInf, l = 0.0f;
  for (int64_t j0 = lo; j0 < hi; j0 += kBk) {
    const int64_t n = std::min(kBk, hi - j0);
    alignas(64) float s[kBk];
    __m512 block_max = neg_inf;
    for (int64_t g = 0; g < n; g += 16) {
      __m512 acc[16];
#pragma GCC unroll 16
      for (int kk = 0; kk < 16; ++kk) {
        const float* kj = kh + std::min(j0 + g + kk, hi - 1) * D;  // past the row's end: a valid key, masked below
        acc[kk] = _mm512_mul_ps(_mm512_loadu_ps(kj), qv[0]);
#pragma GCC unroll 8
        for (int v = 1; v < NV; ++v) acc[kk] = _mm512_fmadd_ps(_mm512_loadu_ps(kj + 16 * v), qv[v], acc[kk]);
      }
      const __m512 dots = Avx512::lanes_reduce<false>(acc);
      __mmask16 live = _mm512_cmp_ps_mask(lanes, _mm512_set1_ps(float(n - g)), _CMP_LT_OQ);
      if (valid) {
        uint32_t bits = 0;
        for (int kk = 0; kk < 16 && g + kk < n; ++kk) bits |= uint32_t(valid[j0 + g + kk] != 0) << kk;
        live = __mmask16(live & bits);
      }
      const __m512 sc = _mm512_mask_blend_ps(live, neg_inf, _mm512_mul_ps(dots, _mm512_set1_ps(cs)));
      _mm512_store_ps(s + g, sc);
      block_max = _mm512_max_ps(block_max, sc);
    }
    const float bm = _mm512_reduce_max_ps(block_max);
    if (bm == kNegInf) continue;  // every key of the block masked
    if (bm > m) {                 // rescale what is summed so far (nothing yet: alpha = 2^-inf = 0)
      const __m512 alpha = _mm512_set1_ps(exp2_fast(m - bm));
      l *= exp2_fast(m - bm);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) o[v] = _mm512_mul_ps(o[v], alpha);
      m = bm;
    }
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t g = 0; g < n; g += 16) {
      const __m512 p = Avx512::exp2_512(_mm512_sub_ps(_mm512_load_ps(s + g), mv));  // -inf: 0
      _mm512_store_ps(s + g, p);
      sum = _mm512_add_ps(sum, p);
    }
    l += _mm512_reduce_add_ps(sum);
    for (int64_t c = 0; c < n; ++c) {
      if (s[c] == 0.0f) continue;
      const __m512 p = _mm512_set1_ps(s[c]);
      const float* vj = vh + (j0 + c) * D;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) o[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16 * v), o[v]);
    }
  }
  if (m == kNegInf) {  // nothing allowed: out 0, lse -inf (as the tiles)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + 16 * v, _mm512_setzero_ps());
    *lse = kNegInf;
    return;
  }
  const __m512 inv = _mm512_set1_ps(1.0f / l);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + 16 * v, _mm512_mul_ps(o[v], inv));
  *lse = m / kLog2e + std::log(l);
}

// MR rows of s = q k^T (leading dimension kBk) and their 16-lane maxima rmax (leading dimension 16); with
// `allow` (4 masks per row), the lanes it clears are -inf.
template <int MR>
ASPEN_TARGET_AVX512 void strip_scores_512(const float* qs, int64_t D, const float* kt, float* s, float* rmax,
                                          const __mmask16* allow) {
  __m512 acc[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < D; ++k) {
    const float* bk = kt + k * kBk;
    const __m512 bv[4] = {_mm512_loadu_ps(bk), _mm512_loadu_ps(bk + 16), _mm512_loadu_ps(bk + 32),
                          _mm512_loadu_ps(bk + 48)};
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(qs[r * D + k]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  if (allow) {
    const __m512 neg_inf = _mm512_set1_ps(kNegInf);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_mask_blend_ps(allow[4 * r + v], neg_inf, acc[r][v]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_store_ps(s + r * kBk + 16 * v, acc[r][v]);
    _mm512_store_ps(rmax + 16 * r,
                    _mm512_max_ps(_mm512_max_ps(acc[r][0], acc[r][1]), _mm512_max_ps(acc[r][2], acc[r][3])));
  }
}

using StripScores512 = void (*)(const float*, int64_t, const float*, float*, float*, const __mmask16*);
constexpr StripScores512 kStripScores512[4] = {strip_scores_512<1>, strip_scores_512<2>, strip_scores_512<3>,
                                               strip_scores_512<4>};

// Avx512::lanes_reduce over 16 rows of 16 floats at x.
template <bool kMax>
ASPEN_TARGET_AVX512 __m512 lanes_reduce_512(const float* x) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(x + 16 * i);
  return Avx512::lanes_reduce<kMax>(r);
}

// NOTE [attention fused strips]: rows <= 16 of a tile; `allow` (4 masks per row) or null (every key).
ASPEN_TARGET_AVX512 void fused_group_512(const float* qs, int64_t D, const float* kt, const float* vb, int64_t rows,
                                         const __mmask16* allow, float* m, float* l, float* o) {
  alignas(64) float s[16 * kBk];
  alignas(64) float part[16 * 16] = {};  // per row: 16-lane maxima, then 16-lane sums
  for (int64_t i = 0; i < rows; i += 4)
    kStripScores512[std::min<int64_t>(4, rows - i) - 1](qs + i * D, D, kt, s + i * kBk, part + 16 * i,
                                                        allow ? allow + 4 * i : nullptr);
  const __mmask16 live = tail_mask(rows);
  const __m512 m_old = _mm512_mask_loadu_ps(_mm512_setzero_ps(), live, m);
  // A row's reference m moves only when the block's maximum passes it by more than kLazyRescale (the first
  // block always: m = -inf): p = 2^(s - m) <= 2^kLazyRescale, far inside f32, and o and l need no rescaling
  // (alpha = 1) on most blocks of a long row. out = o / l and lse = m + log2 l hold for any reference.
  // With `allow`, a row may have no key yet (m stays -inf: its sub below is NaN, not > kLazyRescale, so
  // alpha is 1) and its exponentials are taken against 0 (p = 2^-inf = 0).
  const __m512 m_max = _mm512_max_ps(m_old, lanes_reduce_512<true>(part));
  const __mmask16 moved = _mm512_cmp_ps_mask(_mm512_sub_ps(m_max, m_old), _mm512_set1_ps(kLazyRescale), _CMP_GT_OQ);
  const __m512 m_new = _mm512_mask_blend_ps(moved, m_old, m_max);
  const __m512 alpha = _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.0f),  // m = -inf before the first block: 0
                                            Avx512::exp2_512(_mm512_sub_ps(m_old, m_new)));
  alignas(64) float mn[16], al[16];
  const __mmask16 empty = _mm512_cmp_ps_mask(m_new, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ);
  _mm512_store_ps(mn, _mm512_mask_blend_ps(empty, m_new, _mm512_setzero_ps()));
  _mm512_store_ps(al, alpha);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 mv = _mm512_set1_ps(mn[r]);
    __m512 p[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512 x = _mm512_sub_ps(_mm512_load_ps(s + r * kBk + 16 * v), mv);
      p[v] = allow ? Avx512::exp2_512(x) : Avx512::exp2_finite_512(x);  // -inf: 0
      _mm512_store_ps(s + r * kBk + 16 * v, p[v]);
    }
    _mm512_store_ps(part + 16 * r, _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])));
  }
  const __m512 l_old = _mm512_mask_loadu_ps(_mm512_setzero_ps(), live, l);
  _mm512_mask_storeu_ps(l, live, _mm512_fmadd_ps(l_old, alpha, lanes_reduce_512<false>(part)));
  _mm512_mask_storeu_ps(m, live, m_new);
  for (int64_t r = 0; r < rows; ++r) {  // o = o * alpha + p v
    if (al[r] == 1.0f) continue;
    const __m512 av = _mm512_set1_ps(al[r]);
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), av));
  }
  Avx512::gemm(s, kBk, 1, vb, D, o, D, rows, D, kBk, true);
}

}  // namespace

ASPEN_TARGET_AVX512 void Avx512::gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                      int64_t ldc, int64_t m, int64_t n, int64_t kk, bool accumulate) {
  for (int64_t j = 0; j < n; j += 64) {  // a 64-column panel of B stays in L1 across the rows
    if (n - j >= 64) {
      for (int64_t i = 0; i < m; i += 4)
        kGemmPanels512[std::min<int64_t>(4, m - i) - 1](a + i * ars, ars, aks, b + j, ldb, c + i * ldc + j, ldc, kk,
                                                        nullptr, accumulate);
      continue;
    }
    __mmask16 mk[4];
    for (int v = 0; v < 4; ++v) mk[v] = tail_mask(std::max<int64_t>(0, n - j - 16 * v));
    for (int64_t i = 0; i < m; i += 4)
      kGemmTiles512[std::min<int64_t>(4, m - i) - 1](a + i * ars, ars, aks, b + j, ldb, c + i * ldc + j, ldc, kk, mk,
                                                     accumulate);
  }
}

ASPEN_TARGET_AVX512 void Avx512::transpose(const float* src, int64_t cols, int64_t D, float* dst) {
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
    const int64_t nc = std::min<int64_t>(16, cols - c0);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const int64_t nd = std::min<int64_t>(16, D - d0);
      const __mmask16 md = tail_mask(nd), mc = tail_mask(nc);
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_maskz_loadu_ps(i < nc ? md : __mmask16(0), src + (c0 + std::min<int64_t>(i, nc - 1)) * D + d0);
      transpose16(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        if (j < nd) _mm512_mask_storeu_ps(dst + (d0 + j) * kBk + c0, mc, r[j]);
    }
  }
}

// NOTE [attention full tiles]: a full tile's rows take their max, probabilities and sums in registers;
// others take softmax_tile_impl, and so does a partial layout tile (it may hold rows of -inf only).
ASPEN_TARGET_AVX512 void Avx512::softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                              const float* kv, float* m, float* l, float* o, int64_t D, bool partial) {
  if (partial || D % 16 != 0 || !full_tile(rows, cols, lo, hi, kv)) {
    softmax_tile_impl(s, rows, cols, lo, hi, kv, m, l, o, D);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBk;
    __m512 x[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) x[v] = _mm512_loadu_ps(sr + 16 * v);
    const float ref = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3])));
    const float m_new = m[r] > ref ? m[r] : ref;  // finite: every score of a full tile is
    const float alpha = exp2_fast(m[r] - m_new);  // m = -inf before the first block: 0
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512 p = exp2_512(_mm512_sub_ps(x[v], mv));
      _mm512_storeu_ps(sr + 16 * v, p);
      sum = _mm512_add_ps(sum, p);
    }
    m[r] = m_new;
    l[r] = l[r] * alpha + _mm512_reduce_add_ps(sum);
    if (alpha != 1.0f) {
      float* orow = o + r * D;
      const __m512 av = _mm512_set1_ps(alpha);
      for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(orow + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), av));
    }
  }
}

// NOTE [attention full tiles] for the backward's step.
ASPEN_TARGET_AVX512 void Avx512::grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo,
                                           const int* hi, const float* kv, const float* lse2, const float* di,
                                           float cs) {
  if (!full_tile(rows, cols, lo, hi, kv)) {
    grad_tile_impl(s, dp, rows, cols, lo, hi, kv, lse2, di, cs);
    return;
  }
  const __m512 csv = _mm512_set1_ps(cs);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBk;
    float* dr = dp + r * kBk;
    const __m512 l2 = _mm512_set1_ps(lse2[r]), dir = _mm512_set1_ps(di[r]);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512 p = exp2_512(_mm512_fmsub_ps(csv, _mm512_loadu_ps(sr + 16 * v), l2));
      _mm512_storeu_ps(sr + 16 * v, p);
      _mm512_storeu_ps(dr + 16 * v, _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dr + 16 * v), dir)));
    }
  }
}

ASPEN_TARGET_AVX512 void Avx512::decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                            const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
  switch (D) {
    case 32:
      return decode_row_512<2>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 64:
      return decode_row_512<4>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 80:
      return decode_row_512<5>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 96:
      return decode_row_512<6>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 128:
      return decode_row_512<8>(q, kh, vh, lo, hi, valid, cs, out, lse);
    default:
      return decode_row_impl(q, kh, vh, lo, hi, valid, D, cs, out, lse);
  }
}

void Avx512::allow_masks(int64_t rows, const int* lo, const int* hi, const float* kv, __mmask16* allow) {
  __mmask16 valid[4] = {0, 0, 0, 0};
  for (int64_t c = 0; c < kBk; ++c)
    if (kv[c] != 0.0f) valid[c / 16] = __mmask16(valid[c / 16] | (1u << (c % 16)));
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < 4; ++v) {
      const int a = std::clamp(lo[r] - 16 * v, 0, 16), e = std::clamp(hi[r] - 16 * v, 0, 16);
      const uint32_t range = e > a ? ((1u << e) - 1u) & ~((1u << a) - 1u) : 0u;
      allow[4 * r + v] = __mmask16(range & valid[v]);
    }
}

ASPEN_TARGET_AVX512 bool Avx512::fused_tile(const float* qs, const float* kt, const float* vb, int64_t rows,
                                            int64_t cols, int64_t D, const int* lo, const int* hi, const float* kv,
                                            float* m, float* l, float* o) {
  if (D % 16 != 0 || cols != kBk) return false;
  __mmask16 allow[kBq * 4];
  const bool partial = lo != nullptr && !full_tile(rows, cols, lo, hi, kv);
  if (partial) allow_masks(rows, lo, hi, kv, allow);
  for (int64_t i = 0; i < rows; i += 16)
    fused_group_512(qs + i * D, D, kt, vb, std::min<int64_t>(16, rows - i), partial ? allow + 4 * i : nullptr, m + i,
                    l + i, o + i * D);
  return true;
}

}  // namespace aspen::kernels::attn
