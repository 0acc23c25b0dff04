// api/training_testing.h: helpers for the TrainingModel tests (test-only):
// the gpt2-tiny/gptj-tiny checkpoints and training goldens of
// models/testdata, their batches, and a few steps of training on them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/training_model.h"
#include "core/philox.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
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
    Status s = models::build_causal_lm(b, ckpt->config(), o);
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

// AdamW with clipping at 0.5: the norm of the reduced gradient decides the step.
inline TrainingOptions dp_adamw() {
  TrainingOptions t = golden_adamw();
  t.clip_grad_norm = 0.5;
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
                                                   std::unique_ptr<TrainingModel>* keep = nullptr,
                                                   const std::function<void(graph::Graph&)>& edit = {}) {
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, gold.steps);
  const int64_t acc = options.gradient_accumulation_, L = options.replication_factor_, R = L * processes;
  const int64_t micro = batch / (acc * R);
  Forward f = forward("gpt2-tiny", micro, gold.T - 1, options.tensor_parallel_);
  if (edit) edit(f.g);
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

// A random 4-head model of `family` with 38 = 2 x 19 classes, built as one
// shard of `tp` (the vocabulary split when vp), trained for `steps` steps of
// 2 micro-batches of [2, 6] (replicas take their share) from the same
// weights and batches whatever the layout; returns the whole weights and
// optimizer state, and the loss of one evaluated micro-batch. Under MPI
// (Options::mpi) each process feeds its replica's micro-batches.
struct SmallRun {
  std::map<std::string, Tensor> weights, state;
  std::vector<StepStats> steps;
  float eval = 0.0f;
};
inline SmallRun train_small(const std::string& family, bool vp, const Options& o, const TrainingOptions& t, int steps,
                            int processes = 1) {
  // Replicas in all: this process's, times the processes (with the model
  // across processes, the processes per replica are stages x shards).
  const int64_t B = 2, S = 6, tp = o.tensor_parallel_;
  const int64_t R = o.model_across_processes_ ? processes : o.replication_factor_ * processes;
  auto build = [&](int64_t shards, int64_t batch) {
    graph::Graph g;
    graph::Builder b(g);
    const models::CausalLmOptions co{
        .batch = batch, .seq = S, .with_loss = true, .tensor_parallel = shards, .vocab_parallel = shards > 1 && vp};
    const Status st =
        family == "gpt2"
            ? models::build_gpt2(b, {.vocab = 38, .n_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 4,
                                     .d_ff = 40}, co).status()
        : family == "llama"  // grouped-query attention (2 kv heads), Qwen2's q/k/v biases
            ? models::build_llama(b, {.vocab = 38, .n_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 4,
                                      .n_kv_head = 2, .head_dim = 0, .d_ff = 40, .qkv_bias = true}, co).status()
            : models::build_gptj(b, {.vocab = 38, .n_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 4,
                                     .rotary_dim = 4, .d_ff = 40}, co).status();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return g;
  };
  const graph::Graph whole = build(1, B), shard = build(tp, B / R);
  std::map<std::string, Tensor> w;
  uint64_t stream = 0;
  for (int32_t i : whole.parameter_nodes()) {
    const graph::Node& n = whole.node(i);
    Tensor x(DType::f32, whole.type(n.outputs[0]).shape);
    philox_fill_normal(x.span<float>(), 21, stream++, 0, 0.0f, 0.2f);
    w.emplace(n.name, std::move(x));
  }
  SmallRun run;
  auto m = TrainingModel::create(shard, o, t);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return run;
  EXPECT_EQ((*m)->vocab_parallel(), tp > 1 && vp);
  EXPECT_TRUE((*m)->copy_weights_to_device(ptrs(w)).is_ok());
  const char* table = family == "llama" ? "model.embed_tokens.weight" : "transformer.wte.weight";
  EXPECT_EQ((*m)->weight_types().at(table).second.to_string(), "[38, 32]");  // whole, whatever the layout
  const int64_t acc = o.gradient_accumulation_;  // acc x R micro-batches of [B / R, S]: 2 of [B, S] in all
  EXPECT_EQ(acc * R * (B / R), 2 * B);
  const int64_t mb = B / R, L = R / processes, p = (*m)->process();
  for (int step = 0; step < steps; ++step) {
    // This process's micro-batches: slot a·L + l is the step's micro-batch a·R + p·L + l.
    Tensor ids(DType::i32, {acc * L * mb, S}), pos(DType::i32, {acc * L * mb, S}), tgt(DType::i32, {acc * L * mb * S});
    for (int64_t a = 0; a < acc; ++a)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t k = 0; k < mb * S; ++k) {
          const int64_t i = ((a * R + p * L + l) * mb) * S + k, slot = ((a * L + l) * mb) * S + k;
          ids.data<int32_t>()[slot] = int32_t((7 * i + 3 * step + 1) % 38);
          pos.data<int32_t>()[slot] = int32_t(i % S);
          tgt.data<int32_t>()[slot] = int32_t((5 * i + step) % 38);
        }
    auto r = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (!r.is_ok()) return run;
    run.steps.insert(run.steps.end(), (*m)->last_steps().begin(), (*m)->last_steps().end());
  }
  run.weights = std::move((*m)->copy_weights_to_host()).value();
  run.state = std::move((*m)->copy_optimizer_state_to_host()).value();
  Tensor ids(DType::i32, {B / R, S}), pos(DType::i32, {B / R, S}), tgt(DType::i32, {B / R * S});
  for (int64_t i = 0; i < B / R * S; ++i) {
    ids.data<int32_t>()[i] = int32_t((3 * i + 2) % 38);
    pos.data<int32_t>()[i] = int32_t(i % S);
    tgt.data<int32_t>()[i] = int32_t((11 * i + 5) % 38);
  }
  auto e = (*m)->evaluate({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  if (e.is_ok()) run.eval = *e;
  return run;
}

}  // namespace aspen::api::testing
