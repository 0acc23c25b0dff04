// The pipeline schedules: every pass once, in an order that respects the
// data dependencies, with the ideal bubble when stages are balanced.
#include "train/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "graph/builder.h"

namespace aspen::train {
namespace {

std::string text(const std::vector<PipeStep>& order) {
  std::string s;
  for (const PipeStep& p : order) s += (s.empty() ? "" : " ") + std::string(p.forward ? "F" : "B") + std::to_string(p.micro);
  return s;
}

TEST(PipelineSchedule, Orders) {
  auto g = pipeline_order(PipelineSchedule::gpipe, 2, 3);
  EXPECT_EQ(text(g[0]), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(text(g[1]), "F0 F1 F2 B0 B1 B2");
  auto o = pipeline_order(PipelineSchedule::one_f_one_b, 3, 4);
  EXPECT_EQ(text(o[0]), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(text(o[1]), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(text(o[2]), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(text(pipeline_order(PipelineSchedule::one_f_one_b, 4, 2)[0]), "F0 F1 B0 B1");  // fewer micro-batches than stages
  EXPECT_EQ(parse_pipeline_schedule("1f1b").value(), PipelineSchedule::one_f_one_b);
  EXPECT_EQ(parse_pipeline_schedule("zb").status().code(), Code::kInvalidArgument);
}

// Runs the orders with forward time f and backward time b per pass: a pass
// starts when its stage is free and its inputs exist (F on s after F on s-1;
// B on s after B on s+1 and its own F). Returns the makespan, or -1 on a
// deadlock; `in_flight` gets each stage's most forwards not yet backwarded.
double simulate(const std::vector<std::vector<PipeStep>>& order, int micro, double f, double b,
                std::vector<int>* in_flight) {
  const int p = int(order.size());
  std::vector<std::vector<double>> fdone(size_t(p), std::vector<double>(size_t(micro), -1)),
      bdone = fdone;
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> free_at(size_t(p), 0.0);
  in_flight->assign(size_t(p), 0);
  std::vector<int> live(size_t(p), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (next[size_t(s)] == order[size_t(s)].size()) continue;
      const PipeStep st = order[size_t(s)][next[size_t(s)]];
      double ready = free_at[size_t(s)];
      if (st.forward) {
        if (s > 0) {
          if (fdone[size_t(s - 1)][size_t(st.micro)] < 0) continue;
          ready = std::max(ready, fdone[size_t(s - 1)][size_t(st.micro)]);
        }
        fdone[size_t(s)][size_t(st.micro)] = free_at[size_t(s)] = ready + f;
        (*in_flight)[size_t(s)] = std::max((*in_flight)[size_t(s)], ++live[size_t(s)]);
      } else {
        if (fdone[size_t(s)][size_t(st.micro)] < 0) continue;
        if (s + 1 < p) {
          if (bdone[size_t(s + 1)][size_t(st.micro)] < 0) continue;
          ready = std::max(ready, bdone[size_t(s + 1)][size_t(st.micro)]);
        }
        bdone[size_t(s)][size_t(st.micro)] = free_at[size_t(s)] = ready + b;
        --live[size_t(s)];
      }
      ++next[size_t(s)];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s)
    if (next[size_t(s)] != order[size_t(s)].size()) return -1;
  return *std::max_element(free_at.begin(), free_at.end());
}

TEST(PipelineSchedule, EveryPassOnceNoDeadlockAndTheIdealBubble) {
  for (PipelineSchedule sch : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 4, 8, 16}) {
        SCOPED_TRACE(std::string(pipeline_schedule_name(sch)) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const auto order = pipeline_order(sch, p, m);
        ASSERT_EQ(int(order.size()), p);
        for (const auto& o : order) {
          ASSERT_EQ(int(o.size()), 2 * m);
          for (int k = 0; k < m; ++k) {
            EXPECT_EQ(std::count(o.begin(), o.end(), PipeStep{true, k}), 1);
            EXPECT_EQ(std::count(o.begin(), o.end(), PipeStep{false, k}), 1);
          }
        }
        std::vector<int> in_flight;
        const double f = 1.0, b = 3.0;  // a backward recomputes the forward
        const double makespan = simulate(order, m, f, b, &in_flight);
        ASSERT_GT(makespan, 0) << "deadlock";
        const double bubble = 1.0 - double(m) * (f + b) / makespan;
        EXPECT_NEAR(bubble, pipeline_bubble_theory(p, m), 1e-12);
        if (sch == PipelineSchedule::one_f_one_b)
          for (int s = 0; s < p; ++s) EXPECT_LE(in_flight[size_t(s)], std::min(m, p - s)) << "stage " << s;
        else
          EXPECT_EQ(in_flight[0], m);  // GPipe keeps every micro-batch's activations
      }
}


// NOTE [stashed activations]: a stage's forward program outputs the values its backward reads, the backward
// programs take them as inputs ("pipe.saved.<v>") and read nothing else of the forward part; with
// recompute_stages neither has them.
TEST(PipelinePrograms, BackwardsTakeTheForwardsSavedValues) {
  graph::Graph g;
  graph::Builder b(g);
  const graph::ValueId x = b.input("x", DType::f32, {4, 6});
  const graph::ValueId y = b.input("y", DType::f32, {4, 3});
  const graph::ValueId w1 = b.parameter("w1", DType::f32, {6, 5}), w2 = b.parameter("w2", DType::f32, {5, 3});
  const graph::ValueId h = b.tanh(b.matmul(x, w1));
  b.set_stage(1);
  const graph::ValueId d = b.sub(b.matmul(h, w2), y);
  b.output("loss", b.reduce_sum(b.mul(d, d), {0, 1}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "stash");
    ProgramOptions o;
    o.gradient_accumulation = 2;
    o.recompute_stages = recompute;
    auto p = build_pipeline_programs(g, 2, o);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    for (const PipelinePrograms::Stage& st : p->stages) {
      size_t outs = 0;
      for (const auto& [name, v] : p->graphs[size_t(st.forward)].outputs()) outs += name.starts_with(kPipeSavedPrefix);
      for (int prog : {st.backward_first, st.backward_next}) {
        size_t ins = 0;
        for (int32_t n : p->graphs[size_t(prog)].input_nodes())
          ins += p->graphs[size_t(prog)].node(n).name.starts_with(kPipeSavedPrefix);
        EXPECT_EQ(ins, outs);
        // No output of the backward comes from the forward part (the loss and the edges left with it).
        for (const auto& [name, v] : p->graphs[size_t(prog)].outputs())
          EXPECT_TRUE(name.starts_with(kPipeGradPrefix) || (recompute && name == "loss")) << name;
      }
      if (recompute) EXPECT_EQ(outs, 0u);
      else EXPECT_GT(outs, 0u);  // tanh's output (stage 0), the difference d (stage 1)
    }
  }
}

}  // namespace
}  // namespace aspen::train
