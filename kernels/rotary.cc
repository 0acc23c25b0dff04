#include "kernels/rotary.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

float rotary_inv_freq(int64_t p, int64_t rotary_dim, const RotaryFrequencies& freq) {
  using Scaling = RotaryFrequencies::Scaling;
  double base = double(freq.base);
  if (freq.scaling == Scaling::dynamic) {
    const double old = double(freq.original_max_positions), len = std::max(double(freq.seq_len), old);
    base *= std::pow(freq.factor * len / old - (freq.factor - 1.0), double(rotary_dim) / double(rotary_dim - 2));
  }
  const double inv = std::pow(base, -2.0 * double(p) / double(rotary_dim));  // base^-0 = 1, even for rotary_dim 2
  if (freq.scaling == Scaling::linear) return float(inv / freq.factor);
  if (freq.scaling != Scaling::llama3) return float(inv);
  const double wavelen = 2.0 * 3.14159265358979323846 / inv, old = double(freq.original_max_positions);
  if (wavelen > old / freq.low_freq_factor) return float(inv / freq.factor);
  if (wavelen < old / freq.high_freq_factor) return float(inv);
  const double smooth = (old / wavelen - freq.low_freq_factor) / (freq.high_freq_factor - freq.low_freq_factor);
  return float((1.0 - smooth) * inv / freq.factor + smooth * inv);
}

// ---------------------------------------------------------------------------
// Reference: the definition. sign = +1 rotates by +angle (forward), -1 by
// -angle (backward).
namespace ref {
namespace {
template <class T>
void rotate(const T* x, const int32_t* pos, T* y, int64_t B, int64_t Tn, int64_t H, int64_t D, int64_t rd,
            RotaryLayout layout, const RotaryFrequencies& freq, T sign) {
  const int64_t half = rd / 2;
  std::vector<T> inv(half);
  for (int64_t p = 0; p < half; ++p) inv[size_t(p)] = T(rotary_inv_freq(p, rd, freq));
  for (int64_t bt = 0; bt < B * Tn; ++bt) {
    for (int64_t h = 0; h < H; ++h) {
      const T* xr = x + (bt * H + h) * D;
      T* yr = y + (bt * H + h) * D;
      for (int64_t p = 0; p < half; ++p) {
        const int64_t a = layout == RotaryLayout::interleaved ? 2 * p : p;
        const int64_t b = layout == RotaryLayout::interleaved ? 2 * p + 1 : p + half;
        const T angle = T(pos[bt]) * inv[size_t(p)];
        const T c = std::cos(angle), s = sign * std::sin(angle);
        const T xa = xr[a], xb = xr[b];
        yr[a] = xa * c - xb * s;
        yr[b] = xb * c + xa * s;
      }
      if (yr != xr)
        for (int64_t j = rd; j < D; ++j) yr[j] = xr[j];
    }
  }
}
}  // namespace

template <class T>
void rotary_forward(const T* x, const int32_t* pos, T* y, int64_t B, int64_t Tn, int64_t H, int64_t D,
                    int64_t rotary_dim, RotaryLayout layout, const RotaryFrequencies& freq) {
  rotate<T>(x, pos, y, B, Tn, H, D, rotary_dim, layout, freq, T(1));
}
template <class T>
void rotary_backward(const T* dy, const int32_t* pos, T* dx, int64_t B, int64_t Tn, int64_t H, int64_t D,
                     int64_t rotary_dim, RotaryLayout layout, const RotaryFrequencies& freq) {
  rotate<T>(dy, pos, dx, B, Tn, H, D, rotary_dim, layout, freq, T(-1));
}

template void rotary_forward<float>(const float*, const int32_t*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    RotaryLayout, const RotaryFrequencies&);
template void rotary_forward<double>(const double*, const int32_t*, double*, int64_t, int64_t, int64_t, int64_t,
                                     int64_t, RotaryLayout, const RotaryFrequencies&);
template void rotary_backward<float>(const float*, const int32_t*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                     RotaryLayout, const RotaryFrequencies&);
template void rotary_backward<double>(const double*, const int32_t*, double*, int64_t, int64_t, int64_t, int64_t,
                                      int64_t, RotaryLayout, const RotaryFrequencies&);
}  // namespace ref

// ---------------------------------------------------------------------------
// Fast path. One (b, t) row's cos/sin table serves its H heads; it is built
// with the same f32 operations as ref::rotate<float>, so only the rotation
// arithmetic (vectorized, possibly FMA-contracted) differs.
//
// Tables (s carries the direction sign):
//   half_split:  c[p] = cos, s[p] = sin                          p < rd/2
//   interleaved: c[2p] = c[2p+1] = cos, s[2p] = -sin, s[2p+1] = +sin, so that
//                y[j] = x[j]·c[j] + x[j^1]·s[j] for j < rd.
namespace {

void build_tables(int32_t pos, const float* inv, int64_t rd, RotaryLayout layout, float sign, float* c, float* s) {
  for (int64_t p = 0; p < rd / 2; ++p) {
    const float angle = float(pos) * inv[p];
    const float cv = std::cos(angle), sv = sign * std::sin(angle);
    if (layout == RotaryLayout::interleaved) {
      c[2 * p] = c[2 * p + 1] = cv;
      s[2 * p] = -sv;
      s[2 * p + 1] = sv;
    } else {
      c[p] = cv;
      s[p] = sv;
    }
  }
}

// Rotates the first rd channels of one head row. y may be x.
using RowFn = void (*)(const float* x, float* y, const float* c, const float* s, int64_t rd);

[[gnu::always_inline]] inline void interleaved_body(const float* x, float* y, const float* c, const float* s,
                                                    int64_t rd) {
  for (int64_t j = 0; j < rd; j += 2) {
    const float xa = x[j], xb = x[j + 1];
    y[j] = xa * c[j] + xb * s[j];
    y[j + 1] = xb * c[j + 1] + xa * s[j + 1];
  }
}
[[gnu::always_inline]] inline void half_body(const float* x, float* y, const float* c, const float* s, int64_t rd) {
  const int64_t half = rd / 2;
  for (int64_t p = 0; p < half; ++p) {
    const float xa = x[p], xb = x[p + half];
    y[p] = xa * c[p] - xb * s[p];
    y[p + half] = xb * c[p] + xa * s[p];
  }
}

void interleaved_scalar(const float* x, float* y, const float* c, const float* s, int64_t rd) {
  interleaved_body(x, y, c, s, rd);
}
void half_scalar(const float* x, float* y, const float* c, const float* s, int64_t rd) { half_body(x, y, c, s, rd); }
ASPEN_TARGET_AVX2 void interleaved_avx2(const float* x, float* y, const float* c, const float* s, int64_t rd) {
  interleaved_body(x, y, c, s, rd);
}
ASPEN_TARGET_AVX2 void half_avx2(const float* x, float* y, const float* c, const float* s, int64_t rd) {
  half_body(x, y, c, s, rd);
}

ASPEN_TARGET_AVX512 void interleaved_avx512(const float* x, float* y, const float* c, const float* s, int64_t rd) {
  // Each 16-lane block holds whole pairs (rd is even), so in place is safe.
  for (int64_t j = 0; j < rd; j += 16) {
    const __mmask16 m = rd - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (rd - j)) - 1);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + j);
    const __m512 sw = _mm512_maskz_permute_ps(0xffff, xv, 0xB1);  // swap each pair: x[j^1]
    const __m512 r = _mm512_add_ps(_mm512_mul_ps(xv, _mm512_maskz_loadu_ps(m, c + j)),
                                   _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(m, s + j)));
    _mm512_mask_storeu_ps(y + j, m, r);
  }
}

ASPEN_TARGET_AVX512 void half_avx512(const float* x, float* y, const float* c, const float* s, int64_t rd) {
  // Both halves of a block of pairs are loaded before either is stored: in place is safe.
  const int64_t half = rd / 2;
  for (int64_t p = 0; p < half; p += 16) {
    const __mmask16 m = half - p >= 16 ? __mmask16(0xffff) : __mmask16((1u << (half - p)) - 1);
    const __m512 xa = _mm512_maskz_loadu_ps(m, x + p), xb = _mm512_maskz_loadu_ps(m, x + p + half);
    const __m512 cv = _mm512_maskz_loadu_ps(m, c + p), sv = _mm512_maskz_loadu_ps(m, s + p);
    _mm512_mask_storeu_ps(y + p, m, _mm512_sub_ps(_mm512_mul_ps(xa, cv), _mm512_mul_ps(xb, sv)));
    _mm512_mask_storeu_ps(y + p + half, m, _mm512_add_ps(_mm512_mul_ps(xb, cv), _mm512_mul_ps(xa, sv)));
  }
}

RowFn pick_row(RotaryLayout layout) {
  const bool il = layout == RotaryLayout::interleaved;
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return il ? interleaved_avx512 : half_avx512;
  if (isa == Isa::avx2) return il ? interleaved_avx2 : half_avx2;
  return il ? interleaved_scalar : half_scalar;
}

constexpr int64_t kParallelMin = 1 << 14;  // elements; below this one thread is faster

void rotary_fast(const float* x, const int32_t* pos, float* y, int64_t B, int64_t Tn, int64_t H, int64_t D, int64_t rd,
                 RotaryLayout layout, const RotaryFrequencies& freq, float sign) {
  const int64_t rows = B * Tn * H;
  if (rows == 0 || D == 0) return;
  std::vector<float> inv(size_t(rd / 2));
  for (int64_t p = 0; p < rd / 2; ++p) inv[size_t(p)] = rotary_inv_freq(p, rd, freq);
  const RowFn row = pick_row(layout);
  const int64_t tab = layout == RotaryLayout::interleaved ? rd : rd / 2;
  const bool copy_rest = x != y && D > rd;
  // Rows are (b, t, h); a thread's static chunk is contiguous, so it rebuilds
  // its table only when (b, t) changes. Each row depends only on its own
  // inputs: the result is the same for any thread count.
#pragma omp parallel if (rows * D >= kParallelMin)
  {
    std::vector<float> c(size_t(tab) + 1), s(size_t(tab) + 1);
    int64_t cur = -1;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t bt = r / H;
      if (bt != cur) {
        build_tables(pos[bt], inv.data(), rd, layout, sign, c.data(), s.data());
        cur = bt;
      }
      row(x + r * D, y + r * D, c.data(), s.data(), rd);
      if (copy_rest) std::memcpy(y + r * D + rd, x + r * D + rd, size_t(D - rd) * sizeof(float));
    }
  }
}

Status check_rotary(const char* kernel, const char* in_name, const char* out_name, std::span<const float> in,
                    std::span<const int32_t> pos, std::span<float> out, int64_t B, int64_t Tn, int64_t H, int64_t D,
                    int64_t rd, const RotaryFrequencies& freq) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "B", B));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "T", Tn));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "H", H));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "D", D));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "rotary_dim", rd));
  const std::string k(kernel);
  if (rd % 2 != 0) return Status::invalid_argument(k + ": argument 'rotary_dim'", "an even number", std::to_string(rd));
  if (rd > D)
    return Status::invalid_argument(k + ": argument 'rotary_dim'", "at most D = " + std::to_string(D),
                                    std::to_string(rd));
  if (!(freq.base > 0.0f) || !std::isfinite(freq.base))
    return Status::invalid_argument(k + ": argument 'base'", "a finite number > 0", std::to_string(freq.base));
  using Scaling = RotaryFrequencies::Scaling;
  if (freq.scaling != Scaling::none && freq.scaling != Scaling::linear && freq.scaling != Scaling::llama3 &&
      freq.scaling != Scaling::dynamic)
    return Status::invalid_argument(k + ": argument 'scaling'", "none, linear, llama3 or dynamic",
                                    std::to_string(int(freq.scaling)));
  if (freq.scaling == Scaling::dynamic && freq.original_max_positions <= 0)
    return Status::invalid_argument(k + ": dynamic scaling: original_max_positions", "> 0",
                                    std::to_string(freq.original_max_positions));
  if (freq.scaling != Scaling::none && !(freq.factor > 0 && std::isfinite(freq.factor)))
    return Status::invalid_argument(k + ": argument 'factor'", "a finite number > 0", std::to_string(freq.factor));
  if (freq.scaling == Scaling::llama3 &&
      !(freq.low_freq_factor > 0 && freq.high_freq_factor > freq.low_freq_factor &&
        std::isfinite(freq.high_freq_factor) && freq.original_max_positions > 0))
    return Status::invalid_argument(k + ": llama3 scaling",
                                    "0 < low_freq_factor < high_freq_factor (finite), original_max_positions > 0",
                                    std::to_string(freq.low_freq_factor) + ", " +
                                        std::to_string(freq.high_freq_factor) + ", " +
                                        std::to_string(freq.original_max_positions));
  int64_t bt = 0, bth = 0, n = 0;
  if (__builtin_mul_overflow(B, Tn, &bt) || __builtin_mul_overflow(bt, H, &bth) || __builtin_mul_overflow(bth, D, &n))
    return Status::invalid_argument(
        k + ": shape", "B·T·H·D to fit in int64",
        std::to_string(B) + "·" + std::to_string(Tn) + "·" + std::to_string(H) + "·" + std::to_string(D));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, in_name, in, n));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "pos", pos, bt));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, out_name, out, n));
  return Status();
}

}  // namespace

RotaryFrequencies rotary_run_frequencies(const RotaryFrequencies& freq, std::span<const int32_t> pos) {
  RotaryFrequencies f = freq;
  if (f.scaling == RotaryFrequencies::Scaling::dynamic) {
    int64_t top = -1;
    for (int32_t p : pos) top = std::max<int64_t>(top, p);
    f.seq_len = top + 1;
  }
  return f;
}

Status rotary_forward(std::span<const float> x, std::span<const int32_t> pos, std::span<float> y, int64_t B, int64_t T,
                      int64_t H, int64_t D, int64_t rotary_dim, RotaryLayout layout, const RotaryFrequencies& freq) {
  ASPEN_RETURN_IF_ERROR(check_rotary("rotary_forward", "x", "y", x, pos, y, B, T, H, D, rotary_dim, freq));
  const RotaryFrequencies f = rotary_run_frequencies(freq, pos.first(size_t(B * T)));
  if (reference_mode())
    ref::rotary_forward<float>(x.data(), pos.data(), y.data(), B, T, H, D, rotary_dim, layout, f);
  else
    rotary_fast(x.data(), pos.data(), y.data(), B, T, H, D, rotary_dim, layout, f, 1.0f);
  return Status();
}

Status rotary_backward(std::span<const float> dy, std::span<const int32_t> pos, std::span<float> dx, int64_t B,
                       int64_t T, int64_t H, int64_t D, int64_t rotary_dim, RotaryLayout layout, const RotaryFrequencies& freq) {
  ASPEN_RETURN_IF_ERROR(check_rotary("rotary_backward", "dy", "dx", dy, pos, dx, B, T, H, D, rotary_dim, freq));
  const RotaryFrequencies f = rotary_run_frequencies(freq, pos.first(size_t(B * T)));
  if (reference_mode())
    ref::rotary_backward<float>(dy.data(), pos.data(), dx.data(), B, T, H, D, rotary_dim, layout, f);
  else
    rotary_fast(dy.data(), pos.data(), dx.data(), B, T, H, D, rotary_dim, layout, f, -1.0f);
  return Status();
}

}  // namespace aspen::kernels
