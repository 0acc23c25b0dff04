#include "profile/perfetto.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/atomic_file.h"

namespace aspen::profile {
namespace {

// ------------------------------------------------------------ protobuf wire format
// The few messages written here are encoded by hand: Perfetto's SDK is not packaged for Debian, and its
// generated classes would be a large dependency for ten message types.

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(v);
}
void put_tag(std::string& out, int field, int wire) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire)); }
void put_uint(std::string& out, int field, uint64_t v) {
  put_tag(out, field, 0);
  put_varint(out, v);
}
void put_fixed64(std::string& out, int field, uint64_t v) {
  put_tag(out, field, 1);
  for (int i = 0; i < 8; ++i) out += char(uint8_t(v >> (8 * i)));
}
void put_bytes(std::string& out, int field, std::string_view s) {
  put_tag(out, field, 2);
  put_varint(out, s.size());
  out.append(s);
}

// Field numbers of perfetto_trace.proto (checked against the `perfetto` package's descriptors by the tests).
namespace field {
constexpr int kTracePacket = 1;  // Trace.packet
// TracePacket
constexpr int kTimestamp = 8, kSequenceId = 10, kTrackEvent = 11, kInternedData = 12, kSequenceFlags = 13,
              kClockSnapshot = 6, kCompressedPackets = 50, kDefaults = 59, kTrackDescriptor = 60;
// TrackEvent
constexpr int kCategoryIids = 3, kDebugAnnotations = 4, kType = 9, kNameIid = 10, kCounterValue = 30,
              kFlowIds = 47, kTerminatingFlowIds = 48;
// TrackDescriptor
constexpr int kUuid = 1, kName = 2, kProcess = 3, kParentUuid = 5, kCounter = 8, kChildOrdering = 11,
              kSiblingOrderRank = 12;
// InternedData
constexpr int kEventCategories = 1, kEventNames = 2, kAnnotationNames = 3, kAnnotationStrings = 29;
// DebugAnnotation
constexpr int kAnnotationNameIid = 1, kAnnotationUint = 3, kAnnotationStringIid = 17;
}  // namespace field

constexpr uint64_t kSliceBegin = 1, kSliceEnd = 2, kCounter = 4;  // TrackEvent.Type
constexpr uint64_t kIncrementalStateCleared = 1;                   // TracePacket.SequenceFlags
constexpr uint64_t kClockBoottime = 6, kSequenceClock = 64;        // 64..127: sequence-scoped clocks
constexpr uint64_t kExplicitOrder = 3;                             // TrackDescriptor.ChildTracksOrdering
constexpr uint64_t kUnitBytes = 3;                                 // CounterDescriptor.Unit
constexpr size_t kBlockBytes = size_t(1) << 20;                    // packets deflated together

// The file: packets collected into blocks, each block deflated into one TracePacket.
class Output {
 public:
  void packet(const std::string& p) {
    put_bytes(block_, field::kTracePacket, p);
    if (block_.size() >= kBlockBytes) flush();
  }
  std::string finish() {
    flush();
    return std::move(out_);
  }

 private:
  void flush() {
    if (block_.empty()) return;
    uLongf size = compressBound(uLong(block_.size()));
    std::string z(size, '\0');
    // compress2 writes the zlib format, which the trace processor's inflater takes (it also takes gzip).
    if (compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(block_.data()),
                  uLong(block_.size()), Z_DEFAULT_COMPRESSION) == Z_OK) {
      z.resize(size);
      std::string wrapper;
      put_bytes(wrapper, field::kCompressedPackets, z);
      put_bytes(out_, field::kTracePacket, wrapper);
    } else {  // (only out of memory): the block as it is
      out_ += block_;
    }
    block_.clear();
  }
  std::string block_, out_;
};

// One packet sequence: its interned strings, its clock and its default track.
class Sequence {
 public:
  Sequence(Output* out, uint32_t id, uint64_t track) : out_(out), id_(id) {
    // The first packet: clears the sequence's state, sets its default track and clock, and ties its clock
    // (zero: the trace's start) to the trace's.
    std::string defaults, te_defaults, snapshot, clock, boottime, p;
    put_uint(te_defaults, 11, track);                 // TrackEventDefaults.track_uuid
    put_uint(defaults, 58, kSequenceClock);           // TracePacketDefaults.timestamp_clock_id
    put_bytes(defaults, 11, te_defaults);             // TracePacketDefaults.track_event_defaults
    put_uint(clock, 1, kSequenceClock);               // Clock.clock_id
    put_uint(clock, 2, 0);                            // Clock.timestamp
    put_uint(clock, 3, 1);                            // Clock.is_incremental
    put_uint(boottime, 1, kClockBoottime);
    put_uint(boottime, 2, 0);
    put_bytes(snapshot, 1, clock);  // ClockSnapshot.clocks
    put_bytes(snapshot, 1, boottime);
    put_uint(p, field::kSequenceId, id_);
    put_uint(p, field::kSequenceFlags, kIncrementalStateCleared);
    put_bytes(p, field::kDefaults, defaults);
    put_bytes(p, field::kClockSnapshot, snapshot);
    out_->packet(p);
  }

  // The id of `s` in the table `kind` (an InternedData field), entered in this packet's InternedData when new.
  uint64_t intern(int kind, std::string_view s) {
    auto& table = tables_[kind];
    auto it = table.find(std::string(s));
    if (it != table.end()) return it->second;
    const uint64_t iid = table.size() + 1;
    table.emplace(std::string(s), iid);
    std::string entry;
    put_uint(entry, 1, iid);  // EventName/EventCategory/DebugAnnotationName/InternedString: iid = 1
    put_bytes(entry, 2, s);   // name (str for InternedString) = 2
    put_bytes(interned_, kind, entry);
    return iid;
  }

  // A packet at `t_ns` (trace time, not before the previous packet's) holding the TrackEvent `te`.
  void event(int64_t t_ns, const std::string& te) {
    packet_.clear();
    put_uint(packet_, field::kTimestamp, uint64_t(t_ns - last_ns_));
    last_ns_ = t_ns;
    put_uint(packet_, field::kSequenceId, id_);
    if (!interned_.empty()) {
      put_bytes(packet_, field::kInternedData, interned_);
      interned_.clear();
    }
    put_bytes(packet_, field::kTrackEvent, te);
    out_->packet(packet_);
  }

 private:
  Output* out_;
  uint32_t id_;
  int64_t last_ns_ = 0;
  std::map<int, std::unordered_map<std::string, uint64_t>> tables_;
  std::string interned_, packet_;
};

// The process of a device: "p<k>" of "p<k>/cpu0" (NOTE [profiles across processes]); "" in one process.
std::string process_of(const std::string& device) {
  const size_t slash = device.find('/');
  if (slash == std::string::npos || slash < 2 || device[0] != 'p') return "";
  for (size_t i = 1; i < slash; ++i)
    if (device[i] < '0' || device[i] > '9') return "";
  return device.substr(0, slash);
}

const std::string* arg(const TraceEvent& e, std::string_view key) {
  for (auto it = e.args.rbegin(); it != e.args.rend(); ++it)
    if (it->first == key) return &it->second;
  return nullptr;
}

int64_t to_int(const std::string* s, int64_t fallback) {
  if (s == nullptr || s->empty()) return fallback;
  int64_t v = 0;
  for (char c : *s) {
    if (c < '0' || c > '9') return fallback;
    v = v * 10 + (c - '0');
  }
  return v;
}

struct Device {
  std::string name;
  int process = 0;
  std::vector<std::vector<size_t>> lanes;  // event indices per track, in begin order
};

// A counter's value from `t` on.
struct Point {
  int64_t t = 0, value = 0;
};

void write_track(Output& out, uint64_t uuid, uint64_t parent, const std::string& name, int64_t rank, bool counter) {
  std::string d, p;
  put_uint(d, field::kUuid, uuid);
  put_bytes(d, field::kName, name);
  put_uint(d, field::kParentUuid, parent);
  put_uint(d, field::kSiblingOrderRank, uint64_t(rank));
  if (counter) {
    std::string c;
    put_uint(c, 3, kUnitBytes);  // CounterDescriptor.unit
    put_bytes(d, field::kCounter, c);
  }
  put_uint(p, field::kSequenceId, 1);
  put_bytes(p, field::kTrackDescriptor, d);
  out.packet(p);
}

}  // namespace

std::string perfetto_trace(const std::vector<TraceEvent>& events, const std::vector<ProgramMemory>& programs) {
  // Events by start (ties: the longer first, so that an event precedes those it contains).
  std::vector<size_t> order(events.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (events[a].start_ns != events[b].start_ns) return events[a].start_ns < events[b].start_ns;
    return events[a].end_ns > events[b].end_ns;
  });
  const int64_t origin = events.empty() ? 0 : events[order.front()].start_ns;
  auto t = [&](int64_t ns) { return ns - origin; };
  auto end_of = [&](size_t i) { return std::max(events[i].start_ns, events[i].end_ns); };

  // Devices and processes in order of first appearance; each device's events on the first of its tracks
  // where they nest.
  std::vector<std::string> processes;
  std::vector<Device> devices;
  std::unordered_map<std::string, size_t> device_index;
  std::vector<size_t> device_of(events.size());
  {
    std::vector<std::vector<std::vector<int64_t>>> open;  // per device, per lane: the ends of open slices
    for (size_t i : order) {
      const TraceEvent& e = events[i];
      auto [it, added] = device_index.emplace(e.device, devices.size());
      if (added) {
        const std::string proc = process_of(e.device);
        auto p = std::find(processes.begin(), processes.end(), proc);
        if (p == processes.end()) p = processes.insert(p, proc);
        devices.push_back({e.device, int(p - processes.begin()), {}});
        open.emplace_back();
      }
      device_of[i] = it->second;
      Device& d = devices[it->second];
      auto& stacks = open[it->second];
      size_t lane = 0;
      for (; lane < stacks.size(); ++lane) {
        auto& st = stacks[lane];
        while (!st.empty() && st.back() <= e.start_ns) st.pop_back();
        if (st.empty() || st.back() >= end_of(i)) break;
      }
      if (lane == stacks.size()) {
        stacks.emplace_back();
        d.lanes.emplace_back();
      }
      stacks[lane].push_back(end_of(i));
      d.lanes[lane].push_back(i);
    }
  }

  // Flows: the n-th "flow_out" of a key to the n-th "flow_in" of the same key.
  std::unordered_map<size_t, uint64_t> flow_out, flow_in;
  std::vector<std::pair<size_t, size_t>> transfers;  // (out, in)
  {
    std::map<std::string, std::pair<std::vector<size_t>, std::vector<size_t>>> by_key;
    for (size_t i : order) {
      if (const std::string* k = arg(events[i], "flow_out")) by_key[*k].first.push_back(i);
      if (const std::string* k = arg(events[i], "flow_in")) by_key[*k].second.push_back(i);
    }
    uint64_t next = 1;
    for (const auto& [key, ends] : by_key) {
      const size_t n = std::min(ends.first.size(), ends.second.size());
      for (size_t k = 0; k < n; ++k) {
        flow_out[ends.first[k]] = next;
        flow_in[ends.second[k]] = next;
        transfers.emplace_back(ends.first[k], ends.second[k]);
        ++next;
      }
    }
  }

  // Counters per device: planned memory at each kernel, bytes in flight.
  std::vector<std::vector<Point>> memory(devices.size()), in_flight(devices.size());
  {
    std::unordered_map<int64_t, const ProgramMemory*> plan;
    for (const ProgramMemory& pm : programs)
      if (pm.program >= 0 && pm.stride > 0) plan[pm.program] = &pm;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> deltas(devices.size());  // (time, change)
    for (size_t i : order) {
      const TraceEvent& e = events[i];
      const size_t d = device_of[i];
      if (!plan.empty() && e.category == category::kKernel &&
          (process_of(e.device).empty() || process_of(e.device) == "p0")) {
        auto p = plan.find(to_int(arg(e, "program"), -1));
        const int64_t node = to_int(arg(e, "node"), -1);
        if (p != plan.end() && node >= 0 && size_t(node / p->second->stride) < p->second->live_bytes.size()) {
          const int64_t v = p->second->live_bytes[size_t(node / p->second->stride)];
          auto& pts = memory[d];
          if (pts.empty() || pts.back().value != v) pts.push_back({t(e.start_ns), v});
        }
      }
      if ((e.category == category::kCopy || e.category == category::kCollective) && e.bytes > 0) {
        deltas[d].emplace_back(t(e.start_ns), e.bytes);
        deltas[d].emplace_back(t(end_of(i)), -e.bytes);
      }
    }
    for (auto [out, in] : transfers)  // sent, not yet taken: the sender's
      if (events[out].bytes > 0) {
        const int64_t until = std::max(events[out].start_ns, end_of(in));
        deltas[device_of[out]].emplace_back(t(events[out].start_ns), events[out].bytes);
        deltas[device_of[out]].emplace_back(t(until), -events[out].bytes);
      }
    for (size_t d = 0; d < devices.size(); ++d) {
      auto& ds = deltas[d];
      std::stable_sort(ds.begin(), ds.end(), [](auto& a, auto& b) { return a.first < b.first; });
      int64_t level = 0;
      for (size_t k = 0; k < ds.size();) {
        const int64_t at = ds[k].first;
        for (; k < ds.size() && ds[k].first == at; ++k) level += ds[k].second;
        in_flight[d].push_back({at, level});
      }
    }
  }

  Output out;
  // Tracks: a process track for each process, its devices' tracks and counters under it.
  const uint64_t kProcessUuid = 1000, kTrackUuid = uint64_t(1) << 32;
  for (size_t p = 0; p < processes.size(); ++p) {
    std::string d, proc, packet;
    put_uint(d, field::kUuid, kProcessUuid + p);
    put_uint(proc, 1, p + 1);  // ProcessDescriptor.pid
    put_bytes(proc, 6, processes[p].empty() ? "aspen" : "aspen " + processes[p]);  // process_name
    put_bytes(d, field::kProcess, proc);
    put_uint(d, field::kChildOrdering, kExplicitOrder);
    put_uint(packet, field::kSequenceId, 1);
    put_bytes(packet, field::kTrackDescriptor, d);
    out.packet(packet);
  }
  uint64_t next_track = kTrackUuid;
  int64_t rank = 0;
  uint32_t next_sequence = 2;
  std::string te, annotation;
  for (size_t di = 0; di < devices.size(); ++di) {
    const Device& dev = devices[di];
    const uint64_t parent = kProcessUuid + uint64_t(dev.process);
    const std::string shown = processes[size_t(dev.process)].empty() ? dev.name : dev.name.substr(dev.name.find('/') + 1);
    for (size_t lane = 0; lane < dev.lanes.size(); ++lane) {
      const uint64_t uuid = next_track++;
      write_track(out, uuid, parent, lane == 0 ? shown : shown + " #" + std::to_string(lane + 1), rank++, false);
      Sequence seq(&out, next_sequence++, uuid);
      std::vector<size_t> stack;  // open slices
      auto close_until = [&](int64_t ns, bool all) {
        while (!stack.empty() && (all || end_of(stack.back()) <= ns)) {
          te.clear();
          put_uint(te, field::kType, kSliceEnd);
          seq.event(t(end_of(stack.back())), te);
          stack.pop_back();
        }
      };
      for (size_t i : dev.lanes[lane]) {
        const TraceEvent& e = events[i];
        close_until(e.start_ns, false);
        te.clear();
        put_uint(te, field::kType, kSliceBegin);
        put_uint(te, field::kNameIid, seq.intern(field::kEventNames, e.name));
        put_uint(te, field::kCategoryIids, seq.intern(field::kEventCategories, e.category));
        auto uint_arg = [&](std::string_view key, int64_t v) {
          annotation.clear();
          put_uint(annotation, field::kAnnotationNameIid, seq.intern(field::kAnnotationNames, key));
          put_uint(annotation, field::kAnnotationUint, uint64_t(v));
          put_bytes(te, field::kDebugAnnotations, annotation);
        };
        if (e.bytes > 0) uint_arg("bytes", e.bytes);
        if (e.flops > 0) uint_arg("flops", e.flops);
        for (size_t a = 0; a < e.args.size(); ++a) {
          bool later = false;  // a later duplicate key wins, as in trace.json
          for (size_t b = a + 1; b < e.args.size() && !later; ++b) later = e.args[b].first == e.args[a].first;
          if (later) continue;
          annotation.clear();
          put_uint(annotation, field::kAnnotationNameIid, seq.intern(field::kAnnotationNames, e.args[a].first));
          put_uint(annotation, field::kAnnotationStringIid, seq.intern(field::kAnnotationStrings, e.args[a].second));
          put_bytes(te, field::kDebugAnnotations, annotation);
        }
        if (auto f = flow_out.find(i); f != flow_out.end()) put_fixed64(te, field::kFlowIds, f->second);
        if (auto f = flow_in.find(i); f != flow_in.end()) put_fixed64(te, field::kTerminatingFlowIds, f->second);
        seq.event(t(e.start_ns), te);
        stack.push_back(i);
      }
      close_until(0, true);
    }
    const std::pair<const char*, const std::vector<Point>*> counters[] = {{" memory (planned)", &memory[di]},
                                                                          {" bytes in flight", &in_flight[di]}};
    for (const auto& [suffix, points] : counters) {
      if (points->empty()) continue;
      const uint64_t uuid = next_track++;
      write_track(out, uuid, parent, shown + suffix, rank++, true);
      Sequence seq(&out, next_sequence++, uuid);
      for (const Point& pt : *points) {
        te.clear();
        put_uint(te, field::kType, kCounter);
        put_uint(te, field::kCounterValue, uint64_t(pt.value));
        seq.event(pt.t, te);
      }
    }
  }
  return out.finish();
}

Status write_perfetto_trace(const std::vector<TraceEvent>& events, const std::vector<ProgramMemory>& programs,
                            const std::string& path) {
  return write_file_atomic(path, perfetto_trace(events, programs));
}

}  // namespace aspen::profile
