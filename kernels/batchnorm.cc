#include "kernels/batchnorm.h"

#include <cmath>
#include <string>

#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

Status check(const BatchNormShape& s, const char* k) {
  if (s.N < 1 || s.C < 1 || s.S < 1)
    return Status::invalid_argument(std::string(k) + ": shape", "N, C, S >= 1",
                                    std::to_string(s.N) + ", " + std::to_string(s.C) + ", " + std::to_string(s.S));
  return Status();
}

// One channel's forward: T the values' type, A the sums'.
template <class T, class A>
void forward_channel(const BatchNormShape& s, int64_t c, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                     T* rstd, double eps) {
  const int64_t M = s.N * s.S;
  A sum = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* p = x + (n * s.C + c) * s.S;
    for (int64_t i = 0; i < s.S; ++i) sum += A(p[i]);
  }
  const A mu = sum / A(M);
  A sq = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* p = x + (n * s.C + c) * s.S;
    for (int64_t i = 0; i < s.S; ++i) sq += (A(p[i]) - mu) * (A(p[i]) - mu);
  }
  const A r = A(1) / std::sqrt(sq / A(M) + A(eps));
  mean[c] = T(mu), rstd[c] = T(r);
  const A scale = r * A(gamma[c]), shift = A(beta[c]) - mu * scale;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* p = x + (n * s.C + c) * s.S;
    T* q = y + (n * s.C + c) * s.S;
    for (int64_t i = 0; i < s.S; ++i) q[i] = T(A(p[i]) * scale + shift);
  }
}

template <class T, class A>
void backward_channel(const BatchNormShape& s, int64_t c, const T* dy, const T* x, const T* gamma, const T* mean,
                      const T* rstd, T* dx, T* dgamma, T* dbeta) {
  const int64_t M = s.N * s.S;
  const A mu = A(mean[c]), r = A(rstd[c]);
  A sum_dy = 0, sum_dy_xhat = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const int64_t at = (n * s.C + c) * s.S;
    for (int64_t i = 0; i < s.S; ++i) {
      sum_dy += A(dy[at + i]);
      sum_dy_xhat += A(dy[at + i]) * (A(x[at + i]) - mu) * r;
    }
  }
  dbeta[c] = T(sum_dy), dgamma[c] = T(sum_dy_xhat);
  const A k = A(gamma[c]) * r, mean_dy = sum_dy / A(M), mean_dy_xhat = sum_dy_xhat / A(M);
  for (int64_t n = 0; n < s.N; ++n) {
    const int64_t at = (n * s.C + c) * s.S;
    for (int64_t i = 0; i < s.S; ++i)
      dx[at + i] = T(k * (A(dy[at + i]) - mean_dy - (A(x[at + i]) - mu) * r * mean_dy_xhat));
  }
}

}  // namespace

namespace ref {
template <class T>
void batchnorm_forward(const BatchNormShape& s, const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                       double eps) {
  for (int64_t c = 0; c < s.C; ++c) forward_channel<T, double>(s, c, x, gamma, beta, y, mean, rstd, eps);
}
template <class T>
void batchnorm_backward(const BatchNormShape& s, const T* dy, const T* x, const T* gamma, const T* mean,
                        const T* rstd, T* dx, T* dgamma, T* dbeta) {
  for (int64_t c = 0; c < s.C; ++c) backward_channel<T, double>(s, c, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
}
template void batchnorm_forward<float>(const BatchNormShape&, const float*, const float*, const float*, float*,
                                       float*, float*, double);
template void batchnorm_forward<double>(const BatchNormShape&, const double*, const double*, const double*, double*,
                                        double*, double*, double);
template void batchnorm_backward<float>(const BatchNormShape&, const float*, const float*, const float*,
                                        const float*, const float*, float*, float*, float*);
template void batchnorm_backward<double>(const BatchNormShape&, const double*, const double*, const double*,
                                         const double*, const double*, double*, double*, double*);
}  // namespace ref

Status batchnorm_forward(const BatchNormShape& s, const float* x, const float* gamma, const float* beta, float* y,
                         float* mean, float* rstd, float eps) {
  ASPEN_RETURN_IF_ERROR(check(s, "batchnorm_forward"));
  if (!(eps >= 0.0f)) return Status::invalid_argument("batchnorm_forward: eps", ">= 0", std::to_string(eps));
#pragma omp parallel for schedule(static) if (s.N * s.C * s.S >= 4096 && !reference_mode())
  for (int64_t c = 0; c < s.C; ++c) forward_channel<float, double>(s, c, x, gamma, beta, y, mean, rstd, eps);
  return Status();
}

Status batchnorm_backward(const BatchNormShape& s, const float* dy, const float* x, const float* gamma,
                          const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta) {
  ASPEN_RETURN_IF_ERROR(check(s, "batchnorm_backward"));
#pragma omp parallel for schedule(static) if (s.N * s.C * s.S >= 4096 && !reference_mode())
  for (int64_t c = 0; c < s.C; ++c)
    backward_channel<float, double>(s, c, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  return Status();
}

}  // namespace aspen::kernels
