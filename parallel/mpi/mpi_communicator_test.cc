// Runs under mpirun (CTest: -np 2 and -np 4): every rank runs every test,
// and each rank builds all ranks' inputs from seeds, so it can check its own
// result against the naive loop without further communication.
//
//   parallel_mpi_test                  the GoogleTest suite
//   parallel_mpi_test --die-at N       rank 1 calls _exit(3) inside all_reduce #N
//                                      (the rank-death check, run_rank_death.cmake)
#include "parallel/mpi/mpi_communicator.h"

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <thread>

#include "parallel/testing.h"

namespace aspen::parallel {
namespace {

using testing::naive_reduce;
using testing::random_buffer;
using Buffers = std::vector<std::vector<uint8_t>>;

CommOptions opts(Algorithm alg = Algorithm::automatic) {
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  o.algorithm = alg;
  return o;
}

TEST(MpiCommunicator, AllReduceMatchesNaiveLoop) {
  for (Algorithm alg : {Algorithm::automatic, Algorithm::direct, Algorithm::chunked, Algorithm::tree}) {
    auto comm = MpiCommunicator::world(opts(alg)).value();
    const int n = comm->size(), r = comm->rank();
    for (int64_t count : {int64_t(1), int64_t(3), int64_t(17), int64_t(1000003)})
      for (DType t : {DType::f32, DType::bf16})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
          SCOPED_TRACE(std::string(algorithm_name(alg)) + " " + std::to_string(count) + " " +
                       std::string(dtype_name(t)) + " " + reduce_op_name(op));
          Buffers in;
          for (int k = 0; k < n; ++k) in.push_back(random_buffer(count, t, uint64_t(k + 11)));
          const auto want = naive_reduce(in, t, 0, count, op);
          std::vector<uint8_t> io = in[r];
          ASSERT_TRUE(comm->all_reduce(io.data(), count, t, op).is_ok());
          const bool rank_order =
              alg == Algorithm::direct || (alg == Algorithm::automatic && n <= MpiCommunicator::kTreeRanks &&
                                           count * dtype_size(t) <= MpiCommunicator::kDefaultSmallBytes);
          if (rank_order || n == 2) {
            EXPECT_TRUE(io == want);  // direct path, or a ring or tree of 2 (x0 + x1 either way round)
          } else {
            EXPECT_LT(testing::max_rel_diff(io, want, t), t == DType::f32 ? 1e-5 : 1e-2);
          }
          // Every rank holds the same bits: compare with rank 0's.
          std::vector<uint8_t> r0 = io;
          ASSERT_TRUE(comm->broadcast(r0.data(), count, t, 0).is_ok());
          EXPECT_TRUE(r0 == io);
        }
  }
}

TEST(MpiCommunicator, BitwiseDeterministicAcrossReruns) {
  for (Algorithm alg : {Algorithm::direct, Algorithm::chunked, Algorithm::tree}) {
    auto comm = MpiCommunicator::world(opts(alg)).value();
    const int64_t count = 1000003;
    for (DType t : {DType::f32, DType::bf16}) {
      const auto in = random_buffer(count, t, uint64_t(comm->rank() + 50));
      std::vector<uint8_t> first;
      for (int run = 0; run < 5; ++run) {
        std::vector<uint8_t> io = in;
        ASSERT_TRUE(comm->all_reduce(io.data(), count, t, ReduceOp::sum).is_ok());
        if (run == 0)
          first = io;
        else
          EXPECT_TRUE(io == first) << algorithm_name(alg) << " run " << run;
      }
    }
  }
}

TEST(MpiCommunicator, ReduceScatterAllGatherBroadcast) {
  auto comm = MpiCommunicator::world(opts()).value();
  const int n = comm->size(), r = comm->rank();
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(1000003)})
    for (DType t : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::to_string(count) + " " + std::string(dtype_name(t)));
      const size_t bytes = static_cast<size_t>(count * dtype_size(t));
      Buffers in;
      for (int k = 0; k < n; ++k) in.push_back(random_buffer(count * n, t, uint64_t(k + 70)));
      std::vector<uint8_t> out(bytes);
      ASSERT_TRUE(comm->reduce_scatter(in[r].data(), out.data(), count, t, ReduceOp::sum).is_ok());
      EXPECT_TRUE(out == naive_reduce(in, t, r * count, count, ReduceOp::sum));
      std::vector<uint8_t> gathered(bytes * n);
      ASSERT_TRUE(comm->all_gather(in[r].data(), gathered.data(), count, t).is_ok());
      for (int k = 0; k < n; ++k) EXPECT_EQ(0, std::memcmp(gathered.data() + k * bytes, in[k].data(), bytes)) << k;
      for (int root = 0; root < n; ++root) {
        std::vector<uint8_t> io(in[r].begin(), in[r].begin() + static_cast<ptrdiff_t>(bytes));
        ASSERT_TRUE(comm->broadcast(io.data(), count, t, root).is_ok());
        EXPECT_EQ(0, std::memcmp(io.data(), in[root].data(), bytes)) << "root " << root;
      }
    }
}

TEST(MpiCommunicator, SendRecvAroundARing) {
  auto comm = MpiCommunicator::world(opts()).value();
  const int n = comm->size(), r = comm->rank();
  const int64_t count = 1000003;
  const auto mine = random_buffer(count, DType::f32, uint64_t(r + 90));
  std::vector<uint8_t> got(mine.size());
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    ASSERT_TRUE(comm->send(mine.data(), count, DType::f32, next).is_ok());
    ASSERT_TRUE(comm->recv(got.data(), count, DType::f32, prev).is_ok());
  } else {
    ASSERT_TRUE(comm->recv(got.data(), count, DType::f32, prev).is_ok());
    ASSERT_TRUE(comm->send(mine.data(), count, DType::f32, next).is_ok());
  }
  EXPECT_TRUE(got == random_buffer(count, DType::f32, uint64_t(prev + 90)));
}

// Tagged messages: both neighbours post before they take (what would deadlock
// with rendezvous sends), take in another order than posted, and every
// message arrives whole; flush returns once all were received.
TEST(MpiCommunicator, PostedMessagesArriveByTagInAnyOrder) {
  auto comm = MpiCommunicator::world(opts()).value();
  const int n = comm->size(), r = comm->rank();
  EXPECT_GE(comm->max_tag(), 32767);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const int64_t counts[3] = {1, 777, 300001};
  for (int tag = 0; tag < 3; ++tag) {
    const auto mine = random_buffer(counts[tag], DType::f32, uint64_t(100 * r + tag));
    ASSERT_TRUE(comm->post(mine.data(), int64_t(mine.size()), next, tag).is_ok());  // a copy: mine may go
  }
  for (int tag = 2; tag >= 0; --tag) {
    std::vector<uint8_t> got(size_t(counts[tag]) * 4);
    ASSERT_TRUE(comm->take(got.data(), int64_t(got.size()), prev, tag).is_ok());
    EXPECT_TRUE(got == random_buffer(counts[tag], DType::f32, uint64_t(100 * prev + tag))) << "tag " << tag;
  }
  EXPECT_TRUE(comm->flush().is_ok());
  std::vector<uint8_t> b(4);
  EXPECT_EQ(comm->post(b.data(), 4, r, 0).code(), Code::kInvalidArgument);  // not to itself
  EXPECT_EQ(comm->post(b.data(), 4, next, -1).code(), Code::kInvalidArgument);
}

// A take whose message never comes names the tag and the peer.
TEST(MpiCommunicator, TakeTimesOutNamingTheTag) {
  CommOptions o = opts();
  o.timeout = std::chrono::milliseconds(300);
  o.name = "pipe";
  auto comm = MpiCommunicator::world(o).value();
  if (comm->rank() == 0) {
    std::vector<uint8_t> b(8);
    Status s = comm->take(b.data(), 8, 1, 42);
    EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
    EXPECT_NE(s.message().find("take #1 (tag 42) from rank 1 (mpi group 'pipe', rank 0"), std::string::npos)
        << s.message();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiCommunicator, TimeoutNamesTheCollectiveAndTheMissingRank) {
  CommOptions o = opts();
  o.timeout = std::chrono::milliseconds(300);
  o.name = "data";
  auto comm = MpiCommunicator::world(o).value();
  std::vector<float> x(10, 1.0f);
  if (comm->rank() == 1) {
    // Rank 1 never joins all_reduce #1 (rank 0 gives up on it); rank 0's small sends stay unreceived.
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
  } else if (comm->rank() == 0) {
    Status s = comm->all_reduce(x);
    EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
    EXPECT_NE(s.message().find("all_reduce #1 (mpi group 'data', rank 0 of " + std::to_string(comm->size()) +
                               "): expected the direct exchange to finish within 300 ms, found still waiting for "
                               "rank 1 (receive of 40 bytes)"),
              std::string::npos)
        << s.message();
    EXPECT_EQ(comm->all_reduce(x).code(), Code::kAborted);  // the communicator stays failed
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace aspen::parallel

namespace {
// Rank 1 dies inside all_reduce #die_at; the others must not hang.
int die_scenario(int die_at) {
  using namespace aspen::parallel;
  CommOptions o;
  o.timeout = std::chrono::seconds(5);
  o.name = "data";
  auto comm = MpiCommunicator::world(o).value();
  std::vector<float> x(1 << 20, 1.0f);  // 4 MiB: the ring path
  for (int i = 1; i <= die_at + 1; ++i) {
    if (i == die_at && comm->rank() == 1) {
      std::cerr << "rank 1: exiting inside all_reduce #" << i << "\n";
      _exit(3);
    }
    aspen::Status s = comm->all_reduce(x);
    if (!s.is_ok()) {
      std::cerr << "aspen: rank " << comm->rank() << ": " << s.to_string() << "\n";
      return 1;
    }
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  aspen::Status init = aspen::parallel::mpi_init(&argc, &argv);
  if (!init.is_ok()) {
    std::cerr << init.to_string() << "\n";
    return 1;
  }
  int rc = 0;
  if (argc == 3 && std::strcmp(argv[1], "--die-at") == 0) {
    rc = die_scenario(std::atoi(argv[2]));
  } else {
    ::testing::InitGoogleTest(&argc, argv);
    if (aspen::parallel::mpi_world_rank() != 0)  // one rank's report is enough; failures still set the exit code
      delete ::testing::UnitTest::GetInstance()->listeners().Release(
          ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
    rc = RUN_ALL_TESTS();
    if (rc != 0) std::cerr << "rank " << aspen::parallel::mpi_world_rank() << ": tests failed\n";
  }
  aspen::parallel::mpi_finalize();
  return rc;
}
