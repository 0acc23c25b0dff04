// tools/profile_command.cc: `aspen profile diff A B`: two profiles of the same program compared instruction by
// instruction (profile/diff.h, NOTE [profile diff]; docs/profile.md).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "profile/diff.h"
#include "profile/profile_dir.h"
#include "profile/report.h"
#include "tools/commands.h"

namespace aspen::tools {
namespace {

struct DiffArgs {
  std::string a, b, report;
  profile::DiffOptions options;
  int top = 20;
  bool json = false;
};

// A profile directory (its trace.json) or a trace.json itself.
Result<std::vector<profile::TraceEvent>> read_profile(const std::string& path) {
  const bool dir = std::filesystem::is_directory(path);
  const std::filesystem::path json = std::filesystem::path(path) / "trace.json";
  if (dir && !std::filesystem::exists(json) && std::filesystem::exists(std::filesystem::path(path) / "trace.pftrace"))
    return Status::error(Code::kInvalidArgument, json.string(),
                         "the run's events as JSON (written for runs of at most " +
                             std::to_string(profile::kJsonTraceEvents) + " events)",
                         "only trace.pftrace: the run recorded more; record fewer steps (--profile-steps, or "
                         "--profile-every to spread them) to compare two runs");
  return profile::read_chrome_trace(dir ? json.string() : path);
}

nlohmann::ordered_json to_json(const profile::InstructionDiff& x) {
  return {{"device", x.device},           {"op", x.name},
          {"layer", x.layer},             {"program", x.program},
          {"node", x.node},               {"runs_a", x.runs_a},
          {"runs_b", x.runs_b},           {"median_a_ns", x.median_a_ns},
          {"median_b_ns", x.median_b_ns}, {"ratio", x.ratio},
          {"z", x.z},                     {"impact_ns", x.impact_ns},
          {"detectable", x.detectable}};
}

std::string table(const std::vector<profile::InstructionDiff>& rows, int top) {
  std::string out = fmt::format("  {:<8} {:<22} {:<34} {:>10} {:>6} {:>11} {:>11} {:>7} {:>7} {:>12}\n", "device", "op",
                                "layer", "prog:node", "runs", "A us", "B us", "ratio", "z", "B cost ms");
  for (size_t i = 0; i < rows.size() && int(i) < top; ++i) {
    const profile::InstructionDiff& x = rows[i];
    out += fmt::format("  {:<8} {:<22} {:<34} {:>10} {:>6} {:>11.2f} {:>11.2f} {:>7.3f} {:>7.1f} {:>12.3f}\n",
                       escape_for_terminal(x.device), escape_for_terminal(x.name).substr(0, 22),
                       escape_for_terminal(x.layer.empty() ? "-" : x.layer).substr(0, 34),
                       x.node.empty() ? "-" : x.program + ":" + x.node, x.runs_b, x.median_a_ns / 1e3,
                       x.median_b_ns / 1e3, x.ratio, x.z, x.impact_ns / 1e6);
  }
  if (int(rows.size()) > top) out += fmt::format("  ... and {} more (--top)\n", rows.size() - size_t(top));
  return out;
}

int run_diff(const DiffArgs& a) {
  auto ea = read_profile(a.a);
  if (!ea.is_ok()) return report(ea.status());
  auto eb = read_profile(a.b);
  if (!eb.is_ok()) return report(eb.status());
  const profile::ProfileDiff d = profile::diff_profiles(*ea, *eb, a.options);
  nlohmann::ordered_json j = {{"a", a.a},
                                {"b", a.b},
                                {"run_factor", d.run_factor},
                                {"spread", d.spread},
                                {"detectable", d.detectable},
                                {"compared", d.compared},
                                {"only_a", d.only_a},
                                {"only_b", d.only_b},
                                {"slower", nlohmann::ordered_json::array()},
                                {"faster", nlohmann::ordered_json::array()}};
  for (const auto& x : d.slower) j["slower"].push_back(to_json(x));
  for (const auto& x : d.faster) j["faster"].push_back(to_json(x));
  if (!a.report.empty()) {  // B's report with the Compare view (docs/profile.md)
    const std::filesystem::path b_json = std::filesystem::path(a.b) / "profile.json";
    std::ifstream in(b_json);
    nlohmann::ordered_json b = in ? nlohmann::ordered_json::parse(in, nullptr, false) : nlohmann::ordered_json();
    if (!b.is_object())
      return report(Status::error(Code::kInvalidArgument, "--report: " + b_json.string(),
                                  "B's profile.json (B a --profile directory)", in ? "not a JSON object" : "none"));
    b["compare"] = j;
    if (Status s = write_file_atomic(a.report, profile::report_html(b.dump(1))); !s.is_ok()) return report(s);
    std::cerr << "report: " << escape_for_terminal(a.report) << " (B's profile, with the Compare view)\n";
  }
  if (a.json) {
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::cout << fmt::format("profile diff: A {} ({} events), B {} ({} events)\n", escape_for_terminal(a.a), ea->size(),
                           escape_for_terminal(a.b), eb->size());
  std::cout << fmt::format("instructions compared: {} (only in A: {}, only in B: {}); the whole run: B at {:.3f}x A\n",
                           d.compared, d.only_a, d.only_b, d.run_factor);
  if (d.only_a + d.only_b > 0)
    std::cout << "  (instructions in one profile only: the two runs did not run the same programs throughout)\n";
  std::cout << fmt::format(
      "run-to-run spread of the instructions that carry the time: {:.1f} %; the smallest change named there: "
      "{:.1f} % (smaller instructions vary more){}\n", 100 * d.spread,
      100 * d.detectable,
      d.detectable > a.options.threshold ? " (above --threshold: these two runs cannot tell smaller ones from noise)" : "");
  const std::string beyond =
      fmt::format("beyond the run's {:.3f}x by more than its size's smallest change ({:.1f} % for the largest), z > {:.0f}",
                  d.run_factor, 100 * d.detectable, a.options.min_z);
  if (d.slower.empty()) {
    std::cout << "slower in B: none (" << beyond << ")\n";
  } else {
    std::cout << "slower in B (" << beyond << "), the surest first:\n" << table(d.slower, a.top);
  }
  if (d.faster.empty()) {
    std::cout << "faster in B: none\n";
  } else {
    std::cout << "faster in B:\n" << table(d.faster, a.top);
  }
  return 0;
}

}  // namespace

Command add_profile_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("profile", "read profiles that --profile DIR wrote (docs/profile.md)");
  cmd->require_subcommand(1);
  auto args = std::make_shared<DiffArgs>();
  CLI::App* diff = cmd->add_subcommand(
      "diff", "compare two profiles of the same program instruction by instruction: what got slower or faster in B");
  diff->footer(
      "Example: aspen profile diff before/ after/\n"
      "Each instruction's typical time in A and B (a 20 % trimmed mean); the whole run's factor (a host slower all along scales\n"
      "everything); an instruction is named when B over A, beyond that factor, passes --threshold and stands\n"
      "out of its own spread (z > 4).");
  diff->add_option("A", args->a, "the profile before: a --profile directory or its trace.json")->required();
  diff->add_option("B", args->b, "the profile after")->required();
  diff->add_option("--threshold", args->options.threshold, "relative change to name (default 0.02: 2 %)")
      ->check(CLI::Range(0.0, 10.0));
  diff->add_option("--top", args->top, "rows per list (default 20)")->check(CLI::Range(1, 1 << 20));
  diff->add_flag("--json", args->json, "one JSON object");
  diff->add_option("--report", args->report, "also write B's report.html with the Compare view to this file");
  return Command{cmd, [args] { return run_diff(*args); }};
}

}  // namespace aspen::tools
