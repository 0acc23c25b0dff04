#include "bench/kernels_bench.h"

#include <fmt/format.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/common.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/thread_team.h"
#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/cpu.h"
#include "kernels/norm.h"
#include "kernels/softmax.h"

namespace aspen::bench {

namespace {

struct Case {
  std::string name;
  double bytes;  // bytes read + written by one call (the STREAM convention: no write-allocate traffic)
  std::function<Status()> run;
};

}  // namespace

Status run_kernels_bench(const KernelsBenchOptions& opt, std::ostream& out) {
  ScopedOmpThreads team(opt.threads);
  // 16 Mi floats = 64 MiB per array: well past the last-level cache.
  const int64_t C = 1024, R = opt.quick ? 64 : 16384, N = R * C;
  auto make = [&](uint64_t seed) {
    Tensor t(DType::f32, Shape{N});
    philox_fill_uniform(t.span<float>(), seed, 0, 0, -2.0f, 2.0f);
    return t;
  };
  Tensor x = make(1), y = make(2), dy = make(3), dx = make(4), m = make(5), v = make(6);
  for (float& e : v.span<float>()) e = e * e;  // a second moment is non-negative
  Tensor gamma(DType::f32, Shape{C}), beta(DType::f32, Shape{C}), mean(DType::f32, Shape{R}),
      rstd(DType::f32, Shape{R}), dgamma(DType::f32, Shape{C}), dbeta(DType::f32, Shape{C});
  for (float& g : gamma.span<float>()) g = 1.0f;
  auto xs = x.span<float>();
  auto ys = y.span<float>();
  const double n4 = double(N) * 4;
  kernels::AdamWConfig adam;
  std::vector<Case> cases = {
      {"layernorm_forward", 2 * n4,
       [&] {
         return kernels::layernorm_forward(xs, gamma.span<float>(), beta.span<float>(), ys, mean.span<float>(),
                                           rstd.span<float>(), R, C, 1e-5f);
       }},
      {"layernorm_backward", 3 * n4,
       [&] {
         return kernels::layernorm_backward(xs, gamma.span<float>(), mean.span<float>(), rstd.span<float>(),
                                            dy.span<float>(), dx.span<float>(), dgamma.span<float>(),
                                            beta.span<float>(), R, C);
       }},
      {"rmsnorm_forward", 2 * n4,
       [&] { return kernels::rmsnorm_forward(xs, gamma.span<float>(), ys, rstd.span<float>(), R, C, 1e-5f); }},
      {"softmax_forward", 2 * n4, [&] { return kernels::softmax_forward(xs, ys, R, C); }},
      {"softmax_backward", 3 * n4,
       [&] { return kernels::softmax_backward(ys, dy.span<float>(), dx.span<float>(), R, C); }},
      {"gelu_tanh_forward", 2 * n4, [&] { return kernels::gelu_forward(xs, ys, N, kernels::GeluKind::tanh); }},
      {"gelu_tanh_backward", 3 * n4,
       [&] { return kernels::gelu_backward(xs, dy.span<float>(), dx.span<float>(), N, kernels::GeluKind::tanh); }},
      {"adamw_step", 7 * n4,  // reads param, grad, m, v; writes param, m, v
       [&] {
         adam.step += 1;
         return kernels::adamw_step(dx.span<float>(), dy.span<float>(), m.span<float>(), v.span<float>(), N, adam);
       }},
  };

  const double copy_bw = measure_copy_bandwidth(size_t(N) * 4);
  if (!opt.json)
    out << fmt::format("# {} thread(s), {} MiB per array, STREAM-style copy: {:.1f} GB/s (isa {})\n", opt.threads,
                       N * 4 >> 20, copy_bw / 1e9, kernels::isa_name(kernels::active_isa()));
  // NOTE [guarded rows]: the copy's bandwidth is the row's ceiling, measured before and after it.
  const auto ceiling = [&] { return measure_copy_bandwidth(size_t(N) * 4); };
  for (const Case& c : cases) {
    Status st;
    const RowTimes times = guarded_rounds({[&] { st = c.run(); }}, opt.quick ? std::function<double()>() : ceiling,
                                          opt.quick ? 1 : 5, opt.quick ? 0.0 : 0.3);
    ASPEN_RETURN_IF_ERROR(std::move(st).with_context("bench kernels: " + c.name));
    const double bw = c.bytes / times.min[0], row_copy = times.ceiling() > 0 ? times.ceiling() : copy_bw;
    if (opt.json) {
      nlohmann::ordered_json row = {{"bench", "kernels"},     {"kernel", c.name},   {"elements", N},
                                    {"threads", opt.threads}, {"bytes_per_s", bw}, {"copy_bytes_per_s", row_copy},
                                    {"fraction_of_copy", bw / row_copy}};
      row["seconds"] = spread_json(times, 0);
      add_guard_fields(row, times);
      out << row.dump() << "\n";
    } else {
      out << fmt::format("{:<20} {:>8.1f} GB/s  {:>5.0f}% of copy{}\n", c.name, bw / 1e9, 100 * bw / row_copy,
                         times.disturbed ? fmt::format("  (disturbed: the copy moved {:.0f}%)", 100 * times.drift())
                                         : "");
    }
    out.flush();
  }
  return Status();
}

}  // namespace aspen::bench
