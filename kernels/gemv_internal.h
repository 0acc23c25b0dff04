// kernels/gemv_internal.h: what gemv.cc's dispatch and the per-ISA kernel files (gemv_avx512.cc,
// gemv_avx2.cc) share: one thread's job, the packed layout's address, the blocking constants, and the
// kernels' entry points. Not part of the kernels' interface (gemv.h is).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"

namespace aspen::kernels::gemv_detail {

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
  // NOTE [gemv bf16 dot] (x_bf16, M > 1, AVX512-BF16): [K, N]: x's rows as dwords of two bf16, one per pair of
  // k (k + 1 in the low half, k in the high half), rows of ldxd = ceil(K / 2) dwords; [N, K]: x's rows in bf16,
  // rows of Kp (K rounded up to 32) zero-padded.
  const uint32_t* xd = nullptr;
  int64_t ldxd = 0;
  const bf16* xs = nullptr;
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
using NkTile = void (*)(const Job&, int64_t m0, int64_t n);  // an [N, K] tile: rows of x from m0, of w from n

// The [K, N] kernels accumulate into y in panels of columns: all M rows of a
// panel (M·P floats) stay in L1 while K rows of weights stream past. Wider
// panels make longer contiguous weight runs; 16 KiB of accumulators leaves
// most of L1 for the streams.
inline int64_t kn_panel(int64_t M) { return std::clamp<int64_t>((4096 / M) / 16 * 16, 64, 4096); }

inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(bf16 v) { return bf16_to_f32(v); }

// [N, K] tiles prefetch the next tile's rows (R rows on) at the same k: a
// row is only 1.5-6 KiB, so a fixed distance along the row would mostly
// fetch the row after, which is already being read.
// [K, N] panels prefetch the same columns this many rows ahead: a thread's
// share of a row is a short run (N / threads columns), too short for the
// hardware's stream detection, and the rows it needs next are known.
// Both into L2 (T1), not L1: those lines are used a whole tile or block later, and fetched into L1 they evicted
// the lines in use (rows 6-12 KiB apart share L1 sets). One-row products from memory, 2 threads on a Zen 4,
// fraction of the read sweep in its fast moments (~50 GB/s): f32 0.52-0.76 -> 0.80-0.98 (AVX-512 and AVX2), bf16
// unpacked 0.41-0.71 -> 0.69-0.93.
inline constexpr int64_t kKnPrefetchRows = 8;

// NOTE [gemv row blocks]: more than one row of x against [K, N]. kn_block keeps y in L1 and loads and stores
// it for every 2-4 weight rows: at M = 8 one store per 2 FMAs, and the stores set the pace (in cache, 2 threads
// on a Zen 4: ~95 GFLOP/s f32 and 40-85 bf16, oneDNN ~200). Here a strip of up to 48 columns of MB <= 8 rows stays
// in MB x 3 registers across a block of kKnBlockRows weight rows, loaded from and stored to y once per block;
// each weight vector is loaded (bf16: widened) once for the MB rows and x's values are broadcast. y[m, n] still
// starts from its bias and adds its k terms in order: the bits of kn_block. The next block's rows are
// prefetched at the strip's columns into L2 (T1), not L1: they are used a whole row later, and with rows 12 KiB
// apart (c_fc's N = 3072) every row of a block falls in one L1 set (2 threads, Zen 4, M = 8: T1 over T0 +5-15 %
// on GPT-2's [K, N] matrices). Blocks of 16 rows over 8 (the M = 1 kernels' streams): f32 +5-10 % from memory on
// both ISAs, once the prefetches went to L2; the VDPBF16PS strips 18.7 -> 35 GB/s in cache (8 rows are 4 pairs:
// the loads and stores of y and the call around them took a third of the time).
inline constexpr int64_t kKnBlockRows = 16;
// The AVX-512 M > 1 strips also prefetch their own rows this many elements ahead, into L1: at M = 8 the products
// take about as long as the reads and the hardware's prefetch alone let them take turns (GPT-2's [K, N] matrices
// at M = 8, 2 threads on a Zen 4, interleaved runs: f32 c_fc 19.4-20.2 -> 23.2-24.3 GB/s, bf16 ~21 -> ~24; the
// AVX2 strips, bound by their FMAs there, gained nothing).
inline constexpr int64_t kKnAhead = 128;

// The M > 1 [K, N] drivers' loop (NOTE [gemv row blocks]): y[:, n0:n1) starts from the bias, then each block of
// kKnBlockRows weight rows is applied to chunks of up to `rows` rows of x, a chunk of c rows by strips[c - 1].
using KnStrips = void (*)(const Job&, int64_t m0, int64_t k0, int64_t k1, int64_t n0, int64_t n1);
inline void kn_row_blocks(const Job& j, int64_t n0, int64_t n1, const KnStrips* strips, int64_t rows) {
  for (int64_t m = 0; m < j.M; ++m)
    for (int64_t n = n0; n < n1; ++n) j.y[m * j.N + n] = j.bias ? j.bias[n] : 0.0f;
  for (int64_t k0 = 0; k0 < j.K; k0 += kKnBlockRows) {
    const int64_t k1 = std::min(j.K, k0 + kKnBlockRows);
    for (int64_t m0 = 0; m0 < j.M; m0 += rows) strips[std::min(rows, j.M - m0) - 1](j, m0, k0, k1, n0, n1);
  }
}

// Each computes y[:, n0:n1) of its job; the ISA's kernels for each weight layout and type.
void nk_f32_avx512(const Job& j, int64_t n0, int64_t n1);
void nk_bf16_avx512(const Job& j, int64_t n0, int64_t n1);
void kn_f32_avx512(const Job& j, int64_t n0, int64_t n1);
void kn_bf16_avx512(const Job& j, int64_t n0, int64_t n1);
void nk_f32_avx2(const Job& j, int64_t n0, int64_t n1);
void nk_bf16_avx2(const Job& j, int64_t n0, int64_t n1);
void kn_f32_avx2(const Job& j, int64_t n0, int64_t n1);
void kn_bf16_avx2(const Job& j, int64_t n0, int64_t n1);
// bf16 weights, x_bf16, M > 1, on AVX512-BF16 (NOTE [gemv bf16 dot]).
void nk_bf16_dot(const Job& j, int64_t n0, int64_t n1);
void kn_bf16_dot(const Job& j, int64_t n0, int64_t n1);

}  // namespace aspen::kernels::gemv_detail
