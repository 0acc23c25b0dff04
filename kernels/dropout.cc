#include "kernels/dropout.h"

#include <cmath>
#include <string>

#include "core/philox.h"
#include "kernels/check_args.h"
#include "kernels/chunks.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

uint32_t dropout_keep_threshold(double ratio) { return uint32_t(std::ceil(ratio * 16777216.0)); }
float dropout_scale(double ratio) { return float(1.0 / (1.0 - ratio)); }

namespace {

// The 24 bits element i of `stream` under `seed` draws, as dropout and uniform_draw read them.
uint32_t draw_bits(int64_t seed, uint64_t stream, int64_t i) {
  return philox_bits(uint64_t(seed), stream, uint64_t(i)) >> 8;
}
double uniform_of(uint32_t bits, double low, double high) { return low + (high - low) * double(bits) * 0x1p-24; }

// f(i, bits) for every element i < N, on the OpenMP team: one Philox block gives four elements' bits
// (element n is word n % 4 of block n / 4, the draws draw_bits gives).
template <class F>
void for_each_draw(int64_t seed, uint64_t stream, int64_t N, F f) {
  const int64_t blocks = (N + 3) / 4;
#pragma omp parallel for schedule(static) if (N >= chunks::kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const PhiloxBlock r = philox_block(uint64_t(seed), stream, uint64_t(b));
    for (int64_t w = 0; w < 4; ++w)
      if (4 * b + w < N) f(4 * b + w, r[size_t(w)] >> 8);
  }
}

}  // namespace

namespace ref {
template <class T>
void dropout_forward(const T* x, T* y, int64_t N, int64_t seed, uint64_t stream, double ratio) {
  if (seed < 0 || ratio == 0.0) {
    for (int64_t i = 0; i < N; ++i) y[i] = x[i];
    return;
  }
  const uint32_t threshold = dropout_keep_threshold(ratio);
  const T scale = T(dropout_scale(ratio));
  for (int64_t i = 0; i < N; ++i)
    y[i] = draw_bits(seed, stream, i) >= threshold ? x[i] * scale : T(0);
}
template void dropout_forward<float>(const float*, float*, int64_t, int64_t, uint64_t, double);
template void dropout_forward<double>(const double*, double*, int64_t, int64_t, uint64_t, double);

template <class T>
void uniform_draw(T* y, int64_t N, int64_t seed, uint64_t stream, double low, double high) {
  for (int64_t i = 0; i < N; ++i)
    y[i] = T(uniform_of(draw_bits(seed, stream, i), low, high));
}
template void uniform_draw<float>(float*, int64_t, int64_t, uint64_t, double, double);
template void uniform_draw<double>(double*, int64_t, int64_t, uint64_t, double, double);
}  // namespace ref

Status uniform_draw(std::span<float> y, int64_t N, int64_t seed, uint64_t stream, double low, double high) {
  constexpr const char* k = "uniform_draw";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (seed < 0) return Status::invalid_argument(std::string(k) + ": seed", ">= 0", std::to_string(seed));
  if (reference_mode()) {
    ref::uniform_draw(y.data(), N, seed, stream, low, high);
    return Status();
  }
  float* py = y.data();
  for_each_draw(seed, stream, N, [&](int64_t i, uint32_t bits) { py[i] = float(uniform_of(bits, low, high)); });
  return Status();
}

Status dropout_forward(std::span<const float> x, std::span<float> y, int64_t N, int64_t seed, uint64_t stream,
                       double ratio) {
  constexpr const char* k = "dropout_forward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (!(ratio >= 0.0 && ratio < 1.0))
    return Status::invalid_argument(std::string(k) + ": ratio", "in [0, 1)", std::to_string(ratio));
  if (reference_mode()) {
    ref::dropout_forward(x.data(), y.data(), N, seed, stream, ratio);
    return Status();
  }
  const float* px = x.data();
  float* py = y.data();
  if (seed < 0 || ratio == 0.0) {
    if (px != py)
#pragma omp parallel for schedule(static) if (N >= chunks::kParallelMin)
      for (int64_t i = 0; i < N; ++i) py[i] = px[i];
    return Status();
  }
  const uint32_t threshold = dropout_keep_threshold(ratio);
  const float scale = dropout_scale(ratio);
  for_each_draw(seed, stream, N,
                [&](int64_t i, uint32_t bits) { py[i] = bits >= threshold ? px[i] * scale : 0.0f; });
  return Status();
}

}  // namespace aspen::kernels
