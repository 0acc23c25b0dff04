// kernels/gemv.h: matrix products with a few activation rows (decode), built to
// stream the weights from memory once, as fast as the memory reads them.
//
//   y[m, n] = bias[n] + sum over k of x[m, k] · W(k, n)        m < M, n < N, k < K
//
// x is [M, K] f32, y is [M, N] f32 (overwritten), bias is [N] f32 or empty.
// The weights w are f32 or bf16 in one of two layouts:
//   trans_b:  w is [N, K], W(k, n) = w[n·K + k]   (nn.Linear, the tied LM head)
//   plain:    w is [K, N], W(k, n) = w[k·N + n]   (GPT-2's Conv1D)
// This is kernels/matmul.h's product with batch 1 and A = x, B = w, restricted
// to f32 activations; it exists because a token-by-token decode is bound by
// weight bytes per second, and a GEMM library's M = 1 path reaches about half
// of what a plain read of the same bytes does (docs/kernels.md, "GEMV").
//
// Design (details in docs/kernels.md):
//   - every weight byte is read once from memory for all M rows: the M rows are
//     blocked inside the kernel, so extra rows cost arithmetic, not bandwidth;
//   - the team's threads split N into large contiguous pieces, each thread
//     streaming its own rows ([N, K]) or its own column range down K ([K, N]);
//   - bf16 weights are widened to f32 exactly (a shift) and multiplied in f32,
//     so x is never rounded: the result is the f32 product of x and the bf16
//     values, with f32 accumulation.
// Any M >= 1 is correct; the design targets M <= 16 (beyond that a blocked
// GEMM reuses x better than this streams W).
//
// Determinism: each y[m, n] is reduced in an order fixed by K and the ISA
// alone, never by the thread count (parallelism is over n only).
//
// Thread-safety: gemv() runs on the calling thread's OpenMP team (see
// docs/threading.md) and touches only its arguments; concurrent calls on
// different teams are safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::kernels {

struct GemvShape {
  int64_t M = 0, N = 0, K = 0;
  bool trans_b = false;         // w is [N, K] (else [K, N])
  bool has_bias = false;
  DType weight = DType::f32;    // f32 or bf16
  // x's values are bf16 values (a mixed matmul rounded them: NOTE [mixed matmul] in graph/ops_matmul.cc). With bf16
  // weights and M > 1 the kernels may then multiply bf16 pairs (VDPBF16PS where the CPU has it: NOTE [gemv
  // bf16 dot]); the products are exact either way and each output keeps its k order: the same bits as without
  // the flag, except where a denormal enters (the instruction flushes them). Set it only for such x.
  bool x_bf16 = false;

  int64_t x_elements() const { return M * K; }
  int64_t w_elements() const { return K * N; }
  int64_t y_elements() const { return M * N; }
  int64_t weight_bytes() const { return w_elements() * int64_t(dtype_size(weight)); }
  std::string to_string() const;  // "gemv 1x768x2304 w:bf16 [K,N] +bias"
  bool operator==(const GemvShape&) const = default;
};

// Checked entry points: validate the shape and every buffer, then run the
// reference (reference_mode()) or the fast version for active_isa().
[[nodiscard]] Status gemv(std::span<const float> x, std::span<const float> w, std::span<const float> bias,
                          std::span<float> y, const GemvShape& shape);
[[nodiscard]] Status gemv(std::span<const float> x, std::span<const bf16> w, std::span<const float> bias,
                          std::span<float> y, const GemvShape& shape);

// Validates a shape alone (extents >= 1, weight f32 or bf16).
[[nodiscard]] Status gemv_validate(const GemvShape& shape);

// Raw fast run for the compiler's path: the shape was validated and the
// buffers are trusted to match it; w points to shape.weight elements.
void gemv_run(const GemvShape& shape, const float* x, const void* w, const float* bias, float* y);

// NOTE [packed gemv] (gemv_internal.h): bf16 weights regrouped once (a fixed weight: the tied LM head [N, K],
// GPT-2's Conv1D [K, N]) so that each thread reads one stream: same bits as gemv_run on w, read faster.
// gemv_packable: bf16, and [N, K] with N >= 8 (any M), or [K, N] with M == 1 and K >= 8 on an AVX-512 ISA (other
// ISAs run a packed [K, N] correctly but slowly: unpacked per call). gemv_pack writes shape.weight_bytes() bytes.
bool gemv_packable(const GemvShape& shape);
void gemv_pack(const GemvShape& shape, const void* w, void* out);
void gemv_run_packed(const GemvShape& shape, const float* x, const void* packed, const float* bias, float* y);

// One product of a group: its shape and buffers; `packed`: w in gemv_pack's layout (gemv_packable(shape)).
struct GemvCall {
  GemvShape shape;
  const void* w = nullptr;
  bool packed = false;
  const float* bias = nullptr;
  float* y = nullptr;
};

// NOTE [gemv groups] (gemv.cc): several products of one x (a layer's q, k and v; its gate and up) in one
// parallel region, their rows cut among the team as one list: one fork/join where there was one per product,
// and no thread idles at the end of a small one. Each output has the bits gemv_run (or gemv_run_packed) gives.
// Every call: [N, K] (trans_b), the same M, K, weight type and x_bf16; at most 16 calls. Trusted as gemv_run.
void gemv_run_group(const float* x, std::span<const GemvCall> calls);

namespace ref {
// The definition: y = bias + x · W in T (float or double), W read from Wt
// (T or bf16) and widened; k summed in order.
template <class T, class Wt>
void gemv(const T* x, const Wt* w, const T* bias, T* y, const GemvShape& shape);
}  // namespace ref

}  // namespace aspen::kernels
