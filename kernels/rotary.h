// kernels/rotary.h: rotary position embedding (RoPE), forward and backward.
//
// x is [B, T, H, D]: batch, position, head, head dimension. This is the layout
// a projection produces before Hugging Face transposes q/k to [B, H, T, D]
// (view(B, T, H, D)); rotating before the transpose lets one position row
// serve all H heads. Only the first rotary_dim channels of each head (even,
// <= D) rotate; channels [rotary_dim, D) pass through unchanged (partial
// rotary, as GPT-J and GPT-NeoX use).
//
// Channel p's pair (a, b), 0 <= p < rotary_dim/2, within one head row:
//   RotaryLayout::interleaved  (GPT-J, HF rotate_every_two): a = 2p, b = 2p + 1
//   RotaryLayout::half_split   (GPT-NeoX / Llama, HF rotate_half): a = p, b = p + rotary_dim/2
// With angle = pos[b, t] · inv_freq[p] and inv_freq[p] = base^(-2p / rotary_dim):
//   y_a = x_a·cos(angle) − x_b·sin(angle)
//   y_b = x_b·cos(angle) + x_a·sin(angle)
//
// Positions are int32 [B, T], one per (batch, time) row, so left-padded
// batches and KV-cache offsets (pos = past + t) need no special case.
//
// Precision (pinned; tests compare against ref:: with the same choices):
//   - inv_freq[p] is computed in f64 and rounded once to f32 (rotary_inv_freq).
//     HF computes it in f32, which can differ by one f32 ulp.
//   - The f32 kernels form the angle as float(pos) · inv_freq in f32, as HF
//     does, then cos/sin of that f32 angle with the C library (ref::<float>
//     and the fast path make identical cos/sin tables). ref::<double> forms
//     the angle and cos/sin in f64 from the same f32 inv_freq.
//
// In place: y may be x itself (same data pointer); otherwise the two must not
// overlap. Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

enum class RotaryLayout : int { interleaved = 0, half_split = 1 };

// The frequencies: inv_freq[p] = base^(-2p / rotary_dim), then Hugging Face's
// static rope_scaling variants (modeling_rope_utils):
//   none:    as is
//   linear:  inv_freq / factor (positions interpolated by factor)
//   llama3:  with wavelen = 2π / inv_freq, lo = original_max_positions / low_freq_factor and
//            hi = original_max_positions / high_freq_factor: wavelen > lo (low frequencies) divides by
//            factor, wavelen < hi keeps inv_freq, and between them
//            smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
//            blends: (1 - smooth) inv_freq / factor + smooth inv_freq.
//   dynamic: NTK-aware scaling by the run's length (HF's _compute_dynamic_ntk_parameters): with
//            L = max(seq_len, original_max_positions), the base becomes
//            base · (factor · L / original_max_positions − (factor − 1))^(rotary_dim / (rotary_dim − 2));
//            rotary_forward and rotary_backward take seq_len = max(pos) + 1 over the call's positions (HF's
//            dynamic_rope_update: the largest position of the forward's position_ids; HF's module also keeps
//            the largest length seen in earlier calls until a run shorter than original_max_positions
//            resets it; here each call stands alone).
// A float converts implicitly: the plain base is the common case.
struct RotaryFrequencies {
  enum class Scaling { none, linear, llama3, dynamic };
  float base = 10000.0f;
  Scaling scaling = Scaling::none;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
  int64_t seq_len = 0;  // dynamic: the run's length (the kernels set it from the positions)
  RotaryFrequencies() = default;
  RotaryFrequencies(float b) : base(b) {}  // NOLINT(google-explicit-constructor)
};

// freq for one call over `pos`: dynamic scaling's seq_len = max(pos) + 1 (what rotary_forward and
// rotary_backward use; ref:: callers take it from here); other scalings as they are.
RotaryFrequencies rotary_run_frequencies(const RotaryFrequencies& freq, std::span<const int32_t> pos);

// inv_freq[p] of `freq`, computed in f64, rounded to f32.
float rotary_inv_freq(int64_t p, int64_t rotary_dim, const RotaryFrequencies& freq);

// y[b, t, h, :] = x[b, t, h, :] with its first rotary_dim channels rotated by
// pos[b, t] · inv_freq. x, y: [B, T, H, D]; pos: [B, T]. rotary_dim is even and
// in [0, D]; base is finite and > 0.
[[nodiscard]] Status rotary_forward(std::span<const float> x, std::span<const int32_t> pos, std::span<float> y,
                                    int64_t B, int64_t T, int64_t H, int64_t D, int64_t rotary_dim, RotaryLayout layout,
                                    const RotaryFrequencies& freq = {});

// Differentiates y_a = x_a·cos − x_b·sin, y_b = x_b·cos + x_a·sin: the rotation
// is orthogonal, so dx is dy rotated by −angle:
//   dx_a = dy_a·cos + dy_b·sin,  dx_b = dy_b·cos − dy_a·sin,
// and channels [rotary_dim, D) pass dy through. dy, dx: [B, T, H, D]; dx may be
// dy itself. Same arguments and checks as rotary_forward.
[[nodiscard]] Status rotary_backward(std::span<const float> dy, std::span<const int32_t> pos, std::span<float> dx,
                                     int64_t B, int64_t T, int64_t H, int64_t D, int64_t rotary_dim,
                                     RotaryLayout layout, const RotaryFrequencies& freq = {});

namespace ref {
// Plain loops, no checks, no threads; y may be x. Instantiated for float and double.
template <class T>
void rotary_forward(const T* x, const int32_t* pos, T* y, int64_t B, int64_t Tn, int64_t H, int64_t D,
                    int64_t rotary_dim, RotaryLayout layout, const RotaryFrequencies& freq);
template <class T>
void rotary_backward(const T* dy, const int32_t* pos, T* dx, int64_t B, int64_t Tn, int64_t H, int64_t D,
                     int64_t rotary_dim, RotaryLayout layout, const RotaryFrequencies& freq);
}  // namespace ref

}  // namespace aspen::kernels
