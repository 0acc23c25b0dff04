// kernels/optimizers.h: the other fused optimizer steps (SGD, LAMB) and the
// sum of squares that gradient clipping and overflow checks read. AdamW has
// its own file (kernels/adamw.h), whose conventions these follow: f32
// parameters and state updated in place, scalars computed in f64 and rounded
// once to f32, `grad_scale` multiplying the gradient before anything else
// (1/loss_scale, times a clipping factor).
//
// SGD, torch.optim.SGD's single-tensor order (dampening 0):
//   g   = grad · grad_scale
//   g   = g + f32(weight_decay) · param               d_p.add(param, alpha=weight_decay)   (weight_decay > 0)
//   buf = f32(momentum) · buf + g                     buf.mul_(momentum).add_(d_p)          (momentum > 0;
//                                                     buf starts at zero, so step 1 gives buf = g as PyTorch's clone)
//   g   = nesterov ? g + f32(momentum) · buf : buf    (momentum > 0)
//   param = param + f32(−lr) · g                      param.add_(d_p, alpha=-lr)
//
// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", with
// Adam's bias correction and decoupled weight decay inside the trust ratio,
// as NVIDIA apex's FusedLAMB without its global gradient pre-normalisation):
//   m = β1·m + (1 − β1)·g,  v = β2·v + (1 − β2)·g²
//   u = (m / bc1) / (sqrt(v / bc2) + eps) + wd · param
//   trust = ‖param‖ / ‖u‖ when both norms are > 0, else 1   (norms over the whole tensor)
//   param = param − lr · trust · u
// Two passes: the first updates m and v and sums ‖param‖² and ‖u‖² in f64
// per fixed chunk, added in chunk order (so the result does not depend on the
// thread count); the second recomputes u and applies it.
//
// sum_squares: Σ x² over N f32 values, accumulated in f64 per fixed chunk and
// added in chunk order: the same bits for any thread count. Any Inf or NaN
// element gives a non-finite sum (how overflow is detected).
//
// Thread-safety: pure functions of their arguments (state updated in place).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

struct SgdConfig {
  double lr = 1e-3;
  double momentum = 0.0;      // in [0, 1); 0: no buffer
  double weight_decay = 0.0;  // >= 0 (L2, added to the gradient, as PyTorch)
  bool nesterov = false;      // needs momentum > 0
  float grad_scale = 1.0f;
};

// param, grad: [N]; buf: [N] when momentum > 0, else empty.
[[nodiscard]] Status sgd_step(std::span<float> param, std::span<const float> grad, std::span<float> buf, int64_t N,
                              const SgdConfig& config);

struct LambConfig {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  // in [0, 1)
  double eps = 1e-6;                  // >= 0 (apex's default)
  double weight_decay = 0.01;         // >= 0
  int64_t step = 1;                   // 1-based (bias correction)
  float grad_scale = 1.0f;
};

[[nodiscard]] Status lamb_step(std::span<float> param, std::span<const float> grad, std::span<float> m,
                               std::span<float> v, int64_t N, const LambConfig& config);

// Σ x², deterministic (see above). N may be 0 (the sum is 0).
[[nodiscard]] Result<double> sum_squares(std::span<const float> x, int64_t N);

namespace ref {
template <class T>
void sgd_step(T* param, const T* grad, T* buf, int64_t N, const SgdConfig& config);
template <class T>
void lamb_step(T* param, const T* grad, T* m, T* v, int64_t N, const LambConfig& config);
double sum_squares(const float* x, int64_t N);  // one f64 sum in index order
}  // namespace ref

}  // namespace aspen::kernels
