// core/memory_phases.h: the process's resident memory at the steps of its work, to say which step made the peak.
//
// NOTE [memory phases]: a profile's measured peak RSS (VmHWM) says how high memory went, not when. The
// library notes the resident set and its high-water mark as each costly step ends (a checkpoint opened,
// programs compiled, a session's buffers made, weights loaded); the step after which the high-water mark
// first reaches the peak is where the peak was, and the resident set after it against the peak is what that
// step held only while it ran (a compiler's graphs, a loader's pages). profile.json and the report show them
// (NOTE [planned and measured memory], profile/profile_dir.h).
//
//   note_memory_phase("weights loaded");
//
// Reading /proc/self/status takes ~20 µs: for steps that take milliseconds or more. The first 200 notes of a
// process are kept (a test process compiles thousands of programs); later ones only move the last entry.
// Thread-safety: any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aspen {

struct MemoryPhase {
  std::string name;
  int64_t rss = 0;         // resident bytes after it (VmRSS)
  int64_t high_water = 0;  // the resident set's high-water mark after it (VmHWM)
};

void note_memory_phase(std::string name);
std::vector<MemoryPhase> memory_phases();
// The process now, named `name` (not kept).
MemoryPhase memory_now(std::string name);

}  // namespace aspen
