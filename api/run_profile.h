// api/run_profile.h: what every command that writes a profile directory (docs/profile.md) shares: the facts
// each profile starts with, and writing it with a line that says where.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "parallel/communicator.h"
#include "runtime/session.h"
#include "profile/profile_dir.h"

namespace aspen::api {

// RunFacts for `command`: the CPU's name, the ISA the kernels use and the threads (0: the team's default),
// then the command's own facts, in order; and the machine's peaks, measured now on those threads (about a
// second: call it after the run, when the profile is written).
profile::RunFacts run_facts(std::string command, int threads,
                            std::vector<std::pair<std::string, std::string>> own = {});

// profile::write_profile_dir, then a line on `out` naming the files written.
[[nodiscard]] Status write_run_profile(const std::string& dir, const std::vector<profile::TraceEvent>& events,
                                       const profile::RunFacts& run, std::ostream& out);

// NOTE [profiles across processes]: every process's events in process 0's list, each process's devices named
// "p<k>/<device>" (process 0's too) and its times moved onto process 0's clock: the processes leave a barrier
// together and each reads its recorder's clock (`clock`) there; process k's events shift by process 0's
// reading less its own (exact to the barrier's skew, tens of microseconds, on one host or many). A collective:
// every process calls it, with its events or none; the others get an empty list. In one process: `mine`.
Result<std::vector<profile::TraceEvent>> gather_process_events(parallel::Communicator* job,
                                                               const std::vector<profile::TraceEvent>& mine,
                                                               const profile::TraceRecorder* clock);

// NOTE [planned and measured memory]: `session`'s Footprint as the run's planned memory, beside the peak RSS
// and the RSS at start (run_facts measures those).
void add_planned_memory(profile::RunFacts& run, const runtime::Session& session);

// The help of the commands' --profile option.
inline constexpr const char* kProfileHelp =
    "write DIR/report.html, DIR/trace.pftrace (Perfetto; and trace.json), DIR/profile.json (docs/profile.md) "
    "(default: $ASPEN_PROFILE; unset: no profile)";

}  // namespace aspen::api
