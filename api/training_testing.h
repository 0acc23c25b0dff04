// api/training_testing.h: helpers for the TrainingModel tests (test-only):
// the gpt2-tiny/gptj-tiny checkpoints and training goldens of
// models/testdata, their batches, and a few steps of training on them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/training_model.h"
#include "io/safetensors.h"
#include "models/gpt2.h"
#include "models/gptj.h"
#include "models/weights.h"

namespace aspen::api::testing {

inline const std::string kTestdata = ASPEN_MODELS_TESTDATA;

struct Golden {
  std::shared_ptr<io::SafetensorsFile> file;
  Tensor input_ids;  // i32 [steps, B, T]
  int64_t steps = 0, B = 0, T = 0;
};

inline Golden read_golden(const std::string& model) {
  Golden g;
  auto f = io::SafetensorsFile::open(kTestdata + "/" + model + "/train_golden.safetensors");
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  g.file = std::make_shared<io::SafetensorsFile>(std::move(f).value());
  auto ids = g.file->read("input_ids");
  EXPECT_TRUE(ids.is_ok()) << ids.status().to_string();
  g.steps = ids->shape()[0], g.B = ids->shape()[1], g.T = ids->shape()[2];
  g.input_ids = Tensor(DType::i32, ids->shape());
  for (int64_t i = 0; i < ids->numel(); ++i) g.input_ids.data<int32_t>()[i] = int32_t(ids->data<int64_t>()[i]);
  return g;
}

// HF's shifted loss over [B, T] ids is ours over inputs ids[:, :T-1] and targets ids[:, 1:].
struct Batches {
  Tensor input_ids, positions, targets;  // [steps*B, T-1] each (the combined batch), targets [steps*B*(T-1)]
};
inline Batches shifted(const Golden& g, int64_t steps) {
  const int64_t S = g.T - 1;
  Batches b{Tensor(DType::i32, {steps * g.B, S}), Tensor(DType::i32, {steps * g.B, S}),
            Tensor(DType::i32, {steps * g.B * S})};
  for (int64_t r = 0; r < steps * g.B; ++r)
    for (int64_t t = 0; t < S; ++t) {
      b.input_ids.data<int32_t>()[r * S + t] = g.input_ids.data<int32_t>()[r * g.T + t];
      b.positions.data<int32_t>()[r * S + t] = int32_t(t);
      b.targets.data<int32_t>()[r * S + t] = g.input_ids.data<int32_t>()[r * g.T + t + 1];
    }
  return b;
}

// The model's forward graph with a loss, for [batch, seq], and its checkpoint's weights.
struct Forward {
  graph::Graph g;
  std::map<std::string, Tensor> weights;
};
inline Forward forward(const std::string& model, int64_t batch, int64_t seq, int64_t tensor_parallel = 1) {
  Forward f;
  auto ckpt = models::Checkpoint::open(kTestdata + "/" + model);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto build = [&](graph::Graph& g, int64_t tp) {
    graph::Builder b(g);
    const models::CausalLmOptions o{.batch = batch, .seq = seq, .with_loss = true, .tensor_parallel = tp};
    Status s = ckpt->config().gpt2() ? build_gpt2(b, *ckpt->config().gpt2(), o).status()
                                     : build_gptj(b, *ckpt->config().gptj(), o).status();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  };
  graph::Graph whole;  // the checkpoint's full weights (a tensor-parallel graph holds one shard's)
  build(whole, 1);
  auto w = models::read_weights(whole, *ckpt);
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  f.weights = std::move(w).value();
  if (tensor_parallel > 1) {
    build(f.g, tensor_parallel);
  } else {
    f.g = std::move(whole);
  }
  return f;
}

inline std::map<std::string, const Tensor*> ptrs(const std::map<std::string, Tensor>& m) {
  std::map<std::string, const Tensor*> out;
  for (const auto& [k, v] : m) out.emplace(k, &v);
  return out;
}

inline TrainingOptions golden_adamw() {
  TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::adamw;
  t.optimizer.weight_decay = 0.1;
  t.schedule.lr = 1e-2;
  return t;
}

// SGD with momentum 0.9, lr 0.1: no Adam normalisation to amplify rounding,
// so layouts can be compared to 1e-5.
inline TrainingOptions sgd_momentum() {
  TrainingOptions t = golden_adamw();
  t.optimizer.kind = train::OptimizerKind::sgd;
  t.optimizer.momentum = 0.9;
  t.schedule.lr = 0.1;
  return t;
}

// GPT-2's c_attn key bias has a true gradient of 0 (testdata/README.md): f32
// noise there is amplified by Adam, so those entries are not compared.
inline bool key_bias_entry(const std::string& name, int64_t i, int64_t d_model) {
  return name.find("attn.c_attn.bias") != std::string::npos && i >= d_model && i < 2 * d_model;
}

// Weights after `steps` steps of a model made by `options` on the golden batches.
// Weights after `steps` steps of a model made by `options` (with `processes`
// processes of an MPI job) on the golden batches: global batches of `batch`
// rows cycling through the golden's 20, each cut into micro-batches; this
// process feeds its replicas' ones (micro-batch a of global replica g is
// number a·R + g of the step, TrainingModel's order). `keep` receives the model.
inline std::map<std::string, Tensor> train_weights(const Options& options, const TrainingOptions& t, int64_t batch,
                                                   int64_t steps, std::vector<StepStats>* stats = nullptr,
                                                   int processes = 1,
                                                   std::unique_ptr<TrainingModel>* keep = nullptr) {
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, gold.steps);
  const int64_t acc = options.gradient_accumulation_, L = options.replication_factor_, R = L * processes;
  const int64_t micro = batch / (acc * R);
  Forward f = forward("gpt2-tiny", micro, gold.T - 1, options.tensor_parallel_);
  auto m = TrainingModel::create(f.g, options, t);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return {};
  EXPECT_TRUE((*m)->copy_weights_to_device(ptrs(f.weights)).is_ok());
  const int64_t p = (*m)->process(), iters = options.device_iterations_;
  const int64_t S = gold.T - 1, per_call = iters * acc * L * micro;
  for (int64_t done = 0; done < steps; done += iters) {
    Tensor ids(DType::i32, {per_call, S}), pos(DType::i32, {per_call, S}), tgt(DType::i32, {per_call * S});
    int64_t r = 0;
    for (int64_t it = 0; it < iters; ++it)
      for (int64_t a = 0; a < acc; ++a)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t k = 0; k < micro; ++k, ++r) {
            const int64_t j = a * R + p * L + l;  // the micro-batch's number in its step
            const int64_t src = ((done + it) * batch + j * micro + k) % (gold.steps * gold.B);
            std::copy_n(all.input_ids.data<int32_t>() + src * S, S, ids.data<int32_t>() + r * S);
            std::copy_n(all.positions.data<int32_t>() + src * S, S, pos.data<int32_t>() + r * S);
            std::copy_n(all.targets.data<int32_t>() + src * S, S, tgt.data<int32_t>() + r * S);
          }
    auto out = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    if (!out.is_ok()) return {};
    if (stats) stats->insert(stats->end(), (*m)->last_steps().begin(), (*m)->last_steps().end());
  }
  auto weights = std::move((*m)->copy_weights_to_host()).value();
  if (keep) *keep = std::move(m).value();
  return weights;
}

// Each step's loss within loss_tol relative of the reference's and, when
// norm_tol > 0, its gradient norm within norm_tol relative.
inline void expect_steps_near(const std::vector<StepStats>& got, const std::vector<StepStats>& want, double loss_tol,
                              double norm_tol = 0.0) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, loss_tol * want[i].loss) << "step " << i + 1;
    if (norm_tol > 0) {
      EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, norm_tol * want[i].grad_norm) << "step " << i + 1;
    }
  }
}

inline double max_rel_diff(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.data<float>()[i], y = u.data<float>()[i];
      if (key_bias_entry(name, i, 48)) continue;
      worst = std::max(worst, std::abs(x - y) / (1.0 + std::abs(y)));
    }
  }
  return worst;
}

inline bool bitwise_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a)
    if (!b.count(name) || std::memcmp(t.raw(), b.at(name).raw(), t.nbytes()) != 0) return false;
  return true;
}

}  // namespace aspen::api::testing
