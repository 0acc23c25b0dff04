// train/schedule.h: learning-rate schedules and loss scaling, the two
// host-side decisions a training step feeds into its program as run-time
// scalars ("optimizer.lr", "train.loss_scale", "optimizer.grad_scale"), so
// neither ever recompiles.
//
// LrSchedule::at(step), step = 1, 2, ... the update about to be made:
//   warm-up:   lr · step / (warmup_steps + 1)  for step <= warmup_steps  (never 0)
//   constant:  lr
//   linear:    from lr after warm-up down to min_lr_ratio · lr at total_steps
//   cosine:    min + (lr − min) · (1 + cos(π · progress)) / 2, progress in [0, 1]
// Steps past total_steps keep the last value.
//
// LossScaler (PyTorch's GradScaler and DeepSpeed's dynamic loss scaler):
//   none     scale 1, every step applied (an overflow is an error the trainer reports)
//   static   a fixed scale, every step applied
//   dynamic  an overflowing step (Inf/NaN gradients) is skipped; once
//            `hysteresis` overflows have come without an applied step in between,
//            the scale is multiplied by backoff_factor (and hysteresis restarts);
//            after growth_interval applied steps in a row it is multiplied by growth_factor.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace aspen::train {

enum class ScheduleKind { constant, linear, cosine };
Result<ScheduleKind> parse_schedule_kind(std::string_view name);  // "constant", "linear", "cosine"
const char* schedule_kind_name(ScheduleKind k);

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;

  Status validate() const;
  double at(int64_t step) const;
};

enum class LossScaling { none, static_scale, dynamic };
Result<LossScaling> parse_loss_scaling(std::string_view name);  // "none", "static", "dynamic"

struct LossScaleOptions {
  LossScaling mode = LossScaling::none;
  double initial_scale = 65536.0;
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000, hysteresis = 2;
  Status validate() const;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& o = {});
  double scale() const { return scale_; }
  // Records whether this step's gradients were finite; true: apply the step.
  bool update(bool finite);
  int64_t skipped() const { return skipped_; }

  // What a checkpoint keeps (restoring it continues exactly).
  struct State {
    double scale = 1.0;
    int64_t good_steps = 0, hysteresis_left = 0, skipped = 0;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_, skipped_}; }
  // Whether `s` (read back from a checkpoint after `step` steps) is a state
  // this scaler can be in: scale 1 without loss scaling, the configured scale
  // when static, a finite scale from min(2^-16, the initial scale) to f32's
  // largest when dynamic; counters within their ranges (good_steps <
  // growth_interval, hysteresis_left in [1, hysteresis], skipped <= step).
  // Corrupt naming the field.
  [[nodiscard]] Status check_state(const State& s, int64_t step) const;
  void restore(const State& s) {
    scale_ = s.scale, good_steps_ = s.good_steps, hysteresis_left_ = s.hysteresis_left, skipped_ = s.skipped;
  }

 private:
  LossScaleOptions o_;
  double scale_ = 1.0;
  int64_t good_steps_ = 0, hysteresis_left_ = 0, skipped_ = 0;
};

}  // namespace aspen::train
