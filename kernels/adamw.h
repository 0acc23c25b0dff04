// kernels/adamw.h: one fused AdamW optimizer step over N f32 parameters.
//
// Decoupled weight decay as torch.optim.AdamW (Loshchilov & Hutter), with the
// order of operations of PyTorch 2.x's single-tensor implementation
// (_single_tensor_adamw / _single_tensor_adam with decoupled weight decay).
// Scalars are computed in f64, as Python does, and rounded to f32 where
// PyTorch hands them to an f32 tensor op:
//
//   g     = grad · grad_scale                         (f32; grad_scale = 1 is exact)
//   param = param · f32(1 − lr·wd)                    param.mul_(1 - lr * weight_decay)
//   m     = lerp(m, g, f32(1 − beta1))                exp_avg.lerp_(grad, 1 - beta1):
//             w = f32(1 − beta1); |w| < 0.5: m + w·(g − m);  else g − (1 − w)·(g − m)
//   v     = v · f32(beta2) + (f32(1 − beta2) · g) · g exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   bc1   = 1 − beta1^step,  bc2 = 1 − beta2^step     (f64)
//   denom = sqrt(v) / f32(sqrt(bc2)) + f32(eps)       (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
//   param = param − (f32(lr / bc1) · m) / denom       param.addcdiv_(exp_avg, denom, value=-step_size)
//
// Mathematically m = beta1·m + (1 − beta1)·g and
// param −= lr · m̂ / (sqrt(v̂) + eps) with m̂ = m / bc1, v̂ = v / bc2.
//
// ref::adamw_step<float> performs exactly those f32 operations. The fast path
// may fuse a multiply and an add (as PyTorch's own vectorized CPU kernels do),
// so it agrees with the reference to within about an ulp per element, not
// bitwise. Elements are independent: the result is the same for any thread
// count.
//
// grad_scale multiplies the gradient before anything else: pass 1/loss_scale
// to unscale mixed-precision gradients, or a clipping factor
// min(1, max_norm / total_norm). Keep it 1 otherwise.
//
// Thread-safety: pure function of its arguments (updates param, m, v in place).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

struct AdamWConfig {
  // Defaults are torch.optim.AdamW's. Doubles, as Python floats are.
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  // each in [0, 1)
  double eps = 1e-8;                  // >= 0
  double weight_decay = 1e-2;         // >= 0
  int64_t step = 1;                   // 1-based index of this step (bias correction)
  float grad_scale = 1.0f;            // gradients are multiplied by this first
};

// One step. param, grad, m (exp_avg), v (exp_avg_sq): [N] each, f32. m and v
// start at zero before step 1. grad is read-only.
[[nodiscard]] Status adamw_step(std::span<float> param, std::span<const float> grad, std::span<float> m,
                                std::span<float> v, int64_t N, const AdamWConfig& config);

namespace ref {
// Plain loop, no checks, no threads. Instantiated for float and double (the
// double version rounds the scalars to double instead of f32).
template <class T>
void adamw_step(T* param, const T* grad, T* m, T* v, int64_t N, const AdamWConfig& config);
}  // namespace ref

}  // namespace aspen::kernels
