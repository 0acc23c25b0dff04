#include "parallel/threads/threads_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "parallel/testing.h"

namespace aspen::parallel {
namespace {

using testing::naive_reduce;
using testing::random_buffer;
using Buffers = std::vector<std::vector<uint8_t>>;

// Runs fn(rank, comm) on one thread per rank; returns each rank's Status.
std::vector<Status> run_group(int n, const CommOptions& options,
                              const std::function<Status(int, ThreadsCommunicator&)>& fn) {
  auto comms = make_threads_group(n, options).value();
  std::vector<Status> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
  return out;
}

void expect_all_ok(const std::vector<Status>& s) {
  for (size_t r = 0; r < s.size(); ++r) EXPECT_TRUE(s[r].is_ok()) << "rank " << r << ": " << s[r].to_string();
}

struct Case {
  int n;
  int64_t count;
  DType dtype;
};
std::vector<Case> cases() {
  std::vector<Case> out;
  for (int n : {2, 3, 4})
    for (int64_t count : {int64_t(1), int64_t(3), int64_t(17), int64_t(16411), int64_t(1000003)})
      for (DType t : {DType::f32, DType::bf16}) out.push_back({n, count, t});
  return out;
}
std::string name(const Case& c) {
  return std::to_string(c.n) + " devices, " + std::to_string(c.count) + " " + std::string(dtype_name(c.dtype));
}

TEST(ThreadsCommunicator, AllReduceEqualsNaiveLoopBitwise) {
  for (const Case& c : cases())
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean})
      for (Algorithm alg : {Algorithm::automatic, Algorithm::direct, Algorithm::chunked}) {
        SCOPED_TRACE(name(c) + " " + reduce_op_name(op) + " " + algorithm_name(alg));
        Buffers in;
        for (int r = 0; r < c.n; ++r) in.push_back(random_buffer(c.count, c.dtype, uint64_t(r + 7 * c.n)));
        const auto want = naive_reduce(in, c.dtype, 0, c.count, op);
        Buffers io = in;
        CommOptions o;
        o.algorithm = alg;
        expect_all_ok(run_group(c.n, o, [&](int r, ThreadsCommunicator& comm) {
          return comm.all_reduce(io[r].data(), c.count, c.dtype, op);
        }));
        for (int r = 0; r < c.n; ++r) EXPECT_TRUE(io[r] == want) << "rank " << r;
      }
}

TEST(ThreadsCommunicator, ReduceToRootEqualsNaiveLoopBitwiseAndLeavesPeersAlone) {
  for (const Case& c : cases())
    for (Algorithm alg : {Algorithm::automatic, Algorithm::direct, Algorithm::chunked})
      for (int root : {0, c.n - 1}) {
        SCOPED_TRACE(name(c) + " " + algorithm_name(alg) + " root " + std::to_string(root));
        Buffers in;
        for (int r = 0; r < c.n; ++r) in.push_back(random_buffer(c.count, c.dtype, uint64_t(r + 11 * c.n)));
        Buffers io = in;
        CommOptions o;
        o.algorithm = alg;
        expect_all_ok(run_group(c.n, o, [&](int r, ThreadsCommunicator& comm) {
          return comm.reduce(io[r].data(), c.count, c.dtype, ReduceOp::sum, root);
        }));
        for (int r = 0; r < c.n; ++r)
          EXPECT_TRUE(io[r] == (r == root ? naive_reduce(in, c.dtype, 0, c.count, ReduceOp::sum) : in[r])) << "rank " << r;
      }
}

TEST(ThreadsCommunicator, ReduceScatterEqualsNaiveLoopBitwise) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    Buffers in;
    for (int r = 0; r < c.n; ++r) in.push_back(random_buffer(c.count * c.n, c.dtype, uint64_t(r + 100)));
    Buffers out(static_cast<size_t>(c.n), std::vector<uint8_t>(static_cast<size_t>(c.count * dtype_size(c.dtype))));
    expect_all_ok(run_group(c.n, {}, [&](int r, ThreadsCommunicator& comm) {
      return comm.reduce_scatter(in[r].data(), out[r].data(), c.count, c.dtype, ReduceOp::mean);
    }));
    for (int r = 0; r < c.n; ++r)
      EXPECT_TRUE(out[r] == naive_reduce(in, c.dtype, r * c.count, c.count, ReduceOp::mean)) << "rank " << r;
  }
}

TEST(ThreadsCommunicator, AllGatherAndBroadcast) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const size_t bytes = static_cast<size_t>(c.count * dtype_size(c.dtype));
    Buffers in, gathered(static_cast<size_t>(c.n), std::vector<uint8_t>(bytes * c.n));
    for (int r = 0; r < c.n; ++r) in.push_back(random_buffer(c.count, c.dtype, uint64_t(r + 200)));
    expect_all_ok(run_group(c.n, {}, [&](int r, ThreadsCommunicator& comm) {
      return comm.all_gather(in[r].data(), gathered[r].data(), c.count, c.dtype);
    }));
    for (int r = 0; r < c.n; ++r)
      for (int k = 0; k < c.n; ++k)
        EXPECT_EQ(0, std::memcmp(gathered[r].data() + k * bytes, in[k].data(), bytes)) << "rank " << r << " block " << k;
    for (int root = 0; root < c.n; ++root) {
      Buffers io = in;
      expect_all_ok(run_group(c.n, {}, [&](int r, ThreadsCommunicator& comm) {
        return comm.broadcast(io[r].data(), c.count, c.dtype, root);
      }));
      for (int r = 0; r < c.n; ++r) EXPECT_TRUE(io[r] == in[root]) << "root " << root << " rank " << r;
    }
  }
}

TEST(ThreadsCommunicator, SendRecvAroundARing) {
  for (int n : {2, 3, 4}) {
    const int64_t count = 1000003;
    Buffers in, out(static_cast<size_t>(n), std::vector<uint8_t>(static_cast<size_t>(count * 4)));
    for (int r = 0; r < n; ++r) in.push_back(random_buffer(count, DType::f32, uint64_t(r + 300)));
    expect_all_ok(run_group(n, {}, [&](int r, ThreadsCommunicator& comm) {
      // Even ranks send first, odd ranks receive first: no two ranks wait on each other's send.
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      if (r % 2 == 0) {
        ASPEN_RETURN_IF_ERROR(comm.send(in[r].data(), count, DType::f32, next));
        return comm.recv(out[r].data(), count, DType::f32, prev);
      }
      ASPEN_RETURN_IF_ERROR(comm.recv(out[r].data(), count, DType::f32, prev));
      return comm.send(in[r].data(), count, DType::f32, next);
    }));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(out[r] == in[(r + n - 1) % n]) << n << " devices, rank " << r;
  }
}

TEST(ThreadsCommunicator, BitwiseDeterministicAcrossReruns) {
  for (DType t : {DType::f32, DType::bf16})
    for (Algorithm alg : {Algorithm::direct, Algorithm::chunked}) {
      const int n = 3;
      const int64_t count = 1000003;
      Buffers in;
      for (int r = 0; r < n; ++r) in.push_back(random_buffer(count, t, uint64_t(r + 400)));
      Buffers first;
      for (int run = 0; run < 5; ++run) {
        Buffers io = in;
        CommOptions o;
        o.algorithm = alg;
        expect_all_ok(run_group(n, o, [&](int r, ThreadsCommunicator& comm) {
          return comm.all_reduce(io[r].data(), count, t, ReduceOp::sum);
        }));
        for (int r = 1; r < n; ++r) EXPECT_TRUE(io[r] == io[0]);
        if (run == 0)
          first = io;
        else
          EXPECT_TRUE(io[0] == first[0]) << "run " << run;
      }
    }
}

TEST(ThreadsCommunicator, ManyCollectivesBackToBack) {
  // Alternating kinds and sizes without pauses: the slots and barriers are reused safely.
  const int n = 4;
  expect_all_ok(run_group(n, {}, [&](int r, ThreadsCommunicator& comm) {
    for (int i = 0; i < 300; ++i) {
      const int64_t count = 1 + (i * 37) % 5000;
      std::vector<float> x(static_cast<size_t>(count), float(r + i));
      ASPEN_RETURN_IF_ERROR(comm.all_reduce(x, ReduceOp::sum));
      const float want = float(n * i + n * (n - 1) / 2);
      for (float v : x)
        if (v != want) return Status::invalid_argument("iteration " + std::to_string(i), std::to_string(want), std::to_string(v));
      ASPEN_RETURN_IF_ERROR(comm.broadcast(x.data(), count, DType::f32, i % n));
    }
    return Status();
  }));
}

TEST(ThreadsCommunicator, TimeoutNamesTheCollectiveAndTheMissingRank) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(200);
  o.name = "data";
  auto s = run_group(3, o, [&](int r, ThreadsCommunicator& comm) {
    std::vector<float> x(10, 1.0f);
    ASPEN_RETURN_IF_ERROR(comm.all_reduce(x));  // #1: everyone
    if (r == 2) return Status();                // rank 2 stops here
    return comm.all_reduce(x);                  // #2: ranks 0 and 1 wait for rank 2
  });
  EXPECT_TRUE(s[2].is_ok());
  int timed_out = 0;
  for (int r = 0; r < 2; ++r) {
    if (s[r].code() == Code::kDeadlineExceeded) {
      ++timed_out;
      EXPECT_EQ(s[r].message(), "all_reduce #2 (threads group 'data', rank " + std::to_string(r) +
                                    " of 3): expected every rank at the entry barrier within 200 ms, found still "
                                    "waiting for rank 2 (last entered all_reduce #1) (hint: a rank stopped, hangs, "
                                    "or called collectives in a different order)");
    } else {
      EXPECT_EQ(s[r].code(), Code::kAborted) << s[r].to_string();
      EXPECT_NE(s[r].message().find("the group failed: all_reduce #2"), std::string::npos) << s[r].message();
    }
  }
  EXPECT_GE(timed_out, 1);
}

TEST(ThreadsCommunicator, RecvTimeoutNamesThePeer) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(100);
  auto s = run_group(2, o, [&](int r, ThreadsCommunicator& comm) {
    float x = 0;
    if (r == 1) return comm.recv(&x, 1, DType::f32, 0);
    return Status();
  });
  EXPECT_EQ(s[1].code(), Code::kDeadlineExceeded);
  EXPECT_EQ(s[1].message(),
            "recv #1 (threads group 'group', rank 1 of 2) from rank 0: expected rank 0 to send within 100 ms, found "
            "still waiting for rank 0 (has entered no collective); it has sent 0 messages to this rank (hint: a rank "
            "stopped, hangs, or the schedule's sends and recvs do not pair up)");
}

TEST(ThreadsCommunicator, MismatchedCallsAreReportedOnEveryRank) {
  auto s = run_group(2, {}, [&](int r, ThreadsCommunicator& comm) {
    std::vector<float> x(static_cast<size_t>(10 + r));
    return comm.all_reduce(x);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(s[r].code(), Code::kFailedPrecondition);
    EXPECT_NE(s[r].message().find("found rank 0 called all_reduce(f32, 10 elements, sum), rank 1 called "
                                  "all_reduce(f32, 11 elements, sum)"),
              std::string::npos)
        << s[r].message();
  }
}

TEST(ThreadsCommunicator, AbortEndsPeersWaitsAtOnce) {
  CommOptions o;
  o.timeout = std::chrono::seconds(60);  // abort must not wait for it
  const auto t0 = std::chrono::steady_clock::now();
  auto s = run_group(3, o, [&](int r, ThreadsCommunicator& comm) {
    if (r == 1) {
      comm.abort("loss is NaN at step 7");
      return Status();
    }
    std::vector<float> x(5);
    return comm.all_reduce(x);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  for (int r : {0, 2}) {
    EXPECT_EQ(s[r].code(), Code::kAborted);
    EXPECT_NE(s[r].message().find("the group failed: rank 1 aborted: loss is NaN at step 7"), std::string::npos)
        << s[r].message();
  }
}

TEST(ThreadsCommunicator, BadArguments) {
  auto comms = make_threads_group(2).value();
  int32_t i = 0;
  Status s = comms[0]->all_reduce(&i, 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(s.message(), "all_reduce (threads, rank 0 of 2): expected dtype f32 or bf16, found i32");
  float f = 0;
  EXPECT_EQ(comms[1]->broadcast(&f, 1, DType::f32, 2).message(),
            "broadcast (threads, rank 1 of 2): expected root in [0, 2), found 2");
  EXPECT_EQ(comms[1]->send(&f, 1, DType::f32, 1).message(),
            "send (threads, rank 1 of 2): expected a peer other than this rank, found 1");
  EXPECT_EQ(make_threads_group(0).status().message(), "threads group 'group': expected size >= 1, found 0");
}

}  // namespace
}  // namespace aspen::parallel
