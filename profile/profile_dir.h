// profile/profile_dir.h: a run's profile as a directory a person or a script opens (docs/profile.md):
//
//   DIR/trace.pftrace every recorded event as a Perfetto trace (profile/perfetto.h): a track per device,
//                     counters of planned memory and bytes in flight, an arrow for every transfer; a few
//                     bytes an event, so 10 million events open in ui.perfetto.dev
//   DIR/trace.json    the same events in the Chrome trace JSON (chrome://tracing, Perfetto, `aspen profile
//                     diff`), for runs of at most kJsonTraceEvents events
//   DIR/profile.json  the totals per device and per op (profile::device_totals), with what ran and where, in
//                     the schema "aspen.profile/1" (docs/profile.md), for scripts
//   DIR/report.html   the same drawn for a person: one self-contained page (profile/report.h)
//
// `aspen generate --profile DIR` writes one; so does any command run with the environment variable
// ASPEN_PROFILE=DIR (profile_dir_choice), for programs that cannot pass a flag.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_phases.h"
#include "core/status.h"
#include "profile/trace.h"

namespace aspen::profile {

// A compiled program's memory over its instruction order, as its memory plan made it (the memory view;
// compiler::program_memory fills it): the arena (the planned peak of transient values), the naive sum
// (every transient in its own buffer), parameters and weight-only values kept beside, the bytes of transient
// values live at each node, and the values live at the peak.
struct ProgramMemory {
  struct Value {
    std::string op;    // the node that makes it
    std::string type;  // its dtype and shape
    int64_t bytes = 0;
  };
  std::string name;  // "prefill", "decode", "run", ...
  int64_t program = -1;  // its index in the session (the events' "program" argument); -1: not known
  int64_t nodes = 0, arena_bytes = 0, naive_bytes = 0, parameter_bytes = 0, derived_bytes = 0;
  int64_t peak_node = -1;
  // Live bytes over program order: at most kMaxPoints points, each the largest of `stride` consecutive nodes.
  static constexpr int64_t kMaxPoints = 1000;
  int64_t stride = 1;
  std::vector<int64_t> live_bytes;
  std::vector<Value> at_peak;  // the largest first, at most 20
};

// What the profile says about the run besides its events: the command, facts about the machine and the
// program (name -> value, in order: "cpu", "isa", "threads", ...), and its programs' memory.
// The machine's ceilings, measured in the run's process (kernels/peaks.h; 0: not measured): what the
// roofline divides each op's rates by.
struct Peaks {
  double fma_gflops = 0;    // f32 FMA on the widest vectors, the run's threads
  double bf16_gflops = 0;   // bf16 products (AMX or AVX512-BF16; 0 without either)
  double read_gb_per_s = 0;  // the read sweep, beyond the last-level cache
};
// NOTE [planned and measured memory]: the process's peak resident set (measured: VmHWM) beside what the
// run's plan holds (planned: its session's Footprint) and what the process held before any model (at start:
// code, libraries); the rest is named as it is: kernels' private copies of weights, the checkpoint's pages
// read, the tokenizer, allocator slack. 0: not known.
struct RunMemory {
  int64_t peak_rss = 0, start_rss = 0;
  int64_t measurement = 0;  // the peaks' read buffer, when an earlier profile of this process measured them
  // Measured when the profile is written: the file-backed pages resident then beyond those at start (the
  // code of the libraries and kernels used, paged in as first run; a checkpoint's pages are dropped once
  // read, NOTE [pages read once]), and the freed tensor blocks held for reuse (NOTE [tensor block cache]).
  int64_t libraries_paged = 0, block_cache = 0;
  int64_t kernel_copies = 0;  // kernels' own layouts of fixed weights then (count_kernel_copy_bytes)
  int64_t heap_free = 0;      // free heap malloc keeps then (mallinfo2's fordblks: freed, not returned)
  int64_t kernel_scratch = 0;  // the threads' kernel scratch then (kernels/scratch.h: widened operands, layouts)
  // NOTE [memory phases] (core/memory_phases.h): the resident set and its high-water mark after each step of
  // the work, the last one when the profile was written.
  std::vector<MemoryPhase> phases = {};
  int64_t parameters = 0, replica_copies = 0, arenas = 0, weight_only = 0;  // planned
  int64_t planned() const { return parameters + replica_copies + arenas + weight_only; }
};
struct RunFacts {
  std::string command;
  std::vector<std::pair<std::string, std::string>> facts;
  std::vector<ProgramMemory> programs = {};
  Peaks peaks = {};
  RunMemory memory = {};
};

// profile.json's text (docs/profile.md): schema, command, facts, peaks, wall_ns (first start to last end over
// all devices), per device its busy_ns, span_ns, events, ops (category, name, count, total_ns, mean_ns, share
// of the device's busy time, bytes, gb_per_s, flops, gflops_per_s, the roofline fractions) and layers, and
// programs (ProgramMemory's fields).
std::string profile_json(const std::vector<TraceEvent>& events, const RunFacts& run);

// Creates `dir` (and its parents) if needed: a command calls it before it runs, so that a directory it
// cannot write is named before the work, not after. kIoError naming `dir`.
[[nodiscard]] Status make_profile_dir(const std::string& dir);

// The most events trace.json is written for (about 200 MB of JSON): beyond, only trace.pftrace (and an
// earlier trace.json in `dir` is removed).
inline constexpr size_t kJsonTraceEvents = 1'000'000;

// Creates `dir` (and its parents) if needed and writes trace.pftrace, trace.json (up to kJsonTraceEvents
// events), profile.json and report.html there, each replaced atomically. kIoError naming the path that could not be made or written.
[[nodiscard]] Status write_profile_dir(const std::string& dir, const std::vector<TraceEvent>& events,
                                       const RunFacts& run);

// Options::profile(PATH) of the C++ API and enableProfiling(PATH) of the Python package: a PATH ending in
// ".json" is one Chrome trace file (write_chrome_trace), any other a profile directory (write_profile_dir)
// with the facts `facts` makes (called only then: measuring the machine's peaks takes about a second).
[[nodiscard]] Status write_profile_path(const std::string& path, const std::vector<TraceEvent>& events,
                                        const std::function<RunFacts()>& facts);

// The profile directory of a command: `flag` when not empty, else the environment's ASPEN_PROFILE, else ""
// (no profile).
std::string profile_dir_choice(const std::string& flag);

}  // namespace aspen::profile
