#include "kernels/adamw.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

// The step's scalars, computed in f64 and rounded once to T (see adamw.h).
template <class T>
struct Coef {
  T grad_scale, decay;
  T lerp_w;          // m = base + lerp_w · (g − m): w when |w| < 0.5, else w − 1
  bool lerp_from_m;  // base = m when |w| < 0.5, else g
  T beta2, one_minus_beta2, bc2_sqrt, eps, step_size;
};

template <class T>
Coef<T> coefficients(const AdamWConfig& c) {
  Coef<T> k;
  k.grad_scale = T(c.grad_scale);
  k.decay = T(1.0 - c.lr * c.weight_decay);
  const T w = T(1.0 - c.beta1);
  k.lerp_from_m = std::abs(w) < T(0.5);
  k.lerp_w = k.lerp_from_m ? w : w - T(1);
  k.beta2 = T(c.beta2);
  k.one_minus_beta2 = T(1.0 - c.beta2);
  const double bc1 = 1.0 - std::pow(c.beta1, double(c.step));
  const double bc2 = 1.0 - std::pow(c.beta2, double(c.step));
  k.bc2_sqrt = T(std::sqrt(bc2));
  k.eps = T(c.eps);
  k.step_size = T(c.lr / bc1);
  return k;
}

}  // namespace

// ---------------------------------------------------------------------------
// Reference: the definition, one element at a time in PyTorch's order.
namespace ref {
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, int64_t N, const AdamWConfig& config) {
  const Coef<T> k = coefficients<T>(config);
  for (int64_t i = 0; i < N; ++i) {
    const T g = grad[i] * k.grad_scale;
    T p = param[i] * k.decay;
    const T mi = (k.lerp_from_m ? m[i] : g) + k.lerp_w * (g - m[i]);
    const T vi = v[i] * k.beta2 + (k.one_minus_beta2 * g) * g;
    const T denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    p = p - (k.step_size * mi) / denom;
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}
template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWConfig&);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, const AdamWConfig&);
}  // namespace ref

// ---------------------------------------------------------------------------
// Fast path: elementwise, so any split gives the same result.
namespace {

using StepFn = void (*)(float* p, const float* g, float* m, float* v, int64_t n, const Coef<float>& k);

// The portable body (also the AVX2 tail). __builtin_sqrtf would not vectorize
// under the default -fmath-errno, so the AVX2 variant uses intrinsics.
[[gnu::always_inline]] inline void step_body(float* p, const float* g, float* m, float* v, int64_t n,
                                             const Coef<float>& k) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * k.grad_scale;
    const float pi = p[i] * k.decay;
    const float mi = (k.lerp_from_m ? m[i] : gi) + k.lerp_w * (gi - m[i]);
    const float vi = v[i] * k.beta2 + (k.one_minus_beta2 * gi) * gi;
    const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    p[i] = pi - (k.step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

void step_scalar(float* p, const float* g, float* m, float* v, int64_t n, const Coef<float>& k) {
  step_body(p, g, m, v, n, k);
}

ASPEN_TARGET_AVX2 void step_avx2(float* p, const float* g, float* m, float* v, int64_t n, const Coef<float>& k) {
  const __m256 gs = _mm256_set1_ps(k.grad_scale), decay = _mm256_set1_ps(k.decay), w = _mm256_set1_ps(k.lerp_w);
  const __m256 b2 = _mm256_set1_ps(k.beta2), c2 = _mm256_set1_ps(k.one_minus_beta2);
  const __m256 bc2 = _mm256_set1_ps(k.bc2_sqrt), eps = _mm256_set1_ps(k.eps), ss = _mm256_set1_ps(k.step_size);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
    const __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    __m256 mv = _mm256_loadu_ps(m + i);
    mv = _mm256_fmadd_ps(w, _mm256_sub_ps(gv, mv), k.lerp_from_m ? mv : gv);
    const __m256 vv =
        _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2), _mm256_mul_ps(_mm256_mul_ps(c2, gv), gv));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2), eps);
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pv, _mm256_div_ps(_mm256_mul_ps(ss, mv), denom)));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
  }
  step_body(p + i, g + i, m + i, v + i, n - i, k);
}

ASPEN_TARGET_AVX512 void step_avx512(float* p, const float* g, float* m, float* v, int64_t n, const Coef<float>& k) {
  const __m512 gs = _mm512_set1_ps(k.grad_scale), decay = _mm512_set1_ps(k.decay), w = _mm512_set1_ps(k.lerp_w);
  const __m512 b2 = _mm512_set1_ps(k.beta2), c2 = _mm512_set1_ps(k.one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(k.bc2_sqrt), eps = _mm512_set1_ps(k.eps), ss = _mm512_set1_ps(k.step_size);
  for (int64_t i = 0; i < n; i += 16) {
    // Masked-off tail lanes load zeros; whatever they compute is not stored.
    const __mmask16 mk = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 gv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, g + i), gs);
    const __m512 pv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p + i), decay);
    __m512 mv = _mm512_maskz_loadu_ps(mk, m + i);
    mv = _mm512_fmadd_ps(w, _mm512_sub_ps(gv, mv), k.lerp_from_m ? mv : gv);
    const __m512 vv =
        _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, v + i), b2), _mm512_mul_ps(_mm512_mul_ps(c2, gv), gv));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_maskz_sqrt_ps(mk, vv), bc2), eps);
    _mm512_mask_storeu_ps(p + i, mk, _mm512_sub_ps(pv, _mm512_div_ps(_mm512_mul_ps(ss, mv), denom)));
    _mm512_mask_storeu_ps(m + i, mk, mv);
    _mm512_mask_storeu_ps(v + i, mk, vv);
  }
}

StepFn pick_step() {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return step_avx512;
  if (isa == Isa::avx2) return step_avx2;
  return step_scalar;
}

constexpr int64_t kChunk = 4096;           // elements per task
constexpr int64_t kParallelMin = 1 << 15;  // below this one thread is faster

Status check_unit_interval(const char* name, double x) {
  if (x >= 0.0 && x < 1.0) return Status();
  return Status::invalid_argument(std::string("adamw_step: argument '") + name + "'", "a value in [0, 1)",
                                  std::to_string(x));
}
Status check_non_negative(const char* name, double x) {
  if (x >= 0.0) return Status();
  return Status::invalid_argument(std::string("adamw_step: argument '") + name + "'", "a value >= 0",
                                  std::to_string(x));
}

}  // namespace

Status adamw_step(std::span<float> param, std::span<const float> grad, std::span<float> m, std::span<float> v,
                  int64_t N, const AdamWConfig& config) {
  const char* kernel = "adamw_step";
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "N", N));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "step", config.step, 1));
  ASPEN_RETURN_IF_ERROR(check_non_negative("lr", config.lr));
  ASPEN_RETURN_IF_ERROR(check_unit_interval("beta1", config.beta1));
  ASPEN_RETURN_IF_ERROR(check_unit_interval("beta2", config.beta2));
  ASPEN_RETURN_IF_ERROR(check_non_negative("eps", config.eps));
  ASPEN_RETURN_IF_ERROR(check_non_negative("weight_decay", config.weight_decay));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "param", param, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "grad", grad, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "m", m, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "v", v, N));
  if (reference_mode()) {
    ref::adamw_step<float>(param.data(), grad.data(), m.data(), v.data(), N, config);
    return Status();
  }
  const Coef<float> k = coefficients<float>(config);
  const StepFn fn = pick_step();
  float* p = param.data();
  const float* g = grad.data();
  float *mp = m.data(), *vp = v.data();
  const int64_t chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, N - lo);
    fn(p + lo, g + lo, mp + lo, vp + lo, len, k);
  }
  return Status();
}

}  // namespace aspen::kernels
