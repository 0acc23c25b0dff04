// kernels/convert.h: vectorized f32 <-> bf16 / f16 conversions, and f32 -> bf16
// and f16 with stochastic rounding.
//
// The scalar conversions in core/dtype.h are the definition (they are what
// ref:: runs): round to nearest even, infinities stay, NaN stays NaN (quiet):
//   f32 -> bf16: a NaN keeps its top 16 bits with the quiet bit set;
//   f32 -> f16:  a NaN becomes sign | 0x7e00 (payload dropped);
//   f16/bf16 -> f32: exact (f16 subnormals become f32 normals).
// Subnormal inputs are rounded like any other value. The fast paths agree
// with them bit for bit on every input: where hardware differs (AVX512-BF16's
// vcvtneps2bf16 flushes subnormal inputs to zero; vcvtps2ph keeps NaN
// payloads), the fast path patches those lanes.
//
// Stochastic rounding (f32 -> bf16): with u the f32 bits and r 32 random bits,
//   result = (u + (r >> 16)) >> 16        (NaN: as round-to-nearest)
// i.e. a uniform 16-bit value is added to the 16 bits that bf16 drops before
// truncating. The magnitude rounds up with probability (dropped bits)/65536,
// so the expected value of the result is x exactly (the rounding is unbiased);
// the result is always one of the two bf16 values around x, and x itself when
// x is a bf16 value. Above the largest finite bf16 (0x7f7f), the upper
// neighbour is infinity: such x round to ±inf with that same probability.
// f32 -> f16 stochastically: of the two f16 values around x (lo toward zero, hi away from it), hi with
// probability (|x| - |lo|) / (|hi| - |lo|) (r / 2^32 below it), computed exactly in double: unbiased the same
// way, x itself when x is an f16 value, ±inf past the largest finite f16 with that same probability, NaN as
// round-to-nearest.
// Element i uses r = philox_bits(seed, stream, offset + i) (core/philox.h):
// the result depends only on (seed, stream, offset + i), never on the thread
// count or on how a tensor is split into calls.
//
// Fast paths: AVX512-BF16 (vcvtneps2bf16) when active_isa() is avx512_bf16,
// integer bit tricks at avx512 and below; F16C (vcvtps2ph / vcvtph2ps) at
// avx2 and up; a 16-lane Philox for stochastic rounding at avx512 and up.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::kernels {

// One stochastically rounded value: x with random bits r (see above).
inline bf16 f32_to_bf16_stochastic(float x, uint32_t r) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  return bf16{uint16_t((u + (r >> 16)) >> 16)};
}

// One stochastically rounded f16 (see above).
inline f16 f32_to_f16_stochastic(float x, uint32_t r) {
  if (x != x) return f32_to_f16(x);
  f16 lo = f32_to_f16(x);  // nearest; step it toward zero when it lies beyond x
  const double ax = std::abs(double(x));
  if (std::abs(double(f16_to_f32(lo))) > ax) lo.bits = uint16_t(lo.bits - 1);  // magnitude bits - 1
  const double alo = std::abs(double(f16_to_f32(lo)));
  if (alo == ax) return lo;
  const f16 hi{uint16_t(lo.bits + 1)};  // the next magnitude (0x7c00: infinity)
  const double ahi = std::abs(double(f16_to_f32(hi)));
  const double p = std::isinf(ahi) ? (ax - alo) / (65536.0 - alo) : (ax - alo) / (ahi - alo);
  return double(r) < p * 4294967296.0 ? hi : lo;
}

// y[i] = f32_to_bf16(x[i]) for i in [0, N).
[[nodiscard]] Status convert_f32_to_bf16(std::span<const float> x, std::span<bf16> y, int64_t N);
// y[i] = bf16_to_f32(x[i]).
[[nodiscard]] Status convert_bf16_to_f32(std::span<const bf16> x, std::span<float> y, int64_t N);
// y[i] = f32_to_f16(x[i]).
[[nodiscard]] Status convert_f32_to_f16(std::span<const float> x, std::span<f16> y, int64_t N);
// y[i] = f16_to_f32(x[i]).
[[nodiscard]] Status convert_f16_to_f32(std::span<const f16> x, std::span<float> y, int64_t N);
// y[i] = float(x[i]): bytes (u8, or bool's 0/1) into arithmetic, e.g. masks.
[[nodiscard]] Status convert_u8_to_f32(std::span<const uint8_t> x, std::span<float> y, int64_t N);
// y[i] = f32_to_bf16_stochastic(x[i], philox_bits(seed, stream, offset + i)).
// offset + N must not pass 2^64.
[[nodiscard]] Status convert_f32_to_bf16_stochastic(std::span<const float> x, std::span<bf16> y, int64_t N,
                                                    uint64_t seed, uint64_t stream, uint64_t offset);

// y[i] = f32_to_f16_stochastic(x[i], philox_bits(seed, stream, offset + i)); offset + N must not pass 2^64.
[[nodiscard]] Status convert_f32_to_f16_stochastic(std::span<const float> x, std::span<f16> y, int64_t N,
                                                   uint64_t seed, uint64_t stream, uint64_t offset);

// The two above chosen by dtype, for ops that compute in f32 on bf16 or f16 tensors (convolution, batch
// norm): y = x widened from `from`, or narrowed to `to` (each bf16 or f16; anything else is an error).
[[nodiscard]] Status widen_to_f32(DType from, const void* x, float* y, int64_t N);
[[nodiscard]] Status narrow_from_f32(DType to, const float* x, void* y, int64_t N);

namespace ref {
// Plain loops over the scalar definitions; no checks, no threads.
void convert_f32_to_bf16(const float* x, bf16* y, int64_t N);
void convert_bf16_to_f32(const bf16* x, float* y, int64_t N);
void convert_f32_to_f16(const float* x, f16* y, int64_t N);
void convert_f16_to_f32(const f16* x, float* y, int64_t N);
void convert_u8_to_f32(const uint8_t* x, float* y, int64_t N);
void convert_f32_to_bf16_stochastic(const float* x, bf16* y, int64_t N, uint64_t seed, uint64_t stream,
                                    uint64_t offset);
void convert_f32_to_f16_stochastic(const float* x, f16* y, int64_t N, uint64_t seed, uint64_t stream,
                                   uint64_t offset);
}  // namespace ref

}  // namespace aspen::kernels
