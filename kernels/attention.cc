#include "kernels/attention.h"

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic
// headers as maybe-uninitialized; the warning is silenced for those lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

using Kind = AttentionMask::Kind;

constexpr int64_t kBq = 64;  // query rows per block
constexpr int64_t kBk = 64;  // keys per block
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLazyRescale = 8.0f;  // NOTE [attention fused strips]: how far a row's maximum may pass its reference
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 2^f on [-1/2, 1/2]: degree-6 interpolation at Chebyshev nodes (fitted for
// this file in long double, rounded to float); relative error < 8e-8 when
// evaluated in float with FMA.
constexpr float kP0 = 1.0f, kP1 = 6.931471825e-01f, kP2 = 2.402265072e-01f, kP3 = 5.550327152e-02f,
                kP4 = 9.618056938e-03f, kP5 = 1.340042800e-03f, kP6 = 1.546144485e-04f;

// 2^x for x <= 127, vectorizable under `#pragma omp simd`: x = n + f with
// n = round(x), 2^f by the polynomial, 2^n added into the exponent bits.
// Results below 2^-126 (x < -126, including -inf) flush to +0.
inline __attribute__((always_inline)) float exp2_fast(float x) {
  float xc = x < -126.0f ? -126.0f : x;
  xc = xc > 127.0f ? 127.0f : xc;
  const float shifted = xc + 12582912.0f;  // 1.5 * 2^23: rounds to an integer in the low mantissa bits
  const uint32_t n = std::bit_cast<uint32_t>(shifted) - 0x4B400000u;
  const float f = xc - (shifted - 12582912.0f);
  float p = kP6;
  p = p * f + kP5;
  p = p * f + kP4;
  p = p * f + kP3;
  p = p * f + kP2;
  p = p * f + kP1;
  p = p * f + kP0;
  const float y = std::bit_cast<float>(std::bit_cast<uint32_t>(p) + (n << 23));
  return x < -126.0f ? 0.0f : y;
}

// Key range [lo, hi) that the positional mask allows query row i of batch
// row b, within [0, S]: the kind's range, cut to the segment of position
// kv_offset + i when there are segments (seg_lo/seg_hi: [B, S], the first key
// of each key's segment and one past its last). lo and hi never decrease with
// i, so a block of rows allows at most [lo(first row), hi(last row)).
struct Geometry {
  Kind kind;
  int64_t window, window_right, offset, S;
  const int32_t* seg_lo = nullptr;
  const int32_t* seg_hi = nullptr;
  void range(int64_t b, int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t pos = offset + i;  // validated: cannot overflow
    if (kind == Kind::none) {
      *lo = 0;
      *hi = S;
    } else if (kind == Kind::causal) {
      *lo = 0;
      *hi = pos < S ? pos + 1 : S;
    } else {
      *hi = std::clamp<int64_t>(pos + window_right + 1, 0, S);
      *lo = std::clamp<int64_t>(pos - window + 1, 0, *hi);
    }
    if (seg_lo) {  // validated: pos < S
      *lo = std::max<int64_t>(*lo, seg_lo[b * S + pos]);
      *hi = std::max(*lo, std::min<int64_t>(*hi, seg_hi[b * S + pos]));
    }
  }
};

// ---------------------------------------------------------------------------
// Block operations. Each ISA provides:
//   gemm:         C[i, j] (+)= sum_k A(i, k) B[k, j] with A(i, k) = a[i * ars + k * aks]
//                 (so A may be read transposed), B and C row-major; vectorized over j.
//   transpose:    dst[d * kBk + c] = src[c * D + d] for a block of cols <= kBk keys, so
//                 that dot products with the block vectorize across keys.
//   softmax_tile: one online-softmax step of the forward (see forward_fast).
//   grad_tile:    s -> p = exp2(cs * s - lse2), dp -> ds = p * (dp - di).
// Tiles are [rows, cols] with leading dimension kBk; row r may use columns
// [lo[r], hi[r]) whose kv[c] != 0.

// The softmax steps are written once, as plain loops that vectorize under
// `#pragma omp simd`; forced inline, they compile at the ISA of each caller.
#define ASPEN_ATTN_INLINE inline __attribute__((always_inline))

// One online-softmax step of the forward: masks s (exp2-domain scores),
// updates each row's running max m and sum l, replaces s by
// p = exp2(s - m_new) and scales the row of o by alpha = exp2(m_old - m_new).
// A row with nothing allowed yet takes 0 as its reference max, so that its p
// and alpha come out 0 without a branch.
ASPEN_ATTN_INLINE void softmax_tile_impl(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                         const float* kv, float* m, float* l, float* o, int64_t D) {
  // Row reductions run in 16 lanes (columns c0 + lane), then a tree; the tiles
  // have kBk columns of storage, so lanes past `cols` stay in bounds.
  constexpr int kLanes = 16;
  float ref[kBq], alpha[kBq], sum[kBq];
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBk;
    const int a = lo[r], e = hi[r], n = int(cols);
    float part[kLanes];
    for (int j = 0; j < kLanes; ++j) part[j] = kNegInf;
    for (int c0 = 0; c0 < n; c0 += kLanes) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const int c = c0 + j;
        const float x = (c < n && c >= a && c < e && kv[c] != 0.0f) ? sr[c] : kNegInf;
        sr[c] = x;
        part[j] = part[j] > x ? part[j] : x;
      }
    }
#pragma GCC unroll 4
    for (int w = kLanes / 2; w > 0; w /= 2)
#pragma GCC unroll 8
      for (int j = 0; j < w; ++j) part[j] = part[j] > part[j + w] ? part[j] : part[j + w];
    ref[r] = part[0];
  }
#pragma omp simd
  for (int64_t r = 0; r < rows; ++r) {
    const float m_new = m[r] > ref[r] ? m[r] : ref[r];
    ref[r] = m_new == kNegInf ? 0.0f : m_new;
    alpha[r] = exp2_fast(m[r] - ref[r]);
    m[r] = m_new;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBk;
    const float mr = ref[r];
    float part[kLanes] = {};
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const float p = exp2_fast(sr[c0 + j] - mr);  // -inf past cols: p = 0
        sr[c0 + j] = p;
        part[j] += p;
      }
    }
#pragma GCC unroll 4
    for (int w = kLanes / 2; w > 0; w /= 2)
#pragma GCC unroll 8
      for (int j = 0; j < w; ++j) part[j] += part[j + w];
    sum[r] = part[0];
  }
#pragma omp simd
  for (int64_t r = 0; r < rows; ++r) l[r] = l[r] * alpha[r] + sum[r];
  for (int64_t r = 0; r < rows; ++r) {
    if (alpha[r] == 1.0f) continue;
    float* orow = o + r * D;
    const float ar = alpha[r];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) orow[d] *= ar;
  }
}

// The backward's tile step: s -> p = exp2(cs * s - lse2), dp -> ds = p * (dp - di).
ASPEN_ATTN_INLINE void grad_tile_impl(float* s, float* dp, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                      const float* kv, const float* lse2, const float* di, float cs) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBk;
    float* dr = dp + r * kBk;
    const int64_t a = lo[r], e = hi[r];
    const float l2 = lse2[r], dir = di[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const bool ok = c >= a && c < e && kv[c] != 0.0f;
      const float p = ok ? exp2_fast(cs * sr[c] - l2) : 0.0f;
      sr[c] = p;
      dr[c] = p * (dr[c] - dir);
    }
  }
}

// NOTE [attention full tiles]: a tile every row of which may use all kBk keys
// (no key padding, inside every row's range: most tiles of a long causal row)
// needs no masking pass; the AVX-512 steps then run in registers.
inline bool full_tile(int64_t rows, int64_t cols, const int* lo, const int* hi, const float* kv) {
  if (cols != kBk) return false;
  for (int64_t r = 0; r < rows; ++r)
    if (lo[r] != 0 || hi[r] != kBk) return false;
  for (int64_t c = 0; c < kBk; ++c)
    if (kv[c] == 0.0f) return false;
  return true;
}

// dst[d * kBk + c] = src[c * D + d], plain loops (the portable and AVX2 variants).
ASPEN_ATTN_INLINE void transpose_impl(const float* src, int64_t cols, int64_t D, float* dst) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t d = 0; d < D; ++d) dst[d * kBk + c] = src[c * D + d];
}

// NOTE [attention decode rows]: with a few query rows per (b, h) (decoding,
// T <= kDecodeRows) the tiles waste most of their work: a 64-row block runs
// one row, and each 64-key block is transposed for a single dot product per
// key. A row instead takes its scores directly, kBk keys at a time (one dot
// product over D per allowed key, in the exp2 domain as the tiles do), with
// the tiles' online softmax across the blocks: running max m and sum l, o
// rescaled by 2^(m_old - m_new), o += p v; then out = o / l and lse = m ln 2 +
// ln l. About 10x fewer instructions per key; K and V stream once per row;
// scratch is one block of scores on the stack.
constexpr int64_t kDecodeRows = 4;
// NOTE [attention split-KV decoding]: keys per chunk of a long decode row (a multiple of kBk).
constexpr int64_t kDecodeChunk = 1024;
int64_t decode_chunks(int64_t S) { return S > kDecodeChunk ? (S + kDecodeChunk - 1) / kDecodeChunk : 1; }

ASPEN_ATTN_INLINE void decode_row_impl(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                       const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
  float m = kNegInf, l = 0.0f;
  for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (int64_t j0 = lo; j0 < hi; j0 += kBk) {
    const int64_t n = std::min(kBk, hi - j0);
    float s[kBk];
    float block_max = kNegInf;
    for (int64_t c = 0; c < n; ++c) {
      const int64_t j = j0 + c;
      if (valid && valid[j] == 0) {
        s[c] = kNegInf;
        continue;
      }
      const float* kj = kh + j * D;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += q[d] * kj[d];
      s[c] = acc * cs;
      block_max = block_max > s[c] ? block_max : s[c];
    }
    if (block_max == kNegInf) continue;  // every key of the block masked
    if (block_max > m) {  // rescale what is summed so far (nothing yet: alpha = 2^-inf = 0)
      const float alpha = exp2_fast(m - block_max);
      l *= alpha;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) out[d] *= alpha;
      m = block_max;
    }
#pragma omp simd reduction(+ : l)
    for (int64_t c = 0; c < n; ++c) {
      const float p = exp2_fast(s[c] - m);  // a masked key: -inf, p = 0
      s[c] = p;
      l += p;
    }
    for (int64_t c = 0; c < n; ++c) {
      if (s[c] == 0.0f) continue;
      const float p = s[c];
      const float* vj = vh + (j0 + c) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) out[d] += p * vj[d];
    }
  }
  if (m == kNegInf) {  // nothing allowed: out 0, lse -inf (as the tiles)
    *lse = kNegInf;
    return;
  }
  const float inv = 1.0f / l;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) out[d] *= inv;
  *lse = m / kLog2e + std::log(l);
}

struct Portable {
  static bool fused_tile(const float*, const float*, const float*, int64_t, int64_t, int64_t, const int*, const int*,
                         const float*, float*, float*, float*) {
    return false;  // NOTE [attention fused strips]: AVX-512 only
  }
  // Four rows of C per pass over B, sharing each load of B.
  static void gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c, int64_t ldc,
                   int64_t m, int64_t n, int64_t kk, bool accumulate) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      float *c0 = c + i * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
      if (!accumulate)
        for (int64_t j = 0; j < n; ++j) c0[j] = c1[j] = c2[j] = c3[j] = 0.0f;
      for (int64_t k = 0; k < kk; ++k) {
        const float* ak = a + i * ars + k * aks;
        const float a0 = ak[0], a1 = ak[ars], a2 = ak[2 * ars], a3 = ak[3 * ars];
        const float* bk = b + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          c0[j] += a0 * bk[j];
          c1[j] += a1 * bk[j];
          c2[j] += a2 * bk[j];
          c3[j] += a3 * bk[j];
        }
      }
    }
    for (; i < m; ++i) {
      float* c0 = c + i * ldc;
      if (!accumulate) std::fill(c0, c0 + n, 0.0f);
      for (int64_t k = 0; k < kk; ++k) {
        const float a0 = a[i * ars + k * aks];
        const float* bk = b + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) c0[j] += a0 * bk[j];
      }
    }
  }

  static void transpose(const float* src, int64_t cols, int64_t D, float* dst) { transpose_impl(src, cols, D, dst); }

  static void softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi, const float* kv,
                           float* m, float* l, float* o, int64_t D, bool /*partial*/) {
    softmax_tile_impl(s, rows, cols, lo, hi, kv, m, l, o, D);
  }
  static void decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                         const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
    decode_row_impl(q, kh, vh, lo, hi, valid, D, cs, out, lse);
  }
  static void grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo, const int* hi,
                        const float* kv, const float* lse2, const float* di, float cs) {
    grad_tile_impl(s, dp, rows, cols, lo, hi, kv, lse2, di, cs);
  }
};

ASPEN_TARGET_AVX512 inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

// MR rows x 64 columns of C (four vectors), accumulated in registers over k.
// kWhole: all 64 columns, plain loads and stores; else mk masks each vector
// (a ragged last panel: a fully masked vector costs FMAs but touches no
// memory). The masked loads cost the whole-panel case 12 % of the backward.
template <bool kWhole>
ASPEN_TARGET_AVX512 inline __m512 load_panel(const float* p, const __mmask16* mk, int v) {
  if constexpr (kWhole) return _mm512_loadu_ps(p);
  else return _mm512_maskz_loadu_ps(mk[v], p);
}

template <int MR, bool kWhole>
ASPEN_TARGET_AVX512 void gemm_tile_512(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb,
                                       float* c, int64_t ldc, int64_t kk, const __mmask16* mk, bool accumulate) {
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
      if constexpr (kWhole) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
      else _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mk[v], acc[r][v]);
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

struct Avx512 {
  // NOTE [attention fused strips]: false when D is not a multiple of 16 or the tile has fewer than kBk keys.
  // lo, hi and kv null: every row may use every key (the caller knows); else the rows' ranges and the keys'
  // validity, applied as -inf.
  ASPEN_TARGET_AVX512 static bool fused_tile(const float* qs, const float* kt, const float* vb, int64_t rows,
                                             int64_t cols, int64_t D, const int* lo, const int* hi, const float* kv,
                                             float* m, float* l, float* o);
  ASPEN_TARGET_AVX512 static void gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb,
                                       float* c, int64_t ldc, int64_t m, int64_t n, int64_t kk, bool accumulate) {
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
        kGemmTiles512[std::min<int64_t>(4, m - i) - 1](a + i * ars, ars, aks, b + j, ldb, c + i * ldc + j, ldc, kk,
                                                       mk, accumulate);
    }
  }

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

  ASPEN_TARGET_AVX512 static void transpose(const float* src, int64_t cols, int64_t D, float* dst) {
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
                                               const float* kv, float* m, float* l, float* o, int64_t D,
                                               bool partial) {
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
  ASPEN_TARGET_AVX512 static void decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                      const uint8_t* valid, int64_t D, float cs, float* out, float* lse);
  // NOTE [attention full tiles] for the backward's step.
  ASPEN_TARGET_AVX512 static void grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo,
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
};

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
  const __m512 neg_inf = _mm512_set1_ps(kNegInf), lanes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                                          14, 15);
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
    if (bm > m) {  // rescale what is summed so far (nothing yet: alpha = 2^-inf = 0)
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

ASPEN_TARGET_AVX512 void Avx512::decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                            const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
  switch (D) {
    case 32: return decode_row_512<2>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 64: return decode_row_512<4>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 80: return decode_row_512<5>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 96: return decode_row_512<6>(q, kh, vh, lo, hi, valid, cs, out, lse);
    case 128: return decode_row_512<8>(q, kh, vh, lo, hi, valid, cs, out, lse);
    default: return decode_row_impl(q, kh, vh, lo, hi, valid, D, cs, out, lse);
  }
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
    for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + r * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * D + d), av));
  }
  Avx512::gemm(s, kBk, 1, vb, D, o, D, rows, D, kBk, true);
}

ASPEN_TARGET_AVX512 bool Avx512::fused_tile(const float* qs, const float* kt, const float* vb, int64_t rows,
                                            int64_t cols, int64_t D, const int* lo, const int* hi, const float* kv,
                                            float* m, float* l, float* o) {
  if (D % 16 != 0 || cols != kBk) return false;
  __mmask16 allow[kBq * 4];
  const bool partial = lo != nullptr && !full_tile(rows, cols, lo, hi, kv);
  if (partial) {
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
  for (int64_t i = 0; i < rows; i += 16)
    fused_group_512(qs + i * D, D, kt, vb, std::min<int64_t>(16, rows - i), partial ? allow + 4 * i : nullptr, m + i,
                    l + i, o + i * D);
  return true;
}

// AVX2 + FMA (CPUs without AVX-512: Zen 2 and 3, Haswell to Comet Lake). The
// block product keeps MR rows x 16 columns of C (two vectors per row, at most
// 12 accumulators of the 16 ymm registers) over k; ragged columns go through
// masked loads and stores. The softmax steps are the shared loops above,
// compiled here for AVX2 (8 lanes). Before this variant such CPUs ran the
// portable one at the baseline ISA (SSE2, no FMA): attention was 18 % of a
// GPT-2 124M training step on a Zen 3, at about 25 GFLOP/s.
ASPEN_TARGET_AVX2 inline __m256i tail_mask8(int64_t left) {
  const int n = int(std::clamp<int64_t>(left, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int MR>
ASPEN_TARGET_AVX2 void gemm_tile_256(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                     int64_t ldc, int64_t kk, const __m256i* mk, bool accumulate) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v)
      acc[r][v] = accumulate ? _mm256_maskload_ps(c + r * ldc + 8 * v, mk[v]) : _mm256_setzero_ps();
  for (int64_t k = 0; k < kk; ++k) {
    const float* bk = b + k * ldb;
    const __m256 b0 = _mm256_maskload_ps(bk, mk[0]), b1 = _mm256_maskload_ps(bk + 8, mk[1]);
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
    for (int v = 0; v < 2; ++v) _mm256_maskstore_ps(c + r * ldc + 8 * v, mk[v], acc[r][v]);
}

using GemmTile256 = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                             const __m256i*, bool);
constexpr GemmTile256 kGemmTiles256[6] = {gemm_tile_256<1>, gemm_tile_256<2>, gemm_tile_256<3>,
                                          gemm_tile_256<4>, gemm_tile_256<5>, gemm_tile_256<6>};

struct Avx2 {
  static bool fused_tile(const float*, const float*, const float*, int64_t, int64_t, int64_t, const int*, const int*,
                         const float*, float*, float*, float*) {
    return false;  // NOTE [attention fused strips]: AVX-512 only
  }
  ASPEN_TARGET_AVX2 static void gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                     int64_t ldc, int64_t m, int64_t n, int64_t kk, bool accumulate) {
    for (int64_t j = 0; j < n; j += 16) {  // a 16-column panel of B stays in L1 across the rows
      const __m256i mk[2] = {tail_mask8(n - j), tail_mask8(n - j - 8)};
      for (int64_t i = 0; i < m; i += 6)
        kGemmTiles256[std::min<int64_t>(6, m - i) - 1](a + i * ars, ars, aks, b + j, ldb, c + i * ldc + j, ldc, kk,
                                                       mk, accumulate);
    }
  }
  ASPEN_TARGET_AVX2 static void transpose(const float* src, int64_t cols, int64_t D, float* dst) {
    transpose_impl(src, cols, D, dst);
  }
  ASPEN_TARGET_AVX2 static void softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                             const float* kv, float* m, float* l, float* o, int64_t D,
                                             bool /*partial*/) {
    softmax_tile_impl(s, rows, cols, lo, hi, kv, m, l, o, D);
  }
  ASPEN_TARGET_AVX2 static void decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                      const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
    decode_row_impl(q, kh, vh, lo, hi, valid, D, cs, out, lse);
  }
  ASPEN_TARGET_AVX2 static void grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo,
                                          const int* hi, const float* kv, const float* lse2, const float* di,
                                          float cs) {
    grad_tile_impl(s, dp, rows, cols, lo, hi, kv, lse2, di, cs);
  }
};

// ---------------------------------------------------------------------------
// Drivers, shared by the ISAs.

constexpr uint8_t kSkipTile = 0, kFullTile = 1, kPartialTile = 2;  // NOTE [attention block layouts]

struct Problem {
  const float* q;
  const float* k;
  const float* v;
  int64_t B, H, Hk, T, S, D;
  float scale;
  Geometry geo;
  const uint8_t* key_valid;  // [B, S] or null
  // The key/value head (b * Hk + kv head) that query head bh = b * H + h reads:
  // query heads h share kv head h / (H / Hk) (grouped-query attention).
  int64_t kv_head(int64_t bh) const { return (bh / H) * Hk + (bh % H) / (H / Hk); }

  // NOTE [attention block layouts]: a block-sparse layout (mask.layout) is
  // compiled per call into one state per (layout head, query tile, key tile):
  // skipped (no element allowed), full (the layout allows every element) or
  // partial (the layout's blocks are smaller than the tile or it is cut by
  // them: after the scores are computed, the elements the layout removes
  // become -inf). Without a layout every tile is full as far as the layout
  // goes; the ranges, key_valid and segments still apply on top.
  const uint8_t* layout = nullptr;  // [lheads, lrows, lcols]
  int64_t lblock = 0, lheads = 1, lrows = 0, lcols = 0;
  const uint8_t* tiles = nullptr;  // [lheads, nqt, nkt]
  int64_t nqt = 0, nkt = 0;
  const float* alibi = nullptr;  // [H] slopes, or null
  const float* bias = nullptr;   // [bias_batch, bias_heads, T, S], or null
  int64_t bias_batch = 1, bias_heads = 1;
  // The bias on a tile's scores s (leading dimension kBk), times mult (the scores' domain, as for ALiBi).
  void add_bias(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s, float mult) const {
    const int64_t b = bias_batch == 1 ? 0 : bh / H, h = bias_heads == 1 ? 0 : bh % H;
    const float* rows0 = bias + ((b * bias_heads + h) * T + i0) * S + j0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) s[r * kBk + c] += mult * rows0[r * S + c];
  }
  // ALiBi on a tile's scores s (leading dimension kBk): + mult * slope * (j - position), where mult puts the
  // bias in the scores' domain (the forward's exp2 domain: log2 e; the backward's unscaled q.k: 1 / scale).
  void add_alibi(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s, float mult) const {
    const float slope = alibi[bh % H] * mult;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = geo.offset + i0 + r;
      for (int64_t c = 0; c < cols; ++c) s[r * kBk + c] += slope * float(j0 + c - pos);
    }
  }
  int64_t layout_head(int64_t bh) const { return lheads == 1 ? 0 : bh % H; }
  uint8_t tile_state(int64_t bh, int64_t i0, int64_t j0) const {
    return tiles ? tiles[(layout_head(bh) * nqt + i0 / kBq) * nkt + j0 / kBk] : kFullTile;
  }
  // The layout's -inf on the scores s (leading dimension kBk) of a partial tile.
  void mask_tile(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s) const {
    const uint8_t* l = layout + layout_head(bh) * lrows * lcols;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = l + ((geo.offset + i0 + r) / lblock) * lcols;
      for (int64_t c = 0; c < cols; ++c)
        if (row[(j0 + c) / lblock] == 0) s[r * kBk + c] = -std::numeric_limits<float>::infinity();
    }
  }
};

// kv[c] = 1 where key j0 + c is not padding, else 0; returns whether any is.
bool fill_key_valid(const Problem& pb, int64_t b, int64_t j0, int64_t cols, float* kv) {
  bool any = false;
  for (int64_t c = 0; c < cols; ++c) {
    const bool ok = pb.key_valid == nullptr || pb.key_valid[b * pb.S + j0 + c] != 0;
    kv[c] = ok ? 1.0f : 0.0f;
    any |= ok;
  }
  return any;
}

// Per-row allowed columns of the tile (query rows i0.. of batch row b, keys j0..j0+cols).
void tile_ranges(const Problem& pb, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int* lo, int* hi) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t a, e;
    pb.geo.range(b, i0 + r, &a, &e);
    lo[r] = int(std::clamp<int64_t>(a - j0, 0, cols));
    hi[r] = int(std::clamp<int64_t>(e - j0, 0, cols));
  }
}

// Keys [first, last) that some row of the query block [i0, i0 + rows) of batch row b may use.
void block_key_span(const Problem& pb, int64_t b, int64_t i0, int64_t rows, int64_t* first, int64_t* last) {
  int64_t unused;
  pb.geo.range(b, i0, first, &unused);
  pb.geo.range(b, i0 + rows - 1, &unused, last);
}

// NOTE [attention query spans]: a forward task is a span of up to kSpanBlocks query blocks of one head, and
// each key block it visits serves every query block of the span in turn: K^T and V come from L3 or memory
// once per span instead of once per 64 rows (at T = 8192 a head's K and V are 4 MiB, twice an L2). Spans
// shrink while there would be fewer than 4 tasks per thread.
constexpr int64_t kSpanBlocks = 4, kQuerySpan = kSpanBlocks * kBq;

int64_t query_span_blocks(int64_t heads, int64_t nqb, int threads) {
  int64_t blocks = kSpanBlocks;
  while (blocks > 1 && heads * ((nqb + blocks - 1) / blocks) < 4 * int64_t(threads)) blocks /= 2;
  return blocks;
}

int64_t forward_scratch_floats(int64_t D) { return 2 * kQuerySpan * D + D * kBk + kBq * kBk + 2 * kQuerySpan + kBk; }

// NOTE [attention decode rows]: each (b, h, row) is one task on its own.
template <class Ops>
void forward_decode(const Problem& pb, float* out, float* lse) {
  const int64_t D = pb.D, T = pb.T, S = pb.S, rows = pb.B * pb.H * T;
  const float cs = pb.scale * kLog2e;
  // NOTE [attention split-KV decoding]: a row over more than kDecodeChunk keys is cut into chunks of
  // absolute key positions [c * kDecodeChunk, (c + 1) * kDecodeChunk), each a task of its own (out_c, lse_c),
  // then combined per row in chunk order: lse = log sum_c e^lse_c, out = sum_c e^(lse_c - lse) out_c. The
  // chunks follow S alone, so the bits do not depend on the thread count.
  const int64_t chunks = decode_chunks(S);
  std::vector<float> part(chunks > 1 ? size_t(rows * chunks * (D + 1)) : 0);
  const int64_t tasks = rows * chunks;
  const int nt = int(std::min<int64_t>(omp_get_max_threads(), tasks));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t row = t / chunks, c = t % chunks;
    const int64_t bh = row / T, i = row % T, b = bh / pb.H, kvh = pb.kv_head(bh);
    int64_t lo, hi;
    pb.geo.range(b, i, &lo, &hi);
    if (chunks > 1) {
      lo = std::max(lo, c * kDecodeChunk);
      hi = std::min(hi, (c + 1) * kDecodeChunk);
    }
    float* o = chunks > 1 ? part.data() + t * (D + 1) : out + row * D;
    float* l = chunks > 1 ? o + D : lse + row;
    Ops::decode_row(pb.q + row * D, pb.k + kvh * S * D, pb.v + kvh * S * D, lo, std::max(lo, hi),
                    pb.key_valid ? pb.key_valid + b * S : nullptr, D, cs, o, l);
  }
  if (chunks == 1) return;
#pragma omp parallel for schedule(static) num_threads(int(std::min<int64_t>(omp_get_max_threads(), rows)))
  for (int64_t row = 0; row < rows; ++row) {
    const float* pr = part.data() + row * chunks * (D + 1);
    float m = kNegInf;
    for (int64_t c = 0; c < chunks; ++c) m = std::max(m, pr[c * (D + 1) + D]);
    float* o = out + row * D;
    std::fill_n(o, D, 0.0f);
    if (m == kNegInf) {  // no allowed key in any chunk
      lse[row] = kNegInf;
      continue;
    }
    float sum = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float lc = pr[c * (D + 1) + D];
      if (lc == kNegInf) continue;
      const float w = std::exp(lc - m);
      sum += w;
      for (int64_t d = 0; d < D; ++d) o[d] += w * pr[c * (D + 1) + d];
    }
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    lse[row] = m + std::log(sum);
  }
}

// FlashAttention-2 forward. Per (b, h, query block): scores for one key block
// at a time, s = (q * scale * log2 e) k^T in the exp2 domain; running max m and
// sum l per row; o = o * 2^(m_old - m_new) + p v; at the end out = o / l and
// lse = (m + log2 l) ln 2.
template <class Ops>
void forward_fast(const Problem& pb, float* out, float* lse) {
  const int64_t D = pb.D, T = pb.T, S = pb.S;
  const int nt = omp_get_max_threads();
  const int64_t per = forward_scratch_floats(D);
  std::vector<float> scratch(size_t(per * nt));
  const int64_t nqb = (T + kBq - 1) / kBq;
  const int64_t span_blocks = query_span_blocks(pb.B * pb.H, nqb, nt);  // NOTE [attention query spans]
  const int64_t nspan = (nqb + span_blocks - 1) / span_blocks, tasks = pb.B * pb.H * nspan;
  const float cs = pb.scale * kLog2e;
  // NOTE [attention keys transposed once]: with several query blocks per head, every block would transpose
  // the same key blocks again; each key block's K^T [D, kBk] is made once, blocks one after another
  // ([B, Hk, S / kBk, D, kBk]: a tile reads its block contiguously, as it would its own copy; a [D, S] layout
  // strides rows by S floats, which alias in L1 when S is a multiple of 1024). The size of k, rounded up.
  const bool once = nqb > 1;
  const int64_t nkb = (S + kBk - 1) / kBk;
  std::vector<float> k_t(once ? size_t(pb.B * pb.Hk * nkb * D * kBk) : 0);
  if (once) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t u = 0; u < pb.B * pb.Hk * nkb; ++u) {
      const int64_t kvh = u / nkb, j0 = (u % nkb) * kBk;
      Ops::transpose(pb.k + (kvh * S + j0) * D, std::min(kBk, S - j0), D, k_t.data() + u * D * kBk);
    }
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < tasks; ++t) {
    float* qs = scratch.data() + per * omp_get_thread_num();
    float* o = qs + kQuerySpan * D;
    float* kt = o + kQuerySpan * D;
    float* s = kt + D * kBk;
    float* m = s + kBq * kBk;
    float* l = m + kQuerySpan;
    float* kv = l + kQuerySpan;
    int lo[kBq], hi[kBq];
    int64_t sub_first[kSpanBlocks] = {}, sub_last[kSpanBlocks] = {};
    // NOTE [attention query spans]: the spans that visit the most key blocks (causal: the last) go first.
    const int64_t bh = t % (pb.B * pb.H), span = nspan - 1 - t / (pb.B * pb.H), b = bh / pb.H;
    const int64_t i_begin = span * span_blocks * kBq, n = std::min(span_blocks * kBq, T - i_begin);
    const float* kh = pb.k + pb.kv_head(bh) * S * D;
    const float* vh = pb.v + pb.kv_head(bh) * S * D;
    const float* qb = pb.q + (bh * T + i_begin) * D;
    for (int64_t x = 0; x < n * D; ++x) {
      qs[x] = qb[x] * cs;
      o[x] = 0.0f;
    }
    for (int64_t r = 0; r < n; ++r) {
      m[r] = kNegInf;
      l[r] = 0.0f;
    }
    const int64_t nsub = (n + kBq - 1) / kBq;
    for (int64_t u = 0; u < nsub; ++u)
      block_key_span(pb, b, i_begin + u * kBq, std::min(kBq, n - u * kBq), &sub_first[u], &sub_last[u]);
    const int64_t first = sub_first[0], last = sub_last[nsub - 1];  // the rows' ranges grow with the row
    for (int64_t j0 = first / kBk * kBk; j0 < last; j0 += kBk) {  // blocks outside [first, last) are masked out
      const int64_t cols = std::min(kBk, S - j0);
      if (!fill_key_valid(pb, b, j0, cols, kv)) continue;
      const bool all_valid = pb.key_valid == nullptr || std::all_of(kv, kv + cols, [](float x) { return x != 0.0f; });
      const float* ktile = kt;
      if (once)
        ktile = k_t.data() + (pb.kv_head(bh) * nkb + j0 / kBk) * D * kBk;
      else
        Ops::transpose(kh + j0 * D, cols, D, kt);
      for (int64_t u = 0; u < nsub; ++u) {  // each 64-row block of the span on this key block
        if (j0 + cols <= sub_first[u] || j0 >= sub_last[u]) continue;
        const int64_t i0 = i_begin + u * kBq, rows = std::min(kBq, T - i0);
        const uint8_t state = pb.tile_state(bh, i0, j0);  // NOTE [attention block layouts]
        if (state == kSkipTile) continue;
        float *qu = qs + u * kBq * D, *ou = o + u * kBq * D, *mu = m + u * kBq, *lu = l + u * kBq;
        bool ranged = false;  // lo, hi hold this tile's ranges
        if (state == kFullTile && !pb.alibi && !pb.bias) {  // NOTE [attention fused strips]
          // The rows' ranges grow with the row: the first row's end and the last row's start bound them all.
          int64_t lo_first, hi_first, lo_last, hi_last;
          pb.geo.range(b, i0, &lo_first, &hi_first);
          pb.geo.range(b, i0 + rows - 1, &lo_last, &hi_last);
          const bool inside = all_valid && cols == kBk && lo_last <= j0 && hi_first >= j0 + cols;
          if (!inside) tile_ranges(pb, b, i0, rows, j0, cols, lo, hi), ranged = true;
          if (Ops::fused_tile(qu, ktile, vh + j0 * D, rows, cols, D, inside ? nullptr : lo, inside ? nullptr : hi,
                              inside ? nullptr : kv, mu, lu, ou))
            continue;
        }
        if (!ranged) tile_ranges(pb, b, i0, rows, j0, cols, lo, hi);
        Ops::gemm(qu, D, 1, ktile, kBk, s, kBk, rows, cols, D, false);
        if (pb.alibi) pb.add_alibi(bh, i0, rows, j0, cols, s, kLog2e);
        if (pb.bias) pb.add_bias(bh, i0, rows, j0, cols, s, kLog2e);
        if (state == kPartialTile) pb.mask_tile(bh, i0, rows, j0, cols, s);
        // A bias may hold -inf: rows of -inf take the masked path, as a layout's do.
        Ops::softmax_tile(s, rows, cols, lo, hi, kv, mu, lu, ou, D, state == kPartialTile || pb.bias);
        Ops::gemm(s, kBk, 1, vh + j0 * D, D, ou, D, rows, D, cols, true);
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      float* orow = out + (bh * T + i_begin + r) * D;
      const bool any = l[r] > 0.0f;
      const float inv = any ? 1.0f / l[r] : 0.0f;
      for (int64_t d = 0; d < D; ++d) orow[d] = o[r * D + d] * inv;
      lse[bh * T + i_begin + r] = any ? m[r] / kLog2e + std::log(l[r]) : kNegInf;
    }
  }
}

int64_t backward_scratch_floats(int64_t D) { return 2 * D * kBk + 2 * kBq * kBk + kBk + 2 * kBq; }

// FlashAttention-2 backward, in two passes so that every output element is
// summed by one thread in a fixed order: pass 1 owns a key block of one kv
// head (dk, dv) and walks the query blocks of every query head that shares it
// (grouped-query attention: the group's heads in order); pass 2 owns a query
// block (dq) and walks the key blocks. Both recompute
// p = exp2(cs * q.k - lse log2 e) and ds per tile.
template <class Ops>
void backward_fast(const Problem& pb, const float* out, const float* lse, const float* dout, float* dq, float* dk,
                   float* dv, float* dbias) {
  const int64_t D = pb.D, T = pb.T, S = pb.S, BH = pb.B * pb.H;
  const int nt = omp_get_max_threads();
  const int64_t per = backward_scratch_floats(D);
  std::vector<float> scratch(size_t(per * nt));
  const float cs = pb.scale * kLog2e;

  if (dbias) {  // elements of skipped tiles (masked) stay 0
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t row = 0; row < BH * T; ++row) std::fill_n(dbias + row * S, S, 0.0f);
  }
  // di = rowsum(dout * out): the p-weighted mean of dp, per query row.
  std::vector<float> di(size_t(BH * T));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t row = 0; row < BH * T; ++row) {
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc += dout[row * D + d] * out[row * D + d];
    di[size_t(row)] = acc;
  }

  struct Tile {
    float *kt, *vt, *s, *dp, *kv, *lse2, *dib;
    int lo[kBq], hi[kBq];
  };
  auto carve = [&](Tile& w) {
    w.kt = scratch.data() + per * omp_get_thread_num();
    w.vt = w.kt + D * kBk;
    w.s = w.vt + D * kBk;
    w.dp = w.s + kBq * kBk;
    w.kv = w.dp + kBq * kBk;
    w.lse2 = w.kv + kBk;
    w.dib = w.lse2 + kBq;
  };
  // p into w.s and ds into w.dp for query rows [i0, i0 + rows) and keys
  // [j0, j0 + cols) of head bh; w.kt, w.vt and w.kv hold the key block.
  auto tile = [&](Tile& w, int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    tile_ranges(pb, bh / pb.H, i0, rows, j0, cols, w.lo, w.hi);
    for (int64_t r = 0; r < rows; ++r) {
      const float lr = lse[bh * T + i0 + r];
      if (lr == kNegInf) w.lo[r] = w.hi[r] = 0;  // a row with no allowed key has no gradient
      w.lse2[r] = lr * kLog2e;
      w.dib[r] = di[size_t(bh * T + i0 + r)];
    }
    const float* qb = pb.q + (bh * T + i0) * D;
    const float* gb = dout + (bh * T + i0) * D;
    Ops::gemm(qb, D, 1, w.kt, kBk, w.s, kBk, rows, cols, D, false);   // s = q k^T
    if (pb.alibi) pb.add_alibi(bh, i0, rows, j0, cols, w.s, 1.0f / pb.scale);
    if (pb.bias) pb.add_bias(bh, i0, rows, j0, cols, w.s, 1.0f / pb.scale);
    if (pb.tile_state(bh, i0, j0) == kPartialTile) pb.mask_tile(bh, i0, rows, j0, cols, w.s);  // -inf: p = 0
    Ops::gemm(gb, D, 1, w.vt, kBk, w.dp, kBk, rows, cols, D, false);  // dp = dout v^T
    Ops::grad_tile(w.s, w.dp, rows, cols, w.lo, w.hi, w.kv, w.lse2, w.dib, cs);
  };
  // The key block j0 of kv head kvh (= b * Hk + kv head).
  auto load_keys = [&](Tile& w, int64_t kvh, int64_t j0, int64_t cols) {
    if (!fill_key_valid(pb, kvh / pb.Hk, j0, cols, w.kv)) return false;
    Ops::transpose(pb.k + (kvh * S + j0) * D, cols, D, w.kt);
    Ops::transpose(pb.v + (kvh * S + j0) * D, cols, D, w.vt);
    return true;
  };

  const int64_t nqb = (T + kBq - 1) / kBq, nkb = (S + kBk - 1) / kBk,
                group = pb.Hk > 0 ? pb.H / pb.Hk : 0, units = pb.B * pb.Hk;
  // The first query head of kv head kvh's group.
  auto first_head = [&](int64_t kvh) { return (kvh / pb.Hk) * pb.H + (kvh % pb.Hk) * group; };
  // Key block j0 of kv head kvh, loaded in w, against every query block of its group's heads, in order:
  // dk and dv accumulated for the block (dk unscaled), and with `dq` (the one-pass schedule) dq too.
  auto walk_queries = [&](Tile& w, int64_t kvh, int64_t j0, int64_t cols, float* dq_or_null) {
    float* dkb = dk + (kvh * S + j0) * D;
    float* dvb = dv + (kvh * S + j0) * D;
    for (int64_t bh = first_head(kvh); bh < first_head(kvh) + group; ++bh)
      for (int64_t i0 = 0; i0 < T; i0 += kBq) {
        const int64_t rows = std::min(kBq, T - i0);
        int64_t first, last;
        block_key_span(pb, bh / pb.H, i0, rows, &first, &last);
        if (first >= j0 + cols || last <= j0 || pb.tile_state(bh, i0, j0) == kSkipTile) continue;
        tile(w, bh, i0, rows, j0, cols);
        if (dbias)  // ds is the scores' gradient, and the bias's; each tile is visited once here
          for (int64_t r = 0; r < rows; ++r)
            std::copy_n(w.dp + r * kBk, cols, dbias + (bh * T + i0 + r) * S + j0);
        const float* qb = pb.q + (bh * T + i0) * D;
        const float* gb = dout + (bh * T + i0) * D;
        Ops::gemm(w.s, 1, kBk, gb, D, dvb, D, cols, D, rows, true);   // dv += p^T dout
        Ops::gemm(w.dp, 1, kBk, qb, D, dkb, D, cols, D, rows, true);  // dk += ds^T q
        if (dq_or_null)                                               // dq += ds k
          Ops::gemm(w.dp, kBk, 1, pb.k + (kvh * S + j0) * D, D, dq_or_null + (bh * T + i0) * D, D, rows, D, cols,
                    true);
      }
    for (int64_t x = 0; x < cols * D; ++x) dkb[x] *= pb.scale;
  };

  // NOTE [attention backward per head]: with enough kv heads for every thread
  // (B·Hk a multiple of the threads, or at least 4 per thread), a thread owns
  // whole kv heads and makes one pass: per key block, per query block of the
  // group's heads, s and ds once, then dv, dk and dq all from them (5 block
  // products instead of the two passes' 7). dq sums over the key blocks in
  // ascending order and dk, dv over the (head, query block) pairs in the same
  // order as the two passes do, with the same block products: the bits are
  // the two passes' bits, so the choice may follow the thread count.
  if (units >= nt && (units % nt == 0 || units >= 4 * int64_t(nt))) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t kvh = 0; kvh < units; ++kvh) {
      Tile w;
      carve(w);
      float* dq_group = dq + first_head(kvh) * T * D;
      std::fill(dk + kvh * S * D, dk + (kvh + 1) * S * D, 0.0f);
      std::fill(dv + kvh * S * D, dv + (kvh + 1) * S * D, 0.0f);
      std::fill(dq_group, dq_group + group * T * D, 0.0f);
      for (int64_t j0 = 0; j0 < S; j0 += kBk) {
        const int64_t cols = std::min(kBk, S - j0);
        if (load_keys(w, kvh, j0, cols)) walk_queries(w, kvh, j0, cols, dq);
      }
      for (float* x = dq_group; x < dq_group + group * T * D; ++x) *x *= pb.scale;
    }
    return;
  }

#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < pb.B * pb.Hk * nkb; ++t) {
    Tile w;
    carve(w);
    const int64_t kvh = t / nkb, j0 = (t % nkb) * kBk, cols = std::min(kBk, S - j0);
    std::fill(dk + (kvh * S + j0) * D, dk + (kvh * S + j0 + cols) * D, 0.0f);
    std::fill(dv + (kvh * S + j0) * D, dv + (kvh * S + j0 + cols) * D, 0.0f);
    if (load_keys(w, kvh, j0, cols)) walk_queries(w, kvh, j0, cols, nullptr);
  }

#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < BH * nqb; ++t) {
    Tile w;
    carve(w);
    const int64_t bh = t / nqb, i0 = (t % nqb) * kBq, rows = std::min(kBq, T - i0);
    float* dqb = dq + (bh * T + i0) * D;
    std::fill(dqb, dqb + rows * D, 0.0f);
    int64_t first, last;
    block_key_span(pb, bh / pb.H, i0, rows, &first, &last);
    const int64_t kvh = pb.kv_head(bh);
    for (int64_t j0 = first / kBk * kBk; j0 < last; j0 += kBk) {
      const int64_t cols = std::min(kBk, S - j0);
      if (pb.tile_state(bh, i0, j0) == kSkipTile || !load_keys(w, kvh, j0, cols)) continue;
      tile(w, bh, i0, rows, j0, cols);
      Ops::gemm(w.dp, kBk, 1, pb.k + (kvh * S + j0) * D, D, dqb, D, rows, D, cols, true);  // dq += ds k
    }
    for (int64_t x = 0; x < rows * D; ++x) dqb[x] *= pb.scale;
  }
}

// ---------------------------------------------------------------------------
// Argument checks.

std::string i64(int64_t x) { return std::to_string(x); }

Status check_shape(const char* kernel, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                   float scale, const AttentionMask& mask, int64_t* n_q, int64_t* n_k, int64_t* n_l) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "B", B));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "H", H));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "Hk", Hk));
  if ((Hk == 0) != (H == 0) || (Hk > 0 && H % Hk != 0))
    return Status::invalid_argument(std::string(kernel) + ": Hk", "a divisor of H = " + i64(H) + " (key/value heads)",
                                    i64(Hk));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "T", T));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "S", S));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "D", D));
  int64_t bh, bhk, bs;
  if (__builtin_mul_overflow(B, H, &bh) || __builtin_mul_overflow(bh, T, n_l) ||
      __builtin_mul_overflow(*n_l, D, n_q) || __builtin_mul_overflow(B, Hk, &bhk) ||
      __builtin_mul_overflow(bhk, S, n_k) || __builtin_mul_overflow(*n_k, D, n_k) ||
      __builtin_mul_overflow(B, S, &bs))
    return Status::invalid_argument(std::string(kernel) + ": extents", "B*H*T*D and B*H*S*D within int64",
                                    "B=" + i64(B) + " H=" + i64(H) + " T=" + i64(T) + " S=" + i64(S) + " D=" + i64(D));
  if (!std::isfinite(scale))
    return Status::invalid_argument(std::string(kernel) + ": scale", "a finite number", std::to_string(scale));
  if (mask.kind != Kind::none && mask.kind != Kind::causal && mask.kind != Kind::local)
    return Status::invalid_argument(std::string(kernel) + ": mask.kind", "none, causal or local",
                                    i64(int(mask.kind)));
  if (mask.kind == Kind::local) {
    ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.window", mask.window, 1));
    ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.window_right", mask.window_right, 0));
    if (mask.window > (int64_t(1) << 53) || mask.window_right > (int64_t(1) << 53))
      return Status::invalid_argument(std::string(kernel) + ": mask.window, mask.window_right", "at most 2^53",
                                      i64(mask.window) + ", " + i64(mask.window_right));
  } else if (mask.window_right != 0) {
    return Status::invalid_argument(std::string(kernel) + ": mask.window_right", "0 unless the kind is local",
                                    i64(mask.window_right));
  }
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.kv_offset", mask.kv_offset, 0));
  if (mask.kv_offset > std::numeric_limits<int64_t>::max() - T)
    return Status::invalid_argument(std::string(kernel) + ": mask.kv_offset",
                                    "kv_offset + T within int64", i64(mask.kv_offset));
  if (!mask.key_valid.empty() && int64_t(mask.key_valid.size()) != bs)
    return Status::invalid_argument(std::string(kernel) + ": argument 'mask.key_valid'",
                                    "empty (all keys valid) or exactly " + i64(bs) + " elements ([B, S])",
                                    i64(int64_t(mask.key_valid.size())));
  if (!mask.alibi_slopes.empty()) {
    if (int64_t(mask.alibi_slopes.size()) != H)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.alibi_slopes'",
                                      "exactly H = " + i64(H) + " slopes", i64(int64_t(mask.alibi_slopes.size())));
    if (!(scale > 0))
      return Status::invalid_argument(std::string(kernel) + ": scale", "> 0 with ALiBi slopes", std::to_string(scale));
    for (float s : mask.alibi_slopes)
      if (!std::isfinite(s))
        return Status::invalid_argument(std::string(kernel) + ": mask.alibi_slopes", "finite slopes",
                                        std::to_string(s));
  }
  if (!mask.bias.empty()) {
    if ((mask.bias_batch != 1 && mask.bias_batch != B) || (mask.bias_heads != 1 && mask.bias_heads != H))
      return Status::invalid_argument(std::string(kernel) + ": mask.bias_batch, mask.bias_heads",
                                      "1 or B = " + i64(B) + ", 1 or H = " + i64(H),
                                      i64(mask.bias_batch) + ", " + i64(mask.bias_heads));
    int64_t cells = 0;
    if (__builtin_mul_overflow(mask.bias_batch * mask.bias_heads, T, &cells) ||
        __builtin_mul_overflow(cells, S, &cells) || int64_t(mask.bias.size()) != cells)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.bias'",
                                      "exactly " + i64(mask.bias_batch) + " x " + i64(mask.bias_heads) + " x " + i64(T) +
                                          " x " + i64(S) + " elements ([bias_batch, bias_heads, T, S])",
                                      i64(int64_t(mask.bias.size())));
    if (!(scale > 0))
      return Status::invalid_argument(std::string(kernel) + ": scale", "> 0 with a bias", std::to_string(scale));
  }
  if (!mask.layout.empty()) {
    ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.layout_block", mask.layout_block, 1));
    if (mask.layout_heads != 1 && mask.layout_heads != H)
      return Status::invalid_argument(std::string(kernel) + ": mask.layout_heads", "1 or H = " + i64(H),
                                      i64(mask.layout_heads));
    const int64_t rows = (mask.kv_offset + T + mask.layout_block - 1) / mask.layout_block,
                  cols = (S + mask.layout_block - 1) / mask.layout_block;
    int64_t cells = 0;
    if (__builtin_mul_overflow(rows, cols, &cells) || __builtin_mul_overflow(cells, mask.layout_heads, &cells) ||
        int64_t(mask.layout.size()) != cells)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.layout'",
                                      i64(mask.layout_heads * rows * cols) + " elements ([" + i64(mask.layout_heads) +
                                          ", " + i64(rows) + ", " + i64(cols) + "]: layout heads, query blocks, key "
                                          "blocks of " + i64(mask.layout_block) + ")",
                                      i64(int64_t(mask.layout.size())));
  }
  if (!mask.segments.empty()) {
    if (int64_t(mask.segments.size()) != bs)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.segments'",
                                      "empty (one segment) or exactly " + i64(bs) + " elements ([B, S])",
                                      i64(int64_t(mask.segments.size())));
    if (T > 0 && mask.kv_offset + T > S)
      return Status::invalid_argument(std::string(kernel) + ": mask.kv_offset",
                                      "kv_offset + T <= S = " + i64(S) + " with segments (each query's segment is "
                                      "its position's)", i64(mask.kv_offset) + " + " + i64(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 1; j < S; ++j)
        if (mask.segments[size_t(b * S + j)] < mask.segments[size_t(b * S + j - 1)])
          return Status::invalid_argument(std::string(kernel) + ": mask.segments row " + i64(b),
                                          "non-decreasing segment ids (documents one after another)",
                                          i64(mask.segments[size_t(b * S + j - 1)]) + " then " +
                                              i64(mask.segments[size_t(b * S + j)]) + " at key " + i64(j));
  }
  return Status();
}

using NamedBuffer = std::tuple<const char*, std::span<const float>, int64_t>;

Status check_buffers(const char* kernel, std::initializer_list<NamedBuffer> buffers) {
  for (const auto& [name, buf, n] : buffers) ASPEN_RETURN_IF_ERROR(check_buffer(kernel, name, buf, n));
  return Status();
}

// Per (layout head, query tile, key tile): skipped, full or partial (NOTE
// [attention block layouts]), from the layout blocks each tile overlaps.
void layout_tiles(Problem& pb, std::vector<uint8_t>& tiles) {
  pb.nqt = (pb.T + kBq - 1) / kBq;
  pb.nkt = (pb.S + kBk - 1) / kBk;
  tiles.assign(size_t(pb.lheads * pb.nqt * pb.nkt), kSkipTile);
  const int64_t bs = pb.lblock;
  for (int64_t h = 0; h < pb.lheads; ++h)
    for (int64_t qt = 0; qt < pb.nqt; ++qt) {
      const int64_t p0 = pb.geo.offset + qt * kBq, p1 = pb.geo.offset + std::min(pb.T, (qt + 1) * kBq) - 1;
      for (int64_t kt = 0; kt < pb.nkt; ++kt) {
        const int64_t j1 = std::min(pb.S, (kt + 1) * kBk) - 1;
        bool any = false, all = true;
        for (int64_t qb = p0 / bs; qb <= p1 / bs; ++qb)
          for (int64_t kb = kt * kBk / bs; kb <= j1 / bs; ++kb) {
            const bool on = pb.layout[(h * pb.lrows + qb) * pb.lcols + kb] != 0;
            any |= on;
            all &= on;
          }
        tiles[size_t((h * pb.nqt + qt) * pb.nkt + kt)] = !any ? kSkipTile : all ? kFullTile : kPartialTile;
      }
    }
  pb.tiles = tiles.data();
}

// The problem of one call; with segments, `seg` receives each key's segment
// bounds ([B, S] starts, then [B, S] ends), which the geometry reads; with a
// layout, `tiles` its tiles' states.
Problem make_problem(const float* q, const float* k, const float* v, int64_t B, int64_t H, int64_t Hk, int64_t T,
                     int64_t S, int64_t D, float scale, const AttentionMask& mask, std::vector<int32_t>& seg,
                     std::vector<uint8_t>& tiles) {
  Problem pb{q, k, v, B, H, Hk, T, S, D, scale,
             Geometry{mask.kind, mask.window, mask.window_right, mask.kv_offset, S},
             mask.key_valid.empty() ? nullptr : mask.key_valid.data()};
  if (!mask.alibi_slopes.empty()) pb.alibi = mask.alibi_slopes.data();
  if (!mask.bias.empty()) {
    pb.bias = mask.bias.data();
    pb.bias_batch = mask.bias_batch;
    pb.bias_heads = mask.bias_heads;
  }
  if (!mask.layout.empty()) {
    pb.layout = mask.layout.data();
    pb.lblock = mask.layout_block;
    pb.lheads = mask.layout_heads;
    pb.lcols = (S + mask.layout_block - 1) / mask.layout_block;
    pb.lrows = (mask.kv_offset + T + mask.layout_block - 1) / mask.layout_block;
    layout_tiles(pb, tiles);
  }
  if (mask.segments.empty()) return pb;
  seg.resize(size_t(2 * B * S));
  int32_t* lo = seg.data();
  int32_t* hi = lo + B * S;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* id = mask.segments.data() + b * S;
    for (int64_t j = 0; j < S; ++j) lo[b * S + j] = int32_t(j > 0 && id[j] == id[j - 1] ? lo[b * S + j - 1] : j);
    for (int64_t j = S - 1; j >= 0; --j)
      hi[b * S + j] = int32_t(j + 1 < S && id[j] == id[j + 1] ? hi[b * S + j + 1] : j + 1);
  }
  pb.geo.seg_lo = lo;
  pb.geo.seg_hi = hi;
  return pb;
}

}  // namespace

Status check_attention_mask(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D, float scale,
                            const AttentionMask& mask) {
  int64_t nq, nk, nl;
  return check_shape("attention", B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl);
}

std::vector<float> alibi_slopes(int64_t heads, double bias_max) {
  int64_t n = 1;
  while (n < heads) n *= 2;
  std::vector<float> all(static_cast<size_t>(n)), out;
  for (int64_t k = 1; k <= n; ++k) all[size_t(k - 1)] = float(std::exp2(-bias_max * double(k) / double(n)));
  if (n == heads) return all;
  for (int64_t k = 1; k < n; k += 2) out.push_back(all[size_t(k)]);
  for (int64_t k = 0; k < n; k += 2) out.push_back(all[size_t(k)]);
  out.resize(size_t(heads));
  return out;
}

int64_t attention_forward_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                                        int threads) {
  if (T <= kDecodeRows) {  // NOTE [attention split-KV decoding]
    const int64_t chunks = decode_chunks(S);
    return chunks > 1 ? B * H * T * chunks * (D + 1) * int64_t(sizeof(float)) : 0;
  }
  const int64_t keys_t = T > kBq ? B * Hk * ((S + kBk - 1) / kBk) * kBk * D : 0;  // NOTE [attention keys transposed once]
  return (forward_scratch_floats(D) * int64_t(std::max(threads, 1)) + keys_t) * int64_t(sizeof(float));
}

int64_t attention_backward_scratch_bytes(int64_t B, int64_t H, int64_t T, int64_t D, int threads) {
  return (backward_scratch_floats(D) * int64_t(std::max(threads, 1)) + B * H * T) * int64_t(sizeof(float));
}

Status attention_forward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                         std::span<float> out, std::span<float> lse, int64_t B, int64_t H, int64_t Hk, int64_t T,
                         int64_t S, int64_t D, float scale, const AttentionMask& mask) {
  constexpr const char* kName = "attention_forward";
  int64_t nq, nk, nl;
  ASPEN_RETURN_IF_ERROR(check_shape(kName, B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl));
  ASPEN_RETURN_IF_ERROR(check_buffers(kName, {{"q", q, nq}, {"k", k, nk}, {"v", v, nk}, {"out", out, nq},
                                              {"lse", lse, nl}}));
  if (nl == 0) return Status();
  if (reference_mode()) {
    ref::attention_forward<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), B, H, Hk, T, S, D, scale, mask);
    return Status();
  }
  std::vector<int32_t> seg;
  std::vector<uint8_t> tiles;
  const Problem pb = make_problem(q.data(), k.data(), v.data(), B, H, Hk, T, S, D, scale, mask, seg, tiles);
  const auto run = [&](auto ops) {
    using Ops = decltype(ops);
    if (T <= kDecodeRows && mask.layout.empty() && mask.alibi_slopes.empty() &&
        mask.bias.empty())  // NOTE [attention decode rows]
      forward_decode<Ops>(pb, out.data(), lse.data());
    else
      forward_fast<Ops>(pb, out.data(), lse.data());
  };
  if (active_isa() >= Isa::avx512)
    run(Avx512{});
  else if (active_isa() >= Isa::avx2)
    run(Avx2{});
  else
    run(Portable{});
  return Status();
}

Status attention_backward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                          std::span<const float> out, std::span<const float> lse, std::span<const float> dout,
                          std::span<float> dq, std::span<float> dk, std::span<float> dv, int64_t B, int64_t H,
                          int64_t Hk, int64_t T, int64_t S, int64_t D, float scale, const AttentionMask& mask,
                          std::span<float> dbias) {
  constexpr const char* kName = "attention_backward";
  int64_t nq, nk, nl;
  ASPEN_RETURN_IF_ERROR(check_shape(kName, B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl));
  ASPEN_RETURN_IF_ERROR(check_buffers(kName, {{"q", q, nq}, {"k", k, nk}, {"v", v, nk}, {"out", out, nq},
                                              {"lse", lse, nl}, {"dout", dout, nq}, {"dq", dq, nq},
                                              {"dk", dk, nk}, {"dv", dv, nk}}));
  if (!dbias.empty()) {
    if (mask.bias.empty())
      return Status::invalid_argument(std::string(kName) + ": dbias", "empty without mask.bias (pass a bias of zeros)",
                                      i64(int64_t(dbias.size())) + " elements");
    int64_t nb = 0;
    if (__builtin_mul_overflow(nl, S, &nb))
      return Status::invalid_argument(std::string(kName) + ": dbias", "B*H*T*S within int64", "more");
    ASPEN_RETURN_IF_ERROR(check_buffers(kName, {{"dbias", dbias, nb}}));
  }
  float* db = dbias.empty() ? nullptr : dbias.data();
  if (reference_mode()) {
    ref::attention_backward<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                   dk.data(), dv.data(), B, H, Hk, T, S, D, scale, mask, db);
    return Status();
  }
  std::vector<int32_t> seg;
  std::vector<uint8_t> tiles;
  const Problem pb = make_problem(q.data(), k.data(), v.data(), B, H, Hk, T, S, D, scale, mask, seg, tiles);
  if (active_isa() >= Isa::avx512)
    backward_fast<Avx512>(pb, out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), db);
  else if (active_isa() >= Isa::avx2)
    backward_fast<Avx2>(pb, out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), db);
  else
    backward_fast<Portable>(pb, out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), db);
  return Status();
}

}  // namespace aspen::kernels
