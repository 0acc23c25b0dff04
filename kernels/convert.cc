#include "kernels/convert.h"

// GCC 12 reports -Wmaybe-uninitialized inside AVX-512 intrinsics built on
// _mm512_undefined_*() (GCC bug 105593, fixed in GCC 13); the reported
// locations are in the intrinsics header, so silence it there only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>

#include "core/philox.h"
#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

// ---------------------------------------------------------------------------
// Reference: the scalar definitions in core/dtype.h and convert.h.
namespace ref {
void convert_f32_to_bf16(const float* x, bf16* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = aspen::f32_to_bf16(x[i]);
}
void convert_bf16_to_f32(const bf16* x, float* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = aspen::bf16_to_f32(x[i]);
}
void convert_f32_to_f16(const float* x, f16* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = aspen::f32_to_f16(x[i]);
}
void convert_f16_to_f32(const f16* x, float* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = aspen::f16_to_f32(x[i]);
}
void convert_u8_to_f32(const uint8_t* x, float* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = float(x[i]);
}
void convert_f32_to_bf16_stochastic(const float* x, bf16* y, int64_t N, uint64_t seed, uint64_t stream,
                                    uint64_t offset) {
  for (int64_t i = 0; i < N; ++i) y[i] = f32_to_bf16_stochastic(x[i], philox_bits(seed, stream, offset + uint64_t(i)));
}
void convert_f32_to_f16_stochastic(const float* x, f16* y, int64_t N, uint64_t seed, uint64_t stream,
                                   uint64_t offset) {
  for (int64_t i = 0; i < N; ++i) y[i] = f32_to_f16_stochastic(x[i], philox_bits(seed, stream, offset + uint64_t(i)));
}
}  // namespace ref

namespace {

constexpr int64_t kChunk = 8192;           // elements per task
constexpr int64_t kParallelMin = 1 << 16;  // below this one thread is faster

template <class In, class Out>
using ConvFn = void (*)(const In* x, Out* y, int64_t n);

// Elementwise, so any split gives the same result.
template <class In, class Out>
void run_chunked(ConvFn<In, Out> fn, const In* x, Out* y, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) fn(x + c * kChunk, y + c * kChunk, std::min(kChunk, n - c * kChunk));
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }

// ---- f32 -> bf16, round to nearest even ---------------------------------
// Branchless form of aspen::f32_to_bf16, so the loop vectorizes.
[[gnu::always_inline]] inline void to_bf16_body(const float* x, bf16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    y[i].bits = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}
void to_bf16_scalar(const float* x, bf16* y, int64_t n) { to_bf16_body(x, y, n); }
ASPEN_TARGET_AVX2 void to_bf16_avx2(const float* x, bf16* y, int64_t n) { to_bf16_body(x, y, n); }

// The integer rounding of 16 lanes, packed to 16 bits.
ASPEN_TARGET_AVX512 inline __m256i bf16_rne16(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_maskz_cvtepi32_epi16(0xffff, r);
}

ASPEN_TARGET_AVX512 void to_bf16_avx512(const float* x, bf16* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm256_mask_storeu_epi16(&y[i], m, bf16_rne16(_mm512_maskz_loadu_epi32(m, x + i)));
  }
}

// vcvtneps2bf16 rounds to nearest even and quiets NaN as the definition does,
// but treats subnormal inputs as zero: those lanes take the integer rounding.
ASPEN_TARGET_AVX512_BF16 void to_bf16_avx512_bf16(const float* x, bf16* y, int64_t n) {
  const __m512i exp_bits = _mm512_set1_epi32(0x7f800000), man_bits = _mm512_set1_epi32(0x007fffff);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i u = _mm512_maskz_loadu_epi32(m, x + i);
    __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(u));
    const __mmask16 sub = _mm512_testn_epi32_mask(u, exp_bits) & _mm512_test_epi32_mask(u, man_bits);
    if (sub) h = _mm256_mask_mov_epi16(h, sub, bf16_rne16(u));
    _mm256_mask_storeu_epi16(&y[i], m, h);
  }
}

// ---- bf16 -> f32 ----------------------------------------------------------
[[gnu::always_inline]] inline void from_bf16_body(const bf16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(uint32_t(x[i].bits) << 16);
}
void from_bf16_scalar(const bf16* x, float* y, int64_t n) { from_bf16_body(x, y, n); }
ASPEN_TARGET_AVX2 void from_bf16_avx2(const bf16* x, float* y, int64_t n) { from_bf16_body(x, y, n); }
ASPEN_TARGET_AVX512 void from_bf16_avx512(const bf16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, &x[i]));
    _mm512_mask_storeu_epi32(y + i, m, _mm512_slli_epi32(w, 16));
  }
}

// ---- f32 -> f16 -----------------------------------------------------------
// vcvtps2ph rounds to nearest even like aspen::f32_to_f16 (subnormals
// included) but keeps NaN payloads; NaN lanes are set to sign | 0x7e00.
void to_f16_scalar(const float* x, f16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = aspen::f32_to_f16(x[i]);
}
ASPEN_TARGET_AVX2 void to_f16_avx2(const float* x, f16* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&y[i]),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
      for (int64_t j = i; j < i + 8; ++j) y[j] = aspen::f32_to_f16(x[j]);
  }
  to_f16_scalar(x + i, y + i, n - i);
}
ASPEN_TARGET_AVX512 void to_f16_avx512(const float* x, f16* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan) {
      const __m512i u = _mm512_castps_si512(v);
      const __m512i q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                                        _mm512_set1_epi32(0x7e00));
      h = _mm256_mask_mov_epi16(h, nan, _mm512_maskz_cvtepi32_epi16(0xffff, q));
    }
    _mm256_mask_storeu_epi16(&y[i], m, h);
  }
}

// ---- f16 -> f32 (vcvtph2ps is exact and quiets NaN as the definition) -----
void from_f16_scalar(const f16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = aspen::f16_to_f32(x[i]);
}
ASPEN_TARGET_AVX2 void from_f16_avx2(const f16* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&x[i]))));
  from_f16_scalar(x + i, y + i, n - i);
}
ASPEN_TARGET_AVX512 void from_f16_avx512(const f16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, &x[i])));
  }
}

// ---- stochastic rounding ----------------------------------------------------
// Philox layout (core/philox.h): element e of a stream is word e % 4 of block
// e / 4; block b uses counter (b_lo, b_hi, stream_lo, stream_hi), key (seed_lo, seed_hi).
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

// n elements starting at element index 4·block (n may end mid-block).
void sr_blocks(const float* x, bf16* y, int64_t n, uint64_t seed, uint64_t stream, uint64_t block) {
  for (int64_t i = 0; i < n; i += 4, ++block) {
    const PhiloxBlock r =
        philox4x32_10({uint32_t(block), uint32_t(block >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                      {uint32_t(seed), uint32_t(seed >> 32)});
    for (int64_t w = 0; w < std::min<int64_t>(4, n - i); ++w) y[i + w] = f32_to_bf16_stochastic(x[i + w], r[w]);
  }
}

// hi/lo 32 bits of the 16 products a[j] · mul.
ASPEN_TARGET_AVX512 inline void mulhilo16(__m512i a, __m512i mul, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, mul);                        // a[2k] · mul, 64-bit
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), mul);  // a[2k+1] · mul
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// units × 64 elements starting at element index 4·block: 16 Philox blocks per
// unit, one per lane, then a 4x16 transpose puts the words in element order.
ASPEN_TARGET_AVX512 void sr_avx512(const float* x, bf16* y, int64_t units, uint64_t seed, uint64_t stream,
                                   uint64_t block) {
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i m0 = _mm512_set1_epi32(int(kMul0)), m1 = _mm512_set1_epi32(int(kMul1));
  const __m512i s_lo = _mm512_set1_epi32(int(uint32_t(stream))), s_hi = _mm512_set1_epi32(int(uint32_t(stream >> 32)));
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (int64_t u = 0; u < units; ++u, block += 16) {
    const __m512i b_lo = _mm512_set1_epi32(int(uint32_t(block)));
    __m512i c0 = _mm512_add_epi32(b_lo, iota);
    __m512i c1 = _mm512_set1_epi32(int(uint32_t(block >> 32)));
    c1 = _mm512_mask_add_epi32(c1, _mm512_cmplt_epu32_mask(c0, b_lo), c1, _mm512_set1_epi32(1));  // carry
    __m512i c2 = s_lo, c3 = s_hi;
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      __m512i hi0, lo0, hi1, lo1;
      mulhilo16(c0, m0, hi0, lo0);
      mulhilo16(c2, m1, hi1, lo1);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(int(k0)));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(int(k1)));
      c3 = lo0;
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    // c_w[j] is word w of block j; element 4j + w needs it. Within each
    // 128-bit lane: u_q = block (4·lane + q), then gather lane l of each u_q.
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
    const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i a = _mm512_shuffle_i32x4(u0, u1, 0x44), b = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i c = _mm512_shuffle_i32x4(u0, u1, 0xEE), d = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    const __m512i rnd[4] = {_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD),
                            _mm512_shuffle_i32x4(c, d, 0x88), _mm512_shuffle_i32x4(c, d, 0xDD)};
    for (int q = 0; q < 4; ++q) {
      const float* xs = x + u * 64 + q * 16;
      const __m512i v = _mm512_loadu_si512(xs);
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(v, _mm512_srli_epi32(rnd[q], 16)), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs_mask), inf);
      r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(v, 16), _mm512_set1_epi32(0x40));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(&y[u * 64 + q * 16]), _mm512_maskz_cvtepi32_epi16(0xffff, r));
    }
  }
}

void sr_fast(const float* x, bf16* y, int64_t N, uint64_t seed, uint64_t stream, uint64_t offset) {
  int64_t i = 0;
  for (; i < N && ((offset + uint64_t(i)) & 3u) != 0; ++i)  // up to a block boundary
    y[i] = f32_to_bf16_stochastic(x[i], philox_bits(seed, stream, offset + uint64_t(i)));
  const uint64_t block0 = (offset + uint64_t(i)) / 4;
  const int64_t rest = N - i, units = rest / 64;  // a unit: 64 elements, 16 blocks
  constexpr int64_t kUnitsPerTask = 64;
  const int64_t tasks = (units + kUnitsPerTask - 1) / kUnitsPerTask;
  const bool avx512 = active_isa() >= Isa::avx512;
#pragma omp parallel for schedule(static) if (rest >= kParallelMin / 4)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t u0 = t * kUnitsPerTask, nu = std::min(kUnitsPerTask, units - u0);
    const int64_t e = i + u0 * 64;
    if (avx512)
      sr_avx512(x + e, y + e, nu, seed, stream, block0 + uint64_t(u0) * 16);
    else
      sr_blocks(x + e, y + e, nu * 64, seed, stream, block0 + uint64_t(u0) * 16);
  }
  const int64_t e = i + units * 64;
  sr_blocks(x + e, y + e, N - e, seed, stream, block0 + uint64_t(units) * 16);
}

template <class In, class Out>
Status check_convert(const char* kernel, std::span<const In> x, std::span<Out> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "y", y, N));
  return Status();
}

// A stochastic conversion's arguments: the buffers, and element indices offset + i that stay below 2^64.
template <class Out>
Status check_stochastic(const char* kernel, std::span<const float> x, std::span<Out> y, int64_t N, uint64_t offset) {
  ASPEN_RETURN_IF_ERROR(check_convert(kernel, x, y, N));
  if (N > 0 && offset > std::numeric_limits<uint64_t>::max() - uint64_t(N - 1))
    return Status::invalid_argument(std::string(kernel) + ": argument 'offset'", "offset + N <= 2^64",
                                    "offset = " + std::to_string(offset) + ", N = " + std::to_string(N));
  return Status();
}

}  // namespace

Status convert_f32_to_bf16(std::span<const float> x, std::span<bf16> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_convert("convert_f32_to_bf16", x, y, N));
  if (reference_mode()) {
    ref::convert_f32_to_bf16(x.data(), y.data(), N);
    return Status();
  }
  const Isa isa = active_isa();
  run_chunked<float, bf16>(isa >= Isa::avx512_bf16 ? to_bf16_avx512_bf16
                           : isa == Isa::avx512    ? to_bf16_avx512
                           : isa == Isa::avx2      ? to_bf16_avx2
                                                   : to_bf16_scalar,
                           x.data(), y.data(), N);
  return Status();
}

Status convert_bf16_to_f32(std::span<const bf16> x, std::span<float> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_convert("convert_bf16_to_f32", x, y, N));
  if (reference_mode()) {
    ref::convert_bf16_to_f32(x.data(), y.data(), N);
    return Status();
  }
  const Isa isa = active_isa();
  run_chunked<bf16, float>(isa >= Isa::avx512 ? from_bf16_avx512
                           : isa == Isa::avx2 ? from_bf16_avx2
                                              : from_bf16_scalar,
                           x.data(), y.data(), N);
  return Status();
}

Status convert_f32_to_f16(std::span<const float> x, std::span<f16> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_convert("convert_f32_to_f16", x, y, N));
  if (reference_mode()) {
    ref::convert_f32_to_f16(x.data(), y.data(), N);
    return Status();
  }
  const Isa isa = active_isa();
  run_chunked<float, f16>(isa >= Isa::avx512 ? to_f16_avx512
                          : isa == Isa::avx2 ? to_f16_avx2
                                             : to_f16_scalar,
                          x.data(), y.data(), N);
  return Status();
}

Status widen_to_f32(DType from, const void* x, float* y, int64_t N) {
  const size_t n = size_t(std::max<int64_t>(N, 0));
  if (from == DType::bf16) return convert_bf16_to_f32({static_cast<const bf16*>(x), n}, {y, n}, N);
  if (from == DType::f16) return convert_f16_to_f32({static_cast<const f16*>(x), n}, {y, n}, N);
  return Status::invalid_argument("widen_to_f32: from", "bf16 or f16", std::string(dtype_name(from)));
}

Status narrow_from_f32(DType to, const float* x, void* y, int64_t N) {
  const size_t n = size_t(std::max<int64_t>(N, 0));
  if (to == DType::bf16) return convert_f32_to_bf16({x, n}, {static_cast<bf16*>(y), n}, N);
  if (to == DType::f16) return convert_f32_to_f16({x, n}, {static_cast<f16*>(y), n}, N);
  return Status::invalid_argument("narrow_from_f32: to", "bf16 or f16", std::string(dtype_name(to)));
}

Status convert_f16_to_f32(std::span<const f16> x, std::span<float> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_convert("convert_f16_to_f32", x, y, N));
  if (reference_mode()) {
    ref::convert_f16_to_f32(x.data(), y.data(), N);
    return Status();
  }
  const Isa isa = active_isa();
  run_chunked<f16, float>(isa >= Isa::avx512 ? from_f16_avx512
                          : isa == Isa::avx2 ? from_f16_avx2
                                             : from_f16_scalar,
                          x.data(), y.data(), N);
  return Status();
}

// The reference's loop is the kernel (it vectorizes as it stands), split into chunks for the threads.
Status convert_u8_to_f32(std::span<const uint8_t> x, std::span<float> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_convert("convert_u8_to_f32", x, y, N));
  run_chunked<uint8_t, float>(ref::convert_u8_to_f32, x.data(), y.data(), N);
  return Status();
}

Status convert_f32_to_bf16_stochastic(std::span<const float> x, std::span<bf16> y, int64_t N, uint64_t seed,
                                      uint64_t stream, uint64_t offset) {
  ASPEN_RETURN_IF_ERROR(check_stochastic("convert_f32_to_bf16_stochastic", x, y, N, offset));
  if (reference_mode())
    ref::convert_f32_to_bf16_stochastic(x.data(), y.data(), N, seed, stream, offset);
  else
    sr_fast(x.data(), y.data(), N, seed, stream, offset);
  return Status();
}

// The scalar definition in chunks on the team (a weight's copy per micro-batch; any split gives the same
// values: element i's bits depend on offset + i alone).
Status convert_f32_to_f16_stochastic(std::span<const float> x, std::span<f16> y, int64_t N, uint64_t seed,
                                     uint64_t stream, uint64_t offset) {
  ASPEN_RETURN_IF_ERROR(check_stochastic("convert_f32_to_f16_stochastic", x, y, N, offset));
  const int64_t chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelMin && !reference_mode())
  for (int64_t c = 0; c < chunks; ++c)
    ref::convert_f32_to_f16_stochastic(x.data() + c * kChunk, y.data() + c * kChunk, std::min(kChunk, N - c * kChunk),
                                       seed, stream, offset + uint64_t(c * kChunk));
  return Status();
}

}  // namespace aspen::kernels
