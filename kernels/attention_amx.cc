// kernels/attention_amx.cc: attention's forward on bf16 q, k and v with AMX tiles.
//
// NOTE [attention amx]: the FlashAttention-2 forward of attention.cc (query
// spans, online softmax, lazy rescaling, the same masks and tile states) with
// its two block products in AMX tiles (kernels/matmul_amx.cc's NOTE [amx
// micro-kernel]: TDPBF16PS, 16 x 32 bf16 by 32 x 16 bf16 pairs into 16 x 16
// f32) and its softmax in AVX-512, f32:
//   s = q k^T   32 query rows x 64 keys; q's rows are A tiles as they lie
//               (a copy padded to Dp = D rounded up to 32), K is packed once
//               per call into B tiles (pairs of head dimensions per key).
//   softmax     s scaled to the exp2 domain, masked, the rows' maxima and
//               sums 16 rows at a time in registers (as the f32 fused strips),
//               p rounded to bf16 (VCVTNE2PS2BF16) into a 32 x 64 A operand.
//   o += p v    o's 32 x Do rows (Do = D rounded up to 16) are the C tiles,
//               loaded from and stored to the f32 accumulator; V is packed
//               once per call into B tiles (pairs of keys per dimension).
// Per 32 x 64 step the products are 8 TDPBF16PS each at D = 64 (256 cycles
// of the tile unit), where the f32 kernel's FMAs took about 4,100 cycles: the
// softmax (its exponentials and reductions) is now most of the time. Masks,
// ALiBi and biases go through the same tile states and helpers as the f32
// kernel. Rows past T and keys past S are padding that the masks or the
// zeros of the packing cancel: the tiles are always whole.
//
// Numerics: q.k is exact per product and summed in f32; p is rounded to bf16
// (relative 2^-9) for p v while the rows' sums l use the f32 p, as PyTorch's
// CPU flash kernel does; TDPBF16PS flushes bf16 denormals to zero. The bits
// do not depend on the thread count (each row is one task's).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/attention_avx512.h"
#include "kernels/attention_internal.h"

namespace aspen::kernels::attn {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")

namespace {

constexpr int64_t kRows = 32;        // query rows per step: two 16-row A tiles
constexpr int64_t kTileElems = 512;  // bf16 elements of one 16 x 64-byte tile
constexpr int64_t kGroup = 4;        // key blocks per pass of p v (NOTE [attention amx])

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A buffer whose elements start uninitialized (the kernels write every element before reading it; a
// std::vector would zero megabytes first).
template <class T>
struct Scratch {
  std::unique_ptr<T[]> p;
  void resize(size_t n) { p.reset(new T[n]); }
  T* data() const { return p.get(); }
  T& operator[](size_t i) const { return p[i]; }
};

// 16 bf16 of a and 16 of b as 16 words (a_j, b_j): two rows of a matrix as one row of pairs (VNNI order).
__m512i interleave16(__m256i a, __m256i b) {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// K's block [cols, D] (rows D apart) as the B operand of s = q k^T: per 32-step chunk c of the head
// dimension and 16-key tile n, a tile whose row p holds word j = (k[16 n + j][32 c + 2 p], k[..][32 c + 2 p + 1]):
// a 16 x 16 transpose of 32-bit pairs. Zeros past cols and D. Tile (c, n) at dst + (4 c + n) * kTileElems.
void pack_keys(const uint16_t* k, int64_t cols, int64_t D, int64_t Dp, uint16_t* dst) {
  for (int64_t c = 0; c < Dp / 32; ++c) {
    const int64_t left = std::clamp<int64_t>(D - 32 * c, 0, 32);
    const __mmask32 md = left >= 32 ? ~__mmask32(0) : __mmask32((1u << left) - 1u);
    for (int64_t n = 0; n < kBk / 16; ++n) {
      __m512 r[16];
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t key = 16 * n + j;
        r[j] =
            key < cols ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(md, k + key * D + 32 * c)) : _mm512_setzero_ps();
      }
      Avx512::transpose16(r);
      uint16_t* t = dst + (4 * c + n) * kTileElems;
      for (int p = 0; p < 16; ++p) _mm512_storeu_ps(reinterpret_cast<float*>(t + 32 * p), r[p]);
    }
  }
}

// V's block [cols, D] as the B operand of o += p v: per 32-key chunk c and 16-dimension tile n (of nd), a
// tile whose row p holds word j = (v[32 c + 2 p][16 n + j], v[32 c + 2 p + 1][16 n + j]). Zeros past cols
// and D. Tile (c, n) at dst + (c * nd + n) * kTileElems.
void pack_values(const uint16_t* v, int64_t cols, int64_t D, int64_t nd, uint16_t* dst) {
  for (int64_t c = 0; c < kBk / 32; ++c)
    for (int64_t n = 0; n < nd; ++n) {
      const int64_t left = std::clamp<int64_t>(D - 16 * n, 0, 16);
      const __mmask16 md = __mmask16(left >= 16 ? 0xFFFFu : (1u << left) - 1u);
      uint16_t* t = dst + (c * nd + n) * kTileElems;
      for (int64_t p = 0; p < 16; ++p) {
        const int64_t k0 = 32 * c + 2 * p;
        const __m256i a = k0 < cols ? _mm256_maskz_loadu_epi16(md, v + k0 * D + 16 * n) : _mm256_setzero_si256();
        const __m256i b =
            k0 + 1 < cols ? _mm256_maskz_loadu_epi16(md, v + (k0 + 1) * D + 16 * n) : _mm256_setzero_si256();
        _mm512_storeu_si512(t + 32 * p, interleave16(a, b));
      }
    }
}

// s [32, kBk] (unscaled q.k) = q [32, Dp] (bf16, rows Dp apart) times the packed key block kp.
void block_scores_amx(const uint16_t* q, int64_t Dp, const uint16_t* kp, float* s) {
  const int64_t q_stride = Dp * 2, s_stride = kBk * 4;
  for (int64_t cb = 0; cb < kBk / 32; ++cb) {  // keys 32 cb .. 32 cb + 31: key tiles 2 cb and 2 cb + 1
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < Dp / 32; ++c) {
      _tile_loadd(4, q + 32 * c, q_stride);
      _tile_loadd(5, q + 16 * Dp + 32 * c, q_stride);
      _tile_loadd(6, kp + (4 * c + 2 * cb) * kTileElems, 64);
      _tile_loadd(7, kp + (4 * c + 2 * cb + 1) * kTileElems, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float* sc = s + 32 * cb;
    _tile_stored(0, sc, s_stride);
    _tile_stored(1, sc + 16, s_stride);
    _tile_stored(2, sc + 16 * kBk, s_stride);
    _tile_stored(3, sc + 16 * kBk + 16, s_stride);
  }
}

// o [32, Do] (f32, rows Do apart) += p [32, 32 chunks] (bf16, rows ldp apart) times the packed value blocks
// from vp on (blocks vblock apart), over `chunks` 32-key chunks.
void block_values_amx(const uint16_t* p, int64_t ldp, const uint16_t* vp, int64_t vblock, int64_t nd,
                      int64_t chunks, float* o, int64_t Do) {
  const int64_t o_stride = Do * 4;
  for (int64_t n0 = 0; n0 < nd; n0 += 2) {
    const bool two = n0 + 1 < nd;
    float* oc = o + 16 * n0;
    _tile_loadd(0, oc, o_stride);
    _tile_loadd(2, oc + 16 * Do, o_stride);
    if (two) {
      _tile_loadd(1, oc + 16, o_stride);
      _tile_loadd(3, oc + 16 * Do + 16, o_stride);
    }
    for (int64_t c = 0; c < chunks; ++c) {
      const uint16_t* vc = vp + (c / 2) * vblock + ((c % 2) * nd + n0) * kTileElems;
      _tile_loadd(4, p + 32 * c, ldp * 2);
      _tile_loadd(5, p + 16 * ldp + 32 * c, ldp * 2);
      _tile_loadd(6, vc, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      if (two) {
        _tile_loadd(7, vc + kTileElems, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, oc, o_stride);
    _tile_stored(2, oc + 16 * Do, o_stride);
    if (two) {
      _tile_stored(1, oc + 16, o_stride);
      _tile_stored(3, oc + 16 * Do + 16, o_stride);
    }
  }
}

// NOTE [attention bf16 dot]: without AMX (Zen 4, Cooper Lake), the same three block products run as
// AVX512-BF16 dot products (VDPBF16PS) on the very operands packed for the tiles: a B tile's row p holds, for 16
// columns, the pair of values at K = 2 p, 2 p + 1 (of its 32-deep chunk), which is what VDPBF16PS takes against
// a broadcast pair of A's row. MR rows x 4 column tiles in 4 MR accumulators (MR = 6: 24 of the 32 zmm); per
// pair: 4 loads of B, MR broadcasts, 4 MR dot products (32 multiply-adds each, twice a 16-lane FMA's). The
// sums run over K in order as the tiles' do; the bits may differ from AMX's (each is exact per pair, rounded
// per accumulation); p and ds rounded to bf16 as with tiles.
//
// C [rows, 16 nt] (f32, rows ldc apart) (+)= A [rows, 32 chunks] (bf16, rows lda apart) times the tiles:
// column tile n of chunk c at chunk(c) + n kTileElems. Rows MR at a time, column tiles 4 at a time.
template <int MR, int NT>
void dot_strip(const uint16_t* a, int64_t lda, const uint16_t* const* chunk, int64_t chunks, int64_t n0, float* c,
               int64_t ldc, bool accumulate) {
  __m512 acc[MR][NT];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NT; ++n)
      acc[r][n] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * (n0 + n)) : _mm512_setzero_ps();
  for (int64_t k = 0; k < chunks; ++k) {
    const uint16_t* bk = chunk[k] + n0 * kTileElems;
    const uint16_t* ak = a + 32 * k;
    for (int p = 0; p < 16; ++p) {
      __m512bh bv[NT];
#pragma GCC unroll 4
      for (int n = 0; n < NT; ++n) bv[n] = __m512bh(_mm512_loadu_si512(bk + n * kTileElems + 32 * p));
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        uint32_t pair;
        std::memcpy(&pair, ak + r * lda + 2 * p, sizeof pair);
        const __m512bh av = __m512bh(_mm512_set1_epi32(int(pair)));
#pragma GCC unroll 4
        for (int n = 0; n < NT; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], av, bv[n]);
      }
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int n = 0; n < NT; ++n) _mm512_storeu_ps(c + r * ldc + 16 * (n0 + n), acc[r][n]);
}

template <int MR>
void dot_rows(const uint16_t* a, int64_t lda, const uint16_t* const* chunk, int64_t chunks, int64_t nt, float* c,
              int64_t ldc, bool accumulate) {
  for (int64_t n0 = 0; n0 < nt; n0 += 4) {
    switch (std::min<int64_t>(4, nt - n0)) {
      case 4:
        dot_strip<MR, 4>(a, lda, chunk, chunks, n0, c, ldc, accumulate);
        break;
      case 3:
        dot_strip<MR, 3>(a, lda, chunk, chunks, n0, c, ldc, accumulate);
        break;
      case 2:
        dot_strip<MR, 2>(a, lda, chunk, chunks, n0, c, ldc, accumulate);
        break;
      default:
        dot_strip<MR, 1>(a, lda, chunk, chunks, n0, c, ldc, accumulate);
        break;
    }
  }
}

using DotRows = void (*)(const uint16_t*, int64_t, const uint16_t* const*, int64_t, int64_t, float*, int64_t, bool);
constexpr DotRows kDotRows[6] = {dot_rows<1>, dot_rows<2>, dot_rows<3>, dot_rows<4>, dot_rows<5>, dot_rows<6>};

// C (+)= A times the tiles, chunk_at(c) giving chunk c's first column tile; K in groups of kMaxChunks chunks
// (C through memory between groups: the same sums, in the same order).
constexpr int64_t kMaxChunks = 8;
template <class ChunkAt>
void dot_product(const uint16_t* a, int64_t lda, int64_t rows, ChunkAt chunk_at, int64_t chunks, int64_t nt, float* c,
                 int64_t ldc, bool accumulate) {
  for (int64_t c0 = 0; c0 < chunks; c0 += kMaxChunks) {
    const uint16_t* chunk[kMaxChunks];
    const int64_t cn = std::min(kMaxChunks, chunks - c0);
    for (int64_t k = 0; k < cn; ++k) chunk[k] = chunk_at(c0 + k);
    for (int64_t i = 0; i < rows; i += 6)
      kDotRows[std::min<int64_t>(6, rows - i) - 1](a + i * lda + 32 * c0, lda, chunk, cn, nt, c + i * ldc, ldc,
                                                   accumulate || c0 > 0);
  }
}

// block_scores_amx's product as dot products.
void block_scores_dot(const uint16_t* q, int64_t Dp, const uint16_t* kp, float* s) {
  dot_product(
      q, Dp, kRows, [kp](int64_t c) { return kp + 4 * c * kTileElems; }, Dp / 32, kBk / 16, s, kBk, false);
}

// block_values_amx's product as dot products.
void block_values_dot(const uint16_t* p, int64_t ldp, const uint16_t* vp, int64_t vblock, int64_t nd, int64_t chunks,
                      float* o, int64_t Do) {
  dot_product(
      p, ldp, kRows, [=](int64_t c) { return vp + (c / 2) * vblock + (c % 2) * nd * kTileElems; }, chunks, nd, o, Do,
      true);
}

// One call's choice: AMX tiles, or NOTE [attention bf16 dot].
void block_scores(bool tiles, const uint16_t* q, int64_t Dp, const uint16_t* kp, float* s) {
  if (tiles)
    block_scores_amx(q, Dp, kp, s);
  else
    block_scores_dot(q, Dp, kp, s);
}

void block_values(bool tiles, const uint16_t* p, int64_t ldp, const uint16_t* vp, int64_t vblock, int64_t nd,
                  int64_t chunks, float* o, int64_t Do) {
  if (tiles)
    block_values_amx(p, ldp, vp, vblock, nd, chunks, o, Do);
  else
    block_values_dot(p, ldp, vp, vblock, nd, chunks, o, Do);
}

// A tile's raw scores s (q.k) into the exp2 domain (times cs), then what they take beyond q.k as the f32
// kernel adds it (ALiBi, the bias, a partial layout tile's -inf): for the tiles that have any.
void scaled_extras(const Problem& pb, int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, uint8_t state,
                   float cs, float* s) {
  for (int64_t y = 0; y < rows * kBk; ++y) s[y] *= cs;
  pb.add_extras(bh, i0, rows, j0, cols, s, kLog2e, state);
}

// 2^x for p: degree-4 interpolation of 2^f on [-1/2, 1/2] at Chebyshev nodes (relative error 3.5e-6, far
// below the 2^-9 of p's rounding to bf16; two FMAs fewer than exp2_512's). Unless `finite`, x < -126 (and
// -inf) give +0.
template <bool kFinite>
__m512 exp2_p(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 e = _mm512_set1_ps(9.666368515e-03f);
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(5.592197584e-02f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(2.402234904e-01f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(6.931210452e-01f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.0f));
  if constexpr (kFinite) return _mm512_scalef_ps(e, n);
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);  // false for -inf, NaN
  return _mm512_maskz_scalef_ps(live, e, n);
}

// One online-softmax step for rows <= 16 of a step, in two halves so that the caller can add the pending
// p v of earlier key blocks (NOTE [attention amx]: p v runs once per group of key blocks) before o is
// rescaled. s holds the raw scores q.k (cs > 0 puts them in the exp2 domain); with `allow` (4 masks per
// row) the cleared keys become -inf in s.
struct RowsStep {
  int64_t rows;
  __mmask16 live, moved;  // the rows; those whose reference moves (o and l rescaled by alpha)
  __m512 m_new, alpha;
};

// The first half: the rows' maxima and the lazy rescale's decision (as fused_group_512 in
// attention_avx512.cc: a reference moves only when passed by kLazyRescale; a row with no key yet keeps
// m = -inf).
RowsStep softmax_max(float* s, int64_t rows, const __mmask16* allow, float cs, const float* m) {
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __m512 part[16];
  for (int64_t r = 0; r < 16; ++r) part[r] = neg_inf;
  for (int64_t r = 0; r < rows; ++r) {
    __m512 x[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      x[v] = _mm512_load_ps(s + r * kBk + 16 * v);
      if (allow) {
        x[v] = _mm512_mask_blend_ps(allow[4 * r + v], neg_inf, x[v]);
        _mm512_store_ps(s + r * kBk + 16 * v, x[v]);
      }
    }
    part[r] = _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
  }
  RowsStep st;
  st.rows = rows;
  st.live = tail_mask(rows);
  const __m512 m_old = _mm512_mask_loadu_ps(_mm512_setzero_ps(), st.live, m);
  const __m512 m_max = _mm512_max_ps(m_old, _mm512_mul_ps(Avx512::lanes_reduce<true>(part), _mm512_set1_ps(cs)));
  st.moved = _mm512_mask_cmp_ps_mask(st.live, _mm512_sub_ps(m_max, m_old), _mm512_set1_ps(kLazyRescale), _CMP_GT_OQ);
  st.m_new = _mm512_mask_blend_ps(st.moved, m_old, m_max);
  st.alpha = _mm512_mask_blend_ps(st.moved, _mm512_set1_ps(1.0f), Avx512::exp2_512(_mm512_sub_ps(m_old, st.m_new)));
  return st;
}

// The second half: o's moved rows (Do apart) rescaled, p = 2^(cs s - m) rounded to bf16 into p (rows ldp
// apart), the sums l and references m updated. `finite`: no score is -inf.
// With z (dropout's multipliers, rows kBk apart), p is written times z; l sums the undropped p.
template <bool kFinite>
void softmax_exp(const float* s, const RowsStep& st, float cs, float* m, float* l, float* o, int64_t Do, uint16_t* p,
                 int64_t ldp, const float* z) {
  alignas(64) float mn[16], al[16];
  const __mmask16 empty = _mm512_cmp_ps_mask(st.m_new, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ);
  _mm512_store_ps(mn, _mm512_mask_blend_ps(empty, st.m_new, _mm512_setzero_ps()));
  _mm512_store_ps(al, st.alpha);
  const __m512 csv = _mm512_set1_ps(cs);
  __m512 part[16];
  for (int64_t r = 0; r < 16; ++r) part[r] = _mm512_setzero_ps();
  for (int64_t r = 0; r < st.rows; ++r) {
    const __m512 mv = _mm512_set1_ps(mn[r]);
    __m512 e[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) e[v] = exp2_p<kFinite>(_mm512_fmsub_ps(_mm512_load_ps(s + r * kBk + 16 * v), csv, mv));
    part[r] = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
    if (z)
      for (int v = 0; v < 4; ++v) e[v] = _mm512_mul_ps(e[v], _mm512_load_ps(z + r * kBk + 16 * v));
    _mm512_storeu_si512(p + r * ldp, __m512i(_mm512_cvtne2ps_pbh(e[1], e[0])));
    _mm512_storeu_si512(p + r * ldp + 32, __m512i(_mm512_cvtne2ps_pbh(e[3], e[2])));
    if (al[r] == 1.0f) continue;
    const __m512 av = _mm512_set1_ps(al[r]);
    for (int64_t d = 0; d < Do; d += 16)
      _mm512_storeu_ps(o + r * Do + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Do + d), av));
  }
  const __m512 l_old = _mm512_mask_loadu_ps(_mm512_setzero_ps(), st.live, l);
  _mm512_mask_storeu_ps(l, st.live, _mm512_fmadd_ps(l_old, st.alpha, Avx512::lanes_reduce<false>(part)));
  _mm512_mask_storeu_ps(m, st.live, st.m_new);
}

}  // namespace

void forward_bf16(const Problem& pb, const bf16* q16, const bf16* k16, const bf16* v16, float* out, float* lse,
                  bool tiles) {
  const auto* q = reinterpret_cast<const uint16_t*>(q16);
  const auto* k = reinterpret_cast<const uint16_t*>(k16);
  const auto* v = reinterpret_cast<const uint16_t*>(v16);
  const int64_t D = pb.D, T = pb.T, S = pb.S, Dp = round_up(D, 32), Do = round_up(D, 16), nd = Do / 16;
  const int nt = omp_get_max_threads();
  const int64_t nkb = (S + kBk - 1) / kBk, kblock = Dp * kBk, vblock = kBk * Do;
  // NOTE [attention keys transposed once], for the tiles: every key block of every kv head packed once.
  Scratch<uint16_t> kpack, vpack;
  kpack.resize(size_t(pb.B * pb.Hk * nkb * kblock));
  vpack.resize(size_t(pb.B * pb.Hk * nkb * vblock));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t u = 0; u < pb.B * pb.Hk * nkb; ++u) {
    const int64_t kvh = u / nkb, j0 = (u % nkb) * kBk, cols = std::min(kBk, S - j0);
    pack_keys(k + (kvh * S + j0) * D, cols, D, Dp, kpack.data() + u * kblock);
    pack_values(v + (kvh * S + j0) * D, cols, D, nd, vpack.data() + u * vblock);
  }
  const int64_t nqb = (T + kBq - 1) / kBq;
  const int64_t span_blocks = query_span_blocks(pb.B * pb.H, nqb, nt);  // NOTE [attention query spans]
  const int64_t nspan = (nqb + span_blocks - 1) / span_blocks, tasks = pb.B * pb.H * nspan;
  const float cs = pb.scale * kLog2e;
  // Per thread: q's rows padded to Dp, o, m and l for a span (kQuerySpan is whole steps).
  static_assert(kQuerySpan % kRows == 0);
  const int64_t span_rows = kQuerySpan;
  const int64_t per = span_rows * Dp * 2 + span_rows * Do * 4 + 2 * span_rows * 4;
  std::vector<char> scratch(size_t(per * nt));
#pragma omp parallel num_threads(nt)
  {
    char* mine = scratch.data() + per * omp_get_thread_num();
    uint16_t* qs = reinterpret_cast<uint16_t*>(mine);
    float* o = reinterpret_cast<float*>(mine + span_rows * Dp * 2);
    float* m = o + span_rows * Do;
    float* l = m + span_rows;
    alignas(64) float s[kRows * kBk];
    alignas(64) uint16_t p[kRows * kGroup * kBk] = {};  // the pending blocks' p, rows kGroup * kBk apart
    alignas(64) float kv[kGroup][kBk];
    alignas(64) float z[kRows * kBk];  // dropout's multipliers
    bool any_valid[kGroup], all_valid[kGroup];
    __mmask16 allow[kRows * 4];
    int lo[kRows], hi[kRows];
    if (tiles) _tile_loadconfig(&amx_tiles_16x64());
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      // NOTE [attention query spans]: the spans that visit the most key blocks (causal: the last) go first.
      const int64_t bh = t % (pb.B * pb.H), span = nspan - 1 - t / (pb.B * pb.H), b = bh / pb.H;
      const int64_t i_begin = span * span_blocks * kBq, n = std::min(span_blocks * kBq, T - i_begin);
      const int64_t kvh = pb.kv_head(bh);
      std::memset(qs, 0, size_t(span_rows * Dp * 2));
      for (int64_t r = 0; r < n; ++r) std::memcpy(qs + r * Dp, q + (bh * T + i_begin + r) * D, size_t(D * 2));
      std::fill_n(o, span_rows * Do, 0.0f);
      std::fill_n(m, span_rows, kNegInf);
      std::fill_n(l, span_rows, 0.0f);
      const int64_t nsteps = (n + kRows - 1) / kRows;
      int64_t first = 0, last = 0;
      block_key_span(pb, b, i_begin, n, &first, &last);
      for (int64_t g0 = first / kBk * kBk; g0 < last; g0 += kGroup * kBk) {  // a group of key blocks
        const int64_t nb = std::min<int64_t>(kGroup, (last - g0 + kBk - 1) / kBk);
        for (int64_t x = 0; x < nb; ++x) {
          const int64_t cols = std::min(kBk, S - g0 - x * kBk);
          any_valid[x] = fill_key_valid(pb, b, g0 + x * kBk, cols, kv[x]);
          all_valid[x] = pb.key_valid == nullptr || std::all_of(kv[x], kv[x] + cols, [](float y) { return y != 0.0f; });
        }
        for (int64_t u = 0; u < nsteps; ++u) {
          const int64_t i0 = i_begin + u * kRows, rows = std::min(kRows, T - i0), at = u * kRows;
          const RowRanges ranges(pb, b, i0, rows);
          int64_t pending = 0, pending_first = 0;  // key blocks whose p waits in p, from block pending_first
          const auto flush = [&] {
            if (pending > 0)
              block_values(tiles, p, kGroup * kBk, vpack.data() + (kvh * nkb + pending_first) * vblock, vblock, nd,
                           2 * pending, o + at * Do, Do);
            pending = 0;
          };
          for (int64_t x = 0; x < nb; ++x) {
            const int64_t j0 = g0 + x * kBk, cols = std::min(kBk, S - j0);
            const uint8_t state = pb.tile_state(bh, i0, j0);  // NOTE [attention block layouts]
            if (!any_valid[x] || !ranges.meets(j0, cols) || state == kSkipTile) {
              flush();  // the pending blocks are consecutive
              continue;
            }
            block_scores(tiles, qs + at * Dp, Dp, kpack.data() + (kvh * nkb + j0 / kBk) * kblock, s);
            const bool inside = ranges.inside(j0, cols, all_valid[x]);
            if (!inside) {
              tile_ranges(pb, b, i0, rows, j0, cols, lo, hi);
              Avx512::allow_masks(rows, lo, hi, kv[x], allow);
            }
            // A bias, ALiBi, a layout's partial tile or a negative scale: into the exp2 domain first, then the
            // bias and the layout's -inf as the f32 kernel adds them.
            const bool extra = pb.alibi || pb.bias || state == kPartialTile || !(cs > 0);
            float step_cs = cs;
            if (extra) {
              scaled_extras(pb, bh, i0, rows, j0, cols, state, cs, s);
              step_cs = 1.0f;
            }
            RowsStep st[2];
            __mmask16 moved = 0;
            for (int64_t g = 0; g < rows; g += 16) {
              st[g / 16] = softmax_max(s + g * kBk, std::min<int64_t>(16, rows - g), inside ? nullptr : allow + 4 * g,
                                       step_cs, m + at + g);
              moved |= st[g / 16].moved;
            }
            if (moved) flush();  // p v of the pending blocks before o is rescaled
            if (pending == 0) pending_first = j0 / kBk;
            uint16_t* pb_at = p + pending * kBk;
            if (pb.drop_threshold) pb.dropout_tile(bh, i0, rows, j0, cols, z);
            const float* zt = pb.drop_threshold ? z : nullptr;
            for (int64_t g = 0; g < rows; g += 16) {
              if (inside && !extra)
                softmax_exp<true>(s + g * kBk, st[g / 16], step_cs, m + at + g, l + at + g, o + (at + g) * Do, Do,
                                  pb_at + g * kGroup * kBk, kGroup * kBk, zt ? zt + g * kBk : nullptr);
              else
                softmax_exp<false>(s + g * kBk, st[g / 16], step_cs, m + at + g, l + at + g, o + (at + g) * Do, Do,
                                   pb_at + g * kGroup * kBk, kGroup * kBk, zt ? zt + g * kBk : nullptr);
            }
            ++pending;
          }
          flush();
        }
      }
      finish_rows(o, Do, m, l, n, D, out + (bh * T + i_begin) * D, lse + bh * T + i_begin);
    }
    if (tiles) _tile_release();
  }
}

int64_t forward_bf16_scratch_bytes(int64_t B, int64_t Hk, int64_t S, int64_t D, int threads) {
  const int64_t Dp = round_up(D, 32), Do = round_up(D, 16), nkb = (S + kBk - 1) / kBk;
  const int64_t per =
      kQuerySpan * Dp * 2 + kQuerySpan * Do * 4 + 2 * kQuerySpan * 4 + kRows * kBk * 4 + kRows * kGroup * kBk * 2;
  return B * Hk * nkb * kBk * (Dp + Do) * 2 + per * std::max(threads, 1);
}

namespace {

constexpr int64_t kBwdGroup = 4;  // 32-row steps whose dk, dv products run as one (NOTE [attention amx backward])
constexpr int64_t kBwdKeys = 4;   // key blocks whose dq products run as one (NOTE [attention amx backward])

// 32 bf16 from a (lanes 0-15) and b (16-31) interleaved: a0 b0 a1 b1 ...: a row of 16 pairs.
__m512i pair_rows(__m512 a, __m512 b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, __m512i(_mm512_cvtne2ps_pbh(b, a)));
}

// dst [Do rows, ldd] = src [rows, Do]^T (bf16; src rows lds apart, rows a multiple of 32, Do of 16): 32 rows
// by 16 columns at a time, pairs of rows interleaved into 16 words per column block, then one 16 x 16
// transpose of words gives 16 rows of 32 consecutive values.
void transpose_bf16(const uint16_t* src, int64_t lds, int64_t rows, int64_t Do, uint16_t* dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 32)
    for (int64_t d0 = 0; d0 < Do; d0 += 16) {
      __m512 w[16];
      for (int64_t k = 0; k < 16; ++k) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (r0 + 2 * k) * lds + d0));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (r0 + 2 * k + 1) * lds + d0));
        w[k] = _mm512_castsi512_ps(interleave16(a, b));
      }
      Avx512::transpose16(w);
      for (int64_t j = 0; j < 16; ++j) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (d0 + j) * ldd + r0), w[j]);
    }
}

// The key block's dk^T (or dv^T) [Do, kBk] (f32) into its rows of dk [cols, D] times mult.
void store_transposed(const float* acc, int64_t cols, int64_t D, float mult, float* dst) {
  const __m512 mv = _mm512_set1_ps(mult);
  for (int64_t d0 = 0; d0 < D; d0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      __m512 r[16];
      for (int64_t i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(acc + (d0 + i) * kBk + c0);  // rows past D: padding
      Avx512::transpose16(r);
      const __mmask16 md = tail_mask(D - d0);
      for (int64_t c = 0; c < std::min<int64_t>(16, cols - c0); ++c)
        _mm512_mask_storeu_ps(dst + (c0 + c) * D + d0, md, _mm512_mul_ps(r[c], mv));
    }
}

// acc [Do, kBk] (f32, rows kBk apart) += a [Do, 32 chunks] (bf16, rows lda apart) times b: per 32-row chunk c
// (of `chunks`), 4 key tiles of pairs of rows (tile n of chunk c at b + (4 c + n) * kTileElems).
void block_transposed_amx(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t chunks, int64_t nd,
                          float* acc) {
  const int64_t stride = kBk * 4;
  for (int64_t a0 = 0; a0 < nd; a0 += 2) {
    const bool two = a0 + 1 < nd;
    for (int64_t n0 = 0; n0 < kBk / 16; n0 += 2) {
      float* c0 = acc + 16 * a0 * kBk + 16 * n0;
      _tile_loadd(0, c0, stride);
      _tile_loadd(1, c0 + 16, stride);
      if (two) {
        _tile_loadd(2, c0 + 16 * kBk, stride);
        _tile_loadd(3, c0 + 16 * kBk + 16, stride);
      }
      for (int64_t c = 0; c < chunks; ++c) {
        _tile_loadd(4, a + 16 * a0 * lda + 32 * c, lda * 2);
        _tile_loadd(6, b + (4 * c + n0) * kTileElems, 64);
        _tile_loadd(7, b + (4 * c + n0 + 1) * kTileElems, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, a + 16 * (a0 + 1) * lda + 32 * c, lda * 2);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c0, stride);
      _tile_stored(1, c0 + 16, stride);
      if (two) {
        _tile_stored(2, c0 + 16 * kBk, stride);
        _tile_stored(3, c0 + 16 * kBk + 16, stride);
      }
    }
  }
}

// block_transposed_amx's product as dot products (NOTE [attention bf16 dot]).
void block_transposed_dot(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t chunks, int64_t nd, float* acc) {
  dot_product(
      a, lda, 16 * nd, [b](int64_t c) { return b + 4 * c * kTileElems; }, chunks, kBk / 16, acc, kBk, true);
}

void block_transposed(bool tiles, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t chunks, int64_t nd,
                      float* acc) {
  if (tiles)
    block_transposed_amx(a, lda, b, chunks, nd, acc);
  else
    block_transposed_dot(a, lda, b, chunks, nd, acc);
}

// What one backward call shares: the operands in the tiles' layouts and the rows' constants.
struct Backward {
  const Problem& pb;
  bool tiles;  // AMX, else NOTE [attention bf16 dot]
  int64_t D, Dp, Do, nd, T, Tp, S, nkb, kblock, vblock;
  float cs;
  Scratch<uint16_t> q, g;    // q and dout [B H, Tp, Dp] bf16, rows padded
  Scratch<uint16_t> qt, gt;  // their transposes [B H, Do, Tp]
  Scratch<uint16_t> kt, vt;  // k and v as B tiles of q k^T, dout v^T (pack_keys), per key block
  Scratch<uint16_t> kp;      // k as B tiles of ds k (pack_values), per key block
  Scratch<float> lse2, di;   // per query row: lse log2 e (+inf: no key, p = 0), rowsum(dout out)
  Scratch<float> dq;         // dq's accumulator [B H, Tp, Do]
  float* dbias;
};

// Per thread.
struct BackwardScratch {
  alignas(64) float s[kRows * kBk];
  alignas(64) float dp[kRows * kBk];
  alignas(
      64) uint16_t ds[kRows * kBwdKeys * kBk];  // ds of kBwdKeys key blocks, rows kBwdKeys kBk apart (A of dq += ds k)
  alignas(64) uint16_t p_pairs[kBwdKeys][kBwdGroup * 4 * kTileElems];   // per key block: p, pairs of rows (B of dv^T)
  alignas(64) uint16_t ds_pairs[kBwdKeys][kBwdGroup * 4 * kTileElems];  // ds, likewise (B of dk^T += q^T ds)
  alignas(64) float kv[kBwdKeys][kBk];
  alignas(64) float z[kRows * kBk];  // dropout's multipliers
  __mmask16 allow[kRows * 4];
  int lo[kRows], hi[kRows];
};

// The step of rows [i0, i0 + rows) of head bh (i0 a multiple of kRows) against key block j0, block xb of the
// walk's kBwdKeys (kv[xb] filled): p and ds into slot `slot` of block xb's pairs, ds into columns xb kBk.. of
// the ds rows, dbias's rows when wanted. False when the tile is masked out.
bool backward_step(const Backward& bw, BackwardScratch& w, int64_t bh, int64_t i0, int64_t j0, int64_t xb,
                   bool all_valid, int64_t slot, bool write_dbias) {
  const Problem& pb = bw.pb;
  const int64_t b = bh / pb.H, kvh = pb.kv_head(bh), rows = std::min(kRows, bw.T - i0), cols = std::min(kBk, bw.S - j0);
  const RowRanges ranges(pb, b, i0, rows);
  const uint8_t state = pb.tile_state(bh, i0, j0);
  if (!ranges.meets(j0, cols) || state == kSkipTile) return false;
  const int64_t blk = kvh * bw.nkb + j0 / kBk;
  block_scores(bw.tiles, bw.q.data() + (bh * bw.Tp + i0) * bw.Dp, bw.Dp, bw.kt.data() + blk * bw.kblock, w.s);
  block_scores(bw.tiles, bw.g.data() + (bh * bw.Tp + i0) * bw.Dp, bw.Dp, bw.vt.data() + blk * bw.kblock, w.dp);
  const bool inside = ranges.inside(j0, cols, all_valid);
  if (!inside) {
    tile_ranges(pb, b, i0, rows, j0, cols, w.lo, w.hi);
    Avx512::allow_masks(rows, w.lo, w.hi, w.kv[xb], w.allow);
  }
  const bool extra = pb.alibi || pb.bias || state == kPartialTile;
  float cs = bw.cs;
  if (extra) {  // as the forward
    scaled_extras(pb, bh, i0, rows, j0, cols, state, cs, w.s);
    cs = 1.0f;
  }
  const __m512 csv = _mm512_set1_ps(cs), neg_inf = _mm512_set1_ps(kNegInf), zero = _mm512_setzero_ps();
  const bool drop = pb.drop_threshold != 0;  // out = (p z) v: dp = z (dout v^T), ds = p (dp - di), dv = (p z)^T dout
  if (drop) pb.dropout_tile(bh, i0, rows, j0, cols, w.z);
  uint16_t* pp = w.p_pairs[xb] + slot * 4 * kTileElems;
  uint16_t* dsp = w.ds_pairs[xb] + slot * 4 * kTileElems;
  uint16_t* dsr = w.ds + xb * kBk;          // rows kBwdKeys kBk apart
  for (int64_t r = 0; r < kRows; r += 2) {  // two rows: one row of pairs
    __m512 p[2][4], ds[2][4];
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t row = r + h;
      if (row >= rows) {
        for (int v = 0; v < 4; ++v) p[h][v] = ds[h][v] = zero;
        continue;
      }
      const __m512 l2 = _mm512_set1_ps(bw.lse2[size_t(bh * bw.T + i0 + row)]);
      const __m512 dir = _mm512_set1_ps(bw.di[size_t(bh * bw.T + i0 + row)]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        __m512 x = _mm512_fmsub_ps(_mm512_load_ps(w.s + row * kBk + 16 * v), csv, l2);
        if (!inside) x = _mm512_mask_blend_ps(w.allow[4 * row + v], neg_inf, x);
        p[h][v] = exp2_p<false>(x);
        __m512 dpv = _mm512_load_ps(w.dp + row * kBk + 16 * v);
        if (drop) {
          const __m512 zv = _mm512_load_ps(w.z + row * kBk + 16 * v);
          dpv = _mm512_mul_ps(dpv, zv);
          ds[h][v] = _mm512_mul_ps(p[h][v], _mm512_sub_ps(dpv, dir));
          p[h][v] = _mm512_mul_ps(p[h][v], zv);
        } else {
          ds[h][v] = _mm512_mul_ps(p[h][v], _mm512_sub_ps(dpv, dir));
        }
      }
      if (write_dbias) {
        float* dbr = bw.dbias + (bh * bw.T + i0 + row) * bw.S + j0;
        for (int v = 0; v < 4; ++v)
          _mm512_mask_storeu_ps(dbr + 16 * v, tail_mask(std::max<int64_t>(0, cols - 16 * v)), ds[h][v]);
      }
      _mm512_store_si512(dsr + row * kBwdKeys * kBk, __m512i(_mm512_cvtne2ps_pbh(ds[h][1], ds[h][0])));
      _mm512_store_si512(dsr + row * kBwdKeys * kBk + 32, __m512i(_mm512_cvtne2ps_pbh(ds[h][3], ds[h][2])));
    }
    for (int v = 0; v < 4; ++v) {  // key tile v, row r / 2
      _mm512_store_si512(pp + v * kTileElems + (r / 2) * 32, pair_rows(p[0][v], p[1][v]));
      _mm512_store_si512(dsp + v * kTileElems + (r / 2) * 32, pair_rows(ds[0][v], ds[1][v]));
    }
  }
  return true;
}

}  // namespace

// NOTE [attention amx backward]: FlashAttention-2's backward with its five block products in AMX tiles, per
// 32 query rows x 64 keys (a step):
//   s = q k^T, dp = dout v^T      A: q's and dout's rows (bf16, padded to Dp), B: K and V packed as the
//                                 forward packs K (once per call)
//   p = 2^(cs s - lse2), ds = p (dp - di)   AVX-512, f32; p and ds rounded to bf16
//   dq += ds k                    A: ds's rows, B: K packed as the forward packs V; C: dq's f32 rows
//   dv^T += dout^T p, dk^T += q^T ds
//                                 A: dout^T and q^T (transposed once per call), B: p and ds as pairs of
//                                 rows; C: the key block's dk^T and dv^T [Do, 64] in f32, transposed into
//                                 dk and dv when the block is done. Up to kBwdGroup consecutive steps of
//                                 one head share one pass (a K dimension of up to 128 rows).
// A walk takes kBwdKeys key blocks at once: each query step visits them in turn and adds their dq products
// in one pass over dq's C tiles (ds of the visited blocks side by side, 256 keys of K), where block by block
// dq's tiles were loaded and stored for every 64 keys (14 % of a 4k forward + backward; 10 % faster at
// 4k-8k causal). The sums run in the same order as block by block: the same bits.
// The schedules are the f32 kernel's (NOTE [attention backward per head]): one pass per kv head when there
// are enough of them, else pass 1 over key blocks (dk, dv, dbias) and pass 2 over query blocks (dq), both
// walking the same steps, so the bits are the same either way and do not depend on the thread count.
void backward_bf16(const Problem& pb, const bf16* q16, const bf16* k16, const bf16* v16, const float* out,
                   const float* lse, const float* dout, float* dq, float* dk, float* dv, float* dbias, bool tiles) {
  const auto* qx = reinterpret_cast<const uint16_t*>(q16);
  const auto* kx = reinterpret_cast<const uint16_t*>(k16);
  const auto* vx = reinterpret_cast<const uint16_t*>(v16);
  const int64_t D = pb.D, T = pb.T, S = pb.S, BH = pb.B * pb.H;
  Backward bw{pb,
              tiles,
              D,
              round_up(D, 32),
              round_up(D, 16),
              round_up(D, 16) / 16,
              T,
              round_up(T, kRows),
              S,
              (S + kBk - 1) / kBk,
              0,
              0,
              pb.scale * kLog2e,
              {},
              {},
              {},
              {},
              {},
              {},
              {},
              {},
              {},
              {},
              dbias};
  bw.kblock = bw.Dp * kBk;
  bw.vblock = kBk * bw.Do;
  const int nt = omp_get_max_threads();
  // Every element below is written before it is read (pads included): no zeroing passes.
  bw.q.resize(size_t(BH * bw.Tp * bw.Dp));
  bw.g.resize(size_t(BH * bw.Tp * bw.Dp));
  bw.qt.resize(size_t(BH * bw.Do * bw.Tp));
  bw.gt.resize(size_t(BH * bw.Do * bw.Tp));
  bw.lse2.resize(size_t(BH * T));
  bw.di.resize(size_t(BH * T));
  bw.dq.resize(size_t(BH * bw.Tp * bw.Do));
  const int64_t units = pb.B * pb.Hk;
  bw.kt.resize(size_t(units * bw.nkb * bw.kblock));
  bw.vt.resize(size_t(units * bw.nkb * bw.kblock));
  bw.kp.resize(size_t(units * bw.nkb * bw.vblock));
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static) nowait
    for (int64_t u = 0; u < units * bw.nkb; ++u) {
      const int64_t kvh = u / bw.nkb, j0 = (u % bw.nkb) * kBk, cols = std::min(kBk, S - j0);
      pack_keys(kx + (kvh * S + j0) * D, cols, D, bw.Dp, bw.kt.data() + u * bw.kblock);
      pack_keys(vx + (kvh * S + j0) * D, cols, D, bw.Dp, bw.vt.data() + u * bw.kblock);
      pack_values(kx + (kvh * S + j0) * D, cols, D, bw.nd, bw.kp.data() + u * bw.vblock);
    }
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      uint16_t* qh = bw.q.data() + bh * bw.Tp * bw.Dp;
      uint16_t* gh = bw.g.data() + bh * bw.Tp * bw.Dp;
      for (int64_t i = 0; i < bw.Tp; ++i) {
        const int64_t row = bh * T + i;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < bw.Dp; d += 16) {  // past D (and past T): zeros
          const __mmask16 md = i < T ? tail_mask(std::max<int64_t>(0, D - d)) : __mmask16(0);
          const __m256i qv = _mm256_maskz_loadu_epi16(md, qx + row * D + d);
          // di from the rounded dout, as dp: ds is then exact where p is (a one-key row: 0)
          const __m256i gv = __m256i(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(md, dout + row * D + d)));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(qh + i * bw.Dp + d), qv);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(gh + i * bw.Dp + d), gv);
          const __m512 gr = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(gv), 16));
          acc = _mm512_fmadd_ps(gr, _mm512_maskz_loadu_ps(md, out + row * D + d), acc);
        }
        if (i >= T) continue;
        bw.di[size_t(row)] = _mm512_reduce_add_ps(acc);
        bw.lse2[size_t(row)] = lse[row] == kNegInf ? std::numeric_limits<float>::infinity() : lse[row] * kLog2e;
      }
      transpose_bf16(qh, bw.Dp, bw.Tp, bw.Do, bw.qt.data() + bh * bw.Do * bw.Tp, bw.Tp);
      transpose_bf16(gh, bw.Dp, bw.Tp, bw.Do, bw.gt.data() + bh * bw.Do * bw.Tp, bw.Tp);
      std::fill_n(bw.dq.data() + bh * bw.Tp * bw.Do, bw.Tp * bw.Do, 0.0f);
    }
    if (dbias) {  // elements of skipped tiles (masked) stay 0
#pragma omp for schedule(static)
      for (int64_t row = 0; row < BH * T; ++row) std::fill_n(dbias + row * S, S, 0.0f);
    }
  }
  float* dq_acc = bw.dq.data();
  const int64_t group = pb.Hk > 0 ? pb.H / pb.Hk : 0;
  const auto first_head = [&](int64_t kvh) { return (kvh / pb.Hk) * pb.H + (kvh % pb.Hk) * group; };
  std::vector<BackwardScratch> scratch(static_cast<size_t>(nt));
  std::vector<float> acc(size_t(nt) * size_t(kBwdKeys * 2 * bw.Do * kBk));

  // Key blocks J0.. (up to kBwdKeys) of kv head kvh against every step of its group's heads: their dk and dv,
  // with `with_dq` dq too (one product per step over the blocks' keys), dbias when wanted. A block a step
  // skips gets zeros in the ds rows (they add exact zeros to dq), the same sums in the same order as block by
  // block: the bits do not depend on the grouping.
  const auto walk_queries = [&](int64_t kvh, int64_t J0, bool with_dq) {
    const int tid = omp_get_thread_num();
    BackwardScratch& w = scratch[size_t(tid)];
    const int64_t nb = std::min<int64_t>(kBwdKeys, (S - J0 + kBk - 1) / kBk), blk0 = kvh * bw.nkb + J0 / kBk;
    float* acc_t = acc.data() + size_t(tid) * size_t(kBwdKeys * 2 * bw.Do * kBk);  // per block: dk^T, dv^T
    std::fill_n(acc_t, nb * 2 * bw.Do * kBk, 0.0f);
    int64_t cols[kBwdKeys] = {}, row_first = bw.T, row_last = 0;
    bool any[kBwdKeys] = {}, all_valid[kBwdKeys] = {};
    for (int64_t x = 0; x < nb; ++x) {
      cols[x] = std::min(kBk, S - J0 - x * kBk);
      any[x] = fill_key_valid(pb, kvh / pb.Hk, J0 + x * kBk, cols[x], w.kv[x]);
      all_valid[x] =
          pb.key_valid == nullptr || std::all_of(w.kv[x], w.kv[x] + cols[x], [](float y) { return y != 0.0f; });
    }
    for (int64_t bh = first_head(kvh); bh < first_head(kvh) + group; ++bh) {
      int64_t pending[kBwdKeys] = {}, pending_first[kBwdKeys] = {};
      const auto flush = [&](int64_t x) {
        if (pending[x] > 0) {
          float* dkt = acc_t + x * 2 * bw.Do * kBk;
          block_transposed(bw.tiles, bw.gt.data() + bh * bw.Do * bw.Tp + pending_first[x], bw.Tp, w.p_pairs[x],
                           pending[x], bw.nd, dkt + bw.Do * kBk);
          block_transposed(bw.tiles, bw.qt.data() + bh * bw.Do * bw.Tp + pending_first[x], bw.Tp, w.ds_pairs[x],
                           pending[x], bw.nd, dkt);
        }
        pending[x] = 0;
      };
      row_first = bw.T, row_last = 0;
      for (int64_t x = 0; x < nb; ++x) {
        if (!any[x]) continue;
        int64_t f, l;
        block_query_span(pb, bh / pb.H, J0 + x * kBk, J0 + x * kBk + cols[x], &f, &l);
        row_first = std::min(row_first, f);
        row_last = std::max(row_last, l);
      }
      for (int64_t i0 = row_first / kRows * kRows; i0 < row_last; i0 += kRows) {
        int64_t bottom = -1, top = -1;  // the first and last blocks this step visits
        for (int64_t x = 0; x < nb; ++x) {
          if (!any[x] || !backward_step(bw, w, bh, i0, J0 + x * kBk, x, all_valid[x], pending[x], dbias != nullptr)) {
            flush(x);
            for (int64_t r = 0; r < kRows; ++r) std::fill_n(w.ds + r * kBwdKeys * kBk + x * kBk, kBk, uint16_t(0));
            continue;
          }
          if (bottom < 0) bottom = x;
          top = x;
          if (pending[x] == 0) pending_first[x] = i0;
          if (++pending[x] == kBwdGroup) flush(x);
        }
        if (with_dq && top >= 0)  // the visited blocks' keys (zeros for a skipped one between them)
          block_values(bw.tiles, w.ds + bottom * kBk, kBwdKeys * kBk, bw.kp.data() + (blk0 + bottom) * bw.vblock,
                       bw.vblock, bw.nd, 2 * (top - bottom + 1), dq_acc + (bh * bw.Tp + i0) * bw.Do, bw.Do);
      }
      for (int64_t x = 0; x < nb; ++x) flush(x);
    }
    for (int64_t x = 0; x < nb; ++x) {
      const float* dkt = acc_t + x * 2 * bw.Do * kBk;
      store_transposed(dkt, cols[x], D, pb.scale, dk + (kvh * S + J0 + x * kBk) * D);
      store_transposed(dkt + bw.Do * kBk, cols[x], D, 1.0f, dv + (kvh * S + J0 + x * kBk) * D);
    }
  };

  const bool one_pass = units >= nt && (units % nt == 0 || units >= 4 * int64_t(nt));
#pragma omp parallel num_threads(nt)
  {
    if (tiles) _tile_loadconfig(&amx_tiles_16x64());
    if (one_pass) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t kvh = 0; kvh < units; ++kvh)
        for (int64_t j0 = 0; j0 < S; j0 += kBwdKeys * kBk) walk_queries(kvh, j0, true);
    } else {
      const int64_t ngroups = (bw.nkb + kBwdKeys - 1) / kBwdKeys;
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < units * ngroups; ++t) walk_queries(t / ngroups, (t % ngroups) * kBwdKeys * kBk, false);
      const int64_t nsteps = bw.Tp / kRows;
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < BH * nsteps; ++t) {
        BackwardScratch& w = scratch[size_t(omp_get_thread_num())];
        const int64_t bh = t / nsteps, i0 = (t % nsteps) * kRows, kvh = pb.kv_head(bh);
        int64_t first, last;
        block_key_span(pb, bh / pb.H, i0, std::min(kRows, T - i0), &first, &last);
        for (int64_t j0 = first / kBk * kBk; j0 < last; j0 += kBk) {
          const int64_t cols = std::min(kBk, S - j0);
          if (!fill_key_valid(pb, bh / pb.H, j0, cols, w.kv[0])) continue;
          const bool all_valid =
              pb.key_valid == nullptr || std::all_of(w.kv[0], w.kv[0] + cols, [](float y) { return y != 0.0f; });
          if (!backward_step(bw, w, bh, i0, j0, 0, all_valid, 0, false)) continue;
          block_values(bw.tiles, w.ds, kBwdKeys * kBk, bw.kp.data() + (kvh * bw.nkb + j0 / kBk) * bw.vblock, bw.vblock,
                       bw.nd, 2, dq_acc + (bh * bw.Tp + i0) * bw.Do, bw.Do);
        }
      }
    }
    if (tiles) _tile_release();
#pragma omp for schedule(static)
    for (int64_t row = 0; row < BH * T; ++row) {
      const float* a = dq_acc + ((row / T) * bw.Tp + row % T) * bw.Do;
      for (int64_t d = 0; d < D; ++d) dq[row * D + d] = pb.scale * a[d];
    }
  }
}

int64_t backward_bf16_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D, int threads) {
  const int64_t Dp = round_up(D, 32), Do = round_up(D, 16), Tp = round_up(T, kRows), nkb = (S + kBk - 1) / kBk;
  const int64_t rows = B * H * (Tp * (2 * Dp + 2 * Do) * 2 + Tp * Do * 4 + T * 8);  // q, g, qt, gt, dq, lse2, di
  const int64_t keys = B * Hk * nkb * kBk * (2 * Dp + Do) * 2;                      // kt, vt, kp
  const int64_t per = int64_t(sizeof(BackwardScratch)) + kBwdKeys * 2 * Do * kBk * 4;
  return rows + keys + per * std::max(threads, 1);
}

#pragma GCC pop_options

}  // namespace aspen::kernels::attn
