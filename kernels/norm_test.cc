#include "kernels/norm.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::close_nmse;
using testing::Guarded;
using testing::kGradNmse;
using testing::kOddSizes;
using testing::nmse_threshold;
using testing::numeric_grad;
using testing::random_vector;
using testing::skip_big;
using testing::to_f64;

constexpr float kEps = 1e-5f;

std::vector<std::pair<int64_t, int64_t>> shapes() {
  std::vector<std::pair<int64_t, int64_t>> s;
  for (int64_t r : kOddSizes)
    for (int64_t c : kOddSizes) s.push_back({r, c});
  s.push_back({4, 768});
  s.push_back({520, 129});  // several row chunks and dgamma blocks, on the whole team
  return s;
}

std::string shape_name(int64_t R, int64_t C, Isa isa) {
  return "R=" + std::to_string(R) + " C=" + std::to_string(C) + " isa=" + isa_name(isa);
}

// Rows with a nonzero mean, so that the variance is not just the mean square.
std::vector<float> row_data(int64_t n, uint64_t seed) { return random_vector(n, seed, 2.0f, 4.0f); }

double weighted_sum(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
  return s;
}

// With C = 1 the terms of dx cancel (LayerNorm: exactly; RMSNorm: down to eps / (x^2 + eps)),
// so the float result is only determined to the rounding of those terms, rstd |gamma dy| FLT_EPSILON:
// NMSE against the f64 value means nothing there, and an absolute bound of a few roundings is checked.
void expect_dx_close(std::span<const float> got, const std::vector<double>& want, const std::vector<float>& gamma,
                     const std::vector<float>& dy, const std::vector<double>& rstd, int64_t R, int64_t C) {
  if (C > 1) {
    EXPECT_TRUE(close_nmse(got, want, nmse_threshold(DType::f32)));
    return;
  }
  for (int64_t r = 0; r < R; ++r)
    EXPECT_LE(std::abs(got[r] - want[r]), 4 * FLT_EPSILON * rstd[r] * std::abs(gamma[0] * dy[r])) << "row " << r;
}

TEST(LayerNorm, MatchesReference) {
  const double tol = nmse_threshold(DType::f32);
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (auto [R, C] : shapes()) {
      if (skip_big(R * C, isa)) continue;
      SCOPED_TRACE(shape_name(R, C, isa));
      const std::vector<float> x = row_data(R * C, 1 + C), gamma = random_vector(C, 2 + C),
                               beta = random_vector(C, 3 + C), dy = random_vector(R * C, 4 + R);
      Guarded<float> y(R * C), mean(R), rstd(R), dx(R * C), dgamma(C), dbeta(C);
      ASSERT_TRUE(layernorm_forward(x, gamma, beta, y.span(), mean.span(), rstd.span(), R, C, kEps).is_ok());
      ASSERT_TRUE(
          layernorm_backward(x, gamma, mean.cspan(), rstd.cspan(), dy, dx.span(), dgamma.span(), dbeta.span(), R, C)
              .is_ok());
      const std::vector<double> xd = to_f64(x), gd = to_f64(gamma), bd = to_f64(beta), dyd = to_f64(dy);
      std::vector<double> wy(R * C), wm(R), wr(R), wdx(R * C), wdg(C), wdb(C);
      ref::layernorm_forward(xd.data(), gd.data(), bd.data(), wy.data(), wm.data(), wr.data(), R, C, double(kEps));
      ref::layernorm_backward(xd.data(), gd.data(), wm.data(), wr.data(), dyd.data(), wdx.data(), wdg.data(),
                              wdb.data(), R, C);
      EXPECT_TRUE(close_nmse(y.cspan(), wy, tol));
      EXPECT_TRUE(close_nmse(mean.cspan(), wm, tol));
      EXPECT_TRUE(close_nmse(rstd.cspan(), wr, tol));
      expect_dx_close(dx.cspan(), wdx, gamma, dy, wr, R, C);
      EXPECT_TRUE(close_nmse(dgamma.cspan(), wdg, tol));
      EXPECT_TRUE(close_nmse(dbeta.cspan(), wdb, tol));
      EXPECT_GUARDS(y);
      EXPECT_GUARDS(mean);
      EXPECT_GUARDS(rstd);
      EXPECT_GUARDS(dx);
      EXPECT_GUARDS(dgamma);
      EXPECT_GUARDS(dbeta);
    }
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, C = 7;
  const std::vector<float> x = random_vector(R * C, 11), gamma = random_vector(C, 12, 0.5f, 1.5f),
                           beta = random_vector(C, 13), dy = random_vector(R * C, 14);
  std::vector<float> y(R * C), mean(R), rstd(R), dx(R * C), dgamma(C), dbeta(C);
  ASSERT_TRUE(layernorm_forward(x, gamma, beta, y, mean, rstd, R, C, kEps).is_ok());
  ASSERT_TRUE(layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, R, C).is_ok());
  const std::vector<double> xd = to_f64(x), gd = to_f64(gamma), bd = to_f64(beta), w = to_f64(dy);
  auto loss = [&](const std::vector<double>& xs, const std::vector<double>& gs, const std::vector<double>& bs) {
    std::vector<double> out(R * C), m(R), r(R);
    ref::layernorm_forward(xs.data(), gs.data(), bs.data(), out.data(), m.data(), r.data(), R, C, double(kEps));
    return weighted_sum(w, out);
  };
  EXPECT_TRUE(close_nmse(dx, numeric_grad([&](const auto& v) { return loss(v, gd, bd); }, xd), kGradNmse));
  EXPECT_TRUE(close_nmse(dgamma, numeric_grad([&](const auto& v) { return loss(xd, v, bd); }, gd), kGradNmse));
  EXPECT_TRUE(close_nmse(dbeta, numeric_grad([&](const auto& v) { return loss(xd, gd, v); }, bd), kGradNmse));
}

TEST(LayerNorm, FusedResidualAddMatchesReference) {
  const double tol = nmse_threshold(DType::f32);
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (auto [R, C] : shapes()) {
      if (skip_big(R * C, isa)) continue;
      SCOPED_TRACE(shape_name(R, C, isa));
      const std::vector<float> x = row_data(R * C, 21 + C), res = random_vector(R * C, 22 + R),
                               gamma = random_vector(C, 23), beta = random_vector(C, 24);
      Guarded<float> h(R * C), y(R * C), mean(R), rstd(R);
      ASSERT_TRUE(
          add_layernorm_forward(x, res, gamma, beta, h.span(), y.span(), mean.span(), rstd.span(), R, C, kEps).is_ok());
      std::vector<float> wh(R * C), wy(R * C), wm(R), wr(R);
      ref::add_layernorm_forward(x.data(), res.data(), gamma.data(), beta.data(), wh.data(), wy.data(), wm.data(),
                                 wr.data(), R, C, kEps);
      EXPECT_EQ(h.vec(), wh);  // the add is exact
      EXPECT_TRUE(close_nmse(y.cspan(), wy, tol));
      EXPECT_TRUE(close_nmse(mean.cspan(), wm, tol));
      EXPECT_TRUE(close_nmse(rstd.cspan(), wr, tol));
      EXPECT_GUARDS(h);
      EXPECT_GUARDS(y);
      EXPECT_GUARDS(mean);
      EXPECT_GUARDS(rstd);
    }
  }
  // In place into the residual stream: h is residual.
  const int64_t R = 5, C = 33;
  const std::vector<float> x = row_data(R * C, 25), gamma = random_vector(C, 26), beta = random_vector(C, 27);
  std::vector<float> res = random_vector(R * C, 28), want_h(R * C), want_y(R * C), y(R * C), m(R), r(R);
  ref::add_layernorm_forward(x.data(), res.data(), gamma.data(), beta.data(), want_h.data(), want_y.data(), m.data(),
                             r.data(), R, C, kEps);
  ASSERT_TRUE(add_layernorm_forward(x, res, gamma, beta, res, y, m, r, R, C, kEps).is_ok());
  EXPECT_EQ(res, want_h);
  EXPECT_TRUE(close_nmse(y, want_y, tol));
}

TEST(RmsNorm, MatchesReference) {
  const double tol = nmse_threshold(DType::f32);
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (auto [R, C] : shapes()) {
      if (skip_big(R * C, isa)) continue;
      SCOPED_TRACE(shape_name(R, C, isa));
      const std::vector<float> x = random_vector(R * C, 31 + C, -3.0f, 3.0f), gamma = random_vector(C, 32 + C),
                               dy = random_vector(R * C, 33 + R);
      Guarded<float> y(R * C), rstd(R), dx(R * C), dgamma(C);
      ASSERT_TRUE(rmsnorm_forward(x, gamma, y.span(), rstd.span(), R, C, kEps).is_ok());
      ASSERT_TRUE(rmsnorm_backward(x, gamma, rstd.cspan(), dy, dx.span(), dgamma.span(), R, C).is_ok());
      const std::vector<double> xd = to_f64(x), gd = to_f64(gamma), dyd = to_f64(dy);
      std::vector<double> wy(R * C), wr(R), wdx(R * C), wdg(C);
      ref::rmsnorm_forward(xd.data(), gd.data(), wy.data(), wr.data(), R, C, double(kEps));
      ref::rmsnorm_backward(xd.data(), gd.data(), wr.data(), dyd.data(), wdx.data(), wdg.data(), R, C);
      EXPECT_TRUE(close_nmse(y.cspan(), wy, tol));
      EXPECT_TRUE(close_nmse(rstd.cspan(), wr, tol));
      expect_dx_close(dx.cspan(), wdx, gamma, dy, wr, R, C);
      EXPECT_TRUE(close_nmse(dgamma.cspan(), wdg, tol));
      EXPECT_GUARDS(y);
      EXPECT_GUARDS(rstd);
      EXPECT_GUARDS(dx);
      EXPECT_GUARDS(dgamma);
    }
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, C = 7;
  const std::vector<float> x = random_vector(R * C, 41), gamma = random_vector(C, 42, 0.5f, 1.5f),
                           dy = random_vector(R * C, 43);
  std::vector<float> y(R * C), rstd(R), dx(R * C), dgamma(C);
  ASSERT_TRUE(rmsnorm_forward(x, gamma, y, rstd, R, C, kEps).is_ok());
  ASSERT_TRUE(rmsnorm_backward(x, gamma, rstd, dy, dx, dgamma, R, C).is_ok());
  const std::vector<double> xd = to_f64(x), gd = to_f64(gamma), w = to_f64(dy);
  auto loss = [&](const std::vector<double>& xs, const std::vector<double>& gs) {
    std::vector<double> out(R * C), r(R);
    ref::rmsnorm_forward(xs.data(), gs.data(), out.data(), r.data(), R, C, double(kEps));
    return weighted_sum(w, out);
  };
  EXPECT_TRUE(close_nmse(dx, numeric_grad([&](const auto& v) { return loss(v, gd); }, xd), kGradNmse));
  EXPECT_TRUE(close_nmse(dgamma, numeric_grad([&](const auto& v) { return loss(xd, v); }, gd), kGradNmse));
}

TEST(Norm, ReductionsIndependentOfThreadCount) {
  const int64_t R = 521, C = 129;
  const std::vector<float> x = row_data(R * C, 51), gamma = random_vector(C, 52), beta = random_vector(C, 53),
                           dy = random_vector(R * C, 54);
  std::vector<float> y(R * C), mean(R), rstd(R), rms_rstd(R);
  ASSERT_TRUE(layernorm_forward(x, gamma, beta, y, mean, rstd, R, C, kEps).is_ok());
  ASSERT_TRUE(rmsnorm_forward(x, gamma, y, rms_rstd, R, C, kEps).is_ok());
  struct Out {
    std::vector<float> dx, dgamma, dbeta, rms_dx, rms_dgamma;
  };
  auto run = [&](int threads) {
    ScopedOmpThreads team(threads);
    Out o{std::vector<float>(R * C), std::vector<float>(C), std::vector<float>(C), std::vector<float>(R * C),
          std::vector<float>(C)};
    EXPECT_TRUE(layernorm_backward(x, gamma, mean, rstd, dy, o.dx, o.dgamma, o.dbeta, R, C).is_ok());
    EXPECT_TRUE(rmsnorm_backward(x, gamma, rms_rstd, dy, o.rms_dx, o.rms_dgamma, R, C).is_ok());
    return o;
  };
  const Out one = run(1), two = run(2);
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(one.dgamma, two.dgamma));
  EXPECT_TRUE(same_bits(one.dbeta, two.dbeta));
  EXPECT_TRUE(same_bits(one.rms_dgamma, two.rms_dgamma));
  EXPECT_TRUE(same_bits(one.dx, two.dx));
  EXPECT_TRUE(same_bits(one.rms_dx, two.rms_dx));
}

TEST(Norm, BadArgumentsAreStatus) {
  std::vector<float> x(4 * 768), gamma(512), beta(768), y(4 * 768), mean(4), rstd(4);
  Status s = layernorm_forward(x, gamma, beta, y, mean, rstd, 4, 768, kEps);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "layernorm_forward: argument 'gamma': expected at least 768 elements, found 512");
  EXPECT_EQ(rmsnorm_forward(x, beta, y, rstd, 4, 0, kEps).message(), "rmsnorm_forward: C: expected >= 1, found 0");
  EXPECT_EQ(rmsnorm_forward(x, beta, y, rstd, 4, 768, -1.0f).message(),
            "rmsnorm_forward: eps: expected a finite value >= 0, found -1.000000");
  EXPECT_EQ(layernorm_backward(x, beta, mean, {}, x, y, beta, beta, 4, 768).message(),
            "layernorm_backward: argument 'rstd': expected a buffer of 4 elements, found a null pointer");
  EXPECT_TRUE(layernorm_forward({}, beta, beta, {}, {}, {}, 0, 768, kEps).is_ok());
}

}  // namespace
}  // namespace aspen::kernels
