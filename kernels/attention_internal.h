// kernels/attention_internal.h: what the attention kernels' files share (private to kernels/attention*.cc):
// the block sizes, the geometry of the masks, one call's Problem, and the softmax steps written as plain
// loops that each ISA's file compiles at its own target. Not for other callers: the contract is attention.h.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/philox.h"
#include "kernels/attention.h"

namespace aspen::kernels::attn {

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
constexpr int64_t kDecodeRows = kAttentionDecodeRows;
// NOTE [attention split-KV decoding]: keys per chunk of a long decode row (a multiple of kBk).
constexpr int64_t kDecodeChunk = 1024;
inline int64_t decode_chunks(int64_t S) { return S > kDecodeChunk ? (S + kDecodeChunk - 1) / kDecodeChunk : 1; }

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
    if (block_max > m) {                 // rescale what is summed so far (nothing yet: alpha = 2^-inf = 0)
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
  const uint8_t* tiles = nullptr;  // [lheads, nqt, nkt]; with positions [B, lheads, nqt, nkt]
  const int32_t* lq = nullptr;     // mask.layout_query_positions [B, T], or null
  const int32_t* lk = nullptr;     // mask.layout_key_positions [B, S]
  int64_t lq_block(int64_t b, int64_t i) const { return std::max<int32_t>(lq[b * T + i], 0) / lblock; }
  int64_t lk_block(int64_t b, int64_t j) const { return std::max<int32_t>(lk[b * S + j], 0) / lblock; }
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
  // Dropout (mask.dropout > 0): keep element n of the Philox stream when its top 24 bits >= drop_threshold.
  uint32_t drop_threshold = 0;  // 0: no dropout
  float drop_scale = 1.0f;      // 1 / (1 - dropout)
  uint64_t drop_seed = 0, drop_stream = 0;
  int64_t drop_heads = 0, drop_head_offset = 0;  // mask.dropout_heads (or H), dropout_head_offset
  // z [rows, kBk] = the dropout multipliers of the tile (0 past cols).
  void dropout_tile(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* z) const;
  int64_t layout_head(int64_t bh) const { return lheads == 1 ? 0 : bh % H; }
  uint8_t tile_state(int64_t bh, int64_t i0, int64_t j0) const {
    if (!tiles) return kFullTile;
    const int64_t lh = lq ? (bh / H) * lheads + layout_head(bh) : layout_head(bh);
    return tiles[(lh * nqt + i0 / kBq) * nkt + j0 / kBk];
  }
  // The layout's -inf on the scores s (leading dimension kBk) of a partial tile.
  void mask_tile(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s) const {
    const uint8_t* l = layout + layout_head(bh) * lrows * lcols;
    if (lq) {  // each row's own positions
      const int64_t b = bh / H;
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = l + lq_block(b, i0 + r) * lcols;
        for (int64_t c = 0; c < cols; ++c)
          if (row[lk_block(b, j0 + c)] == 0) s[r * kBk + c] = -std::numeric_limits<float>::infinity();
      }
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = l + ((geo.offset + i0 + r) / lblock) * lcols;
      for (int64_t c = 0; c < cols; ++c)
        if (row[(j0 + c) / lblock] == 0) s[r * kBk + c] = -std::numeric_limits<float>::infinity();
    }
  }
  // What a tile's scores s (leading dimension kBk) take beyond q.k: ALiBi and the bias times mult (the
  // scores' domain), then a partial layout tile's -inf.
  void add_extras(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s, float mult,
                  uint8_t state) const {
    if (alibi) add_alibi(bh, i0, rows, j0, cols, s, mult);
    if (bias) add_bias(bh, i0, rows, j0, cols, s, mult);
    if (state == kPartialTile) mask_tile(bh, i0, rows, j0, cols, s);
  }
};

// kv[c] = 1 where key j0 + c is not padding, else 0; returns whether any is.
inline bool fill_key_valid(const Problem& pb, int64_t b, int64_t j0, int64_t cols, float* kv) {
  bool any = false;
  for (int64_t c = 0; c < cols; ++c) {
    const bool ok = pb.key_valid == nullptr || pb.key_valid[b * pb.S + j0 + c] != 0;
    kv[c] = ok ? 1.0f : 0.0f;
    any |= ok;
  }
  return any;
}

// Per-row allowed columns of the tile (query rows i0.. of batch row b, keys j0..j0+cols).
inline void tile_ranges(const Problem& pb, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int* lo,
                        int* hi) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t a, e;
    pb.geo.range(b, i0 + r, &a, &e);
    lo[r] = int(std::clamp<int64_t>(a - j0, 0, cols));
    hi[r] = int(std::clamp<int64_t>(e - j0, 0, cols));
  }
}

// The key ranges of the first and the last of the query rows [i0, i0 + rows) of batch row b. The rows'
// ranges grow with the row, so they bound every row's: the rows may use keys [lo_first, hi_last) only, and
// every row may use [lo_last, hi_first).
struct RowRanges {
  int64_t lo_first, hi_first, lo_last, hi_last;
  RowRanges(const Problem& pb, int64_t b, int64_t i0, int64_t rows) {
    pb.geo.range(b, i0, &lo_first, &hi_first);
    pb.geo.range(b, i0 + rows - 1, &lo_last, &hi_last);
  }
  // Some row may use a key of [j0, j0 + cols).
  bool meets(int64_t j0, int64_t cols) const { return j0 + cols > lo_first && j0 < hi_last; }
  // Every row may use every key of a whole block [j0, j0 + kBk), none of them padding (all_valid).
  bool inside(int64_t j0, int64_t cols, bool all_valid) const {
    return all_valid && cols == kBk && lo_last <= j0 && hi_first >= j0 + cols;
  }
};

// Keys [first, last) that some row of the query block [i0, i0 + rows) of batch row b may use.
inline void block_key_span(const Problem& pb, int64_t b, int64_t i0, int64_t rows, int64_t* first, int64_t* last) {
  const RowRanges r(pb, b, i0, rows);
  *first = r.lo_first;
  *last = r.hi_last;
}

// Query rows [*first, *last) of batch row b whose key ranges may meet keys [j0, j1): the rows' ranges grow
// with the row (Geometry), so two binary searches bound them (a backward's key block then walks only
// these rows, not all T).
inline void block_query_span(const Problem& pb, int64_t b, int64_t j0, int64_t j1, int64_t* first, int64_t* last) {
  int64_t lo = 0, hi = pb.T;  // first row whose range ends past j0
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    int64_t a, e;
    pb.geo.range(b, mid, &a, &e);
    if (e > j0)
      hi = mid;
    else
      lo = mid + 1;
  }
  *first = lo;
  hi = pb.T;  // first row whose range starts at or past j1
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    int64_t a, e;
    pb.geo.range(b, mid, &a, &e);
    if (a >= j1)
      hi = mid;
    else
      lo = mid + 1;
  }
  *last = lo;
}

// The end of a forward task: out's n rows (D apart) = o (rows ldo apart) / l, and lse = m ln 2 + ln l
// (m in the exp2 domain); a row with no allowed key (l = 0) gets out 0 and lse -inf.
inline void finish_rows(const float* o, int64_t ldo, const float* m, const float* l, int64_t n, int64_t D, float* out,
                        float* lse) {
  for (int64_t r = 0; r < n; ++r) {
    const bool any = l[r] > 0.0f;
    const float inv = any ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < D; ++d) out[r * D + d] = o[r * ldo + d] * inv;
    lse[r] = any ? m[r] / kLog2e + std::log(l[r]) : kNegInf;
  }
}

// NOTE [attention query spans]: a forward task is a span of up to kSpanBlocks query blocks of one head, and
// each key block it visits serves every query block of the span in turn: K^T and V come from L3 or memory
// once per span instead of once per 64 rows (at T = 8192 a head's K and V are 4 MiB, twice an L2). Spans
// shrink while there would be fewer than 4 tasks per thread.
constexpr int64_t kSpanBlocks = 4, kQuerySpan = kSpanBlocks * kBq;

inline int64_t query_span_blocks(int64_t heads, int64_t nqb, int threads) {
  int64_t blocks = kSpanBlocks;
  while (blocks > 1 && heads * ((nqb + blocks - 1) / blocks) < 4 * int64_t(threads)) blocks /= 2;
  return blocks;
}

// NOTE [attention amx] (attention_amx.cc): the forward on bf16 q, k and v, for any mask of pb (whose q, k and v
// are unused): its block products in AMX tiles (`tiles`: only when active_isa() >= Isa::amx) or as AVX512-BF16
// dot products on the same packed operands (NOTE [attention bf16 dot]: active_isa() >= Isa::avx512_bf16).
void forward_bf16(const Problem& pb, const bf16* q, const bf16* k, const bf16* v, float* out, float* lse, bool tiles);
// NOTE [attention amx backward]: the backward on bf16 q, k and v, likewise (dbias may be null).
void backward_bf16(const Problem& pb, const bf16* q, const bf16* k, const bf16* v, const float* out, const float* lse,
                   const float* dout, float* dq, float* dk, float* dv, float* dbias, bool tiles);
int64_t backward_bf16_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D, int threads);
// forward_bf16's scratch for one call on `threads` threads: K and V packed, per-thread span buffers.
int64_t forward_bf16_scratch_bytes(int64_t B, int64_t Hk, int64_t S, int64_t D, int threads);

}  // namespace aspen::kernels::attn
