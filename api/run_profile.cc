#include "api/run_profile.h"

#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <mutex>

#include <algorithm>
#include <cstring>

#include "core/memory_phases.h"
#include "core/tensor.h"
#include "core/weight_copies.h"
#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/peaks.h"
#include "kernels/scratch.h"
#include "profile/diff.h"

namespace aspen::api {

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

namespace {

// An int64 carried in two f32 slots, bit for bit (the collectives move f32 and bf16; these are never added).
void put_i64(int64_t v, float* two) { std::memcpy(two, &v, sizeof v); }
int64_t get_i64(const float* two) {
  int64_t v = 0;
  std::memcpy(&v, two, sizeof v);
  return v;
}

}  // namespace

Result<std::vector<profile::TraceEvent>> gather_process_events(parallel::Communicator* job,
                                                               const std::vector<profile::TraceEvent>& mine,
                                                               const profile::TraceRecorder* clock) {
  if (!job || job->size() == 1) return mine;
  const int P = job->size(), me = job->rank();
  float barrier = 0;
  ASPEN_RETURN_IF_ERROR(job->all_reduce(&barrier, 1, DType::f32, parallel::ReduceOp::sum));
  const int64_t at_barrier = clock ? clock->now_ns() : 0;  // right after the barrier
  const std::string text = profile::chrome_trace_json(mine);
  float head[4];
  put_i64(int64_t(text.size()), head);
  put_i64(at_barrier, head + 2);
  std::vector<float> heads(size_t(4 * P));
  ASPEN_RETURN_IF_ERROR(job->all_gather(head, heads.data(), 4, DType::f32));
  const auto floats = [](int64_t bytes) { return (bytes + 3) / 4; };
  if (me != 0) {
    std::vector<float> payload(size_t(floats(int64_t(text.size()))));
    std::memcpy(payload.data(), text.data(), text.size());
    ASPEN_RETURN_IF_ERROR(job->send(payload.data(), int64_t(payload.size()), DType::f32, 0));
    return std::vector<profile::TraceEvent>{};
  }
  // Every payload first (a sender waits for its receive), then the parsing.
  std::vector<std::string> texts(static_cast<size_t>(P));
  texts[0] = text;
  for (int k = 1; k < P; ++k) {
    const int64_t bytes = get_i64(&heads[size_t(4 * k)]);
    std::vector<float> payload(size_t(floats(bytes)));
    ASPEN_RETURN_IF_ERROR(job->recv(payload.data(), int64_t(payload.size()), DType::f32, k));
    texts[size_t(k)].assign(reinterpret_cast<const char*>(payload.data()), size_t(bytes));
  }
  std::vector<profile::TraceEvent> all;
  const int64_t clock0 = get_i64(&heads[2]);
  for (int k = 0; k < P; ++k) {
    ASPEN_ASSIGN_OR_RETURN(std::vector<profile::TraceEvent> events,
                           profile::parse_chrome_trace(texts[size_t(k)], "the profile of process " + std::to_string(k)));
    const int64_t shift = clock0 - get_i64(&heads[size_t(4 * k + 2)]);
    for (profile::TraceEvent& e : events) {
      e.device = "p" + std::to_string(k) + "/" + e.device;
      e.start_ns += shift;
      e.end_ns += shift;
      all.push_back(std::move(e));
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const profile::TraceEvent& x, const profile::TraceEvent& y) {
    return x.start_ns != y.start_ns ? x.start_ns < y.start_ns : x.end_ns > y.end_ns;
  });
  return all;
}

void add_planned_memory(profile::RunFacts& run, const runtime::Session& session) {
  const runtime::Session::Footprint f = session.footprint();
  run.memory.parameters += f.parameters;
  run.memory.replica_copies += f.replica_copies;
  run.memory.arenas += f.arenas;
  run.memory.weight_only += f.weight_only;
}

Status write_run_profile(const std::string& dir, const std::vector<profile::TraceEvent>& events,
                         const profile::RunFacts& run, std::ostream& out) {
  ASPEN_RETURN_IF_ERROR(profile::write_profile_dir(dir, events, run));
  out << "profile: " << dir << "/report.html (open it in a browser), trace.pftrace (ui.perfetto.dev)"
      << (events.size() <= profile::kJsonTraceEvents ? ", trace.json" : "") << ", profile.json\n";
  return Status();
}

}  // namespace aspen::api
