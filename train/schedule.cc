#include "train/schedule.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
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

Status LossScaler::check_state(const State& s, int64_t step) const {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& found) {
    return Status::error(Code::kCorrupt, field, expected, found,
                         "the checkpoint is damaged, or was written with other precision.loss_scaling settings");
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  switch (o_.mode) {
    case LossScaling::none:
      if (s.scale != 1.0) return bad("scale", "1 (precision.loss_scaling is none)", num(s.scale));
      break;
    case LossScaling::static_scale:
      if (s.scale != o_.initial_scale)
        return bad("scale", num(o_.initial_scale) + " (precision.loss_scaling static, precision.loss_scale)",
                   num(s.scale));
      break;
    case LossScaling::dynamic:
      // The loss is scaled in f32: a scale beyond f32's range is no state a run reaches. Backing off stops
      // at 2^-16 (or below it, where precision.loss_scale started).
      if (!std::isfinite(s.scale) || s.scale > double(std::numeric_limits<float>::max()) ||
          s.scale < std::min(1.0 / 65536.0, o_.initial_scale))
        return bad("scale",
                   "a finite scale in [" + num(std::min(1.0 / 65536.0, o_.initial_scale)) +
                       ", f32's largest] (dynamic loss scaling)",
                   num(s.scale));
      if (s.good_steps < 0 || s.good_steps >= o_.growth_interval)
        return bad("good_steps", "in [0, " + std::to_string(o_.growth_interval) + ") (precision.growth_interval)",
                   std::to_string(s.good_steps));
      if (s.hysteresis_left < 1 || s.hysteresis_left > o_.hysteresis)
        return bad("hysteresis_left", "in [1, " + std::to_string(o_.hysteresis) + "] (precision.hysteresis)",
                   std::to_string(s.hysteresis_left));
      break;
  }
  if (s.skipped < 0 || s.skipped > step)
    return bad("skipped", "in [0, " + std::to_string(step) + "] (the steps done)", std::to_string(s.skipped));
  return Status::ok();
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
