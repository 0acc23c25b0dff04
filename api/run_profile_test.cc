// api/run_profile.h: NOTE [profiles across processes] on a group of threads standing for the processes: each
// rank's events reach rank 0 with its devices named "p<k>/..." and its times on rank 0's clock.
#include "api/run_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "parallel/threads/threads_communicator.h"

namespace aspen::api {
namespace {

TEST(ProcessProfiles, GatheredOnProcessZeroOnItsClock) {
  constexpr int P = 3;
  auto group = parallel::make_threads_group(P);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  // Recorders made 20 ms apart: their clocks differ by as much.
  std::vector<std::unique_ptr<profile::TraceRecorder>> clocks;
  for (int k = 0; k < P; ++k) {
    clocks.push_back(std::make_unique<profile::TraceRecorder>());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<std::vector<profile::TraceEvent>> got(P);
  std::vector<Status> status(P);
  std::vector<std::thread> threads;
  for (int k = 0; k < P; ++k)
    threads.emplace_back([&, k] {
      parallel::Communicator& comm = *(*group)[size_t(k)];
      float barrier = 0;
      status[size_t(k)] = comm.all_reduce(&barrier, 1, DType::f32, parallel::ReduceOp::sum);
      // The same moment on every rank, each on its own clock.
      profile::TraceEvent e;
      e.device = "cpu0";
      e.name = "together";
      e.category = profile::category::kKernel;
      e.start_ns = clocks[size_t(k)]->now_ns();
      e.end_ns = e.start_ns + 1000;
      e.args = {{"layer", "h." + std::to_string(k)}};
      std::vector<profile::TraceEvent> mine(size_t(k), e);  // rank k: k events (rank 0 none)
      if (k == 2) mine.push_back(e);
      auto r = gather_process_events(&comm, mine, clocks[size_t(k)].get());
      if (r.is_ok()) got[size_t(k)] = std::move(r).value();
      else status[size_t(k)] = r.status();
    });
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(got[1].empty());
  EXPECT_TRUE(got[2].empty());
  ASSERT_EQ(got[0].size(), 1u + 3u);
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const profile::TraceEvent& e : got[0]) {
    EXPECT_TRUE(e.device == "p1/cpu0" || e.device == "p2/cpu0") << e.device;
    EXPECT_EQ(e.args.at(0).second, "h." + e.device.substr(1, 1));
    lo = std::min(lo, e.start_ns);
    hi = std::max(hi, e.start_ns);
  }
  EXPECT_LT(hi - lo, 5'000'000) << "the ranks' moments on rank 0's clock: " << lo << " .. " << hi;  // clocks 20-40 ms apart
  EXPECT_GT(std::abs(clocks[2]->now_ns() - clocks[0]->now_ns()), 30'000'000);
}

}  // namespace
}  // namespace aspen::api
