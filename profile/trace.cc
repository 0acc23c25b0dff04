#include "profile/trace.h"

#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <system_error>
#include <unordered_map>

namespace aspen::profile {

// ---------------------------------------------------------------- recorder

TraceRecorder::TraceRecorder(bool enabled) : origin_(std::chrono::steady_clock::now()), enabled_(enabled) {}

std::vector<TraceEvent>& TraceRecorder::Shard::tail() {
  if (chunks.empty() || chunks.back().size() == chunks.back().capacity()) {
    chunks.emplace_back();
    chunks.back().reserve(kChunkEvents);
  }
  return chunks.back();
}

TraceRecorder::Shard& TraceRecorder::shard_for_this_thread() {
  // Each thread takes the next slot once; threads of one process rarely
  // share a shard until there are more than kShards of them.
  static std::atomic<unsigned> next_slot{0};
  thread_local const unsigned slot = next_slot.fetch_add(1, std::memory_order_relaxed);
  return shards_[slot % kShards];
}

void TraceRecorder::record(const TraceEvent& event) {
  Shard& s = shard_for_this_thread();
  std::lock_guard<std::mutex> lock(s.mu);
  s.tail().push_back(event);
}

void TraceRecorder::record(TraceEvent&& event) {
  Shard& s = shard_for_this_thread();
  std::lock_guard<std::mutex> lock(s.mu);
  s.tail().push_back(std::move(event));
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::vector<TraceEvent> out;
  out.reserve(size());
  for (const Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& chunk : s.chunks) out.insert(out.end(), chunk.begin(), chunk.end());
  }
  // Ties beyond start and length are broken by device and name so that the
  // order does not depend on which shard a thread happened to use.
  std::stable_sort(out.begin(), out.end(), [](const TraceEvent& a, const TraceEvent& b) {
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    if (a.end_ns != b.end_ns) return a.end_ns > b.end_ns;
    if (a.device != b.device) return a.device < b.device;
    return a.name < b.name;
  });
  return out;
}

size_t TraceRecorder::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& chunk : s.chunks) n += chunk.size();
  }
  return n;
}

void TraceRecorder::clear() {
  for (Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.chunks.clear();
  }
}

void TraceScope::begin(std::string_view device, std::string_view name, std::string_view cat, int64_t bytes) {
  event_.device.assign(device);
  event_.name.assign(name);
  event_.category.assign(cat);
  event_.bytes = bytes;
  event_.start_ns = recorder_->now_ns();
}

void TraceScope::end() {
  event_.end_ns = recorder_->now_ns();
  recorder_->record(std::move(event_));
}

// ---------------------------------------------------------------- chrome trace

namespace {

// A JSON string literal; invalid UTF-8 becomes U+FFFD rather than an error.
void append_json_string(std::string& out, const std::string& s) {
  bool plain = true;
  for (unsigned char c : s) {
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) {
      plain = false;
      break;
    }
  }
  if (plain) {  // the common case: no escaping needed
    out += '"';
    out += s;
    out += '"';
    return;
  }
  out += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Nanoseconds as microseconds with up to three decimals, exactly.
void append_us(std::string& out, int64_t ns) {
  uint64_t u = static_cast<uint64_t>(ns);
  if (ns < 0) {
    out += '-';
    u = ~u + 1;  // magnitude, also for INT64_MIN
  }
  out += std::to_string(u / 1000);
  unsigned frac = static_cast<unsigned>(u % 1000);
  if (frac != 0) {
    char buf[5];
    std::snprintf(buf, sizeof buf, ".%03u", frac);
    size_t len = 4;
    while (buf[len - 1] == '0') --len;
    out.append(buf, len);
  }
}

void append_metadata(std::string& out, const char* what, int tid, const std::string& arg_key,
                     const std::string* str_value, int int_value) {
  out += "{\"name\":\"";
  out += what;
  out += "\",\"ph\":\"M\",\"pid\":1,\"tid\":";
  out += std::to_string(tid);
  out += ",\"args\":{\"";
  out += arg_key;
  out += "\":";
  if (str_value != nullptr) {
    append_json_string(out, *str_value);
  } else {
    out += std::to_string(int_value);
  }
  out += "}},\n";
}

}  // namespace

std::string chrome_trace_json(const std::vector<TraceEvent>& events) {
  std::unordered_map<std::string, int> tids;
  std::vector<const std::string*> devices;
  for (const TraceEvent& e : events) {
    if (tids.emplace(e.device, static_cast<int>(devices.size()) + 1).second) {
      devices.push_back(&e.device);
    }
  }

  std::string out;
  out.reserve(64 + devices.size() * 160 + events.size() * 160);
  out += "{\"traceEvents\":[\n";
  const std::string process = "aspen";
  append_metadata(out, "process_name", 0, "name", &process, 0);
  for (size_t i = 0; i < devices.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    append_metadata(out, "thread_name", tid, "name", devices[i], 0);
    append_metadata(out, "thread_sort_index", tid, "sort_index", nullptr, tid);
  }

  // Keys of one event's args, with the value's JSON text; a later duplicate
  // key replaces an earlier one.
  std::vector<std::pair<const std::string*, std::string>> args;
  const std::string bytes_key = "bytes", flops_key = "flops";
  bool first = true;
  for (const TraceEvent& e : events) {
    if (!first) out += ",\n";
    first = false;
    out += "{\"name\":";
    append_json_string(out, e.name);
    out += ",\"cat\":";
    append_json_string(out, e.category);
    out += ",\"ph\":\"X\",\"ts\":";
    append_us(out, e.start_ns);
    out += ",\"dur\":";
    append_us(out, std::max<int64_t>(0, e.end_ns - e.start_ns));
    out += ",\"pid\":1,\"tid\":";
    out += std::to_string(tids.at(e.device));

    args.clear();
    if (e.bytes > 0) args.emplace_back(&bytes_key, std::to_string(e.bytes));
    if (e.flops > 0) args.emplace_back(&flops_key, std::to_string(e.flops));
    for (const auto& [key, value] : e.args) {
      std::string text;
      append_json_string(text, value);
      auto same = std::find_if(args.begin(), args.end(), [&key = key](const auto& a) { return *a.first == key; });
      if (same != args.end()) {
        same->second = std::move(text);
      } else {
        args.emplace_back(&key, std::move(text));
      }
    }
    if (!args.empty()) {
      out += ",\"args\":{";
      for (size_t i = 0; i < args.size(); ++i) {
        if (i > 0) out += ',';
        append_json_string(out, *args[i].first);
        out += ':';
        out += args[i].second;
      }
      out += '}';
    }
    out += '}';
  }
  if (!first) out += '\n';
  // Drop the trailing ",\n" of the metadata when there are no events.
  if (first && out.size() >= 2 && out.compare(out.size() - 2, 2, ",\n") == 0) {
    out.resize(out.size() - 2);
    out += '\n';
  }
  out += "]}\n";
  return out;
}

Status write_chrome_trace(const std::vector<TraceEvent>& events, const std::string& path) {
  return write_file_atomic(path, chrome_trace_json(events));
}

// ---------------------------------------------------------------- summary

namespace {

// Control characters (a newline in an op name) would break the table.
std::string printable(const std::string& s, size_t width) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) out += (c < 0x20 || c == 0x7f) ? ' ' : static_cast<char>(c);
  if (out.size() > width) out = out.substr(0, width - 3) + "...";
  return out;
}

int64_t union_ns(std::vector<std::pair<int64_t, int64_t>>& iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0;
  int64_t lo = 0, hi = 0;
  bool open = false;
  for (const auto& [s, e] : iv) {
    if (e <= s) continue;
    if (!open || s > hi) {
      if (open) total += hi - lo;
      lo = s;
      hi = e;
      open = true;
    } else {
      hi = std::max(hi, e);
    }
  }
  if (open) total += hi - lo;
  return total;
}

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out.append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
}

// NOTE [execution split]: a sweep over the device's event boundaries; between two boundaries the innermost
// running event (the latest start; at equal starts the later in `events`' order: events() puts the enclosing
// one first) owns the time.
ExecutionSplit execution_split(const std::vector<TraceEvent>& events, const std::vector<size_t>& mine, int64_t first,
                               int64_t last) {
  ExecutionSplit s;
  if (last <= first) return s;
  struct Edge {
    int64_t t;
    bool start;
    size_t k;
  };
  std::vector<Edge> edges;
  edges.reserve(2 * mine.size());
  for (size_t k : mine) {
    if (events[k].end_ns <= events[k].start_ns) continue;  // owns no time (and would end before it starts)
    edges.push_back({events[k].start_ns, true, k});
    edges.push_back({events[k].end_ns, false, k});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return a.t != b.t ? a.t < b.t : a.start != b.start ? !a.start : a.k < b.k;  // ends first at a tie
  });
  auto bucket = [&s](const std::string& cat) -> int64_t& {
    if (cat == category::kKernel) return s.compute_ns;
    if (cat == category::kCopy) return s.copy_ns;
    if (cat == category::kCollective) return s.collective_ns;
    if (cat == category::kWait) return s.wait_ns;
    if (cat == category::kHost) return s.host_ns;
    if (cat == category::kPlan) return s.runtime_ns;
    return s.other_ns;
  };
  std::set<std::pair<int64_t, size_t>> active;  // (start, index): the innermost is the largest
  int64_t at = first;
  for (const Edge& e : edges) {
    const int64_t t = std::clamp(e.t, first, last);
    if (t > at) {
      if (active.empty()) s.idle_ns += t - at;
      else bucket(events[active.rbegin()->second].category) += t - at;
      at = t;
    }
    if (e.start) active.insert({events[e.k].start_ns, e.k});
    else active.erase({events[e.k].start_ns, e.k});
  }
  s.idle_ns += last - at;
  return s;
}

}  // namespace

std::vector<DeviceTotals> device_totals(const std::vector<TraceEvent>& events) {
  struct Building {
    std::vector<std::pair<int64_t, int64_t>> intervals;
    std::map<std::pair<std::string, std::string>, OpTotals> ops;  // by (category, name)
    std::unordered_map<std::string, size_t> layer_index;
  };
  std::vector<DeviceTotals> devices;
  std::vector<Building> building;
  std::unordered_map<std::string, size_t> index;
  for (const TraceEvent& e : events) {
    auto [it, added] = index.emplace(e.device, devices.size());
    if (added) {
      devices.emplace_back();
      devices.back().device = e.device;
      building.emplace_back();
    }
    Building& b = building[it->second];
    const int64_t dur = std::max<int64_t>(0, e.end_ns - e.start_ns);
    b.intervals.emplace_back(e.start_ns, e.end_ns);
    OpTotals& op = b.ops[{e.category, e.name}];
    if (op.count == 0) {
      op.category = e.category;
      op.name = e.name;
    }
    ++op.count;
    op.total_ns += dur;
    if (e.bytes > 0) {
      op.bytes += e.bytes;
      op.bytes_ns += dur;
    }
    if (e.flops > 0) {
      op.flops += e.flops;
      op.flops_ns += dur;
    }
    const std::string* layer = nullptr;
    bool backward = false;
    for (const auto& [key, value] : e.args) {
      if (key == "layer") layer = &value;
      if (key == "pass") backward = value == "backward";
    }
    if (layer != nullptr) {
      DeviceTotals& d = devices[it->second];
      auto [at, first] = b.layer_index.emplace(*layer, d.layers.size());
      if (first) d.layers.push_back({.layer = *layer});
      LayerTotals& l = d.layers[at->second];
      ++l.count;
      (backward ? l.backward_ns : l.forward_ns) += dur;
      l.flops += e.flops;
      l.bytes += e.bytes;
    }
  }
  int64_t wall_first = INT64_MAX, wall_last = INT64_MIN;
  for (const TraceEvent& e : events) {
    wall_first = std::min(wall_first, e.start_ns);
    wall_last = std::max(wall_last, e.end_ns);
  }
  std::vector<std::vector<size_t>> by_device(devices.size());
  for (size_t k = 0; k < events.size(); ++k) by_device[index.at(events[k].device)].push_back(k);
  for (size_t i = 0; i < devices.size(); ++i) devices[i].split = execution_split(events, by_device[i], wall_first, wall_last);
  for (size_t i = 0; i < devices.size(); ++i) {
    Building& b = building[i];
    DeviceTotals& d = devices[i];
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (const auto& [s, e] : b.intervals) {
      first = std::min(first, s);
      last = std::max(last, e);
    }
    d.span_ns = std::max<int64_t>(0, last - first);
    d.events = int64_t(b.intervals.size());
    d.busy_ns = union_ns(b.intervals);
    for (auto& [key, op] : b.ops) d.ops.push_back(std::move(op));
    std::stable_sort(d.ops.begin(), d.ops.end(),
                     [](const OpTotals& x, const OpTotals& y) { return x.total_ns > y.total_ns; });
  }
  return devices;
}

std::string summary(const std::vector<TraceEvent>& events, int top_n) {
  const std::vector<DeviceTotals> devices = device_totals(events);
  if (devices.empty()) return "no trace events\n";

  constexpr size_t kMaxName = 40;
  std::string out;
  for (const DeviceTotals& d : devices) {
    const int64_t span = d.span_ns, busy = d.busy_ns;
    appendf(out, "device %s: busy %.3f ms of %.3f ms (%.1f%%), %" PRId64 " events\n",
            printable(d.device, kMaxName).c_str(), busy / 1e6, span / 1e6, span > 0 ? 100.0 * busy / span : 0.0,
            d.events);
    const std::vector<OpTotals>& ops = d.ops;
    const size_t shown = top_n <= 0 ? ops.size() : std::min(ops.size(), static_cast<size_t>(top_n));

    size_t name_w = 2, cat_w = 8;
    for (size_t i = 0; i < shown; ++i) {
      name_w = std::max(name_w, printable(ops[i].name, kMaxName).size());
      cat_w = std::max(cat_w, printable(ops[i].category, kMaxName).size());
    }
    const int nw = static_cast<int>(name_w), cw = static_cast<int>(cat_w);
    appendf(out, "  %-*s  %-*s  %8s  %10s  %10s  %6s  %8s\n", nw, "op", cw, "category", "count", "total ms", "mean us",
            "share", "GB/s");
    for (size_t i = 0; i < shown; ++i) {
      const OpTotals& op = ops[i];
      appendf(out, "  %-*s  %-*s  %8" PRId64 "  %10.3f  %10.1f  %5.1f%%  ", nw, printable(op.name, kMaxName).c_str(),
              cw, printable(op.category, kMaxName).c_str(), op.count, op.total_ns / 1e6,
              op.total_ns / 1e3 / static_cast<double>(op.count), busy > 0 ? 100.0 * op.total_ns / busy : 0.0);
      if (op.bytes > 0 && op.bytes_ns > 0) {
        const double gbps = static_cast<double>(op.bytes) / op.bytes_ns;  // bytes/ns = GB/s
        appendf(out, gbps >= 100 ? "%8.0f\n" : gbps >= 1 ? "%8.2f\n" : "%8.4f\n", gbps);
      } else {
        appendf(out, "%8s\n", "-");
      }
    }
    if (shown < ops.size()) {
      int64_t rest_ns = 0, rest_count = 0;
      for (size_t i = shown; i < ops.size(); ++i) {
        rest_ns += ops[i].total_ns;
        rest_count += ops[i].count;
      }
      appendf(out, "  (%zu more ops, %" PRId64 " events, %.3f ms)\n", ops.size() - shown, rest_count, rest_ns / 1e6);
    }
  }
  return out;
}

}  // namespace aspen::profile
