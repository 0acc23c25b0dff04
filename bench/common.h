// bench/common.h: what every benchmark shares: timing, the machine's measured
// ceilings, and output.
//
// The host is shared and noisy, so benchmarks never quote a number alone: each
// measures its peer (oneDNN called directly, OpenBLAS, a STREAM-style copy) in
// the same run, interleaved with aspen's own measurement, and reports ratios.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/peaks.h"

namespace aspen::bench {

// Runs fn once to warm up (unless warm_up is false), then repeats it until
// `min_seconds` have passed and at least `min_reps` runs were made; returns
// the fastest run in seconds.
double best_seconds(const std::function<void()>& fn, int min_reps = 3, double min_seconds = 0.2,
                    bool warm_up = true);

// NOTE [guarded rows] A row's candidates (aspen and its peers) run in `rounds` interleaved rounds: in each,
// every candidate in turn runs until min_seconds / rounds have passed (at least once), and its round time is
// its fastest run there. The row's ceiling (`ceiling`: the FMA peak, the read bandwidth; larger is faster) is
// measured before and after the rounds: when it moved by more than `tolerance` of its larger value, the host
// was disturbed during the row, which is measured again, up to `retries` more times; a row still moving is
// marked disturbed (its figures are kept, flagged). A claim that a goal is out of reach quotes undisturbed rows
// only. Without a ceiling (nullptr) nothing is flagged.
struct RowTimes {
  std::vector<double> min, median, max;   // seconds per run over the rounds, by candidate
  double ceiling_before = 0.0, ceiling_after = 0.0;
  int attempts = 1;                       // 1 + the re-measurements a moving ceiling caused
  bool disturbed = false;
  double ceiling() const { return ceiling_before > ceiling_after ? ceiling_before : ceiling_after; }
  double drift() const;                   // |after - before| / max(before, after); 0 without a ceiling
};
// How far a ceiling moved between two measurements: |after - before| / max(before, after); 0 when both are 0.
// Over kMovedTolerance (5 %), the host was disturbed between them (NOTE [guarded rows]).
constexpr double kMovedTolerance = 0.05;
double ceiling_drift(double before, double after);
inline bool ceiling_moved(double before, double after) { return ceiling_drift(before, after) > kMovedTolerance; }
// The min, median and max of some seconds (all 0 when there are none).
struct Spread {
  double min = 0, median = 0, max = 0;
};
Spread spread_of(std::vector<double> seconds);
nlohmann::ordered_json spread_json(const Spread& s);  // {"min": s, "median": s, "max": s}

RowTimes guarded_rounds(const std::vector<std::function<void()>>& fns, const std::function<double()>& ceiling,
                        int rounds = 5, double min_seconds = 0.3, double tolerance = 0.05, int retries = 1);
// The spread of candidate i as JSON: {"min": s, "median": s, "max": s} (seconds per run).
nlohmann::ordered_json spread_json(const RowTimes& t, size_t i);
// "ceiling_before", "ceiling_after", "ceiling_drift", "attempts", "disturbed" added to a row.
void add_guard_fields(nlohmann::ordered_json& row, const RowTimes& t);

// NOTE [guarded rows] for a measurement that is not candidates in rounds (an MPI job, a training run): `measure`
// runs between two readings of `ceiling`, and again (up to `retries` more times) while the ceiling moved more
// than kMovedTolerance. Without a ceiling (nullptr) it runs once, unguarded (all 0). The first error stops it.
struct Guard {
  double before = 0, after = 0;
  int attempts = 0;
  bool disturbed() const { return ceiling_moved(before, after); }
};
Status guarded(const std::function<Status()>& measure, const std::function<double()>& ceiling, Guard* guard,
               int retries = 1);
void add_guard_fields(nlohmann::ordered_json& row, const Guard& g);  // the same fields as above

// The ceilings, measured in this process (kernels/peaks.h).
using kernels::BfPeak;
using kernels::measure_bf16_peak;
using kernels::measure_f32_fma_peak;
using kernels::measure_read_bandwidth;
using kernels::read_sweep_seconds;

// Memory bandwidth in bytes/s of a STREAM-style copy (read n + write n floats)
// over `bytes` per array, on the calling thread's OpenMP team.
double measure_copy_bandwidth(size_t bytes);
// Runs a peer's shell command and hands `take` every line of its stdout that is a JSON object (other
// lines are ignored). False when the command could not start or exited non-zero.
bool read_json_lines(const std::string& cmd, const std::function<void(const nlohmann::json&)>& take);

}  // namespace aspen::bench
