// runtime/run_facts.h: the facts every profile directory starts with (docs/profile.md): the machine, this
// process's memory by named part, the session's planned memory, and the machine's peaks measured in this
// process. The commands' --profile (api/run_profile.h), InferenceModel and TrainingModel's Options::profile
// and the benches all build them here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "profile/profile_dir.h"
#include "runtime/session.h"

namespace aspen::runtime {

// RunFacts for `command`: the CPU's name, the ISA the kernels use and the threads (0: the team's default),
// then the command's own facts, in order; this process's memory now (its peak, what it held at start, the
// parts named: NOTE [planned and measured memory]); and the machine's peaks, measured now on those threads
// (about a second, once per process and team size: call it after the run, when the profile is written).
profile::RunFacts run_facts(std::string command, int threads,
                            std::vector<std::pair<std::string, std::string>> own = {});

// NOTE [planned and measured memory]: `session`'s Footprint added to the run's planned memory.
void add_planned_memory(profile::RunFacts& run, const Session& session);

// Every program of `session`: its planned memory ("program <i>") in run.programs, then its footprint
// (add_planned_memory).
void add_session(profile::RunFacts& run, const Session& session);

}  // namespace aspen::runtime
