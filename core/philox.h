// core/philox.h: Philox4x32-10, a counter-based random number generator.
//
// Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11). The
// n-th number of a stream depends only on (seed, stream, n), never on which
// thread or device computes it, so results are the same whatever the thread or
// device count. Known-answer vectors from Random123 are in philox_test.cc.
//
// Layout (pinned: checkpoints store seeds and offsets): block b of stream s
// under seed k uses counter (b_lo, b_hi, s_lo, s_hi) and key (k_lo, k_hi);
// element n of the stream is word n % 4 of block n / 4.
//
// Thread-safety: everything here is a pure function.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace aspen {

using PhiloxBlock = std::array<uint32_t, 4>;

PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key);

// Block `block` of stream `stream` under `seed`: elements 4 block .. 4 block + 3.
PhiloxBlock philox_block(uint64_t seed, uint64_t stream, uint64_t block);
// Element n of stream `stream` under `seed`, as raw bits.
uint32_t philox_bits(uint64_t seed, uint64_t stream, uint64_t n);
// 24 random bits mapped to [0, 1).
inline float bits_to_unit_float(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }

// Fills out[i] with uniform [lo, hi) from elements offset + i of the stream.
// Parallel over the calling thread's OpenMP team; identical for any team size.
void philox_fill_uniform(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t offset,
                         float lo = 0.0f, float hi = 1.0f);
// Fills with normal(mean, stddev) by Box-Muller; element i uses the uniform
// pair (offset + 2i, offset + 2i + 1).
void philox_fill_normal(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t offset,
                        float mean = 0.0f, float stddev = 1.0f);

}  // namespace aspen
