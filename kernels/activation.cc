#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/check_args.h"
#include "kernels/chunks.h"
#include "kernels/cpu.h"
#include "kernels/vec_math.h"

namespace aspen::kernels {

namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

// ---- argument checks -------------------------------------------------------

Status check_kind(const char* kernel, GeluKind kind) {
  if (kind != GeluKind::tanh && kind != GeluKind::erf)
    return Status::invalid_argument(std::string(kernel) + ": kind", "GeluKind::tanh or GeluKind::erf",
                                    std::to_string(int(kind)));
  return Status();
}

Status check_rows(const char* kernel, int64_t R, int64_t C) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "R", R));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "C", C));
  if (C > 0 && R > INT64_MAX / C)
    return Status::invalid_argument(std::string(kernel) + ": R * C", "a product that fits in int64",
                                    std::to_string(R) + " * " + std::to_string(C));
  return Status();
}


constexpr int64_t kGrain = 1 << 14;  // elements per chunk
constexpr int64_t kMaxChunks = 64;   // row blocks of a column reduction (dbias)

// Rows per block of a reduction over rows: a function of R and C only, so the
// partial sums, and the order they are combined in, do not depend on threads.
int64_t reduce_grain(int64_t R, int64_t C) {
  const int64_t by_size = std::max<int64_t>(1, kGrain / std::max<int64_t>(C, 1));
  const int64_t by_count = (R + kMaxChunks - 1) / kMaxChunks;
  return std::max(by_size, by_count);
}

// ---- scalar forms (vectorize inside `omp simd` loops) ----------------------

ASPEN_VM_INLINE float gelu_tanh_f(float x) {
  const float u = float(kSqrt2OverPi) * (x + float(kGeluCubic) * x * x * x);
  return x * vm::detail::sigmoid_neg_nonan(-2.0f * u);  // 0.5 (1 + tanh u) = sigmoid(2u); x carries NaN
}
// s = sigmoid(-z), s (1 - s) = s (e s) with e = e^z. NaN z gives unspecified
// values: the callers multiply by x, which carries the NaN on.
ASPEN_VM_INLINE float sigmoid_and_slope(float z, float* slope) {
  z = vm::select(z < vm::detail::kExpLo, vm::detail::kExpLo, z);
  z = vm::select(z > 80.0f, 80.0f, z);  // keeps e * s finite and s normal
  const float e = vm::detail::exp_in_range(z), s = vm::detail::recip(1.0f + e);
  *slope = s * (e * s);
  return s;
}
ASPEN_VM_INLINE float gelu_tanh_grad_f(float x) {
  const float u = float(kSqrt2OverPi) * (x + float(kGeluCubic) * x * x * x);
  float slope;
  const float s = sigmoid_and_slope(-2.0f * u, &slope);
  const float du = float(kSqrt2OverPi) * (1.0f + float(3 * kGeluCubic) * x * x);
  return s + (x * slope) * (2.0f * du);
}
ASPEN_VM_INLINE float gelu_erf_f(float x) { return 0.5f * x * (1.0f + vm::erf(x * float(kInvSqrt2))); }
ASPEN_VM_INLINE float gelu_erf_grad_f(float x) {
  return 0.5f * (1.0f + vm::erf(x * float(kInvSqrt2))) + x * float(kInvSqrt2Pi) * vm::exp(-0.5f * x * x);
}
ASPEN_VM_INLINE float silu_f(float x) { return x * vm::detail::sigmoid_neg_nonan(-x); }  // x carries NaN
ASPEN_VM_INLINE float silu_grad_f(float x) {
  float slope;
  const float s = sigmoid_and_slope(-x, &slope);
  return s + x * slope;
}

// ---- elementwise bodies ----------------------------------------------------

struct Ew {
  const float* x;   // first input (a, x, or dy for add/scale backward)
  const float* x2;  // second input (b)
  const float* dy;
  float* y;   // first output
  float* y2;  // second output
  float alpha;
  const uint8_t* cond = nullptr;  // where's condition
};

ASPEN_VM_INLINE void add_fwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] + x2[i];
}
ASPEN_VM_INLINE void add_bwd(const Ew& a, int64_t b, int64_t e) {
  const float* dy = a.dy;
  float *da = a.y, *db = a.y2;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float g = dy[i];
    da[i] = g;
    db[i] = g;
  }
}
ASPEN_VM_INLINE void sub_fwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] - x2[i];
}
ASPEN_VM_INLINE void div_fwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] / x2[i];
}
ASPEN_VM_INLINE void where_fwd(const Ew& a, int64_t b, int64_t e) {
  const uint8_t* c = a.cond;
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = c[i] != 0 ? x[i] : x2[i];
}
ASPEN_VM_INLINE void mul_fwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] * x2[i];
}
ASPEN_VM_INLINE void mul_bwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2, *dy = a.dy;
  float *da = a.y, *db = a.y2;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float g = dy[i], va = x[i], vb = x2[i];
    da[i] = g * vb;
    db[i] = g * va;
  }
}
ASPEN_VM_INLINE void scale_map(const Ew& a, int64_t b, int64_t e) {
  const float* x = a.x;
  float* y = a.y;
  const float alpha = a.alpha;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = alpha * x[i];
}

template <float (*F)(float)>
ASPEN_VM_INLINE void map_fwd(const Ew& a, int64_t b, int64_t e) {
  const float* x = a.x;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = F(x[i]);
}
template <float (*G)(float)>
ASPEN_VM_INLINE void map_bwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *dy = a.dy;
  float* dx = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) dx[i] = G(x[i]) * dy[i];
}

ASPEN_VM_INLINE void gelu_tanh_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<gelu_tanh_f>(a, b, e); }
ASPEN_VM_INLINE void gelu_tanh_bwd(const Ew& a, int64_t b, int64_t e) { map_bwd<gelu_tanh_grad_f>(a, b, e); }
ASPEN_VM_INLINE void gelu_erf_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<gelu_erf_f>(a, b, e); }
ASPEN_VM_INLINE void gelu_erf_bwd(const Ew& a, int64_t b, int64_t e) { map_bwd<gelu_erf_grad_f>(a, b, e); }
ASPEN_VM_INLINE void silu_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<silu_f>(a, b, e); }
ASPEN_VM_INLINE float exp_f(float x) { return vm::exp(x); }
ASPEN_VM_INLINE float tanh_f(float x) { return vm::tanh(x); }
// NaN below 0, as std::sqrt. Under the default -fmath-errno GCC keeps a libm call for x < 0 (to set
// errno) and does not vectorize this loop; sqrt is not on a hot path in the models (LayerNorm and
// AdamW have their own kernels).
ASPEN_VM_INLINE float sqrt_f(float x) { return __builtin_sqrtf(x); }
ASPEN_VM_INLINE void exp_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<exp_f>(a, b, e); }
ASPEN_VM_INLINE void tanh_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<tanh_f>(a, b, e); }
ASPEN_VM_INLINE void sqrt_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<sqrt_f>(a, b, e); }
ASPEN_VM_INLINE void silu_bwd(const Ew& a, int64_t b, int64_t e) { map_bwd<silu_grad_f>(a, b, e); }

// NaN-propagating forms (x > 0 is false for NaN, so relu_f passes a NaN on as x itself).
ASPEN_VM_INLINE float relu_f(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
ASPEN_VM_INLINE float sigmoid_f(float x) { return vm::sigmoid(x); }
ASPEN_VM_INLINE float erf_f(float x) { return vm::erf(x); }
ASPEN_VM_INLINE float log_f(float x) { return __builtin_logf(x); }  // not on a hot path (log-softmax has its own)
ASPEN_VM_INLINE void relu_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<relu_f>(a, b, e); }
ASPEN_VM_INLINE void sigmoid_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<sigmoid_f>(a, b, e); }
ASPEN_VM_INLINE void erf_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<erf_f>(a, b, e); }
ASPEN_VM_INLINE void log_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<log_f>(a, b, e); }
// sin and cos: the C library's (not on a hot path: rotary tables an exporter left unfolded). floor, ceil
// and rint (half to even under the default rounding mode) vectorize to one rounding instruction.
ASPEN_VM_INLINE float sin_f(float x) { return __builtin_sinf(x); }
ASPEN_VM_INLINE float cos_f(float x) { return __builtin_cosf(x); }
ASPEN_VM_INLINE float floor_f(float x) { return __builtin_floorf(x); }
ASPEN_VM_INLINE float ceil_f(float x) { return __builtin_ceilf(x); }
ASPEN_VM_INLINE float round_f(float x) { return __builtin_rintf(x); }
ASPEN_VM_INLINE void sin_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<sin_f>(a, b, e); }
ASPEN_VM_INLINE void cos_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<cos_f>(a, b, e); }
ASPEN_VM_INLINE void floor_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<floor_f>(a, b, e); }
ASPEN_VM_INLINE void ceil_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<ceil_f>(a, b, e); }
ASPEN_VM_INLINE void round_fwd(const Ew& a, int64_t b, int64_t e) { map_fwd<round_f>(a, b, e); }
ASPEN_VM_INLINE void relu_bwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *dy = a.dy;
  float* dx = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}
ASPEN_VM_INLINE void max_fwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] != x[i] || x[i] > x2[i] ? x[i] : x2[i];  // x2 carries its own NaN
}
ASPEN_VM_INLINE void min_fwd(const Ew& a, int64_t b, int64_t e) {
  const float *x = a.x, *x2 = a.x2;
  float* y = a.y;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] != x[i] || x[i] < x2[i] ? x[i] : x2[i];
}

ASPEN_STAMP_VARIANTS(relu_fwd, Ew)
ASPEN_STAMP_VARIANTS(relu_bwd, Ew)
ASPEN_STAMP_VARIANTS(sigmoid_fwd, Ew)
ASPEN_STAMP_VARIANTS(erf_fwd, Ew)
ASPEN_STAMP_VARIANTS(log_fwd, Ew)
ASPEN_STAMP_VARIANTS(sin_fwd, Ew)
ASPEN_STAMP_VARIANTS(cos_fwd, Ew)
ASPEN_STAMP_VARIANTS(floor_fwd, Ew)
ASPEN_STAMP_VARIANTS(ceil_fwd, Ew)
ASPEN_STAMP_VARIANTS(round_fwd, Ew)
ASPEN_STAMP_VARIANTS(max_fwd, Ew)
ASPEN_STAMP_VARIANTS(min_fwd, Ew)
ASPEN_STAMP_VARIANTS(add_fwd, Ew)
ASPEN_STAMP_VARIANTS(add_bwd, Ew)
ASPEN_STAMP_VARIANTS(sub_fwd, Ew)
ASPEN_STAMP_VARIANTS(div_fwd, Ew)
ASPEN_STAMP_VARIANTS(where_fwd, Ew)
ASPEN_STAMP_VARIANTS(exp_fwd, Ew)
ASPEN_STAMP_VARIANTS(tanh_fwd, Ew)
ASPEN_STAMP_VARIANTS(sqrt_fwd, Ew)
ASPEN_STAMP_VARIANTS(mul_fwd, Ew)
ASPEN_STAMP_VARIANTS(mul_bwd, Ew)
ASPEN_STAMP_VARIANTS(scale_map, Ew)
ASPEN_STAMP_VARIANTS(gelu_tanh_fwd, Ew)
ASPEN_STAMP_VARIANTS(gelu_tanh_bwd, Ew)
ASPEN_STAMP_VARIANTS(gelu_erf_fwd, Ew)
ASPEN_STAMP_VARIANTS(gelu_erf_bwd, Ew)
ASPEN_STAMP_VARIANTS(silu_fwd, Ew)
ASPEN_STAMP_VARIANTS(silu_bwd, Ew)

// ---- bias + GELU over rows -------------------------------------------------

struct BiasRows {
  const float *x, *bias, *dy;
  float* y;        // y (forward) or dx (backward)
  float* partial;  // backward: one [C] row of dbias partial sums per row block
  int64_t C, grain;
};

template <float (*F)(float)>
ASPEN_VM_INLINE void bias_map_rows(const BiasRows& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  const float* bias = a.bias;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * C;
    float* y = a.y + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = F(x[c] + bias[c]);
  }
}
// Rows [r0, r1) are one block; its dbias partial is the block's rows summed in order.
template <float (*G)(float)>
ASPEN_VM_INLINE void bias_grad_rows(const BiasRows& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  const float* bias = a.bias;
  float* acc = a.partial + (r0 / a.grain) * C;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float *x = a.x + r * C, *dy = a.dy + r * C;
    float* dx = a.y + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float d = G(x[c] + bias[c]) * dy[c];
      dx[c] = d;
      acc[c] += d;
    }
  }
}
ASPEN_VM_INLINE void bias_gelu_tanh_fwd(const BiasRows& a, int64_t b, int64_t e) {
  bias_map_rows<gelu_tanh_f>(a, b, e);
}
ASPEN_VM_INLINE void bias_gelu_erf_fwd(const BiasRows& a, int64_t b, int64_t e) { bias_map_rows<gelu_erf_f>(a, b, e); }
ASPEN_VM_INLINE void bias_gelu_tanh_bwd(const BiasRows& a, int64_t b, int64_t e) {
  bias_grad_rows<gelu_tanh_grad_f>(a, b, e);
}
ASPEN_VM_INLINE void bias_gelu_erf_bwd(const BiasRows& a, int64_t b, int64_t e) {
  bias_grad_rows<gelu_erf_grad_f>(a, b, e);
}
ASPEN_STAMP_VARIANTS(bias_gelu_tanh_fwd, BiasRows)
ASPEN_STAMP_VARIANTS(bias_gelu_erf_fwd, BiasRows)
ASPEN_STAMP_VARIANTS(bias_gelu_tanh_bwd, BiasRows)
ASPEN_STAMP_VARIANTS(bias_gelu_erf_bwd, BiasRows)

using chunks::col_sum;
using chunks::ColSum;
ASPEN_STAMP_VARIANTS(col_sum, ColSum)

#undef ASPEN_STAMP_VARIANTS

}  // namespace

// ---- reference ---------------------------------------------------------------

namespace ref {

template <class T>
static T gelu_value(T x, GeluKind kind) {
  if (kind == GeluKind::tanh) {
    const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
    return T(0.5) * x * (T(1) + std::tanh(u));
  }
  return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
}
template <class T>
static T gelu_grad(T x, GeluKind kind) {
  if (kind == GeluKind::tanh) {
    const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
    const T t = std::tanh(u);
    const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
  }
  return T(0.5) * (T(1) + std::erf(x * T(kInvSqrt2))) + x * T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
}

template <class T>
void add_forward(const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = a[i] + b[i];
}
template <class T>
void add_backward(const T* dy, T* da, T* db, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const T g = dy[i];
    da[i] = g;
    db[i] = g;
  }
}
void add_forward_i32(const int32_t* a, const int32_t* b, int32_t* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = int32_t(uint32_t(a[i]) + uint32_t(b[i]));  // wraps, never UB
}
template <class T>
void sub_forward(const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = a[i] - b[i];
}
template <class T>
void div_forward(const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = a[i] / b[i];
}
template <class T>
void exp_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::exp(x[i]);
}
template <class T>
void tanh_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::tanh(x[i]);
}
template <class T>
void sqrt_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::sqrt(x[i]);
}
template <class T>
void where_forward(const uint8_t* cond, const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = cond[i] != 0 ? a[i] : b[i];
}
template <class T>
void relu_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::isnan(x[i]) ? x[i] : std::max(x[i], T(0));
}
template <class T>
void relu_backward(const T* x, const T* dy, T* dx, int64_t N) {
  for (int64_t i = 0; i < N; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}
template <class T>
void sigmoid_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = T(1) / (T(1) + std::exp(-x[i]));
}
template <class T>
void erf_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::erf(x[i]);
}
template <class T>
void log_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::log(x[i]);
}
template <class T>
void sin_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::sin(x[i]);
}
template <class T>
void cos_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::cos(x[i]);
}
template <class T>
void floor_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::floor(x[i]);
}
template <class T>
void ceil_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::ceil(x[i]);
}
template <class T>
void round_forward(const T* x, T* y, int64_t N) {  // half to even: x - floor(x) == 0.5 goes to the even one
  for (int64_t i = 0; i < N; ++i) {
    const T f = std::floor(x[i]), d = x[i] - f;
    y[i] = d > T(0.5) || (d == T(0.5) && std::fmod(f, T(2)) != T(0)) ? f + T(1) : f;
  }
}
template <class T>
void max_forward(const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::isnan(a[i]) || std::isnan(b[i]) ? a[i] + b[i] : std::max(a[i], b[i]);
}
template <class T>
void min_forward(const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = std::isnan(a[i]) || std::isnan(b[i]) ? a[i] + b[i] : std::min(a[i], b[i]);
}
template <class T>
void mul_forward(const T* a, const T* b, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = a[i] * b[i];
}
template <class T>
void mul_backward(const T* a, const T* b, const T* dy, T* da, T* db, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const T g = dy[i], va = a[i], vb = b[i];
    da[i] = g * vb;
    db[i] = g * va;
  }
}
template <class T>
void scale_forward(const T* x, T* y, int64_t N, T alpha) {
  for (int64_t i = 0; i < N; ++i) y[i] = alpha * x[i];
}
template <class T>
void scale_backward(const T* dy, T* dx, int64_t N, T alpha) {
  for (int64_t i = 0; i < N; ++i) dx[i] = alpha * dy[i];
}
template <class T>
void gelu_forward(const T* x, T* y, int64_t N, GeluKind kind) {
  for (int64_t i = 0; i < N; ++i) y[i] = gelu_value(x[i], kind);
}
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t N, GeluKind kind) {
  for (int64_t i = 0; i < N; ++i) dx[i] = gelu_grad(x[i], kind) * dy[i];
}
template <class T>
void silu_forward(const T* x, T* y, int64_t N) {
  for (int64_t i = 0; i < N; ++i) y[i] = x[i] / (T(1) + std::exp(-x[i]));
}
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const T s = T(1) / (T(1) + std::exp(-x[i]));
    dx[i] = dy[i] * s * (T(1) + x[i] * (T(1) - s));
  }
}
template <class T>
void bias_gelu_forward(const T* x, const T* bias, T* y, int64_t R, int64_t C, GeluKind kind) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = gelu_value(x[r * C + c] + bias[c], kind);
}
template <class T>
void bias_gelu_backward(const T* x, const T* bias, const T* dy, T* dx, T* dbias, int64_t R, int64_t C, GeluKind kind) {
  for (int64_t c = 0; c < C; ++c) dbias[c] = T(0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const T d = gelu_grad(x[r * C + c] + bias[c], kind) * dy[r * C + c];
      dx[r * C + c] = d;
      dbias[c] += d;
    }
}

#define ASPEN_INSTANTIATE(T)                                                              \
  template void add_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void add_backward<T>(const T*, T*, T*, int64_t);                               \
  template void sub_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void div_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void exp_forward<T>(const T*, T*, int64_t);                                    \
  template void tanh_forward<T>(const T*, T*, int64_t);                                   \
  template void sqrt_forward<T>(const T*, T*, int64_t);                                   \
  template void where_forward<T>(const uint8_t*, const T*, const T*, T*, int64_t);        \
  template void relu_forward<T>(const T*, T*, int64_t);                                   \
  template void relu_backward<T>(const T*, const T*, T*, int64_t);                        \
  template void sigmoid_forward<T>(const T*, T*, int64_t);                                \
  template void erf_forward<T>(const T*, T*, int64_t);                                    \
  template void log_forward<T>(const T*, T*, int64_t);                                    \
  template void sin_forward<T>(const T*, T*, int64_t);                                    \
  template void cos_forward<T>(const T*, T*, int64_t);                                    \
  template void floor_forward<T>(const T*, T*, int64_t);                                  \
  template void ceil_forward<T>(const T*, T*, int64_t);                                   \
  template void round_forward<T>(const T*, T*, int64_t);                                  \
  template void max_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void min_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void mul_forward<T>(const T*, const T*, T*, int64_t);                          \
  template void mul_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);           \
  template void scale_forward<T>(const T*, T*, int64_t, T);                               \
  template void scale_backward<T>(const T*, T*, int64_t, T);                              \
  template void gelu_forward<T>(const T*, T*, int64_t, GeluKind);                         \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t, GeluKind);              \
  template void silu_forward<T>(const T*, T*, int64_t);                                   \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);                        \
  template void bias_gelu_forward<T>(const T*, const T*, T*, int64_t, int64_t, GeluKind); \
  template void bias_gelu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, GeluKind);
ASPEN_INSTANTIATE(float)
ASPEN_INSTANTIATE(double)
#undef ASPEN_INSTANTIATE

}  // namespace ref

// ---- public kernels ----------------------------------------------------------

namespace {
// The checks, the reference under reference_mode(), else the ISA variant over chunks.
using EwRun = void (*)(const Ew&, int64_t, int64_t, int64_t);
using BinaryRef = void (*)(const float*, const float*, float*, int64_t);
Status binary(const char* k, EwRun run, BinaryRef reference, std::span<const float> a, std::span<const float> b,
              std::span<float> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "a", a, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "b", b, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (reference_mode()) {
    reference(a.data(), b.data(), y.data(), N);
  } else {
    run(Ew{a.data(), b.data(), nullptr, y.data(), nullptr, 0.0f}, N, kGrain, 1);
  }
  return Status();
}
using UnaryRef = void (*)(const float*, float*, int64_t);
Status unary(const char* k, EwRun run, UnaryRef reference, std::span<const float> x, std::span<float> y, int64_t N) {
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (reference_mode()) {
    reference(x.data(), y.data(), N);
  } else {
    run(Ew{x.data(), nullptr, nullptr, y.data(), nullptr, 0.0f}, N, kGrain, 1);
  }
  return Status();
}
}  // namespace

Status add_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N) {
  return binary("add_forward", add_fwd_run, ref::add_forward<float>, a, b, y, N);
}

Status add_backward(std::span<const float> dy, std::span<float> da, std::span<float> db, int64_t N) {
  constexpr const char* k = "add_backward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "da", da, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "db", db, N));
  if (reference_mode()) {
    ref::add_backward(dy.data(), da.data(), db.data(), N);
  } else {
    add_bwd_run(Ew{nullptr, nullptr, dy.data(), da.data(), db.data(), 0.0f}, N, kGrain, 1);
  }
  return Status();
}

Status mul_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N) {
  return binary("mul_forward", mul_fwd_run, ref::mul_forward<float>, a, b, y, N);
}

Status mul_backward(std::span<const float> a, std::span<const float> b, std::span<const float> dy, std::span<float> da,
                    std::span<float> db, int64_t N) {
  constexpr const char* k = "mul_backward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "a", a, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "b", b, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "da", da, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "db", db, N));
  if (reference_mode()) {
    ref::mul_backward(a.data(), b.data(), dy.data(), da.data(), db.data(), N);
  } else {
    mul_bwd_run(Ew{a.data(), b.data(), dy.data(), da.data(), db.data(), 0.0f}, N, kGrain, 1);
  }
  return Status();
}

Status scale_forward(std::span<const float> x, std::span<float> y, int64_t N, float alpha) {
  constexpr const char* k = "scale_forward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (reference_mode()) {
    ref::scale_forward(x.data(), y.data(), N, alpha);
  } else {
    scale_map_run(Ew{x.data(), nullptr, nullptr, y.data(), nullptr, alpha}, N, kGrain, 1);
  }
  return Status();
}

Status scale_backward(std::span<const float> dy, std::span<float> dx, int64_t N, float alpha) {
  constexpr const char* k = "scale_backward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, N));
  if (reference_mode()) {
    ref::scale_backward(dy.data(), dx.data(), N, alpha);
  } else {
    scale_map_run(Ew{dy.data(), nullptr, nullptr, dx.data(), nullptr, alpha}, N, kGrain, 1);
  }
  return Status();
}

Status gelu_forward(std::span<const float> x, std::span<float> y, int64_t N, GeluKind kind) {
  constexpr const char* k = "gelu_forward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_kind(k, kind));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (reference_mode()) {
    ref::gelu_forward(x.data(), y.data(), N, kind);
    return Status();
  }
  const Ew a{x.data(), nullptr, nullptr, y.data(), nullptr, 0.0f};
  if (kind == GeluKind::tanh)
    gelu_tanh_fwd_run(a, N, kGrain, 1);
  else
    gelu_erf_fwd_run(a, N, kGrain, 1);
  return Status();
}

Status gelu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx, int64_t N,
                     GeluKind kind) {
  constexpr const char* k = "gelu_backward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_kind(k, kind));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, N));
  if (reference_mode()) {
    ref::gelu_backward(x.data(), dy.data(), dx.data(), N, kind);
    return Status();
  }
  const Ew a{x.data(), nullptr, dy.data(), dx.data(), nullptr, 0.0f};
  if (kind == GeluKind::tanh)
    gelu_tanh_bwd_run(a, N, kGrain, 1);
  else
    gelu_erf_bwd_run(a, N, kGrain, 1);
  return Status();
}

// Small (generation state): the reference loop is the kernel.
Status add_forward(std::span<const int32_t> a, std::span<const int32_t> b, std::span<int32_t> y, int64_t N) {
  constexpr const char* k = "add_forward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "a", a, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "b", b, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  ref::add_forward_i32(a.data(), b.data(), y.data(), N);
  return Status();
}

Status sub_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N) {
  return binary("sub_forward", sub_fwd_run, ref::sub_forward<float>, a, b, y, N);
}
Status div_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N) {
  return binary("div_forward", div_fwd_run, ref::div_forward<float>, a, b, y, N);
}
Status relu_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("relu_forward", relu_fwd_run, ref::relu_forward<float>, x, y, N);
}
Status sigmoid_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("sigmoid_forward", sigmoid_fwd_run, ref::sigmoid_forward<float>, x, y, N);
}
Status erf_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("erf_forward", erf_fwd_run, ref::erf_forward<float>, x, y, N);
}
Status log_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("log_forward", log_fwd_run, ref::log_forward<float>, x, y, N);
}
Status sin_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("sin_forward", sin_fwd_run, ref::sin_forward<float>, x, y, N);
}
Status cos_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("cos_forward", cos_fwd_run, ref::cos_forward<float>, x, y, N);
}
Status floor_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("floor_forward", floor_fwd_run, ref::floor_forward<float>, x, y, N);
}
Status ceil_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("ceil_forward", ceil_fwd_run, ref::ceil_forward<float>, x, y, N);
}
Status round_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("round_forward", round_fwd_run, ref::round_forward<float>, x, y, N);
}
Status max_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N) {
  return binary("max_forward", max_fwd_run, ref::max_forward<float>, a, b, y, N);
}
Status min_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N) {
  return binary("min_forward", min_fwd_run, ref::min_forward<float>, a, b, y, N);
}
Status relu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx, int64_t N) {
  constexpr const char* k = "relu_backward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, N));
  if (reference_mode()) {
    ref::relu_backward(x.data(), dy.data(), dx.data(), N);
  } else {
    relu_bwd_run(Ew{x.data(), nullptr, dy.data(), dx.data(), nullptr, 0.0f}, N, kGrain, 1);
  }
  return Status();
}
Status exp_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("exp_forward", exp_fwd_run, ref::exp_forward<float>, x, y, N);
}
Status tanh_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("tanh_forward", tanh_fwd_run, ref::tanh_forward<float>, x, y, N);
}
Status sqrt_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("sqrt_forward", sqrt_fwd_run, ref::sqrt_forward<float>, x, y, N);
}
Status where_forward(std::span<const uint8_t> cond, std::span<const float> a, std::span<const float> b,
                     std::span<float> y, int64_t N) {
  constexpr const char* k = "where_forward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "cond", cond, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "a", a, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "b", b, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (reference_mode()) {
    ref::where_forward(cond.data(), a.data(), b.data(), y.data(), N);
  } else {
    Ew e{a.data(), b.data(), nullptr, y.data(), nullptr, 0.0f};
    e.cond = cond.data();
    where_fwd_run(e, N, kGrain, 1);
  }
  return Status();
}

Status silu_forward(std::span<const float> x, std::span<float> y, int64_t N) {
  return unary("silu_forward", silu_fwd_run, ref::silu_forward<float>, x, y, N);
}

Status silu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx, int64_t N) {
  constexpr const char* k = "silu_backward";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, N));
  if (reference_mode()) {
    ref::silu_backward(x.data(), dy.data(), dx.data(), N);
  } else {
    silu_bwd_run(Ew{x.data(), nullptr, dy.data(), dx.data(), nullptr, 0.0f}, N, kGrain, 1);
  }
  return Status();
}

Status bias_gelu_forward(std::span<const float> x, std::span<const float> bias, std::span<float> y, int64_t R,
                         int64_t C, GeluKind kind) {
  constexpr const char* k = "bias_gelu_forward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_kind(k, kind));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "bias", bias, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, R * C));
  if (reference_mode()) {
    ref::bias_gelu_forward(x.data(), bias.data(), y.data(), R, C, kind);
    return Status();
  }
  if (C == 0) return Status();
  const BiasRows a{x.data(), bias.data(), nullptr, y.data(), nullptr, C, 0};
  const int64_t grain = std::max<int64_t>(1, kGrain / C);
  if (kind == GeluKind::tanh)
    bias_gelu_tanh_fwd_run(a, R, grain, C);
  else
    bias_gelu_erf_fwd_run(a, R, grain, C);
  return Status();
}

Status bias_gelu_backward(std::span<const float> x, std::span<const float> bias, std::span<const float> dy,
                          std::span<float> dx, std::span<float> dbias, int64_t R, int64_t C, GeluKind kind) {
  constexpr const char* k = "bias_gelu_backward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_kind(k, kind));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "bias", bias, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dbias", dbias, C));
  if (reference_mode()) {
    ref::bias_gelu_backward(x.data(), bias.data(), dy.data(), dx.data(), dbias.data(), R, C, kind);
    return Status();
  }
  if (C == 0) return Status();
  if (R == 0) {
    std::fill(dbias.begin(), dbias.begin() + C, 0.0f);
    return Status();
  }
  const int64_t grain = reduce_grain(R, C);
  const int64_t blocks = (R + grain - 1) / grain;
  std::unique_ptr<float[]> scratch(blocks > 1 ? new float[blocks * C] : nullptr);
  const BiasRows a{x.data(), bias.data(), dy.data(), dx.data(), blocks > 1 ? scratch.get() : dbias.data(), C, grain};
  if (kind == GeluKind::tanh)
    bias_gelu_tanh_bwd_run(a, R, grain, C);
  else
    bias_gelu_erf_bwd_run(a, R, grain, C);
  if (blocks > 1)
    col_sum_run(ColSum{scratch.get(), dbias.data(), blocks, C}, C, std::max<int64_t>(256, kGrain / blocks), blocks);
  return Status();
}

}  // namespace aspen::kernels
