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
        r[j] = key < cols ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(md, k + key * D + 32 * c))
                          : _mm512_setzero_ps();
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
        const __m512i w = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
        _mm512_storeu_si512(t + 32 * p, w);
      }
    }
}

// s [32, kBk] (unscaled q.k) = q [32, Dp] (bf16, rows Dp apart) times the packed key block kp.
void block_scores(const uint16_t* q, int64_t Dp, const uint16_t* kp, float* s) {
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
void block_values(const uint16_t* p, int64_t ldp, const uint16_t* vp, int64_t vblock, int64_t nd, int64_t chunks,
                  float* o, int64_t Do) {
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
  st.moved = _mm512_mask_cmp_ps_mask(st.live, _mm512_sub_ps(m_max, m_old), _mm512_set1_ps(kLazyRescale),
                                     _CMP_GT_OQ);
  st.m_new = _mm512_mask_blend_ps(st.moved, m_old, m_max);
  st.alpha = _mm512_mask_blend_ps(st.moved, _mm512_set1_ps(1.0f), Avx512::exp2_512(_mm512_sub_ps(m_old, st.m_new)));
  return st;
}

// The second half: o's moved rows (Do apart) rescaled, p = 2^(cs s - m) rounded to bf16 into p (rows ldp
// apart), the sums l and references m updated. `finite`: no score is -inf.
template <bool kFinite>
void softmax_exp(const float* s, const RowsStep& st, float cs, float* m, float* l, float* o, int64_t Do, uint16_t* p,
                 int64_t ldp) {
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
    _mm512_storeu_si512(p + r * ldp, __m512i(_mm512_cvtne2ps_pbh(e[1], e[0])));
    _mm512_storeu_si512(p + r * ldp + 32, __m512i(_mm512_cvtne2ps_pbh(e[3], e[2])));
    if (al[r] == 1.0f) continue;
    const __m512 av = _mm512_set1_ps(al[r]);
    for (int64_t d = 0; d < Do; d += 16) _mm512_storeu_ps(o + r * Do + d, _mm512_mul_ps(_mm512_loadu_ps(o + r * Do + d), av));
  }
  const __m512 l_old = _mm512_mask_loadu_ps(_mm512_setzero_ps(), st.live, l);
  _mm512_mask_storeu_ps(l, st.live, _mm512_fmadd_ps(l_old, st.alpha, Avx512::lanes_reduce<false>(part)));
  _mm512_mask_storeu_ps(m, st.live, st.m_new);
}

}  // namespace

void forward_amx(const Problem& pb, const bf16* q16, const bf16* k16, const bf16* v16, float* out, float* lse) {
  const auto* q = reinterpret_cast<const uint16_t*>(q16);
  const auto* k = reinterpret_cast<const uint16_t*>(k16);
  const auto* v = reinterpret_cast<const uint16_t*>(v16);
  const int64_t D = pb.D, T = pb.T, S = pb.S, Dp = round_up(D, 32), Do = round_up(D, 16), nd = Do / 16;
  const int nt = omp_get_max_threads();
  const int64_t nkb = (S + kBk - 1) / kBk, kblock = Dp * kBk, vblock = kBk * Do;
  // NOTE [attention keys transposed once], for the tiles: every key block of every kv head packed once.
  std::vector<uint16_t> kpack(size_t(pb.B * pb.Hk * nkb * kblock)), vpack(size_t(pb.B * pb.Hk * nkb * vblock));
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
    bool any_valid[kGroup], all_valid[kGroup];
    __mmask16 allow[kRows * 4];
    int lo[kRows], hi[kRows];
    _tile_loadconfig(&amx_tiles_16x64());
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
          int64_t lo_first, hi_first, lo_last, hi_last;
          pb.geo.range(b, i0, &lo_first, &hi_first);
          pb.geo.range(b, i0 + rows - 1, &lo_last, &hi_last);
          int64_t pending = 0, pending_first = 0;  // key blocks whose p waits in p, from block pending_first
          const auto flush = [&] {
            if (pending > 0)
              block_values(p, kGroup * kBk, vpack.data() + (kvh * nkb + pending_first) * vblock, vblock, nd,
                           2 * pending, o + at * Do, Do);
            pending = 0;
          };
          for (int64_t x = 0; x < nb; ++x) {
            const int64_t j0 = g0 + x * kBk, cols = std::min(kBk, S - j0);
            const uint8_t state = pb.tile_state(bh, i0, j0);  // NOTE [attention block layouts]
            // the rows' ranges grow with the row: [lo_first, hi_last) holds them all
            if (!any_valid[x] || j0 + cols <= lo_first || j0 >= hi_last || state == kSkipTile) {
              flush();  // the pending blocks are consecutive
              continue;
            }
            block_scores(qs + at * Dp, Dp, kpack.data() + (kvh * nkb + j0 / kBk) * kblock, s);
            const bool inside = all_valid[x] && cols == kBk && lo_last <= j0 && hi_first >= j0 + cols;
            if (!inside) {
              tile_ranges(pb, b, i0, rows, j0, cols, lo, hi);
              Avx512::allow_masks(rows, lo, hi, kv[x], allow);
            }
            // A bias, ALiBi, a layout's partial tile or a negative scale: into the exp2 domain first, then the
            // bias and the layout's -inf as the f32 kernel adds them.
            const bool extra = pb.alibi || pb.bias || state == kPartialTile || !(cs > 0);
            float step_cs = cs;
            if (extra) {
              for (int64_t y = 0; y < rows * kBk; ++y) s[y] *= cs;
              if (pb.alibi) pb.add_alibi(bh, i0, rows, j0, cols, s, kLog2e);
              if (pb.bias) pb.add_bias(bh, i0, rows, j0, cols, s, kLog2e);
              if (state == kPartialTile) pb.mask_tile(bh, i0, rows, j0, cols, s);
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
            for (int64_t g = 0; g < rows; g += 16) {
              if (inside && !extra)
                softmax_exp<true>(s + g * kBk, st[g / 16], step_cs, m + at + g, l + at + g, o + (at + g) * Do, Do,
                                  pb_at + g * kGroup * kBk, kGroup * kBk);
              else
                softmax_exp<false>(s + g * kBk, st[g / 16], step_cs, m + at + g, l + at + g, o + (at + g) * Do, Do,
                                   pb_at + g * kGroup * kBk, kGroup * kBk);
            }
            ++pending;
          }
          flush();
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        float* orow = out + (bh * T + i_begin + r) * D;
        const bool any = l[r] > 0.0f;
        const float inv = any ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < D; ++d) orow[d] = o[r * Do + d] * inv;
        lse[bh * T + i_begin + r] = any ? m[r] / kLog2e + std::log(l[r]) : kNegInf;
      }
    }
    _tile_release();
  }
}

int64_t forward_amx_scratch_bytes(int64_t B, int64_t Hk, int64_t S, int64_t D, int threads) {
  const int64_t Dp = round_up(D, 32), Do = round_up(D, 16), nkb = (S + kBk - 1) / kBk;
  const int64_t per = kQuerySpan * Dp * 2 + kQuerySpan * Do * 4 + 2 * kQuerySpan * 4 + kRows * kBk * 4 +
                      kRows * kGroup * kBk * 2;
  return B * Hk * nkb * kBk * (Dp + Do) * 2 + per * std::max(threads, 1);
}

#pragma GCC pop_options

}  // namespace aspen::kernels::attn
