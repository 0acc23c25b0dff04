#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}

// Runs the fast path and the reference on the same inputs and compares.
void check_case(MatmulShape s, uint64_t seed) {
  SCOPED_TRACE(s.to_string());
  auto a = testing::random_vector(s.a_elements(), seed);
  auto b = testing::random_vector(s.b_elements(), seed + 1);
  auto bias = testing::random_vector(s.N, seed + 2);
  auto c0 = testing::random_vector(s.c_elements(), seed + 3);  // beta = 1 accumulates onto this
  Guarded<float> fast(s.c_elements());
  std::vector<float> want(c0);
  for (size_t i = 0; i < c0.size(); ++i) fast[i] = c0[i];
  if (s.input == DType::f32) {
    ASSERT_TRUE(matmul(a, b, bias, fast.span(), s).is_ok());
    ref::matmul<float, float>(a.data(), b.data(), s.has_bias ? bias.data() : nullptr, want.data(), s);
  } else {
    auto ab = to_bf16(a), bb = to_bf16(b);
    ASSERT_TRUE(matmul(ab, bb, bias, fast.span(), s).is_ok());
    ref::matmul<bf16, float>(ab.data(), bb.data(), s.has_bias ? bias.data() : nullptr, want.data(), s);
  }
  EXPECT_GUARDS(fast);
  // Same inputs (bf16 inputs are exact in f32), f32 accumulation in both: only
  // the summation order differs.
  EXPECT_TRUE(testing::close_nmse(fast.cspan(), want, testing::nmse_threshold(DType::f32)));
}

TEST(Matmul, MatchesReferenceOverOddShapes) {
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t m : testing::kOddSizes)
      for (int64_t n : {int64_t(1), int64_t(7), int64_t(129)})
        for (int64_t k : {int64_t(3), int64_t(17), int64_t(129)}) {
          MatmulShape s{.batch = 1, .M = m, .N = n, .K = k, .input = dt};
          check_case(s, seed++);
        }
}

TEST(Matmul, TransposesBatchesBiasAndAccumulate) {
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool bcast : {false, true})
          for (bool bias : {false, true})
            for (float beta : {0.0f, 1.0f}) {
              MatmulShape s{.batch = 3, .M = 17, .N = 7, .K = 33, .trans_a = ta, .trans_b = tb,
                            .broadcast_b = bcast, .has_bias = bias, .beta = beta, .input = dt};
              check_case(s, seed++);
            }
}

TEST(Matmul, ReferenceModeAndPlanCache) {
  MatmulShape s{.M = 5, .N = 6, .K = 7};
  auto a = testing::random_vector(35, 1), b = testing::random_vector(42, 2);
  std::vector<float> c1(30), c2(30);
  size_t before = matmul_cache_size();
  ASSERT_TRUE(matmul(a, b, {}, c1, s).is_ok());
  ASSERT_TRUE(matmul(a, b, {}, c1, s).is_ok());
  EXPECT_EQ(matmul_cache_size(), before + 1);  // one plan for one shape
  {
    ScopedReferenceMode r(true);
    ASSERT_TRUE(matmul(a, b, {}, c2, s).is_ok());
  }
  EXPECT_EQ(matmul_cache_size(), before + 1);
  EXPECT_TRUE(testing::close_nmse(c1, c2, 1e-12));
}

TEST(Matmul, PlanRunsOnAThreadTeam) {
  CoreBudget budget(2);
  auto team = ThreadTeam::create("dev0", 2, budget);
  ASSERT_TRUE(team.is_ok());
  MatmulShape s{.M = 64, .N = 48, .K = 40, .trans_b = true};
  auto a = testing::random_vector(s.a_elements(), 5), b = testing::random_vector(s.b_elements(), 6);
  std::vector<float> got(s.c_elements()), want(s.c_elements());
  (*team)->run([&] {
    auto plan = MatmulPlan::create(s);
    ASSERT_TRUE(plan.is_ok());
    EXPECT_EQ(plan->team_size(), 2);
    plan->run(a.data(), b.data(), nullptr, got.data());
  });
  ref::matmul<float, float>(a.data(), b.data(), nullptr, want.data(), s);
  EXPECT_TRUE(testing::close_nmse(got, want, testing::nmse_threshold(DType::f32)));
}

TEST(Matmul, BadArgumentsAreStatuses) {
  MatmulShape s{.M = 4, .N = 3, .K = 3};
  std::vector<float> a(12), b(9), c(11);
  Status st = matmul(a, b, {}, c, s);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "matmul: argument 'c': expected at least 12 elements, found 11");
  std::vector<float> c_ok(12);
  s.has_bias = true;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: argument 'bias': expected a buffer of 3 elements, found a null pointer");
  s.has_bias = false;
  s.K = 0;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: K: expected >= 1, found 0");
  s.K = 3;
  s.input = DType::bf16;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: shape.input: expected f32 (the buffers' type), found bf16");
  s.input = DType::i32;
  EXPECT_EQ(MatmulPlan::create(s).status().code(), Code::kUnimplemented);
  s.input = DType::f32;
  s.beta = 0.5f;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: beta: expected 0 or 1, found 0.500000");
}

}  // namespace
}  // namespace aspen::kernels
