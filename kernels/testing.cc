#include "kernels/testing.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/philox.h"
#include "core/thread_team.h"

namespace aspen::kernels::testing {

double nmse_threshold(DType t) {
  switch (t) {
    case DType::f32: return 1e-9;
    case DType::f16: return 1e-6;
    case DType::bf16: return 1e-4;
    default: return 0.0;
  }
}

void fill_uniform(std::span<float> out, uint64_t seed, float lo, float hi) {
  // One thread: test inputs are small, and opening a parallel region per call
  // costs more than it saves on a loaded 2-core machine.
  ScopedOmpThreads one(1);
  philox_fill_uniform(out, seed, /*stream=*/0x7e57, 0, lo, hi);
}

std::vector<Isa> available_isas(Isa up_to) {
  std::vector<Isa> v;
  const int last = std::min(int(cpu_features().best), int(up_to));
  for (int i = 0; i <= last; ++i) v.push_back(Isa(i));
  return v;
}

std::vector<float> random_vector(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  fill_uniform(v, seed, lo, hi);
  return v;
}

std::vector<double> to_f64(std::span<const float> x) { return std::vector<double>(x.begin(), x.end()); }

::testing::AssertionResult all_finite(std::span<const float> x) {
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i])) return ::testing::AssertionFailure() << "element " << i << " is " << x[i];
  return ::testing::AssertionSuccess();
}

template <class W>
static ::testing::AssertionResult close_impl(std::span<const float> got, std::span<const W> want, double max_nmse) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs expected " << want.size();
  auto finite = all_finite(got);
  if (!finite) return finite;
  double err = 0, ref = 0, worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = double(got[i]) - double(want[i]);
    err += d * d;
    ref += double(want[i]) * double(want[i]);
    if (std::abs(d) > worst) {
      worst = std::abs(d);
      worst_i = i;
    }
  }
  double nmse = ref > 0 ? err / ref : err;
  if (!(nmse <= max_nmse)) {
    return ::testing::AssertionFailure() << "NMSE " << nmse << " > " << max_nmse << " over " << got.size()
                                         << " elements; worst at " << worst_i << ": got " << got[worst_i]
                                         << ", want " << double(want[worst_i]);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult close_nmse(std::span<const float> got, std::span<const float> want, double max_nmse) {
  return close_impl(got, want, max_nmse);
}
::testing::AssertionResult close_nmse(std::span<const float> got, std::span<const double> want, double max_nmse) {
  return close_impl(got, want, max_nmse);
}

std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
                                 double h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double up = f(x);
    x[i] = saved - h;
    double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

}  // namespace aspen::kernels::testing
