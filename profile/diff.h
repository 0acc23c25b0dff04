// profile/diff.h: two runs of the same program compared instruction by instruction (`aspen profile diff A B`).
//
// A compiled program runs the same instruction stream every time, so two profiles of it align exactly: each
// instruction (device, program, node, op) has one duration per run of it in each profile. NOTE [profile diff]:
// per instruction its typical duration in A and B (the mean of its runs less the fastest and slowest 20 %),
// and their ratio. Two runs of the same program on a shared
// host differ in two ways besides a real change: the whole run slower or faster (the run's factor: the
// median of the ratios weighted by the square root of A's time, divided out of each), and each instruction a
// little on its own (the run-to-run spread: 1.4826 · the MAD of the log ratios of the instructions of about
// its size, NOTE [spread by size] in diff.cc). An instruction
// is named slower (or faster) when its ratio passes the threshold and 4 spreads (the smallest change the two
// runs can tell for it: `detectable`), its difference stands out of its own samples (z above 4: the difference over
// the standard error of the two trimmed means, at least 0.5 % of them and 100 ns: the clock's and the
// recorder's own jitter), and it cost B at least
// 0.1 % of the compared time. Instructions only one profile has are counted, not compared.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "profile/trace.h"

namespace aspen::profile {

// The events of a trace.json write_chrome_trace wrote (its complete events, devices by thread name).
// kIoError / kCorrupt naming `path`.
Result<std::vector<TraceEvent>> read_chrome_trace(const std::string& path);
// The same from the text itself (chrome_trace_json's); errors name `what`.
Result<std::vector<TraceEvent>> parse_chrome_trace(const std::string& text, const std::string& what);

struct DiffOptions {
  double threshold = 0.02;   // relative change (after the run's factor) an instruction must pass
  double spreads = 4.0;      // and this many of the runs' spreads
  double min_z = 4.0;        // and its z
  double min_share = 0.001;  // and its cost in B over the compared time
  int min_runs = 3;          // runs of an instruction in each profile to compare it
};

struct InstructionDiff {
  std::string device, name, layer, program, node;  // program and node: "" for events that are not instructions
  int64_t runs_a = 0, runs_b = 0;
  double median_a_ns = 0, median_b_ns = 0;  // the typical times (20 % trimmed means)
  double ratio = 0;      // median_b / median_a / the run's factor
  double z = 0;          // (median_b - factor · median_a) over their standard error
  double impact_ns = 0;  // (median_b - factor · median_a) · runs_b: what it cost B in all
  double detectable = 0;  // the smallest change named for this instruction (its size's spread: NOTE [spread by size])
};

struct ProfileDiff {
  double run_factor = 1;  // B's instructions over A's, the whole run's (NOTE [profile diff])
  double spread = 0;      // the run-to-run spread (of log ratios) of the instructions that carry the time
  double detectable = 0;  // the smallest relative change named there: max(threshold, e^(spreads · spread) - 1)
  int64_t compared = 0, only_a = 0, only_b = 0;  // instructions compared, and those in one profile only
  std::vector<InstructionDiff> slower, faster;   // named ones, the largest z first
};

ProfileDiff diff_profiles(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b,
                          const DiffOptions& options = {});

}  // namespace aspen::profile
