// kernels/softmax.h: softmax over the last axis, and fused softmax + cross-entropy.
//
// All f32, row-major. Softmax: x, y, dy, dx are [R, C]. Cross-entropy: logits
// and dlogits are [R, V], targets (int32), loss and lse are [R].
//
// Softmax is computed stably, y = exp(x - max_c x) / sum_c exp(x - max_c x), one
// row at a time held in cache: x is read from memory once and y written once.
//
// Cross-entropy per row r with target t = targets[r]:
//   lse[r] = log sum_v exp(logits[r, v])      (stable: max + log sum exp(x - max))
//   loss[r] = lse[r] - logits[r, t]            (0 for a row whose target is ignore_index)
//   mean = sum of loss over non-ignored rows / their count; 0 when every row is ignored.
// A target outside [0, V) that is not ignore_index is an error (a Status naming
// the row, the value and V), found before anything is computed or written.
//
// Determinism: every row is computed by one thread in a fixed order, and the
// mean is summed over rows in row order, so results do not depend on the
// number of OpenMP threads. Backward kernels overwrite their outputs.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

// The default ignore_index, as in PyTorch.
inline constexpr int32_t kIgnoreIndex = -100;

// y = softmax(x) over each row of C. Requires C >= 1. y may be x (in place).
[[nodiscard]] Status softmax_forward(std::span<const float> x, std::span<float> y, int64_t R, int64_t C);

// Of y = softmax(x): dx = y * (dy - sum_c dy * y), per row. dx may be dy (in place).
[[nodiscard]] Status softmax_backward(std::span<const float> y, std::span<const float> dy, std::span<float> dx,
                                      int64_t R, int64_t C);

// Writes loss [R], lse [R] (for every row, ignored ones included) and
// mean_loss[0] (see above). Requires V >= 1.
[[nodiscard]] Status cross_entropy_forward(std::span<const float> logits, std::span<const int32_t> targets,
                                           std::span<float> loss, std::span<float> lse, std::span<float> mean_loss,
                                           int64_t R, int64_t V, int32_t ignore_index = kIgnoreIndex);

// Of mean = sum over non-ignored r of (lse[r] - logits[r, t_r]) / count:
//   dlogits[r, v] = (softmax(logits[r])[v] - [v == t_r]) * dloss_scale / count,
//   and 0 on ignored rows (all of them when count is 0).
// dloss_scale is the gradient arriving at the mean (1 for a plain mean).
// lse is what cross_entropy_forward saved; softmax is recomputed from it, so
// each row is one read of logits and one write of dlogits. dlogits may be
// logits (in place).
[[nodiscard]] Status cross_entropy_backward(std::span<const float> logits, std::span<const int32_t> targets,
                                            std::span<const float> lse, std::span<float> dlogits, int64_t R, int64_t V,
                                            float dloss_scale, int32_t ignore_index = kIgnoreIndex);

// The reference: the definitions, in plain loops (no checks, no threads).
namespace ref {
template <class T>
void softmax_forward(const T* x, T* y, int64_t R, int64_t C);
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t R, int64_t C);
template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* loss, T* lse, T* mean_loss, int64_t R, int64_t V,
                           int32_t ignore_index);
template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, T* dlogits, int64_t R, int64_t V,
                            T dloss_scale, int32_t ignore_index);
}  // namespace ref

}  // namespace aspen::kernels
