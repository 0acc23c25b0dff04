#include "bench/pipeline_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "api/training_model.h"
#include "bench/common.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "graph/builder.h"
#include "train/pipeline.h"

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

// NOTE [rebalance rows]: the mixed model on 2 stages (1F1B, 4 micro-batches), SGD. The run (recovery()):
// parallel.balance: dynamic (from the measured cut) on even devices for `steps` steps (it settles), then stage
// 1's device slowed by `slow` (NOTE [slowed device]: each of its passes spins (1 + slow) times its time, as a
// core shared with another job would) for `steps` more. Beside it, measured alone with the same slowdown: the
// cut it had settled on, kept (what a static cut loses), and the cuts near the one it moved to (within two
// narrow points: the best any cut there reaches). Each row: the median step wall of its last `tail` steps.
struct Rebalanced {
  double step_s = 0, imbalance = 0;
  Spread step;
  std::vector<double> busy_s;
  std::vector<int> stage_of;
  int moves = 0;
  double move_s = 0;        // the moves' mean
  int first_move_step = 0;  // counted from the row's first step
  std::string path;         // the moves: "21 @6, probe 28 @17" (stage 0's compute nodes after, at the row's step)
};

// `steps` steps of `model`; the last `tail` of them make the row (moves: those made after step `from`).
Status collect(api::TrainingModel& model, const Tensor& x, int64_t steps, int64_t tail, int64_t from, Rebalanced& r) {
  std::vector<double> walls;
  std::vector<std::vector<double>> busy;
  for (int64_t i = 0; i < steps; ++i) {
    ASPEN_RETURN_IF_ERROR(model.run({{"x", &x}}).status());
    if (i + tail < steps) continue;
    walls.push_back(model.last_pipeline_stats().wall_s);
    busy.push_back(model.last_pipeline_stats().busy_s);
  }
  r.stage_of = model.pipeline_stage_of();
  for (const train::StageMove& m : model.stage_moves()) {
    if (m.step < from) continue;
    if (r.moves++ == 0) r.first_move_step = int(m.step - from) + 1;
    r.move_s += m.seconds;
    r.path += fmt::format("{}{}{} @{}", r.path.empty() ? "" : ", ", m.probe ? "probe " : "", m.nodes_after.at(0),
                          m.step - from + 1);
  }
  if (r.moves) r.move_s /= double(r.moves);
  std::vector<size_t> order(walls.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t c) { return walls[a] < walls[c]; });
  const size_t med = order[order.size() / 2];
  r.busy_s = busy[med];
  r.step_s = walls[med];
  r.step = spread_of(walls);
  double mx = 0, sum = 0;
  for (double v : r.busy_s) mx = std::max(mx, v), sum += v;
  r.imbalance = sum > 0 ? mx / (sum / double(r.busy_s.size())) : 0;
  return Status();
}

struct SlowHook {  // NOTE [slowed device] on stage 1 while it lives
  explicit SlowHook(double slow) {
    if (slow > 0) setenv("ASPEN_TEST_SLOW_DEVICE", fmt::format("1:{}", slow).c_str(), 1);
  }
  ~SlowHook() { unsetenv("ASPEN_TEST_SLOW_DEVICE"); }
};

Result<std::unique_ptr<api::TrainingModel>> balance_model(api::TrainingOptions::Balance balance,
                                                          const std::vector<int>* cut, const PipelineBenchOptions& o) {
  ASPEN_ASSIGN_OR_RETURN(graph::Graph g, mixed_model(o));
  if (cut)
    for (size_t i = 0; i < cut->size(); ++i)
      if ((*cut)[i] >= 0) g.mutable_node(int32_t(i)).stage = (*cut)[i];
  api::Options opts;
  opts.threads(1).gradient_accumulation(4);
  api::TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::sgd;
  t.optimizer.weight_decay = 0.0;
  t.schedule.lr = 1e-4;
  t.pipeline = {2, train::PipelineSchedule::one_f_one_b, balance};
  ASPEN_ASSIGN_OR_RETURN(auto model, api::TrainingModel::create(g, opts, t));
  ASPEN_RETURN_IF_ERROR(random_weights(*model, double(o.heads * o.head_dim)));
  return model;
}

Tensor balance_input(const PipelineBenchOptions& o) {
  Tensor x(DType::f32, {4 * o.seq, o.heads * o.head_dim});
  philox_fill_normal(x.span<float>(), 7, 0, 0, 0.0f, 1.0f);
  return x;
}

int stage0_nodes(const Rebalanced& r) { return int(std::count(r.stage_of.begin(), r.stage_of.end(), 0)); }

// The balance rows' cut (estimated or measured): the median of o.steps steps after a warm-up.
Result<Rebalanced> measure_balance(api::TrainingOptions::Balance balance, const PipelineBenchOptions& o) {
  ASPEN_ASSIGN_OR_RETURN(auto model, balance_model(balance, nullptr, o));
  Rebalanced r;
  ASPEN_RETURN_IF_ERROR(collect(*model, balance_input(o), o.steps + 1, o.steps, 0, r));
  return r;
}

// The run: `even` its settled rows on even devices, `slowed` the rows after the slowdown.
Status recovery(int64_t steps, int64_t tail, double slow, const PipelineBenchOptions& o, Rebalanced& even,
                Rebalanced& slowed) {
  ASPEN_ASSIGN_OR_RETURN(auto model, balance_model(api::TrainingOptions::Balance::dynamic, nullptr, o));
  const Tensor x = balance_input(o);
  ASPEN_RETURN_IF_ERROR(collect(*model, x, steps, tail, 0, even));
  SlowHook hook(slow);
  return collect(*model, x, steps, tail, steps, slowed);
}

// A static cut with the slowdown, measured alone.
Result<Rebalanced> kept_cut(const std::vector<int>& cut, int64_t tail, double slow, const PipelineBenchOptions& o) {
  SlowHook hook(slow);
  ASPEN_ASSIGN_OR_RETURN(auto model, balance_model(api::TrainingOptions::Balance::estimated, &cut, o));
  Rebalanced r;
  ASPEN_RETURN_IF_ERROR(collect(*model, balance_input(o), tail + 1, tail, 0, r));
  return r;
}

Status rebalance_rows(const PipelineBenchOptions& o, std::ostream& out) {
  const int64_t steps = o.quick ? 12 : o.rebalance_steps, tail = o.quick ? 3 : 10, near = o.quick ? 1 : 2;
  const double slow = o.slow_stage;
  if (!o.json)
    out << fmt::format(
        "\n# rebalance (parallel.balance: dynamic): the balance model from the measured cut, {} steps on even "
        "devices, then {} with stage 1's device slowed by {:.0f} % (a test hook that spins, as a shared core); "
        "beside it, alone: the settled cut kept, and the best cut near the one it moved to; step = median wall "
        "of a row's last {} steps\n{:>22} | {:>9} | {:>8} | {:>11} | {:>5} | {}\n",
        steps, steps, 100 * slow, tail, "row", "max/mean", "step ms", "stage 0 ops", "moves", "move cost");
  auto row = [&](const std::string& name, const Rebalanced& r, const nlohmann::ordered_json& extra) {
    const int stage0 = stage0_nodes(r);
    if (o.json) {
      nlohmann::ordered_json j = {{"bench", "pipeline_rebalance"}, {"row", name},      {"slow", slow},
                                  {"busy_s", r.busy_s},            {"max_over_mean", r.imbalance},
                                  {"step_s", r.step_s},            {"stage0_nodes", stage0},
                                  {"moves", r.moves},              {"move_s", r.move_s},
                                  {"first_move_step", r.first_move_step}, {"path", r.path},
                                  {"step", spread_json(r.step)}};
      if (extra.is_object()) j.update(extra);
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:>22} | {:>9.2f} | {:>8.1f} | {:>11} | {:>5} | {}{}\n", name, r.imbalance, 1e3 * r.step_s,
                         stage0, r.moves,
                         r.moves ? fmt::format("{:.0f} ms = {:.2f} steps (stage 0 ops {})", 1e3 * r.move_s,
                                               r.move_s / r.step_s, r.path)
                                 : std::string("-"),
                         !extra.is_object() || !extra.contains("recovered") ? std::string()
                         : extra["recovered"].is_null()
                             ? std::string("   (no cut near beats the kept one: nothing to win back)")
                             : fmt::format("   recovered {:.0f} % of the throughput the slowdown took that a cut "
                                           "can win back",
                                           100 * extra["recovered"].get<double>()));
    }
    out.flush();
  };
  Rebalanced even, dyn;
  ASPEN_RETURN_IF_ERROR(recovery(steps, tail, slow, o, even, dyn));
  row("dynamic, even devices", even, {});
  ASPEN_ASSIGN_OR_RETURN(const Rebalanced kept, kept_cut(even.stage_of, tail, slow, o));
  // The cuts near the one the run moved to: its boundary moved by up to `near` narrow points either way.
  ASPEN_ASSIGN_OR_RETURN(const graph::Graph g, mixed_model(o));
  ASPEN_ASSIGN_OR_RETURN(const train::PipelineSplit finest,
                         train::split_pipeline(g, 0, "loss", {.node_costs = {}, .every_narrow_point = true}));
  int boundary = 0;  // the first piece on stage 1
  for (size_t i = 0; i < dyn.stage_of.size(); ++i)
    if (dyn.stage_of[i] == 0) boundary = std::max(boundary, finest.stage_of[i] + 1);
  const int pieces = int(finest.stages.size());
  Rebalanced best = kept;
  for (int b = std::max(1, boundary - int(near)); b <= std::min(pieces - 1, boundary + int(near)); ++b) {
    std::vector<int> cut(finest.stage_of.size(), -1);
    for (size_t i = 0; i < cut.size(); ++i)
      if (finest.stage_of[i] >= 0) cut[i] = finest.stage_of[i] >= b ? 1 : 0;
    Result<Rebalanced> r = kept_cut(cut, tail, slow, o);
    if (r.is_ok() && r->step_s < best.step_s) best = *r;  // (a cut the model cannot take is skipped)
  }
  const double lost = 1.0 / best.step_s - 1.0 / kept.step_s;
  // NaN (null in JSON): no cut near beats the kept one, nothing to win back.
  const double recovered =
      lost > 0 ? (1.0 / dyn.step_s - 1.0 / kept.step_s) / lost : std::numeric_limits<double>::quiet_NaN();
  row("settled cut, slowed", kept, {});
  nlohmann::ordered_json extra = {{"recovered", nullptr}, {"best_step_s", best.step_s}};
  if (std::isfinite(recovered)) extra["recovered"] = recovered;
  row("dynamic, slowed", dyn, extra);
  row("best cut near, slowed", best, {});
  return Status();
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
  Rebalanced cuts[2];
  Guard guard;
  ASPEN_RETURN_IF_ERROR(guarded(
      [&]() -> Status {
        ASPEN_ASSIGN_OR_RETURN(cuts[0], measure_balance(api::TrainingOptions::Balance::estimated, o));
        ASPEN_ASSIGN_OR_RETURN(cuts[1], measure_balance(api::TrainingOptions::Balance::measured, o));
        return Status();
      },
      peak(2), &guard));
  for (int i = 0; i < 2; ++i) {
    const Rebalanced& r = cuts[i];
    const char* name = i == 1 ? "measured" : "estimated";
    if (o.json) {
      nlohmann::ordered_json j = {{"bench", "pipeline_balance"}, {"balance", name},
                                  {"stages", 2},                 {"busy_s", r.busy_s},
                                  {"max_over_mean", r.imbalance}, {"step_s", r.step_s},
                                  {"stage0_nodes", stage0_nodes(r)}};
      if (i == 1) j["speedup_vs_estimated"] = cuts[0].step_s / r.step_s;
      j["step"] = spread_json(r.step);
      add_guard_fields(j, guard);
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:>10} | {:>10.4f} {:>10.4f} | {:>9.2f} | {:>8.1f} | {:>11}{}{}\n", name, r.busy_s[0],
                         r.busy_s[1], r.imbalance, 1e3 * r.step_s, stage0_nodes(r),
                         i == 1 ? fmt::format("   ({:.2f}x the estimated cut's speed)", cuts[0].step_s / r.step_s)
                                : std::string(),
                         guard.disturbed() ? " ~" : "");
    }
    out.flush();
  }
  if (!o.json) out << "# ~: disturbed: the FMA peak before and after the row moved by more than 5 %\n";
  if (!o.rebalance) return Status();
  return rebalance_rows(o, out);
}

}  // namespace aspen::bench
