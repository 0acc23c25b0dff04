// kernels/vec_math.h: float exp, tanh, erf and sigmoid that vectorize.
//
// Plain C++ (bit casts and selects, no intrinsics, no libm calls), forced
// inline, so a loop under `#pragma omp simd` that calls them compiles to
// straight-line vector code at whatever ISA the enclosing function targets.
// Accuracy, measured over dense sweeps against long double libm: max relative
// error 1.0e-7 (exp), 1.5e-7 (tanh), 1.8e-7 (erf), i.e. 1-3 ulp, wherever the
// result is a normal float.
//
// Edge behaviour: NaN in, NaN out. exp flushes to +0 below x = -87.3 (results
// that would be near or below FLT_MIN; never produces denormals, which are slow
// on vector units) and gives +inf above ln FLT_MAX (88.7228). tanh(±inf) = ±1, erf(±inf) = ±1.
//
// The polynomial coefficients were fitted for this file (Chebyshev-node
// interpolation in long double, rounded to float).
#pragma once

#include <bit>
#include <cstdint>

#define ASPEN_VM_INLINE inline __attribute__((always_inline))

namespace aspen::kernels::vm {

// c ? a : b, written without a branch: a ternary on floats lets GCC thread the
// branch and duplicate arithmetic into it, which (with trapping math) blocks
// if-conversion and so vectorization on targets without mask registers.
ASPEN_VM_INLINE float select(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// e^x. x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2; e^r by its degree-7
// Taylor polynomial (truncation < 6e-9 relative); 2^n applied as two factors
// 2^(n/2) 2^(n - n/2) so that n = 128 (x near ln FLT_MAX) does not overflow.
ASPEN_VM_INLINE float exp(float x) {
  constexpr float kLo = -87.3f, kHi = 88.7228317f;  // kHi: the float just below ln FLT_MAX
  float xc = select(x < kLo, kLo, x);               // comparisons written so that NaN passes through
  xc = select(xc > kHi, kHi, xc);
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
  const float shifted = xc * 1.44269504088896341f + 12582912.0f;
  const int32_t n = std::bit_cast<int32_t>(shifted) - 0x4B400000;
  const float nf = shifted - 12582912.0f;
  float r = xc - nf * 0.693145751953125f;  // ln2 high part: exact for |n| <= 2^8
  r = r - nf * 1.42860682030941723e-6f;    // ln2 low part
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n1 = n >> 1, n2 = n - n1;
  const float s1 = std::bit_cast<float>(uint32_t(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(uint32_t(n2 + 127) << 23);
  float y = p * s1 * s2;
  y = select(x < kLo, 0.0f, y);
  y = select(x > kHi, __builtin_inff(), y);
  return y;
}

// 1 / (1 + e^-x); saturates cleanly to 0 and 1.
ASPEN_VM_INLINE float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

namespace detail {
ASPEN_VM_INLINE float abs_bits(float x) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu); }
// |mag| with the sign of `sign`.
ASPEN_VM_INLINE float with_sign_of(float mag, float sign) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(mag) & 0x7FFFFFFFu) |
                              (std::bit_cast<uint32_t>(sign) & 0x80000000u));
}
}  // namespace detail

// tanh x. |x| < 0.625: x + x^3 P(x^2) (degree-5 P, fit error 5e-10); otherwise
// sign(x) (1 - 2 / (e^{2|x|} + 1)), clamped at |x| = 9.1 where tanh rounds to 1.
ASPEN_VM_INLINE float tanh(float x) {
  const float ax = detail::abs_bits(x);
  const float t = x * x;
  float p = 2.292744815e-03f;
  p = p * t - 8.343945257e-03f;
  p = p * t + 2.176891826e-02f;
  p = p * t - 5.395925790e-02f;
  p = p * t + 1.333330423e-01f;
  p = p * t - 3.333333433e-01f;
  const float small = x + x * t * p;
  const float a = select(ax > 9.1f, 9.1f, ax);
  const float big = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  return detail::with_sign_of(select(ax < 0.625f, small, big), x);
}

// erf x. |x| < 1: x P(x^2) (degree 7, fit error 4e-11). Otherwise
// sign(x) (1 - e^{-x^2} Q(|x|)) with Q ~ erfc(x) e^{x^2} a degree-10 polynomial in
// |x| - 2.5 fitted on [1, 4] (error 2e-8 relative to erf); |x| is clamped at 4,
// where erf rounds to 1.
ASPEN_VM_INLINE float erf(float x) {
  const float ax = detail::abs_bits(x);
  const float t = x * x;
  float p = -9.667044651e-06f;
  p = p * t + 1.126595889e-04f;
  p = p * t - 8.484080317e-04f;
  p = p * t + 5.221031606e-03f;
  p = p * t - 2.686543018e-02f;
  p = p * t + 1.128378212e-01f;
  p = p * t - 3.761263788e-01f;
  p = p * t + 1.128379226e+00f;
  const float small = x * p;
  const float a = select(ax > 4.0f, 4.0f, ax);
  const float u = a - 2.5f;
  float q = 1.611890752e-06f;
  q = q * u - 6.377862064e-06f;
  q = q * u + 1.468955725e-05f;
  q = q * u - 5.362729280e-05f;
  q = q * u + 2.123135637e-04f;
  q = q * u - 7.389278617e-04f;
  q = q * u + 2.466508653e-03f;
  q = q * u - 7.999388501e-03f;
  q = q * u + 2.493805625e-02f;
  q = q * u - 7.434759289e-02f;
  q = q * u + 2.108063698e-01f;
  const float big = 1.0f - exp(-(a * a)) * q;
  return select(ax < 1.0f, small, detail::with_sign_of(big, x));
}

}  // namespace aspen::kernels::vm
