#include "kernels/quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

float f16_value(uint16_t bits) { return f16_to_f32(f16{bits}); }

// Values per block of each weight format.
template <class W>
constexpr int64_t kValues = std::is_same_v<W, BlockQ4_K> ? 256 : 32;

// A row of x quantized to Q8_0: its blocks, their scales as f32 (widened once, not per row group) and the sums
// of their quants (Q4_K's min terms).
struct XRow {
  const BlockQ8_0* q;
  const float* d;
  const int32_t* sum;
};
struct XQ {
  std::vector<BlockQ8_0> q;
  std::vector<float> d;
  std::vector<int32_t> sum;
  std::vector<XRow> rows;  // row m's views of the three
};
// x's rows in Q8_0, in this thread's buffers (reused: a decode step quantizes ~50 rows of x, and three fresh
// vectors each time were a measurable part of its small products). Rows in parallel when there are many
// (prefill): each row is one thread's, so the values do not depend on the count.
const XQ& quantize_x(const float* x, int64_t M, int64_t K) {
  thread_local XQ o;
  const int64_t blocks = K / 32;
  o.q.resize(static_cast<size_t>(M * blocks));
  o.d.resize(o.q.size());
  o.sum.resize(o.q.size());
  o.rows.resize(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    const int64_t at = m * blocks;
    o.rows[size_t(m)] = {o.q.data() + at, o.d.data() + at, o.sum.data() + at};
  }
  BlockQ8_0* q = o.q.data();
  float* d = o.d.data();
  int32_t* sum = o.sum.data();
#pragma omp parallel for schedule(static) if (M >= 8 && M * K >= (1 << 16))
  for (int64_t m = 0; m < M; ++m) {
    quantize_row_q8_0(x + m * K, K, q + m * blocks);
    for (int64_t i = m * blocks; i < (m + 1) * blocks; ++i) {
      d[i] = f16_value(q[i].d);
      int32_t t = 0;
      for (int j = 0; j < 32; ++j) t += q[i].qs[j];
      sum[i] = t;
    }
  }
  return o;
}

// A weight block's 32 values as int8, j = 0..31: Q8_0's as stored, Q4_0's nibbles less 8 (low nibbles are
// values 0..15, high nibbles 16..31, as ggml orders them).
int8_t weight_q(const BlockQ8_0& w, int j) { return w.qs[j]; }
int8_t weight_q(const BlockQ4_0& w, int j) {
  return int8_t(int(j < 16 ? w.qs[j] & 0xF : w.qs[j - 16] >> 4) - 8);
}

// ggml's get_scale_min_k4: Q4_K sub-block j's 6-bit scale and min.
void q4k_scale_min(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63, *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One output: the blocks in order (the header's accumulation), each block's integer sum exact.
template <class W>
float row_dot(const W* w, const XRow& x, int64_t blocks) {
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int32_t(weight_q(w[b], j)) * int32_t(x.q[b].qs[j]);
    acc = std::fma(float(isum), f16_value(w[b].d) * x.d[b], acc);
  }
  return acc;
}
template <>
float row_dot(const BlockQ4_K* w, const XRow& x, int64_t supers) {
  float acc = 0.0f;
  for (int64_t B = 0; B < supers; ++B) {
    const BlockQ4_K& b = w[B];
    const float d = f16_value(b.d), dmin = f16_value(b.dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      q4k_scale_min(b.scales, s, &sc, &m);
      const uint8_t* q = b.qs + 32 * (s / 2);
      const BlockQ8_0& xb = x.q[B * 8 + s];
      int32_t isum = 0;
      for (int j = 0; j < 32; ++j) isum += int32_t(s % 2 ? q[j] >> 4 : q[j] & 0xF) * int32_t(xb.qs[j]);
      const float dx = x.d[B * 8 + s];
      acc = std::fma(float(isum), (d * float(sc)) * dx, acc);
      acc = std::fma(float(-x.sum[B * 8 + s]), (dmin * float(m)) * dx, acc);
    }
  }
  return acc;
}

// NOTE [interleaved rows8]: the fast products read W packed (pack_rows8, once when weights are loaded): each
// whole group of 8 rows is one stream of chunks, one chunk per block column b holding the 8 rows' block b
// (8 · sizeof(W) bytes, the same size), laid out for 256-bit int8 dot products:
//   Q8_0  [ d: 8 f16 | quants: for j4 = 0..7, for row r: bytes 4 j4 .. 4 j4 + 3 of row r's block, each ^ 0x80 ]
//   Q4_0  [ d: 8 f16 | quants: for j4 = 0..3, for row r: bytes 4 j4 .. 4 j4 + 3 of row r's qs ]
//   Q4_K  [ d: 8 f16 | dmin: 8 f16 | scales: for byte k = 0..11, the 8 rows' | qs: for j4 = 0..31, for row r: 4 bytes ]
// So one 32-byte load holds four quants of each of the 8 rows, lane r = row r, and x's four matching bytes
// broadcast to every lane make each int32 lane row r's partial sum: the block's 8 integer sums come out in one
// vector, no horizontal reduction (the first layout, 8 rows' blocks one after another, spent a third of its
// time in the hadd tree). Q8_0's quants are stored + 128 (^ 0x80, unsigned) so that VPDPBUSD (unsigned by
// signed) takes them as they are, and Σ (w + 128) x less 128 Σ x is Σ w x exactly; Q4's nibbles are unsigned
// already (Q4_0 subtracts 8 Σ x). Every integer sum is exact, so the packed products give the reference's bits
// on every ISA. Rows past the last whole group follow as stored, row by row.
template <class W>
constexpr int64_t kChunk = 8 * int64_t(sizeof(W));
// Where a block's quants start (after d; Q4_K: after d, dmin and the 12 scale bytes).
template <class W>
constexpr int64_t kQuantsAt = std::is_same_v<W, BlockQ4_K> ? 16 : 2;

// Where byte o of row r's block goes in its chunk, and whether it is stored ^ 0x80.
template <class W>
constexpr int64_t chunk_offset(int64_t r, int64_t o) {
  constexpr bool q4k = std::is_same_v<W, BlockQ4_K>;
  if (o < 2) return 2 * r + o;                     // d
  if (q4k && o < 4) return 16 + 2 * r + (o - 2);   // Q4_K's dmin
  if (q4k && o < 16) return 32 + 8 * (o - 4) + r;  // Q4_K's scales, byte o - 4 of each row
  const int64_t j = o - kQuantsAt<W>;
  return 8 * kQuantsAt<W> + (j / 4) * 32 + r * 4 + j % 4;
}
template <class W>
constexpr uint8_t chunk_flip(int64_t o) {
  return std::is_same_v<W, BlockQ8_0> && o >= kQuantsAt<W> ? 0x80 : 0;
}

// pack_rows8 (`to_packed`) or its inverse, on W's bytes.
// Quants move in runs of four bytes (j % 4 stays together), groups in parallel: a byte at a time, one thread,
// packing a 124M-parameter model's Q8_0 matrices took half a second at load.
template <class W>
void regroup_rows8(const uint8_t* from, int64_t N, int64_t K, uint8_t* to, bool to_packed) {
  const int64_t blocks = K / kValues<W>, groups = N / 8, bytes = int64_t(sizeof(W));
#pragma omp parallel for schedule(static) if (groups * blocks >= 4096)
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t chunk = (g * blocks + b) * kChunk<W>;
      for (int64_t r = 0; r < 8; ++r) {
        const int64_t row = ((g * 8 + r) * blocks + b) * bytes;
        for (int64_t o = 0; o < bytes;) {
          const int64_t at = chunk + chunk_offset<W>(r, o);
          uint8_t* dst = to_packed ? to + at : to + row + o;
          const uint8_t* src = to_packed ? from + row + o : from + at;
          if (o >= kQuantsAt<W>) {
            uint32_t v;
            std::memcpy(&v, src, 4);
            if (chunk_flip<W>(o)) v ^= 0x80808080u;
            std::memcpy(dst, &v, 4);
            o += 4;
          } else {
            *dst = *src ^ chunk_flip<W>(o);
            ++o;
          }
        }
      }
    }
  const int64_t whole = groups * 8 * blocks * bytes;
  std::memcpy(to + whole, from + whole, size_t(N * blocks * bytes - whole));
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
constexpr int kS8Offset = 0;
// Unsigned |w| by x signed as w: two products of at most 128 · 127 fit maddubs' int16 (w = -128 included).
inline __m256i dot_s8(__m256i acc, __m256i packed, __m256i x) {
  const __m256i w = _mm256_xor_si256(packed, _mm256_set1_epi8(char(0x80)));
  return _mm256_add_epi32(
      acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1)));
}
inline __m256i dot_u4(__m256i acc, __m256i q, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1)));
}
// Two nibble products per int16 lane of each maddubs are at most 2 · 15 · 127 = 3810: two of them add exactly.
inline __m256i dot_u4x2(__m256i acc, __m256i q, __m256i x, __m256i p, __m256i z) {
  const __m256i sum16 = _mm256_add_epi16(_mm256_maddubs_epi16(q, x), _mm256_maddubs_epi16(p, z));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(sum16, _mm256_set1_epi16(1)));
}
#include "kernels/quant_isa.inc"
}  // namespace isa_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
namespace isa_vnni {
constexpr int kS8Offset = 128;
inline __m256i dot_s8(__m256i acc, __m256i packed, __m256i x) { return _mm256_dpbusd_epi32(acc, packed, x); }
inline __m256i dot_u4(__m256i acc, __m256i q, __m256i x) { return _mm256_dpbusd_epi32(acc, q, x); }
inline __m256i dot_u4x2(__m256i acc, __m256i q, __m256i x, __m256i p, __m256i z) {
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, q, x), p, z);
}
#include "kernels/quant_isa.inc"
}  // namespace isa_vnni
#pragma GCC pop_options

template <class W>
void gemv_reference(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K) {
  const XQ& xq = quantize_x(x, M, K);
  const int64_t blocks = K / kValues<W>;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = row_dot(w + n * blocks, xq.rows[size_t(m)], blocks);
}

// The fast products of x (quantized: xq) by packed weights (pack_rows8's order), one or several (NOTE [gemv
// groups]): the groups of 8 rows of all of them are one list, each group one thread's (static), so no output
// depends on the thread count or on the products beside it; a group's rows of x run 4 at a time against it
// (prefill), in a chunk of x rows small enough to stay in cache. Then each product's last rows (row by row in
// both layouts): the reference's sequence.
template <class W>
void packed_products(const XQ& xq, int64_t M, int64_t K, const QuantGroupCall* calls, size_t count) {
  constexpr size_t kMaxCalls = 16;
  const int64_t blocks = K / kValues<W>;
  int64_t first[kMaxCalls + 1] = {0}, values = 0;  // first[c]: product c's first group in the list
  for (size_t c = 0; c < count; ++c) {
    first[c + 1] = first[c] + calls[c].N / 8;
    values += calls[c].N * K;
  }
  const bool vnni = active_isa() >= Isa::avx512 && cpu_features().avx512_vnni;
  const int64_t groups = first[count];
  constexpr int64_t kRowChunk = 64;
  const XRow* rows = xq.rows.data();
  for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
    const int64_t mc = std::min(kRowChunk, M - m0);
#pragma omp parallel for schedule(static) if (groups > 1 && mc * values >= (1 << 16))
    for (int64_t g = 0; g < groups; ++g) {
      size_t c = 0;
      while (g >= first[c + 1]) ++c;
      const int64_t lg = g - first[c], N = calls[c].N;
      float* y_rows[kRowChunk];
      for (int64_t m = 0; m < mc; ++m) y_rows[m] = calls[c].y + (m0 + m) * N + lg * 8;
      const uint8_t* chunk = calls[c].w + lg * blocks * kChunk<W>;
      if (vnni)
        isa_vnni::group_rows<W>(chunk, blocks, rows + m0, y_rows, mc);
      else
        isa_avx2::group_rows<W>(chunk, blocks, rows + m0, y_rows, mc);
    }
  }
  for (size_t c = 0; c < count; ++c)
    for (int64_t n = calls[c].N / 8 * 8; n < calls[c].N; ++n)
      for (int64_t m = 0; m < M; ++m)
        calls[c].y[m * calls[c].N + n] = row_dot(reinterpret_cast<const W*>(calls[c].w) + n * blocks, rows[m], blocks);
}

// Every product's entry point: the checks, then the fast path or the reference (on W unpacked). `packed`:
// W in pack_rows8's order.
template <class W>
Status gemv_checked(const char* fn, std::span<const float> x, std::span<const W> w, std::span<float> y, int64_t M,
                    int64_t N, int64_t K, bool packed) {
  const int64_t per = kValues<W>, blocks = K / per, groups = N / 8;
  if (M < 1 || N < 1 || K < per || K % per != 0)
    return Status::invalid_argument(std::string(fn) + ": shape",
                                    "M, N >= 1 and K a positive multiple of " + std::to_string(per) + " (its blocks)",
                                    std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
  if (int64_t(x.size()) < M * K || int64_t(w.size()) < N * blocks || int64_t(y.size()) < M * N)
    return Status::invalid_argument(std::string(fn) + ": buffers",
                                    "x of " + std::to_string(M * K) + " values, w of " + std::to_string(N * blocks) +
                                        " blocks, y of " + std::to_string(M * N),
                                    std::to_string(x.size()) + ", " + std::to_string(w.size()) + ", " +
                                        std::to_string(y.size()));
  if (reference_mode() || active_isa() < Isa::avx2) {
    std::vector<W> unpacked;
    if (packed) {
      unpacked.resize(static_cast<size_t>(N * blocks));
      regroup_rows8<W>(reinterpret_cast<const uint8_t*>(w.data()), N, K, reinterpret_cast<uint8_t*>(unpacked.data()),
                       /*to_packed=*/false);
    }
    gemv_reference(x.data(), packed ? unpacked.data() : w.data(), y.data(), M, N, K);
    return Status();
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(w.data());
  std::vector<uint8_t> repacked;  // W as stored: packed for this call (weights fixed are packed once, outside)
  if (!packed && groups > 0) {
    repacked.resize(size_t(N * blocks) * sizeof(W));
    regroup_rows8<W>(bytes, N, K, repacked.data(), /*to_packed=*/true);
    bytes = repacked.data();
  }
  const QuantGroupCall call{bytes, y.data(), N};
  packed_products<W>(quantize_x(x.data(), M, K), M, K, &call, 1);
  return Status();
}

template <class W>
void pack_bytes(std::span<const W> w, int64_t N, int64_t K, std::span<W> out) {
  regroup_rows8<W>(reinterpret_cast<const uint8_t*>(w.data()), N, K, reinterpret_cast<uint8_t*>(out.data()),
                   /*to_packed=*/true);
}

}  // namespace

namespace {

// quantize_row_q8_0 on AVX2: the same operations on 8 lanes (the maximum of |x|, d = amax / 127 and id = 1 / d
// as scalars, y = x id, roundf as trunc(y) plus the step at |fraction| >= 1/2), so the same bits. A decode
// step quantizes each row of x on one thread while the other waits: in a perf of a Q8_0 generation the scalar
// loop's roundf calls were 2 % of it (and a trunc compiled for the baseline ISA worse).
ASPEN_TARGET_AVX2 void quantize_row_q8_0_avx2(const float* x, int64_t K, BlockQ8_0* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 half = _mm256_set1_ps(0.5f), neg_half = _mm256_set1_ps(-0.5f), one = _mm256_set1_ps(1.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* v = x + b * 32;
    __m256 xv[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      xv[i] = _mm256_loadu_ps(v + 8 * i);
      m = _mm256_max_ps(_mm256_and_ps(xv[i], abs_mask), m);  // a NaN lane keeps m, as std::max(amax, |x|)
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d).bits;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 y = _mm256_mul_ps(xv[i], idv);
      __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 f = _mm256_sub_ps(y, t);
      t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, half, _CMP_GE_OQ), one));
      t = _mm256_sub_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, neg_half, _CMP_LE_OQ), one));
      q[i] = _mm256_cvttps_epi32(t);
    }
    // int32 -> int8 (|q| <= 127: the saturating packs are exact); the packs work per 128-bit lane, the
    // permutation restores the order.
    const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs), bytes);
  }
}

}  // namespace

void quantize_row_q8_0(const float* x, int64_t K, BlockQ8_0* out) {
  if (active_isa() >= Isa::avx2) return quantize_row_q8_0_avx2(x, K, out);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d).bits;
    for (int j = 0; j < 32; ++j) out[b].qs[j] = int8_t(std::roundf(v[j] * id));
  }
}

namespace ref {
void gemv_q8_0(const float* x, const BlockQ8_0* w, float* y, int64_t M, int64_t N, int64_t K) {
  gemv_reference(x, w, y, M, N, K);
}
void gemv_q4_0(const float* x, const BlockQ4_0* w, float* y, int64_t M, int64_t N, int64_t K) {
  gemv_reference(x, w, y, M, N, K);
}
void gemv_q4_k(const float* x, const BlockQ4_K* w, float* y, int64_t M, int64_t N, int64_t K) {
  gemv_reference(x, w, y, M, N, K);
}
}  // namespace ref

Status gemv_q8_0(std::span<const float> x, std::span<const BlockQ8_0> w, std::span<float> y, int64_t M, int64_t N,
                 int64_t K) {
  return gemv_checked("gemv_q8_0", x, w, y, M, N, K, false);
}
Status gemv_q8_0_rows8(std::span<const float> x, std::span<const BlockQ8_0> packed, std::span<float> y, int64_t M,
                       int64_t N, int64_t K) {
  return gemv_checked("gemv_q8_0_rows8", x, packed, y, M, N, K, true);
}
void pack_q8_0_rows8(std::span<const BlockQ8_0> w, int64_t N, int64_t K, std::span<BlockQ8_0> out) {
  pack_bytes(w, N, K, out);
}
Status gemv_q4_0(std::span<const float> x, std::span<const BlockQ4_0> w, std::span<float> y, int64_t M, int64_t N,
                 int64_t K) {
  return gemv_checked("gemv_q4_0", x, w, y, M, N, K, false);
}
Status gemv_q4_0_rows8(std::span<const float> x, std::span<const BlockQ4_0> packed, std::span<float> y, int64_t M,
                       int64_t N, int64_t K) {
  return gemv_checked("gemv_q4_0_rows8", x, packed, y, M, N, K, true);
}
void pack_q4_0_rows8(std::span<const BlockQ4_0> w, int64_t N, int64_t K, std::span<BlockQ4_0> out) {
  pack_bytes(w, N, K, out);
}
Status gemv_q4_k(std::span<const float> x, std::span<const BlockQ4_K> w, std::span<float> y, int64_t M, int64_t N,
                 int64_t K) {
  return gemv_checked("gemv_q4_k", x, w, y, M, N, K, false);
}
Status gemv_q4_k_rows8(std::span<const float> x, std::span<const BlockQ4_K> packed, std::span<float> y, int64_t M,
                       int64_t N, int64_t K) {
  return gemv_checked("gemv_q4_k_rows8", x, packed, y, M, N, K, true);
}
void pack_q4_k_rows8(std::span<const BlockQ4_K> w, int64_t N, int64_t K, std::span<BlockQ4_K> out) {
  pack_bytes(w, N, K, out);
}

namespace {

// The typed products on raw bytes (QuantFormat), spans sized from the shape: the callers' buffers hold it.
template <class W>
const W* as_blocks(const uint8_t* w) {
  return reinterpret_cast<const W*>(w);
}
template <class W>
constexpr const char* kGemvName = std::is_same_v<W, BlockQ8_0>   ? "gemv_q8_0"
                                  : std::is_same_v<W, BlockQ4_0> ? "gemv_q4_0"
                                                                 : "gemv_q4_k";
template <class W>
Status bytes_gemv(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K, bool packed) {
  const size_t blocks = size_t(N * (K / kValues<W>));
  return gemv_checked<W>(kGemvName<W>, {x, size_t(M * K)}, {as_blocks<W>(w), blocks}, {y, size_t(M * N)}, M, N, K,
                         packed);
}
// NOTE [gemv groups] for the block formats: packed_products over all the products, x quantized once.
template <class W>
Status group_rows8(const float* x, const QuantGroupCall* calls, size_t count, int64_t M, int64_t K) {
  constexpr size_t kMaxCalls = 16;  // packed_products'
  const int64_t per = kValues<W>;
  if (M < 1 || K < per || K % per != 0 || count > kMaxCalls)
    return Status::invalid_argument(std::string(kGemvName<W>) + " group: shape",
                                    "M >= 1, K a positive multiple of " + std::to_string(per) + ", at most " +
                                        std::to_string(kMaxCalls) + " products",
                                    std::to_string(M) + "x" + std::to_string(K) + ", " + std::to_string(count));
  for (size_t c = 0; c < count; ++c)
    if (calls[c].N < 1)
      return Status::invalid_argument(std::string(kGemvName<W>) + " group: N", ">= 1", std::to_string(calls[c].N));
  if (reference_mode() || active_isa() < Isa::avx2) {
    for (size_t c = 0; c < count; ++c)
      ASPEN_RETURN_IF_ERROR(bytes_gemv<W>(x, calls[c].w, calls[c].y, M, calls[c].N, K, true));
    return Status();
  }
  packed_products<W>(quantize_x(x, M, K), M, K, calls, count);
  return Status();
}

template <class W>
constexpr QuantFormat format_of(const char* name) {
  return QuantFormat{
      .name = name,
      .block_values = kValues<W>,
      .block_bytes = int64_t(sizeof(W)),
      .gemv = [](const float* x, const uint8_t* w, float* y, int64_t M, int64_t N,
                 int64_t K) { return bytes_gemv<W>(x, w, y, M, N, K, false); },
      .gemv_rows8 = [](const float* x, const uint8_t* w, float* y, int64_t M, int64_t N,
                       int64_t K) { return bytes_gemv<W>(x, w, y, M, N, K, true); },
      .pack_rows8 =
          [](const uint8_t* w, int64_t N, int64_t K, uint8_t* out) {
            regroup_rows8<W>(w, N, K, out, /*to_packed=*/true);
          },
      .gemv_rows8_group = group_rows8<W>,
      .reference = [](const float* x, const uint8_t* w, float* y, int64_t M, int64_t N,
                      int64_t K) { gemv_reference(x, as_blocks<W>(w), y, M, N, K); }};
}
constexpr QuantFormat kFormats[] = {format_of<BlockQ8_0>("q8_0"), format_of<BlockQ4_0>("q4_0"),
                                    format_of<BlockQ4_K>("q4_k")};

}  // namespace

const QuantFormat* quant_format(std::string_view name) {
  for (const QuantFormat& f : kFormats)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace aspen::kernels
