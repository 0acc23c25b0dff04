// kernels/gemv.cc: checks, the reference, and the fast GEMV variants
// (AVX-512, AVX2, portable) for both weight layouts. See gemv.h for the
// contract and docs/kernels.md ("GEMV") for the design and measurements.
#include "kernels/gemv.h"

// GCC 12 reports -Wmaybe-uninitialized inside AVX-512 intrinsics built on
// _mm512_undefined_*() (GCC bug 105593; see kernels/convert.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

std::string GemvShape::to_string() const {
  std::string s = "gemv " + std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
  s.append(" w:").append(dtype_name(weight)).append(trans_b ? " [N,K]" : " [K,N]");
  if (has_bias) s += " +bias";
  return s;
}

Status gemv_validate(const GemvShape& s) {
  const char* k = "gemv";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "M", s.M, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", s.N, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "K", s.K, 1));
  if (s.weight != DType::f32 && s.weight != DType::bf16)
    return Status::error(Code::kUnimplemented, "gemv: weight dtype", "f32 or bf16", std::string(dtype_name(s.weight)));
  return Status();
}

namespace {

// ---- shared pieces --------------------------------------------------------------------------------

// Everything one thread needs: it computes y[:, n0:n1).
struct Job {
  const float* x;
  const void* w;
  const float* bias;
  float* y;
  int64_t M, N, K;
  int64_t ldx = 0;  // x's row stride: K, or the whole K when this job is one slice of it ([K, N])
  // bf16 [N, K] at AVX2 and AVX-512: x with each chunk of two vectors (16 or
  // 32 elements) split into its even then its odd elements, rows of Kp = K
  // rounded up to a chunk, zero-padded (NOTE [bf16 pairs]).
  const float* xp = nullptr;
  int64_t Kp = 0;
  // bf16 w in gemv_pack's layout (NOTE [packed gemv]): whole groups of 8 rows interleaved per 32 along the row.
  bool packed = false;
};

// NOTE [packed gemv]: with M = 1 a bf16 [N, K] product (the tied LM head: the largest matrix of a decode
// step) read 8 rows at a time as 8 strided streams reached ~65 % of the read sweep, where the quantized
// products, reading one stream per thread (NOTE [interleaved rows8] in quant.cc), reach the sweep. gemv_pack
// regroups each whole group of 8 rows into one stream: for each chunk of 32 k (the last one shorter: Kc), the
// 8 rows' Kc values in turn; rows past the last whole group stay as stored. The group starts where its first
// row did (n · K), so row r's values k .. of a group at w + n K are at
//   w + n K + c · 8 + r · Kc + (k - c)      c = k rounded down to 32, Kc = min(32, K - c).
// The kernels compute each row exactly as unpacked (same loads' values, same FMAs, same sums): same bits.
// A bf16 [K, N] weight (GPT-2's Conv1D) is read by the M = 1 kernel 8 rows at a time across each 32-column
// chunk: 8 streams again. Packed (AVX-512 only: that kernel's layout), each block of 8 rows holds, chunk by
// chunk (c = 0, 32, ...; width Cw = min(32, N - c)), the 8 rows' Cw values in turn: row k0 + i's column n of the
// block at w + k0 N is at w + k0 N + c · 8 + i · Cw + (n - c); rows past the last whole block stay as stored.
// The K slices and column cuts fall on whole blocks and chunks, so each thread reads one sequential stream.
// Row r's element k of the packed group at `group` (rows of L elements as stored: K for [N, K], N for [K, N]).
inline const bf16* packed_row(const bf16* group, int64_t L, int r, int64_t k) {
  const int64_t c = k / 32 * 32;
  return group + c * 8 + r * std::min<int64_t>(32, L - c) + (k - c);
}
using RangeFn = void (*)(const Job&, int64_t n0, int64_t n1);

// The [K, N] kernels accumulate into y in panels of columns: all M rows of a
// panel (M·P floats) stay in L1 while K rows of weights stream past. Wider
// panels make longer contiguous weight runs; 16 KiB of accumulators leaves
// most of L1 for the streams.
int64_t kn_panel(int64_t M) { return std::clamp<int64_t>((4096 / M) / 16 * 16, 64, 4096); }

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(bf16 v) { return bf16_to_f32(v); }

// ---- portable ------------------------------------------------------------------------------------

template <class W>
void nk_portable(const Job& j, int64_t n0, int64_t n1) {
  const W* w = static_cast<const W*>(j.w);
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < j.M; ++m) {
      float acc = 0;
      const float* x = j.x + m * j.K;
      const W* wr = w + n * j.K;
      for (int64_t k = 0; k < j.K; ++k) acc += x[k] * widen(wr[k]);
      j.y[m * j.N + n] = acc + (j.bias ? j.bias[n] : 0.0f);
    }
}

template <class W>
void kn_portable(const Job& j, int64_t n0, int64_t n1) {
  const W* w = static_cast<const W*>(j.w);
  for (int64_t m = 0; m < j.M; ++m)
    for (int64_t n = n0; n < n1; ++n) j.y[m * j.N + n] = j.bias ? j.bias[n] : 0.0f;
  for (int64_t k = 0; k < j.K; ++k) {
    const W* wr = w + k * j.N;
    for (int64_t m = 0; m < j.M; ++m) {
      const float xv = j.x[m * j.ldx + k];
      float* y = j.y + m * j.N;
      for (int64_t n = n0; n < n1; ++n) y[n] += xv * widen(wr[n]);
    }
  }
}

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

// [N, K] tiles prefetch the next tile's rows (R rows on) at the same k: a
// row is only 1.5-6 KiB, so a fixed distance along the row would mostly
// fetch the row after, which is already being read.
// [K, N] panels prefetch the same columns this many rows ahead: a thread's
// share of a row is a short run (N / threads columns), too short for the
// hardware's stream detection, and the rows it needs next are known.
inline constexpr int64_t kKnPrefetchRows = 8;

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
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T0);
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

using NkTile = void (*)(const Job&, int64_t, int64_t);

// NOTE [bf16 pairs]: a 64-byte load holds 32 bf16 weights; shifting each
// 32-bit lane left by 16 gives the even elements as exact f32, masking off the
// low half gives the odd ones. Against x split the same way (Job::xp) that is
// one load and two single-cycle ops per two FMAs, instead of two loads, two
// widening shuffles and two shifts (the f32 path's conversion of 16 at a time).
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
      if (!Packed) _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T0);
      const __m512i v = _mm512_maskz_loadu_epi16(mask, Packed ? packed_row(w, K, r, k) : w + r * K + k);
      lo[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      hi[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m512 xe = _mm512_loadu_ps(x + m * Kp + k), xo = _mm512_loadu_ps(x + m * Kp + k + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(xo, hi[r], _mm512_fmadd_ps(xe, lo[r], acc[m][r]));
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

ASPEN_TARGET_AVX512 void nk_bf16_avx512(const Job& j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (j.packed)  // M = 1, n0 on a group's first row
    for (; n + 8 <= std::min(n1, j.N / 8 * 8); n += 8) nk_tile_bf16_avx512<1, 8, true>(j, 0, n);
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

// [K, N]: y[m, p0:p1) accumulates KB weight rows at a time; each weight vector
// is loaded once and applied to all MB rows of x (broadcasts hoisted out of the
// column loop). y[m, n] gets its k terms in order whatever KB and MB are, so
// the blocking changes speed, not results.
template <class W, int MB, int KB>
ASPEN_TARGET_AVX512 void kn_block_avx512(const Job& j, int64_t m0, int64_t k, int64_t p0, int64_t p1) {
  const int64_t N = j.N;
  const W* w = static_cast<const W*>(j.w) + k * N;
  __m512 xb[MB][KB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) xb[m][i] = _mm512_set1_ps(j.x[(m0 + m) * j.ldx + k + i]);
  float* y = j.y + m0 * N;
  int64_t c = p0;
  for (; c + 16 <= p1; c += 16) {
    __m512 wv[KB];
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T0);
      wv[i] = ld16(w + i * N + c);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      __m512 a = _mm512_loadu_ps(y + m * N + c);
#pragma GCC unroll 8
      for (int i = 0; i < KB; ++i) a = _mm512_fmadd_ps(xb[m][i], wv[i], a);
      _mm512_storeu_ps(y + m * N + c, a);
    }
  }
  if (c < p1) {
    const __mmask16 mask = __mmask16((1u << (p1 - c)) - 1);
    __m512 wv[KB];
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) wv[i] = ld16(w + i * N + c, mask);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      __m512 a = _mm512_maskz_loadu_ps(mask, y + m * N + c);
#pragma GCC unroll 8
      for (int i = 0; i < KB; ++i) a = _mm512_fmadd_ps(xb[m][i], wv[i], a);
      _mm512_mask_storeu_ps(y + m * N + c, mask, a);
    }
  }
}

// NOTE [gemv row blocks]: more than one row of x against [K, N]. kn_block keeps y in L1 and loads and stores
// it for every 2-4 weight rows: at M = 8 one store per 2 FMAs, and the stores set the pace (in cache, 2 threads
// on a Zen 4: ~95 GFLOP/s f32 and 40-85 bf16, oneDNN ~200). Here a strip of up to 48 columns of MB <= 8 rows stays
// in MB x 3 registers across a block of kKnBlockRows weight rows (the M = 1 kernels' 8 streams), loaded from and
// stored to y once per block; each weight vector is loaded (bf16: widened) once for the MB rows and x's values
// are broadcast. y[m, n] still starts from its bias and adds its k terms in order: the bits of kn_block. The
// next block's rows are prefetched at the strip's columns into L2 (T1), not L1: they are used a whole row later,
// and with rows 12 KiB apart (c_fc's N = 3072) every row of a block falls in one L1 set (2 threads, Zen 4, M = 8:
// T1 over T0 +5-15 % on GPT-2's [K, N] matrices).
inline constexpr int64_t kKnBlockRows = 8;

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

using KnStrips = void (*)(const Job&, int64_t, int64_t, int64_t, int64_t, int64_t);

template <class W>
ASPEN_TARGET_AVX512 void kn_rows_avx512(const Job& j, int64_t n0, int64_t n1) {
  static constexpr KnStrips strips[8] = {kn_strips_avx512<W, 1>, kn_strips_avx512<W, 2>, kn_strips_avx512<W, 3>,
                                         kn_strips_avx512<W, 4>, kn_strips_avx512<W, 5>, kn_strips_avx512<W, 6>,
                                         kn_strips_avx512<W, 7>, kn_strips_avx512<W, 8>};
  for (int64_t m = 0; m < j.M; ++m)
    for (int64_t n = n0; n < n1; ++n) j.y[m * j.N + n] = j.bias ? j.bias[n] : 0.0f;
  for (int64_t k0 = 0; k0 < j.K; k0 += kKnBlockRows) {
    const int64_t k1 = std::min(j.K, k0 + kKnBlockRows);
    for (int64_t m0 = 0; m0 < j.M; m0 += 8) strips[std::min<int64_t>(8, j.M - m0) - 1](j, m0, k0, k1, n0, n1);
  }
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
      if (!Packed) _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T0);
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
    for (; k + 8 <= K; k += 8) kn_block_avx512<W, 1, 8>(j, 0, k, p0, p1);
    for (; k < K; ++k) kn_block_avx512<W, 1, 1>(j, 0, k, p0, p1);
  }
}

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
      _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T0);
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
      if (!Packed) _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * K + k), _MM_HINT_T0);
      const __m256i v = ld16_bf16(Packed ? packed_row(w, K, r, k) : w + r * K + k, K - k);
      const __m256 lo = bf16_even(v), hi = bf16_odd(v, high);
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) acc[m][r] = _mm256_fmadd_ps(xo[m], hi, _mm256_fmadd_ps(xe[m], lo, acc[m][r]));
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

ASPEN_TARGET_AVX2 void nk_bf16_avx2(const Job& j, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (j.packed)  // M = 1, n0 on a group's first row
    for (; n + 8 <= std::min(n1, j.N / 8 * 8); n += 8) nk_tile_bf16_avx2<1, 8, true>(j, 0, n);
  if (j.M == 1)  // 8 weight rows in flight, as at AVX-512
    for (; n + 8 <= n1; n += 8) nk_rows_bf16_avx2<8>(j, n);
  for (; n + 4 <= n1; n += 4) nk_rows_bf16_avx2<4>(j, n);
  for (; n < n1; ++n) nk_rows_bf16_avx2<1>(j, n);
}

// [K, N] f32: MB rows of x against KB weight rows; each weight vector is
// loaded once for the MB rows, the broadcasts hoisted out of the column loop
// (MB * KB + KB + 1 of the 16 registers). y[m, n] gets its k terms in order
// whatever KB and MB are.
template <int MB, int KB>
ASPEN_TARGET_AVX2 void kn_block_avx2(const Job& j, int64_t m0, int64_t k, int64_t p0, int64_t p1) {
  const int64_t N = j.N;
  const float* w = static_cast<const float*>(j.w) + k * N;
  __m256 xb[MB][KB];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) xb[m][i] = _mm256_set1_ps(j.x[(m0 + m) * j.ldx + k + i]);
  float* y = j.y + m0 * N;
  int64_t c = p0;
  for (; c + 8 <= p1; c += 8) {
    __m256 wv[KB];
#pragma GCC unroll 8
    for (int i = 0; i < KB; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T0);
      wv[i] = ld8(w + i * N + c);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      __m256 a = _mm256_loadu_ps(y + m * N + c);
#pragma GCC unroll 8
      for (int i = 0; i < KB; ++i) a = _mm256_fmadd_ps(xb[m][i], wv[i], a);
      _mm256_storeu_ps(y + m * N + c, a);
    }
  }
  for (; c < p1; ++c)  // scalar tail: fmaf keeps the vector lanes' rounding
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      float a = y[m * N + c];
#pragma GCC unroll 8
      for (int i = 0; i < KB; ++i) a = __builtin_fmaf(j.x[(m0 + m) * j.ldx + k + i], w[i * N + c], a);
      y[m * N + c] = a;
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
  using Strips = void (*)(const Job&, int64_t, int64_t, int64_t, int64_t, int64_t);
  static constexpr Strips strips[4] = {kn_strips_avx2<W, 1>, kn_strips_avx2<W, 2>, kn_strips_avx2<W, 3>,
                                       kn_strips_avx2<W, 4>};
  for (int64_t m = 0; m < j.M; ++m)
    for (int64_t n = n0; n < n1; ++n) j.y[m * j.N + n] = j.bias ? j.bias[n] : 0.0f;
  for (int64_t k0 = 0; k0 < j.K; k0 += kKnBlockRows) {
    const int64_t k1 = std::min(j.K, k0 + kKnBlockRows);
    for (int64_t m0 = 0; m0 < j.M; m0 += 4) strips[std::min<int64_t>(4, j.M - m0) - 1](j, m0, k0, k1, n0, n1);
  }
}

ASPEN_TARGET_AVX2 void kn_avx2(const Job& j, int64_t n0, int64_t n1) {  // one row of x (M > 1: kn_rows_avx2)
  const int64_t K = j.K, P = kn_panel(1);
  for (int64_t p0 = n0; p0 < n1; p0 += P) {
    const int64_t p1 = std::min(n1, p0 + P);
    for (int64_t n = p0; n < p1; ++n) j.y[n] = j.bias ? j.bias[n] : 0.0f;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) kn_block_avx2<1, 4>(j, 0, k, p0, p1);
    for (; k < K; ++k) kn_block_avx2<1, 1>(j, 0, k, p0, p1);
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
      _mm_prefetch(reinterpret_cast<const char*>(w + (i + kKnPrefetchRows) * N + c), _MM_HINT_T0);
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

ASPEN_TARGET_AVX2 void kn_bf16_avx2(const Job& j, int64_t n0, int64_t n1) {  // M = 1 (M > 1: kn_rows_avx2)
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

// ---- dispatch ------------------------------------------------------------------------------------

RangeFn pick(const GemvShape& s) {
  const Isa isa = active_isa();
  const bool b16 = s.weight == DType::bf16;
  if (isa >= Isa::avx512) {
    if (s.trans_b) return b16 ? nk_bf16_avx512 : nk_avx512<float>;
    return b16 ? kn_avx512<bf16> : kn_avx512<float>;
  }
  if (isa == Isa::avx2) {
    if (s.trans_b) return b16 ? nk_bf16_avx2 : nk_avx2;
    if (s.M > 1) return b16 ? kn_rows_avx2<bf16> : kn_rows_avx2<float>;
    return b16 ? kn_bf16_avx2 : kn_avx2;
  }
  if (s.trans_b) return b16 ? nk_portable<bf16> : nk_portable<float>;
  return b16 ? kn_portable<bf16> : kn_portable<float>;
}

// Below this many weight bytes a fork/join costs more than a second stream saves.
inline constexpr int64_t kParallelMinBytes = 256 << 10;

// NOTE [gemv split]: N is cut into contiguous pieces, aligned to 4 rows
// ([N, K]) or 16 columns, a 64-byte line of f32 ([K, N]); [K, N] weights
// above kParallelMinBytes are also cut along K into kKnSlices slices of whole
// rows (NOTE [gemv slices]). The slices depend on the shape alone and an
// output's arithmetic does not depend on where the N cuts fall, so results are
// the same for any team size.
//
// NOTE [gemv slices]: a thread's share of a [K, N] row is a short run (N /
// threads columns); split by K instead, a thread streams one contiguous block
// of whole rows. Slice 0 accumulates onto the bias in y, slice i > 0 into
// `partial` from zero, and y += partial[i] in slice order at the end.
inline constexpr int64_t kKnSlices = 2;

void run_split(const GemvShape& s, const Job& job) {
  const RangeFn fn = pick(s);
  const bool big = s.weight_bytes() >= kParallelMinBytes;
  const int64_t slices = !s.trans_b && big && s.K >= 2 * 8 ? kKnSlices : 1;
  const int64_t align = job.packed ? (s.trans_b ? 8 : 32) : s.trans_b ? 4 : 16;  // packed: whole groups, chunks
  const int64_t pieces = (s.N + align - 1) / align;
  const int64_t threads = big ? std::min<int64_t>(omp_get_max_threads(), slices * pieces) : 1;
  thread_local std::vector<float> partial;  // per calling thread, grown once
  Job jobs[kKnSlices];
  jobs[0] = job;
  if (slices > 1) {
    partial.resize(static_cast<size_t>((slices - 1) * s.M * s.N));
    const int64_t rows = s.K / slices / 8 * 8;  // whole 8-row blocks in all but the last slice
    const size_t row_bytes = size_t(s.N) * size_t(dtype_size(s.weight));
    for (int64_t i = 0; i < slices; ++i) {
      const int64_t k0 = i * rows, k1 = i == slices - 1 ? s.K : k0 + rows;
      Job& j = jobs[i];
      j = job;
      j.x = job.x + k0;
      j.w = static_cast<const char*>(job.w) + size_t(k0) * row_bytes;
      j.K = k1 - k0;
      if (i > 0) {
        j.bias = nullptr;
        j.y = partial.data() + (i - 1) * s.M * s.N;
      }
    }
  }
  const int64_t cuts = (threads + slices - 1) / slices;  // N pieces per slice
  const int64_t per = (pieces + cuts - 1) / cuts * align;
  const int64_t tasks = slices * cuts;
#pragma omp parallel for schedule(static) num_threads(int(threads)) if (threads > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n0 = std::min(s.N, t % cuts * per), n1 = std::min(s.N, n0 + per);
    if (n0 < n1) fn(jobs[t / cuts], n0, n1);
  }
  for (int64_t i = 1; i < slices; ++i) {
    const float* p = partial.data() + (i - 1) * s.M * s.N;
    for (int64_t e = 0; e < s.M * s.N; ++e) job.y[e] += p[e];
  }
}

template <class Wt>
Status checked_gemv(std::span<const float> x, std::span<const Wt> w, std::span<const float> bias, std::span<float> y,
                    const GemvShape& s) {
  ASPEN_RETURN_IF_ERROR(gemv_validate(s));
  if (s.weight != dtype_of<Wt>())
    return Status::invalid_argument("gemv: shape.weight", std::string(dtype_name(dtype_of<Wt>())) + " (w's type)",
                                    std::string(dtype_name(s.weight)));
  ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "x", x, s.x_elements()));
  ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "w", w, s.w_elements()));
  ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "y", y, s.y_elements()));
  if (s.has_bias) ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "bias", bias, s.N));
  const float* b = s.has_bias ? bias.data() : nullptr;
  if (reference_mode()) {
    ref::gemv<float, Wt>(x.data(), w.data(), b, y.data(), s);
    return Status();
  }
  gemv_run(s, x.data(), w.data(), b, y.data());
  return Status();
}

}  // namespace

namespace {
void run(const GemvShape& s, const float* x, const void* w, const float* bias, float* y, bool packed) {
  Job job{x, w, s.has_bias ? bias : nullptr, y, s.M, s.N, s.K, s.K};
  job.packed = packed;
  if (s.trans_b && s.weight == DType::bf16 && active_isa() >= Isa::avx2) {
    // NOTE [bf16 pairs]: chunks of two vectors. Per calling thread, grown once: steady state allocates nothing.
    thread_local std::vector<float> xp;
    const int64_t chunk = active_isa() >= Isa::avx512 ? 32 : 16;
    job.Kp = (s.K + chunk - 1) / chunk * chunk;
    xp.assign(static_cast<size_t>(s.M * job.Kp), 0.0f);
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t k = 0; k < s.K; ++k) {
        const int64_t c = k / chunk * chunk, i = k % chunk;
        xp[size_t(m * job.Kp + c + (i % 2) * (chunk / 2) + i / 2)] = x[m * s.K + k];
      }
    job.xp = xp.data();
  }
  run_split(s, job);
}
}  // namespace

void gemv_run(const GemvShape& s, const float* x, const void* w, const float* bias, float* y) {
  run(s, x, w, bias, y, false);
}

bool gemv_packable(const GemvShape& s) {
  if (s.weight != DType::bf16 || s.M != 1) return false;
  return s.trans_b ? s.N >= 8 : s.K >= 8 && active_isa() >= Isa::avx512;
}

namespace {
// gemv_pack's regrouping (`to_packed`) or its inverse. Both layouts are groups of 8 rows (of w as stored: N
// rows of K for [N, K], K rows of N for [K, N]) whose chunks of 32 along the row hold the 8 rows' values in turn.
void regroup(const GemvShape& s, const bf16* from, bf16* to, bool to_packed) {
  const int64_t rows = s.trans_b ? s.N : s.K, L = s.trans_b ? s.K : s.N, whole = rows / 8 * 8;
  for (int64_t n = 0; n < whole; n += 8)
    for (int64_t c = 0; c < L; c += 32) {
      const int64_t cw = std::min<int64_t>(32, L - c);
      for (int r = 0; r < 8; ++r) {
        const int64_t plain = (n + r) * L + c, packed = n * L + c * 8 + r * cw;
        std::memcpy(to + (to_packed ? packed : plain), from + (to_packed ? plain : packed), size_t(cw) * sizeof(bf16));
      }
    }
  std::memcpy(to + whole * L, from + whole * L, size_t((rows - whole) * L) * sizeof(bf16));
}
}  // namespace

void gemv_pack(const GemvShape& s, const void* w, void* out) {
  regroup(s, static_cast<const bf16*>(w), static_cast<bf16*>(out), /*to_packed=*/true);
}

void gemv_run_packed(const GemvShape& s, const float* x, const void* packed, const float* bias, float* y) {
  const bool fast = active_isa() >= (s.trans_b ? Isa::avx2 : Isa::avx512) && !reference_mode();
  if (fast) return run(s, x, packed, bias, y, true);
  // Elsewhere the rows as stored: unpacked into this thread's buffer (the portable kernels read rows).
  thread_local std::vector<bf16> rows;
  rows.resize(size_t(s.N * s.K));
  regroup(s, static_cast<const bf16*>(packed), rows.data(), /*to_packed=*/false);
  if (reference_mode())
    ref::gemv<float, bf16>(x, rows.data(), s.has_bias ? bias : nullptr, y, s);
  else
    run(s, x, rows.data(), bias, y, false);
}

Status gemv(std::span<const float> x, std::span<const float> w, std::span<const float> bias, std::span<float> y,
            const GemvShape& shape) {
  return checked_gemv<float>(x, w, bias, y, shape);
}

Status gemv(std::span<const float> x, std::span<const bf16> w, std::span<const float> bias, std::span<float> y,
            const GemvShape& shape) {
  return checked_gemv<bf16>(x, w, bias, y, shape);
}

namespace ref {

template <class T, class Wt>
void gemv(const T* x, const Wt* w, const T* bias, T* y, const GemvShape& s) {
  const int64_t M = s.M, N = s.N, K = s.K;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * T(widen(s.trans_b ? w[n * K + k] : w[k * N + n]));
      y[m * N + n] = acc + (bias ? bias[n] : T(0));
    }
}

template void gemv<float, float>(const float*, const float*, const float*, float*, const GemvShape&);
template void gemv<double, double>(const double*, const double*, const double*, double*, const GemvShape&);
template void gemv<float, bf16>(const float*, const bf16*, const float*, float*, const GemvShape&);
template void gemv<double, bf16>(const double*, const bf16*, const double*, double*, const GemvShape&);

}  // namespace ref

}  // namespace aspen::kernels
