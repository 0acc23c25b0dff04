// kernels/testing.h: the kernel test harness (tests only; see testing.cc).
//
// In the spirit of ggml's test-backend-ops: every kernel runs on its fast path
// and on its reference path over odd shapes, outputs sit between guard bytes,
// results are compared by normalized mean squared error with a threshold per
// dtype, and NaN/Inf in an output fails the test. Backward kernels are
// checked against central finite differences of the forward reference in f64.
//
// Run one kernel's tests with --gtest_filter, e.g.
//   build/release/kernels/kernels_test --gtest_filter='LayerNorm*'
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu.h"

namespace aspen::kernels::testing {

// Extents to sweep: odd, prime, one past a vector width.
inline const std::vector<int64_t> kOddSizes = {1, 3, 7, 17, 129};

// NMSE thresholds, fast vs reference, by the dtype the kernel computes in.
double nmse_threshold(DType t);
// Backward kernels vs finite differences of the f64 reference.
inline constexpr double kGradNmse = 1e-6;

// A buffer of n elements with 64 guard bytes of a known pattern on each side.
// guards_intact() tells whether anything wrote outside [0, n).
template <class T>
class Guarded {
 public:
  explicit Guarded(size_t n, T fill = T{}) : n_(n), bytes_(kGuard * 2 + (n * sizeof(T) + 63) / 64 * 64) {
    mem_.reset(static_cast<unsigned char*>(::operator new(bytes_, std::align_val_t(64))));
    std::memset(mem_.get(), kPattern, bytes_);
    for (size_t i = 0; i < n; ++i) data()[i] = fill;
  }
  T* data() { return reinterpret_cast<T*>(mem_.get() + kGuard); }
  const T* data() const { return reinterpret_cast<const T*>(mem_.get() + kGuard); }
  size_t size() const { return n_; }
  std::span<T> span() { return {data(), n_}; }
  std::span<const T> cspan() const { return {data(), n_}; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  std::vector<T> vec() const { return std::vector<T>(data(), data() + n_); }
  bool guards_intact() const {
    const unsigned char* p = mem_.get();
    for (size_t i = 0; i < kGuard; ++i)
      if (p[i] != kPattern) return false;
    for (size_t i = kGuard + n_ * sizeof(T); i < bytes_; ++i)
      if (p[i] != kPattern) return false;
    return true;
  }

 private:
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kPattern = 0xA5;
  struct Del {
    void operator()(unsigned char* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  size_t n_, bytes_;
  std::unique_ptr<unsigned char, Del> mem_;
};

// Every ISA from scalar up to min(this CPU's best, up_to): tests run each
// kernel variant under ScopedIsaCap for each.
std::vector<Isa> available_isas(Isa up_to = Isa::amx);

// Shapes big enough to run on the whole OpenMP team are swept at the best ISA
// only: the split into chunks does not depend on the ISA, and fork/joins are
// the slow part of these tests on a loaded machine.
inline bool skip_big(int64_t elements, Isa isa) {
  return elements >= (1 << 16) && isa != available_isas(Isa::avx512).back();
}

// Deterministic uniform fill in [lo, hi) (Philox stream `seed`), on one
// thread (test inputs are small; a parallel region per call costs more).
void fill_uniform(std::span<float> out, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<double> to_f64(std::span<const float> x);

// got vs want: NMSE = sum (got-want)^2 / sum want^2 (or the plain sum when want
// is all zero) must be <= max_nmse, and every got must be finite.
::testing::AssertionResult close_nmse(std::span<const float> got, std::span<const float> want, double max_nmse);
::testing::AssertionResult close_nmse(std::span<const float> got, std::span<const double> want, double max_nmse);
::testing::AssertionResult all_finite(std::span<const float> x);

// Central finite differences of a scalar function of x, in f64:
// grad[i] = (f(x + h e_i) - f(x - h e_i)) / 2h.
std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                 std::vector<double> x, double h = 1e-5);

}  // namespace aspen::kernels::testing

// Asserts a guarded buffer was not written outside its bounds.
#define EXPECT_GUARDS(buf) EXPECT_TRUE((buf).guards_intact()) << #buf " was written out of bounds"
