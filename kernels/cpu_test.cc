#include "kernels/cpu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

TEST(Cpu, CapAndReferenceSwitches) {
  Isa best = cpu_features().best;
  EXPECT_EQ(active_isa(), best);
  {
    ScopedIsaCap cap(Isa::scalar);
    EXPECT_EQ(active_isa(), Isa::scalar);
  }
  EXPECT_EQ(active_isa(), best);
  EXPECT_FALSE(reference_mode());
  {
    ScopedReferenceMode r(true);
    EXPECT_TRUE(reference_mode());
  }
  EXPECT_FALSE(reference_mode());
  EXPECT_NE(cpu_features().to_string().find(isa_name(best)), std::string::npos);
}

TEST(Harness, GuardsCatchOverrun) {
  testing::Guarded<float> b(5);
  EXPECT_TRUE(b.guards_intact());
  b.data()[5] = 1.0f;  // one past the end, into the guard
  EXPECT_FALSE(b.guards_intact());
}

TEST(Harness, NmseAndFiniteChecksFail) {
  std::vector<float> a = {1, 2, 3}, b = {1, 2, 3.1f}, nan = {1, NAN, 3};
  EXPECT_TRUE(testing::close_nmse(a, a, 0.0));
  EXPECT_FALSE(testing::close_nmse(b, a, 1e-6));
  EXPECT_FALSE(testing::close_nmse(nan, a, 1.0));
  auto g = testing::numeric_grad([](const std::vector<double>& x) { return x[0] * x[0] * x[1]; }, {3.0, 2.0});
  EXPECT_NEAR(g[0], 12.0, 1e-6);
  EXPECT_NEAR(g[1], 9.0, 1e-6);
}

}  // namespace
}  // namespace aspen::kernels
