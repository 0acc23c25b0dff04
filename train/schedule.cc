#include "train/schedule.h"

#include <cmath>
#include <numbers>

namespace aspen::train {

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::constant: return "constant";
    case ScheduleKind::linear: return "linear";
    case ScheduleKind::cosine: return "cosine";
  }
  return "?";
}

Result<ScheduleKind> parse_schedule_kind(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::constant, ScheduleKind::linear, ScheduleKind::cosine})
    if (name == schedule_kind_name(k)) return k;
  return Status::invalid_argument("schedule", "constant, linear or cosine", "'" + std::string(name) + "'");
}

Status LrSchedule::validate() const {
  if (!(lr >= 0.0) || !std::isfinite(lr)) return Status::invalid_argument("schedule: lr", "a finite value >= 0", std::to_string(lr));
  if (warmup_steps < 0) return Status::invalid_argument("schedule: warmup_steps", ">= 0", std::to_string(warmup_steps));
  if (total_steps < 1) return Status::invalid_argument("schedule: total_steps", ">= 1", std::to_string(total_steps));
  if (!(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0))
    return Status::invalid_argument("schedule: min_lr_ratio", "in [0, 1]", std::to_string(min_lr_ratio));
  return Status();
}

double LrSchedule::at(int64_t step) const {
  if (step <= warmup_steps) return lr * double(step) / double(warmup_steps + 1);
  if (kind == ScheduleKind::constant) return lr;
  const double lo = lr * min_lr_ratio;
  const int64_t span = total_steps - warmup_steps;
  const double progress = span <= 0 ? 1.0 : std::min(1.0, double(step - warmup_steps) / double(span));
  if (kind == ScheduleKind::linear) return lr + (lo - lr) * progress;
  return lo + (lr - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

Result<LossScaling> parse_loss_scaling(std::string_view name) {
  if (name == "none") return LossScaling::none;
  if (name == "static") return LossScaling::static_scale;
  if (name == "dynamic") return LossScaling::dynamic;
  return Status::invalid_argument("loss scaling", "none, static or dynamic", "'" + std::string(name) + "'");
}

Status LossScaleOptions::validate() const {
  if (mode == LossScaling::none) return Status();
  if (!(initial_scale > 0.0) || !std::isfinite(initial_scale))
    return Status::invalid_argument("loss scaling: initial scale", "a finite value > 0", std::to_string(initial_scale));
  if (mode == LossScaling::static_scale) return Status();
  if (!(growth_factor >= 1.0))
    return Status::invalid_argument("loss scaling: growth_factor", ">= 1", std::to_string(growth_factor));
  if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
    return Status::invalid_argument("loss scaling: backoff_factor", "in (0, 1)", std::to_string(backoff_factor));
  if (growth_interval < 1)
    return Status::invalid_argument("loss scaling: growth_interval", ">= 1", std::to_string(growth_interval));
  if (hysteresis < 1) return Status::invalid_argument("loss scaling: hysteresis", ">= 1", std::to_string(hysteresis));
  return Status();
}

LossScaler::LossScaler(const LossScaleOptions& o) : o_(o) {
  scale_ = o.mode == LossScaling::none ? 1.0 : o.initial_scale;
  hysteresis_left_ = o.hysteresis;
}

bool LossScaler::update(bool finite) {
  if (o_.mode != LossScaling::dynamic) return true;
  if (!finite) {
    ++skipped_;
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) {
      scale_ = std::max(scale_ * o_.backoff_factor, 1.0 / 65536.0);
      hysteresis_left_ = o_.hysteresis;
    }
    return false;
  }
  hysteresis_left_ = o_.hysteresis;
  if (++good_steps_ >= o_.growth_interval) {
    scale_ *= o_.growth_factor;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace aspen::train
