#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/thread_team.h"

namespace aspen {
namespace {

// Random123's published known-answer vectors (tests/kat_vectors).
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, SameStreamWhateverTheThreadCount) {
  std::vector<float> one(10007), two(10007), tail(10007 - 5000);
  {
    ScopedOmpThreads t(1);
    philox_fill_uniform(one, 42, 3, 100);
  }
  {
    ScopedOmpThreads t(2);
    philox_fill_uniform(two, 42, 3, 100);
    philox_fill_uniform(tail, 42, 3, 100 + 5000);  // an offset continues the same stream
  }
  EXPECT_EQ(one, two);
  for (size_t i = 0; i < tail.size(); ++i) ASSERT_EQ(tail[i], one[5000 + i]);
}

TEST(Philox, UniformAndNormalMoments) {
  std::vector<float> u(200000), n(200000);
  philox_fill_uniform(u, 1, 0, 0, -1.0f, 3.0f);
  philox_fill_normal(n, 1, 1, 0, 2.0f, 0.5f);
  double su = 0, sn = 0, sn2 = 0;
  for (float v : u) {
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 3.0f);
    su += v;
  }
  for (float v : n) {
    ASSERT_TRUE(std::isfinite(v));
    sn += v;
    sn2 += double(v) * v;
  }
  double mn = sn / n.size();
  EXPECT_NEAR(su / u.size(), 1.0, 0.01);
  EXPECT_NEAR(mn, 2.0, 0.005);
  EXPECT_NEAR(std::sqrt(sn2 / n.size() - mn * mn), 0.5, 0.005);
  // Different seeds or streams differ.
  EXPECT_NE(philox_bits(1, 0, 0), philox_bits(2, 0, 0));
  EXPECT_NE(philox_bits(1, 0, 0), philox_bits(1, 1, 0));
}

}  // namespace
}  // namespace aspen
