// api/run_profile.h: what every command that writes a profile directory (docs/profile.md) shares: the facts
// each profile starts with, and writing it with a line that says where.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
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

// The help of the commands' --profile option.
inline constexpr const char* kProfileHelp =
    "write DIR/trace.json (Perfetto), DIR/profile.json and DIR/report.html (docs/profile.md) "
    "(default: $ASPEN_PROFILE; unset: no profile)";

}  // namespace aspen::api
