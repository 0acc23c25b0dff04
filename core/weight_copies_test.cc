#include "core/weight_copies.h"

#include <gtest/gtest.h>

namespace aspen {
namespace {

// The budget holds what fits and refuses, whole, what does not; what is given back can be taken again.
TEST(WeightCopies, TakesWhatFitsAndRefusesTheRest) {
  const int64_t budget = weight_copy_budget(), before = weight_copy_bytes();
  ASSERT_GT(budget, 0);
  const int64_t room = budget - before;
  ASSERT_TRUE(take_weight_copy_bytes(room / 2));
  EXPECT_EQ(weight_copy_bytes(), before + room / 2);
  EXPECT_FALSE(take_weight_copy_bytes(room - room / 2 + 1)) << "one byte past the budget";
  EXPECT_EQ(weight_copy_bytes(), before + room / 2) << "a refusal reserves nothing";
  EXPECT_TRUE(take_weight_copy_bytes(room - room / 2));
  EXPECT_FALSE(take_weight_copy_bytes(1));
  give_weight_copy_bytes(room);
  EXPECT_EQ(weight_copy_bytes(), before);
  EXPECT_TRUE(take_weight_copy_bytes(0));
}

}  // namespace
}  // namespace aspen
