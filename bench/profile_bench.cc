#include "bench/profile_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/generate_bench.h"
#include "core/thread_team.h"
#include "models/generate.h"
#include "profile/diff.h"
#include "profile/perfetto.h"
#include "profile/trace.h"

namespace aspen::bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One decode run of `tokens` new tokens (a warm-up first), on a generator opened with `trace` (or none); the
// seconds of the timed run.
Result<double> decode_seconds(const std::string& dir, int threads, int64_t tokens, profile::TraceRecorder* trace) {
  models::GeneratorOptions go{.max_batch = 1, .max_length = 8 + tokens, .max_prompt = 8, .threads = threads};
  go.trace = trace;
  ASPEN_ASSIGN_OR_RETURN(auto gen, models::Generator::open(dir, go));
  std::vector<std::vector<int32_t>> prompt = {{464, 2068, 7586, 21831, 18045, 625, 262, 16931}};
  for (int32_t& id : prompt[0]) id %= 2048;  // within the quick model's vocabulary too
  ASPEN_RETURN_IF_ERROR(gen->generate(prompt, {.max_new_tokens = 2, .temperature = 0.0f}).status());  // warm-up
  if (trace) trace->clear();
  const auto t0 = std::chrono::steady_clock::now();
  ASPEN_RETURN_IF_ERROR(gen->generate(prompt, {.max_new_tokens = tokens, .temperature = 0.0f}).status());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sets (or clears, with "") ASPEN_TEST_SLOW_INSTRUCTION for the sessions opened while it lives.
struct SlowedInstruction {
  explicit SlowedInstruction(const std::string& value) {
    if (!value.empty()) ::setenv("ASPEN_TEST_SLOW_INSTRUCTION", value.c_str(), 1);
  }
  ~SlowedInstruction() { ::unsetenv("ASPEN_TEST_SLOW_INSTRUCTION"); }
};

// The trace-size row: `run` repeated to `n` events, written to `path`.
Status trace_size(const std::vector<profile::TraceEvent>& run, int64_t n, const std::string& path, bool json,
                  std::ostream& out) {
  if (run.empty()) return Status::error(Code::kInternal, "bench profile", "traced events", "none");
  const double json_per_event = double(profile::chrome_trace_json(run).size()) / double(run.size());
  std::vector<profile::TraceEvent> events;
  events.reserve(size_t(n));
  const int64_t span = run.back().end_ns - run.front().start_ns + 1000;
  for (int64_t k = 0; int64_t(events.size()) < n; ++k)
    for (size_t i = 0; i < run.size() && int64_t(events.size()) < n; ++i) {
      events.push_back(run[i]);
      events.back().start_ns += k * span;
      events.back().end_ns += k * span;
    }
  const auto t0 = std::chrono::steady_clock::now();
  ASPEN_RETURN_IF_ERROR(profile::write_perfetto_trace(events, {}, path));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double bytes = double(std::filesystem::file_size(path));
  std::filesystem::remove(path);
  if (json) {
    out << nlohmann::ordered_json{{"bench", "profile_trace_size"}, {"events", n}, {"run_events", run.size()},
                                  {"pftrace_bytes", bytes}, {"pftrace_bytes_per_event", bytes / double(n)},
                                  {"json_bytes_per_event", json_per_event}, {"write_s", seconds}}.dump()
        << "\n";
  } else {
    out << fmt::format("trace of {} events (a decode's {} repeated): trace.pftrace {:.1f} MB, {:.1f} bytes an event, "
                       "written in {:.1f} s; trace.json would take {:.0f} bytes an event ({:.0f} MB)\n",
                       n, run.size(), bytes / 1e6, bytes / double(n), seconds, json_per_event,
                       json_per_event * double(n) / 1e6);
  }
  out.flush();
  return Status();
}

}  // namespace

Status run_profile_bench(const ProfileBenchOptions& opt, std::ostream& out) {
  const int64_t layers = opt.quick ? 2 : opt.layers, vocab = opt.quick ? 2048 : 50257;
  const int64_t tokens = opt.quick ? 8 : opt.new_tokens;
  const int rounds = opt.quick ? 3 : opt.rounds, trials = opt.quick ? 2 : opt.trials;
  if (tokens < 4) return Status::invalid_argument("bench profile: new tokens", ">= 4", std::to_string(tokens));
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("aspen_bench_profile_" + std::to_string(::getpid()))).string();
  struct Cleanup {
    std::string d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};
  ASPEN_RETURN_IF_ERROR(write_random_gpt2(dir, layers, vocab).status());
  const int threads = opt.threads > 0 ? opt.threads : std::max(1, CoreBudget::global().available());

  // Overhead: traced over untraced, per round (alternated, so that a slow minute hits both).
  std::vector<double> ratios;
  double best_plain = 1e30, best_traced = 1e30;
  for (int r = 0; r < rounds; ++r) {
    profile::TraceRecorder trace;
    ASPEN_ASSIGN_OR_RETURN(const double plain, decode_seconds(dir, threads, tokens, nullptr));
    ASPEN_ASSIGN_OR_RETURN(const double traced, decode_seconds(dir, threads, tokens, &trace));
    ratios.push_back(traced / plain);
    best_plain = std::min(best_plain, plain);
    best_traced = std::min(best_traced, traced);
  }
  const double overhead = median(ratios) - 1.0;
  if (opt.json) {
    out << nlohmann::ordered_json{{"bench", "profile_overhead"}, {"layers", layers}, {"threads", threads},
                                  {"new_tokens", tokens}, {"rounds", rounds}, {"overhead", overhead},
                                  {"overhead_min", *std::min_element(ratios.begin(), ratios.end()) - 1.0},
                                  {"overhead_max", *std::max_element(ratios.begin(), ratios.end()) - 1.0},
                                  {"best_ratio", best_traced / best_plain - 1.0}}.dump()
        << "\n";
  } else {
    out << fmt::format("GPT-2 ({} layers) decode of {} tokens, {} threads: every instruction traced costs {:+.2f} % "
                       "(median of {} alternated rounds, {:+.2f} .. {:+.2f} %; best against best {:+.2f} %)\n",
                       layers, tokens, threads, 100 * overhead, rounds,
                       100 * (*std::min_element(ratios.begin(), ratios.end()) - 1.0),
                       100 * (*std::max_element(ratios.begin(), ratios.end()) - 1.0),
                       100 * (best_traced / best_plain - 1.0));
  }
  out.flush();

  // Detection: the candidates are the decode program's instructions of >= 1 % of its time.
  profile::TraceRecorder first;
  ASPEN_RETURN_IF_ERROR(decode_seconds(dir, threads, tokens, &first).status());
  if (const int64_t n = opt.quick ? std::min<int64_t>(opt.trace_events, 100'000) : opt.trace_events; n > 0)
    ASPEN_RETURN_IF_ERROR(trace_size(first.events(), n, dir + "/trace.pftrace", opt.json, out));
  std::map<int, double> node_ns;
  double program_ns = 0;
  for (const profile::TraceEvent& e : first.events()) {
    std::string program, node;
    for (const auto& [k, v] : e.args) {
      if (k == "program") program = v;
      if (k == "node") node = v;
    }
    if (program != "1" || node.empty()) continue;  // the decode step's program
    node_ns[std::stoi(node)] += double(e.duration_ns());
    program_ns += double(e.duration_ns());
  }
  std::vector<int> candidates;
  for (const auto& [node, ns] : node_ns)
    if (ns >= 0.01 * program_ns) candidates.push_back(node);
  if (candidates.empty()) return Status::error(Code::kInternal, "bench profile", "decode instructions", "none traced");
  int found = 0, false_names = 0;
  std::vector<double> detectable;
  for (int t = 0; t < trials; ++t) {
    const int node = candidates[size_t((t * 7919) % int(candidates.size()))];
    profile::TraceRecorder a, b;
    ASPEN_RETURN_IF_ERROR(decode_seconds(dir, threads, tokens, &a).status());
    {
      SlowedInstruction slow("1:" + std::to_string(node) + ":" + std::to_string(opt.slowdown));
      ASPEN_RETURN_IF_ERROR(decode_seconds(dir, threads, tokens, &b).status());
    }
    const profile::ProfileDiff d = profile::diff_profiles(a.events(), b.events());
    bool hit = false;
    for (const profile::InstructionDiff& x : d.slower) {
      if (x.program == "1" && x.node == std::to_string(node)) hit = true;
      else ++false_names;
    }
    found += hit;
    detectable.push_back(d.detectable);
    if (opt.json)
      out << nlohmann::ordered_json{{"bench", "profile_diff_trial"}, {"trial", t}, {"node", node},
                                    {"found", hit}, {"named", d.slower.size()}, {"detectable", d.detectable},
                                    {"run_factor", d.run_factor}}.dump()
          << "\n";
  }
  if (opt.json) {
    out << nlohmann::ordered_json{{"bench", "profile_diff"}, {"layers", layers}, {"slowdown", opt.slowdown},
                                  {"trials", trials}, {"found", found}, {"rate", double(found) / trials},
                                  {"false_names", false_names}, {"candidates", candidates.size()},
                                  {"detectable_median", median(detectable)}}.dump()
        << "\n";
  } else {
    out << fmt::format("profile diff, one of {} instructions (>= 1 % of the decode step) slowed by {:.1f} %: found "
                       "in {} of {} trials ({:.0f} %), {} other instructions named in all; the smallest change the "
                       "runs could tell: {:.1f} % (median)\n",
                       candidates.size(), 100 * opt.slowdown, found, trials, 100.0 * found / trials, false_names,
                       100 * median(detectable));
  }
  return Status();
}

}  // namespace aspen::bench
