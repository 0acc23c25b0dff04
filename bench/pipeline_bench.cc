#include "bench/pipeline_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "api/training_model.h"
#include "bench/common.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "graph/builder.h"

namespace aspen::bench {

namespace {

// stages x blocks residual tanh blocks, each stage's tagged; loss = mean of h².
graph::Graph uniform_model(int stages, const PipelineBenchOptions& o) {
  graph::Graph g;
  graph::Builder b(g);
  b.set_stage(0);
  graph::ValueId h = b.input("x", DType::f32, {o.rows, o.width});
  for (int s = 0; s < stages; ++s) {
    b.set_stage(s);
    for (int64_t k = 0; k < o.blocks; ++k) {
      const graph::ValueId w = b.parameter(fmt::format("s{}.b{}.weight", s, k), DType::f32, {o.width, o.width});
      h = b.add(h, b.tanh(b.op1(graph::OpKind::matmul, {h, w})));
    }
  }
  b.output("loss", b.scale(b.reduce_sum(b.mul(h, h), {0, 1}), 1.0 / double(o.rows * o.width)));
  return g;
}

// Every weight normal(0, 0.5 / sqrt(fan_in)): activations stay of order 1 through the blocks.
Status random_weights(api::TrainingModel& model, double fan_in) {
  std::map<std::string, Tensor> weights;
  uint64_t stream = 0;
  for (const auto& [name, type] : model.weight_types()) {
    Tensor w(type.first, type.second);
    philox_fill_normal(w.span<float>(), 99, stream++, 0, 0.0f, float(0.5 / std::sqrt(fan_in)));
    weights.emplace(name, std::move(w));
  }
  std::map<std::string, const Tensor*> ptrs;
  for (const auto& [name, w] : weights) ptrs.emplace(name, &w);
  return model.copy_weights_to_device(ptrs);
}

struct Measured {
  double bubble = 0, step_s = 0;
  Spread step;  // over the timed steps
};

Result<Measured> measure(int stages, int micro, train::PipelineSchedule schedule, const PipelineBenchOptions& o) {
  const graph::Graph g = uniform_model(stages, o);
  api::Options opts;
  opts.threads(1).gradient_accumulation(micro);
  api::TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::sgd;
  t.optimizer.weight_decay = 0.0;
  t.schedule.lr = 1e-3;
  t.pipeline = {stages, schedule};
  ASPEN_ASSIGN_OR_RETURN(auto model, api::TrainingModel::create(g, opts, t));
  ASPEN_RETURN_IF_ERROR(random_weights(*model, double(o.width)));
  Tensor x(DType::f32, {int64_t(micro) * o.rows, o.width});
  philox_fill_normal(x.span<float>(), 7, 0, 0, 0.0f, 1.0f);
  std::vector<double> bubbles, walls;
  for (int64_t i = 0; i <= o.steps; ++i) {
    ASPEN_RETURN_IF_ERROR(model->run({{"x", &x}}).status());
    if (i == 0) continue;  // warm-up
    bubbles.push_back(model->last_pipeline_stats().bubble());
    walls.push_back(model->last_pipeline_stats().wall_s);
  }
  std::sort(bubbles.begin(), bubbles.end());
  const Spread step = spread_of(walls);
  return Measured{bubbles[bubbles.size() / 2], step.median, step};
}

// `attention_blocks` blocks h = h + attention(p, p, p), p = h · P (causal,
// heads x head_dim = C) then as many h = h + tanh(h · W), P and W [C, C]; x
// is [seq, C]; no stage tags. The estimate sees the same matmul in every
// block and misses attention's T² work. Loss = mean of h².
Result<graph::Graph> mixed_model(const PipelineBenchOptions& o) {
  graph::Graph g;
  graph::Builder b(g);
  const int64_t T = o.seq, H = o.heads, D = o.head_dim, C = H * D;
  graph::ValueId h = b.input("x", DType::f32, {T, C});
  for (int64_t k = 0; k < o.attention_blocks; ++k) {
    const graph::ValueId wp = b.parameter(fmt::format("att{}.proj", k), DType::f32, {C, C});
    const graph::ValueId p = b.op1(graph::OpKind::matmul, {h, wp});                 // a projection, as q, k and v
    const graph::ValueId q = b.transpose(b.reshape(p, {1, T, H, D}), {0, 2, 1, 3});  // [1, H, T, D]
    graph::Attrs a;
    a.set("scale", 1.0 / std::sqrt(double(D)));
    a.set("mask", std::string("causal"));
    const graph::ValueId att = b.op(graph::OpKind::attention, {q, q, q}, std::move(a))[0];
    h = b.add(h, b.reshape(b.transpose(att, {0, 2, 1, 3}), {T, C}));
  }
  for (int64_t k = 0; k < o.attention_blocks; ++k) {
    const graph::ValueId w = b.parameter(fmt::format("mm{}.weight", k), DType::f32, {C, C});
    h = b.add(h, b.tanh(b.op1(graph::OpKind::matmul, {h, w})));
  }
  b.output("loss", b.scale(b.reduce_sum(b.mul(h, h), {0, 1}), 1.0 / double(T * C)));
  ASPEN_RETURN_IF_ERROR(b.status());
  return g;
}

struct Balanced {
  std::vector<double> busy_s;
  double step_s = 0, imbalance = 0;
  int stage0_nodes = 0;
  Spread step;
};

Result<Balanced> measure_balance(api::TrainingOptions::Balance balance, const PipelineBenchOptions& o) {
  ASPEN_ASSIGN_OR_RETURN(const graph::Graph g, mixed_model(o));
  const int micro = 4;
  api::Options opts;
  opts.threads(1).gradient_accumulation(micro);
  api::TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::sgd;
  t.optimizer.weight_decay = 0.0;
  t.schedule.lr = 1e-4;
  t.pipeline = {2, train::PipelineSchedule::one_f_one_b, balance};
  ASPEN_ASSIGN_OR_RETURN(auto model, api::TrainingModel::create(g, opts, t));
  ASPEN_RETURN_IF_ERROR(random_weights(*model, double(o.heads * o.head_dim)));
  Tensor x(DType::f32, {int64_t(micro) * o.seq, o.heads * o.head_dim});
  philox_fill_normal(x.span<float>(), 7, 0, 0, 0.0f, 1.0f);
  std::vector<double> walls;
  std::vector<std::vector<double>> busy;
  for (int64_t i = 0; i <= o.steps; ++i) {
    ASPEN_RETURN_IF_ERROR(model->run({{"x", &x}}).status());
    if (i == 0) continue;
    walls.push_back(model->last_pipeline_stats().wall_s);
    busy.push_back(model->last_pipeline_stats().busy_s);
  }
  std::vector<size_t> order(walls.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t c) { return walls[a] < walls[c]; });
  const size_t med = order[order.size() / 2];
  Balanced r;
  r.busy_s = busy[med];
  r.step_s = walls[med];
  r.step = spread_of(walls);
  double mx = 0, sum = 0;
  for (double v : r.busy_s) mx = std::max(mx, v), sum += v;
  r.imbalance = sum > 0 ? mx / (sum / double(r.busy_s.size())) : 0;
  for (int st : model->pipeline_stage_of()) r.stage0_nodes += st == 0;
  return r;
}

}  // namespace

Status run_pipeline_bench(const PipelineBenchOptions& opt, std::ostream& out) {
  PipelineBenchOptions o = opt;
  if (o.quick) o.width = 64, o.rows = 8, o.blocks = 1, o.steps = 1, o.seq = 32, o.heads = 2, o.head_dim = 8;
  if (o.steps < 1) return Status::invalid_argument("bench pipeline: steps", ">= 1", std::to_string(o.steps));
  // One thread per stage: a process needs as many cores in its budget as the
  // most stages measured. The budget is sized at first use, so oversubscribe
  // (ASPEN_CORES) before anything reserves a team; the table marks such rows.
  const int online = int(std::max(1u, std::thread::hardware_concurrency()));
  const int most = *std::max_element(o.stages.begin(), o.stages.end());
  if (most > online && !std::getenv("ASPEN_CORES")) setenv("ASPEN_CORES", std::to_string(most).c_str(), 0);
  const int cores = online;
  if (!o.json) {
    out << fmt::format(
        "# {} stages x {} blocks of [{}, {}] x [{}, {}] (tanh, residual), one thread per stage, SGD; bubble = 1 - "
        "mean(stage busy) / wall, median of {} steps after 1 warm-up; theory (p-1)/(m+p-1); {} cores\n",
        "p", o.blocks, o.rows, o.width, o.width, o.width, o.steps, cores);
    out << fmt::format("{:>6} {:>6} {:>9} | {:>8} {:>8} {:>7} | {:>8}\n", "stages", "micro", "schedule", "bubble",
                       "theory", "diff", "step ms");
  }
  // The ceiling: the FMA peak of as many threads as stages (the stages' matmuls are compute-bound); --quick
  // measures none.
  auto peak = [&](int threads) -> std::function<double()> {
    if (o.quick) return nullptr;
    return [threads, cores] { return measure_f32_fma_peak(std::min(threads, cores)); };
  };
  for (int p : o.stages)
    for (int m : o.micro)
      for (train::PipelineSchedule sch : {train::PipelineSchedule::gpipe, train::PipelineSchedule::one_f_one_b}) {
        // NOTE [guarded rows]: the stages' FMA peak (one thread per stage) before and after the row; a moved
        // ceiling measures the row once more, then marks it.
        Measured r;
        Guard guard;
        ASPEN_RETURN_IF_ERROR(guarded(
            [&]() -> Status {
              ASPEN_ASSIGN_OR_RETURN(r, measure(p, m, sch, o));
              return Status();
            },
            peak(p), &guard));
        const double theory = train::pipeline_bubble_theory(p, m);
        if (o.json) {
          nlohmann::ordered_json j = {{"bench", "pipeline"}, {"stages", p},        {"microbatches", m},
                                      {"schedule", train::pipeline_schedule_name(sch)}, {"bubble", r.bubble},
                                      {"theory", theory},   {"step_s", r.step_s}, {"cores", cores},
                                      {"step", spread_json(r.step)}};
          add_guard_fields(j, guard);
          out << j.dump() << "\n";
        } else {
          out << fmt::format("{:>6} {:>6} {:>9} | {:>8.3f} {:>8.3f} {:>+7.3f} | {:>8.1f}{}{}\n", p, m,
                             train::pipeline_schedule_name(sch), r.bubble, theory, r.bubble - theory, 1e3 * r.step_s,
                             guard.disturbed() ? " ~" : "",
                             p > cores ? "  (more stages than cores: they share them)" : "");
        }
        out.flush();
      }
  if (!o.balance) return Status();
  if (!o.json)
    out << fmt::format(
        "\n# balance: {} causal attention blocks (T {}, {} heads x {}) then {} matmul blocks [{}, {}], no stage "
        "tags, 2 stages, 1F1B, 4 micro-batches; busy = each stage's seconds in programs\n{:>10} | {:>10} {:>10} | "
        "{:>9} | {:>8} | {:>11}\n",
        o.attention_blocks, o.seq, o.heads, o.head_dim, o.attention_blocks, o.seq, o.heads * o.head_dim, "cut",
        "stage 0 s", "stage 1 s", "max/mean", "step ms", "stage 0 ops");
  // The two cuts' rows are one comparison: guarded together (the peak before the first, after the second).
  Balanced cuts[2];
  Guard guard;
  ASPEN_RETURN_IF_ERROR(guarded(
      [&]() -> Status {
        ASPEN_ASSIGN_OR_RETURN(cuts[0], measure_balance(api::TrainingOptions::Balance::estimated, o));
        ASPEN_ASSIGN_OR_RETURN(cuts[1], measure_balance(api::TrainingOptions::Balance::measured, o));
        return Status();
      },
      peak(2), &guard));
  for (int i = 0; i < 2; ++i) {
    const Balanced& r = cuts[i];
    const char* name = i == 1 ? "measured" : "estimated";
    if (o.json) {
      nlohmann::ordered_json j = {{"bench", "pipeline_balance"}, {"balance", name},
                                  {"stages", 2},                 {"busy_s", r.busy_s},
                                  {"max_over_mean", r.imbalance}, {"step_s", r.step_s},
                                  {"stage0_nodes", r.stage0_nodes}};
      if (i == 1) j["speedup_vs_estimated"] = cuts[0].step_s / r.step_s;
      j["step"] = spread_json(r.step);
      add_guard_fields(j, guard);
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:>10} | {:>10.4f} {:>10.4f} | {:>9.2f} | {:>8.1f} | {:>11}{}{}\n", name, r.busy_s[0],
                         r.busy_s[1], r.imbalance, 1e3 * r.step_s, r.stage0_nodes,
                         i == 1 ? fmt::format("   ({:.2f}x the estimated cut's speed)", cuts[0].step_s / r.step_s)
                                : std::string(),
                         guard.disturbed() ? " ~" : "");
    }
    out.flush();
  }
  if (!o.json) out << "# ~: disturbed: the FMA peak before and after the row moved by more than 5 %\n";
  return Status();
}

}  // namespace aspen::bench
