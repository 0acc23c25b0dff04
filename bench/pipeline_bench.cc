#include "bench/pipeline_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "api/training_model.h"
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

struct Measured {
  double bubble = 0, step_s = 0;
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
  std::map<std::string, Tensor> weights;
  uint64_t stream = 0;
  for (const auto& [name, type] : model->weight_types()) {
    Tensor w(type.first, type.second);
    philox_fill_normal(w.span<float>(), 99, stream++, 0, 0.0f, float(0.5 / std::sqrt(double(o.width))));
    weights.emplace(name, std::move(w));
  }
  std::map<std::string, const Tensor*> ptrs;
  for (const auto& [name, w] : weights) ptrs.emplace(name, &w);
  ASPEN_RETURN_IF_ERROR(model->copy_weights_to_device(ptrs));
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
  std::sort(walls.begin(), walls.end());
  return Measured{bubbles[bubbles.size() / 2], walls[walls.size() / 2]};
}

}  // namespace

Status run_pipeline_bench(const PipelineBenchOptions& opt, std::ostream& out) {
  PipelineBenchOptions o = opt;
  if (o.quick) o.width = 64, o.rows = 8, o.blocks = 1, o.steps = 1;
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
  for (int p : o.stages)
    for (int m : o.micro)
      for (train::PipelineSchedule sch : {train::PipelineSchedule::gpipe, train::PipelineSchedule::one_f_one_b}) {
        ASPEN_ASSIGN_OR_RETURN(Measured r, measure(p, m, sch, o));
        const double theory = train::pipeline_bubble_theory(p, m);
        if (o.json) {
          nlohmann::ordered_json j = {{"bench", "pipeline"}, {"stages", p},        {"microbatches", m},
                                      {"schedule", train::pipeline_schedule_name(sch)}, {"bubble", r.bubble},
                                      {"theory", theory},   {"step_s", r.step_s}, {"cores", cores}};
          out << j.dump() << "\n";
        } else {
          out << fmt::format("{:>6} {:>6} {:>9} | {:>8.3f} {:>8.3f} {:>+7.3f} | {:>8.1f}{}\n", p, m,
                             train::pipeline_schedule_name(sch), r.bubble, theory, r.bubble - theory, 1e3 * r.step_s,
                             p > cores ? "  (more stages than cores: they share them)" : "");
        }
        out.flush();
      }
  return Status();
}

}  // namespace aspen::bench
