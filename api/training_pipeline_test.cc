// api/training_pipeline_test.cc: TrainingModel with pipeline stages: the stages train as one device
// accumulating the same micro-batches (schedules, replicas, half-precision optimizer state, stashed or
// recomputed activations), and where the cut falls (blocks, measured costs, stage tags).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "api/training_model.h"
#include "api/training_testing.h"
#include "kernels/convert.h"
#include "train/pipeline_balance.h"
#include "train/program.h"

namespace aspen::api {
namespace {

using namespace testing;  // NOLINT: the helpers of this test

// Up to four devices of one thread in one process (2 replicas x 2 stages, or 3 stages) need cores from the
// budget; CI machines have two, so this binary oversubscribes on purpose (before any team reserves its cores:
// the budget is sized at its first use).
const bool kCores = [] { return setenv("ASPEN_CORES", "8", 0) == 0; }();

// Pipeline stages (cut automatically between blocks; GPT-2's tied wte used by
// the first and the last stage) equal one device accumulating the same
// micro-batches, for both schedules: the stages' gradient contributions to a
// shared weight are added in another order, so f32 rounding, not bits.
TEST(Pipeline, StagesEqualOneDeviceWithAccumulation) {
  ASSERT_TRUE(kCores);
  const TrainingOptions sgd = sgd_momentum();
  for (const TrainingOptions& base : {sgd, dp_adamw()}) {
    const bool adam = base.optimizer.kind == train::OptimizerKind::adamw;
    Options one;
    one.threads(1).gradient_accumulation(4);
    std::vector<StepStats> s1;
    const auto w1 = train_weights(one, base, 4, 5, &s1);
    for (int stages : {2, 3})
      for (train::PipelineSchedule schedule : {train::PipelineSchedule::gpipe, train::PipelineSchedule::one_f_one_b}) {
        SCOPED_TRACE(std::string(adam ? "adamw, clipped" : "sgd") + ", " + std::to_string(stages) + " stages, " +
                     train::pipeline_schedule_name(schedule));
        TrainingOptions t = base;
        t.pipeline = {stages, schedule};
        std::vector<StepStats> sp;
        const auto wp = train_weights(one, t, 4, 5, &sp);
        ASSERT_FALSE(wp.empty());
        EXPECT_LT(max_rel_diff(wp, w1), adam ? 1e-4 : 1e-5);
        expect_steps_near(sp, s1, 1e-5, adam ? 1e-4 : 0.0);
      }
  }
}


// PopTorch's state types (moments in f16 and bf16) in the layouts of one process: pipeline stages and
// replicas keep the state in its types and train as one device does (replicas: the same bits; stages: up to the
// f32 order of additions that the half rounding then shows, an ulp of f16 in a moment); the state leaves a pipeline in its types and loads into
// one device. (Half gradients, accum_type, are not compared across layouts: where the rounding happens decides
// which of this model's tiny gradients underflow, which Adam's normalisation turns into 1e-2 of a weight;
// python/tests/test_poptorch.py checks them on one device.)
TEST(Pipeline, HalfPrecisionStateInEveryLayout) {
  ASSERT_TRUE(kCores);
  TrainingOptions base = dp_adamw();
  base.optimizer.first_order_dtype = DType::f16, base.optimizer.second_order_dtype = DType::bf16;
  Options one;
  one.threads(1).gradient_accumulation(4);
  std::unique_ptr<TrainingModel> m1;
  const auto w1 = train_weights(one, base, 4, 5, nullptr, 1, &m1);
  const auto f32_weights = train_weights(one, dp_adamw(), 4, 5);
  ASSERT_TRUE(m1);
  EXPECT_GT(max_rel_diff(w1, f32_weights), 1e-6);  // the types are not a no-op
  TrainingOptions piped = base;
  piped.pipeline = {2, train::PipelineSchedule::one_f_one_b};
  std::unique_ptr<TrainingModel> mp;
  const auto wp = train_weights(one, piped, 4, 5, nullptr, 1, &mp);
  ASSERT_FALSE(w1.empty() || wp.empty());
  ASSERT_TRUE(mp);
  // The bound: in each of the 5 steps a moment may land one ulp of its type away (f16 m: 2^-10 of it; bf16 v:
  // 2^-7, 2^-8 through the square root), which moves that step's update by as much of lr. The CI's AVX2 machine
  // measured 1.01e-4, this bound is 2.4e-4; f32 state stays within 1e-4 above.
  const double lr = base.schedule.lr, steps = 5;
  EXPECT_LT(max_rel_diff(wp, w1), steps * lr * (std::ldexp(1.0, -10) + std::ldexp(1.0, -8)));
  // Two replicas reduce what one device accumulating two micro-batches adds, in the same order: the same bits.
  Options one2, dp2;
  one2.threads(1).gradient_accumulation(2);
  dp2.threads(1).replication_factor(2);
  const auto w2 = train_weights(one2, base, 4, 5), wd = train_weights(dp2, base, 4, 5);
  ASSERT_FALSE(w2.empty() || wd.empty());
  EXPECT_TRUE(bitwise_equal(wd, w2)) << max_rel_diff(wd, w2);
  auto state = mp->copy_optimizer_state_to_host();
  ASSERT_TRUE(state.is_ok()) << state.status().to_string();
  for (const auto& [name, t] : *state)
    EXPECT_EQ(t.dtype(), name == train::kStepName ? DType::f32
                         : name.starts_with("optimizer.exp_avg_sq.") ? DType::bf16
                                                                      : DType::f16)
        << name;
  std::map<std::string, const Tensor*> in;
  for (const auto& [name, t] : *state) in[name] = &t;
  EXPECT_TRUE(m1->copy_optimizer_state_to_device(in).is_ok());
  // f32 state (a checkpoint of another run) loads converted to the half types.
  auto wide = std::move(m1->copy_optimizer_state_to_host()).value();
  std::map<std::string, Tensor> f32_state;
  for (const auto& [name, t] : wide) {
    Tensor w(DType::f32, t.shape());
    if (t.dtype() == DType::f32) std::memcpy(w.raw(), t.raw(), t.nbytes());
    else ASSERT_TRUE(kernels::widen_to_f32(t.dtype(), t.raw(), w.data<float>(), t.numel()).is_ok());
    f32_state.emplace(name, std::move(w));
  }
  in.clear();
  for (const auto& [name, t] : f32_state) in[name] = &t;
  ASSERT_TRUE(m1->copy_optimizer_state_to_device(in).is_ok());
  EXPECT_TRUE(bitwise_equal(std::move(m1->copy_optimizer_state_to_host()).value(), wide));
}

// NOTE [stashed activations]: each stage's backward takes the values its forward pass kept ("pipe.saved.*")
// instead of recomputing them: the same bits as recomputing (TrainingOptions::pipeline.recompute), under both
// schedules (train/pipeline_test.cc checks the programs).
TEST(Pipeline, StashedActivationsEqualRecomputingBitwise) {
  ASSERT_TRUE(kCores);
  Options one;
  one.threads(1).gradient_accumulation(4);
  for (train::PipelineSchedule schedule : {train::PipelineSchedule::gpipe, train::PipelineSchedule::one_f_one_b}) {
    SCOPED_TRACE(train::pipeline_schedule_name(schedule));
    TrainingOptions t = dp_adamw();
    t.pipeline = {3, schedule};
    std::vector<StepStats> s_stash, s_recompute;
    const auto stashed = train_weights(one, t, 4, 5, &s_stash);
    t.pipeline.recompute = true;
    const auto recomputed = train_weights(one, t, 4, 5, &s_recompute);
    ASSERT_FALSE(stashed.empty() || recomputed.empty());
    EXPECT_TRUE(bitwise_equal(stashed, recomputed)) << max_rel_diff(stashed, recomputed);
    ASSERT_EQ(s_stash.size(), s_recompute.size());
    for (size_t i = 0; i < s_stash.size(); ++i) EXPECT_EQ(s_stash[i].loss, s_recompute[i].loss) << i;
  }
}

// Data parallel x pipeline: 2 replicas of 2 stages (4 devices) with 2
// micro-batches each take the micro-batches one device accumulating 4 takes.
TEST(Pipeline, ReplicasOfAPipelineEqualOneDevice) {
  ASSERT_TRUE(kCores);
  const TrainingOptions sgd = sgd_momentum();
  for (const TrainingOptions& base : {sgd, dp_adamw()}) {
    const bool adam = base.optimizer.kind == train::OptimizerKind::adamw;
    SCOPED_TRACE(adam ? "adamw, clipped" : "sgd");
    Options one;
    one.threads(1).gradient_accumulation(4);
    std::vector<StepStats> s1, s2;
    const auto w1 = train_weights(one, base, 4, 5, &s1);
    TrainingOptions t = base;
    t.pipeline = {2, train::PipelineSchedule::one_f_one_b};
    Options dp;
    dp.threads(1).replication_factor(2).gradient_accumulation(2);
    const auto w2 = train_weights(dp, t, 4, 5, &s2);
    ASSERT_FALSE(w1.empty() || w2.empty());
    EXPECT_LT(max_rel_diff(w2, w1), adam ? 1e-4 : 1e-5);
    expect_steps_near(s2, s1, 1e-5);
  }
}

// The cut of gpt2-tiny: balanced stages joined by one activation each (the
// residual stream), the tied wte shared by the first and the last stage.
TEST(Pipeline, SplitsGpt2AtBlockBoundaries) {
  Forward f = forward("gpt2-tiny", 2, 7);
  for (int stages : {2, 3}) {
    auto pp = train::build_pipeline_programs(f.g, stages, {});
    ASSERT_TRUE(pp.is_ok()) << pp.status().to_string();
    EXPECT_EQ(int(pp->stages.size()), stages);
    EXPECT_EQ(int(pp->split.edges.size()), stages - 1);
    for (const train::PipelineEdge& e : pp->split.edges) {
      EXPECT_EQ(e.to, e.from + 1);
      EXPECT_EQ(e.type.shape.to_string(), "[2, 7, 48]");  // [B, T, C]
    }
    ASSERT_EQ(pp->shared.size(), 1u);
      EXPECT_EQ(pp->params[pp->shared[0].param], "transformer.wte.weight");
  }
  EXPECT_EQ(train::build_pipeline_programs(f.g, 100000, {}).status().subject(), "pipeline: stages");
}

// The cut follows the costs it is given: the finest cut has a piece per
// narrow point (gpt2-tiny: between and inside its blocks); costs that make
// the first piece dear move a 2-stage cut to its end; measured costs (every
// piece compiled and timed) cut where a valid cut can fall, and the stages
// still train as one device does.
TEST(Pipeline, CutBalancesGivenAndMeasuredCosts) {
  ASSERT_TRUE(kCores);
  Forward f = forward("gpt2-tiny", 1, 7);
  const int nodes = int(f.g.nodes().size());
  auto finest = train::split_pipeline(f.g, 0, "loss", {.node_costs = {}, .every_narrow_point = true});
  ASSERT_TRUE(finest.is_ok()) << finest.status().to_string();
  const int pieces = int(finest->stages.size());
  EXPECT_GE(pieces, 4);  // two blocks: at least attention | MLP | attention | MLP
  for (int i = 1, last = 0; i < nodes; ++i) {  // pieces are runs of nodes in order
    const int s = finest->stage_of[size_t(i)];
    if (s < 0) continue;
    EXPECT_GE(s, last) << "node " << i;
    last = s;
  }
  auto estimated = train::split_pipeline(f.g, 2, "loss");
  ASSERT_TRUE(estimated.is_ok());
  std::vector<double> costs(size_t(nodes), 1e-6);
  int first_piece_nodes = 0;
  for (int i = 0; i < nodes; ++i)
    if (finest->stage_of[size_t(i)] == 0) costs[size_t(i)] = 1.0, ++first_piece_nodes;
  auto dear_first = train::split_pipeline(f.g, 2, "loss", {.node_costs = costs, .every_narrow_point = false});
  ASSERT_TRUE(dear_first.is_ok()) << dear_first.status().to_string();
  int on_stage0 = 0, estimated_stage0 = 0;
  for (int i = 0; i < nodes; ++i) {
    on_stage0 += dear_first->stage_of[size_t(i)] == 0;
    estimated_stage0 += estimated->stage_of[size_t(i)] == 0;
  }
  EXPECT_EQ(on_stage0, first_piece_nodes);  // cut right after the dear piece
  EXPECT_NE(on_stage0, estimated_stage0);
  EXPECT_EQ(train::split_pipeline(f.g, 2, "loss", {.node_costs = {1.0}, .every_narrow_point = false}).status().code(),
            Code::kInvalidArgument);
  for (int i = 0; i < nodes; ++i)  // a compute node's (sources cost nothing)
    if (finest->stage_of[size_t(i)] >= 0) {
      costs[size_t(i)] = -1.0;
      break;
    }
  EXPECT_EQ(train::split_pipeline(f.g, 2, "loss", {.node_costs = costs, .every_narrow_point = false}).status().code(),
            Code::kInvalidArgument);

  // Measured: a piece's time per piece, spread over its nodes.
  train::ProgramOptions po;
  auto measured = train::measure_pipeline_costs(f.g, po, {}, 1, 2);
  ASSERT_TRUE(measured.is_ok()) << measured.status().to_string();
  ASSERT_EQ(int(measured->piece_s.size()), pieces);
  for (double t : measured->piece_s) EXPECT_GT(t, 0.0);
  double spread = 0.0, total = 0.0;
  for (double c : measured->node_costs) spread += c;
  for (double t : measured->piece_s) total += t;
  EXPECT_NEAR(spread, total, 1e-9 * total);
  // Trained with the measured cut: as one device (any valid cut computes the same).
  const TrainingOptions sgd = sgd_momentum();
  Options one;
  one.threads(1).gradient_accumulation(4);
  const auto w1 = train_weights(one, sgd, 4, 3);
  TrainingOptions t = sgd;
  t.pipeline = {2, train::PipelineSchedule::one_f_one_b, TrainingOptions::Balance::measured};
  std::unique_ptr<TrainingModel> m;
  const auto wp = train_weights(one, t, 4, 3, nullptr, 1, &m);
  ASSERT_FALSE(wp.empty());
  EXPECT_LT(max_rel_diff(wp, w1), 1e-5);
  EXPECT_EQ(int(m->pipeline_stage_of().size()), nodes);
}

// Where the cut falls changes no arithmetic (what lets stages be rebalanced while training, NOTE [moving
// stages]): every cut of gpt2-tiny into 2 and 3 stages that keeps the tied wte's two uses (the embedding, the
// lm_head) on different stages trains to the same bits, losses, norms and weights. (A cut with both on the
// first stage adds their gradients per micro-batch instead of per step: PipelineCut::keep_grouping rules it
// out, below.)
TEST(Pipeline, EveryCutComputesTheSameBits) {
  ASSERT_TRUE(kCores);
  const Golden gold = read_golden("gpt2-tiny");
  Forward f = forward("gpt2-tiny", 1, gold.T - 1);
  auto finest = train::split_pipeline(f.g, 0, "loss", {.node_costs = {}, .every_narrow_point = true});
  ASSERT_TRUE(finest.is_ok()) << finest.status().to_string();
  const int pieces = int(finest->stages.size());
  ASSERT_GE(pieces, 4);
  int lm_head_piece = -1;
  for (size_t i = 0; i < f.g.nodes().size(); ++i)
    if (f.g.node(int32_t(i)).scope == "lm_head" && lm_head_piece < 0) lm_head_piece = finest->stage_of[i];
  ASSERT_GT(lm_head_piece, 1);
  // The cut's constraint: with the last stage a thousand times slower, the cut would leave it only the loss
  // (the lm_head on stage 0, beside the embedding); keeping the estimated cut's grouping, the lm_head stays off
  // stage 0 (and the speeds move every block there).
  auto estimated = train::split_pipeline(f.g, 2, "loss");
  ASSERT_TRUE(estimated.is_ok()) << estimated.status().to_string();
  auto stage_of_lm_head = [&](const train::PipelineSplit& split) {
    for (size_t i = 0; i < f.g.nodes().size(); ++i)
      if (f.g.node(int32_t(i)).scope == "lm_head") return split.stage_of[i];
    return -1;
  };
  EXPECT_EQ(stage_of_lm_head(*estimated), 1);
  auto free_cut = train::split_pipeline(f.g, 2, "loss", {.node_costs = {}, .stage_speed = {1.0, 1e3}});
  ASSERT_TRUE(free_cut.is_ok()) << free_cut.status().to_string();
  EXPECT_EQ(stage_of_lm_head(*free_cut), 0);
  auto kept = train::split_pipeline(f.g, 2, "loss",
                                    {.node_costs = {}, .stage_speed = {1.0, 1e3}, .keep_grouping = estimated->stage_of});
  ASSERT_TRUE(kept.is_ok()) << kept.status().to_string();
  EXPECT_EQ(stage_of_lm_head(*kept), 1);
  for (size_t i = 0; i < f.g.nodes().size(); ++i)
    if (finest->stage_of[i] >= 0 && finest->stage_of[i] < lm_head_piece) {
      EXPECT_EQ(kept->stage_of[i], 0) << i;
    }
  // A fast last stage takes more than the estimated cut gave it.
  auto fast_last = train::split_pipeline(f.g, 2, "loss", {.node_costs = {}, .stage_speed = {1.0, 0.25}});
  ASSERT_TRUE(fast_last.is_ok());
  auto on_last = [](const train::PipelineSplit& s) { return std::count(s.stage_of.begin(), s.stage_of.end(), 1); };
  EXPECT_GT(on_last(*fast_last), on_last(*estimated));
  EXPECT_EQ(train::split_pipeline(f.g, 2, "loss", {.node_costs = {}, .stage_speed = {1.0}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(train::split_pipeline(f.g, 2, "loss", {.node_costs = {}, .stage_speed = {1.0, 0.0}}).status().code(),
            Code::kInvalidArgument);
  Options one;
  one.threads(1).gradient_accumulation(4);
  for (const TrainingOptions& base : {sgd_momentum(), dp_adamw()})
    for (int stages : {2, 3}) {
      std::vector<std::vector<int>> cuts;  // the first piece of each stage after the first
      for (int a = 1; a < lm_head_piece + 1; ++a)
        for (int b = a + 1; b <= (stages == 3 ? pieces - 1 : a + 1); ++b)
          cuts.push_back(stages == 3 ? std::vector<int>{a, b} : std::vector<int>{a});
      std::vector<StepStats> s0;
      std::map<std::string, Tensor> w0;
      for (const std::vector<int>& cut : cuts) {
        SCOPED_TRACE(std::to_string(stages) + " stages, cut before piece " + std::to_string(cut[0]) +
                     (stages == 3 ? " and " + std::to_string(cut[1]) : ""));
        TrainingOptions t = base;
        t.pipeline = {stages, train::PipelineSchedule::one_f_one_b};
        std::vector<StepStats> s;
        auto w = train_weights(one, t, 4, 4, &s, 1, nullptr, [&](graph::Graph& g) {
          for (size_t i = 0; i < finest->stage_of.size(); ++i) {
            const int piece = finest->stage_of[i];
            if (piece < 0) continue;
            int stage = 0;
            for (int c : cut) stage += piece >= c;
            g.mutable_node(int32_t(i)).stage = stage;
          }
        });
        ASSERT_FALSE(w.empty());
        if (w0.empty()) {
          w0 = std::move(w), s0 = s;
          continue;
        }
        EXPECT_TRUE(bitwise_equal(w, w0)) << max_rel_diff(w, w0);
        ASSERT_EQ(s.size(), s0.size());
        for (size_t k = 0; k < s.size(); ++k) {
          EXPECT_EQ(s[k].loss, s0[k].loss) << "step " << k + 1;
          EXPECT_EQ(s[k].grad_norm, s0[k].grad_norm) << "step " << k + 1;
        }
      }
    }
}

// Balance::dynamic with stage 1's device made 3x slower (NOTE [slowed device]): layers move to stage 0 while
// training, and the losses, gradient norms and weights are those of a run that never moved, bit for bit.
TEST(Pipeline, RebalancedWhileTrainingGivesTheSameBits) {
  ASSERT_TRUE(kCores);
  Options one;
  one.threads(1).gradient_accumulation(4);
  TrainingOptions t = dp_adamw();
  t.pipeline = {2, train::PipelineSchedule::one_f_one_b};
  const int64_t steps = 24;
  std::vector<StepStats> s0;
  const auto w0 = train_weights(one, t, 4, steps, &s0);
  t.pipeline.balance = TrainingOptions::Balance::dynamic;
  t.pipeline.rebalance = {.window = 3, .min_gain = 0.05, .cooldown = 4};
  ::setenv("ASPEN_TEST_SLOW_DEVICE", "1:2.0", 1);
  std::vector<StepStats> s1;
  std::unique_ptr<TrainingModel> m;
  const auto w1 = train_weights(one, t, 4, steps, &s1, 1, &m);
  ::unsetenv("ASPEN_TEST_SLOW_DEVICE");
  ASSERT_TRUE(m);
  ASSERT_FALSE(w0.empty() || w1.empty());
  ASSERT_GE(m->stage_moves().size(), 1u);
  const train::StageMove& move = m->stage_moves()[0];
  EXPECT_GT(move.nodes_after[0], move.nodes_before[0]);  // work left the slow stage
  EXPECT_GT(move.predicted_gain(), 0.05);
  EXPECT_GT(move.seconds, 0.0);
  const std::vector<int> cut = m->pipeline_stage_of();
  EXPECT_GT(std::count(cut.begin(), cut.end(), 0), std::count(cut.begin(), cut.end(), 1));
  EXPECT_TRUE(bitwise_equal(w1, w0)) << max_rel_diff(w1, w0);
  ASSERT_EQ(s1.size(), s0.size());
  for (size_t k = 0; k < s1.size(); ++k) {
    EXPECT_EQ(s1[k].loss, s0[k].loss) << "step " << k + 1;
    EXPECT_EQ(s1[k].grad_norm, s0[k].grad_norm) << "step " << k + 1;
    EXPECT_EQ(s1[k].stage_busy_s.size(), 2u);
  }
  // Refused where it cannot move, before anything is compiled: a model with stage tags. (An MPI job is refused
  // the same way, by the same check of Options::mpi.)
  Forward f = forward("gpt2-tiny", 1, 8);
  f.g.mutable_node(f.g.input_nodes()[0] + 3).stage = 0;
  const Status tagged = TrainingModel::create(f.g, one, t).status();
  EXPECT_EQ(tagged.code(), Code::kInvalidArgument);
  EXPECT_NE(tagged.message().find("parallel.balance: dynamic"), std::string::npos) << tagged.to_string();
  EXPECT_NE(tagged.message().find("stage tags"), std::string::npos) << tagged.to_string();
}

// A model with stage tags is cut where the tags say; a tag that sends a value
// back to an earlier stage is refused, naming the nodes.
TEST(Pipeline, StageTagsDecideTheCut) {
  graph::Graph g;
  graph::Builder b(g);
  b.set_stage(0);
  const graph::ValueId x = b.input("x", DType::f32, {3, 4});
  const graph::ValueId h = b.tanh(b.op1(graph::OpKind::matmul, {x, b.parameter("w0", DType::f32, {4, 4})}));
  b.set_stage(1);
  const graph::ValueId y = b.tanh(b.op1(graph::OpKind::matmul, {h, b.parameter("w1", DType::f32, {4, 4})}));
  b.output("loss", b.reduce_sum(b.mul(y, y), {0, 1}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto split = train::split_pipeline(g, 2, "loss");
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  ASSERT_EQ(split->edges.size(), 1u);
  EXPECT_TRUE(split->stages[0].forward.find_parameter("w0").has_value());
  EXPECT_FALSE(split->stages[0].forward.find_parameter("w1").has_value());
  EXPECT_TRUE(split->stages[1].forward.find_parameter("w1").has_value());
  g.mutable_node(g.value(h).producer).stage = 1;  // tanh on stage 1, its input on 0: fine
  EXPECT_TRUE(train::split_pipeline(g, 2, "loss").is_ok());
  g.mutable_node(g.value(y).producer).stage = 0;  // y's tanh back on stage 0, its matmul on 1
  auto bad = train::split_pipeline(g, 2, "loss");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("inputs from its own or earlier stages"), std::string::npos)
      << bad.status().to_string();
  EXPECT_EQ(train::split_pipeline(g, 3, "loss").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace aspen::api
