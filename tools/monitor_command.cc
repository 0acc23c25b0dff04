// tools/monitor_command.cc: `aspen monitor RUN_DIR`: each device's load while a run trains, read from the run
// directory's metrics.jsonl (NOTE [device load] in api/trainer.cc), and the device slower than its peers named.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/commands.h"
#include "train/report.h"

namespace aspen::tools {
namespace {

struct MonitorArgs {
  std::string run_dir;
  int window = 20;       // steps the table averages
  int steps = 5;         // a device named slow after this many steps in a row
  double margin = 0.15;  // busy share above the others' median by at least this fraction of it
  bool once = false, json = false;
  double interval = 1.0;
};

// NOTE [slow device]: the slow device is the one busy longest, not the ones that wait for it: in a pipeline
// (or any layout whose devices meet every step) a slow device's peers finish their passes and wait, so their
// busy shares fall while its own rises; wall-clock tools that time each device's step blame every device alike.
struct Load {
  std::deque<std::map<std::string, double>> steps;  // the last `window` steps' busy shares by device
  std::map<std::string, int> above;                 // by device: steps in a row above the others by margin
  int64_t last_step = 0;
};

void take(Load& load, const nlohmann::json& j, const MonitorArgs& a) {
  std::map<std::string, double> busy;
  for (const auto& [k, v] : j.items())
    if (k.rfind("busy.", 0) == 0 && v.is_number()) busy[k.substr(5)] = v.get<double>();
  if (busy.size() < 2) return;
  load.last_step = j.value("step", int64_t(0));
  load.steps.push_back(busy);
  while (int(load.steps.size()) > a.window) load.steps.pop_front();
  for (const auto& [device, share] : busy) {
    std::vector<double> others;
    for (const auto& [d, s] : busy)
      if (d != device) others.push_back(s);
    std::nth_element(others.begin(), others.begin() + long(others.size() / 2), others.end());
    const double median = others[others.size() / 2];
    int& run = load.above[device];
    run = share > median * (1 + a.margin) ? run + 1 : 0;
  }
}

std::string slow_device(const Load& load, const MonitorArgs& a) {
  std::string worst;
  int longest = 0;
  for (const auto& [device, run] : load.above)
    if (run >= a.steps && run > longest) worst = device, longest = run;
  return worst;
}

std::string render(const Load& load, const MonitorArgs& a) {
  std::map<std::string, double> mean;
  for (const auto& s : load.steps)
    for (const auto& [d, v] : s) mean[d] += v / double(load.steps.size());
  std::string out = fmt::format("{} at step {}: the last {} steps\n", escape_for_terminal(a.run_dir), load.last_step,
                                load.steps.size());
  out += fmt::format("  {:<16} {:>8} {:>16} {:>14}\n", "device", "busy", "waiting or idle", "steps above");
  for (const auto& [d, v] : mean)
    out += fmt::format("  {:<16} {:>7.1f}% {:>15.1f}% {:>14}\n", escape_for_terminal(d), 100 * v, 100 * (1 - v),
                       load.above.count(d) ? load.above.at(d) : 0);
  const std::string slow = slow_device(load, a);
  if (!slow.empty()) {
    out += fmt::format("slow device: {} (busy {:.1f}% of each step, {} steps in a row more than {:.0f}% above the "
                       "others' median): the other devices wait for it\n",
                       escape_for_terminal(slow), 100 * mean[slow], load.above.at(slow), 100 * a.margin);
  } else if (!load.steps.empty()) {
    out += "no device slower than its peers\n";
  } else {
    out += "no per-device load yet (one device, or no step logged)\n";
  }
  return out;
}

int run_monitor(const MonitorArgs& a) {
  const std::string path = (std::filesystem::path(a.run_dir) / train::kMetricsFile).string();
  Load load;
  std::ifstream in;
  std::string partial;
  ino_t inode = 0;
  for (;;) {
    // A run that starts (or resumes) writes a new file in the old one's place: read that one from its start.
    struct stat st {};
    if (in.is_open() && ::stat(path.c_str(), &st) == 0 && st.st_ino != inode) {
      in.close();
      load = Load{};
      partial.clear();
    }
    if (!in.is_open()) {
      if (::stat(path.c_str(), &st) == 0) inode = st.st_ino;
      in.open(path);
      if (!in.is_open() && (a.once || a.json))
        return report(Status::error(Code::kNotFound, path, "a run directory's metrics (aspen train --run-dir)",
                                    "no such file"));
    }
    if (in.is_open()) {
      std::string line;
      while (std::getline(in, line)) {
        if (in.eof()) {  // a line still being written: keep it for the next read
          partial += line;
          break;
        }
        line = partial + line;
        partial.clear();
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object()) take(load, j, a);
      }
      in.clear();
    }
    if (a.once || a.json) break;
    std::cout << "\033[H\033[2J" << render(load, a) << std::flush;  // clear the terminal, then the table
    std::this_thread::sleep_for(std::chrono::duration<double>(a.interval));
  }
  if (a.json) {
    nlohmann::ordered_json j = {{"step", load.last_step}, {"slow_device", slow_device(load, a)}, {"devices", {}}};
    std::map<std::string, double> mean;
    for (const auto& s : load.steps)
      for (const auto& [d, v] : s) mean[d] += v / double(load.steps.size());
    for (const auto& [d, v] : mean) j["devices"][d] = {{"busy", v}, {"steps_above", load.above[d]}};
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::cout << render(load, a);
  return 0;
}

}  // namespace

Command add_monitor_command(CLI::App& app) {
  auto args = std::make_shared<MonitorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "monitor", "each device's load while a run trains (its metrics.jsonl), and the device slower than its peers");
  cmd->footer("Example: aspen monitor runs/gpt2   (beside a running `aspen train ... --run-dir runs/gpt2`)\n"
              "A device is named slow when its busy share of each step stays above the others' median by --margin (of it)\n"
              "for --steps steps in a row: the slow device itself, not the devices that wait for it.");
  cmd->add_option("RUN_DIR", args->run_dir, "the run directory (aspen train --run-dir)")->required();
  cmd->add_option("--window", args->window, "steps the table averages (default 20)")->check(CLI::Range(1, 100000));
  cmd->add_option("--steps", args->steps, "steps in a row before a device is named slow (default 5)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--margin", args->margin, "busy share above the others' median by this fraction of it (default 0.15)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--interval", args->interval, "seconds between refreshes (default 1)")->check(CLI::Range(0.05, 3600.0));
  cmd->add_flag("--once", args->once, "read what is there, print once and exit (scripts, tests)");
  cmd->add_flag("--json", args->json, "read what is there and print one JSON object (implies --once)");
  return Command{cmd, [args] { return run_monitor(*args); }};
}

}  // namespace aspen::tools
