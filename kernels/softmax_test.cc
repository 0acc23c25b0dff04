#include "kernels/softmax.h"

#include <gtest/gtest.h>

#include <cfloat>
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

std::string shape_name(int64_t R, int64_t C, float range, Isa isa) {
  return "R=" + std::to_string(R) + " C=" + std::to_string(C) + " range=" + std::to_string(range) +
         " isa=" + isa_name(isa);
}

// Targets in [0, V), with every third row (starting at row 1) set to `ignore`.
std::vector<int32_t> make_targets(int64_t R, int64_t V, uint64_t seed, int32_t ignore = kIgnoreIndex) {
  const std::vector<float> u = random_vector(R, seed, 0.0f, 1.0f);
  std::vector<int32_t> t(R);
  for (int64_t r = 0; r < R; ++r) t[r] = r % 3 == 1 ? ignore : std::min<int32_t>(int32_t(u[r] * V), V - 1);
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Softmax, MatchesReference) {
  const double tol = nmse_threshold(DType::f32);
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t r : kOddSizes)
    for (int64_t c : kOddSizes) shapes.push_back({r, c});
  shapes.push_back({3, 768});
  shapes.push_back({70, 1031});  // several row chunks, on the whole team
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (float range : {1.0f, 80.0f}) {  // +-80: exp(x) alone would overflow; stability is required
      for (auto [R, C] : shapes) {
        if (skip_big(R * C, isa)) continue;
        SCOPED_TRACE(shape_name(R, C, range, isa));
        const std::vector<float> x = random_vector(R * C, 1 + C, -range, range), dy = random_vector(R * C, 2 + R);
        Guarded<float> y(R * C), dx(R * C);
        ASSERT_TRUE(softmax_forward(x, y.span(), R, C).is_ok());
        ASSERT_TRUE(softmax_backward(y.cspan(), dy, dx.span(), R, C).is_ok());
        const std::vector<double> xd = to_f64(x), dyd = to_f64(dy);
        std::vector<double> wy(R * C), wdx(R * C);
        ref::softmax_forward(xd.data(), wy.data(), R, C);
        ref::softmax_backward(wy.data(), dyd.data(), wdx.data(), R, C);
        EXPECT_TRUE(close_nmse(y.cspan(), wy, tol));
        if (range == 1.0f) {
          EXPECT_TRUE(close_nmse(dx.cspan(), wdx, tol));
        } else {
          // At +-80 rows are nearly one-hot: where y ~ 1, dy - sum dy y cancels to ~0, so dx is
          // only determined to about FLT_EPSILON |dy| and its relative error means nothing.
          // Check the absolute error instead (|dy| <= 1).
          EXPECT_TRUE(testing::all_finite(dx.cspan()));
          for (int64_t i = 0; i < R * C; ++i) EXPECT_NEAR(dx[i], wdx[i], 4 * FLT_EPSILON) << "element " << i;
        }
        EXPECT_GUARDS(y);
        EXPECT_GUARDS(dx);
      }
    }
  }
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, C = 7;
  const std::vector<float> x = random_vector(R * C, 11, -3.0f, 3.0f), dy = random_vector(R * C, 12);
  std::vector<float> y(R * C), dx(R * C);
  ASSERT_TRUE(softmax_forward(x, y, R, C).is_ok());
  ASSERT_TRUE(softmax_backward(y, dy, dx, R, C).is_ok());
  const std::vector<double> w = to_f64(dy);
  auto loss = [&](const std::vector<double>& xs) {
    std::vector<double> out(R * C);
    ref::softmax_forward(xs.data(), out.data(), R, C);
    double s = 0;
    for (int64_t i = 0; i < R * C; ++i) s += w[i] * out[i];
    return s;
  };
  EXPECT_TRUE(close_nmse(dx, numeric_grad(loss, to_f64(x)), kGradNmse));
}

TEST(Softmax, InPlace) {
  const int64_t R = 4, C = 300;
  std::vector<float> x = random_vector(R * C, 13, -10.0f, 10.0f), want(R * C);
  ref::softmax_forward(x.data(), want.data(), R, C);
  ASSERT_TRUE(softmax_forward(x, x, R, C).is_ok());
  EXPECT_TRUE(close_nmse(x, want, nmse_threshold(DType::f32)));
}

TEST(CrossEntropy, MatchesReference) {
  const double tol = nmse_threshold(DType::f32);
  const float dloss = 1.5f;
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (float range : {4.0f, 80.0f}) {
      for (int64_t R : kOddSizes) {
        for (int64_t V : {int64_t(1), int64_t(3), int64_t(7), int64_t(17), int64_t(129), int64_t(1031)}) {
          if (skip_big(R * V, isa)) continue;
          SCOPED_TRACE(shape_name(R, V, range, isa));
          const std::vector<float> logits = random_vector(R * V, 21 + V, -range, range);
          const std::vector<int32_t> targets = make_targets(R, V, 22 + R);
          Guarded<float> loss(R), lse(R), mean(1), dlogits(R * V);
          ASSERT_TRUE(cross_entropy_forward(logits, targets, loss.span(), lse.span(), mean.span(), R, V).is_ok());
          ASSERT_TRUE(cross_entropy_backward(logits, targets, lse.cspan(), dlogits.span(), R, V, dloss).is_ok());
          const std::vector<double> ld = to_f64(logits);
          std::vector<double> wloss(R), wlse(R), wmean(1), wd(R * V);
          ref::cross_entropy_forward(ld.data(), targets.data(), wloss.data(), wlse.data(), wmean.data(), R, V,
                                     kIgnoreIndex);
          ref::cross_entropy_backward(ld.data(), targets.data(), wlse.data(), wd.data(), R, V, double(dloss),
                                      kIgnoreIndex);
          EXPECT_TRUE(close_nmse(loss.cspan(), wloss, tol));
          EXPECT_TRUE(close_nmse(lse.cspan(), wlse, tol));
          EXPECT_TRUE(close_nmse(mean.cspan(), wmean, tol));
          EXPECT_TRUE(close_nmse(dlogits.cspan(), wd, tol));
          for (int64_t r = 0; r < R; ++r)
            if (targets[r] == kIgnoreIndex) {
              EXPECT_EQ(loss[r], 0.0f) << "row " << r;
            }
          EXPECT_GUARDS(loss);
          EXPECT_GUARDS(lse);
          EXPECT_GUARDS(mean);
          EXPECT_GUARDS(dlogits);
        }
      }
    }
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t R = 4, V = 5;
  const float dloss = 1.7f;
  const std::vector<float> logits = random_vector(R * V, 31, -2.0f, 2.0f);
  const std::vector<int32_t> targets = make_targets(R, V, 32);  // row 1 ignored
  std::vector<float> loss(R), lse(R), mean(1), dlogits(R * V);
  ASSERT_TRUE(cross_entropy_forward(logits, targets, loss, lse, mean, R, V).is_ok());
  ASSERT_TRUE(cross_entropy_backward(logits, targets, lse, dlogits, R, V, dloss).is_ok());
  auto f = [&](const std::vector<double>& x) {
    std::vector<double> l(R), s(R), m(1);
    ref::cross_entropy_forward(x.data(), targets.data(), l.data(), s.data(), m.data(), R, V, kIgnoreIndex);
    return double(dloss) * m[0];
  };
  EXPECT_TRUE(close_nmse(dlogits, numeric_grad(f, to_f64(logits)), kGradNmse));
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[1 * V + v], 0.0f);
}

TEST(CrossEntropy, AllRowsIgnored) {
  const int64_t R = 3, V = 4;
  const std::vector<float> logits = random_vector(R * V, 41);
  const std::vector<int32_t> targets(R, kIgnoreIndex);
  std::vector<float> loss(R, 9.0f), lse(R), mean(1, 9.0f), dlogits(R * V, 9.0f);
  ASSERT_TRUE(cross_entropy_forward(logits, targets, loss, lse, mean, R, V).is_ok());
  ASSERT_TRUE(cross_entropy_backward(logits, targets, lse, dlogits, R, V, 1.0f).is_ok());
  EXPECT_EQ(mean[0], 0.0f);
  EXPECT_EQ(loss, std::vector<float>(R, 0.0f));
  EXPECT_EQ(dlogits, std::vector<float>(R * V, 0.0f));
}

TEST(CrossEntropy, IgnoreIndexInsideVocabulary) {
  const int64_t R = 6, V = 9;
  const int32_t ignore = 0;  // class 0 (e.g. padding) is ignored, as with PyTorch's ignore_index
  const std::vector<float> logits = random_vector(R * V, 51, -3.0f, 3.0f);
  const std::vector<int32_t> targets = make_targets(R, V, 52, ignore);
  std::vector<float> loss(R), lse(R), mean(1), dlogits(R * V);
  ASSERT_TRUE(cross_entropy_forward(logits, targets, loss, lse, mean, R, V, ignore).is_ok());
  ASSERT_TRUE(cross_entropy_backward(logits, targets, lse, dlogits, R, V, 1.0f, ignore).is_ok());
  std::vector<float> wloss(R), wlse(R), wmean(1), wd(R * V);
  ref::cross_entropy_forward(logits.data(), targets.data(), wloss.data(), wlse.data(), wmean.data(), R, V, ignore);
  ref::cross_entropy_backward(logits.data(), targets.data(), wlse.data(), wd.data(), R, V, 1.0f, ignore);
  EXPECT_TRUE(close_nmse(mean, wmean, nmse_threshold(DType::f32)));
  EXPECT_TRUE(close_nmse(dlogits, wd, nmse_threshold(DType::f32)));
}

TEST(CrossEntropy, IndependentOfThreadCount) {
  const int64_t R = 70, V = 1031;
  const std::vector<float> logits = random_vector(R * V, 61, -8.0f, 8.0f);
  const std::vector<int32_t> targets = make_targets(R, V, 62);
  auto run = [&](int threads) {
    ScopedOmpThreads team(threads);
    std::vector<float> loss(R), lse(R), mean(1), dlogits(R * V);
    EXPECT_TRUE(cross_entropy_forward(logits, targets, loss, lse, mean, R, V).is_ok());
    EXPECT_TRUE(cross_entropy_backward(logits, targets, lse, dlogits, R, V, 1.0f).is_ok());
    return std::vector<std::vector<float>>{loss, lse, mean, dlogits};
  };
  const auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_bits(one[i], two[i])) << "output " << i;
}

TEST(CrossEntropy, TargetOutOfRangeIsStatus) {
  const int64_t R = 4, V = 1031;
  const std::vector<float> logits(R * V, 0.0f);
  std::vector<int32_t> targets = {5, kIgnoreIndex, 1031, 2};
  std::vector<float> loss(R, 7.0f), lse(R), mean(1), dlogits(R * V);
  Status s = cross_entropy_forward(logits, targets, loss, lse, mean, R, V);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.message(),
            "cross_entropy_forward: argument 'targets' row 2: expected a class index in [0, 1031) or "
            "ignore_index -100, found 1031");
  EXPECT_EQ(loss, std::vector<float>(R, 7.0f));  // checked before anything is written
  targets[2] = -1;
  EXPECT_EQ(cross_entropy_backward(logits, targets, lse, dlogits, R, V, 1.0f).message(),
            "cross_entropy_backward: argument 'targets' row 2: expected a class index in [0, 1031) or "
            "ignore_index -100, found -1");
}

TEST(Softmax, BadArgumentsAreStatus) {
  std::vector<float> x(21), y(20);
  Status s = softmax_forward(x, y, 3, 7);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "softmax_forward: argument 'y': expected at least 21 elements, found 20");
  EXPECT_EQ(softmax_backward(x, x, x, 3, 0).message(), "softmax_backward: C: expected >= 1, found 0");
  const std::vector<int32_t> t(2, 0);
  std::vector<float> loss(3), lse(3), mean(1);
  EXPECT_EQ(cross_entropy_forward(x, t, loss, lse, mean, 3, 7).message(),
            "cross_entropy_forward: argument 'targets': expected at least 3 elements, found 2");
  EXPECT_EQ(cross_entropy_forward(x, t, loss, lse, {}, 2, 7).message(),
            "cross_entropy_forward: argument 'mean_loss': expected a buffer of 1 elements, found a null pointer");
}

}  // namespace
}  // namespace aspen::kernels
