// bench/gemm_bench.h: `aspen bench gemm`.
//
// Times aspen's matmul (a cached MatmulPlan behind the checked entry point),
// oneDNN called directly, and OpenBLAS cblas_sgemm on the same shapes in the
// same run, f32 and bf16, on 1 and 2 threads. Reports GFLOP/s, the fraction of
// the machine's peak measured by the bench itself, and aspen ÷ oneDNN.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct GemmCase {
  int64_t m, n, k;
};

struct GemmBenchOptions {
  std::vector<GemmCase> cases;  // empty: the standard list (docs/bench.md)
  std::vector<int> threads = {1, 2};
  bool f32 = true, bf16 = true;
  bool json = false;
  bool quick = false;  // fewer repetitions (used by the smoke test)
};

std::vector<GemmCase> standard_gemm_cases();
Status run_gemm_bench(const GemmBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
