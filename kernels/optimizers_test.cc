#include "kernels/optimizers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

std::vector<int64_t> sizes() {
  std::vector<int64_t> s = testing::kOddSizes;
  s.push_back(3 * 4096 + 5);  // several chunks
  s.push_back(40000);         // parallel
  return s;
}

std::vector<SgdConfig> sgd_configs() {
  SgdConfig plain;
  plain.lr = 0.1;
  SgdConfig mom;
  mom.lr = 0.05, mom.momentum = 0.9, mom.weight_decay = 1e-2, mom.grad_scale = 0.5f;
  SgdConfig nest;
  nest.lr = 0.01, nest.momentum = 0.8, nest.nesterov = true, nest.grad_scale = 1.0f / 1024;
  return {plain, mom, nest};
}

TEST(Sgd, FastMatchesReference) {
  int ci = 0;
  for (const SgdConfig& cfg : sgd_configs()) {
    ++ci;
    for (int64_t n : sizes()) {
      SCOPED_TRACE("config " + std::to_string(ci) + " N=" + std::to_string(n));
      std::vector<float> p = testing::random_vector(size_t(n), uint64_t(n + ci), -2.0f, 2.0f);
      const std::vector<float> g = testing::random_vector(size_t(n), uint64_t(n + ci + 1));
      std::vector<float> buf = testing::random_vector(size_t(n), uint64_t(n + ci + 2), -0.1f, 0.1f);
      if (cfg.momentum == 0.0) buf.clear();
      std::vector<float> want_p = p, want_buf = buf;
      ref::sgd_step<float>(want_p.data(), g.data(), want_buf.data(), n, cfg);
      ASSERT_TRUE(sgd_step(p, g, buf, n, cfg).is_ok());
      EXPECT_TRUE(testing::close_nmse(p, want_p, 1e-12));
      EXPECT_TRUE(testing::close_nmse(buf, want_buf, 1e-12));
    }
  }
}

// torch.optim.SGD by hand: two steps with momentum, Nesterov and weight decay,
// from a zero buffer (PyTorch's first step sets buf = d_p).
TEST(Sgd, HandComputedTwoSteps) {
  const double lr = 0.1, mu = 0.9, wd = 0.01;
  std::vector<double> p = {1.0, -2.0, 0.5}, g1 = {0.3, -0.1, 0.0}, g2 = {-0.2, 0.4, 1.0};
  std::vector<double> buf(3, 0.0);
  std::vector<float> fp(p.begin(), p.end()), fbuf(3, 0.0f);
  SgdConfig cfg;
  cfg.lr = lr, cfg.momentum = mu, cfg.weight_decay = wd, cfg.nesterov = true;
  for (const auto* g : {&g1, &g2}) {
    for (size_t i = 0; i < 3; ++i) {
      const double d = (*g)[i] + wd * p[i];
      buf[i] = buf[i] == 0.0 && g == &g1 ? d : mu * buf[i] + d;
      p[i] -= lr * (d + mu * buf[i]);
    }
    std::vector<float> fg(g->begin(), g->end());
    ASSERT_TRUE(sgd_step(fp, fg, fbuf, 3, cfg).is_ok());
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(fp[i], p[i], 1e-6) << i;
    EXPECT_NEAR(fbuf[i], buf[i], 1e-6) << i;
  }
}

TEST(Sgd, BadArguments) {
  std::vector<float> p(4), g(4), b(4);
  SgdConfig c;
  c.nesterov = true;
  EXPECT_NE(sgd_step(p, g, b, 4, c).to_string().find("nesterov: expected momentum > 0"), std::string::npos)
      << sgd_step(p, g, b, 4, c).to_string();
  c = SgdConfig{};
  c.momentum = 1.0;
  EXPECT_NE(sgd_step(p, g, b, 4, c).to_string().find("momentum"), std::string::npos);
  c = SgdConfig{};
  c.momentum = 0.5;
  EXPECT_FALSE(sgd_step(p, g, std::span<float>(), 4, c).is_ok());  // a buffer is needed
}

TEST(Lamb, FastMatchesReference) {
  LambConfig a;
  LambConfig b;
  b.lr = 3e-3, b.beta1 = 0.8, b.beta2 = 0.95, b.eps = 1e-8, b.weight_decay = 0.0, b.step = 9, b.grad_scale = 0.25f;
  int ci = 0;
  for (const LambConfig& cfg : {a, b}) {
    ++ci;
    for (int64_t n : sizes()) {
      SCOPED_TRACE("config " + std::to_string(ci) + " N=" + std::to_string(n));
      std::vector<float> p = testing::random_vector(size_t(n), uint64_t(n + ci), -2.0f, 2.0f);
      const std::vector<float> g = testing::random_vector(size_t(n), uint64_t(n + ci + 1));
      std::vector<float> m = testing::random_vector(size_t(n), uint64_t(n + ci + 2), -0.1f, 0.1f);
      std::vector<float> v = testing::random_vector(size_t(n), uint64_t(n + ci + 3), 0.0f, 0.01f);
      std::vector<double> dp(p.begin(), p.end()), dg(g.begin(), g.end()), dm(m.begin(), m.end()),
          dv(v.begin(), v.end());
      ref::lamb_step<double>(dp.data(), dg.data(), dm.data(), dv.data(), n, cfg);
      ASSERT_TRUE(lamb_step(p, g, m, v, n, cfg).is_ok());
      EXPECT_TRUE(testing::close_nmse(p, dp, 1e-12));
      EXPECT_TRUE(testing::close_nmse(m, dm, 1e-12));
      EXPECT_TRUE(testing::close_nmse(v, dv, 1e-12));
    }
  }
}

// The LAMB formula by hand on 2 elements (step 1: m̂ = g, v̂ = g², so u = g/(|g|+eps) + wd p).
TEST(Lamb, HandComputedFirstStep) {
  std::vector<float> p = {3.0f, 4.0f}, g = {0.5f, -2.0f}, m(2, 0.0f), v(2, 0.0f);
  LambConfig c;
  c.lr = 0.1, c.eps = 0.0, c.weight_decay = 0.0;
  ASSERT_TRUE(lamb_step(p, g, m, v, 2, c).is_ok());
  // u = sign(g) = {1, -1}: ‖u‖ = √2, ‖p‖ = 5, trust = 5/√2.
  const double step = 0.1 * 5.0 / std::sqrt(2.0);
  EXPECT_NEAR(p[0], 3.0 - step, 1e-6);
  EXPECT_NEAR(p[1], 4.0 + step, 1e-6);
  // A zero parameter tensor gets trust 1.
  std::vector<float> z = {0.0f, 0.0f}, m2(2, 0.0f), v2(2, 0.0f);
  ASSERT_TRUE(lamb_step(z, g, m2, v2, 2, c).is_ok());
  EXPECT_NEAR(z[0], -0.1, 1e-6);
  EXPECT_NEAR(z[1], 0.1, 1e-6);
}

TEST(SumSquares, MatchesReferenceAndFlagsNonFinite) {
  for (int64_t n : sizes()) {
    const std::vector<float> x = testing::random_vector(size_t(n), uint64_t(n), -3.0f, 3.0f);
    const Result<double> s = sum_squares(x, n);
    ASSERT_TRUE(s.is_ok());
    const double want = ref::sum_squares(x.data(), n);
    EXPECT_NEAR(*s, want, 1e-12 * want) << n;
  }
  EXPECT_EQ(*sum_squares(std::span<const float>(), 0), 0.0);
  std::vector<float> x(50000, 1.0f);
  x[41234] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(*sum_squares(x, 50000)));
  x[41234] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(*sum_squares(x, 50000)));
}

}  // namespace
}  // namespace aspen::kernels
