// Data-parallel training over MPI, run under `mpirun -np 2` and `-np 4`
// (CTest label `mpi`): four replicas in all, 4 / np per process, so -np 2 is
// the hierarchical layout (threads inside each process, MPI across) and -np 4
// plain MPI. Every rank also trains one device with accumulation 4 on the same
// micro-batches, in-process, as the reference.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <iostream>

#include "api/training_testing.h"
#include "parallel/mpi/mpi_communicator.h"

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
// only its shards' state.
TEST(DataParallelMpi, ShardedOptimizerStateEqualsTheWholeState) {
  const int P = parallel::mpi_world_size();
  std::map<std::string, Tensor> w[2], state[2];
  size_t kept[2] = {0, 0};
  for (int zero = 0; zero < 2; ++zero) {
    TrainingOptions t = clipped_adamw();
    t.data_parallel.shard_optimizer_state = zero == 1;
    t.data_parallel.bucket_bytes = 8192;
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
  }
  ASSERT_FALSE(w[0].empty() || w[1].empty());
  EXPECT_TRUE(bitwise_equal(w[1], w[0]));
  EXPECT_TRUE(bitwise_equal(state[1], state[0]));
  EXPECT_LT(kept[1], kept[0]);  // this process keeps its shards only
  expect_same_on_every_rank(w[1]);
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
  EXPECT_NE(m.status().to_string().find("training model (programs, options and schedule)"), std::string::npos)
      << m.status().to_string();
  EXPECT_NE(m.status().to_string().find("differs"), std::string::npos) << m.status().to_string();
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
  if (aspen::parallel::mpi_world_rank() != 0)  // one rank's report is enough; failures still set the exit code
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  int rc = RUN_ALL_TESTS();
  if (rc != 0) std::cerr << "rank " << aspen::parallel::mpi_world_rank() << ": tests failed\n";
  aspen::parallel::mpi_finalize();
  return rc;
}
