#include "profile/profile_dir.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/atomic_file.h"
#include "profile/perfetto.h"
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
  const auto positive = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  j["peaks"] = {{"fma_gflops", positive(run.peaks.fma_gflops)},
                {"bf16_gflops", positive(run.peaks.bf16_gflops)},
                {"read_gb_per_s", positive(run.peaks.read_gb_per_s)}};
  int64_t first = 0, last = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    first = i ? std::min(first, events[i].start_ns) : events[i].start_ns;
    last = i ? std::max(last, events[i].end_ns) : events[i].end_ns;
  }
  const int64_t wall = std::max<int64_t>(0, last - first);
  j["wall_ns"] = wall;
  const std::vector<DeviceTotals> devices = device_totals(events);
  int64_t flops = 0;
  for (const DeviceTotals& d : devices)
    for (const OpTotals& op : d.ops) flops += op.flops;
  // The products' FLOPs of every device over the wall time, and that over the FMA peak: the run's MFU. Under
  // MPI (fact "processes": every process's devices here) over every process's peak (each measures its own
  // threads; process 0's stands for all).
  int64_t processes = 1;
  for (const auto& [k, v] : run.facts)
    if (k == "processes") processes = std::max<int64_t>(1, std::atoll(v.c_str()));
  const double achieved = wall > 0 ? double(flops) / double(wall) : 0.0;
  j["flops"] = flops;
  j["gflops_per_s"] = positive(achieved);
  j["mfu"] = run.peaks.fma_gflops > 0 && achieved > 0 ? json(achieved / (run.peaks.fma_gflops * double(processes)))
                                                      : json(nullptr);
  j["devices"] = json::array();
  for (const DeviceTotals& d : devices) {
    json dev;
    dev["device"] = d.device;
    dev["busy_ns"] = d.busy_ns;
    dev["span_ns"] = d.span_ns;
    dev["events"] = d.events;
    dev["split"] = {{"compute_ns", d.split.compute_ns}, {"copy_ns", d.split.copy_ns},
                    {"collective_ns", d.split.collective_ns}, {"wait_ns", d.split.wait_ns},
                    {"host_ns", d.split.host_ns}, {"runtime_ns", d.split.runtime_ns},
                    {"other_ns", d.split.other_ns}, {"idle_ns", d.split.idle_ns}};
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
      const double gbps = op.bytes > 0 && op.bytes_ns > 0 ? double(op.bytes) / double(op.bytes_ns) : 0.0;
      const double gflops = op.flops > 0 && op.flops_ns > 0 ? double(op.flops) / double(op.flops_ns) : 0.0;
      o["gb_per_s"] = positive(gbps);
      o["flops"] = op.flops;
      o["gflops_per_s"] = positive(gflops);
      // NOTE [roofline]: a kernel's rates over their ceilings; the larger says which one bounds it and how near.
      // (Host reads and writes move bytes by reference as often as by copy: no roofline.)
      const bool kernel = op.category == category::kKernel;
      o["of_fma_peak"] =
          kernel && run.peaks.fma_gflops > 0 && gflops > 0 ? json(gflops / run.peaks.fma_gflops) : json(nullptr);
      o["of_read_peak"] =
          kernel && run.peaks.read_gb_per_s > 0 && gbps > 0 ? json(gbps / run.peaks.read_gb_per_s) : json(nullptr);
      dev["ops"].push_back(std::move(o));
    }
    dev["layers"] = json::array();
    for (const LayerTotals& l : d.layers)
      dev["layers"].push_back({{"layer", l.layer},
                               {"count", l.count},
                               {"forward_ns", l.forward_ns},
                               {"backward_ns", l.backward_ns},
                               {"flops", l.flops},
                               {"bytes", l.bytes}});
    j["devices"].push_back(std::move(dev));
  }
  const RunMemory& rm = run.memory;
  const auto known = [](int64_t v) { return v > 0 ? json(v) : json(nullptr); };
  j["memory"] = {{"peak_rss_bytes", known(rm.peak_rss)},
                 {"start_rss_bytes", known(rm.start_rss)},
                 {"planned_bytes", rm.planned()},
                 {"parameter_bytes", rm.parameters},
                 {"replica_copy_bytes", rm.replica_copies},
                 {"arena_bytes", rm.arenas},
                 {"weight_only_bytes", rm.weight_only},
                 {"measurement_bytes", rm.measurement},
                 {"libraries_paged_bytes", rm.libraries_paged},
                 {"block_cache_bytes", rm.block_cache},
                 {"kernel_copy_bytes", rm.kernel_copies},
                 {"heap_free_bytes", rm.heap_free},
                 {"kernel_scratch_bytes", rm.kernel_scratch},
                 {"unplanned_bytes", rm.peak_rss > 0 ? json(rm.peak_rss - rm.start_rss - rm.planned() - rm.measurement -
                                                            rm.libraries_paged - rm.block_cache - rm.kernel_copies -
                                                            rm.heap_free - rm.kernel_scratch)
                                                     : json(nullptr)}};
  // NOTE [memory phases]: the step after which the high-water mark first came within 1 % of the peak, and what
  // the process held at the peak but no longer when the profile was written (that step's working memory).
  j["memory"]["phases"] = json::array();
  const MemoryPhase* peak_phase = nullptr;
  for (const MemoryPhase& m : rm.phases) {
    j["memory"]["phases"].push_back({{"name", m.name}, {"rss_bytes", m.rss}, {"high_water_bytes", m.high_water}});
    if (!peak_phase && rm.peak_rss > 0 && double(m.high_water) >= 0.99 * double(rm.peak_rss)) peak_phase = &m;
  }
  j["memory"]["peak_phase"] = peak_phase ? json(peak_phase->name) : json(nullptr);
  j["memory"]["transient_bytes"] =
      rm.phases.empty() || rm.peak_rss <= 0 ? json(nullptr) : json(std::max<int64_t>(0, rm.peak_rss - rm.phases.back().rss));
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
  ASPEN_RETURN_IF_ERROR(write_perfetto_trace(events, run.programs, base + "trace.pftrace"));
  if (events.size() <= kJsonTraceEvents) {
    ASPEN_RETURN_IF_ERROR(write_chrome_trace(events, base + "trace.json"));
  } else {  // too large for the JSON viewers; an earlier run's must not pass for this one's
    std::error_code ec;
    std::filesystem::remove(base + "trace.json", ec);
    if (ec) return Status::error(Code::kIoError, base + "trace.json", "removed (this run's trace has no JSON copy)", ec.message());
  }
  const std::string json = profile_json(events, run);
  ASPEN_RETURN_IF_ERROR(write_file_atomic(base + "profile.json", json));
  return write_file_atomic(base + "report.html", report_html(json));
}

Status write_profile_path(const std::string& path, const std::vector<TraceEvent>& events,
                          const std::function<RunFacts()>& facts) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return write_chrome_trace(events, path);
  return write_profile_dir(path, events, facts());
}

std::string profile_dir_choice(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("ASPEN_PROFILE");
  return env ? std::string(env) : std::string();
}

}  // namespace aspen::profile
