// bench/profile_bench.h: `aspen bench profile`: what profiling costs and what `aspen profile diff` finds.
//
//   overhead   GPT-2 decode with every instruction traced against the same untraced, alternated in rounds
//              (the median of the per-round ratios; W3.5's goal: at most 2 % slower)
//   detection  trials of `aspen profile diff` (NOTE [profile diff]): per trial two profiled runs of the same
//              decode, the second with one instruction (chosen among those taking >= 1 % of the decode
//              program's time, a different one per trial) slowed by `slowdown` (NOTE [slowed instruction]);
//              found when the diff names it slower; false names counted (W3.5's goal: found in >= 95 %).
//   trace size a real decode's events repeated (each run's times after the last) to `trace_events` events,
//              written as trace.pftrace (profile/perfetto.h): bytes an event, the file, the seconds to write
//              it, against trace.json's bytes an event on the same events (W3.5's goal: 10 million events
//              under 300 MB). Holds the events in memory: about 0.5 GB a million.
#pragma once

#include <ostream>

#include "core/status.h"

namespace aspen::bench {

struct ProfileBenchOptions {
  int threads = 0;            // 0: the free cores
  int64_t layers = 12;        // GPT-2-124M's shape with this many layers
  int64_t new_tokens = 64;    // decode steps per run
  int rounds = 7;             // overhead: traced and untraced runs, alternated
  int trials = 20;            // detection trials
  double slowdown = 0.05;     // the injected slowdown
  int64_t trace_events = 10'000'000;  // trace size: events written (0: no trace-size row)
  bool json = false;
  bool quick = false;         // 2 layers, vocab 2048, few tokens, 3 rounds, 2 trials, 100,000 events (a smoke test)
};

Status run_profile_bench(const ProfileBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
