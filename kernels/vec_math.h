// kernels/vec_math.h: float exp, tanh, erf and sigmoid that vectorize, and
// row reductions (sum, max) that keep several vector accumulators.
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
// For a lambda passed to a reduction below: `[..](int64_t c) ASPEN_VM_LAMBDA { .. }`.
#define ASPEN_VM_LAMBDA __attribute__((always_inline))

namespace aspen::kernels::vm {

// c ? a : b, written without a branch: a ternary on floats lets GCC thread the
// branch and duplicate arithmetic into it, which (with trapping math) blocks
// if-conversion and so vectorization on targets without mask registers.
ASPEN_VM_INLINE float select(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// e^x. x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2; e^r by its degree-7
// Taylor polynomial (truncation < 6e-9 relative); 2^n is applied by adding n to
// the exponent field of e^r. That is exact on [kLo, kHi]: n <= 127 unless
// x > 127.5 ln2, where r < 0 and e^r < 1 leave room for n = 128; n = -126 needs
// x >= kLo > -126 ln2, where r > 0 and e^r > 1 keep the result normal. Outside
// that range (and for NaN) the arithmetic gives garbage that the selects at the
// end replace; the exponent add is integer arithmetic, so garbage costs nothing.
// detail::exp_in_range is the arithmetic alone, for callers that clamp x.
namespace detail {
// e^x for x in [kExpLo, kExpHi] (see exp); anything else, NaN included, gives garbage.
constexpr float kExpLo = -87.3f, kExpHi = 88.7228317f;  // kExpHi: the float just below ln FLT_MAX
ASPEN_VM_INLINE float exp_in_range(float x) {
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits;
  // shifting those bits left by 23 drops the rest and leaves n << 23.
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const uint32_t n_exp = std::bit_cast<uint32_t>(shifted) << 23;
  const float nf = shifted - 12582912.0f;
  float r = x - nf * 0.693145751953125f;  // ln2 high part: exact for |n| <= 2^8
  r = r - nf * 1.42860682030941723e-6f;   // ln2 low part
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p) + n_exp);
}
}  // namespace detail

ASPEN_VM_INLINE float exp(float x) {
  float y = detail::exp_in_range(x);
  y = select(x < detail::kExpLo, 0.0f, y);
  y = select(x > detail::kExpHi, __builtin_inff(), y);
  return select(x != x, x, y);  // NaN: the exponent add may have turned it into a number
}

namespace detail {
// 1 / d for d in [1, 2^126] (d >= 1 keeps the seed's exponent in range; 2^126
// keeps the result normal): a bit-trick seed (relative error < 1/8) and three
// Newton-Raphson steps, each squaring the error. NaN in, NaN out. A divide is
// one slow, unpipelined instruction; these are seven cheap ones.
ASPEN_VM_INLINE float recip(float d) {
  float y = std::bit_cast<float>(0x7EF311C3u - std::bit_cast<uint32_t>(d));
  for (int i = 0; i < 3; ++i) y = y + y * (1.0f - d * y);
  return y;
}
ASPEN_VM_INLINE float abs_bits(float x) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu); }
// |mag| with the sign of `sign`.
ASPEN_VM_INLINE float with_sign_of(float mag, float sign) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(mag) & 0x7FFFFFFFu) |
                              (std::bit_cast<uint32_t>(sign) & 0x80000000u));
}
}  // namespace detail

namespace detail {
// 1 / (1 + e^z), except that NaN z gives an unspecified value: for callers that
// multiply the result by something that carries the NaN on. 0 for z > 87,
// where 1 + e^z leaves recip's range (the true value is below 1.7e-38).
ASPEN_VM_INLINE float sigmoid_neg_nonan(float z) {
  float zc = select(z < kExpLo, kExpLo, z);
  zc = select(zc > 87.0f, 87.0f, zc);
  return select(z > 87.0f, 0.0f, recip(1.0f + exp_in_range(zc)));
}
}  // namespace detail

// 1 / (1 + e^-x); saturates cleanly to 0 and 1 (0 below x = -87).
ASPEN_VM_INLINE float sigmoid(float x) { return select(x != x, x, detail::sigmoid_neg_nonan(-x)); }

// tanh x. |x| < 0.625: x + x^3 P(x^2) (degree-5 P, fit error 5e-10); otherwise
// sign(x) (1 - 2 / (e^{2|x|} + 1)) (the reciprocal by detail::recip), clamped
// at |x| = 9.1 where tanh rounds to 1.
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
  const float big = 1.0f - 2.0f * detail::recip(exp(2.0f * a) + 1.0f);
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

// ---- row reductions ----------------------------------------------------------
// `#pragma omp simd reduction` keeps one vector accumulator, so a long row is
// bound by the latency of its add chain. These keep kLanes partial results (4
// AVX-512 registers, 8 AVX2) and combine them in a fixed order: the result
// depends only on n, the values and the ISA, never on threads. Element c goes to
// partial c % kLanes.
constexpr int kLanes = 64;

// The sum of acc[0, kLanes): GCC reduces the whole-register lanes first, then
// within one register (a fixed shuffle tree for the ISA the caller targets).
ASPEN_VM_INLINE float sum_lanes(const float* acc) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// sum over c in [0, n) of f(c).
template <class F>
ASPEN_VM_INLINE float sum_of(int64_t n, F f) {
  float acc[kLanes];
#pragma omp simd
  for (int j = 0; j < kLanes; ++j) acc[j] = 0.0f;
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) acc[j] += f(c + j);
  }
  const int rest = int(n - c);
#pragma omp simd
  for (int j = 0; j < rest; ++j) acc[j] += f(c + j);
  return sum_lanes(acc);
}

// Two sums in one sweep: f(c) returns a Sum2 {a, b}; *sa, *sb get the sums of each.
struct Sum2 {
  float a, b;
};
template <class F>
ASPEN_VM_INLINE void sum2_of(int64_t n, F f, float* sa, float* sb) {
  float acc_a[kLanes], acc_b[kLanes];
#pragma omp simd
  for (int j = 0; j < kLanes; ++j) {
    acc_a[j] = 0.0f;
    acc_b[j] = 0.0f;
  }
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const Sum2 v = f(c + j);
      acc_a[j] += v.a;
      acc_b[j] += v.b;
    }
  }
  const int rest = int(n - c);
#pragma omp simd
  for (int j = 0; j < rest; ++j) {
    const Sum2 v = f(c + j);
    acc_a[j] += v.a;
    acc_b[j] += v.b;
  }
  *sa = sum_lanes(acc_a);
  *sb = sum_lanes(acc_b);
}

// max over c in [0, n) of f(c), and -inf for n = 0; NaN values are skipped
// (a comparison with NaN is false).
template <class F>
ASPEN_VM_INLINE float max_of(int64_t n, F f) {
  constexpr float kNegInf = -__builtin_inff();
  float acc[kLanes];
#pragma omp simd
  for (int j = 0; j < kLanes; ++j) acc[j] = kNegInf;
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const float v = f(c + j);
      acc[j] = v > acc[j] ? v : acc[j];
    }
  }
  const int rest = int(n - c);
#pragma omp simd
  for (int j = 0; j < rest; ++j) {
    const float v = f(c + j);
    acc[j] = v > acc[j] ? v : acc[j];
  }
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int j = 0; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

}  // namespace aspen::kernels::vm
