#include "core/thread_team.h"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>
#include <cstdlib>

namespace aspen {

// The online CPUs, or the environment's ASPEN_CORES (a positive integer):
// more than the CPUs lets one process oversubscribe on purpose (tests of many
// replicas on a small machine), fewer leaves cores to other processes.
CoreBudget& CoreBudget::global() {
  static CoreBudget budget([] {
    int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* e = std::getenv("ASPEN_CORES")) {
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      if (end != e && *end == '\0' && v >= 1 && v <= 4096) cores = int(v);
    }
    return cores;
  }());
  return budget;
}

int CoreBudget::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_;
}

Status CoreBudget::reserve(const std::string& who, int cores) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cores < 1)
    return Status::invalid_argument(who, "a team of at least 1 thread", std::to_string(cores) + " threads");
  if (cores > free_)
    return Status::error(Code::kFailedPrecondition, who,
                         std::to_string(cores) + " free cores", std::to_string(free_) + " of " + std::to_string(total_) + " free",
                         "fewer threads per device, or fewer devices per process");
  free_ -= cores;
  return Status();
}

void CoreBudget::release(int cores) {
  std::lock_guard<std::mutex> lock(mu_);
  free_ = std::min(total_, free_ + cores);
}

Result<std::unique_ptr<ThreadTeam>> ThreadTeam::create(std::string name, int size, CoreBudget& budget) {
  ASPEN_RETURN_IF_ERROR(budget.reserve("thread team '" + name + "'", size));
  return std::unique_ptr<ThreadTeam>(new ThreadTeam(std::move(name), size, budget));
}

namespace {
thread_local bool t_leader = false;  // the calling thread is some team's leader

// NOTE [idle pools]: libgomp counts the workers of every pool in the process, and when they outnumber the
// CPUs it throttles every idle worker's spinning (NOTE [omp pools]), so each op of the team that runs pays a
// kernel wake-up. The Python package keeps several models alive on the same cores (NOTE [python cores]):
// a model that is only alive, idle, then slowed the one training (resnet18 64x64 on 2 cores: 48 ms a step
// alone, 62-80 ms beside an idle inference model). So while the live teams' threads outnumber the CPUs, a
// leader idle for kIdlePoolRelease frees its own pool; its next task starts the workers again (tens of
// microseconds). Not sooner: freeing takes milliseconds, and a call arriving meanwhile waits for it (a 5 ms
// threshold made an MNIST CNN called every 10 ms take 7 ms a call instead of 1). A process whose teams fit
// its CPUs (the `aspen` command, a budget kept) never frees a pool. A team created later makes the process
// crowded for the idle ones too: the registry of live teams wakes their leaders, waiting without a deadline,
// to look again (the bench that made an inference model before the training one measured 81 ms a training
// step without that, 49 ms with it). The thread count is an atomic beside the registry, not a sum over it:
// a leader reads it holding its own lock, which the registry's holder takes to wake it.
std::atomic<int> g_team_threads{0};
constexpr std::chrono::milliseconds kIdlePoolRelease{50};
std::mutex g_teams_mu;
std::vector<ThreadTeam*> g_teams;

bool crowded() {
  static const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  return g_team_threads.load(std::memory_order_relaxed) > cpus;
}
}  // namespace

ThreadTeam::ThreadTeam(std::string name, int size, CoreBudget& budget)
    : name_(std::move(name)), size_(size), budget_(budget) {
  g_team_threads += size_;
  leader_ = std::thread([this] { loop(); });
  std::lock_guard<std::mutex> lock(g_teams_mu);
  for (ThreadTeam* t : g_teams) t->wake();  // NOTE [idle pools]
  g_teams.push_back(this);
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard<std::mutex> lock(g_teams_mu);
    g_teams.erase(std::find(g_teams.begin(), g_teams.end(), this));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  leader_.join();
  g_team_threads -= size_;
  budget_.release(size_);
}

void ThreadTeam::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    recheck_ = true;
  }
  cv_.notify_all();
}

std::future<void> ThreadTeam::submit(std::function<void()> fn) {
  release_thread_pool();  // NOTE [omp pools]: the submitter's own workers would throttle the team's
  std::packaged_task<void()> task(std::move(fn));
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return done;
}

void ThreadTeam::loop() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  omp_set_num_threads(size_);  // per-thread ICV: governs regions this thread opens
  t_leader = true;
  bool pool = false;  // this leader has opened parallel regions since its pool was last freed
  const auto ready = [this] { return stopping_ || !tasks_.empty(); };
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (pool && crowded() && !cv_.wait_for(lock, kIdlePoolRelease, ready)) {  // NOTE [idle pools]
        lock.unlock();
        omp_pause_resource_all(omp_pause_soft);  // frees this thread's workers
        pool = false;
        continue;
      }
      cv_.wait(lock, [&] { return ready() || (recheck_ && pool); });
      recheck_ = false;
      if (!ready()) continue;  // woken by a new team: crowded now?
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
    pool = true;
  }
}

ScopedOmpThreads::ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(std::max(1, n)); }
ScopedOmpThreads::~ScopedOmpThreads() { omp_set_num_threads(saved_); }

int current_team_size() { return omp_get_max_threads(); }

void release_thread_pool() {
  if (t_leader || omp_in_parallel()) return;  // a leader's pool is its device's team
  omp_pause_resource_all(omp_pause_soft);  // libgomp: frees the calling thread's pool
}

}  // namespace aspen
