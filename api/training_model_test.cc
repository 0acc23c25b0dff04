// TrainingModel: parity with PyTorch + Hugging Face (the training goldens of
// models/testdata), gradient accumulation, clipping, loss scaling and the
// non-finite errors.
#include "api/training_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "train/plan.h"
#include "train/program.h"
#include "api/training_testing.h"

namespace aspen::api {
namespace {

using namespace testing;  // NOLINT: the helpers of this test

nlohmann::json golden_json(const std::string& model) {
  std::ifstream in(kTestdata + "/" + model + "/train_golden.json");
  EXPECT_TRUE(in.good()) << model;
  return nlohmann::json::parse(in);
}

// Ten AdamW steps, fused (one call of 10 device iterations) and split (one
// call per step, gradients accumulated and inspected): every loss within 1e-4
// relative of PyTorch's float64 run, the step-1 gradients within 1e-4, the
// final weights within the golden's own f32 tolerance.
void expect_golden_training(const std::string& model, int64_t d_model, bool no_decay) {
  const Golden gold = read_golden(model);
  const nlohmann::json j = golden_json(model);
  const std::vector<double> want = j.at(no_decay ? "nodecay_loss_f64" : "loss_f64").get<std::vector<double>>();
  ASSERT_EQ(int64_t(want.size()), gold.steps);
  const Batches all = shifted(gold, gold.steps);
  Forward f = forward(model, gold.B, gold.T - 1);
  TrainingOptions t = golden_adamw();
  if (no_decay) t.optimizer.no_decay = {"bias", "ln_"};

  // Fused: all ten steps in one call.
  {
    Options o;
    o.device_iterations(gold.steps).output_mode(OutputMode::all).threads(2);
    auto m = TrainingModel::create(f.g, o, t);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_FALSE((*m)->programs().split());
    ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
    auto out = (*m)->run({{"input_ids", &all.input_ids}, {"positions", &all.positions}, {"targets", &all.targets}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const Tensor& loss = out->at("loss");
    ASSERT_EQ(loss.numel(), gold.steps);
    for (int64_t k = 0; k < gold.steps; ++k)
      EXPECT_NEAR(loss.data<float>()[k], want[size_t(k)], 1e-4 * want[size_t(k)]) << "fused step " << k + 1;
    // Validation on batch 0 with the trained weights (the eval program shares them).
    {
      const int64_t S = gold.T - 1;
      Tensor ids(DType::i32, {gold.B, S}), pos(DType::i32, {gold.B, S}), tgt(DType::i32, {gold.B * S});
      std::copy_n(all.input_ids.data<int32_t>(), gold.B * S, ids.data<int32_t>());
      std::copy_n(all.positions.data<int32_t>(), gold.B * S, pos.data<int32_t>());
      std::copy_n(all.targets.data<int32_t>(), gold.B * S, tgt.data<int32_t>());
      auto v = (*m)->evaluate({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
      ASSERT_TRUE(v.is_ok()) << v.status().to_string();
      const double after = j.at(no_decay ? "nodecay_loss_after_10_steps_on_batch_0_f64"
                                         : "loss_after_10_steps_on_batch_0_f64").get<double>();
      EXPECT_NEAR(*v, after, 1e-4 * after);
    }
    if (no_decay) return;
    // The final weights against the float64 run.
    auto w = (*m)->copy_weights_to_host();
    ASSERT_TRUE(w.is_ok());
    const double tol = j.at("tolerances").at("final_f32_abs").get<double>();
    int64_t total = 0, over = 0, noise = 0;
    const auto left_out = j.at("final_weights_left_out").get<std::vector<std::string>>();
    for (const auto& [name, got] : *w) {
      if (std::find(left_out.begin(), left_out.end(), name) != left_out.end()) continue;
      auto ref = gold.file->read("final." + name);
      ASSERT_TRUE(ref.is_ok()) << name;
      auto grad = gold.file->read("grad." + name);
      ASSERT_TRUE(grad.is_ok()) << name;
      double mean_abs = 0;
      for (int64_t i = 0; i < grad->numel(); ++i) mean_abs += std::abs(double(grad->data<float>()[i]));
      mean_abs /= double(std::max<int64_t>(1, grad->numel()));
      for (int64_t i = 0; i < got.numel(); ++i) {
        if (key_bias_entry(name, i, d_model)) continue;
        // Adam's m/sqrt(v) turns an element's gradient into a step of about lr whatever its size, so
        // where the gradient is rounding noise (nonzero, under 1e-5 of its tensor's mean: GPT-J's v_proj
        // has one of 2.6e-8 beside a mean of 6e-3) the step's sign is noise too, and follows the GEMM
        // library's summation order (OpenBLAS's SkylakeX kernels moved that one by 0.3 lr). Such elements
        // are counted, not checked. Exact zeros (unused embedding rows) are exact everywhere: checked.
        const double g0 = std::abs(double(grad->data<float>()[i]));
        if (g0 != 0 && g0 < 1e-5 * mean_abs) {
          ++noise;
          continue;
        }
        const double d = std::abs(double(got.data<float>()[i]) - double(ref->data<float>()[i]));
        EXPECT_LE(d, tol) << name << "[" << i << "]";
        ++total;
        over += d > 1e-4;
      }
    }
    EXPECT_LE(double(over), 0.001 * double(total)) << over << " of " << total << " elements off by more than 1e-4";
    EXPECT_LE(double(noise), 0.001 * double(total)) << noise << " of " << total << " elements with noise gradients";
  }
  // Split: step by step (clipping at an unreachable norm forces it); the
  // accumulators after step 1 hold its gradients.
  t.clip_grad_norm = 1e30;
  Options o;
  o.threads(2);
  auto m = TrainingModel::create(f.g, o, t);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->programs().split());
  ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
  const int64_t S = gold.T - 1;
  for (int64_t k = 0; k < gold.steps; ++k) {
    Tensor ids(DType::i32, {gold.B, S}), pos(DType::i32, {gold.B, S}), tgt(DType::i32, {gold.B * S});
    std::copy_n(all.input_ids.data<int32_t>() + k * gold.B * S, gold.B * S, ids.data<int32_t>());
    std::copy_n(all.positions.data<int32_t>() + k * gold.B * S, gold.B * S, pos.data<int32_t>());
    std::copy_n(all.targets.data<int32_t>() + k * gold.B * S, gold.B * S, tgt.data<int32_t>());
    auto out = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_NEAR(out->at("loss").data<float>()[0], want[size_t(k)], 1e-4 * want[size_t(k)]) << "split step " << k + 1;
    ASSERT_EQ((*m)->last_steps().size(), 1u);
    EXPECT_EQ((*m)->last_steps()[0].step, k + 1);
    EXPECT_GT((*m)->last_steps()[0].grad_norm, 0.0);
    if (k != 0 || no_decay) continue;
    double sq = 0.0;
    for (const std::string& name : (*m)->programs().params) {
      auto got = (*m)->session().get_parameter(train::grad_accumulator_name(name));
      auto ref = gold.file->read("grad." + name);
      ASSERT_TRUE(got.is_ok() && ref.is_ok()) << name;
      for (int64_t i = 0; i < got->numel(); ++i) {
        sq += double(got->data<float>()[i]) * double(got->data<float>()[i]);
        if (key_bias_entry(name, i, d_model)) continue;
        EXPECT_NEAR(got->data<float>()[i], ref->data<float>()[i], 1e-4) << "grad " << name << "[" << i << "]";
      }
    }
    EXPECT_NEAR((*m)->last_steps()[0].grad_norm, std::sqrt(sq), 1e-6 * std::sqrt(sq));
  }
  EXPECT_EQ((*m)->steps_done(), gold.steps);
}

TEST(TrainingParity, Gpt2TinyAdamWMatchesPyTorch) { expect_golden_training("gpt2-tiny", 48, false); }
TEST(TrainingParity, GptjTinyAdamWMatchesPyTorch) { expect_golden_training("gptj-tiny", 48, false); }
// Grouped-query attention's backward (dk, dv summed over each group), RMSNorm, SwiGLU, llama3 rotary.
TEST(TrainingParity, LlamaTinyAdamWMatchesPyTorch) { expect_golden_training("llama-tiny", 48, false); }
TEST(TrainingParity, Gpt2TinyNoDecayPatterns) { expect_golden_training("gpt2-tiny", 48, true); }

// Accumulating two micro-batches of 2 equals one batch of 4 (the loss is a
// mean over equal-sized micro-batches, so the mean of their gradients is the
// batch's gradient); several device iterations per call change nothing.
TEST(TrainingModel, GradientAccumulationEqualsTheWholeBatch) {
  TrainingOptions t = golden_adamw();
  t.optimizer.kind = train::OptimizerKind::sgd;  // SGD: no Adam normalisation to amplify rounding
  t.optimizer.momentum = 0.9;
  t.schedule.lr = 0.1;
  Options whole;
  whole.threads(2);
  Options acc;
  acc.threads(2).gradient_accumulation(2).device_iterations(3);
  const auto a = train_weights(whole, t, 4, 3);
  const auto b = train_weights(acc, t, 4, 3);
  EXPECT_LT(max_rel_diff(b, a), 1e-5);
}

// Clipping by the global norm: with SGD (no momentum, no decay) one clipped
// step moves the weights by lr · g · max_norm / ‖g‖, and the reported norm is ‖g‖.
TEST(TrainingModel, ClipsTheGlobalGradientNorm) {
  const Golden gold = read_golden("gpt2-tiny");
  TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::sgd;
  t.optimizer.weight_decay = 0.0;
  t.schedule.lr = 0.5;
  t.clip_grad_norm = 0.25;
  Options o;
  o.threads(2);
  std::vector<StepStats> stats;
  const auto got = train_weights(o, t, 2, 1, &stats);
  ASSERT_EQ(stats.size(), 1u);
  double sq = 0.0;
  for (const auto& [name, w] : got) {
    auto g = gold.file->read("grad." + name);
    for (int64_t i = 0; i < g->numel(); ++i) sq += double(g->data<float>()[i]) * double(g->data<float>()[i]);
  }
  const double norm = std::sqrt(sq);
  EXPECT_NEAR(stats[0].grad_norm, norm, 1e-4 * norm);
  ASSERT_GT(norm, 0.25);  // the clip is active
  const Forward f = forward("gpt2-tiny", 2, gold.T - 1);
  for (const auto& [name, w] : got) {
    auto g = gold.file->read("grad." + name);
    const Tensor& w0 = f.weights.at(name);
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double want = double(w0.data<float>()[i]) - 0.5 * double(g->data<float>()[i]) * 0.25 / (norm + 1e-6);
      ASSERT_NEAR(w.data<float>()[i], want, 2e-6 * (1 + std::abs(want))) << name << "[" << i << "]";
    }
  }
}

// Dynamic loss scaling from a scale so large that the scaled loss overflows:
// the overflowing steps are skipped (weights untouched), the scale backs off
// by powers of two, and the applied steps then equal unscaled training
// (power-of-two scales are exact).
TEST(TrainingModel, DynamicLossScalingSkipsOverflowsAndBacksOff) {
  TrainingOptions t = golden_adamw();
  t.loss_scaling = {.mode = train::LossScaling::dynamic, .initial_scale = std::ldexp(1.0, 126),
                    .growth_factor = 2.0, .backoff_factor = std::ldexp(1.0, -30), .growth_interval = 1000,
                    .hysteresis = 1};
  Options o;
  o.threads(2).device_iterations(6);
  std::vector<StepStats> stats;
  const auto scaled = train_weights(o, t, 2, 6, &stats);
  ASSERT_EQ(stats.size(), 6u);
  int64_t skipped = 0;
  for (const StepStats& s : stats) skipped += s.skipped;
  EXPECT_GE(skipped, 2);
  EXPECT_LT(skipped, 6);
  EXPECT_TRUE(stats[0].skipped);
  EXPECT_LT(stats.back().loss_scale, std::ldexp(1.0, 126));
  // The same number of applied steps without scaling. Skipped steps still
  // consume their batch, so compare against training on the same batches:
  // equal only when the skips were the first ones (they are: the scale only falls).
  for (int64_t i = 0; i < skipped; ++i) EXPECT_TRUE(stats[size_t(i)].skipped) << i;
  TrainingOptions plain = golden_adamw();
  plain.clip_grad_norm = 1e30;  // the split step, as the scaled run
  Options po;
  po.threads(2);
  // Batches: the scaled run applied steps on rows [2*skipped, 12); train the plain one on those.
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, gold.steps);
  Forward f = forward("gpt2-tiny", 2, gold.T - 1);
  auto m = TrainingModel::create(f.g, po, plain);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
  const int64_t S = gold.T - 1;
  for (int64_t k = skipped; k < 6; ++k) {
    Tensor ids(DType::i32, {2, S}), pos(DType::i32, {2, S}), tgt(DType::i32, {2 * S});
    std::copy_n(all.input_ids.data<int32_t>() + k * 2 * S, 2 * S, ids.data<int32_t>());
    std::copy_n(all.positions.data<int32_t>() + k * 2 * S, 2 * S, pos.data<int32_t>());
    std::copy_n(all.targets.data<int32_t>() + k * 2 * S, 2 * S, tgt.data<int32_t>());
    ASSERT_TRUE((*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}}).is_ok());
    EXPECT_NEAR((*m)->last_steps()[0].loss, stats[size_t(k)].loss, 1e-5 * stats[size_t(k)].loss) << k;
  }
  EXPECT_LT(max_rel_diff(scaled, *(*m)->copy_weights_to_host()), 1e-5);
}

// A NaN weight in f32 without loss scaling stops training with the step and
// the first non-finite tensor named, in both step shapes.
TEST(TrainingModel, NonFiniteLossStopsNamingTheStepAndTensor) {
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "fused");
    const Golden gold = read_golden("gpt2-tiny");
    const Batches all = shifted(gold, 1);
    Forward f = forward("gpt2-tiny", 2, gold.T - 1);
    Tensor& w = f.weights.at("transformer.h.1.mlp.c_fc.weight");
    w.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
    TrainingOptions t = golden_adamw();
    if (split) t.clip_grad_norm = 1.0;
    Options o;
    o.threads(2);
    auto m = TrainingModel::create(f.g, o, t);
    ASSERT_TRUE(m.is_ok());
    ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
    auto out = (*m)->run({{"input_ids", &all.input_ids}, {"positions", &all.positions}, {"targets", &all.targets}});
    ASSERT_FALSE(out.is_ok());
    const std::string msg = out.status().to_string();
    EXPECT_EQ(out.status().code(), Code::kFailedPrecondition) << msg;
    EXPECT_NE(msg.find("training step 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("first non-finite tensor"), std::string::npos) << msg;
    EXPECT_NE(msg.find("transformer."), std::string::npos) << msg;
  }
}

// Mixed precision: bf16 or f16 matmuls over f32 master weights, gradients and
// optimizer state. The losses of 10 AdamW steps stay within the narrow type's
// reach of PyTorch's float64 run (f16 with static loss scaling, and with
// dynamic scaling from a scale that overflows first).
TEST(TrainingModel, Bf16AndF16ComputeTrackTheF32Losses) {
  const Golden gold = read_golden("gpt2-tiny");
  const std::vector<double> want = golden_json("gpt2-tiny").at("loss_f64").get<std::vector<double>>();
  const Batches all = shifted(gold, gold.steps);
  struct Case {
    const char* label;
    DType compute;
    train::LossScaling scaling;
    double tol;
  };
  for (const Case& k : {Case{"bf16", DType::bf16, train::LossScaling::none, 2e-2},
                        Case{"f16 static", DType::f16, train::LossScaling::static_scale, 5e-3},
                        Case{"f16 dynamic", DType::f16, train::LossScaling::dynamic, 5e-3}}) {
    SCOPED_TRACE(k.label);
    Forward f = forward("gpt2-tiny", gold.B, gold.T - 1);
    TrainingOptions t = golden_adamw();
    t.loss_scaling.mode = k.scaling;
    t.loss_scaling.initial_scale = k.scaling == train::LossScaling::dynamic ? std::ldexp(1.0, 24) : 1024.0;
    t.loss_scaling.hysteresis = 1;
    Options o;
    o.precision(k.compute).threads(2);
    auto m = TrainingModel::create(f.g, o, t);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
    const int64_t S = gold.T - 1;
    int64_t applied = 0;
    for (int64_t k2 = 0; applied < gold.steps && k2 < 3 * gold.steps; ++k2) {
      const int64_t b = applied;  // a skipped step's batch is taken again, so step i sees batch i
      Tensor ids(DType::i32, {gold.B, S}), pos(DType::i32, {gold.B, S}), tgt(DType::i32, {gold.B * S});
      std::copy_n(all.input_ids.data<int32_t>() + b * gold.B * S, gold.B * S, ids.data<int32_t>());
      std::copy_n(all.positions.data<int32_t>() + b * gold.B * S, gold.B * S, pos.data<int32_t>());
      std::copy_n(all.targets.data<int32_t>() + b * gold.B * S, gold.B * S, tgt.data<int32_t>());
      auto out = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      if ((*m)->last_steps()[0].skipped) continue;
      EXPECT_NEAR(out->at("loss").data<float>()[0], want[size_t(b)], k.tol * want[size_t(b)]) << "step " << b + 1;
      ++applied;
    }
    EXPECT_EQ(applied, gold.steps);
    if (k.scaling == train::LossScaling::dynamic) {
      EXPECT_GT((*m)->loss_scaler().skipped(), 0);
    }
  }
}

TEST(TrainingModel, BadInputsNameThemselves) {
  Forward f = forward("gpt2-tiny", 2, 15);
  Options o;
  o.threads(1).gradient_accumulation(2);
  auto m = TrainingModel::create(f.g, o, golden_adamw());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  Tensor ids(DType::i32, {3, 15}), pos(DType::i32, {4, 15}), tgt(DType::i32, {4 * 15});
  auto r = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().subject(), "training input 'input_ids'") << r.status().to_string();
  EXPECT_NE(r.status().expected().find("i32[2, 2, 15]"), std::string::npos) << r.status().to_string();
  auto r2 = (*m)->run({{"input_idz", &ids}});
  EXPECT_EQ(r2.status().subject(), "training input 'input_idz'");
  graph::Graph nol;
  graph::Builder b(nol);
  b.output("y", b.parameter("w", DType::f32, {3}));
  auto bad = TrainingModel::create(nol, o, golden_adamw());
  EXPECT_EQ(bad.status().subject(), "training graph: output 'loss'");
}


// Up to eight devices of one thread in one process (2 replicas x 2 stages x 2
// shards) need eight cores from the budget;
// CI machines have two, so this binary oversubscribes on purpose (before any
// team reserves its cores: the budget is sized at its first use).
const bool kCores = [] { return setenv("ASPEN_CORES", "8", 0) == 0; }();

// R data-parallel replicas of micro-batch m with accumulation A take the same
// micro-batches as one device with accumulation A·R. With A = 1 the gradients
// are even added in the same order (the replicas' in rank order, as the
// device accumulates its micro-batches) and the norm too, so the weights after
// 5 steps are the same bits. With A = 2 each replica first adds its own two
// micro-batches, another order: f32 rounding, which AdamW's normalisation
// amplifies where gradients are tiny (accumulating 4 micro-batches against
// one batch of 4 differs by 1.5e-5 on this model already).
TEST(DataParallel, ReplicasEqualOneDeviceWithAccumulation) {
  ASSERT_TRUE(kCores);
  for (bool adam : {false, true}) {
    const TrainingOptions t = adam ? dp_adamw() : sgd_momentum();
    SCOPED_TRACE(adam ? "adamw, clipped" : "sgd");
    Options one4, one2;
    one4.threads(1).gradient_accumulation(4);
    one2.threads(1).gradient_accumulation(2);
    std::vector<StepStats> s1, s2, s4;
    const auto w1 = train_weights(one4, t, 4, 5, &s1);
    const auto w1b = train_weights(one2, t, 4, 5);
    Options dp2;
    dp2.threads(1).replication_factor(2);
    const auto w2 = train_weights(dp2, t, 4, 5);
    Options dp2acc;
    dp2acc.threads(1).replication_factor(2).gradient_accumulation(2);
    const auto w2a = train_weights(dp2acc, t, 4, 5, &s2);
    Options dp4;
    dp4.threads(1).replication_factor(4).device_iterations(5);
    const auto w4 = train_weights(dp4, t, 4, 5, &s4);
    ASSERT_FALSE(w1.empty() || w1b.empty() || w2.empty() || w2a.empty() || w4.empty());
    EXPECT_TRUE(bitwise_equal(w4, w1)) << max_rel_diff(w4, w1);
    EXPECT_TRUE(bitwise_equal(w2, w1b)) << max_rel_diff(w2, w1b);
    EXPECT_LT(max_rel_diff(w2a, w1), adam ? 1e-4 : 1e-5);
    ASSERT_EQ(s1.size(), 5u);
    ASSERT_EQ(s2.size(), 5u);
    ASSERT_EQ(s4.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(s4[i].loss, s1[i].loss) << "step " << i + 1;
      if (adam) {  // measured when clipping; data parallel without clipping skips the norm
        EXPECT_EQ(s4[i].grad_norm, s1[i].grad_norm) << "step " << i + 1;
        EXPECT_NEAR(s2[i].grad_norm, s1[i].grad_norm, 1e-4 * s1[i].grad_norm) << "step " << i + 1;
      } else {
        EXPECT_EQ(s4[i].grad_norm, -1.0);
      }
      EXPECT_NEAR(s2[i].loss, s1[i].loss, 1e-6 * s1[i].loss) << "step " << i + 1;
    }
  }
}

// A rerun of the same layout gives the same bits.
TEST(DataParallel, RerunIsBitwiseIdentical) {
  ASSERT_TRUE(kCores);
  Options dp;
  dp.threads(1).replication_factor(2).gradient_accumulation(2);
  const auto a = train_weights(dp, dp_adamw(), 4, 3);
  const auto b = train_weights(dp, dp_adamw(), 4, 3);
  ASSERT_FALSE(a.empty());
  for (const auto& [name, t] : a)
    EXPECT_EQ(0, std::memcmp(t.raw(), b.at(name).raw(), t.nbytes())) << name;
}

// Reduction::sum adds the replicas' gradients: with plain SGD, half the
// learning rate of the mean.
TEST(DataParallel, SumReductionAddsTheReplicasGradients) {
  ASSERT_TRUE(kCores);
  TrainingOptions mean = golden_adamw();
  mean.optimizer.kind = train::OptimizerKind::sgd;
  mean.optimizer.weight_decay = 0.0;
  mean.schedule.lr = 0.1;
  TrainingOptions sum = mean;
  sum.reduction = Reduction::sum;
  sum.schedule.lr = 0.05;
  Options dp;
  dp.threads(1).replication_factor(2);
  EXPECT_LT(max_rel_diff(train_weights(dp, sum, 4, 3), train_weights(dp, mean, 4, 3)), 1e-6);
}

// A replica whose step fails (an id outside the vocabulary in its slice)
// stops every replica at once with its own error, not a peer's timeout; the
// model then refuses to run.
TEST(DataParallel, AFailingReplicaStopsTheGroupWithItsError) {
  ASSERT_TRUE(kCores);
  Forward f = forward("gpt2-tiny", 1, 7);
  Options dp;
  dp.threads(1).replication_factor(2);
  auto m = TrainingModel::create(f.g, dp, dp_adamw());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
  EXPECT_EQ((*m)->replicas(), 2);
  Tensor ids(DType::i32, {2, 1, 7}), pos(DType::i32, {2, 1, 7}), tgt(DType::i32, {2, 7});
  for (int i = 0; i < 7; ++i) pos.data<int32_t>()[i] = pos.data<int32_t>()[7 + i] = i;
  ids.data<int32_t>()[7 + 3] = 1 << 20;  // replica 1's micro-batch
  const auto start = std::chrono::steady_clock::now();
  auto r = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(r.status().code(), Code::kAborted) << r.status().to_string();
  EXPECT_NE(r.status().to_string().find("1048576"), std::string::npos) << r.status().to_string();
  auto again = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition) << again.status().to_string();
  // A wrong replica layout names the replicas.
  Forward g = forward("gpt2-tiny", 1, 7);
  auto m2 = TrainingModel::create(g.g, dp, dp_adamw());
  ASSERT_TRUE(m2.is_ok());
  Tensor three(DType::i32, {3, 7});
  auto bad = (*m2)->run({{"input_ids", &three}, {"positions", &pos}, {"targets", &tgt}});
  EXPECT_NE(bad.status().expected().find("x replicas"), std::string::npos) << bad.status().to_string();
  // Top-k's error feedback cannot follow a changing loss scale: refused when the model is made.
  TrainingOptions topk = dp_adamw();
  topk.data_parallel.compression = parallel::Compression::topk;
  topk.loss_scaling.mode = train::LossScaling::dynamic;
  EXPECT_EQ(TrainingModel::create(g.g, dp, topk).status().code(), Code::kUnimplemented);
}


// The exchange overlapped with the last backward pass (the default) gives
// the same bits as the exchange after it, for plain replicas and for
// replicas of pipeline stages. With small buckets the profile
// shows one exchange event per bucket (overlapped: each starts when the pass
// has finished its gradients; when the helper thread gets a core is up to the
// scheduler, so this test does not time it: runtime_test checks that
// on_ready fires mid-program, and `aspen bench train` measures the gain);
// after the pass, one per device.
// Options::profile with a path not ending in .json: a profile directory, as the commands' --profile writes.
TEST(TrainingModel, ProfileDirectory) {
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, 1);
  const std::string dir = ::testing::TempDir() + "aspen_train_profile_dir_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  Forward f = forward("gpt2-tiny", gold.B, gold.T - 1);
  Options o;
  o.threads(1).profile(dir);
  auto m = TrainingModel::create(f.g, o, sgd_momentum());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
  ASSERT_TRUE((*m)->run({{"input_ids", &all.input_ids}, {"positions", &all.positions}, {"targets", &all.targets}})
                  .is_ok());
  for (const char* file : {"report.html", "trace.pftrace", "trace.json", "profile.json"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + file)) << file;
  std::ifstream in(dir + "/profile.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["command"], "TrainingModel");
  EXPECT_FALSE(j["devices"].empty());
  EXPECT_FALSE(j["programs"].empty());
  // The facts every command's profile has (runtime/run_facts.h): peaks, planned and measured memory by part.
  EXPECT_GT(j["peaks"]["fma_gflops"].get<double>(), 0.0);
  EXPECT_GT(j["memory"]["planned_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["memory"]["peak_rss_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(j["memory"]["unplanned_bytes"].is_number());
  EXPECT_TRUE(j["mfu"].is_number());  // the step's FLOPs against the peak measured beside it
  std::filesystem::remove_all(dir);
}

TEST(DataParallel, OverlappedExchangeEqualsTheExchangeAfterThePass) {
  ASSERT_TRUE(kCores);
  std::map<std::string, Tensor> w[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    TrainingOptions t = dp_adamw();
    t.data_parallel.overlap = overlap == 1;
    t.data_parallel.bucket_bytes = 4096;
    Options dp;
    dp.threads(1).replication_factor(2).gradient_accumulation(2);
    w[overlap] = train_weights(dp, t, 4, 3);
    ASSERT_FALSE(w[overlap].empty());
  }
  EXPECT_TRUE(bitwise_equal(w[1], w[0]));
  // Replicas of pipeline stages: each stage's exchange overlaps its last backward pass.
  for (int overlap = 0; overlap < 2; ++overlap) {
    TrainingOptions t = dp_adamw();
    t.data_parallel.overlap = overlap == 1;
    t.data_parallel.bucket_bytes = 4096;
    t.pipeline = {2, train::PipelineSchedule::one_f_one_b};
    Options dp;
    dp.threads(1).replication_factor(2).gradient_accumulation(2);
    w[overlap] = train_weights(dp, t, 4, 3);
    ASSERT_FALSE(w[overlap].empty());
  }
  EXPECT_TRUE(bitwise_equal(w[1], w[0]));

  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, 1);
  const int64_t S = gold.T - 1;
  for (int overlap = 0; overlap < 2; ++overlap) {
    SCOPED_TRACE(overlap ? "overlapped" : "after the pass");
    const std::string path = ::testing::TempDir() + "aspen_overlap_trace_" + std::to_string(getpid()) + ".json";
    Forward f = forward("gpt2-tiny", gold.B / 2, S);
    Options o;
    o.threads(1).replication_factor(2).profile(path);
    TrainingOptions t = sgd_momentum();
    t.data_parallel.overlap = overlap == 1;
    t.data_parallel.bucket_bytes = 4096;
    auto m = TrainingModel::create(f.g, o, t);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
    ASSERT_TRUE((*m)->run({{"input_ids", &all.input_ids}, {"positions", &all.positions}, {"targets", &all.targets}})
                    .is_ok());
    std::ifstream in(path);
    const nlohmann::json doc = nlohmann::json::parse(in);
    // The first device's exchange events.
    std::map<int, std::string> names;
    for (const auto& ev : doc["traceEvents"])
      if (ev["ph"] == "M" && ev["name"] == "thread_name") names[ev["tid"].get<int>()] = ev["args"]["name"];
    int reduces = 0;
    for (const auto& ev : doc["traceEvents"])
      if (ev["ph"] == "X" && ev["name"] == "reduce gradients" && names[ev["tid"].get<int>()] == "cpu0") ++reduces;
    if (overlap) {
      EXPECT_GT(reduces, 3);  // gpt2-tiny's gradients in 4 KiB buckets
    } else {
      EXPECT_EQ(reduces, 1);
    }
    std::remove(path.c_str());
  }
}

// The profile shows each device's gradient exchange (data parallel) and its
// waits for activations and gradients (pipeline) beside its programs.
TEST(ParallelProfile, TracesShowTheExchanges) {
  ASSERT_TRUE(kCores);
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, 1);
  const int64_t S = gold.T - 1;
  for (bool pipeline : {false, true}) {
    SCOPED_TRACE(pipeline ? "2 stages" : "2 replicas");
    const std::string path = ::testing::TempDir() + "aspen_parallel_trace_" + std::to_string(getpid()) + ".json";
    Forward f = forward("gpt2-tiny", gold.B / 2, S);  // 2 replicas or 2 micro-batches of half the batch
    Options o;
    o.threads(1).profile(path);
    if (pipeline) {
      o.gradient_accumulation(2);
    } else {
      o.replication_factor(2);
    }
    TrainingOptions t = sgd_momentum();
    if (pipeline) t.pipeline = {2, train::PipelineSchedule::one_f_one_b};
    auto m = TrainingModel::create(f.g, o, t);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
    auto r = (*m)->run({{"input_ids", &all.input_ids}, {"positions", &all.positions}, {"targets", &all.targets}});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(text.empty());
    auto count = [&](const std::string& needle) {
      size_t n = 0;
      for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
      return n;
    };
    if (pipeline) {
      EXPECT_EQ(count("\"recv pipe.0\""), 2u);       // stage 1 waits for each micro-batch's activation
      EXPECT_EQ(count("\"recv grad pipe.0\""), 2u);  // stage 0 for each gradient
      // Each device's plan instructions (train/plan.h), named with their micro-batch, edge and peer.
      EXPECT_EQ(count("\"instruction\":\"forward m1\""), 2u);
      EXPECT_EQ(count("\"instruction\":\"backward m1 (accumulating)\""), 2u);
      EXPECT_EQ(count("\"instruction\":\"send activation e0 m1 -> 1\""), 1u);
      EXPECT_EQ(count("\"instruction\":\"recv tied_gradient p0 <- 1\""), 1u);
      EXPECT_EQ(count("\"instruction\":\"step shard 1 "), 1u);
    } else {
      EXPECT_EQ(count("\"reduce gradients\""), 2u);  // one per replica
      EXPECT_EQ(count("\"instruction\":\"backward m0\""), 2u);
      EXPECT_EQ(count("\"instruction\":\"reduce data[0,1] "), 2u);
    }
    std::remove(path.c_str());
  }
}

// The model's plan (train/plan.h) describes its layout: one device per mesh
// rank, the pipeline's cut (its edges, each stage's accumulators, the tied
// wte's gradient sent to its owner), every parameter stepped once per
// replica, and a plan that passes check_plan.
TEST(Plan, TheModelsPlanIsItsLayout) {
  ASSERT_TRUE(kCores);
  struct Case {
    const char* name;
    int replicas, stages, shards, acc;
  };
  for (const Case& c : {Case{"fused", 1, 1, 1, 1}, Case{"accumulation", 1, 1, 1, 2}, Case{"dp2", 2, 1, 1, 1},
                        Case{"pp2", 1, 2, 1, 4}, Case{"dp2 x pp2", 2, 2, 1, 2}, Case{"tp3", 1, 1, 3, 1},
                        Case{"pp2 x tp3", 1, 2, 3, 2}}) {
    SCOPED_TRACE(c.name);
    Forward f = forward("gpt2-tiny", 2, 7, c.shards);
    Options o;
    o.threads(1).replication_factor(c.replicas).tensor_parallel(c.shards).gradient_accumulation(c.acc);
    TrainingOptions t = sgd_momentum();
    t.pipeline = {c.stages, train::PipelineSchedule::one_f_one_b};
    auto m = TrainingModel::create(f.g, o, t);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const train::Plan* plan = &(*m)->plan();
    const Status checked = train::check_plan(*plan);
    EXPECT_TRUE(checked.is_ok()) << checked.to_string() << "\n" << train::plan_text(*plan);
    ASSERT_EQ(int(plan->devices.size()), c.replicas * c.stages * c.shards);
    EXPECT_EQ(plan->spec.fused, std::string(c.name) == "fused");
    const size_t n = (*m)->programs().params.size();
    // Every parameter is stepped once per tensor shard: by one replica (the process's replicas share the
    // weights; without stages each steps its optimizer shard), or by every replica when each has its own
    // copy (tensor shards).
    if (!plan->spec.fused)
      for (int shard = 0; shard < c.shards; ++shard) {
        std::vector<int> stepped(n, 0);
        for (const train::DevicePlan& d : plan->devices)
          if (d.coord.tensor == shard)
            for (const train::Instr& i : d.instrs)
              if (i.kind == train::InstrKind::step)
                for (int p : i.params) ++stepped[size_t(p)];
        for (size_t p = 0; p < n; ++p)
          EXPECT_EQ(stepped[p], c.shards > 1 ? c.replicas : 1) << (*m)->programs().params[p] << " shard " << shard;
      }
    if (c.stages > 1) {
      EXPECT_EQ(plan->spec.edges.size(), size_t(1));  // the residual stream
      // The tied wte: its last stage's gradient goes to stage 0, which steps it.
      const auto& params = (*m)->programs().params;
      const int wte = int(std::find(params.begin(), params.end(), "transformer.wte.weight") - params.begin());
      ASSERT_LT(size_t(wte), params.size());
      EXPECT_EQ(plan->spec.params[size_t(wte)].stages, (std::vector<int>{0, 1}));
      int tied = 0;
      for (const train::Instr& i : plan->devices[0].instrs)
        tied += i.kind == train::InstrKind::recv && i.payload == train::Payload::tied_gradient && i.edge == wte;
      EXPECT_EQ(tied, 1);
      for (const auto& acc : plan->spec.accumulators) EXPECT_FALSE(acc.empty());
    }
  }
}

}  // namespace
}  // namespace aspen::api

namespace aspen::api {
namespace {

// NOTE [node FLOPs]: one training step's instructions, traced, add up to the model FLOPs the train bench's MFU
// divides by: 6 · (parameters multiplied) · tokens + attention's 12 · layers · seq · width per token; and
// every instruction of a block names its layer (NOTE [name scopes]), forward and backward.
TEST(TrainingProfile, StepFlopsAreTheModelFlopsByLayer) {
  const int64_t V = 38, C = 32, L = 2, F = 40, B = 2, S = 6;
  graph::Graph g;
  graph::Builder b(g);
  const models::CausalLmOptions co{.batch = B, .seq = S, .with_loss = true};
  ASSERT_TRUE(models::build_gpt2(b, {.vocab = V, .n_positions = 16, .d_model = C, .n_layer = L, .n_head = 4, .d_ff = F},
                                 co).is_ok());
  std::map<std::string, Tensor> w;
  uint64_t stream = 0;
  for (int32_t i : g.parameter_nodes()) {
    Tensor x(DType::f32, g.type(g.node(i).outputs[0]).shape);
    philox_fill_normal(x.span<float>(), 3, stream++, 0, 0.0f, 0.2f);
    w.emplace(g.node(i).name, std::move(x));
  }
  profile::TraceRecorder rec;
  Options o;
  o.threads(1).trace_recorder(&rec);
  auto m = TrainingModel::create(g, o, golden_adamw());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->copy_weights_to_device(ptrs(w)).is_ok());
  Tensor ids(DType::i32, {B, S}), pos(DType::i32, {B, S}), tgt(DType::i32, {B * S});
  for (int64_t i = 0; i < B * S; ++i) {
    ids.data<int32_t>()[i] = int32_t((7 * i + 1) % V);
    pos.data<int32_t>()[i] = int32_t(i % S);
    tgt.data<int32_t>()[i] = int32_t((5 * i + 2) % V);
  }
  rec.clear();
  ASSERT_TRUE((*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}}).is_ok());
  double flops = 0;
  int64_t fc_forward = 0, fc_backward = 0;
  for (const profile::TraceEvent& e : rec.events()) {
    flops += double(e.flops);
    std::string layer, pass;
    for (const auto& [k, v] : e.args) {
      if (k == "layer") layer = v;
      if (k == "pass") pass = v;
    }
    if (layer == "transformer.h.1.mlp.c_fc") ++(pass == "backward" ? fc_backward : fc_forward);
  }
  const double P = double(L * (C * 3 * C + C * C + C * F + F * C) + V * C);  // the tied head counted once
  EXPECT_DOUBLE_EQ(flops, double(B * S) * (6.0 * P + 12.0 * double(L * S * C)));
  EXPECT_GE(fc_forward, 1);
  EXPECT_GE(fc_backward, 2);  // its input's gradient and its weight's
}

}  // namespace
}  // namespace aspen::api
