#include "train/rebalance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "train/pipeline.h"

namespace aspen::train {

namespace {

double slowest(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// The step's time from its stages' (NOTE in rebalance.h): Σ t + (m - 1) · max t, by m; the slowest alone for m 0.
double step_time(const std::vector<double>& t, int m) {
  if (m <= 0) return slowest(t);
  double sum = 0;
  for (double v : t) sum += v;
  return (sum + double(m - 1) * slowest(t)) / double(m);
}

}  // namespace

double StageMove::step_s(const std::vector<double>& stage_s) const { return step_time(stage_s, micro_batches); }

double StageMove::predicted_gain() const {
  const double b = step_s(before_s);
  return b > 0 ? 1.0 - step_s(predicted_s) / b : 0.0;
}

double StageMove::measured_gain() const {
  return measured_step_s <= 0 || before_step_s <= 0 ? std::numeric_limits<double>::quiet_NaN()
                                                    : 1.0 - measured_step_s / before_step_s;
}

Result<StageBalancer> StageBalancer::create(graph::Graph forward, std::string loss, std::vector<int> stage_of,
                                            std::vector<double> node_costs, int micro_batches,
                                            const RebalanceOptions& options) {
  if (micro_batches < 0)
    return Status::invalid_argument("rebalance: micro-batches", ">= 0", std::to_string(micro_batches));
  if (options.window < 1)
    return Status::invalid_argument("rebalance: window", ">= 1 step", std::to_string(options.window));
  if (options.cooldown < options.window)
    return Status::invalid_argument("rebalance: cooldown", ">= the window (" + std::to_string(options.window) + ")",
                                    std::to_string(options.cooldown));
  if (!(options.min_gain >= 0.0 && options.min_gain < 1.0))
    return Status::invalid_argument("rebalance: min_gain", "in [0, 1)", std::to_string(options.min_gain));
  if (!(options.probe_apart >= 0.0))
    return Status::invalid_argument("rebalance: probe_apart", ">= 0", std::to_string(options.probe_apart));
  if (stage_of.size() != forward.nodes().size() || stage_of.empty())
    return Status::invalid_argument("rebalance: the starting cut",
                                    std::to_string(forward.nodes().size()) + " entries (one stage per node)",
                                    std::to_string(stage_of.size()));
  StageBalancer b;
  b.stages_ = 1 + *std::max_element(stage_of.begin(), stage_of.end());
  if (node_costs.empty()) {
    node_costs.assign(forward.nodes().size(), 0.0);
    for (size_t i = 0; i < node_costs.size(); ++i)
      if (stage_of[i] >= 0) node_costs[i] = estimated_node_cost(forward, forward.node(int32_t(i)));
  }
  if (node_costs.size() != forward.nodes().size())
    return Status::invalid_argument("rebalance: node costs", std::to_string(forward.nodes().size()),
                                    std::to_string(node_costs.size()));
  b.forward_ = std::move(forward);
  b.loss_ = std::move(loss);
  b.first_ = stage_of;
  b.stage_of_ = std::move(stage_of);
  b.costs_ = std::move(node_costs);
  b.options_ = options;
  b.micro_batches_ = micro_batches;
  return b;
}

std::vector<double> StageBalancer::stage_costs(const std::vector<int>& stage_of) const {
  std::vector<double> c(static_cast<size_t>(stages_), 0.0);
  for (size_t i = 0; i < stage_of.size(); ++i)
    if (stage_of[i] >= 0) c[size_t(stage_of[i])] += costs_[i];
  return c;
}

std::vector<int> StageBalancer::stage_nodes(const std::vector<int>& stage_of) const {
  std::vector<int> c(static_cast<size_t>(stages_), 0);
  for (int s : stage_of)
    if (s >= 0) ++c[size_t(s)];
  return c;
}

Result<std::optional<std::vector<int>>> StageBalancer::observe(int64_t step, std::span<const double> stage_busy_s,
                                                               double wall_s) {
  just_measured_ = -1;
  if (int(stage_busy_s.size()) != stages_)
    return Status::invalid_argument("rebalance: a step's busy times", std::to_string(stages_) + " (one per stage)",
                                    std::to_string(stage_busy_s.size()));
  // The first step at a cut warms its new programs up (buffers touched, primitives made): not a measurement.
  if (++since_move_ == 1) return std::optional<std::vector<int>>();
  Seen seen{std::vector<double>(stage_busy_s.begin(), stage_busy_s.end()), wall_s};
  if (!(seen.step_s > 0)) seen.step_s = step_time(seen.busy_s, micro_batches_);
  window_.push_back(std::move(seen));
  if (int(window_.size()) > options_.window) window_.pop_front();
  if (int(window_.size()) < options_.window) return std::optional<std::vector<int>>();
  auto median_of = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> median(static_cast<size_t>(stages_)), steps;
  for (int s = 0; s < stages_; ++s) {
    std::vector<double> v;
    for (const Seen& w : window_) v.push_back(w.busy_s[size_t(s)]);
    median[size_t(s)] = median_of(std::move(v));
  }
  for (const Seen& w : window_) steps.push_back(w.step_s);
  // `now`: the step as measured here (what measured cuts are compared by); `modelled`: as the speed model
  // computes it from the busy times (what its predictions are compared with).
  const double now = median_of(std::move(steps)), modelled = step_time(median, micro_batches_);
  if (baseline_s_ <= 0) {
    baseline_s_ = now;
  } else if (std::abs(now - baseline_s_) > 2 * options_.min_gain * baseline_s_) {
    if (++drifted_ >= options_.window) {  // the conditions changed: what other cuts measured no longer holds
      tried_.clear();
      probe_from_.clear();
      may_probe_ = false;
      baseline_s_ = now;
      drifted_ = 0;
    }
  } else {
    drifted_ = 0;
  }
  tried_[stage_of_] = Seen{median, now};
  if (!moves_.empty() && moves_.back().measured_s.empty()) {
    moves_.back().measured_s = median;
    moves_.back().measured_step_s = now;
    just_measured_ = int(moves_.size()) - 1;
  }
  if (!moves_.empty() && since_move_ < options_.cooldown) return std::optional<std::vector<int>>();
  // A decision every `window` steps (a new window's worth of measurement), not every step: the cut's dynamic
  // programming stays off most steps' path.
  if (since_move_ % options_.window != 0) return std::optional<std::vector<int>>();
  auto propose = [&](const std::vector<int>& cut, std::vector<double> predicted) {
    StageMove m;
    m.step = step;
    m.nodes_before = stage_nodes(stage_of_);
    m.nodes_after = stage_nodes(cut);
    m.before_s = median;
    m.before_step_s = now;
    m.predicted_s = std::move(predicted);
    m.micro_batches = micro_batches_;
    proposed_ = std::move(m);
    proposed_cut_ = cut;
    return std::optional<std::vector<int>>(cut);
  };
  // A probe that measured slower than the cut it left (by anything: two measurements, no prediction): back.
  if (!moves_.empty() && moves_.back().probe && !probe_from_.empty()) {
    const std::vector<int> from = std::move(probe_from_);
    probe_from_.clear();
    if (const auto it = tried_.find(from); it != tried_.end() && it->second.step_s < now) {
      may_probe_ = false;
      return propose(from, it->second.busy_s);
    }
  }
  // A cut that measured faster under these conditions (the last move's prediction was wrong): back to it, its
  // measurement as the prediction.
  const std::vector<int>* back = nullptr;
  for (const auto& [cut, m] : tried_)
    if (cut != stage_of_ && m.step_s < now * (1 - options_.min_gain) && (!back || m.step_s < tried_[*back].step_s))
      back = &cut;
  if (back) {
    may_probe_ = true;  // the model mispredicted here: once measured, one probe may look beside this cut
    return propose(*back, tried_[*back].busy_s);
  }
  // Each stage's speed at the current cut, and the cut those speeds balance. (Read off a few nodes a speed is
  // mostly the stage's fixed time: on the demo with stage 1 slowed 2x and 3 nodes of 91 left there, the model
  // once proposed giving it all of them; the wall measured the step 84 % slower and the run went back, once:
  // the cut stays tried. Speeds kept from other cuts were tried instead and went stale when a device recovered.)
  const std::vector<double> cost = stage_costs(stage_of_);
  std::vector<double> speed(static_cast<size_t>(stages_));
  for (int s = 0; s < stages_; ++s) {
    if (!(cost[size_t(s)] > 0) || !(median[size_t(s)] > 0)) return std::optional<std::vector<int>>();
    speed[size_t(s)] = median[size_t(s)] / cost[size_t(s)];
  }
  // The cut the speeds `v` balance (every later cut keeps the first cut's grouping: NOTE [moving stages]).
  auto cut_for = [&](const std::vector<double>& v) {
    return split_pipeline(forward_, stages_, loss_,
                          {.node_costs = costs_,
                           .every_narrow_point = false,
                           .stage_speed = v,
                           .keep_grouping = first_,
                           .micro_batches = micro_batches_});
  };
  ASPEN_ASSIGN_OR_RETURN(const PipelineSplit split, cut_for(speed));
  auto predict = [&](const std::vector<int>& cut) {
    const std::vector<double> next = stage_costs(cut);
    std::vector<double> predicted;
    for (int s = 0; s < stages_; ++s) predicted.push_back(speed[size_t(s)] * next[size_t(s)]);
    return predicted;
  };
  // A cut tried under these conditions: its measurement stands over the prediction (had it measured faster by
  // min_gain, the run would have gone back to it above).
  const bool untried = split.stage_of != stage_of_ && !tried_.count(split.stage_of);
  if (untried) {
    std::vector<double> predicted = predict(split.stage_of);
    if (1.0 - step_time(predicted, micro_batches_) / modelled >= options_.min_gain) {
      may_probe_ = true;  // once this move is measured, one probe may refine it
      return propose(split.stage_of, std::move(predicted));
    }
  }
  // NOTE [probe]: the model has nothing worth a move, yet the stages stay apart: the next cut over, measured.
  const double mean = std::accumulate(median.begin(), median.end(), 0.0) / double(stages_);
  // One probe per move, within the first three decisions after it (so none comes long after: not a swing).
  if (since_move_ > options_.cooldown + 2 * options_.window) may_probe_ = false;
  if (!may_probe_ || !(slowest(median) > (1 + options_.probe_apart) * mean) || options_.probe_apart <= 0)
    return std::optional<std::vector<int>>();
  auto probe = [&](const std::vector<int>& cut) {
    std::optional<std::vector<int>> to = propose(cut, predict(cut));
    proposed_->probe = true;
    probe_from_ = stage_of_;
    may_probe_ = false;
    return to;
  };
  // The model's own best, predicted to gain less than a move must: measured.
  if (untried && step_time(predict(split.stage_of), micro_batches_) < modelled) return probe(split.stage_of);
  // Else the first cut that takes a piece more off the dearest stage.
  const int dearest = int(std::max_element(median.begin(), median.end()) - median.begin());
  std::vector<double> slower = speed;
  for (double f = 1.02; f < 4.0; f *= 1.02) {
    slower[size_t(dearest)] = speed[size_t(dearest)] * f;
    ASPEN_ASSIGN_OR_RETURN(const PipelineSplit next, cut_for(slower));
    if (next.stage_of == stage_of_) continue;
    // The nearest was tried, or is predicted slower by more than a move must gain (the step's objective is not
    // convex over cuts: the first cut that changes can be far from this one): stay.
    if (tried_.count(next.stage_of) ||
        step_time(predict(next.stage_of), micro_batches_) > (1 + options_.min_gain) * modelled)
      return std::optional<std::vector<int>>();
    return probe(next.stage_of);
  }
  return std::optional<std::vector<int>>();
}

void StageBalancer::abandoned() {
  if (!proposed_) return;
  tried_[proposed_cut_] = Seen{std::vector<double>(size_t(stages_), std::numeric_limits<double>::infinity()),
                               std::numeric_limits<double>::infinity()};
  if (proposed_->probe) probe_from_.clear();
  proposed_.reset();
  window_.clear();
  since_move_ = 0;  // the current cut was made again: its first step warms up
}

void StageBalancer::moved(double seconds) {
  if (!proposed_) return;
  proposed_->seconds = seconds;
  moves_.push_back(std::move(*proposed_));
  stage_of_ = std::move(proposed_cut_);
  proposed_.reset();
  window_.clear();
  since_move_ = 0;
  baseline_s_ = 0;
  drifted_ = 0;
}

}  // namespace aspen::train
