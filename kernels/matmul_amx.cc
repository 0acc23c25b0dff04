// kernels/matmul_amx.cc: the AMX variant of aspen's GEMM (matmul_aspen.cc):
// bf16 inputs, f32 accumulation in tiles, f32 output. The five loops, the
// threads and the ragged edges are matmul_aspen.cc's; this file gives the
// micro-kernel and the packing into the tiles' layout.
//
// NOTE [amx micro-kernel]: TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a
// 32 x 16 tile of B (stored as 16 rows of 16 bf16 pairs, "VNNI" order) into a
// 16 x 16 f32 tile of C: 16,384 multiply-adds per instruction. Eight tiles of
// 1 KiB: four hold C's 32 x 32 block (rows 0-15 and 16-31 by columns 0-15 and
// 16-31), two hold A's 32 rows and two B's 32 columns of one 32-step chunk of
// K. Each chunk is four loads and four products, each operand tile used
// twice. The C block stays in its tiles for the whole K block (kc padded to a
// multiple of 32 with zeros), so C is read and written once per block.
//
// NOTE [amx packing]: a panel of A (32 rows) is, per 32-step chunk of K, 32
// rows of 64 bytes (32 bf16): the two A tiles are its halves, each loaded at a
// 64-byte stride. A panel of B (32 columns) is, per chunk, two tiles of 16
// rows, row p holding the pairs (B[2p][n], B[2p+1][n]) for its 16 columns n.
// The four layouts come down to two moves: a row of 32 steps copied (A rows,
// b^T columns read 16 pairs at a time), or two rows of K interleaved (A^T, B),
// and a 16 x 16 transpose of 32-bit pairs where the pairs run the wrong way
// (A^T, b^T). Lanes and steps past the edges are zeros, so the micro-kernel
// always runs whole tiles and the padding adds exact zeros.
//
// The tile state must be granted by the OS (arch_prctl, kernels/cpu.cc) and
// configured per thread: each slab loads the configuration first (begin) and
// releases the tiles after (end), since oneDNN's AMX kernels configure the
// same threads their own way.
//
// Numerics: TDPBF16PS adds each pair's two products to the f32 sum (the
// hardware rounds once per pair, and flushes bf16 denormals to zero), so the
// bits differ from the FMA variants but not between runs or team sizes.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "kernels/matmul_backend.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace aspen::kernels {

namespace {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,amx-tile,amx-bf16")

constexpr int kMR = 32, kNR = 32, kChunk = 32;  // kChunk: steps of K per tile
constexpr int64_t kChunkBytes = 2 * 16 * 64;    // two tiles of 1 KiB

void begin() { _tile_loadconfig(&amx_tiles_16x64()); }

void end() { _tile_release(); }

// C[0:32, 0:32] (row stride ldc floats) = (load_c ? C : 0) + sum over the kcp
// (a multiple of 32) packed steps, then + bias[0:32] when given.
void ukernel(int64_t kcp, const void* pav, const void* pbv, float* c, int64_t ldc, bool load_c, const float* bias) {
  const char* pa = static_cast<const char*>(pav);
  const char* pb = static_cast<const char*>(pbv);
  const int64_t ldb = ldc * int64_t(sizeof(float));
  float* c1 = c + 16 * ldc;
  if (load_c) {
    _tile_loadd(0, c, ldb);
    _tile_loadd(1, c + 16, ldb);
    _tile_loadd(2, c1, ldb);
    _tile_loadd(3, c1 + 16, ldb);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  // The four loads first, then the four products: interleaving them (each
  // product right after its operands) measured 0.5-0.9x of this order.
  for (int64_t q = 0; q < kcp / kChunk; ++q, pa += kChunkBytes, pb += kChunkBytes) {
    _tile_loadd(4, pa, 64);
    _tile_loadd(6, pb, 64);
    _tile_loadd(5, pa + 1024, 64);
    _tile_loadd(7, pb + 1024, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldb);
  _tile_stored(1, c + 16, ldb);
  _tile_stored(2, c1, ldb);
  _tile_stored(3, c1 + 16, ldb);
  if (bias) {
    const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
    for (int i = 0; i < kMR; ++i) {
      float* row = c + i * ldc;
      _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), b0));
      _mm512_storeu_ps(row + 16, _mm512_add_ps(_mm512_loadu_ps(row + 16), b1));
    }
  }
}

// 16 rows of 16 32-bit words: out[j] word i = in[i] word j (unpack within
// 128-bit lanes, then shuffle the 4 x 4 grid of lanes).
inline void transpose_16x16(const __m512i r[16], __m512i out[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // u[4i + c], 128-bit lane L: column 4L + c of rows 4i .. 4i + 3.
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                  w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    out[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    out[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

inline __mmask32 first_n(int n) { return n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1; }
inline __mmask16 first_n16(int n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// Rows k and k + 1 (16 lanes each, `lanes` valid; row k + 1 zero when absent)
// interleaved into 16 pairs.
inline __m512i interleave(const bf16* row0, const bf16* row1, __mmask16 lanes) {
  const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                       5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i a = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(lanes, row0));
  const __m512i b = row1 ? _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(lanes, row1)) : _mm512_setzero_si512();
  return _mm512_permutex2var_epi16(a, idx, b);
}

// One chunk's 16 output rows of 16 pairs, from 16 lanes whose pairs run along
// K in memory: lane l's pairs are 64 bytes at rows[l] (steps `steps` of them
// valid; a null lane is zeros), transposed so output row p holds pair p of
// every lane.
inline void pairs_transposed(const bf16* const rows[16], int steps, char* out) {
  __m512i r[16], t[16];
  const __mmask32 m = first_n(steps);
  for (int l = 0; l < 16; ++l) r[l] = rows[l] ? _mm512_maskz_loadu_epi16(m, rows[l]) : _mm512_setzero_si512();
  transpose_16x16(r, t);
  for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + p * 64, t[p]);
}

// Packs lanes [l0, l0 + ln) and steps [k0, k0 + kc) of X into panels of 32
// lanes, per chunk of 32 steps (NOTE [amx packing]). X[l][k] is src[k*ld + l]
// (`lanes_contiguous`) or src[l*ld + k].
//   a_layout: out chunk = 32 lanes of 32 steps (A's rows);
//   else:     out chunk = 2 tiles of 16 lanes, row p = pairs (2p, 2p + 1) (B's columns).
template <bool a_layout>
void pack(const void* sv, int64_t ld, bool lanes_contiguous, int64_t l0, int64_t ln, int64_t k0, int64_t kc,
          void* outv) {
  const bf16* src = static_cast<const bf16*>(sv);
  char* out = static_cast<char*>(outv);
  const int64_t chunks = (kc + kChunk - 1) / kChunk;
  for (int64_t p0 = 0; p0 < ln; p0 += 32) {
    for (int64_t q = 0; q < chunks; ++q, out += kChunkBytes) {
      const int64_t kq = k0 + q * kChunk;
      const int steps = int(std::min<int64_t>(kChunk, k0 + kc - kq));
      for (int half = 0; half < 2; ++half) {
        const int64_t lane0 = l0 + p0 + 16 * half;
        const int lanes = int(std::clamp<int64_t>(l0 + ln - lane0, 0, 16));
        char* o = out + half * 1024;
        if (!lanes_contiguous) {
          // Lane l's steps are adjacent: A's row is 64 bytes as it is; B's pairs need the transpose.
          if (a_layout) {
            const __mmask32 m = first_n(steps);
            for (int l = 0; l < 16; ++l)
              _mm512_storeu_si512(o + l * 64, l < lanes ? _mm512_maskz_loadu_epi16(m, src + (lane0 + l) * ld + kq)
                                                        : _mm512_setzero_si512());
          } else {
            const bf16* rows[16];
            for (int l = 0; l < 16; ++l) rows[l] = l < lanes ? src + (lane0 + l) * ld + kq : nullptr;
            pairs_transposed(rows, steps, o);
          }
          continue;
        }
        // Lanes are adjacent: interleave pairs of steps; A's rows then need the transpose.
        const __mmask16 lm = first_n16(lanes);
        __m512i pairs[16];
        for (int p = 0; p < 16; ++p) {
          const int k = 2 * p;
          pairs[p] = k >= steps ? _mm512_setzero_si512()
                                : interleave(src + (kq + k) * ld + lane0,
                                             k + 1 < steps ? src + (kq + k + 1) * ld + lane0 : nullptr, lm);
        }
        if (a_layout) {
          __m512i t[16];
          transpose_16x16(pairs, t);
          for (int l = 0; l < 16; ++l) _mm512_storeu_si512(o + l * 64, t[l]);
        } else {
          for (int p = 0; p < 16; ++p) _mm512_storeu_si512(o + p * 64, pairs[p]);
        }
      }
    }
  }
}

// f32 inputs never reach this variant (gemm_isa picks the AVX-512 one), but
// the table has a slot for them.
void no_f32(const void*, int64_t, bool, int64_t, int64_t, int64_t, int64_t, void*) { __builtin_trap(); }

#pragma GCC pop_options

}  // namespace

const GemmIsa& amx_gemm_isa() {
  static const GemmIsa k = {.isa = Isa::amx,
                            .mr = kMR,
                            .nr = kNR,
                            .k_align = kChunk,
                            .packed_bytes = 2,
                            .ukernel = ukernel,
                            .pack_a = {no_f32, pack<true>},
                            .pack_b = {no_f32, pack<false>},
                            .begin = begin,
                            .end = end};
  return k;
}

}  // namespace aspen::kernels
