#include "profile/profile_dir.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/atomic_file.h"
#include "profile/report.h"

namespace aspen::profile {

std::string profile_json(const std::vector<TraceEvent>& events, const RunFacts& run) {
  using json = nlohmann::ordered_json;
  json j;
  j["schema"] = "aspen.profile/1";
  j["command"] = run.command;
  json facts = json::object();
  for (const auto& [k, v] : run.facts) facts[k] = v;
  j["facts"] = facts;
  int64_t first = 0, last = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    first = i ? std::min(first, events[i].start_ns) : events[i].start_ns;
    last = i ? std::max(last, events[i].end_ns) : events[i].end_ns;
  }
  j["wall_ns"] = std::max<int64_t>(0, last - first);
  j["devices"] = json::array();
  for (const DeviceTotals& d : device_totals(events)) {
    json dev;
    dev["device"] = d.device;
    dev["busy_ns"] = d.busy_ns;
    dev["span_ns"] = d.span_ns;
    dev["events"] = d.events;
    dev["ops"] = json::array();
    for (const OpTotals& op : d.ops) {
      json o;
      o["category"] = op.category;
      o["name"] = op.name;
      o["count"] = op.count;
      o["total_ns"] = op.total_ns;
      o["mean_ns"] = op.count ? op.total_ns / op.count : 0;
      o["share"] = d.busy_ns > 0 ? double(op.total_ns) / double(d.busy_ns) : 0.0;
      o["bytes"] = op.bytes;
      o["gb_per_s"] = op.bytes > 0 && op.bytes_ns > 0 ? json(double(op.bytes) / double(op.bytes_ns)) : json(nullptr);
      dev["ops"].push_back(std::move(o));
    }
    j["devices"].push_back(std::move(dev));
  }
  j["programs"] = json::array();
  for (const ProgramMemory& pm : run.programs) {
    json m;
    m["name"] = pm.name;
    m["nodes"] = pm.nodes;
    m["arena_bytes"] = pm.arena_bytes;
    m["naive_bytes"] = pm.naive_bytes;
    m["parameter_bytes"] = pm.parameter_bytes;
    m["derived_bytes"] = pm.derived_bytes;
    m["peak_node"] = pm.peak_node;
    m["stride"] = pm.stride;
    m["live_bytes"] = pm.live_bytes;
    m["at_peak"] = json::array();
    for (const ProgramMemory::Value& v : pm.at_peak) m["at_peak"].push_back({{"op", v.op}, {"type", v.type}, {"bytes", v.bytes}});
    j["programs"].push_back(std::move(m));
  }
  // Invalid UTF-8 in a name becomes U+FFFD, as in trace.json.
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Status make_profile_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    return Status::error(Code::kIoError, dir, "a directory for the profile (trace.json, profile.json)",
                         ec ? ec.message() : "not a directory");
  return Status();
}

Status write_profile_dir(const std::string& dir, const std::vector<TraceEvent>& events, const RunFacts& run) {
  ASPEN_RETURN_IF_ERROR(make_profile_dir(dir));
  const std::string base = (std::filesystem::path(dir) / "").string();
  ASPEN_RETURN_IF_ERROR(write_chrome_trace(events, base + "trace.json"));
  const std::string json = profile_json(events, run);
  ASPEN_RETURN_IF_ERROR(write_file_atomic(base + "profile.json", json));
  return write_file_atomic(base + "report.html", report_html(json));
}

std::string profile_dir_choice(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("ASPEN_PROFILE");
  return env ? std::string(env) : std::string();
}

}  // namespace aspen::profile
