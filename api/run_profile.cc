#include "api/run_profile.h"

#include <omp.h>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/peaks.h"

namespace aspen::api {

profile::RunFacts run_facts(std::string command, int threads, std::vector<std::pair<std::string, std::string>> own) {
  profile::RunFacts run{std::move(command),
                        {{"cpu", kernels::cpu_model_name()},
                         {"isa", kernels::isa_name(kernels::active_isa())},
                         {"threads", std::to_string(threads > 0 ? threads : omp_get_max_threads())}}};
  for (auto& fact : own) run.facts.push_back(std::move(fact));
  // The roofline's ceilings, on the run's threads (about a second: only when a profile is written).
  ScopedOmpThreads team(threads > 0 ? threads : omp_get_max_threads());
  const int t = omp_get_max_threads();
  run.peaks.fma_gflops = kernels::measure_f32_fma_peak(t);
  run.peaks.bf16_gflops = kernels::measure_bf16_peak(t).gflops;
  run.peaks.read_gb_per_s = kernels::measure_read_bandwidth(size_t(256) << 20) / 1e9;
  return run;
}

Status write_run_profile(const std::string& dir, const std::vector<profile::TraceEvent>& events,
                         const profile::RunFacts& run, std::ostream& out) {
  ASPEN_RETURN_IF_ERROR(profile::write_profile_dir(dir, events, run));
  out << "profile: " << dir << "/report.html (open it in a browser), trace.json (ui.perfetto.dev), profile.json\n";
  return Status();
}

}  // namespace aspen::api
