#include "profile/diff.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

namespace aspen::profile {

namespace {

std::string arg(const TraceEvent& e, const char* key) {
  for (const auto& [k, v] : e.args)
    if (k == key) return v;
  return {};
}

// An instruction's identity: the same in every run of the same program.
std::string key_of(const TraceEvent& e) {
  return e.device + '\x1f' + e.category + '\x1f' + e.name + '\x1f' + arg(e, "program") + '\x1f' + arg(e, "node") +
         '\x1f' + arg(e, "instruction");
}

struct Samples {
  const TraceEvent* first = nullptr;
  std::vector<double> ns;
  double median = 0;  // of the raw times (NOTE [run of a program])
};

double duration(const TraceEvent& e) { return double(std::max<int64_t>(0, e.end_ns - e.start_ns)); }

// The value at half the total weight of (value, weight) pairs (sorted here); 1 for none.
double weighted_median(std::vector<std::pair<double, double>> v, double total) {
  std::sort(v.begin(), v.end());
  double acc = 0;
  for (const auto& [x, w] : v) {
    acc += w;
    if (acc >= 0.5 * total) return x;
  }
  return v.empty() ? 1.0 : v.back().first;
}

// NOTE [run of a program]: a shared host slows a whole stretch of time, every instruction in it alike (a
// neighbour's burst, a frequency change): within one profile that is most of an instruction's spread from
// one run of its program to the next, and between two profiles it does not average out over a few dozen
// runs. Each run of a program (on a device: its instructions in time order, a new run where a node comes
// again) gets its factor, the weighted median over its instructions of their time over their median time
// in the profile (weights: the square root of that median, as the run's factor of a diff), and its
// instructions' times are divided by it. One instruction slower in every run moves no run's median: what
// the diff looks for stays. Runs of fewer than 8 instructions are left as they are.
std::map<std::string, Samples> by_instruction(const std::vector<TraceEvent>& events) {
  std::map<std::string, Samples> m;
  std::vector<Samples*> of(events.size());  // each event's instruction
  for (size_t i = 0; i < events.size(); ++i) {
    Samples& s = m[key_of(events[i])];
    if (!s.first) s.first = &events[i];
    s.ns.push_back(duration(events[i]));
    of[i] = &s;
  }
  for (auto& [key, s] : m) {
    std::vector<double> v = s.ns;
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    s.median = v[v.size() / 2];
  }
  // The runs: by (device, program), in time order.
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> streams;
  for (size_t i = 0; i < events.size(); ++i)
    if (const std::string program = arg(events[i], "program"); !program.empty())
      streams[{events[i].device, program}].push_back(i);
  std::vector<double> factor(events.size(), 1.0);
  for (auto& [stream, idx] : streams) {
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t x, size_t y) { return events[x].start_ns < events[y].start_ns; });
    std::vector<size_t> run;
    std::set<const Samples*> seen;
    auto close = [&] {
      if (run.size() >= 8) {
        std::vector<std::pair<double, double>> r;
        double total = 0;
        for (size_t i : run)
          if (const double med = of[i]->median; med > 0) {
            r.emplace_back(duration(events[i]) / med, std::sqrt(med));
            total += std::sqrt(med);
          }
        const double f = total > 0 ? weighted_median(r, total) : 1.0;
        if (f > 0)
          for (size_t i : run) factor[i] = f;
      }
      run.clear();
      seen.clear();
    };
    for (size_t i : idx) {
      if (seen.count(of[i])) close();  // the instruction again: a new run
      seen.insert(of[i]);
      run.push_back(i);
    }
    close();
  }
  for (auto& [key, s] : m) s.ns.clear();
  for (size_t i = 0; i < events.size(); ++i) of[i]->ns.push_back(duration(events[i]) / factor[i]);
  return m;
}

// An instruction's typical time: the mean of its runs with the fastest and slowest 20 % left out (robust to
// a preempted run like the median, and with less noise of its own), and that mean's standard error (the
// winsorized variance over (1 - 2 · 0.2)² n, Tukey and McLaughlin's).
struct Typical {
  double mean = 0, error = 0;
};
Typical trimmed(std::vector<double> v) {
  Typical t;
  if (v.empty()) return t;
  std::sort(v.begin(), v.end());
  const size_t n = v.size(), g = size_t(0.2 * double(n));
  double sum = 0;
  for (size_t i = g; i < n - g; ++i) sum += v[i];
  t.mean = sum / double(n - 2 * g);
  double wmean = 0;
  for (size_t i = 0; i < n; ++i) wmean += v[std::clamp(i, g, n - 1 - g)];
  wmean /= double(n);
  double var = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = v[std::clamp(i, g, n - 1 - g)] - wmean;
    var += x * x;
  }
  var /= double(std::max<size_t>(1, n - 1));
  t.error = std::sqrt(var) / ((1.0 - 2.0 * double(g) / double(n)) * std::sqrt(double(n)));
  return t;
}

}  // namespace

Result<std::vector<TraceEvent>> read_chrome_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(Code::kIoError, path, "a readable trace.json", "cannot open it");
  std::stringstream text;
  text << in.rdbuf();
  return parse_chrome_trace(text.str(), path);
}

Result<std::vector<TraceEvent>> parse_chrome_trace(const std::string& text, const std::string& path) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    return Status::error(Code::kCorrupt, path, "Chrome trace JSON with a traceEvents array (aspen's trace.json)",
                         j.is_discarded() ? "text that is not JSON" : "JSON without one");
  std::unordered_map<int64_t, std::string> devices;
  for (const nlohmann::ordered_json& e : j["traceEvents"])
    if (e.is_object() && e.value("ph", "") == "M" && e.value("name", "") == "thread_name" && e.contains("args"))
      devices[e.value("tid", int64_t(0))] = e["args"].value("name", "");
  std::vector<TraceEvent> events;
  for (const nlohmann::ordered_json& e : j["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number())
      return Status::error(Code::kCorrupt, path, "complete events with numeric ts and dur", e.dump().substr(0, 120));
    TraceEvent t;
    const int64_t tid = e.value("tid", int64_t(0));
    t.device = devices.count(tid) ? devices[tid] : "tid " + std::to_string(tid);
    t.name = e.value("name", "");
    t.category = e.value("cat", "");
    t.start_ns = std::llround(e["ts"].get<double>() * 1e3);
    t.end_ns = t.start_ns + std::llround(e["dur"].get<double>() * 1e3);
    if (e.contains("args") && e["args"].is_object())
      for (const auto& [k, v] : e["args"].items()) {
        if (k == "bytes" && v.is_number()) t.bytes = v.get<int64_t>();
        else if (k == "flops" && v.is_number()) t.flops = v.get<int64_t>();
        else t.args.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
      }
    events.push_back(std::move(t));
  }
  return events;
}

ProfileDiff diff_profiles(const std::vector<TraceEvent>& a, const std::vector<TraceEvent>& b,
                          const DiffOptions& options) {
  const std::map<std::string, Samples> sa = by_instruction(a), sb = by_instruction(b);
  struct Pair {
    const Samples *a, *b;
    Typical ta, tb;
    double ma, mb;
  };
  std::vector<Pair> pairs;
  ProfileDiff d;
  for (const auto& [key, s] : sa) {
    auto it = sb.find(key);
    if (it == sb.end()) {
      ++d.only_a;
      continue;
    }
    if (int(s.ns.size()) < options.min_runs || int(it->second.ns.size()) < options.min_runs) continue;
    const Typical ta = trimmed(s.ns), tb = trimmed(it->second.ns);
    pairs.push_back({&s, &it->second, ta, tb, ta.mean, tb.mean});
  }
  for (const auto& [key, s] : sb) d.only_b += sa.count(key) ? 0 : 1;
  d.compared = int64_t(pairs.size());
  // The run's factor: the weighted median of B / A over the instructions, each weighted by the square root of
  // its time in A (by the time itself, three attention instructions that ran 4x slower in A than in B
  // outweighed fifty others and made every other instruction read 4x slower; unweighted, the
  // nanosecond-long ones, the noisiest, would decide).
  std::vector<std::pair<double, double>> ratios;  // (ratio, weight)
  double total = 0;
  for (const Pair& p : pairs)
    if (p.ma > 0 && p.mb > 0) {
      const double w = std::sqrt(p.ma * double(p.a->ns.size()));
      ratios.emplace_back(p.mb / p.ma, w);
      total += w;
    }
  if (!ratios.empty()) d.run_factor = weighted_median(ratios, total);
  // The run-to-run spread by the instruction's size (NOTE [spread by size]): a 300 µs product varies by 1 %
  // from one profile to the next, a 2 µs copy by 10 %; one spread for all let the many small ones hide a 5 %
  // change of a big one (a GPT-2 decode: 4 spreads were 14 % over all its instructions, 6 % over those of
  // 1 % of the step or more). Each instruction's spread is that of the kNear instructions nearest to it in
  // total time (1.4826 · the median absolute deviation of their log ratios); the diff's `spread` is the
  // time-weighted median of them (what the instructions that carry the time can tell).
  constexpr size_t kNear = 24;
  std::vector<size_t> by_time;  // pairs with both times, by their total time in A
  for (size_t i = 0; i < pairs.size(); ++i)
    if (pairs[i].ma > 0 && pairs[i].mb > 0) by_time.push_back(i);
  std::sort(by_time.begin(), by_time.end(), [&](size_t x, size_t y) {
    return pairs[x].ma * double(pairs[x].a->ns.size()) < pairs[y].ma * double(pairs[y].a->ns.size());
  });
  std::vector<double> spread_of(pairs.size(), 0.0);
  std::vector<std::pair<double, double>> spreads;  // (spread, total time in A)
  double time_total = 0;
  for (size_t r = 0; r < by_time.size(); ++r) {
    const size_t n = by_time.size(), w = std::min(kNear, n);
    const size_t lo = std::min(r >= w / 2 ? r - w / 2 : 0, n - w);
    std::vector<double> dev;
    for (size_t k = lo; k < lo + w; ++k) {
      const Pair& p = pairs[by_time[k]];
      dev.push_back(std::abs(std::log(p.mb / p.ma / d.run_factor)));
    }
    std::nth_element(dev.begin(), dev.begin() + std::ptrdiff_t(dev.size() / 2), dev.end());
    const size_t i = by_time[r];
    spread_of[i] = 1.4826 * dev[dev.size() / 2];
    const double t = pairs[i].ma * double(pairs[i].a->ns.size());
    spreads.emplace_back(spread_of[i], t);
    time_total += t;
  }
  if (!spreads.empty()) d.spread = weighted_median(spreads, time_total);
  auto detectable = [&](double spread) { return std::max(options.threshold, std::exp(options.spreads * spread) - 1.0); };
  d.detectable = detectable(d.spread);
  double compared_b = 0;
  for (const Pair& p : pairs) compared_b += p.mb * double(p.b->ns.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const Pair& p = pairs[i];
    if (p.ma <= 0) continue;
    const double expected = d.run_factor * p.ma;
    const double err = std::max(std::hypot(d.run_factor * p.ta.error, p.tb.error), std::max(0.005 * std::max(expected, p.mb), 100.0));
    InstructionDiff x;
    x.device = p.a->first->device;
    x.name = p.a->first->name;
    x.layer = arg(*p.a->first, "layer");
    x.program = arg(*p.a->first, "program");
    x.node = arg(*p.a->first, "node");
    x.runs_a = int64_t(p.a->ns.size());
    x.runs_b = int64_t(p.b->ns.size());
    x.median_a_ns = p.ma;
    x.median_b_ns = p.mb;
    x.ratio = p.mb / expected;
    x.z = err > 0 ? (p.mb - expected) / err : 0.0;
    x.impact_ns = (p.mb - expected) * double(x.runs_b);
    x.detectable = detectable(spread_of[i]);
    const bool costs = std::abs(x.impact_ns) >= options.min_share * compared_b;
    if (costs && x.ratio > 1 + x.detectable && x.z > options.min_z) d.slower.push_back(x);
    if (costs && x.ratio < 1 / (1 + x.detectable) && x.z < -options.min_z) d.faster.push_back(x);
  }
  std::sort(d.slower.begin(), d.slower.end(), [](const auto& x, const auto& y) { return x.z > y.z; });
  std::sort(d.faster.begin(), d.faster.end(), [](const auto& x, const auto& y) { return x.z < y.z; });
  return d;
}

}  // namespace aspen::profile
