#include "bench/collectives_bench.h"

#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "bench/common.h"
#include "parallel/threads/threads_communicator.h"

#if ASPEN_HAVE_MPI
#include <mpi.h>

#include "parallel/mpi/mpi_communicator.h"
#endif

namespace aspen::bench {

namespace {

using Clock = std::chrono::steady_clock;
using parallel::ReduceOp;

struct Row {
  std::string backend;
  int devices = 0;
  int64_t bytes = 0;
  double seconds = 0;  // best time of one all-reduce
  Spread spread;       // its time per call over the rounds
  // NOTE [guarded rows]: the ceiling of an all-reduce within one host is its memory's copy bandwidth (every
  // byte is read and written a few times): measured before and after each team size's rows, in GB/s.
  Guard guard;
};

double algbw(const Row& r) { return double(r.bytes) / r.seconds / 1e9; }
double busbw(const Row& r) { return algbw(r) * 2.0 * (r.devices - 1) / r.devices; }

int reps_for(int64_t bytes, bool quick) {
  if (quick) return 2;
  return int(std::clamp<int64_t>((int64_t(256) << 20) / bytes, 4, 64));
}

// Per-call times of `reps` back-to-back all-reduces on n threads, one per round (the best is the row's).
Result<std::vector<double>> time_threads(int n, int64_t bytes, bool quick) {
  ASPEN_ASSIGN_OR_RETURN(auto comms, parallel::make_threads_group(n));
  const int64_t count = bytes / 4;
  const int reps = reps_for(bytes, quick), rounds = quick ? 1 : 3;
  std::vector<std::vector<float>> bufs(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(count), 0.0f));
  std::barrier sync(n);
  std::vector<Status> st(static_cast<size_t>(n));
  std::vector<double> times;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        for (int i = 0; i < reps && st[r].is_ok(); ++i) st[r] = comms[r]->all_reduce(bufs[r], ReduceOp::sum);
        sync.arrive_and_wait();
        if (r == 0 && round > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / reps);
      }
    });
  for (auto& t : threads) t.join();
  for (const Status& s : st) ASPEN_RETURN_IF_ERROR(s);
  return times;
}

void print_row(std::ostream& out, const Row& r, bool json, const std::map<std::tuple<int, int64_t>, double>& ref) {
  auto it = ref.find({r.devices, r.bytes});
  const double ratio = it != ref.end() && r.backend != "mpi_reference" ? it->second / r.seconds : 0;
  if (json) {
    nlohmann::ordered_json j = {{"bench", "allreduce"}, {"backend", r.backend}, {"devices", r.devices},
                                {"bytes", r.bytes},     {"algbw_gbs", algbw(r)}, {"busbw_gbs", busbw(r)}};
    if (ratio > 0) j["ratio_vs_mpi_reference"] = ratio;
    j["seconds"] = spread_json(r.spread);
    add_guard_fields(j, r.guard);
    out << j.dump() << "\n";
  } else {
    char line[512];
    std::snprintf(line, sizeof(line), "%-14s %7d %8lld %10.2f %10.2f", r.backend.c_str(), r.devices,
                  static_cast<long long>(r.bytes >> 20), algbw(r), busbw(r));
    out << line;
    if (ratio > 0) std::snprintf(line, sizeof(line), " %9.2fx", ratio);
    else std::snprintf(line, sizeof(line), " %10s", "");
    out << line;
    std::snprintf(line, sizeof(line), "        %.3g-%.3g ms%s", r.spread.min * 1e3, r.spread.max * 1e3, r.guard.disturbed() ? " ~" : "");
    out << line << "\n";
  }
  out.flush();
}

#if ASPEN_HAVE_MPI
// This process is one rank of an MPI job: times our mpi backend and
// MPI_Allreduce on the same buffer, interleaved; rank 0 returns the rows.
Result<std::vector<Row>> time_mpi_job(const CollectivesBenchOptions& o) {
  ASPEN_RETURN_IF_ERROR(parallel::mpi_init(nullptr, nullptr));
  ASPEN_ASSIGN_OR_RETURN(auto comm, parallel::MpiCommunicator::world());
  const int n = comm->size();
  std::vector<Row> rows;
  for (int64_t mib : o.mib) {
    const int64_t bytes = mib << 20, count = bytes / 4;
    std::vector<float> buf(static_cast<size_t>(count), 0.0f);
    const int reps = reps_for(bytes, o.quick), rounds = o.quick ? 1 : 3;
    std::vector<double> ours, theirs;
    for (int round = 0; round <= rounds; ++round) {
      for (int which = 0; which < 2; ++which) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        for (int i = 0; i < reps; ++i) {
          if (which == 0) {
            ASPEN_RETURN_IF_ERROR(comm->all_reduce(buf, ReduceOp::sum));
          } else {
            MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        const double t = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
        if (round > 0) (which == 0 ? ours : theirs).push_back(t);
      }
    }
    const Spread a = spread_of(ours), b = spread_of(theirs);
    rows.push_back({.backend = "mpi", .devices = n, .bytes = bytes, .seconds = a.min, .spread = a, .guard = {}});
    rows.push_back({.backend = "mpi_reference", .devices = n, .bytes = bytes, .seconds = b.min, .spread = b, .guard = {}});
  }
  comm.reset();
  return rows;
}

// Runs `mpirun -np n` on this executable in child mode; parses its JSON lines.
Result<std::vector<Row>> relaunch_mpi(const CollectivesBenchOptions& o, int n) {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0)
    return Status::error(Code::kIoError, "/proc/self/exe", "a readable link to this executable", "readlink failed");
  std::ostringstream cmd;
  cmd << o.mpirun << (geteuid() == 0 ? " --allow-run-as-root" : "") << " --oversubscribe -np " << n
      << " '" << self << "' bench collectives --mpi-child --mib ";
  for (size_t i = 0; i < o.mib.size(); ++i) cmd << (i ? "," : "") << o.mib[i];
  if (o.quick) cmd << " --quick";
  cmd << " 2>&1";
  FILE* p = popen(cmd.str().c_str(), "r");
  if (!p) return Status::error(Code::kIoError, o.mpirun, "a command that starts", "popen failed");
  std::vector<Row> rows;
  std::string text;
  char line[1024];
  while (std::fgets(line, sizeof(line), p)) {
    text += line;
    char backend[64] = {};
    int devices = 0;
    long long bytes = 0;
    Spread t;
    if (std::sscanf(line, "ROW %63s %d %lld %lf %lf %lf", backend, &devices, &bytes, &t.min, &t.median, &t.max) == 6)
      rows.push_back({.backend = backend, .devices = devices, .bytes = bytes, .seconds = t.min, .spread = t, .guard = {}});
  }
  const int rc = pclose(p);
  if (rc != 0 || rows.empty())
    return Status::error(Code::kFailedPrecondition, cmd.str(), "an MPI job that measures and exits 0",
                         "exit status " + std::to_string(rc) + ", output:\n" + text,
                         "install OpenMPI (scripts/install-deps.sh), pass --mpirun PATH, or --no-mpi");
  return rows;
}
#endif

}  // namespace

Status run_collectives_bench(const CollectivesBenchOptions& options, std::ostream& out) {
  CollectivesBenchOptions o = options;
  if (o.quick && !o.mpi_child) {
    o.devices = {2};
    o.mib = {1};
  }
#if ASPEN_HAVE_MPI
  if (o.mpi_child) {
    ASPEN_ASSIGN_OR_RETURN(auto rows, time_mpi_job(o));
    if (parallel::mpi_world_rank() == 0)
      for (const Row& r : rows)
        out << "ROW " << r.backend << " " << r.devices << " " << r.bytes << " " << r.spread.min << " " << r.spread.median
            << " " << r.spread.max << "\n";
    out.flush();
    parallel::mpi_finalize();
    return Status();
  }
#else
  if (o.mpi_child) return Status::unimplemented("bench collectives --mpi-child", "this build has no MPI");
#endif
  std::vector<Row> rows;
  const bool under_mpirun =
#if ASPEN_HAVE_MPI
      parallel::mpi_launched();
#else
      false;
#endif
  std::map<std::tuple<int, int64_t>, double> ref;
#if ASPEN_HAVE_MPI
  if (o.mpi) {
    if (under_mpirun) {
      ASPEN_ASSIGN_OR_RETURN(rows, time_mpi_job(o));
      if (parallel::mpi_world_rank() != 0) {
        parallel::mpi_finalize();
        return Status();
      }
      o.devices = {parallel::mpi_world_size()};
    }
  }
#endif
  // NOTE [guarded rows]: per team size, the copy bandwidth before and after its rows (the MPI job's and the
  // threads'); a moved ceiling measures them once more, then marks them. Under an outer mpirun the MPI rows were
  // measured above, unguarded; --quick measures no ceiling.
  std::function<double()> ceiling;
  if (!under_mpirun && !o.quick) ceiling = [] { return measure_copy_bandwidth(size_t(64) << 20) / 1e9; };
  for (int n : o.devices) {
    std::vector<Row> group;
    Guard guard;
    ASPEN_RETURN_IF_ERROR(guarded(
        [&]() -> Status {
          group.clear();
#if ASPEN_HAVE_MPI
          if (o.mpi && !under_mpirun) {
            ASPEN_ASSIGN_OR_RETURN(group, relaunch_mpi(o, n));
          }
#endif
          for (const Row& r : rows)
            if (r.devices == n) group.push_back(r);
          for (int64_t mib : o.mib) {
            ASPEN_ASSIGN_OR_RETURN(std::vector<double> t, time_threads(n, mib << 20, o.quick));
            const Spread sp = spread_of(t);
            group.push_back({.backend = "threads", .devices = n, .bytes = mib << 20, .seconds = sp.min, .spread = sp, .guard = {}});
          }
          return Status();
        },
        ceiling, &guard));
    for (Row& r : group) r.guard = guard;
    for (const Row& r : group)
      if (r.backend == "mpi_reference") ref[{r.devices, r.bytes}] = r.seconds;
    if (!o.json && n == o.devices.front())
      out << "backend        devices      MiB  algbw GB/s busbw GB/s  vs MPI_Allreduce  per call (rounds)\n";
    for (int64_t mib : o.mib)
      for (const char* backend : {"threads", "mpi", "mpi_reference"})
        for (const Row& r : group)
          if (r.bytes == (mib << 20) && r.backend == backend) print_row(out, r, o.json, ref);
  }
  if (!o.json)
    out << "# ~: disturbed: the copy bandwidth before and after the team size's rows moved by more than 5 %\n";
#if ASPEN_HAVE_MPI
  if (under_mpirun && o.mpi) parallel::mpi_finalize();
#endif
  return Status();
}

}  // namespace aspen::bench
