// Data-parallel training over MPI, run under `mpirun -np 2` and `-np 4`
// (CTest label `mpi`): four replicas in all, 4 / np per process, so -np 2 is
// the hierarchical layout (threads inside each process, MPI across) and -np 4
// plain MPI. Every rank also trains one device with accumulation 4 on the same
// micro-batches, in-process, as the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <iostream>

#include <filesystem>
#include <sstream>

#include "api/trainer.h"
#include "api/training_testing.h"
#include "core/philox.h"
#include "io/npz.h"
#include "kernels/matmul_choice.h"
#include "parallel/mpi/mpi_communicator.h"
#include "train/demo.h"
#include "train/report.h"

namespace aspen::api {
namespace {

using namespace testing;  // NOLINT: the helpers of this test

constexpr int kReplicas = 4;

int local_replicas() { return kReplicas / parallel::mpi_world_size(); }

// Every rank's weights are the same bits: FNV-1a of all of them, all-gathered.
void expect_same_on_every_rank(const std::map<std::string, Tensor>& w) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : w) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  auto comm = parallel::MpiCommunicator::world();
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  std::vector<float> mine(2), all(size_t(2 * (*comm)->size()));
  std::memcpy(mine.data(), &h, 8);
  ASSERT_TRUE((*comm)->all_gather(mine.data(), all.data(), 2, DType::f32).is_ok());
  for (int r = 0; r < (*comm)->size(); ++r) EXPECT_EQ(0, std::memcmp(all.data() + 2 * r, &h, 8)) << "rank " << r;
}

TrainingOptions sgd() { return sgd_momentum(); }

// NOTE [matmul choice]: the processes of a job run process 0's kernels. Each
// process starts from choices of its own, a different backend per rank for
// every product the model has; after the job's model is made, every process
// holds process 0's, and the job trains with the same bits on every rank.
TEST(DataParallelMpi, MatmulChoicesAgreeAcrossProcesses) {
  const int rank = parallel::mpi_world_rank();
  const kernels::MatmulChoice before = kernels::set_matmul_choice(kernels::MatmulChoice::measured);
  kernels::clear_matmul_choices();
  // Measure the model's products in every process, then give each process its own backend for them.
  Options probe;
  probe.threads(1).replication_factor(local_replicas());
  ASSERT_FALSE(train_weights(probe, sgd(), kReplicas, 1, nullptr, 1).empty());
  std::string text = kernels::matmul_choices_text(), mine;
  const char* names[3] = {"aspen", "oneDNN", "OpenBLAS"};
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (n++ >= 2)
      for (const char* name : names)
        if (line.size() > std::strlen(name) && line.ends_with(std::string(" ") + name)) {
          line = line.substr(0, line.size() - std::strlen(name)) + names[(rank + (n % 2)) % 2];  // rank-dependent
          break;
        }
    mine += line + "\n";
  }
  ASSERT_TRUE(kernels::adopt_matmul_choices(mine, "the test").is_ok());
  Options dp;
  dp.threads(1).replication_factor(local_replicas()).mpi(true);
  const auto wd = train_weights(dp, sgd(), kReplicas, 3, nullptr, parallel::mpi_world_size());
  ASSERT_FALSE(wd.empty());
  expect_same_on_every_rank(wd);
  // The choices themselves: process 0's everywhere.
  std::string now = kernels::matmul_choices_text();
  uint64_t h = 1469598103934665603ull;
  for (char c : now) h = (h ^ uint8_t(c)) * 1099511628211ull;
  auto comm = parallel::MpiCommunicator::world();
  ASSERT_TRUE(comm.is_ok());
  std::vector<float> me(2), all(size_t(2 * (*comm)->size()));
  std::memcpy(me.data(), &h, 8);
  ASSERT_TRUE((*comm)->all_gather(me.data(), all.data(), 2, DType::f32).is_ok());
  for (int r = 0; r < (*comm)->size(); ++r) EXPECT_EQ(0, std::memcmp(all.data() + 2 * r, &h, 8)) << "rank " << r;
  kernels::clear_matmul_choices();
  kernels::set_matmul_choice(before);
}

TrainingOptions clipped_adamw() {
  TrainingOptions t = golden_adamw();
  t.clip_grad_norm = 0.5;
  return t;
}

// Five steps of 4 replicas (micro-batch 1) against one device accumulating the
// same 4 micro-batches: within 1e-5 with SGD; AdamW amplifies the rounding of
// the other addition order where gradients are tiny (see training_model_test).
TEST(DataParallelMpi, ReplicasEqualOneDevice) {
  for (bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "adamw, clipped" : "sgd");
    const TrainingOptions t = adam ? clipped_adamw() : sgd();
    Options one;
    one.threads(1).gradient_accumulation(kReplicas);
    std::vector<StepStats> s1, sd;
    const auto w1 = train_weights(one, t, kReplicas, 5, &s1);
    Options dp;
    dp.threads(1).replication_factor(local_replicas()).mpi(true);
    const auto wd = train_weights(dp, t, kReplicas, 5, &sd, parallel::mpi_world_size());
    ASSERT_FALSE(w1.empty() || wd.empty());
    EXPECT_LT(max_rel_diff(wd, w1), adam ? 1e-4 : 1e-5);
    ASSERT_EQ(sd.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      if (i == 0) {  // the same weights, and the losses gathered and added in the same order
        EXPECT_EQ(sd[i].loss, s1[i].loss);
      } else {
        EXPECT_NEAR(sd[i].loss, s1[i].loss, 1e-6 * s1[i].loss) << "step " << i + 1;
      }
      if (adam) {  // measured when clipping
        EXPECT_NEAR(sd[i].grad_norm, s1[i].grad_norm, 1e-5 * s1[i].grad_norm) << "step " << i + 1;
      }
    }
    expect_same_on_every_rank(wd);
  }
}

// Replicas of a 2-stage pipeline over MPI (each stage's gradients reduced over
// its replicas in-process and across processes) against one device.
TEST(DataParallelMpi, PipelineStagesWithReplicasEqualOneDevice) {
  for (bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "adamw, clipped" : "sgd");
    TrainingOptions t = adam ? clipped_adamw() : sgd();
    Options one;
    one.threads(1).gradient_accumulation(kReplicas);
    const auto w1 = train_weights(one, t, kReplicas, 4);
    t.pipeline = {2, train::PipelineSchedule::one_f_one_b};
    Options dp;
    dp.threads(1).replication_factor(local_replicas()).mpi(true);
    const auto wd = train_weights(dp, t, kReplicas, 4, nullptr, parallel::mpi_world_size());
    ASSERT_FALSE(w1.empty() || wd.empty());
    EXPECT_LT(max_rel_diff(wd, w1), adam ? 1e-4 : 1e-5);
    expect_same_on_every_rank(wd);
  }
}

// Tensor shards (3: gpt2-tiny's heads) in each process, replicas across the
// processes: each shard's gradients all-reduced with the same shard of the
// other processes.
TEST(DataParallelMpi, TensorShardsWithReplicasAcrossProcessesEqualOneDevice) {
  const int P = parallel::mpi_world_size();
  TrainingOptions t = sgd();
  Options one;
  one.threads(1).gradient_accumulation(4);
  const auto w1 = train_weights(one, t, 4, 3);
  Options dp;
  dp.threads(1).gradient_accumulation(4 / P).tensor_parallel(3).mpi(true);
  const auto wd = train_weights(dp, t, 4, 3, nullptr, P);
  ASSERT_FALSE(w1.empty() || wd.empty());
  EXPECT_LT(max_rel_diff(wd, w1), 1e-5);
  expect_same_on_every_rank(wd);
}

// Gradients sent as bf16 across processes: every rank still ends with the same
// bits, and the weights stay near the f32 run's.
TEST(DataParallelMpi, Bf16CompressionKeepsRanksIdentical) {
  TrainingOptions t = sgd();
  Options dp;
  dp.threads(1).replication_factor(local_replicas()).mpi(true);
  const auto plain = train_weights(dp, t, kReplicas, 3, nullptr, parallel::mpi_world_size());
  t.data_parallel.compression = parallel::Compression::bf16;
  t.data_parallel.bucket_bytes = 4096;  // many buckets
  const auto packed = train_weights(dp, t, kReplicas, 3, nullptr, parallel::mpi_world_size());
  ASSERT_FALSE(plain.empty() || packed.empty());
  const double d = max_rel_diff(packed, plain);
  EXPECT_GT(d, 0.0);   // compression did something
  EXPECT_LT(d, 1e-2);  // bf16 keeps 8 bits of each gradient
  expect_same_on_every_rank(packed);
}

// ZeRO-1 across processes: the same bits as keeping the whole state everywhere
// (each tensor's update is the same op on the same reduced gradient, then
// copied), the whole state gathered for a checkpoint, and each process keeping
// only its shards' state; also with the state kept in f16 and bf16 (PopTorch's
// first/second_order_momentum_accum_type), gathered in its types.
TEST(DataParallelMpi, ShardedOptimizerStateEqualsTheWholeState) {
  const int P = parallel::mpi_world_size();
  for (bool half : {false, true}) {
    SCOPED_TRACE(half ? "f16 / bf16 state" : "f32 state");
    std::map<std::string, Tensor> w[2], state[2];
    size_t kept[2] = {0, 0};
    for (int zero = 0; zero < 2; ++zero) {
      TrainingOptions t = clipped_adamw();
      t.data_parallel.shard_optimizer_state = zero == 1;
      t.data_parallel.bucket_bytes = 8192;
      if (half) t.optimizer.first_order_dtype = DType::f16, t.optimizer.second_order_dtype = DType::bf16;
      Options dp;
      dp.threads(1).replication_factor(local_replicas()).mpi(true);
      std::unique_ptr<TrainingModel> model;
      w[zero] = train_weights(dp, t, kReplicas, 3, nullptr, P, &model);
      ASSERT_TRUE(model);
      EXPECT_EQ(model->optimizer_state_sharded(), zero == 1);
      auto st = model->copy_optimizer_state_to_host();  // collective with ZeRO-1
      ASSERT_TRUE(st.is_ok()) << st.status().to_string();
      state[zero] = std::move(st).value();
      for (const compiler::Binding& b : model->session().parameters()) kept[zero] += b.name.starts_with("optimizer.");
      EXPECT_EQ(model->optimizer_state_types().size(), state[zero].size());
      for (const auto& [name, st_t] : state[zero]) {
        const DType want = !half || name == train::kStepName ? DType::f32
                           : name.starts_with("optimizer.exp_avg_sq.") ? DType::bf16
                                                                        : DType::f16;
        EXPECT_EQ(st_t.dtype(), want) << name;
      }
    }
    ASSERT_FALSE(w[0].empty() || w[1].empty());
    EXPECT_TRUE(bitwise_equal(w[1], w[0]));
    EXPECT_TRUE(bitwise_equal(state[1], state[0]));
    EXPECT_LT(kept[1], kept[0]);  // this process keeps its shards only
    expect_same_on_every_rank(w[1]);
  }
}

// Top-k with error feedback: sending every entry (ratio 1) is the plain sum up
// to the order of additions; sending 5% still leaves every rank with the same
// bits, and what was held back is not lost (it trains on).
TEST(DataParallelMpi, TopkCompressionWithErrorFeedback) {
  const int P = parallel::mpi_world_size();
  TrainingOptions t = sgd();
  t.data_parallel.bucket_bytes = 16384;
  Options dp;
  dp.threads(1).replication_factor(local_replicas()).mpi(true);
  std::vector<StepStats> s_plain, s_all, s_few;
  const auto plain = train_weights(dp, t, kReplicas, 4, &s_plain, P);
  t.data_parallel.compression = parallel::Compression::topk;
  t.data_parallel.topk_ratio = 1.0;
  const auto all = train_weights(dp, t, kReplicas, 4, &s_all, P);
  t.data_parallel.topk_ratio = 0.05;
  const auto few = train_weights(dp, t, kReplicas, 4, &s_few, P);
  ASSERT_FALSE(plain.empty() || all.empty() || few.empty());
  EXPECT_LT(max_rel_diff(all, plain), 1e-6);
  EXPECT_GT(max_rel_diff(few, plain), 1e-6);
  expect_same_on_every_rank(few);
  ASSERT_EQ(s_few.size(), 4u);
  EXPECT_LT(s_few.back().loss, s_few.front().loss);  // it still learns
}

// A process started with other options is caught when the model is made,
// before any compute, on every rank.
TEST(DataParallelMpi, MismatchedOptionsAreCaughtAtStartUp) {
  Forward f = forward("gpt2-tiny", 1, 7);
  TrainingOptions t = sgd();
  if (parallel::mpi_world_rank() == 1) t.schedule.lr = 0.2;
  Options dp;
  dp.threads(1).replication_factor(local_replicas()).mpi(true);
  auto m = TrainingModel::create(f.g, dp, t);
  ASSERT_FALSE(m.is_ok());
  // The error names the option that differs and this process's value.
  EXPECT_EQ(m.status().subject().rfind("training model 'training.schedule.lr' on process", 0), 0u)
      << m.status().to_string();
  EXPECT_NE(m.status().to_string().find(parallel::mpi_world_rank() == 1 ? "(0.2 here)" : "(0.1 here)"),
            std::string::npos)
      << m.status().to_string();
  EXPECT_NE(m.status().to_string().find("differs"), std::string::npos) << m.status().to_string();
  // A layout that differs is caught before any group is made.
  Options other = dp;
  if (parallel::mpi_world_rank() == 1) other.gradient_accumulation(2);
  auto n = TrainingModel::create(f.g, other, sgd());
  ASSERT_FALSE(n.is_ok());
  EXPECT_EQ(n.status().subject().rfind("training layout 'options.gradient_accumulation' on process", 0), 0u)
      << n.status().to_string();
}

// The training job's start-up agreement: a process started with another seed
// or another data.train is refused on every rank, naming the key, before any
// compute (it used to run to the end and record the seed of process 0).
TEST(TrainerMpi, ProcessesThatDisagreeAreRefusedNamingTheKey) {
  const std::string dir = "/tmp/aspen_mpi_trainer_" + std::to_string(getppid());  // one folder for the job's ranks
  if (parallel::mpi_world_rank() == 0) {  // EXPECT, not ASSERT: the other ranks wait in the collective below
    EXPECT_TRUE(train::write_byte_tokenizer(dir + "/tok").is_ok());
    EXPECT_TRUE(train::write_addition_shards(train::make_addition_task(0), 1, dir + "/data", dir + "/tok").is_ok());
  }
  auto world = parallel::MpiCommunicator::world();
  ASSERT_TRUE(world.is_ok());
  float one = 1;
  ASSERT_TRUE((*world)->all_reduce(std::span<float>(&one, 1)).is_ok());  // the data is written
  train::TrainConfig c;
  c.name = "agree";
  c.model.n_layer = 1, c.model.n_head = 2, c.model.d_model = 16, c.model.n_positions = 16;
  c.data.train = dir + "/data";
  c.data.seq = 8;
  c.batch.replicas = parallel::mpi_world_size();
  c.train.steps = 2;
  c.train.threads = 1;
  c.schedule.warmup_steps = 0;
  c.log.run_dir = dir + "/run";
  c.log.progress = "off";
  auto expect_refused = [&](train::TrainConfig cfg, const std::string& key) {
    std::ostringstream sink;
    auto t = Trainer::create(cfg, {.out = &sink, .mpi = true});
    ASSERT_FALSE(t.is_ok()) << key;
    EXPECT_EQ(t.status().subject().rfind("config key '" + key + "' on process " +
                                             std::to_string(parallel::mpi_world_rank()), 0), 0u)
        << t.status().to_string();
    EXPECT_NE(t.status().found().find("differs"), std::string::npos) << t.status().to_string();
  };
  train::TrainConfig seeded = c;
  if (parallel::mpi_world_rank() == 1) seeded.train.seed = 7;
  expect_refused(seeded, "train.seed");
  train::TrainConfig other_data = c;
  if (parallel::mpi_world_rank() == 1) other_data.data.train = dir + "/elsewhere";
  expect_refused(other_data, "data.train");
  // The same config on every rank (train.threads may differ: it does not change the result) trains.
  train::TrainConfig same = c;
  if (parallel::mpi_world_rank() == 1) same.train.threads = 2;
  std::ostringstream sink;
  auto t = Trainer::create(same, {.out = &sink, .mpi = true});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto r = (*t)->run();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  t->reset();
  ASSERT_TRUE((*world)->all_reduce(std::span<float>(&one, 1)).is_ok());
  if (parallel::mpi_world_rank() == 0) std::filesystem::remove_all(dir);
}

// A user's ONNX model trained from arrays by the job's processes (batch.replicas = the processes): the
// losses of one process with that much accumulation on the same global batches.
TEST(TrainerMpi, OnnxModelFromArraysEqualsAccumulation) {
  const std::string dir = "/tmp/aspen_mpi_trainer_onnx_" + std::to_string(getppid());
  const int rank = parallel::mpi_world_rank(), np = parallel::mpi_world_size();
  auto world = parallel::MpiCommunicator::world();
  ASSERT_TRUE(world.is_ok());
  if (rank == 0) {
    std::map<std::string, Tensor> arrays;
    arrays.emplace("x", Tensor(DType::f32, Shape{32, 7, 16}));
    arrays.emplace("targets", Tensor(DType::f32, Shape{32, 7, 16}));
    philox_fill_uniform(arrays.at("x").span<float>(), 1, 0, 0, -1, 1);
    philox_fill_uniform(arrays.at("targets").span<float>(), 2, 0, 0, -1, 1);
    std::filesystem::create_directories(dir);
    EXPECT_TRUE(io::write_npz(dir + "/train.npz", arrays).is_ok());
  }
  float one = 1;
  ASSERT_TRUE((*world)->all_reduce(std::span<float>(&one, 1)).is_ok());  // the data is written
  train::TrainConfig c;
  c.name = "onnx";
  c.model.from = std::string(ASPEN_MODELS_TESTDATA) + "/onnx/block_dynamo/model.onnx";
  c.model.loss = "mse";
  c.data.train = dir + "/train.npz";
  c.data.val_fraction = 0;
  c.optimizer.lr = 1e-2;
  c.batch.micro = 2;
  c.batch.replicas = np;
  c.train.steps = 4;
  c.train.threads = 1;
  c.log.run_dir = dir + "/mpi";
  c.log.progress = "off";
  std::ostringstream sink;
  auto t = Trainer::create(c, {.out = &sink, .mpi = true});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto r = (*t)->run();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  t->reset();
  ASSERT_TRUE((*world)->all_reduce(std::span<float>(&one, 1)).is_ok());  // rank 0 wrote its metrics
  if (rank == 0) {
    train::TrainConfig alone = c;
    alone.batch.replicas = 1;
    alone.batch.accumulation = np;
    alone.log.run_dir = dir + "/alone";
    auto a = Trainer::create(alone, {.out = &sink});
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE((*a)->run().is_ok());
    auto lm = train::read_metric(dir + "/mpi/metrics.jsonl", "loss");
    auto la = train::read_metric(dir + "/alone/metrics.jsonl", "loss");
    ASSERT_TRUE(lm.is_ok() && la.is_ok());
    ASSERT_EQ(lm->size(), 4u);
    ASSERT_EQ(la->size(), 4u);
    for (size_t k = 0; k < 4; ++k)
      EXPECT_NEAR((*lm)[k].second, (*la)[k].second, 1e-5 * std::fabs((*la)[k].second)) << "step " << k + 1;
    EXPECT_TRUE(std::filesystem::exists(dir + "/mpi/model/model.onnx"));
  }
  ASSERT_TRUE((*world)->all_reduce(std::span<float>(&one, 1)).is_ok());
  if (rank == 0) std::filesystem::remove_all(dir);
}

// --- A model across processes (Options::model_across_processes): one
// pipeline stage or tensor shard per process. -np 2 and -np 4: 2 stages
// (1 or 2 replicas); -np 3: 3 stages, and 3 tensor shards (gpt2-tiny's heads).

// One micro-batch (the first of the golden data) as evaluate() takes it.
struct EvalBatch {
  Tensor ids, pos, tgt;
  std::map<std::string, const Tensor*> feeds() const {
    return {{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}};
  }
};
EvalBatch eval_batch() {
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, gold.steps);
  const int64_t S = gold.T - 1;
  EvalBatch e{Tensor(DType::i32, {1, S}), Tensor(DType::i32, {1, S}), Tensor(DType::i32, {S})};
  std::copy_n(all.input_ids.data<int32_t>(), S, e.ids.data<int32_t>());
  std::copy_n(all.positions.data<int32_t>(), S, e.pos.data<int32_t>());
  std::copy_n(all.targets.data<int32_t>(), S, e.tgt.data<int32_t>());
  return e;
}

// Each process runs one stage: the same programs and the same additions as
// the stages on threads of one process, so the same bits (weights, losses,
// norms, optimizer state, evaluation), and near one device.
TEST(ModelAcrossProcesses, PipelineStagesEqualTheInProcessLayout) {
  const int P = parallel::mpi_world_size(), S = P == 3 ? 3 : 2, R = P / S;
  Options one;
  one.threads(1).gradient_accumulation(4);
  const auto w1 = train_weights(one, sgd(), 4, 4);
  const EvalBatch eb = eval_batch();
  for (bool adam : {false, true})
    for (train::PipelineSchedule schedule : {train::PipelineSchedule::gpipe, train::PipelineSchedule::one_f_one_b}) {
      SCOPED_TRACE(std::string(adam ? "adamw, clipped" : "sgd") + ", " + train::pipeline_schedule_name(schedule));
      TrainingOptions t = adam ? clipped_adamw() : sgd();
      t.pipeline = {S, schedule};
      Options in;
      in.threads(1).replication_factor(R).gradient_accumulation(4 / R);
      std::vector<StepStats> s_in, s_across;
      std::unique_ptr<TrainingModel> m_in, m_across;
      const auto w_in = train_weights(in, t, 4, 4, &s_in, 1, &m_in);
      ASSERT_TRUE(m_in);
      auto st_in = m_in->copy_optimizer_state_to_host();
      auto e_in = m_in->evaluate(eb.feeds());
      ASSERT_TRUE(st_in.is_ok() && e_in.is_ok());
      const auto wt_in = m_in->weight_types();
      const auto ot_in = m_in->optimizer_state_types();
      m_in.reset();  // its R x S devices' cores
      Options across;
      across.threads(1).gradient_accumulation(4 / R).mpi(true).model_across_processes(true);
      const auto w_across = train_weights(across, t, 4, 4, &s_across, R, &m_across);
      ASSERT_FALSE(w_in.empty() || w_across.empty());
      ASSERT_TRUE(m_across->model_across_processes());
      EXPECT_TRUE(bitwise_equal(w_across, w_in));
      ASSERT_EQ(s_across.size(), s_in.size());
      for (size_t i = 0; i < s_in.size(); ++i) {
        EXPECT_EQ(s_across[i].loss, s_in[i].loss) << "step " << i + 1;
        EXPECT_EQ(s_across[i].grad_norm, s_in[i].grad_norm) << "step " << i + 1;
      }
      auto st_across = m_across->copy_optimizer_state_to_host();  // collective: every stage's state
      ASSERT_TRUE(st_across.is_ok()) << st_across.status().to_string();
      EXPECT_TRUE(bitwise_equal(*st_across, *st_in));
      EXPECT_EQ(m_across->weight_types(), wt_in);
      EXPECT_EQ(m_across->optimizer_state_types(), ot_in);
      auto e_across = m_across->evaluate(eb.feeds());
      ASSERT_TRUE(e_across.is_ok()) << e_across.status().to_string();
      EXPECT_EQ(*e_across, *e_in);
      expect_same_on_every_rank(w_across);
      if (!adam) {
        EXPECT_LT(max_rel_diff(w_across, w1), 1e-5);
      }
    }
}

// Each process one tensor shard: near one device (SGD 1e-5, clipped AdamW
// 2e-3: see TensorParallel in training_model_test), and every process
// gathers the same whole weights; evaluation near the in-process shards'.
TEST(ModelAcrossProcesses, TensorShardsEqualOneDevice) {
  const int P = parallel::mpi_world_size(), T = 3;
  ASSERT_EQ(P % T, 0) << "run under mpirun -np 3 (gpt2-tiny has 3 heads)";
  const int R = P / T;
  const EvalBatch eb = eval_batch();
  for (bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "adamw, clipped" : "sgd");
    const TrainingOptions t = adam ? clipped_adamw() : sgd();
    Options one;
    one.threads(1).gradient_accumulation(4);
    std::vector<StepStats> s1, s_in, s_across;
    const auto w1 = train_weights(one, t, 4, 3, &s1);
    Options in;
    in.threads(1).replication_factor(R).gradient_accumulation(4 / R).tensor_parallel(T);
    std::unique_ptr<TrainingModel> m_in, m_across;
    const auto w_in = train_weights(in, t, 4, 3, &s_in, 1, &m_in);
    ASSERT_TRUE(m_in);
    auto e_in = m_in->evaluate(eb.feeds());
    ASSERT_TRUE(e_in.is_ok());
    m_in.reset();  // its R x T devices' cores
    Options across;
    across.threads(1).gradient_accumulation(4 / R).tensor_parallel(T).mpi(true).model_across_processes(true);
    const auto w_across = train_weights(across, t, 4, 3, &s_across, R, &m_across);
    ASSERT_FALSE(w1.empty() || w_in.empty() || w_across.empty());
    EXPECT_LT(max_rel_diff(w_across, w1), adam ? 2e-3 : 1e-5);
    EXPECT_LT(max_rel_diff(w_across, w_in), adam ? 2e-3 : 1e-6);
    expect_steps_near(s_across, s_in, 1e-6, adam ? 1e-5 : 0.0);
    auto st = m_across->copy_optimizer_state_to_host();  // collective: the shards' parts gathered
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    EXPECT_EQ(st->size(), m_across->optimizer_state_types().size());
    auto e_across = m_across->evaluate(eb.feeds());
    ASSERT_TRUE(e_across.is_ok()) << e_across.status().to_string();
    EXPECT_NEAR(*e_across, *e_in, 1e-5 * *e_in);
    expect_same_on_every_rank(w_across);
  }
}

// Two tensor shards as two processes (-np 2: one replica; -np 4: two), GPT-2,
// GPT-J and Llama with the vocabulary split: as one device (SGD, 4 steps, within
// 1e-5), every process with the same whole weights.
TEST(ModelAcrossProcesses, TwoShardsAsProcessesEqualOneDevice) {
  const int P = parallel::mpi_world_size();
  ASSERT_EQ(P % 2, 0);
  for (const char* family : {"gpt2", "gptj", "llama"}) {
    SCOPED_TRACE(family);
    Options one;
    one.threads(1).gradient_accumulation(2);
    const SmallRun a = train_small(family, true, one, sgd(), 4);
    Options across;
    across.threads(1).gradient_accumulation(2).tensor_parallel(2).mpi(true).model_across_processes(true);
    const SmallRun b = train_small(family, true, across, sgd(), 4, P / 2);
    ASSERT_FALSE(a.weights.empty() || b.weights.empty());
    EXPECT_LT(max_rel_diff(b.weights, a.weights), 1e-5);
    expect_steps_near(b.steps, a.steps, 1e-5);
    if (P == 2) {  // one replica: the same evaluated micro-batch
      EXPECT_NEAR(b.eval, a.eval, 1e-5 * std::abs(a.eval));
    }
    expect_same_on_every_rank(b.weights);
  }
}

// Two stages of two tensor shards as four processes (one device each), GPT-2
// and GPT-J with the vocabulary split: as one device (SGD and clipped AdamW,
// 4 steps), every process with the same whole weights and optimizer state,
// and the same evaluation.
TEST(ModelAcrossProcesses, StagesOfShardsAsProcessesEqualOneDevice) {
  const int P = parallel::mpi_world_size();
  ASSERT_EQ(P % 4, 0) << "run under mpirun -np 4";
  for (const char* family : {"gpt2", "gptj"})
    for (bool adam : {false, true}) {
      SCOPED_TRACE(std::string(family) + (adam ? ", adamw clipped" : ", sgd"));
      TrainingOptions t = adam ? clipped_adamw() : sgd();
      Options one;
      one.threads(1).gradient_accumulation(2);
      const SmallRun a = train_small(family, true, one, t, 4);
      t.pipeline = {2, train::PipelineSchedule::one_f_one_b};
      Options across;
      across.threads(1).gradient_accumulation(2).tensor_parallel(2).mpi(true).model_across_processes(true);
      const SmallRun b = train_small(family, true, across, t, 4, P / 4);
      ASSERT_FALSE(a.weights.empty() || b.weights.empty());
      EXPECT_LT(max_rel_diff(b.weights, a.weights), adam ? 2e-3 : 1e-5);  // AdamW: see TensorParallel.ShardsEqualOneDevice
      expect_steps_near(b.steps, a.steps, 1e-5);
      ASSERT_EQ(b.state.size(), a.state.size());
      EXPECT_LT(max_rel_diff(b.state, a.state), adam ? 2e-3 : 1e-5);
      if (P == 4) {
        EXPECT_NEAR(b.eval, a.eval, 2e-5 * std::abs(a.eval));
      }
      expect_same_on_every_rank(b.weights);
      expect_same_on_every_rank(b.state);
    }
}

// The layout is checked before any compute: processes that are no multiple of
// stages x shards are refused on every rank, naming the numbers.
TEST(ModelAcrossProcesses, ProcessesMustFillTheMesh) {
  const int P = parallel::mpi_world_size();
  Forward f = forward("gpt2-tiny", 1, 7);
  TrainingOptions t = sgd();
  t.pipeline = {P + 1, train::PipelineSchedule::one_f_one_b};
  Options o;
  o.threads(1).mpi(true).model_across_processes(true);
  auto m = TrainingModel::create(f.g, o, t);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().to_string().find("a multiple of stages x shards (" + std::to_string(P + 1) + " x 1"),
            std::string::npos)
      << m.status().to_string();
  o.replication_factor(2);
  EXPECT_EQ(TrainingModel::create(f.g, o, t).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace aspen::api

namespace {
// Data-parallel training where rank 1 dies before step `die_at`: the others
// must not hang (run_training_death.cmake checks how the job ends).
int die_scenario(int die_at) {
  using namespace aspen;
  using namespace aspen::api;
  using namespace aspen::api::testing;
  const Golden gold = read_golden("gpt2-tiny");
  const Batches all = shifted(gold, gold.steps);
  Forward f = forward("gpt2-tiny", gold.B, gold.T - 1);
  TrainingOptions t = golden_adamw();
  t.data_parallel.comm.timeout = std::chrono::seconds(5);
  Options dp;
  dp.threads(1).mpi(true);
  auto m = TrainingModel::create(f.g, dp, t);
  if (!m.is_ok()) {
    std::cerr << m.status().to_string() << "\n";
    return 1;
  }
  if (Status s = (*m)->copy_weights_to_device(ptrs(f.weights)); !s.is_ok()) return 1;
  const int64_t S = gold.T - 1;
  Tensor ids(DType::i32, {gold.B, S}), pos(DType::i32, {gold.B, S}), tgt(DType::i32, {gold.B * S});
  std::copy_n(all.input_ids.data<int32_t>(), gold.B * S, ids.data<int32_t>());
  std::copy_n(all.positions.data<int32_t>(), gold.B * S, pos.data<int32_t>());
  std::copy_n(all.targets.data<int32_t>(), gold.B * S, tgt.data<int32_t>());
  for (int step = 1; step <= die_at + 1; ++step) {
    if (step == die_at && parallel::mpi_world_rank() == 1) {
      std::cerr << "rank 1: exiting at training step " << step << "\n";
      _exit(3);
    }
    auto r = (*m)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
    if (!r.is_ok()) {
      std::cerr << "aspen: rank " << parallel::mpi_world_rank() << ": " << r.status().to_string() << "\n";
      return 1;
    }
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  setenv("ASPEN_CORES", "4", 0);  // up to four replicas of one thread in a process of a 2-core machine
  aspen::Status init = aspen::parallel::mpi_init(&argc, &argv);
  if (!init.is_ok()) {
    std::cerr << init.to_string() << "\n";
    return 1;
  }
  if (argc == 3 && std::strcmp(argv[1], "--die-at-step") == 0) {
    const int rc = die_scenario(std::atoi(argv[2]));
    aspen::parallel::mpi_finalize();
    return rc;
  }
  ::testing::InitGoogleTest(&argc, argv);
  // These tests compare layouts bit for bit, and each layout's model is made before or after the
  // others: a process that measured its products before it joined a job (the one-device models)
  // would have run its own kernels there and process 0's in the job. So the layouts run the fixed
  // rule; MatmulChoicesAgreeAcrossProcesses tests the measured mode's agreement.
  aspen::kernels::set_matmul_choice(aspen::kernels::MatmulChoice::rule);
  if (aspen::parallel::mpi_world_rank() != 0)  // one rank's report is enough; failures still set the exit code
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  int rc = RUN_ALL_TESTS();
  if (rc != 0) std::cerr << "rank " << aspen::parallel::mpi_world_rank() << ": tests failed\n";
  aspen::parallel::mpi_finalize();
  return rc;
}
