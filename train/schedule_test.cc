#include "train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace aspen::train {
namespace {

TEST(LrSchedule, WarmupThenDecay) {
  LrSchedule s{.kind = ScheduleKind::cosine, .lr = 1.0, .warmup_steps = 4, .total_steps = 14, .min_lr_ratio = 0.1};
  ASSERT_TRUE(s.validate().is_ok());
  EXPECT_DOUBLE_EQ(s.at(1), 0.2);  // step / (warmup + 1): never 0
  EXPECT_DOUBLE_EQ(s.at(4), 0.8);
  EXPECT_DOUBLE_EQ(s.at(5), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.1)));
  EXPECT_DOUBLE_EQ(s.at(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5)));
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);  // past the end: the last value
  s.kind = ScheduleKind::linear;
  EXPECT_DOUBLE_EQ(s.at(9), 1.0 - 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  s.kind = ScheduleKind::constant;
  EXPECT_DOUBLE_EQ(s.at(2), 0.4);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(s.at(1), 1.0);
}

TEST(LrSchedule, BadValuesNameThemselves) {
  LrSchedule s;
  s.min_lr_ratio = 2;
  EXPECT_EQ(s.validate().subject(), "schedule: min_lr_ratio");
  s = LrSchedule{};
  s.lr = -1;
  EXPECT_EQ(s.validate().subject(), "schedule: lr");
  EXPECT_EQ(parse_schedule_kind("cosin").status().expected(), "constant, linear or cosine");
  EXPECT_EQ(*parse_schedule_kind("linear"), ScheduleKind::linear);
}

TEST(LossScaler, DynamicBacksOffWithHysteresisAndGrows) {
  LossScaleOptions o{.mode = LossScaling::dynamic, .initial_scale = 1024, .growth_factor = 2, .backoff_factor = 0.5,
                     .growth_interval = 3, .hysteresis = 2};
  ASSERT_TRUE(o.validate().is_ok());
  LossScaler s(o);
  EXPECT_FALSE(s.update(false));  // first overflow: skipped, hysteresis absorbs it
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));  // second in a row: back off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // a good step in between restarts hysteresis
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));  // growth_interval good steps in a row: grow
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped(), 3);
  // Restoring the state continues exactly.
  LossScaler t(o);
  t.restore(s.state());
  EXPECT_FALSE(t.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(t.state().scale, s.state().scale);
  EXPECT_EQ(t.state().hysteresis_left, s.state().hysteresis_left);
}

TEST(LossScaler, StaticAndNoneNeverSkip) {
  LossScaler none;
  EXPECT_EQ(none.scale(), 1.0);
  EXPECT_TRUE(none.update(false));
  LossScaler st(LossScaleOptions{.mode = LossScaling::static_scale, .initial_scale = 128});
  EXPECT_EQ(st.scale(), 128);
  EXPECT_TRUE(st.update(false));
  EXPECT_EQ(st.scale(), 128);
  LossScaleOptions bad{.mode = LossScaling::dynamic, .backoff_factor = 1.5};
  EXPECT_EQ(bad.validate().subject(), "loss scaling: backoff_factor");
  EXPECT_EQ(parse_loss_scaling("dynamic").value(), LossScaling::dynamic);
  EXPECT_FALSE(parse_loss_scaling("auto").is_ok());
}

}  // namespace
}  // namespace aspen::train
