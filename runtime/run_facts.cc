#include "runtime/run_facts.h"

#include <malloc.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

#include "compiler/memory_profile.h"
#include "core/memory_phases.h"
#include "core/tensor.h"
#include "core/thread_team.h"
#include "core/weight_copies.h"
#include "kernels/cpu.h"
#include "kernels/peaks.h"
#include "kernels/scratch.h"

namespace aspen::runtime {

namespace {

struct Resident {
  int64_t all = 0, file = 0;  // bytes; file: file-backed (and shared) pages
};
Resident resident() {  // this process's resident set now (/proc/self/statm's second and third fields, in pages)
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return {};
  long long size = 0, all = 0, file = 0;
  const int n = std::fscanf(f, "%lld %lld %lld", &size, &all, &file);
  std::fclose(f);
  const int64_t page = int64_t(::sysconf(_SC_PAGESIZE));
  return n == 3 ? Resident{int64_t(all) * page, int64_t(file) * page} : Resident{};
}

// The process before any model: read when the program is loaded (this file's static initialization).
const Resident kStart = resident();
// The read peak's buffer: beyond the last-level caches of these machines (32 MiB at most).
constexpr size_t kPeakBuffer = size_t(128) << 20;

}  // namespace

profile::RunFacts run_facts(std::string command, int threads, std::vector<std::pair<std::string, std::string>> own) {
  profile::RunFacts run{std::move(command),
                        {{"cpu", kernels::cpu_model_name()},
                         {"isa", kernels::isa_name(kernels::active_isa())},
                         {"threads", std::to_string(threads > 0 ? threads : omp_get_max_threads())}}};
  for (auto& fact : own) run.facts.push_back(std::move(fact));
  // The peak RSS, read before the peaks are measured; they are measured once per process and team size
  // (about a second: only when a profile is written). Their read buffer stays in the peak RSS of every later
  // profile of this process: named as such (RunMemory::measurement).
  static std::mutex mu;
  static std::map<int, profile::Peaks> measured;
  std::lock_guard<std::mutex> lock(mu);
  // VmHWM, not getrusage's ru_maxrss: that one is kept across exec, so a command started by a large process (a
  // Python script with torch loaded) reported its parent's peak.
  run.memory.peak_rss = memory_now("").high_water;
  run.memory.start_rss = kStart.all;
  run.memory.libraries_paged = std::max<int64_t>(0, resident().file - kStart.file);
  run.memory.block_cache = int64_t(tensor_block_cache_bytes());
  run.memory.kernel_copies = kernel_copy_bytes();
  run.memory.heap_free = int64_t(mallinfo2().fordblks);
  run.memory.kernel_scratch = kernels::op_scratch_bytes();
  run.memory.phases = memory_phases();
  run.memory.phases.push_back(memory_now("profile written"));
  run.memory.measurement = measured.empty() ? 0 : int64_t(kPeakBuffer);
  ScopedOmpThreads team(threads > 0 ? threads : omp_get_max_threads());
  const int t = omp_get_max_threads();
  if (!measured.count(t)) {
    profile::Peaks& p = measured[t];
    p.fma_gflops = kernels::measure_f32_fma_peak(t);
    p.bf16_gflops = kernels::measure_bf16_peak(t).gflops;
    p.read_gb_per_s = kernels::measure_read_bandwidth(kPeakBuffer) / 1e9;
  }
  run.peaks = measured[t];
  return run;
}

void add_planned_memory(profile::RunFacts& run, const Session& session) {
  const runtime::Session::Footprint f = session.footprint();
  run.memory.parameters += f.parameters;
  run.memory.replica_copies += f.replica_copies;
  run.memory.arenas += f.arenas;
  run.memory.weight_only += f.weight_only;
}

void add_session(profile::RunFacts& run, const Session& session) {
  for (int p = 0; p < session.programs(); ++p)
    run.programs.push_back(compiler::program_memory(session.executable(p), "program " + std::to_string(p), p));
  add_planned_memory(run, session);
}

}  // namespace aspen::runtime
