#include "bench/attention_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/philox.h"
#include "core/thread_team.h"
#include "kernels/attention.h"

namespace aspen::bench {

namespace {

double seconds_of(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Fastest of `runs` runs, after an untimed warm-up run if asked.
double best_of(int runs, bool warm_up, const std::function<void()>& fn) {
  if (warm_up) fn();
  double best = seconds_of(fn);
  for (int r = 1; r < runs; ++r) best = std::min(best, seconds_of(fn));
  return best;
}

Status check_option(const char* name, int64_t value) {
  if (value < 1)
    return Status::invalid_argument(std::string("attention bench: ") + name, ">= 1", std::to_string(value));
  return Status();
}

}  // namespace

Status run_attention_bench(const AttentionBenchOptions& opt, std::ostream& out) {
  for (int64_t t : opt.t) ASPEN_RETURN_IF_ERROR(check_option("--t", t));
  ASPEN_RETURN_IF_ERROR(check_option("--heads", opt.heads));
  ASPEN_RETURN_IF_ERROR(check_option("d", opt.d));
  ASPEN_RETURN_IF_ERROR(check_option("--threads", opt.threads));
  ASPEN_RETURN_IF_ERROR(check_option("repeats", opt.repeats));

  ScopedOmpThreads team(opt.threads);
  const int64_t B = 1, H = opt.heads, D = opt.d;
  const float scale = 1.0f / std::sqrt(float(D));
  kernels::AttentionMask mask;
  mask.kind = kernels::AttentionMask::Kind::causal;

  if (!opt.json)
    out << fmt::format("# attention forward, causal, B=1 H={} D={}, {} thread(s); naive = reference, 1 thread\n"
                       "# peak = scratch bytes allocated beyond q, k, v, out, lse\n"
                       "{:>6} | {:>10} {:>10} {:>8} | {:>12} {:>12}\n",
                       H, D, opt.threads, "T", "fast ms", "naive ms", "speedup", "peak", "naive peak");
  for (const int64_t T : opt.t) {
    const int64_t S = T;
    std::vector<float> q(size_t(B * H * T * D)), k(size_t(B * H * S * D)), v(k.size()), o(q.size()), lse(size_t(B * H * T));
    philox_fill_uniform(q, /*seed=*/1, /*stream=*/1, 0, -1.0f, 1.0f);
    philox_fill_uniform(k, 1, 2, 0, -1.0f, 1.0f);
    philox_fill_uniform(v, 1, 3, 0, -1.0f, 1.0f);

    Status status;
    const double fast = best_of(opt.repeats, true, [&] {
      if (status.is_ok()) status = kernels::attention_forward(q, k, v, o, lse, B, H, T, S, D, scale, mask);
    });
    ASPEN_RETURN_IF_ERROR(status);
    // The reference is quadratic in time and memory: one run once it takes seconds.
    const int naive_runs = T >= 2048 ? 1 : opt.repeats;
    const double naive = best_of(naive_runs, naive_runs > 1, [&] {
      kernels::ref::attention_forward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), B, H, T, S, D, scale,
                                             mask);
    });

    // Peak memory is accounted, not sampled: the fast forward's only allocation
    // is its per-thread tile scratch, attention_forward_scratch_bytes(D, threads);
    // the reference's is one [T, S] float score matrix (see kernels/attention.h).
    const int64_t peak = kernels::attention_forward_scratch_bytes(D, opt.threads);
    const int64_t naive_peak = T * S * int64_t(sizeof(float));
    const double speedup = naive / fast;
    if (opt.json) {
      nlohmann::ordered_json row = {{"bench", "attention"}, {"t", T},
                                    {"mode", "causal"},     {"seconds", fast},
                                    {"naive_seconds", naive}, {"speedup", speedup},
                                    {"peak_bytes", peak},   {"naive_peak_bytes", naive_peak}};
      out << row.dump() << "\n";
    } else {
      out << fmt::format("{:>6} | {:>10.3f} {:>10.3f} {:>7.1f}x | {:>9.1f} KiB {:>8.1f} MiB\n", T, fast * 1e3,
                         naive * 1e3, speedup, peak / 1024.0, naive_peak / 1048576.0);
    }
  }
  return Status();
}

}  // namespace aspen::bench
