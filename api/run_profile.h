// api/run_profile.h: what every command that writes a profile directory (docs/profile.md) shares beside the
// facts each profile starts with (runtime/run_facts.h): gathering the processes' events, and writing the
// directory with a line that says where.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "parallel/communicator.h"
#include "profile/profile_dir.h"

namespace aspen::api {

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

// The help of the commands' --profile option.
inline constexpr const char* kProfileHelp =
    "write DIR/report.html, DIR/trace.pftrace (Perfetto; and trace.json), DIR/profile.json (docs/profile.md) "
    "(default: $ASPEN_PROFILE; unset: no profile)";

}  // namespace aspen::api
