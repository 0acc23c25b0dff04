#include "kernels/optimizers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/check_args.h"

namespace aspen::kernels {

namespace {

constexpr int64_t kChunk = 4096;           // elements per task and per partial sum (pinned: sums depend on it)
constexpr int64_t kParallelMin = 1 << 15;  // below this one thread is faster

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

Status check_range(const char* kernel, const char* name, double x, double lo, double hi, bool hi_open) {
  if (x >= lo && (hi_open ? x < hi : x <= hi)) return Status();
  return Status::invalid_argument(std::string(kernel) + ": argument '" + name + "'",
                                  "a value in [" + std::to_string(lo) + ", " +
                                      (std::isinf(hi) ? std::string("inf") : std::to_string(hi)) + (hi_open ? ")" : "]"),
                                  std::to_string(x));
}
constexpr double kInf = HUGE_VAL;

// SGD's scalars rounded to T once.
template <class T>
struct SgdCoef {
  T grad_scale, wd, momentum, neg_lr;
  bool decay, has_momentum, nesterov;
};
template <class T>
SgdCoef<T> sgd_coef(const SgdConfig& c) {
  return {T(c.grad_scale), T(c.weight_decay), T(c.momentum), T(-c.lr),
          c.weight_decay != 0.0, c.momentum != 0.0, c.nesterov};
}

template <class T>
[[gnu::always_inline]] inline void sgd_body(T* p, const T* grad, T* buf, int64_t n, const SgdCoef<T>& k) {
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] * k.grad_scale;
    if (k.decay) g = g + k.wd * p[i];
    if (k.has_momentum) {
      const T b = k.momentum * buf[i] + g;
      buf[i] = b;
      g = k.nesterov ? g + k.momentum * b : b;
    }
    p[i] = p[i] + k.neg_lr * g;
  }
}

// LAMB's scalars.
template <class T>
struct LambCoef {
  T grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bc1, inv_bc2, eps, wd;
};
template <class T>
LambCoef<T> lamb_coef(const LambConfig& c) {
  const double bc1 = 1.0 - std::pow(c.beta1, double(c.step));
  const double bc2 = 1.0 - std::pow(c.beta2, double(c.step));
  return {T(c.grad_scale), T(c.beta1), T(1.0 - c.beta1), T(c.beta2), T(1.0 - c.beta2),
          T(1.0 / bc1),    T(1.0 / bc2), T(c.eps),       T(c.weight_decay)};
}

// The update direction u of one element, from the new m and v.
template <class T>
[[gnu::always_inline]] inline T lamb_u(T p, T m, T v, const LambCoef<T>& k) {
  return (m * k.inv_bc1) / (std::sqrt(v * k.inv_bc2) + k.eps) + k.wd * p;
}

// Pass 1 over one chunk: new m, v; returns Σp² and Σu².
template <class T>
void lamb_pass1(const T* p, const T* grad, T* m, T* v, int64_t n, const LambCoef<T>& k, double& pp, double& uu) {
  double sp = 0.0, su = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * k.grad_scale;
    const T mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
    const T vi = k.beta2 * v[i] + (k.one_minus_beta2 * g) * g;
    m[i] = mi;
    v[i] = vi;
    const T u = lamb_u(p[i], mi, vi, k);
    sp += double(p[i]) * double(p[i]);
    su += double(u) * double(u);
  }
  pp = sp;
  uu = su;
}

template <class T>
void lamb_pass2(T* p, const T* m, const T* v, int64_t n, const LambCoef<T>& k, T step) {
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] - step * lamb_u(p[i], m[i], v[i], k);
}

// −lr · trust, from the summed squared norms.
double lamb_step_size(double lr, double pp, double uu) {
  const double trust = (pp > 0.0 && uu > 0.0) ? std::sqrt(pp) / std::sqrt(uu) : 1.0;
  return lr * trust;
}

Status check_sgd(const SgdConfig& c) {
  const char* k = "sgd_step";
  ASPEN_RETURN_IF_ERROR(check_range(k, "lr", c.lr, 0.0, kInf, false));
  ASPEN_RETURN_IF_ERROR(check_range(k, "momentum", c.momentum, 0.0, 1.0, true));
  ASPEN_RETURN_IF_ERROR(check_range(k, "weight_decay", c.weight_decay, 0.0, kInf, false));
  if (c.nesterov && c.momentum == 0.0)
    return Status::invalid_argument("sgd_step: nesterov", "momentum > 0", "momentum 0");
  return Status();
}

Status check_lamb(const LambConfig& c) {
  const char* k = "lamb_step";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "step", c.step, 1));
  ASPEN_RETURN_IF_ERROR(check_range(k, "lr", c.lr, 0.0, kInf, false));
  ASPEN_RETURN_IF_ERROR(check_range(k, "beta1", c.beta1, 0.0, 1.0, true));
  ASPEN_RETURN_IF_ERROR(check_range(k, "beta2", c.beta2, 0.0, 1.0, true));
  ASPEN_RETURN_IF_ERROR(check_range(k, "eps", c.eps, 0.0, kInf, false));
  ASPEN_RETURN_IF_ERROR(check_range(k, "weight_decay", c.weight_decay, 0.0, kInf, false));
  return Status();
}

}  // namespace

// ---------------------------------------------------------------------------
// References: the definitions, one element at a time.
namespace ref {
template <class T>
void sgd_step(T* param, const T* grad, T* buf, int64_t N, const SgdConfig& config) {
  sgd_body(param, grad, buf, N, sgd_coef<T>(config));
}
template void sgd_step<float>(float*, const float*, float*, int64_t, const SgdConfig&);
template void sgd_step<double>(double*, const double*, double*, int64_t, const SgdConfig&);

template <class T>
void lamb_step(T* param, const T* grad, T* m, T* v, int64_t N, const LambConfig& config) {
  const LambCoef<T> k = lamb_coef<T>(config);
  double pp = 0.0, uu = 0.0;
  lamb_pass1(param, grad, m, v, N, k, pp, uu);
  lamb_pass2(param, m, v, N, k, T(lamb_step_size(config.lr, pp, uu)));
}
template void lamb_step<float>(float*, const float*, float*, float*, int64_t, const LambConfig&);
template void lamb_step<double>(double*, const double*, double*, double*, int64_t, const LambConfig&);

double sum_squares(const float* x, int64_t N) {
  double s = 0.0;
  for (int64_t i = 0; i < N; ++i) s += double(x[i]) * double(x[i]);
  return s;
}
}  // namespace ref

// ---------------------------------------------------------------------------
// Fast paths: fixed chunks spread over threads; plain loops the compiler
// vectorizes (these steps are bound by memory bandwidth, not arithmetic).

Status sgd_step(std::span<float> param, std::span<const float> grad, std::span<float> buf, int64_t N,
                const SgdConfig& config) {
  const char* kernel = "sgd_step";
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "N", N));
  ASPEN_RETURN_IF_ERROR(check_sgd(config));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "param", param, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "grad", grad, N));
  if (config.momentum != 0.0) ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "buf", buf, N));
  const SgdCoef<float> k = sgd_coef<float>(config);
  float* p = param.data();
  const float* g = grad.data();
  float* b = buf.data();
  const int64_t chunks = chunks_of(N);
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, N - lo);
    sgd_body(p + lo, g + lo, b ? b + lo : nullptr, len, k);
  }
  return Status();
}

Status lamb_step(std::span<float> param, std::span<const float> grad, std::span<float> m, std::span<float> v,
                 int64_t N, const LambConfig& config) {
  const char* kernel = "lamb_step";
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "N", N));
  ASPEN_RETURN_IF_ERROR(check_lamb(config));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "param", param, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "grad", grad, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "m", m, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "v", v, N));
  const LambCoef<float> k = lamb_coef<float>(config);
  float* p = param.data();
  const float* g = grad.data();
  float *mp = m.data(), *vp = v.data();
  const int64_t chunks = chunks_of(N);
  std::vector<double> pp(static_cast<size_t>(chunks)), uu(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, N - lo);
    lamb_pass1(p + lo, g + lo, mp + lo, vp + lo, len, k, pp[size_t(c)], uu[size_t(c)]);
  }
  double spp = 0.0, suu = 0.0;
  for (int64_t c = 0; c < chunks; ++c) spp += pp[size_t(c)], suu += uu[size_t(c)];
  const float step = float(lamb_step_size(config.lr, spp, suu));
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, N - lo);
    lamb_pass2(p + lo, mp + lo, vp + lo, len, k, step);
  }
  return Status();
}

Result<double> sum_squares(std::span<const float> x, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_extent("sum_squares", "N", N, 0));
  ASPEN_RETURN_IF_ERROR(check_buffer("sum_squares", "x", x, N));
  const int64_t chunks = chunks_of(N);
  std::vector<double> part(static_cast<size_t>(chunks));
  const float* p = x.data();
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, N - lo);
    double s = 0.0;
    for (int64_t i = lo; i < lo + len; ++i) s += double(p[i]) * double(p[i]);
    part[size_t(c)] = s;
  }
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

}  // namespace aspen::kernels
