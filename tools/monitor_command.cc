// tools/monitor_command.cc: `aspen monitor RUN_DIR`: each device's load while a run trains, read from the run
// directory's metrics.jsonl (NOTE [device load] in api/trainer_live.cc), and the device slower than its peers named.
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

// A step's shares of one device (NOTE [device load] in api/trainer_live.cc); GB/s of its gradient exchanges.
struct Share {
  double busy = -1, wait = 0, comm = 0, gbps = 0;  // busy -1: the step's line has none for the device
};

// NOTE [slow device]: the slow device is the one busy longest, not the ones that wait for it: in a pipeline
// (or any layout whose devices meet every step) a slow device's peers finish their passes and wait, so their
// busy shares fall while its own rises; wall-clock tools that time each device's step blame every device alike.
struct Load {
  std::deque<std::map<std::string, Share>> steps;  // the last `window` steps' shares by device
  std::map<std::string, int> above;                 // by device: steps in a row above the others by margin
  int64_t last_step = 0;
  // NOTE [data per replica]: examples each replica drew (the last line's), duplicates over every line read.
  std::map<std::string, int64_t> data;
  int64_t duplicates = 0;
};

void take(Load& load, const nlohmann::json& j, const MonitorArgs& a) {
  std::map<std::string, Share> shares;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_number()) continue;
    const size_t dot = k.find('.');
    if (dot == std::string::npos) continue;
    const std::string field = k.substr(0, dot), device = k.substr(dot + 1);
    if (field == "busy") shares[device].busy = v.get<double>();
    if (field == "wait") shares[device].wait = v.get<double>();
    if (field == "comm") shares[device].comm = v.get<double>();
    if (field == "gbps") shares[device].gbps = v.get<double>();
    if (field == "data") {
      if (device == "duplicates") load.duplicates += int64_t(v.get<double>());
      else load.data[device] = int64_t(v.get<double>());
    }
  }
  std::erase_if(shares, [](const auto& kv) { return kv.second.busy < 0; });
  if (shares.size() < 2) return;
  load.last_step = j.value("step", int64_t(0));
  load.steps.push_back(shares);
  while (int(load.steps.size()) > a.window) load.steps.pop_front();
  for (const auto& [device, share] : shares) {
    std::vector<double> others;
    for (const auto& [d, s] : shares)
      if (d != device) others.push_back(s.busy);
    std::nth_element(others.begin(), others.begin() + long(others.size() / 2), others.end());
    const double median = others[others.size() / 2];
    int& run = load.above[device];
    run = share.busy > median * (1 + a.margin) ? run + 1 : 0;
  }
}

std::string slow_device(const Load& load, const MonitorArgs& a) {
  std::string worst;
  int longest = 0;
  for (const auto& [device, run] : load.above)
    if (run >= a.steps && run > longest) worst = device, longest = run;
  return worst;
}

// Each device's shares over the window (GB/s over the steps that exchanged).
std::map<std::string, Share> means(const Load& load) {
  std::map<std::string, Share> mean;
  std::map<std::string, int> exchanging;
  for (const auto& s : load.steps)
    for (const auto& [d, v] : s) {
      auto [it, added] = mean.try_emplace(d);
      Share& m = it->second;
      if (added) m.busy = 0;  // (a Share's busy starts at -1: "no line for the device")
      const double n = double(load.steps.size());
      m.busy += v.busy / n, m.wait += v.wait / n, m.comm += v.comm / n;
      if (v.gbps > 0) m.gbps += v.gbps, ++exchanging[d];
    }
  for (auto& [d, m] : mean)
    if (exchanging[d]) m.gbps /= exchanging[d];
  return mean;
}

std::string render(const Load& load, const MonitorArgs& a) {
  const std::map<std::string, Share> mean = means(load);
  std::string out = fmt::format("{} at step {}: the last {} steps\n", escape_for_terminal(a.run_dir), load.last_step,
                                load.steps.size());
  out += fmt::format("  {:<16} {:>8} {:>10} {:>10} {:>8} {:>9} {:>12}\n", "device", "busy", "peer wait", "exchange",
                     "idle", "GB/s", "steps above");
  for (const auto& [d, v] : mean)
    out += fmt::format("  {:<16} {:>7.1f}% {:>9.1f}% {:>9.1f}% {:>7.1f}% {:>9} {:>12}\n", escape_for_terminal(d),
                       100 * v.busy, 100 * v.wait, 100 * v.comm, 100 * std::max(0.0, 1 - v.busy - v.wait - v.comm),
                       v.gbps > 0 ? fmt::format("{:.2f}", v.gbps) : std::string("-"),
                       load.above.count(d) ? load.above.at(d) : 0);
  const std::string slow = slow_device(load, a);
  if (!slow.empty()) {
    const Share& s = mean.at(slow);
    out += fmt::format("slow device: {} (busy {:.1f}% of each step, {} steps in a row more than {:.0f}% above the "
                       "others' median; it waits {:.1f}% on pipeline peers, {:.1f}% in gradient exchanges): the "
                       "other devices wait for it\n",
                       escape_for_terminal(slow), 100 * s.busy, load.above.at(slow), 100 * a.margin, 100 * s.wait,
                       100 * s.comm);
  } else if (!load.steps.empty()) {
    out += "no device slower than its peers\n";
  } else {
    out += "no per-device load yet (one device, or no step logged)\n";
  }
  if (!load.data.empty()) {
    out += "examples drawn per replica this run:";
    for (const auto& [r, n] : load.data) out += fmt::format(" {} {}", escape_for_terminal(r), n);
    out += load.duplicates > 0 ? fmt::format("; {} drawn by more than one replica: the data are sharded wrong\n",
                                             load.duplicates)
                               : std::string("; none drawn twice\n");
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
    nlohmann::ordered_json j = {{"step", load.last_step}, {"slow_device", slow_device(load, a)}, {"devices", {}},
                                {"data", load.data}, {"duplicates", load.duplicates}};
    for (const auto& [d, v] : means(load))
      j["devices"][d] = {{"busy", v.busy}, {"wait", v.wait}, {"comm", v.comm}, {"gbps", v.gbps},
                         {"steps_above", load.above[d]}};
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
