#include "kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

std::vector<AdamWConfig> configs() {
  AdamWConfig a;  // PyTorch defaults, first step
  AdamWConfig b;
  b.lr = 3e-4, b.beta1 = 0.8, b.beta2 = 0.95, b.eps = 1e-6, b.weight_decay = 0.1, b.step = 7, b.grad_scale = 0.5f;
  AdamWConfig c;  // beta1 < 0.5 takes lerp's other branch
  c.lr = 1e-2, c.beta1 = 0.3, c.beta2 = 0.9, c.weight_decay = 0.0, c.step = 1000, c.grad_scale = 1.0f / 1024;
  return {a, b, c};
}

struct State {
  std::vector<float> param, grad, m, v;
};
State random_state(int64_t n, uint64_t seed) {
  return {testing::random_vector(n, seed, -2.0f, 2.0f), testing::random_vector(n, seed + 1, -1.0f, 1.0f),
          testing::random_vector(n, seed + 2, -0.1f, 0.1f), testing::random_vector(n, seed + 3, 0.0f, 0.01f)};
}

TEST(AdamW, FastMatchesReference) {
  std::vector<int64_t> sizes = testing::kOddSizes;
  sizes.push_back(3 * 4096 + 5);  // several chunks
  sizes.push_back(40000);         // parallel
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    int ci = 0;
    for (const AdamWConfig& cfg : configs()) {
      ++ci;
      for (int64_t n : sizes) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " config " + std::to_string(ci) + " N=" + std::to_string(n));
        const State s = random_state(n, uint64_t(n + ci));
        State want = s;
        ref::adamw_step<float>(want.param.data(), want.grad.data(), want.m.data(), want.v.data(), n, cfg);
        Guarded<float> p(n), m(n), v(n);
        for (int64_t i = 0; i < n; ++i) p[i] = s.param[i], m[i] = s.m[i], v[i] = s.v[i];
        ASSERT_TRUE(adamw_step(p.span(), s.grad, m.span(), v.span(), n, cfg).is_ok());
        EXPECT_TRUE(testing::close_nmse(p.cspan(), want.param, 1e-12));
        EXPECT_TRUE(testing::close_nmse(m.cspan(), want.m, 1e-12));
        EXPECT_TRUE(testing::close_nmse(v.cspan(), want.v, 1e-12));
        if (isa == Isa::scalar) {  // the portable path performs the reference's exact f32 operations
          EXPECT_EQ(p.vec(), want.param);
          EXPECT_EQ(m.vec(), want.m);
          EXPECT_EQ(v.vec(), want.v);
        }
        EXPECT_GUARDS(p);
        EXPECT_GUARDS(m);
        EXPECT_GUARDS(v);
      }
    }
  }
}

// PyTorch's AdamW formula evaluated in double by hand, step 3 with non-zero state.
TEST(AdamW, HandComputedStep) {
  const std::vector<double> p0 = {1.0, -0.5, 2.0, 0.25}, g0 = {0.1, -0.2, 0.0, 3.0};
  const std::vector<double> m0 = {0.01, 0.0, -0.03, 0.2}, v0 = {0.0004, 0.0, 0.0009, 0.5};
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  const int step = 3;
  const double bc1 = 1 - b1 * b1 * b1, bc2 = 1 - b2 * b2 * b2;
  AdamWConfig cfg;
  cfg.lr = lr, cfg.beta1 = b1, cfg.beta2 = b2, cfg.eps = eps, cfg.weight_decay = wd, cfg.step = step;
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    std::vector<float> p(p0.begin(), p0.end()), g(g0.begin(), g0.end()), m(m0.begin(), m0.end()),
        v(v0.begin(), v0.end());
    ASSERT_TRUE(adamw_step(p, g, m, v, 4, cfg).is_ok());
    for (int i = 0; i < 4; ++i) {
      const double pd = p0[i] * (1 - lr * wd);
      const double md = b1 * m0[i] + (1 - b1) * g0[i];
      const double vd = b2 * v0[i] + (1 - b2) * g0[i] * g0[i];
      const double pe = pd - lr * (md / bc1) / (std::sqrt(vd / bc2) + eps);
      EXPECT_NEAR(m[i], md, 1e-7 * std::max(1.0, std::abs(md))) << i;
      EXPECT_NEAR(v[i], vd, 1e-7 * std::max(1e-3, std::abs(vd))) << i;
      EXPECT_NEAR(p[i], pe, 1e-6 * std::max(1.0, std::abs(pe))) << i;
    }
    // Element 1 by hand: m = -0.02, v = 0.00004, m̂ = -0.02/0.271, sqrt(v̂) = sqrt(0.00004/0.002997001).
    EXPECT_NEAR(p[1], -0.5 * 0.999 + 0.01 * (0.02 / 0.271) / (std::sqrt(0.00004 / 0.002997001) + 1e-8), 1e-6);
  }
}

TEST(AdamW, GradScaleMultipliesGradientsFirst) {
  const int64_t n = 37;
  const State s = random_state(n, 61);
  AdamWConfig cfg;
  cfg.step = 4;
  State plain = s, scaled = s;
  for (float& x : scaled.grad) x *= 4.0f;  // exact: scaling by 1/4 recovers the gradient bitwise
  ASSERT_TRUE(adamw_step(plain.param, plain.grad, plain.m, plain.v, n, cfg).is_ok());
  cfg.grad_scale = 0.25f;
  ASSERT_TRUE(adamw_step(scaled.param, scaled.grad, scaled.m, scaled.v, n, cfg).is_ok());
  EXPECT_EQ(plain.param, scaled.param);
  EXPECT_EQ(plain.m, scaled.m);
  EXPECT_EQ(plain.v, scaled.v);
}

TEST(AdamW, SameForOneAndTwoThreads) {
  const int64_t n = 70001;
  const State s = random_state(n, 71);
  State one = s, two = s;
  const AdamWConfig cfg = configs()[1];
  {
    ScopedOmpThreads t(1);
    ASSERT_TRUE(adamw_step(one.param, one.grad, one.m, one.v, n, cfg).is_ok());
  }
  {
    ScopedOmpThreads t(2);
    ASSERT_TRUE(adamw_step(two.param, two.grad, two.m, two.v, n, cfg).is_ok());
  }
  EXPECT_EQ(one.param, two.param);
  EXPECT_EQ(one.m, two.m);
  EXPECT_EQ(one.v, two.v);
}

TEST(AdamW, BadArguments) {
  std::vector<float> p(5), g(5), m(5), v(5), short_v(4);
  AdamWConfig cfg;
  EXPECT_TRUE(adamw_step({}, {}, {}, {}, 0, cfg).is_ok());
  cfg.step = 0;
  EXPECT_EQ(adamw_step(p, g, m, v, 5, cfg).message(), "adamw_step: step: expected >= 1, found 0");
  cfg.step = 1;
  cfg.beta1 = 1.0;
  EXPECT_EQ(adamw_step(p, g, m, v, 5, cfg).message(),
            "adamw_step: argument 'beta1': expected a value in [0, 1), found 1.000000");
  cfg.beta1 = 0.9;
  cfg.eps = -1.0;
  EXPECT_EQ(adamw_step(p, g, m, v, 5, cfg).message(),
            "adamw_step: argument 'eps': expected a value >= 0, found -1.000000");
  cfg.eps = 1e-8;
  EXPECT_EQ(adamw_step(p, g, m, short_v, 5, cfg).message(),
            "adamw_step: argument 'v': expected at least 5 elements, found 4");
  EXPECT_EQ(adamw_step(p, std::span<const float>(), m, v, 5, cfg).message(),
            "adamw_step: argument 'grad': expected a buffer of 5 elements, found a null pointer");
}

}  // namespace
}  // namespace aspen::kernels
