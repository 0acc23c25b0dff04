// examples/cpp/training_model.cc: a forward graph with a scalar loss compiled
// with its backward pass and optimizer (api/training_model.h): a linear
// student learns a teacher's weights with AdamW on a cosine schedule, each
// run() making 4 optimizer steps of 2 accumulated micro-batches, on 2
// data-parallel replicas.
//
//   training_model     exits 0 when the loss falls below 1 % of its start
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "api/training_model.h"
#include "graph/builder.h"

namespace {

int fail(const aspen::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  using namespace aspen;
  constexpr int64_t kBatch = 8, kIn = 16, kOut = 4;
  // loss = mean((x · w + bias - target)²) over a micro-batch of 8 rows.
  graph::Graph g;
  graph::Builder b(g);
  graph::ValueId x = b.input("x", DType::f32, Shape{kBatch, kIn});
  graph::ValueId target = b.input("target", DType::f32, Shape{kBatch, kOut});
  graph::ValueId w = b.parameter("fc.weight", DType::f32, Shape{kIn, kOut});
  graph::ValueId bias = b.parameter("fc.bias", DType::f32, Shape{kOut});
  graph::ValueId y = b.add(b.matmul(x, w), b.broadcast(bias, {kBatch, kOut}));
  graph::ValueId d = b.sub(y, target);
  b.output("loss", b.scale(b.reduce_sum(b.mul(d, d), {0, 1}), 1.0 / double(kBatch * kOut)));
  if (!b.status().is_ok()) return fail(b.status());

  constexpr int64_t kIterations = 4, kAccumulation = 2, kReplicas = 2, kCalls = 60;
  api::Options opts;
  opts.device_iterations(kIterations).gradient_accumulation(kAccumulation).replication_factor(kReplicas).threads(1);
  api::TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::adamw;
  t.optimizer.weight_decay = 0.0;
  t.schedule = {.kind = train::ScheduleKind::cosine, .lr = 0.05, .warmup_steps = 10,
                .total_steps = kCalls * kIterations, .min_lr_ratio = 0.0};
  Result<std::unique_ptr<api::TrainingModel>> model = api::TrainingModel::create(g, opts, t);
  if (!model.is_ok()) return fail(model.status());

  // The weights start at zero (a session's parameters are zeros until set); the teacher's are fixed.
  auto teacher = [](int64_t k, int64_t j) { return std::sin(double(k * kOut + j)) * 0.8; };
  // Each call's inputs: [device_iterations x gradient_accumulation x replicas] micro-batches in front.
  const int64_t micro = kIterations * kAccumulation * kReplicas;
  Tensor xs(DType::f32, Shape{micro, kBatch, kIn}), ts(DType::f32, Shape{micro, kBatch, kOut});
  uint32_t seed = 12345;
  auto uniform = [&] {
    seed = seed * 1664525u + 1013904223u;
    return double(seed >> 8) / double(1u << 24) * 2.0 - 1.0;
  };
  float first = 0.0f, last = 0.0f;
  for (int64_t call = 0; call < kCalls; ++call) {
    for (int64_t r = 0; r < micro * kBatch; ++r) {
      for (int64_t k = 0; k < kIn; ++k) xs.data<float>()[r * kIn + k] = float(uniform());
      for (int64_t j = 0; j < kOut; ++j) {
        double v = 0.3;
        for (int64_t k = 0; k < kIn; ++k) v += double(xs.data<float>()[r * kIn + k]) * teacher(k, j);
        ts.data<float>()[r * kOut + j] = float(v);
      }
    }
    Result<std::map<std::string, Tensor>> out = (*model)->run({{"x", &xs}, {"target", &ts}});
    if (!out.is_ok()) return fail(out.status());
    const Tensor& losses = out->at("loss");  // one per optimizer step (OutputMode::all)
    if (call == 0) first = losses.data<float>()[0];
    last = losses.data<float>()[losses.numel() - 1];
  }
  std::printf("loss %.4g -> %.4g after %lld steps (lr %.3g at the end)\n", first, last,
              static_cast<long long>((*model)->steps_done()), (*model)->last_steps().back().lr);
  Result<std::map<std::string, Tensor>> weights = (*model)->copy_weights_to_host();
  if (!weights.is_ok()) return fail(weights.status());
  std::printf("fc.weight[1][2] %.4f (teacher %.4f)\n", weights->at("fc.weight").data<float>()[1 * kOut + 2],
              teacher(1, 2));
  return std::isfinite(last) && last < 0.01f * first ? 0 : 1;
}
