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
  XRow row(int64_t m, int64_t K) const {
    const int64_t at = m * (K / 32);
    return {q.data() + at, d.data() + at, sum.data() + at};
  }
};
XQ quantize_x(const float* x, int64_t M, int64_t K) {
  XQ o;
  const int64_t blocks = K / 32;
  o.q.resize(static_cast<size_t>(M * blocks));
  for (int64_t m = 0; m < M; ++m) quantize_row_q8_0(x + m * K, K, o.q.data() + m * blocks);
  o.d.resize(o.q.size());
  o.sum.resize(o.q.size());
  for (size_t i = 0; i < o.q.size(); ++i) {
    o.d[i] = f16_value(o.q[i].d);
    int32_t t = 0;
    for (int j = 0; j < 32; ++j) t += o.q[i].qs[j];
    o.sum[i] = t;
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

ASPEN_TARGET_AVX2 __m256i load_q(const BlockQ8_0& w) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
}
ASPEN_TARGET_AVX2 __m256i load_q(const BlockQ4_0& w) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
  return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

// Eight vectors of eight int32 partial sums, one vector per row -> one vector of the eight rows' sums (exact:
// integers, in any order).
ASPEN_TARGET_AVX2 __m256i row_sums(const __m256i v[8]) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// Eight rows of W at once, lanes = rows, each lane row_dot's sequence of operations: the block's integer sums
// (maddubs on |w| and x signed by w: x is ours, in [-127, 127], so any int8 weight, -128 included, is exact,
// and two products of at most 128 · 127 fit an int16), reduced to one int32 per row, then the same f32
// multiply and fma. The weights' 8 scales are inserted into a vector one by one (stored to memory and loaded
// as a vector, they stalled on store forwarding every block). Row r's block b is
// w[r * row_step + b * block_step]: (blocks, 1) for W as stored, (1, 8) packed.
template <class W>
ASPEN_TARGET_AVX2 void rows8_avx2(const W* w, int64_t row_step, int64_t block_step, const XRow& x, int64_t blocks,
                                  float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[b].qs));
    __m256i v[8];
    for (int r = 0; r < 8; ++r) {
      const __m256i wq = load_q(w[r * row_step + b * block_step]);
      v[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wq), _mm256_sign_epi8(xq, wq)), ones);
    }
    const W* c = w + b * block_step;
    const __m128i d = _mm_setr_epi16(short(c[0].d), short(c[row_step].d), short(c[2 * row_step].d),
                                     short(c[3 * row_step].d), short(c[4 * row_step].d), short(c[5 * row_step].d),
                                     short(c[6 * row_step].d), short(c[7 * row_step].d));
    const __m256 scale = _mm256_mul_ps(_mm256_cvtph_ps(d), _mm256_set1_ps(x.d[b]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_sums(v)), scale, acc);
  }
  _mm256_storeu_ps(y, acc);
}

// Q4_K: the sub-block's integer sums by maddubs (nibbles, unsigned, against x's int8: at most 2 · 15 · 127 per
// int16) and madd, reduced per row; then row_dot's two products per sub-block in each lane.
template <>
ASPEN_TARGET_AVX2 void rows8_avx2(const BlockQ4_K* w, int64_t row_step, int64_t block_step, const XRow& x,
                                  int64_t supers, float* y) {
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t B = 0; B < supers; ++B) {
    alignas(32) float dsc[8][8], dmn[8][8];  // [sub-block][row]
    for (int r = 0; r < 8; ++r) {
      const BlockQ4_K& b = w[r * row_step + B * block_step];
      const float d = f16_value(b.d), dmin = f16_value(b.dmin);
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        q4k_scale_min(b.scales, s, &sc, &m);
        dsc[s][r] = d * float(sc), dmn[s][r] = dmin * float(m);
      }
    }
    for (int g = 0; g < 4; ++g) {
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[B * 8 + 2 * g].qs));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[B * 8 + 2 * g + 1].qs));
      __m256i v0[8], v1[8];
      for (int r = 0; r < 8; ++r) {
        const __m256i q = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(w[r * row_step + B * block_step].qs + 32 * g));
        v0[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(q, low), x0), ones);
        v1[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), x1), ones);
      }
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * g + h;
        const __m256 dx = _mm256_set1_ps(x.d[B * 8 + s]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row_sums(h ? v1 : v0)), _mm256_mul_ps(_mm256_load_ps(dsc[s]), dx),
                              acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(float(-x.sum[B * 8 + s])), _mm256_mul_ps(_mm256_load_ps(dmn[s]), dx),
                              acc);
      }
    }
  }
  _mm256_storeu_ps(y, acc);
}

// pack_rows8's permutation (`to_packed`) or its inverse: whole groups of 8 rows regrouped, the rest row by row.
template <class W>
void regroup_rows8(std::span<const W> from, int64_t N, int64_t K, std::span<W> to, bool to_packed) {
  const int64_t blocks = K / kValues<W>, groups = N / 8;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < 8; ++r) {
        const size_t rows = size_t((g * 8 + r) * blocks + b), packed = size_t((g * blocks + b) * 8 + r);
        to[to_packed ? packed : rows] = from[to_packed ? rows : packed];
      }
  std::copy(from.begin() + groups * 8 * blocks, from.begin() + N * blocks, to.begin() + groups * 8 * blocks);
}

template <class W>
void gemv_reference(const float* x, const W* w, float* y, int64_t M, int64_t N, int64_t K) {
  const XQ xq = quantize_x(x, M, K);
  const int64_t blocks = K / kValues<W>;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = row_dot(w + n * blocks, xq.row(m, K), blocks);
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
      regroup_rows8<W>(w, N, K, unpacked, /*to_packed=*/false);
    }
    gemv_reference(x.data(), packed ? unpacked.data() : w.data(), y.data(), M, N, K);
    return Status();
  }
  const XQ xq = quantize_x(x.data(), M, K);
  // Each group of 8 rows is one thread's (static), so no output depends on the thread count.
#pragma omp parallel for schedule(static) if (groups > 1 && N * K >= (1 << 16))
  for (int64_t g = 0; g < groups; ++g) {
    const W* wg = w.data() + g * 8 * blocks;  // the group's first block, in either layout
    for (int64_t m = 0; m < M; ++m)
      rows8_avx2(wg, packed ? 1 : blocks, packed ? 8 : 1, xq.row(m, K), blocks, y.data() + m * N + g * 8);
  }
  for (int64_t n = groups * 8; n < N; ++n)  // the last rows (row by row in both layouts): the reference's sequence
    for (int64_t m = 0; m < M; ++m) y[size_t(m * N + n)] = row_dot(w.data() + n * blocks, xq.row(m, K), blocks);
  return Status();
}

}  // namespace

void quantize_row_q8_0(const float* x, int64_t K, BlockQ8_0* out) {
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
  regroup_rows8(w, N, K, out, /*to_packed=*/true);
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
  regroup_rows8(w, N, K, out, /*to_packed=*/true);
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
  regroup_rows8(w, N, K, out, /*to_packed=*/true);
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
            const size_t blocks = size_t(N * (K / kValues<W>));
            regroup_rows8<W>({as_blocks<W>(w), blocks}, N, K, {reinterpret_cast<W*>(out), blocks}, /*to_packed=*/true);
          },
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
