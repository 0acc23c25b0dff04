#include "core/thread_team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace aspen {
namespace {

TEST(ThreadTeam, RunsWithItsOwnTeamSize) {
  CoreBudget budget(4);
  auto a = ThreadTeam::create("dev0", 1, budget);
  auto b = ThreadTeam::create("dev1", 3, budget);
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(budget.available(), 0);
  int seen_a = 0, seen_b = 0;
  auto fa = (*a)->submit([&] { seen_a = current_team_size(); });
  auto fb = (*b)->submit([&] {
    std::atomic<int> n{0};
#pragma omp parallel
    n += 1;
    seen_b = n.load();
  });
  fa.get();
  fb.get();
  EXPECT_EQ(seen_a, 1);
  EXPECT_EQ(seen_b, 3);
}

TEST(ThreadTeam, BudgetPreventsOversubscription) {
  CoreBudget budget(2);
  auto a = ThreadTeam::create("dev0", 2, budget);
  ASSERT_TRUE(a.is_ok());
  auto b = ThreadTeam::create("dev1", 1, budget);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(b.status().message(),
            "thread team 'dev1': expected 1 free cores, found 0 of 2 free (hint: fewer threads per device, or fewer "
            "devices per process)");
  a->reset();  // releases its cores
  EXPECT_EQ(budget.available(), 2);
  EXPECT_EQ(ThreadTeam::create("x", 0, budget).status().message(),
            "thread team 'x': expected a team of at least 1 thread, found 0 threads");
}

// NOTE [idle pools]: teams whose threads outnumber the CPUs free an idle leader's pool; each team's next
// regions still open with its own size, and values computed in them are the same, before and after.
TEST(ThreadTeam, IdlePoolsFreedWhenCrowdedStillRunTheirTeamSize) {
  const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  CoreBudget budget(4 * cpus + 4);
  auto a = ThreadTeam::create("crowd0", cpus + 1, budget);
  auto b = ThreadTeam::create("crowd1", 2, budget);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto region = [](ThreadTeam& t) {
    std::atomic<int> n{0};
    long sum = 0;
    t.run([&] {
#pragma omp parallel reduction(+ : sum)
      {
        n += 1;
        sum += omp_get_thread_num();
      }
    });
    return std::pair<int, long>(n.load(), sum);
  };
  for (int round = 0; round < 3; ++round) {
    const auto [na, sa] = region(**a);
    EXPECT_EQ(na, cpus + 1);
    EXPECT_EQ(sa, long(cpus) * (cpus + 1) / 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(80));  // both idle past the release time
    const auto [nb, sb] = region(**b);
    EXPECT_EQ(nb, 2);
    EXPECT_EQ(sb, 1);
  }
}

TEST(ThreadTeam, TasksRunInOrderAndPropagateExceptions) {
  CoreBudget budget(1);
  auto t = ThreadTeam::create("dev", 1, budget);
  ASSERT_TRUE(t.is_ok());
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) (*t)->submit([&, i] { order.push_back(i); });
  (*t)->run([] {});
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  auto f = (*t)->submit([] { throw std::runtime_error("boom"); });
  EXPECT_THROW(f.get(), std::runtime_error);
}

}  // namespace
}  // namespace aspen
