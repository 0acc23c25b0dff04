// bench/attention_bench.h: `aspen bench attention`.
//
// Causal self-attention forward (B = 1, S = T) for each T: aspen's
// memory-efficient kernel (kernels/attention.h) against the naive definition,
// ref::attention_forward<float>, which materializes the [T, S] scores. Reports
// the time of each, the speedup, and the scratch memory each needs.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct AttentionBenchOptions {
  std::vector<int64_t> t = {256, 1024, 4096};
  int64_t heads = 2;
  int64_t d = 64;
  int threads = 2;
  bool json = false;
  int repeats = 3;
};

// One line per T (a table, or with json one object per line:
// {"bench":"attention","t":..,"mode":"causal","seconds":..,"naive_seconds":..,
//  "speedup":..,"peak_bytes":..,"naive_peak_bytes":..}).
Status run_attention_bench(const AttentionBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
