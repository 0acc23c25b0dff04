#include "bench/attention_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/common.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/softmax.h"

namespace aspen::bench {

namespace {

// The materialized path a framework's eager attention takes (PyTorch's "math"
// scaled_dot_product_attention): scores = q k^T for all heads by oneDNN, scale
// and causal mask, row softmax, out = p v. Multithreaded like the fast kernel;
// its scratch is the [B·H, T, S] score tensor.
Status materialized_attention(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                              std::span<float> o, std::span<float> scores, int64_t BH, int64_t T, int64_t S,
                              int64_t D, float scale) {
  kernels::MatmulShape qk{.batch = BH, .M = T, .N = S, .K = D, .trans_b = true};
  ASPEN_RETURN_IF_ERROR(kernels::matmul(q, k, {}, scores, qk));
  float* sc = scores.data();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < BH * T; ++row) {
    const int64_t i = row % T;
    float* r = sc + row * S;
    for (int64_t j = 0; j < S; ++j) r[j] = j <= i ? r[j] * scale : -INFINITY;
  }
  ASPEN_RETURN_IF_ERROR(kernels::softmax_forward(scores, scores, BH * T, S));
  kernels::MatmulShape pv{.batch = BH, .M = T, .N = D, .K = S};
  return kernels::matmul(scores, v, {}, o, pv);
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
    out << fmt::format("# attention forward, causal, B=1 H={} D={}, {} thread(s); naive = reference, 1 thread;\n"
                       "# materialized = oneDNN q k^T, softmax, p v over all heads (PyTorch's math path), {} thread(s)\n"
                       "# peak = scratch bytes allocated beyond q, k, v, out, lse\n"
                       "{:>6} | {:>10} {:>10} {:>8} | {:>10} {:>8} | {:>12} {:>12} {:>12}\n",
                       H, D, opt.threads, opt.threads, "T", "fast ms", "naive ms", "speedup", "mat. ms", "speedup",
                       "peak", "naive peak", "mat. peak");
  for (const int64_t T : opt.t) {
    const int64_t S = T;
    std::vector<float> q(size_t(B * H * T * D)), k(size_t(B * H * S * D)), v(k.size()), o(q.size()), lse(size_t(B * H * T));
    philox_fill_uniform(q, /*seed=*/1, /*stream=*/1, 0, -1.0f, 1.0f);
    philox_fill_uniform(k, 1, 2, 0, -1.0f, 1.0f);
    philox_fill_uniform(v, 1, 3, 0, -1.0f, 1.0f);

    Status status;
    const double fast = best_seconds([&] {
      if (status.is_ok()) status = kernels::attention_forward(q, k, v, o, lse, B, H, H, T, S, D, scale, mask);
    }, opt.repeats, 0.0);
    ASPEN_RETURN_IF_ERROR(status);
    std::vector<float> scores(size_t(B * H * T * S)), o_mat(o.size());
    Status mat_status;
    const double mat = best_seconds([&] {
      if (mat_status.is_ok()) mat_status = materialized_attention(q, k, v, o_mat, scores, B * H, T, S, D, scale);
    }, opt.repeats, 0.0);
    ASPEN_RETURN_IF_ERROR(mat_status);
    scores = {};
    // Both compute the same function: a bench that times a wrong answer is worse than none.
    double max_diff = 0;
    for (size_t i = 0; i < o.size(); ++i) max_diff = std::max(max_diff, double(std::abs(o[i] - o_mat[i])));
    if (!(max_diff < 1e-4))
      return Status::error(Code::kInternal, "attention bench, T=" + std::to_string(T),
                           "the fast and materialized outputs to agree within 1e-4",
                           "a max difference of " + std::to_string(max_diff));
    // The reference is quadratic in time and memory: one run once it takes seconds.
    const int naive_runs = T >= 2048 ? 1 : opt.repeats;
    const double naive = best_seconds([&] {
      kernels::ref::attention_forward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), B, H, H, T, S, D, scale,
                                             mask);
    }, naive_runs, 0.0, /*warm_up=*/naive_runs > 1);

    // Peak memory is accounted, not sampled: the fast forward's only allocation
    // is its per-thread tile scratch, attention_forward_scratch_bytes(D, threads);
    // the reference's is one [T, S] float score matrix (see kernels/attention.h).
    const int64_t peak = kernels::attention_forward_scratch_bytes(D, opt.threads);
    const int64_t naive_peak = T * S * int64_t(sizeof(float));
    const double speedup = naive / fast;
    const int64_t mat_peak = B * H * T * S * int64_t(sizeof(float));
    if (opt.json) {
      nlohmann::ordered_json row = {{"bench", "attention"}, {"t", T},
                                    {"mode", "causal"},     {"seconds", fast},
                                    {"naive_seconds", naive}, {"speedup", speedup},
                                    {"peak_bytes", peak},   {"naive_peak_bytes", naive_peak},
                                    {"materialized_seconds", mat}, {"speedup_vs_materialized", mat / fast},
                                    {"materialized_peak_bytes", mat_peak}};
      out << row.dump() << "\n";
    } else {
      out << fmt::format("{:>6} | {:>10.3f} {:>10.3f} {:>7.1f}x | {:>10.3f} {:>7.2f}x | {:>8.1f} KiB {:>8.1f} MiB "
                         "{:>8.1f} MiB\n",
                         T, fast * 1e3, naive * 1e3, speedup, mat * 1e3, mat / fast, peak / 1024.0,
                         naive_peak / 1048576.0, mat_peak / 1048576.0);
    }
  }
  return Status();
}

}  // namespace aspen::bench
