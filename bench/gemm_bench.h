// bench/gemm_bench.h: `aspen bench gemm`.
//
// Times aspen's matmul (a cached MatmulPlan behind the checked entry point, on
// the backend matmul_backend_for picks, which each row names), oneDNN called
// directly, and OpenBLAS cblas_sgemm with its own threading on the same shapes
// in the same run, f32 and bf16, on 1 and 2 threads. Reports GFLOP/s, the
// fraction of the machine's peak measured by the bench itself, and aspen ÷
// oneDNN.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

// C [m, n] = op(A) [m, k] · op(B) [k, n]; A is stored [k, m] with trans_a, B
// [n, k] with trans_b (as kernels::MatmulShape).
struct GemmCase {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};

// "1024x768x3072", with ":ta", ":tb" or ":tatb" for transposes; an error
// Status names the text and the expected form.
Result<GemmCase> parse_gemm_case(const std::string& text);

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
