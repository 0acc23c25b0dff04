// The stage balancer against a simulated pipeline: each stage's time is its device's speed times the true
// cost of its nodes, with noise; the balancer sees only those times.
#include "train/rebalance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "graph/builder.h"
#include "train/pipeline.h"

namespace aspen::train {
namespace {

// A chain of `blocks` blocks (a [16, 16] product and a tanh each) and a sum-of-squares loss.
graph::Graph chain(int blocks) {
  graph::Graph g;
  graph::Builder b(g);
  graph::ValueId h = b.input("x", DType::f32, {4, 16});
  for (int k = 0; k < blocks; ++k)
    h = b.tanh(b.op1(graph::OpKind::matmul, {h, b.parameter("w" + std::to_string(k), DType::f32, {16, 16})}));
  b.output("loss", b.reduce_sum(b.mul(h, h), {0, 1}));
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return g;
}

struct Sim {
  graph::Graph g;
  std::vector<double> truth;  // by node: seconds on a speed-1 device
  std::vector<double> speed;  // by stage
  std::vector<double> overhead;  // by stage: seconds each step whatever its nodes (empty: none)
  double noise = 0.0;         // relative, uniform
  int micro = 0;              // the step's micro-batches (0: its time is the slowest stage's)
  // The wall passed to the balancer: none (it models the step from the busy times), or one its model only
  // approximates (the slowest stage plus the others' share of one micro-batch: the fill and drain are shorter
  // than the model's when the stages are unequal).
  bool wall = false;
  double step(const std::vector<double>& t) const {
    double sum = 0, mx = 0;
    for (double v : t) sum += v, mx = std::max(mx, v);
    if (wall) return micro <= 0 ? mx : mx + (sum - mx) / micro;
    return micro <= 0 ? mx : (sum + (micro - 1) * mx) / micro;
  }
  std::mt19937 rng{7};
  std::vector<double> times(const std::vector<int>& stage_of) {
    std::vector<double> t(speed.size(), 0.0);
    for (size_t i = 0; i < stage_of.size(); ++i)
      if (stage_of[i] >= 0) t[size_t(stage_of[i])] += truth[i];
    std::uniform_real_distribution<double> u(-noise, noise);
    for (size_t s = 0; s < t.size(); ++s) t[s] = (t[s] * speed[s] + (overhead.empty() ? 0.0 : overhead[s])) * (1.0 + u(rng));
    return t;
  }
  // The best slowest stage any cut reaches (the truth known): train/pipeline.h's cut on the true costs.
  double best(int stages) {
    std::vector<double> unit(truth.size());
    for (size_t i = 0; i < truth.size(); ++i) unit[i] = truth[i];
    auto split = split_pipeline(g, stages, "loss",
                                {.node_costs = unit, .every_narrow_point = false, .stage_speed = speed, .micro_batches = micro});
    EXPECT_TRUE(split.is_ok()) << split.status().to_string();
    noise = 0.0;
    return step(times(split->stage_of));
  }
};

Sim make_sim(int blocks, int stages) {
  Sim s;
  s.g = chain(blocks);
  for (const graph::Node& n : s.g.nodes())
    s.truth.push_back(graph::op_has(n.op, graph::kSource) ? 0.0 : 1e-6 * estimated_node_cost(s.g, n));
  s.speed.assign(size_t(stages), 1.0);
  return s;
}

// Runs `steps` steps from the estimated cut; the balancer's moves are made at once. Returns the last step's
// slowest stage (noise-free).
double run(Sim& sim, StageBalancer& b, int64_t from, int64_t steps, const std::function<void(int64_t)>& at = {}) {
  for (int64_t step = from; step < from + steps; ++step) {
    if (at) at(step);
    const std::vector<double> t = sim.times(b.stage_of());
    auto next = b.observe(step, t, sim.wall ? sim.step(t) : 0.0);
    EXPECT_TRUE(next.is_ok()) << next.status().to_string();
    if (next.is_ok() && next->has_value()) b.moved(0.0);
  }
  const double keep = sim.noise;
  sim.noise = 0.0;
  const std::vector<double> t = sim.times(b.stage_of());
  sim.noise = keep;
  return sim.step(t);
}

StageBalancer balancer(const Sim& sim, int stages, RebalanceOptions o = {}) {
  auto first = split_pipeline(sim.g, stages, "loss");
  EXPECT_TRUE(first.is_ok()) << first.status().to_string();
  auto b = StageBalancer::create(sim.g, "loss", first->stage_of, {}, sim.micro, o);
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return std::move(b).value();
}

// Balanced stages under ±10 % noise: 500 steps, not one move.
TEST(StageBalancer, NoiseAloneNeverMoves) {
  for (int stages : {2, 3, 4}) {
    Sim sim = make_sim(12, stages);
    sim.noise = 0.10;
    StageBalancer b = balancer(sim, stages);
    run(sim, b, 1, 500);
    EXPECT_EQ(b.moves().size(), 0u) << stages << " stages";
  }
}

// One device turns 2x slower at step 50: the balancer moves within 20 steps, reaches the best cut there is
// within 5 %, then stays (500 steps of ±5 % noise: no oscillation).
TEST(StageBalancer, ASlowDeviceGivesWorkAway) {
  for (int micro : {0, 4})
  for (int stages : {2, 3}) {
    SCOPED_TRACE(std::to_string(stages) + " stages, " + std::to_string(micro) + " micro-batches");
    Sim sim = make_sim(16, stages);
    sim.micro = micro;
    sim.noise = 0.05;
    StageBalancer b = balancer(sim, stages);
    const double balanced = run(sim, b, 1, 50);
    EXPECT_EQ(b.moves().size(), 0u);
    sim.speed.back() = 2.0;
    const double slowed = run(sim, b, 51, 20);
    ASSERT_GE(b.moves().size(), 1u);
    EXPECT_LE(b.moves()[0].step, 51 + 10);
    const double best = sim.best(stages);
    sim.noise = 0.05;
    const double settled = run(sim, b, 71, 500);
    EXPECT_LT(slowed, 1.05 * best);
    EXPECT_LT(settled, 1.05 * best);
    EXPECT_GT(2.0 * balanced, 1.2 * best);  // the slowdown was worth moving for
    EXPECT_LE(b.moves().size(), 3u);
    const StageMove& m = b.moves()[0];
    EXPECT_GT(m.predicted_gain(), 0.05);
    EXPECT_FALSE(std::isnan(m.measured_gain()));
    EXPECT_NEAR(m.measured_gain(), m.predicted_gain(), 0.1);  // the speed model holds for a slow device
    EXPECT_EQ(m.nodes_before.size(), size_t(stages));
    int moved = 0;
    for (int s = 0; s < stages; ++s) moved += std::abs(m.nodes_after[size_t(s)] - m.nodes_before[size_t(s)]);
    EXPECT_GT(moved, 0);
    // The slowdown goes away: the work comes back.
    sim.speed.back() = 1.0;
    const double recovered = run(sim, b, 571, 60);
    EXPECT_LT(recovered, 1.05 * sim.best(stages));
  }
}

// The estimate misjudges the later blocks (1.6x dearer than it thinks): speeds absorb the error, moves
// converge to within 10 % of the best cut, and do not oscillate.
TEST(StageBalancer, AMisjudgedEstimateConverges) {
  Sim sim = make_sim(16, 2);
  for (size_t i = sim.truth.size() / 2; i < sim.truth.size(); ++i) sim.truth[i] *= 1.6;
  sim.noise = 0.05;
  StageBalancer b = balancer(sim, 2);
  const double settled = run(sim, b, 1, 500);
  EXPECT_LT(settled, 1.10 * sim.best(2));
  EXPECT_GE(b.moves().size(), 1u);
  EXPECT_LE(b.moves().size(), 4u);
}

// Coarse pieces and a piece the estimate misjudges at the balance point (its product 4x dearer than
// thought): on either side of it the speeds blame the stage that holds it, so each side predicts the other
// better. The run may try the other side once, then stays: 500 noisy steps, at most two moves, ending within
// 10 % of the best cut. Then the last stage's device slows (the conditions change): it moves again.
TEST(StageBalancer, CoarsePiecesAndMisjudgedCostsDoNotSwing) {
  Sim sim = make_sim(4, 2);
  {
    auto first = split_pipeline(sim.g, 2, "loss");
    ASSERT_TRUE(first.is_ok());
    for (size_t i = 0; i < sim.truth.size(); ++i)  // the first product on stage 1
      if (first->stage_of[i] == 1 && sim.g.node(int32_t(i)).op == graph::OpKind::matmul) {
        sim.truth[i] *= 4.0;
        break;
      }
  }
  sim.noise = 0.05;
  StageBalancer b = balancer(sim, 2);
  run(sim, b, 1, 500);
  EXPECT_LE(b.moves().size(), 2u);
  // The best cut, by trying every one of them with the truth (noise off).
  auto finest = split_pipeline(sim.g, 0, "loss", {.node_costs = {}, .every_narrow_point = true});
  ASSERT_TRUE(finest.is_ok());
  double best = std::numeric_limits<double>::infinity();
  sim.noise = 0.0;
  for (int c = 1; c < int(finest->stages.size()); ++c) {
    std::vector<int> cut(finest->stage_of.size(), -1);
    for (size_t i = 0; i < cut.size(); ++i)
      if (finest->stage_of[i] >= 0) cut[i] = finest->stage_of[i] >= c ? 1 : 0;
    const std::vector<double> t = sim.times(cut);
    best = std::min(best, *std::max_element(t.begin(), t.end()));
  }
  const std::vector<double> at = sim.times(b.stage_of());
  EXPECT_LT(*std::max_element(at.begin(), at.end()), 1.10 * best);
  const size_t settled = b.moves().size();
  sim.noise = 0.05;
  sim.speed.back() = 3.0;
  run(sim, b, 501, 60);
  EXPECT_GT(b.moves().size(), settled);
}

// PipelineCut::micro_batches: with a stage 3x slower, the dearest stage is least when the fast stage takes
// 3/4 of the work; with 2 micro-batches the step (Σ t + (m - 1) max t) is shorter with more on the fast one,
// and the cut finds the least step among all cuts (checked by trying every one).
TEST(PipelineCut, MicroBatchesMinimiseTheStep) {
  const graph::Graph g = chain(20);
  auto finest = split_pipeline(g, 0, "loss", {.node_costs = {}, .every_narrow_point = true});
  ASSERT_TRUE(finest.is_ok());
  std::vector<double> cost(g.nodes().size(), 0.0);
  for (size_t i = 0; i < cost.size(); ++i)
    if (finest->stage_of[i] >= 0) cost[i] = estimated_node_cost(g, g.node(int32_t(i)));
  const std::vector<double> speed = {1.0, 3.0};
  auto times = [&](const std::vector<int>& stage_of) {
    std::vector<double> t(2, 0.0);
    for (size_t i = 0; i < cost.size(); ++i)
      if (stage_of[i] >= 0) t[size_t(stage_of[i])] += cost[i] * speed[size_t(stage_of[i])];
    return t;
  };
  for (int m : {1, 2, 4}) {
    SCOPED_TRACE(m);
    auto step = [&](const std::vector<int>& stage_of) {
      const std::vector<double> t = times(stage_of);
      return t[0] + t[1] + (m - 1) * std::max(t[0], t[1]);
    };
    auto minmax = split_pipeline(g, 2, "loss", {.node_costs = cost, .every_narrow_point = false, .stage_speed = speed});
    auto by_step = split_pipeline(
        g, 2, "loss", {.node_costs = cost, .every_narrow_point = false, .stage_speed = speed, .micro_batches = m});
    ASSERT_TRUE(minmax.is_ok() && by_step.is_ok());
    double best = std::numeric_limits<double>::infinity();
    for (int c = 1; c < int(finest->stages.size()); ++c) {
      std::vector<int> cut(cost.size(), -1);
      for (size_t i = 0; i < cut.size(); ++i)
        if (finest->stage_of[i] >= 0) cut[i] = finest->stage_of[i] >= c ? 1 : 0;
      best = std::min(best, step(cut));
    }
    EXPECT_NEAR(step(by_step->stage_of), best, 1e-9 * best);
    EXPECT_LE(step(by_step->stage_of), step(minmax->stage_of));
    if (m == 2) {
      EXPECT_LT(step(by_step->stage_of), step(minmax->stage_of));
    }
  }
}

// The step's time at the best 2-stage cut of the finest pieces, by trying every one (the truth known).
double best_of_every_cut(Sim& sim) {
  auto finest = split_pipeline(sim.g, 0, "loss", {.node_costs = {}, .every_narrow_point = true});
  EXPECT_TRUE(finest.is_ok());
  double best = std::numeric_limits<double>::infinity();
  const double keep = sim.noise;
  sim.noise = 0.0;
  for (int c = 1; c < int(finest->stages.size()); ++c) {
    std::vector<int> cut(finest->stage_of.size(), -1);
    for (size_t i = 0; i < cut.size(); ++i)
      if (finest->stage_of[i] >= 0) cut[i] = finest->stage_of[i] >= c ? 1 : 0;
    best = std::min(best, sim.step(sim.times(cut)));
  }
  sim.noise = keep;
  return best;
}

// NOTE [probe] in rebalance.cc. The estimate misjudges the later blocks (0.7x or 1.3x) and stage 0 pays a
// fixed time per step whatever it holds (the micro-batches' inputs, the loss), which the speed model reads as
// a slower device; then stage 1's device slows 2x. Without probes such runs stop 1-7 % short of the best cut
// (the model's next proposal predicted under min_gain, or measured and left); with them every run that moved
// ends within 3.5 % of the best cut, never worse than without, with a few moves more and none late (no
// swing), and a probe that measured slower than the cut it left is left at the next decision, one faster kept.
TEST(StageBalancer, AProbeTakesTheCutAPieceOver) {
  int helped = 0;
  for (bool wall : {false, true})
  for (int blocks : {6, 8, 12})
  for (int micro : {0, 4})
  for (double overhead : {0.0, 0.2, 0.4})
  for (double mis : {0.7, 1.0, 1.3}) {
    SCOPED_TRACE(std::to_string(blocks) + " blocks, " + std::to_string(micro) + " micro-batches, overhead " +
                 std::to_string(overhead) + ", misjudged " + std::to_string(mis) + (wall ? ", walls" : ""));
    double settled[2] = {0, 0}, best = 0;
    for (int probing = 0; probing < 2; ++probing) {
      Sim sim = make_sim(blocks, 2);
      for (size_t i = sim.truth.size() / 2; i < sim.truth.size(); ++i) sim.truth[i] *= mis;
      sim.micro = micro;
      sim.wall = wall;
      sim.noise = 0.02;
      sim.overhead = {0.0, 0.0};
      sim.overhead[0] = overhead * sim.times(split_pipeline(sim.g, 2, "loss")->stage_of)[0];
      StageBalancer b = balancer(sim, 2, {.probe_apart = probing ? 0.05 : 0.0});
      run(sim, b, 1, 50);
      const size_t before = b.moves().size();
      sim.speed.back() = 2.0;
      run(sim, b, 51, 200);
      const size_t by250 = b.moves().size();
      settled[probing] = run(sim, b, 251, 300);
      EXPECT_EQ(b.moves().size(), by250) << "moves late: a swing";
      if (!probing) continue;
      best = best_of_every_cut(sim);
      EXPECT_LE(b.moves().size() - before, 6u);
      int probes = 0;
      for (size_t i = 0; i < b.moves().size(); ++i) {
        const StageMove& m = b.moves()[i];
        if (!m.probe) continue;
        ++probes;
        ASSERT_FALSE(m.measured_s.empty());
        // measured_step_s is the first window's median, the decision a cooldown later reads a later one: equal
        // within the noise.
        const double ratio = m.measured_step_s / m.before_step_s;
        const bool left = i + 1 < b.moves().size() && b.moves()[i + 1].nodes_after == m.nodes_before &&
                          b.moves()[i + 1].step == m.step + 10;  // the next decision: a cooldown later
        if (ratio > 1.03 || ratio < 0.97) {
          EXPECT_EQ(left, ratio > 1.0) << "probe " << i << " measured " << ratio;
        }
      }
      if (b.moves().size() > before) {
        EXPECT_LE(settled[1], 1.035 * best) << "without probes " << settled[0] / best;
      }
      if (settled[0] > 1.01 * best && settled[1] <= 1.01 * best) ++helped;
    }
    EXPECT_LE(settled[1], 1.01 * settled[0]);
  }
  EXPECT_GE(helped, 5);
}

TEST(StageBalancer, RefusesWhatItCannotUse) {
  Sim sim = make_sim(4, 2);
  auto first = split_pipeline(sim.g, 2, "loss");
  ASSERT_TRUE(first.is_ok());
  EXPECT_EQ(StageBalancer::create(sim.g, "loss", first->stage_of, {}, 0, {.window = 0}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(StageBalancer::create(sim.g, "loss", first->stage_of, {}, 0, {.window = 5, .min_gain = 0.05, .cooldown = 2})
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(StageBalancer::create(sim.g, "loss", {0, 1}, {}, 0, {}).status().code(), Code::kInvalidArgument);
  const Status negative = StageBalancer::create(sim.g, "loss", first->stage_of, {}, 0, {.probe_apart = -0.1}).status();
  EXPECT_EQ(negative.message(), "rebalance: probe_apart: expected >= 0, found -0.100000");
  auto b = StageBalancer::create(sim.g, "loss", first->stage_of, {}, 0, {});
  ASSERT_TRUE(b.is_ok());
  const double three[] = {1.0, 1.0, 1.0};
  EXPECT_EQ(b->observe(1, three).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace aspen::train
