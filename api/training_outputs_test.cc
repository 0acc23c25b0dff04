// TrainingModel's reads beside the loss: TrainingOptions::outputs (every micro-batch's forward outputs) and
// keep_gradients (the last step's gradients), for the fused step, accumulation and replicas, checked against
// values computed by hand. With lr 0 the weights stay, so micro-batch k's output is its rows of x times w and
// its gradient 2 x_kᵀ x_k w.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "api/training_model.h"
#include "graph/builder.h"

namespace aspen::api {
namespace {

struct Layout {
  int64_t iters, acc, replicas;
  std::string name() const {
    return "iterations " + std::to_string(iters) + ", accumulation " + std::to_string(acc) + ", replicas " +
           std::to_string(replicas);
  }
};

// y = x w (x [2, 3] a micro-batch, w [3, 4]); loss = Σ y².
graph::Graph forward() {
  graph::Graph g;
  graph::Builder b(g);
  const graph::ValueId y = b.matmul(b.input("x", DType::f32, {2, 3}), b.parameter("w", DType::f32, {3, 4}));
  b.output("y", y);
  b.output("loss", b.reduce_sum(b.mul(y, y), {0, 1}));
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return g;
}

Tensor weights() {
  Tensor w(DType::f32, {3, 4});
  for (int64_t i = 0; i < 12; ++i) w.data<float>()[i] = 0.1f * float(i) - 0.5f;
  return w;
}

// x w of row r.
double product(const Tensor& x, const Tensor& w, int64_t r, int64_t c) {
  double y = 0;
  for (int64_t k = 0; k < 3; ++k) y += x.data<float>()[r * 3 + k] * w.data<float>()[k * 4 + c];
  return y;
}

// SGD at lr 0 in layout l, with `t`'s reads; the weights on the device.
std::unique_ptr<TrainingModel> model(const graph::Graph& g, const Layout& l, TrainingOptions t, const Tensor& w) {
  Options o;
  o.threads(1).device_iterations(l.iters).gradient_accumulation(l.acc).replication_factor(l.replicas);
  t.optimizer.kind = train::OptimizerKind::sgd;
  t.schedule.lr = 0.0;
  auto m = TrainingModel::create(g, o, t);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return nullptr;
  EXPECT_TRUE((*m)->copy_weights_to_device({{"w", &w}}).is_ok());
  return std::move(m).value();
}

Tensor inputs(int64_t micro_batches, float step) {
  Tensor x(DType::f32, {micro_batches * 2, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(step * float(i) + 0.3f);
  return x;
}

// Every micro-batch's y, in the inputs' order, beside the loss.
TEST(TrainingOutputs, EveryMicroBatchsOutputsBesideTheLoss) {
  const graph::Graph g = forward();
  const Tensor w = weights();
  for (const Layout& l : {Layout{3, 1, 1}, Layout{2, 2, 1}, Layout{2, 1, 2}}) {
    SCOPED_TRACE(l.name());
    TrainingOptions t;
    t.outputs = {"y"};
    auto m = model(g, l, t, w);
    ASSERT_TRUE(m);
    const int64_t n = l.iters * l.acc * l.replicas;
    const Tensor x = inputs(n, 1.0f);
    auto out = m->run({{"x", &x}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    ASSERT_TRUE(out->count("y") && out->count("loss"));
    const Tensor& y = out->at("y");
    ASSERT_EQ(y.shape(), (Shape{n, 2, 4}));
    for (int64_t r = 0; r < n * 2; ++r)
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_NEAR(y.data<float>()[r * 4 + c], product(x, w, r, c), 1e-5) << "row " << r << " column " << c;
  }
  TrainingOptions bad;
  bad.outputs = {"z"};
  auto m = TrainingModel::create(g, Options().threads(1), bad);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().subject(), "training output 'z'") << m.status().to_string();
}

// The last step's gradient: the mean over its micro-batches and replicas of 2 x_kᵀ x_k w.
TEST(TrainingOutputs, KeptGradientsAreTheLastStepsMean) {
  const graph::Graph g = forward();
  const Tensor w = weights();
  for (const Layout& l : {Layout{1, 1, 1}, Layout{2, 2, 1}, Layout{1, 2, 2}}) {
    SCOPED_TRACE(l.name());
    TrainingOptions t;
    t.keep_gradients = true;
    auto m = model(g, l, t, w);
    ASSERT_TRUE(m);
    EXPECT_FALSE(m->copy_gradients_to_host().is_ok());  // no step yet
    const int64_t n = l.iters * l.acc * l.replicas, last = (l.iters - 1) * l.acc * l.replicas;
    const Tensor x = inputs(n, 0.7f);
    ASSERT_TRUE(m->run({{"x", &x}}).is_ok());
    auto grads = m->copy_gradients_to_host();
    ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
    const Tensor& gw = grads->at("w");
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t c = 0; c < 4; ++c) {
        double want = 0;
        for (int64_t r = last * 2; r < n * 2; ++r) want += 2.0 * x.data<float>()[r * 3 + k] * product(x, w, r, c);
        want /= double(l.acc * l.replicas);
        EXPECT_NEAR(gw.data<float>()[k * 4 + c], want, 1e-4) << k << ", " << c;
      }
  }
}

// Two stages (tagged): y = x w on stage 0, z = tanh(y) v on stage 1, loss = Σ z². Each output comes from the
// stage that computes it, in the inputs' order, equal to the same layout on one device per replica.
TEST(TrainingOutputs, PipelinedOutputsComeFromTheirStages) {
  graph::Graph g;
  graph::Builder b(g);
  b.set_stage(0);
  const graph::ValueId y = b.matmul(b.input("x", DType::f32, {2, 3}), b.parameter("w", DType::f32, {3, 4}));
  b.output("y", y);
  b.set_stage(1);
  const graph::ValueId z = b.matmul(b.tanh(y), b.parameter("v", DType::f32, {4, 2}));
  b.output("z", z);
  b.output("loss", b.reduce_sum(b.mul(z, z), {0, 1}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const Tensor w = weights();
  Tensor v(DType::f32, {4, 2});
  for (int64_t i = 0; i < 8; ++i) v.data<float>()[i] = 0.2f * float(i) - 0.7f;
  for (const Layout& l : {Layout{2, 1, 1}, Layout{2, 3, 1}, Layout{1, 2, 2}}) {
    SCOPED_TRACE(l.name());
    const int64_t n = l.iters * l.acc * l.replicas;
    const Tensor x = inputs(n, 0.9f);
    std::map<std::string, Tensor> got[2];
    for (int stages : {1, 2}) {
      Options o;
      o.threads(1).device_iterations(l.iters).gradient_accumulation(l.acc).replication_factor(l.replicas);
      TrainingOptions t;
      t.outputs = {"y", "z"};
      t.optimizer.kind = train::OptimizerKind::sgd;
      t.schedule.lr = 0.05;  // the weights move: later steps' outputs see the updates
      t.pipeline.stages = stages;
      auto m = TrainingModel::create(g, o, t);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      ASSERT_TRUE((*m)->copy_weights_to_device({{"w", &w}, {"v", &v}}).is_ok());
      auto out = (*m)->run({{"x", &x}});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      got[stages - 1] = std::move(out).value();
    }
    for (const char* name : {"y", "z", "loss"}) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(got[1].count(name));
      const Tensor& one = got[0].at(name);
      const Tensor& two = got[1].at(name);
      ASSERT_EQ(one.shape(), two.shape());
      for (int64_t i = 0; i < one.numel(); ++i)
        EXPECT_NEAR(two.data<float>()[i], one.data<float>()[i], 1e-6 * (1.0 + std::abs(one.data<float>()[i])))
            << "element " << i;
    }
    EXPECT_EQ(got[1].at("z").shape(), (Shape{n, 2, 2}));
  }
}

}  // namespace
}  // namespace aspen::api
