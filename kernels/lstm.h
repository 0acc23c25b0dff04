// kernels/lstm.h: the LSTM recurrence over a whole sequence, forward and backward, in one call each.
//
// The cell is ONNX's LSTM with its default activations (sigmoid for the gates, tanh for the cell input and
// the output), no peepholes, no clip. The input's part of every gate, xw = X Wᵀ + Wb + Rb, is one matrix
// product the caller makes beforehand; this kernel runs what cannot be batched, the steps:
//   z_t = xw[t] + h_{t-1} Rᵀ            (gates in ONNX's order: i, o, f, c; r is [4H, H])
//   i, o, f = sigmoid(z_i, z_o, z_f),  ĉ = tanh(z_c)
//   c_t = f c_{t-1} + i ĉ,  h_t = o tanh(c_t)
// over t = 0 .. T-1 (reverse: T-1 .. 0), from h0, c0. Outputs: y[t] = h_t, c[t] = c_t and gates[t] = (i, o,
// f, ĉ) after their activations (what the backward reads), each [T, B, .].
// The backward takes dy [T, B, H] (and optionally dc, the gradient of the c output) and gives dxw (the gates'
// pre-activation gradients, [T, B, 4H]: also dX and dW through the caller's product, and dR = Σ_t dz_tᵀ
// h_{t-1}, one product the caller makes), dh0 and dc0 [B, H].
//
// Batch rows are independent: the fast kernels run chunks of rows on the calling thread's OpenMP team, each
// row's arithmetic the same whatever the chunking, so results do not depend on the thread count. Per step,
// h_{t-1} Rᵀ runs as rows of Rᵀ added into z (forward) and dz R as rows of R added into dh (backward), both
// vector loops over a contiguous row; the activations are kernels/vec_math.h's. Outputs are overwritten.
// Why our own: the steps are small products (B × H times H × 4H) chained through an elementwise cell; one
// call per step of a library's product, and the cell's ops between them, cost more than the arithmetic at
// the sizes users train on CPUs (an unrolled LSTM of 32 steps and 2 bidirectional layers is ~7,000 ops a
// training step).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace aspen::kernels {

struct LstmShape {
  int64_t T = 1, B = 1, H = 1;
  bool reverse = false;
};

// Floats of `work` lstm_forward needs (Rᵀ).
inline int64_t lstm_forward_work(const LstmShape& s) { return 4 * s.H * s.H; }

[[nodiscard]] Status lstm_forward(const LstmShape& s, const float* xw, const float* r, const float* h0,
                                  const float* c0, float* y, float* c, float* gates, float* work);
// dc may be null (the c output reaches no loss).
[[nodiscard]] Status lstm_backward(const LstmShape& s, const float* dy, const float* dc, const float* r,
                                   const float* c0, const float* c, const float* gates, float* dxw, float* dh0,
                                   float* dc0);

namespace ref {
template <class T>
void lstm_forward(const LstmShape& s, const T* xw, const T* r, const T* h0, const T* c0, T* y, T* c, T* gates);
template <class T>
void lstm_backward(const LstmShape& s, const T* dy, const T* dc, const T* r, const T* c0, const T* c,
                   const T* gates, T* dxw, T* dh0, T* dc0);
}  // namespace ref

}  // namespace aspen::kernels
