#include "bench/common.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu.h"

namespace aspen::bench {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double best_seconds(const std::function<void()>& fn, int min_reps, double min_seconds, bool warm_up) {
  if (warm_up) fn();
  double best = 1e30, start = now();
  for (int r = 0; r < min_reps || now() - start < min_seconds; ++r) {
    double t0 = now();
    fn();
    best = std::min(best, now() - t0);
    if (r > 1000) break;
  }
  return best;
}

double ceiling_drift(double before, double after) {
  const double hi = std::max(before, after);
  return hi > 0.0 ? std::abs(after - before) / hi : 0.0;
}

double RowTimes::drift() const { return ceiling_drift(ceiling_before, ceiling_after); }

Spread spread_of(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {v.front(), n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.back()};
}

nlohmann::ordered_json spread_json(const Spread& s) {
  return {{"min", s.min}, {"median", s.median}, {"max", s.max}};
}

RowTimes guarded_rounds(const std::vector<std::function<void()>>& fns, const std::function<double()>& ceiling,
                        int rounds, double min_seconds, double tolerance, int retries) {
  rounds = std::max(rounds, 1);
  for (const auto& f : fns) f();  // warm-up
  RowTimes t;
  for (int attempt = 0;; ++attempt) {
    t.attempts = attempt + 1;
    t.ceiling_before = ceiling ? ceiling() : 0.0;
    std::vector<std::vector<double>> per(fns.size());
    const double slice = min_seconds / rounds;
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < fns.size(); ++i) {
        double best = 1e30;
        const double start = now();
        for (int k = 0; k == 0 || (now() - start < slice && k < 1000); ++k) {
          const double t0 = now();
          fns[i]();
          best = std::min(best, now() - t0);
        }
        per[i].push_back(best);
      }
    t.ceiling_after = ceiling ? ceiling() : 0.0;
    t.min.assign(fns.size(), 0.0), t.median.assign(fns.size(), 0.0), t.max.assign(fns.size(), 0.0);
    for (size_t i = 0; i < fns.size(); ++i) {
      const Spread s = spread_of(std::move(per[i]));
      t.min[i] = s.min, t.median[i] = s.median, t.max[i] = s.max;
    }
    t.disturbed = ceiling && t.drift() > tolerance;
    if (!t.disturbed || attempt >= retries) return t;
  }
}

nlohmann::ordered_json spread_json(const RowTimes& t, size_t i) {
  return {{"min", t.min.at(i)}, {"median", t.median.at(i)}, {"max", t.max.at(i)}};
}

namespace {
void put_guard_fields(nlohmann::ordered_json& row, double before, double after, int attempts, bool disturbed) {
  row["ceiling_before"] = before;
  row["ceiling_after"] = after;
  row["ceiling_drift"] = ceiling_drift(before, after);
  row["attempts"] = attempts;
  row["disturbed"] = disturbed;
}
}  // namespace

void add_guard_fields(nlohmann::ordered_json& row, const RowTimes& t) {
  put_guard_fields(row, t.ceiling_before, t.ceiling_after, t.attempts, t.disturbed);
}

void add_guard_fields(nlohmann::ordered_json& row, const Guard& g) {
  put_guard_fields(row, g.before, g.after, g.attempts, g.disturbed());
}

Status guarded(const std::function<Status()>& measure, const std::function<double()>& ceiling, Guard* guard,
               int retries) {
  *guard = Guard{};
  do {
    guard->before = ceiling ? ceiling() : 0.0;
    ASPEN_RETURN_IF_ERROR(measure());
    guard->after = ceiling ? ceiling() : 0.0;
  } while (++guard->attempts <= retries && guard->disturbed());
  return Status();
}

double measure_copy_bandwidth(size_t bytes) {
  const int64_t n = int64_t(bytes / sizeof(float));
  Tensor a(DType::f32, Shape{n}), b(DType::f32, Shape{n});
  float* pa = a.data<float>();
  float* pb = b.data<float>();
  double t = best_seconds([&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pb[i] = pa[i];
  }, 5, 0.3);
  return 2.0 * double(n) * sizeof(float) / t;
}

bool read_json_lines(const std::string& cmd, const std::function<void(const nlohmann::json&)>& take) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return false;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) take(j);
  }
  return ::pclose(p) == 0;
}

}  // namespace aspen::bench
