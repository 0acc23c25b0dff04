// core/thread_team.h: devices of one process each own a set of cores.
//
// A ThreadTeam is one OS thread (the team's "leader") plus the OpenMP team it
// opens for parallel regions. Work submitted to a team runs on its leader with
// omp_set_num_threads(size) in effect, so every OpenMP region inside it (our
// kernels and oneDNN, which Debian builds on OpenMP) uses exactly `size`
// threads. Two teams in one process get two independent OpenMP pools: libgomp
// gives each top-level parallel region opened by a different OS thread its
// own workers. See docs/threading.md.
//
// Oversubscription is avoided by a CoreBudget: every team reserves its cores
// from the process-wide budget (by default the number of online CPUs) and
// returns them when destroyed. Asking for more than remain is an error, not a
// silent slowdown. Idle OpenMP workers keep libgomp's default policy (spin a
// while, then sleep): a passive policy makes every op's region wait for a
// kernel wake-up (docs/threading.md, "Idle workers").
//
// Thread-safety: submit() and run() may be called from any thread; tasks of
// one team run one at a time in submission order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/status.h"

namespace aspen {

class CoreBudget {
 public:
  // The process-wide budget, sized to the online CPUs at first use.
  static CoreBudget& global();
  explicit CoreBudget(int cores) : total_(cores), free_(cores) {}

  int total() const { return total_; }
  int available() const;
  Status reserve(const std::string& who, int cores);
  void release(int cores);

 private:
  mutable std::mutex mu_;
  int total_;
  int free_;
};

class ThreadTeam {
 public:
  // Starts a team of `size` threads named `name`, reserving `size` cores.
  static Result<std::unique_ptr<ThreadTeam>> create(std::string name, int size,
                                                    CoreBudget& budget = CoreBudget::global());
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  const std::string& name() const { return name_; }
  int size() const { return size_; }

  // Queues `fn` to run on the team; the future becomes ready when it ends
  // (and carries any exception it threw).
  std::future<void> submit(std::function<void()> fn);
  // Runs `fn` on the team and waits for it.
  void run(std::function<void()> fn) { submit(std::move(fn)).get(); }

 private:
  ThreadTeam(std::string name, int size, CoreBudget& budget);
  void loop();
  void wake();  // an idle leader looks again whether to free its pool (NOTE [idle pools])

  std::string name_;
  int size_;
  CoreBudget& budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stopping_ = false;
  bool recheck_ = false;
  std::thread leader_;
};

// Sets the calling thread's OpenMP team size for its lifetime, then restores
// it. For code that runs kernels on its own thread (tests, benchmarks).
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n);
  ~ScopedOmpThreads();

 private:
  int saved_;
};

// Number of threads an OpenMP region opened by the calling thread will use.
int current_team_size();

// Frees the OpenMP workers of the calling thread (a thread that is no device's
// leader and has opened parallel regions, e.g. a benchmark's measurement on
// the main thread). libgomp keeps a pool of workers per thread that opened a
// region, and when the pools' workers outnumber the CPUs it throttles every
// idle worker's spinning to about a hundred pauses: a device's workers then
// sleep between ops and are woken by the kernel for each, which on a VM costs
// tens of microseconds per op (NOTE [omp pools] in docs/threading.md).
// ThreadTeam::submit calls it for its caller. No-op on a team's leader and
// inside a parallel region.
void release_thread_pool();

}  // namespace aspen
