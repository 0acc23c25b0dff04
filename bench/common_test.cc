// NOTE [guarded rows]: the rounds' spread, and a row whose ceiling moves measured again, then flagged.
#include "bench/common.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

namespace aspen::bench {
namespace {

void sleep_us(int us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

TEST(GuardedRounds, SpreadAndSteadyCeiling) {
  int calls = 0;
  const RowTimes t = guarded_rounds({[] { sleep_us(200); }, [] { sleep_us(2000); }},
                                    [&] { return 100.0 + (calls++ % 2); }, /*rounds=*/4, /*min_seconds=*/0.0);
  ASSERT_EQ(t.min.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_LE(t.min[i], t.median[i]);
    EXPECT_LE(t.median[i], t.max[i]);
  }
  EXPECT_GE(t.min[0], 200e-6);
  EXPECT_GE(t.min[1], 2000e-6);
  EXPECT_LT(t.median[0], t.median[1]);
  EXPECT_FALSE(t.disturbed);  // 1 % of drift
  EXPECT_EQ(t.attempts, 1);
  EXPECT_NEAR(t.drift(), 1.0 / 101.0, 1e-12);
  nlohmann::ordered_json row;
  add_guard_fields(row, t);
  EXPECT_EQ(row["disturbed"], false);
  EXPECT_EQ(spread_json(t, 1)["median"].get<double>(), t.median[1]);
}

TEST(GuardedRounds, DriftAndSpreadHelpers) {
  EXPECT_DOUBLE_EQ(ceiling_drift(100, 95), 0.05);
  EXPECT_DOUBLE_EQ(ceiling_drift(95, 100), 0.05);
  EXPECT_EQ(ceiling_drift(0, 0), 0.0);
  EXPECT_FALSE(ceiling_moved(100, 95));  // exactly 5 %: not over it
  EXPECT_TRUE(ceiling_moved(100, 94));
  const Spread odd = spread_of({3, 1, 2}), even = spread_of({4, 1, 2, 3}), none = spread_of({});
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.median, 2);
  EXPECT_EQ(odd.max, 3);
  EXPECT_EQ(even.median, 2.5);
  EXPECT_EQ(none.min, 0);
  EXPECT_EQ(spread_json(odd)["max"].get<double>(), 3);
}

TEST(GuardedRounds, AGuardedMeasurementIsRunAgainWhileItsCeilingMoves) {
  std::vector<double> readings = {100, 80, 100, 100};  // moved on the first attempt only
  size_t next = 0;
  int runs = 0;
  Guard g;
  ASSERT_TRUE(guarded([&] { return ++runs, Status(); }, [&] { return readings[next++]; }, &g).is_ok());
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(g.attempts, 2);
  EXPECT_FALSE(g.disturbed());
  readings = {100, 80, 100, 70};  // moved both times: flagged after one retry
  next = 0, runs = 0;
  ASSERT_TRUE(guarded([&] { return ++runs, Status(); }, [&] { return readings[next++]; }, &g).is_ok());
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(g.disturbed());
  nlohmann::ordered_json row;
  add_guard_fields(row, g);
  EXPECT_EQ(row["ceiling_before"].get<double>(), 100);
  EXPECT_EQ(row["ceiling_after"].get<double>(), 70);
  EXPECT_TRUE(row["disturbed"].get<bool>());
  runs = 0;  // no ceiling: once, unguarded; an error stops it
  ASSERT_TRUE(guarded([&] { return ++runs, Status(); }, nullptr, &g).is_ok());
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(g.before, 0);
  EXPECT_FALSE(g.disturbed());
  EXPECT_EQ(guarded([] { return Status::invalid_argument("m", "x", "y"); }, nullptr, &g).code(),
            Code::kInvalidArgument);
}

TEST(GuardedRounds, AMovingCeilingIsMeasuredAgainThenFlagged) {
  // Moves by 20 % on the first attempt only: measured again, then clean.
  std::vector<double> once = {100, 80, 100, 100};
  size_t k = 0;
  RowTimes t = guarded_rounds({[] {}}, [&] { return once[k++]; }, 2, 0.0, 0.05, /*retries=*/1);
  EXPECT_EQ(t.attempts, 2);
  EXPECT_FALSE(t.disturbed);
  EXPECT_EQ(k, 4u);
  // Moves on every attempt: flagged after the retries.
  double c = 100;
  t = guarded_rounds({[] {}}, [&] { return c *= 0.9; }, 2, 0.0, 0.05, /*retries=*/2);
  EXPECT_EQ(t.attempts, 3);
  EXPECT_TRUE(t.disturbed);
  EXPECT_NEAR(t.drift(), 0.1, 1e-9);
  // No ceiling: nothing to flag.
  t = guarded_rounds({[] {}}, nullptr, 2, 0.0);
  EXPECT_FALSE(t.disturbed);
  EXPECT_EQ(t.drift(), 0.0);
}

}  // namespace
}  // namespace aspen::bench
