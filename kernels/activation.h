// kernels/activation.h: elementwise activations and arithmetic, forward and backward.
//
// All f32, contiguous. Elementwise kernels take N (element count); the fused
// bias + GELU kernels take a row-major [R, C] tensor and a bias [C].
//
// Backward kernels overwrite their gradient outputs (they never accumulate).
// An output may be the very same buffer as an input of the same kernel (in
// place, e.g. y = x), but must not partially overlap one.
//
// GELU comes in two forms:
//   GeluKind::tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (HF "gelu_new", GPT-2)
//   GeluKind::erf   0.5 x (1 + erf(x / sqrt 2))                       (exact; BERT)
// The fast tanh form is computed as x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3),
// which is the same function without the cancellation 1 + tanh(u) suffers for x << 0.
//
// Determinism: every output element is a fixed expression of its inputs, and
// dbias (a sum over rows) is reduced over fixed row blocks combined in a fixed
// order, so results do not depend on the number of OpenMP threads.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

enum class GeluKind : int { tanh = 0, erf = 1 };

// y = a + b.
[[nodiscard]] Status add_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N);
// Of y = a + b: da = dy, db = dy.
[[nodiscard]] Status add_backward(std::span<const float> dy, std::span<float> da, std::span<float> db, int64_t N);

// y = a + b on int32, wrapping modulo 2^32 (counters and positions of generation state).
[[nodiscard]] Status add_forward(std::span<const int32_t> a, std::span<const int32_t> b, std::span<int32_t> y,
                                 int64_t N);
// y = a - b.
[[nodiscard]] Status sub_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N);
// y = a / b (IEEE: x / 0 is ±inf or NaN, as in PyTorch).
[[nodiscard]] Status div_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N);
// y = exp(x), tanh(x), sqrt(x) (vec_math.h's exp and tanh: 1-3 ulp; sqrt correctly rounded, NaN below 0).
[[nodiscard]] Status exp_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status tanh_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status sqrt_forward(std::span<const float> x, std::span<float> y, int64_t N);
// y = max(x, 0) (ReLU; NaN stays NaN), 1 / (1 + e^-x), erf(x) (vec_math.h: 1-3 ulp), log(x) (the C
// library's: -inf at 0, NaN below).
[[nodiscard]] Status relu_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status sigmoid_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status erf_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status log_forward(std::span<const float> x, std::span<float> y, int64_t N);
// y = sin(x), cos(x) (the C library's), floor(x), ceil(x), round(x) (half to even, as ONNX Round and
// torch.round; NaN and infinities pass).
[[nodiscard]] Status sin_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status cos_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status floor_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status ceil_forward(std::span<const float> x, std::span<float> y, int64_t N);
[[nodiscard]] Status round_forward(std::span<const float> x, std::span<float> y, int64_t N);
// Of y = relu(x): dx = dy where x > 0, else 0.
[[nodiscard]] Status relu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx, int64_t N);
// y = max(a, b), min(a, b); a NaN in either gives NaN (as torch.maximum, ONNX Max).
[[nodiscard]] Status max_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N);
[[nodiscard]] Status min_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N);
// y = cond != 0 ? a : b; cond holds one byte per element (bool or u8).
[[nodiscard]] Status where_forward(std::span<const uint8_t> cond, std::span<const float> a, std::span<const float> b,
                                   std::span<float> y, int64_t N);

// y = a * b (elementwise).
[[nodiscard]] Status mul_forward(std::span<const float> a, std::span<const float> b, std::span<float> y, int64_t N);
// Of y = a * b: da = dy * b, db = dy * a.
[[nodiscard]] Status mul_backward(std::span<const float> a, std::span<const float> b, std::span<const float> dy,
                                  std::span<float> da, std::span<float> db, int64_t N);

// y = alpha * x.
[[nodiscard]] Status scale_forward(std::span<const float> x, std::span<float> y, int64_t N, float alpha);
// Of y = alpha * x: dx = alpha * dy.
[[nodiscard]] Status scale_backward(std::span<const float> dy, std::span<float> dx, int64_t N, float alpha);

// y = gelu(x), in the form `kind` (see above).
[[nodiscard]] Status gelu_forward(std::span<const float> x, std::span<float> y, int64_t N, GeluKind kind);
// Of y = gelu(x): dx = gelu'(x) * dy.
[[nodiscard]] Status gelu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx, int64_t N,
                                   GeluKind kind);

// y = x * sigmoid(x) (SiLU, swish).
[[nodiscard]] Status silu_forward(std::span<const float> x, std::span<float> y, int64_t N);
// Of y = x sigmoid(x): dx = dy * s (1 + x (1 - s)), s = sigmoid(x).
[[nodiscard]] Status silu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx, int64_t N);

// x, y: [R, C]; bias: [C].  y[r, c] = gelu(x[r, c] + bias[c]).
[[nodiscard]] Status bias_gelu_forward(std::span<const float> x, std::span<const float> bias, std::span<float> y,
                                       int64_t R, int64_t C, GeluKind kind);
// Of y[r, c] = gelu(x[r, c] + bias[c]):
//   dx[r, c] = gelu'(x[r, c] + bias[c]) dy[r, c];  dbias[c] = sum over r of dx[r, c].
// x, dy, dx: [R, C]; bias, dbias: [C]. dx may be dy (in place).
[[nodiscard]] Status bias_gelu_backward(std::span<const float> x, std::span<const float> bias,
                                        std::span<const float> dy, std::span<float> dx, std::span<float> dbias,
                                        int64_t R, int64_t C, GeluKind kind);

// The reference: the definitions, in plain loops (no checks, no threads).
// GeluKind::tanh is evaluated literally as 0.5 x (1 + tanh(u)).
namespace ref {
template <class T>
void add_forward(const T* a, const T* b, T* y, int64_t N);
template <class T>
void add_backward(const T* dy, T* da, T* db, int64_t N);
void add_forward_i32(const int32_t* a, const int32_t* b, int32_t* y, int64_t N);
template <class T>
void sub_forward(const T* a, const T* b, T* y, int64_t N);
template <class T>
void div_forward(const T* a, const T* b, T* y, int64_t N);
template <class T>
void exp_forward(const T* x, T* y, int64_t N);
template <class T>
void tanh_forward(const T* x, T* y, int64_t N);
template <class T>
void sqrt_forward(const T* x, T* y, int64_t N);
template <class T>
void where_forward(const uint8_t* cond, const T* a, const T* b, T* y, int64_t N);
template <class T>
void relu_forward(const T* x, T* y, int64_t N);
template <class T>
void relu_backward(const T* x, const T* dy, T* dx, int64_t N);
template <class T>
void sigmoid_forward(const T* x, T* y, int64_t N);
template <class T>
void erf_forward(const T* x, T* y, int64_t N);
template <class T>
void log_forward(const T* x, T* y, int64_t N);
template <class T>
void sin_forward(const T* x, T* y, int64_t N);
template <class T>
void cos_forward(const T* x, T* y, int64_t N);
template <class T>
void floor_forward(const T* x, T* y, int64_t N);
template <class T>
void ceil_forward(const T* x, T* y, int64_t N);
template <class T>
void round_forward(const T* x, T* y, int64_t N);
template <class T>
void max_forward(const T* a, const T* b, T* y, int64_t N);
template <class T>
void min_forward(const T* a, const T* b, T* y, int64_t N);
template <class T>
void mul_forward(const T* a, const T* b, T* y, int64_t N);
template <class T>
void mul_backward(const T* a, const T* b, const T* dy, T* da, T* db, int64_t N);
template <class T>
void scale_forward(const T* x, T* y, int64_t N, T alpha);
template <class T>
void scale_backward(const T* dy, T* dx, int64_t N, T alpha);
template <class T>
void gelu_forward(const T* x, T* y, int64_t N, GeluKind kind);
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t N, GeluKind kind);
template <class T>
void silu_forward(const T* x, T* y, int64_t N);
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t N);
template <class T>
void bias_gelu_forward(const T* x, const T* bias, T* y, int64_t R, int64_t C, GeluKind kind);
template <class T>
void bias_gelu_backward(const T* x, const T* bias, const T* dy, T* dx, T* dbias, int64_t R, int64_t C, GeluKind kind);
}  // namespace ref

}  // namespace aspen::kernels
