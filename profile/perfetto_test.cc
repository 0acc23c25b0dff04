// profile/perfetto.h: the trace decoded back (a reader of the protobuf wire format, the compressed blocks
// inflated, the sequences' interning and incremental clocks applied as the trace processor applies them) gives
// every event with its device, name, category, exact times and arguments; tracks for overlapping events,
// processes, counters and flows; and a size of a few bytes an event. The official schema is checked by
// profile/perfetto_schema_test.py (the `perfetto` package's descriptors).
#include "profile/perfetto.h"
#include "profile/trace_testing.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace aspen::profile {
namespace {

// ------------------------------------------------------------ a reader of the wire format
struct Field {
  int number = 0;
  int wire = 0;
  uint64_t value = 0;     // varint, fixed64
  std::string_view data;  // length-delimited
};

// The fields of one message; fails the test on malformed bytes.
std::vector<Field> fields(std::string_view m) {
  std::vector<Field> out;
  size_t i = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= m.size()) throw std::runtime_error("truncated varint");
      const uint8_t b = uint8_t(m[i++]);
      v |= uint64_t(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    throw std::runtime_error("varint too long");
  };
  while (i < m.size()) {
    const uint64_t key = varint();
    Field f;
    f.number = int(key >> 3);
    f.wire = int(key & 7);
    if (f.wire == 0) {
      f.value = varint();
    } else if (f.wire == 1) {
      if (i + 8 > m.size()) throw std::runtime_error("truncated fixed64");
      for (int k = 0; k < 8; ++k) f.value |= uint64_t(uint8_t(m[i + size_t(k)])) << (8 * k);
      i += 8;
    } else if (f.wire == 2) {
      const uint64_t n = varint();
      if (n > m.size() - i) throw std::runtime_error("truncated bytes");
      f.data = m.substr(i, n);
      i += n;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    out.push_back(f);
  }
  return out;
}

std::string inflate_block(std::string_view z) {
  std::string out(size_t(8) << 20, '\0');
  uLongf n = uLongf(out.size());
  if (uncompress(reinterpret_cast<Bytef*>(out.data()), &n, reinterpret_cast<const Bytef*>(z.data()), uLong(z.size())) !=
      Z_OK)
    throw std::runtime_error("a compressed block does not inflate");
  out.resize(n);
  return out;
}

struct Slice {
  std::string track, name, category;
  int64_t start = 0, end = 0;
  std::map<std::string, std::string> args;
  std::vector<uint64_t> flows_out, flows_in;
};
struct Decoded {
  std::map<uint64_t, std::tuple<std::string, uint64_t, bool>> tracks;  // uuid -> (name, parent, counter)
  std::map<uint64_t, std::string> processes;                           // uuid -> process name
  std::vector<Slice> slices;                                           // in end order per track
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> counters;  // track name -> (time, value)
  int64_t compressed_blocks = 0, packets = 0;
};

// Applies what the trace processor applies: per sequence, interned tables, the default track and an
// incremental clock (each timestamp a delta from the previous packet's).
Decoded decode(const std::string& trace) {
  Decoded d;
  struct Seq {
    std::map<int, std::map<uint64_t, std::string>> interned;
    uint64_t track = 0;
    bool cleared = false, incremental = false;
    int64_t clock = 0;
    std::vector<Slice> open;
  };
  std::map<uint64_t, Seq> seqs;
  std::vector<std::string> inflated;  // keeps the views valid
  std::vector<std::string_view> packets;
  for (const Field& f : fields(trace)) {
    if (f.number != 1) throw std::runtime_error("Trace holds only packets");
    bool compressed = false;
    for (const Field& pf : fields(f.data))
      if (pf.number == 50) {
        compressed = true;
        ++d.compressed_blocks;
        inflated.push_back(inflate_block(pf.data));
        for (const Field& inner : fields(inflated.back())) packets.push_back(inner.data);
      }
    if (!compressed) packets.push_back(f.data);
  }
  for (std::string_view p : packets) {
    ++d.packets;
    uint64_t seq_id = 0, ts = 0;
    bool has_ts = false;
    std::string_view te, interned, defaults, snapshot, descriptor;
    uint64_t flags = 0;
    for (const Field& f : fields(p)) {
      switch (f.number) {
        case 8: ts = f.value, has_ts = true; break;
        case 10: seq_id = f.value; break;
        case 11: te = f.data; break;
        case 12: interned = f.data; break;
        case 13: flags = f.value; break;
        case 59: defaults = f.data; break;
        case 6: snapshot = f.data; break;
        case 60: descriptor = f.data; break;
        default: throw std::runtime_error("unexpected packet field " + std::to_string(f.number));
      }
    }
    Seq& s = seqs[seq_id];
    if (flags & 1) s.cleared = true, s.interned.clear();
    for (const Field& f : fields(defaults)) {
      if (f.number == 58 && f.value == 64) s.incremental = true;
      if (f.number == 11)
        for (const Field& g : fields(f.data))
          if (g.number == 11) s.track = g.value;
    }
    for (const Field& f : fields(snapshot)) {  // clock 64 at 0 <-> BOOTTIME at 0
      std::map<int, uint64_t> c;
      for (const Field& g : fields(f.data)) c[g.number] = g.value;
      if (c[1] == 64) {
        EXPECT_EQ(c[2], 0u);
        EXPECT_EQ(c[3], 1u);
      } else {
        EXPECT_EQ(c[1], 6u);
        EXPECT_EQ(c[2], 0u);
      }
    }
    for (const Field& f : fields(interned)) {
      uint64_t iid = 0;
      std::string str;
      for (const Field& g : fields(f.data)) {
        if (g.number == 1) iid = g.value;
        if (g.number == 2) str = std::string(g.data);
      }
      s.interned[f.number][iid] = str;
    }
    if (!descriptor.empty()) {
      uint64_t uuid = 0, parent = 0;
      std::string name;
      bool counter = false;
      for (const Field& f : fields(descriptor)) {
        if (f.number == 1) uuid = f.value;
        if (f.number == 2) name = std::string(f.data);
        if (f.number == 5) parent = f.value;
        if (f.number == 8) counter = true;
        if (f.number == 3)
          for (const Field& g : fields(f.data))
            if (g.number == 6) d.processes[uuid] = std::string(g.data);
      }
      if (!d.processes.count(uuid)) d.tracks[uuid] = {name, parent, counter};
    }
    if (te.empty()) continue;
    if (!s.cleared || !s.incremental || !has_ts) throw std::runtime_error("an event before its sequence's state");
    s.clock += int64_t(ts);
    uint64_t type = 0, track = s.track;
    Slice sl;
    int64_t value = 0;
    for (const Field& f : fields(te)) {
      switch (f.number) {
        case 9: type = f.value; break;
        case 11: track = f.value; break;
        case 10: sl.name = s.interned.at(2).at(f.value); break;
        case 3: sl.category = s.interned.at(1).at(f.value); break;
        case 30: value = int64_t(f.value); break;
        case 47: sl.flows_out.push_back(f.value); break;
        case 48: sl.flows_in.push_back(f.value); break;
        case 4: {
          std::string key, val;
          for (const Field& g : fields(f.data)) {
            if (g.number == 1) key = s.interned.at(3).at(g.value);
            if (g.number == 3) val = std::to_string(g.value);
            if (g.number == 17) val = s.interned.at(29).at(g.value);
          }
          sl.args[key] = val;
          break;
        }
        default: throw std::runtime_error("unexpected track event field " + std::to_string(f.number));
      }
    }
    const std::string& track_name = std::get<0>(d.tracks.at(track));
    if (type == 1) {
      sl.track = track_name;
      sl.start = s.clock;
      s.open.push_back(sl);
    } else if (type == 2) {
      if (s.open.empty()) throw std::runtime_error("an end with no open slice on " + track_name);
      s.open.back().end = s.clock;
      d.slices.push_back(s.open.back());
      s.open.pop_back();
    } else if (type == 4) {
      d.counters[track_name].emplace_back(s.clock, value);
    }
  }
  for (auto& [id, s] : seqs)
    if (!s.open.empty()) throw std::runtime_error("a slice left open");
  return d;
}

TraceEvent ev(std::string device, std::string name, int64_t start, int64_t end, std::string cat = category::kKernel,
              std::vector<std::pair<std::string, std::string>> args = {}, int64_t bytes = 0) {
  return test_event(std::move(device), std::move(name), start, end, bytes, std::move(cat), std::move(args));
}

const Slice* find(const Decoded& d, std::string_view track, std::string_view name, int64_t start) {
  for (const Slice& s : d.slices)
    if (s.track == track && s.name == name && s.start == start) return &s;
  return nullptr;
}

TEST(PerfettoTrace, EveryEventComesBackWithItsTimesAndArguments) {
  // cpu0: a plan step holding two kernels (one zero-length, one touching its end), a kernel that overlaps
  // the step without nesting (a second track), a later one. cpu1: one event. Times start at 1000 ns.
  std::vector<TraceEvent> events = {
      ev("cpu0", "forward m0", 1000, 2000, category::kPlan, {{"instruction", "forward m0"}}),
      ev("cpu0", "matmul", 1000, 1500, category::kKernel, {{"node", "3"}, {"layer", "h.0.attn"}, {"node", "4"}}),
      ev("cpu0", "add", 1500, 1500),
      ev("cpu0", "gelu", 1500, 2000, category::kKernel, {{"layer", "h.0.mlp \xce\xbb"}}),
      ev("cpu0", "copy", 1900, 2500, category::kCopy, {}, 4096),
      ev("cpu0", "matmul", 3000, 3100, category::kKernel, {{"node", "3"}, {"layer", "h.0.attn"}}),
      ev("cpu1", "add", 1200, 1300),
  };
  events[1].flops = 123456;
  const Decoded d = decode(perfetto_trace(events));
  ASSERT_EQ(d.slices.size(), events.size());
  EXPECT_EQ(d.processes.size(), 1u);
  for (const TraceEvent& e : events) {
    const std::string track = e.name == "copy" ? "cpu0 #2" : e.device;
    const Slice* s = find(d, track, e.name, e.start_ns - 1000);
    ASSERT_NE(s, nullptr) << e.device << " " << e.name << " at " << e.start_ns;
    EXPECT_EQ(s->end - s->start, e.end_ns - e.start_ns) << e.name;
    EXPECT_EQ(s->category, e.category);
  }
  const Slice* mm = find(d, "cpu0", "matmul", 0);
  EXPECT_EQ(mm->args.at("node"), "4");  // a later duplicate key wins
  EXPECT_EQ(mm->args.at("layer"), "h.0.attn");
  EXPECT_EQ(mm->args.at("flops"), "123456");
  EXPECT_EQ(find(d, "cpu0", "gelu", 500)->args.at("layer"), "h.0.mlp \xce\xbb");
  EXPECT_EQ(find(d, "cpu0 #2", "copy", 900)->args.at("bytes"), "4096");
  // Bytes in flight on cpu0: the copy's 4096 from 900 to 1500.
  const auto& flight = d.counters.at("cpu0 bytes in flight");
  EXPECT_EQ(flight, (std::vector<std::pair<int64_t, int64_t>>{{900, 4096}, {1500, 0}}));
  EXPECT_EQ(d.counters.count("cpu1 bytes in flight"), 0u);
  EXPECT_EQ(perfetto_trace({}).size(), 0u);  // no events, no packets: still a valid (empty) trace
}

TEST(PerfettoTrace, ProcessesFlowsAndPlannedMemory) {
  // Two processes; p0/cpu0 sends to p1/cpu0 twice under one key (paired in time order) and once under another;
  // a send with no receive gets no arrow. Planned memory from program 1's live bytes (stride 2).
  std::vector<TraceEvent> events = {
      ev("p0/cpu0", "matmul", 0, 10, category::kKernel, {{"program", "1"}, {"node", "0"}}),
      ev("p0/cpu0", "add", 10, 20, category::kKernel, {{"program", "1"}, {"node", "1"}}),
      ev("p0/cpu0", "add", 20, 30, category::kKernel, {{"program", "1"}, {"node", "2"}}),
      ev("p0/cpu0", "add", 30, 35, category::kKernel, {{"program", "0"}, {"node", "2"}}),  // no plan: no point
      ev("p0/cpu0", "send", 40, 50, category::kPlan, {{"flow_out", "act e0 m0 0->1"}}, 100),
      ev("p0/cpu0", "send", 60, 70, category::kPlan, {{"flow_out", "act e0 m0 0->1"}}, 100),
      ev("p0/cpu0", "send", 80, 90, category::kPlan, {{"flow_out", "act e1 m0 0->1"}}, 7),
      ev("p0/cpu0", "send", 95, 99, category::kPlan, {{"flow_out", "act e9 m0 0->1"}}, 5),
      ev("p1/cpu0", "recv", 45, 75, category::kPlan, {{"flow_in", "act e0 m0 0->1"}}),
      ev("p1/cpu0", "recv", 76, 78, category::kPlan, {{"flow_in", "act e0 m0 0->1"}}),
      ev("p1/cpu0", "recv", 85, 120, category::kPlan, {{"flow_in", "act e1 m0 0->1"}}),
      ev("p1/cpu0", "matmul", 0, 10, category::kKernel, {{"program", "1"}, {"node", "0"}}),  // another process's
  };
  ProgramMemory pm;
  pm.program = 1;
  pm.stride = 2;
  pm.live_bytes = {500, 900};
  const Decoded d = decode(perfetto_trace(events, {pm}));
  ASSERT_EQ(d.slices.size(), events.size());
  std::vector<std::string> names;
  for (const auto& [uuid, name] : d.processes) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"aspen p0", "aspen p1"}));
  for (const auto& [uuid, t] : d.tracks)  // every device's track under its process
    EXPECT_TRUE(d.processes.count(std::get<1>(t))) << std::get<0>(t);
  auto flow = [&](std::string_view track, std::string_view name, int64_t start, bool out) {
    const Slice* s = find(d, track, name, start);
    EXPECT_NE(s, nullptr);
    const auto& ids = out ? s->flows_out : s->flows_in;
    return ids.size() == 1 ? ids[0] : uint64_t(0);
  };
  const uint64_t a = flow("cpu0", "send", 40, true), b = flow("cpu0", "send", 60, true), c = flow("cpu0", "send", 80, true);
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_NE(b, c);
  EXPECT_EQ(flow("cpu0", "recv", 45, false), a);
  EXPECT_EQ(flow("cpu0", "recv", 76, false), b);
  EXPECT_EQ(flow("cpu0", "recv", 85, false), c);
  EXPECT_EQ(flow("cpu0", "send", 95, true), 0u);  // never received
  // p0's memory: node 0 -> 500, 1 -> 500 (same: no point), 2 -> 900; p1's devices have no plan here.
  int memory_tracks = 0;
  for (const auto& [uuid, t] : d.tracks) memory_tracks += std::get<0>(t).find("memory") != std::string::npos;
  EXPECT_EQ(memory_tracks, 1);
  const auto& mem = d.counters.at("cpu0 memory (planned)");
  EXPECT_EQ(mem, (std::vector<std::pair<int64_t, int64_t>>{{0, 500}, {20, 900}}));
  // In flight from p0/cpu0: 100 from 40 until its receive ends at 75; 100 from 60 to 78; 7 from 80 to 120.
  const auto& flight = d.counters.at("cpu0 bytes in flight");
  EXPECT_EQ(flight, (std::vector<std::pair<int64_t, int64_t>>{{40, 100}, {60, 200}, {75, 100}, {78, 0}, {80, 7}, {120, 0}}));
}

TEST(PerfettoTrace, AFewBytesAnEvent) {
  // A training step's shape: per device a plan instruction holding kernels with the runtime's arguments,
  // the same instructions step after step (as a run repeats its program). 400,000 events.
  std::vector<TraceEvent> events;
  const char* ops[] = {"matmul", "add", "layer_norm", "gelu", "softmax", "matmul_q"};
  int64_t t = 0;
  for (int step = 0; step < 200; ++step)
    for (int dev = 0; dev < 2; ++dev)
      for (int ins = 0; ins < 10; ++ins) {
        const int64_t begin = t;
        for (int k = 0; k < 99; ++k) {
          const int node = ins * 99 + k;
          TraceEvent e = ev("cpu" + std::to_string(dev), ops[node % 6], t, t + 1000 + (node * 37 + step * 11) % 900,
                            category::kKernel,
                            {{"program", "0"},
                             {"node", std::to_string(node)},
                             {"inputs", "f32[8,128,768] f32[768," + std::to_string(768 * (1 + node % 4)) + "]"},
                             {"layer", "h." + std::to_string(node / 90) + ".attn"}});
          e.bytes = 4096 * (1 + node % 7);
          e.flops = 1'000'000 * (1 + node % 5);
          t = e.end_ns + 50 + (step * 7 + k) % 40;
          events.push_back(std::move(e));
        }
        events.push_back(ev("cpu" + std::to_string(dev), "forward", begin, t, category::kPlan,
                            {{"instruction", "forward m" + std::to_string(ins)}}));
        t += 100;
      }
  const std::string trace = perfetto_trace(events);
  ASSERT_EQ(decode(trace).slices.size(), events.size());
  const double per_event = double(trace.size()) / double(events.size());
  std::printf("perfetto trace: %zu events, %zu bytes, %.1f bytes an event\n", events.size(), trace.size(), per_event);
  // 10 million such events in under 300 MB; trace.json spends ~200 bytes an event.
  EXPECT_LT(per_event, 30.0);
}

}  // namespace
}  // namespace aspen::profile
