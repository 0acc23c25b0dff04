// kernels/norm.h: LayerNorm and RMSNorm over the last axis, forward and backward.
//
// All f32, row-major: x, y, dy, dx are [R, C]; gamma, beta, dgamma, dbeta are
// [C]; mean and rstd are [R] (saved by the forward for the backward).
//
//   LayerNorm:  mean = sum_c x / C,  var = sum_c (x - mean)^2 / C,  rstd = 1 / sqrt(var + eps),
//               y = (x - mean) rstd gamma + beta
//   RMSNorm:    rstd = 1 / sqrt(sum_c x^2 / C + eps),  y = x rstd gamma
//
// The fast forward makes one pass over memory per row: the row is read once
// into cache for the mean, the variance is a second (two-pass, numerically
// sound) sweep over the cached row, then y is written once.
//
// Backward kernels overwrite dx, dgamma and dbeta (they never accumulate).
// dgamma and dbeta are sums over rows, reduced over fixed row blocks combined
// in a fixed order: results do not depend on the number of OpenMP threads.
// In place is allowed where stated: y may be x, dx may be dy.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

// LayerNorm forward (see above). Requires C >= 1 and eps >= 0.
[[nodiscard]] Status layernorm_forward(std::span<const float> x, std::span<const float> gamma,
                                       std::span<const float> beta, std::span<float> y, std::span<float> mean,
                                       std::span<float> rstd, int64_t R, int64_t C, float eps);

// Of y = (x - mean) rstd gamma + beta, with xhat = (x - mean) rstd, g = gamma dy:
//   dx = rstd (g - mean_c(g) - xhat mean_c(g xhat)),
//   dgamma[c] = sum_r dy xhat,  dbeta[c] = sum_r dy.
// mean and rstd are what layernorm_forward saved.
[[nodiscard]] Status layernorm_backward(std::span<const float> x, std::span<const float> gamma,
                                        std::span<const float> mean, std::span<const float> rstd,
                                        std::span<const float> dy, std::span<float> dx, std::span<float> dgamma,
                                        std::span<float> dbeta, int64_t R, int64_t C);

// Residual add fused with LayerNorm: h = x + residual (written out: it is the
// residual stream), y = LayerNorm(h), saving mean and rstd of h. h may be x or
// residual (in place); y must not overlap h. The backward is layernorm_backward
// on h plus the identity for the add.
[[nodiscard]] Status add_layernorm_forward(std::span<const float> x, std::span<const float> residual,
                                           std::span<const float> gamma, std::span<const float> beta,
                                           std::span<float> h, std::span<float> y, std::span<float> mean,
                                           std::span<float> rstd, int64_t R, int64_t C, float eps);

// RMSNorm forward (see above). Requires C >= 1 and eps >= 0.
[[nodiscard]] Status rmsnorm_forward(std::span<const float> x, std::span<const float> gamma, std::span<float> y,
                                     std::span<float> rstd, int64_t R, int64_t C, float eps);

// Of y = x rstd gamma, with xhat = x rstd, g = gamma dy:
//   dx = rstd (g - xhat mean_c(g xhat)),  dgamma[c] = sum_r dy xhat.
[[nodiscard]] Status rmsnorm_backward(std::span<const float> x, std::span<const float> gamma,
                                      std::span<const float> rstd, std::span<const float> dy, std::span<float> dx,
                                      std::span<float> dgamma, int64_t R, int64_t C);

// The reference: the definitions, in plain loops (no checks, no threads).
namespace ref {
template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t R, int64_t C, T eps);
template <class T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy, T* dx, T* dgamma,
                        T* dbeta, int64_t R, int64_t C);
template <class T>
void add_layernorm_forward(const T* x, const T* residual, const T* gamma, const T* beta, T* h, T* y, T* mean, T* rstd,
                           int64_t R, int64_t C, T eps);
template <class T>
void rmsnorm_forward(const T* x, const T* gamma, T* y, T* rstd, int64_t R, int64_t C, T eps);
template <class T>
void rmsnorm_backward(const T* x, const T* gamma, const T* rstd, const T* dy, T* dx, T* dgamma, int64_t R, int64_t C);
}  // namespace ref

}  // namespace aspen::kernels
