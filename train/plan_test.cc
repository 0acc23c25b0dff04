#include "train/plan.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace aspen::train {
namespace {

using parallel::Compression;
using parallel::MeshShape;

// A small model's spec for a layout: six parameters (the first tied between
// the first and last stage, as GPT-2's wte), edges between consecutive
// stages plus a skip edge and an integer edge when there are three stages,
// optimizer shards as the step programs make them.
struct Layout {
  std::string name = {};
  MeshShape mesh = {};
  int processes = 1;
  int micro = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  bool fused = false;
  bool zero = false;
  bool overlap = false;
  Compression compression = Compression::none;
  bool needs_norm = true;
};

PlanSpec spec_for(const Layout& l) {
  PlanSpec s;
  s.mesh = l.mesh;
  s.processes = l.processes;
  s.fused = l.fused;
  s.micro_batches = l.micro;
  s.schedule = l.schedule;
  s.shard_optimizer_state = l.zero;
  s.overlap = l.overlap;
  s.compression = l.compression;
  s.bucket_bytes = 2000;  // 500 elements: the embedding alone, the rest packed
  s.needs_norm = l.needs_norm;
  const int S = l.mesh.pipe, last = S - 1, mid = S > 2 ? 1 : last;
  auto stages = [](std::vector<int> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  s.params = {
      {.name = "wte", .elements = 1000, .owner = 0, .stages = stages({0, last}), .whole_on_shards = false},
      {.name = "h0.attn", .elements = 300, .owner = 0, .stages = {0}, .whole_on_shards = false},
      {.name = "h0.ln", .elements = 10, .owner = 0, .stages = {0}, .whole_on_shards = true},
      {.name = "h1.attn", .elements = 300, .owner = mid, .stages = {mid}, .whole_on_shards = false},
      {.name = "h1.ln", .elements = 10, .owner = mid, .stages = {mid}, .whole_on_shards = true},
      {.name = "ln_f", .elements = 10, .owner = last, .stages = {last}, .whole_on_shards = true},
  };
  if (S > 1) {
    for (int st = 0; st + 1 < S; ++st) s.edges.push_back({.from = st, .to = st + 1, .differentiable = true, .bytes = 4096});
    if (S > 2) {
      s.edges.push_back({.from = 0, .to = 2, .differentiable = true, .bytes = 4096});  // a skip connection
      s.edges.push_back({.from = 0, .to = 2, .differentiable = false, .bytes = 64});   // integer ids
    }
    s.accumulators.resize(size_t(S));
    for (size_t i = 0; i < s.params.size(); ++i)
      for (int st : s.params[i].stages) s.accumulators[size_t(st)].push_back(int(i));
  } else if (!l.fused) {
    // One shard per local replica (every replica of the job with ZeRO-1; one with tensor shards).
    const int local = l.mesh.data / l.processes;
    const int shards = l.mesh.tensor > 1 ? 1 : l.zero ? l.mesh.data : local;
    const int n = int(s.params.size());
    for (int k = 0; k < shards; ++k) s.shards.push_back({.begin = k * n / shards, .end = (k + 1) * n / shards});
  }
  return s;
}

const MeshShape kOne = {.data = 1, .pipe = 1, .tensor = 1};
MeshShape mesh(int data, int pipe, int tensor) { return {.data = data, .pipe = pipe, .tensor = tensor}; }

// Every layout combination the runtime supports (api/training_model.h).
std::vector<Layout> layouts() {
  using PS = PipelineSchedule;
  return {
      {.name = "fused", .mesh = kOne, .fused = true, .needs_norm = false},
      {.name = "accumulation", .mesh = kOne, .micro = 3},
      {.name = "dp2", .mesh = mesh(2, 1, 1), .micro = 2},
      {.name = "dp2_overlap", .mesh = mesh(2, 1, 1), .micro = 2, .overlap = true, .needs_norm = false},
      {.name = "dp4_2proc", .mesh = mesh(4, 1, 1), .processes = 2},
      {.name = "dp4_2proc_zero1", .mesh = mesh(4, 1, 1), .processes = 2, .zero = true},
      {.name = "dp2_2proc_topk", .mesh = mesh(2, 1, 1), .processes = 2, .overlap = true, .compression = Compression::topk},
      {.name = "dp2_2proc_bf16_overlap", .mesh = mesh(2, 1, 1), .processes = 2, .micro = 2, .overlap = true,
       .compression = Compression::bf16},
      {.name = "tp2", .mesh = mesh(1, 1, 2)},
      {.name = "dp2_tp2", .mesh = mesh(2, 1, 2), .micro = 2},
      {.name = "tp2_across", .mesh = mesh(1, 1, 2), .processes = 2},
      {.name = "pp2_gpipe", .mesh = mesh(1, 2, 1), .micro = 4, .schedule = PS::gpipe},
      {.name = "pp2_1f1b", .mesh = mesh(1, 2, 1), .micro = 4},
      {.name = "pp3_1f1b_skip", .mesh = mesh(1, 3, 1), .micro = 4},
      {.name = "dp2_pp2_overlap", .mesh = mesh(2, 2, 1), .micro = 2, .overlap = true},
      {.name = "pp2_tp2", .mesh = mesh(1, 2, 2), .micro = 2},
      {.name = "dp2_pp2_tp2", .mesh = mesh(2, 2, 2), .micro = 2},
      {.name = "dp4_pp2_2proc", .mesh = mesh(4, 2, 1), .processes = 2, .micro = 2},
      {.name = "pp2_across", .mesh = mesh(1, 2, 1), .processes = 2, .micro = 3},
      {.name = "dp2_pp2_across", .mesh = mesh(2, 2, 1), .processes = 4, .micro = 2},
      {.name = "pp2_tp2_across", .mesh = mesh(1, 2, 2), .processes = 4, .micro = 2},
  };
}

const std::string kPlans = ASPEN_PLANS_DIR;

TEST(Plan, GoldenPlansForEveryLayout) {
  // ASPEN_UPDATE_GOLDEN=1 rewrites the files (then review the diff).
  const bool update = std::getenv("ASPEN_UPDATE_GOLDEN") != nullptr;
  for (const Layout& l : layouts()) {
    SCOPED_TRACE(l.name);
    Result<Plan> plan = make_plan(spec_for(l));
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    const Status ok = check_plan(*plan);
    EXPECT_TRUE(ok.is_ok()) << ok.to_string();
    const std::string text = plan_text(*plan);
    const std::string path = kPlans + "/" + l.name + ".txt";
    if (update) {
      std::ofstream(path) << text;
      continue;
    }
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << "no golden plan " << path << " (ASPEN_UPDATE_GOLDEN=1 writes it)";
    std::stringstream want;
    want << in.rdbuf();
    EXPECT_EQ(text, want.str()) << "the plan of " << l.name << " changed (ASPEN_UPDATE_GOLDEN=1 rewrites it)";
  }
}

// Each stage's passes follow the schedule's order (train/pipeline.h), on every replica and shard.
TEST(Plan, PipelinePassesFollowTheSchedule) {
  for (const Layout& l : layouts()) {
    if (l.mesh.pipe == 1) continue;
    SCOPED_TRACE(l.name);
    Result<Plan> plan = make_plan(spec_for(l));
    ASSERT_TRUE(plan.is_ok());
    const auto order = pipeline_order(l.schedule, l.mesh.pipe, l.micro);
    for (const DevicePlan& d : plan->devices) {
      std::vector<PipeStep> got;
      for (const Instr& i : d.instrs)
        if (i.kind == InstrKind::forward || i.kind == InstrKind::backward)
          got.push_back({.forward = i.kind == InstrKind::forward, .micro = i.micro});
      EXPECT_EQ(got, order[size_t(d.coord.pipe)]) << "device " << d.rank;
    }
  }
}

// A balanced pipeline's simulated bubble is the schedule's ideal (p - 1) / (m + p - 1).
TEST(Plan, SimulatedBubbleIsTheIdeal) {
  for (PipelineSchedule sched : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (auto [p, m] : {std::pair{2, 4}, {3, 5}, {4, 8}, {4, 1}}) {
      Layout l{.name = "b", .mesh = mesh(1, p, 1), .micro = m, .schedule = sched};
      Result<Plan> plan = make_plan(spec_for(l));
      ASSERT_TRUE(plan.is_ok());
      Result<SimResult> sim = simulate_plan(*plan, {.forward = 1.0, .backward = 2.0});
      ASSERT_TRUE(sim.is_ok()) << sim.status().to_string();
      EXPECT_NEAR(sim->bubble(), pipeline_bubble_theory(p, m), 1e-12)
          << pipeline_schedule_name(sched) << " p " << p << " m " << m;
      EXPECT_DOUBLE_EQ(sim->makespan, 3.0 * (m + p - 1));
    }
  // Without stages there is no bubble.
  Result<Plan> dp = make_plan(spec_for({.name = "dp", .mesh = mesh(2, 1, 2), .micro = 3}));
  ASSERT_TRUE(dp.is_ok());
  EXPECT_EQ(simulate_plan(*dp)->bubble(), 0.0);
}

Plan pp3() { return make_plan(spec_for({.name = "pp3", .mesh = mesh(1, 3, 1), .micro = 2})).value(); }

size_t find(const DevicePlan& d, InstrKind kind, int skip = 0) {
  for (size_t k = 0; k < d.instrs.size(); ++k)
    if (d.instrs[k].kind == kind && skip-- == 0) return k;
  ADD_FAILURE() << "no " << instr_kind_name(kind);
  return 0;
}

TEST(Plan, CheckFindsAMissingRecv) {
  Plan p = pp3();
  auto& list = p.devices[1].instrs;
  list.erase(list.begin() + std::ptrdiff_t(find(p.devices[1], InstrKind::recv)));
  const Status s = check_plan(p);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("a send nobody receives"), std::string::npos) << s.to_string();
}

TEST(Plan, CheckFindsCollectivesOutOfOrder) {
  Plan p = make_plan(spec_for({.name = "dp2_tp2", .mesh = mesh(2, 1, 2), .micro = 2})).value();
  // Devices 0 and 3 reduce over the data axis before summing over the tensor axis, 1 and 2 the other way:
  // 0 waits for 2, 2 for 3, 3 for 1 and 1 for 0.
  for (int d : {0, 3}) {
    auto& list = p.devices[size_t(d)].instrs;
    const size_t a = find(p.devices[size_t(d)], InstrKind::tensor_sum), b = find(p.devices[size_t(d)], InstrKind::reduce);
    std::swap(list[a], list[b]);
  }
  const Status s = check_plan(p);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("deadlock"), std::string::npos) << s.to_string();
  // Different arguments in one group: named as such.
  Plan q = make_plan(spec_for({.name = "dp2", .mesh = mesh(2, 1, 1), .micro = 1})).value();
  q.devices[1].instrs[size_t(find(q.devices[1], InstrKind::reduce))].params.pop_back();
  const Status t = check_plan(q);
  EXPECT_FALSE(t.is_ok());
  EXPECT_NE(t.message().find("collective 0 of the group [0,1] on device 1"), std::string::npos) << t.to_string();
}

TEST(Plan, SimulationRefusesDevicesOutsideThePlan) {
  Plan p = pp3();
  p.devices[0].instrs[size_t(find(p.devices[0], InstrKind::send))].peer = 99;
  const Result<SimResult> s = simulate_plan(p);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("peer 99"), std::string::npos) << s.status().to_string();
  Plan q = make_plan(spec_for({.name = "dp2", .mesh = mesh(2, 1, 1), .micro = 1})).value();
  q.devices[1].instrs[size_t(find(q.devices[1], InstrKind::reduce))].group = {0, 5};
  const Status t = check_plan(q);
  EXPECT_FALSE(t.is_ok());
  EXPECT_FALSE(simulate_plan(q).is_ok());
}

TEST(Plan, CheckFindsPassesTwiceOrMissing) {
  Plan p = pp3();
  auto& list = p.devices[2].instrs;
  list.insert(list.begin() + std::ptrdiff_t(find(p.devices[2], InstrKind::backward)),
              list[find(p.devices[2], InstrKind::backward)]);
  const Status s = check_plan(p);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("one forward and one backward"), std::string::npos) << s.to_string();
}

TEST(Plan, CheckFindsADeadlock) {
  // Stage 1 waits for micro-batch 1's activation before it gives micro-batch 0's gradient back,
  // while stage 0 (1F1B) waits for that gradient before sending micro-batch 1: a cycle.
  Plan p = make_plan(spec_for({.name = "pp2", .mesh = mesh(1, 2, 1), .micro = 2,
                               .schedule = PipelineSchedule::one_f_one_b}))
               .value();
  // Stage 0 of 1F1B with 2 stages: forward 0, forward 1, ...; make it send micro-batch 1 only after backward 0.
  auto& s0 = p.devices[0].instrs;
  std::vector<Instr> moved;
  for (size_t k = 0; k < s0.size();)
    if (s0[k].kind == InstrKind::send && s0[k].micro == 1 && s0[k].payload == Payload::activation) {
      moved.push_back(s0[k]);
      s0.erase(s0.begin() + std::ptrdiff_t(k));
    } else {
      ++k;
    }
  ASSERT_FALSE(moved.empty());
  s0.insert(s0.begin() + std::ptrdiff_t(find(p.devices[0], InstrKind::backward) + 1), moved.begin(), moved.end());
  // Stage 1 takes micro-batch 1 before running micro-batch 0's backward.
  auto& s1 = p.devices[1].instrs;
  const size_t b0 = find(p.devices[1], InstrKind::backward);
  const size_t f1 = find(p.devices[1], InstrKind::forward, 1);
  ASSERT_GT(f1, b0);
  std::vector<Instr> recv1;
  for (size_t k = b0; k < f1; ++k)
    if (s1[k].kind == InstrKind::recv && s1[k].micro == 1) recv1.push_back(s1[k]);
  for (size_t k = f1; k-- > b0;)
    if (s1[k].kind == InstrKind::recv && s1[k].micro == 1) s1.erase(s1.begin() + std::ptrdiff_t(k));
  s1.insert(s1.begin() + std::ptrdiff_t(b0), recv1.begin(), recv1.end());
  const Status s = check_plan(p);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("deadlock"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("device 1 at recv activation e0 m1 <- 0"), std::string::npos) << s.to_string();
}

TEST(Plan, RefusesSpecsThatDescribeNoLayout) {
  PlanSpec s = spec_for({.name = "pp2", .mesh = mesh(1, 2, 1), .micro = 2});
  s.edges[0].to = 5;
  Result<Plan> p = make_plan(s);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("edges[0]"), std::string::npos) << p.status().to_string();

  s = spec_for({.name = "dp2", .mesh = mesh(2, 1, 1)});
  s.shards.pop_back();
  p = make_plan(s);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("shards"), std::string::npos) << p.status().to_string();

  s = spec_for({.name = "dp3", .mesh = mesh(3, 1, 1)});
  s.processes = 2;  // three replicas fit neither two processes' whole replicas nor the model across them
  p = make_plan(s);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("plan spec: mesh"), std::string::npos) << p.status().to_string();

  s = spec_for({.name = "zero_pp", .mesh = mesh(2, 2, 1), .processes = 2});
  s.shard_optimizer_state = true;
  p = make_plan(s);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), Code::kUnimplemented);
}

TEST(Plan, BucketsPackAsTheDataParallelGroupDoes) {
  const std::vector<int64_t> counts = {100, 600, 200, 200, 200, 0, 50};
  // 500 elements a bucket; the 600 alone in place.
  const std::vector<parallel::Bucket> b = parallel::pack_buckets(counts, 2000, true);
  const std::vector<parallel::Bucket> want = {
      {.first = 0, .end = 1, .elements = 100, .in_place = false},
      {.first = 1, .end = 2, .elements = 600, .in_place = true},
      {.first = 2, .end = 4, .elements = 400, .in_place = false},
      {.first = 4, .end = 7, .elements = 250, .in_place = false},
  };
  EXPECT_EQ(b, want);
  // Without large_alone (compressed buckets) the 600 shares no bucket but is copied.
  const std::vector<parallel::Bucket> c = parallel::pack_buckets(counts, 2000, false);
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[1], (parallel::Bucket{.first = 1, .end = 2, .elements = 600, .in_place = false}));
}

}  // namespace
}  // namespace aspen::train
