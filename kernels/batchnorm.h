// kernels/batchnorm.h: batch normalization in training, forward and backward, channels-first.
//
// x, y, dy, dx are [N, C, S] (S: the spatial extents' product, 1 for [N, C]); gamma, beta, mean, rstd,
// dgamma, dbeta are [C]. Each channel is normalized over its N S values by the batch's statistics:
//   mean[c] = sum x / M,  var[c] = sum (x - mean)^2 / M (population),  rstd = 1 / sqrt(var + eps),
//   y = (x - mean) rstd gamma + beta                                        (M = N S)
// and, with xhat = (x - mean) rstd,
//   dbeta[c] = sum dy,  dgamma[c] = sum dy xhat,  dx = gamma rstd (dy - dbeta / M - xhat dgamma / M).
// The fast kernels run channels in parallel (OpenMP, static): each channel's sums are one thread's, in a
// fixed order, accumulated in f64, so results do not depend on the thread count. Outputs are overwritten.
// The graph op `batch_norm` (graph/ops_batchnorm.cc) replaces the broadcasts and reductions a batch norm
// decomposes into (the ONNX importer's BatchNormalization in training mode).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace aspen::kernels {

struct BatchNormShape {
  int64_t N = 1, C = 1, S = 1;
};

[[nodiscard]] Status batchnorm_forward(const BatchNormShape& s, const float* x, const float* gamma,
                                       const float* beta, float* y, float* mean, float* rstd, float eps);
[[nodiscard]] Status batchnorm_backward(const BatchNormShape& s, const float* dy, const float* x,
                                        const float* gamma, const float* mean, const float* rstd, float* dx,
                                        float* dgamma, float* dbeta);

namespace ref {
template <class T>
void batchnorm_forward(const BatchNormShape& s, const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       double eps);
template <class T>
void batchnorm_backward(const BatchNormShape& s, const T* dy, const T* x, const T* gamma, const T* mean,
                        const T* rstd, T* dx, T* dgamma, T* dbeta);
}  // namespace ref

}  // namespace aspen::kernels
