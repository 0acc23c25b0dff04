// kernels/dropout.h: dropout as a pure function of (seed, stream, element index).
//
// Element n of x is kept when the top 24 bits of Philox element n of stream `stream` under `seed`
// (core/philox.h), as an integer, are >= ceil(ratio 2^24): then y[n] = x[n] / (1 - ratio), else 0. The
// mask is never stored: the backward pass draws it again from the same (seed, stream), so dx = dropout(dy)
// with the same arguments. Any thread count gives the same bits. A negative seed means no dropout (y = x):
// the trainer feeds -1 for validation and inference. The attention kernels' dropout draws the same way
// (kernels/attention.h).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

// 0 <= ratio < 1; x and y hold N elements (y may be x).
[[nodiscard]] Status dropout_forward(std::span<const float> x, std::span<float> y, int64_t N, int64_t seed,
                                     uint64_t stream, double ratio);
// The threshold the 24 random bits are compared with, and the kept elements' factor.
uint32_t dropout_keep_threshold(double ratio);
float dropout_scale(double ratio);

// Uniform draws: y[n] = low + (high - low) u[n], with u[n] the same 24 bits dropout compares, / 2^24, in
// [0, 1). seed >= 0 (the graph op refuses a negative one: no draws are meant then).
[[nodiscard]] Status uniform_draw(std::span<float> y, int64_t N, int64_t seed, uint64_t stream, double low,
                                  double high);

namespace ref {
template <class T>
void dropout_forward(const T* x, T* y, int64_t N, int64_t seed, uint64_t stream, double ratio);
template <class T>
void uniform_draw(T* y, int64_t N, int64_t seed, uint64_t stream, double low, double high);
}  // namespace ref

}  // namespace aspen::kernels
