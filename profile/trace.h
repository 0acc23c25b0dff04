// profile/trace.h: what ran where, and for how long.
//
// A TraceRecorder collects timed events from the devices of one process:
// kernels, copies, collectives and host work. The runtime and the
// communicators write into it; the CLI writes it out as a Chrome trace
// (write_chrome_trace, opens in Perfetto and chrome://tracing) and prints a
// per-device table of the costliest ops (summary).
//
//   TraceRecorder rec;
//   {
//     TraceScope s(&rec, "cpu:0", "matmul", category::kKernel, bytes);
//     s.add_arg("node", "17");
//     ...                                   // timed: [construction, destruction)
//   }
//   ASPEN_RETURN_IF_ERROR(write_chrome_trace(rec.events(), "trace.json"));
//
// Times are steady-clock nanoseconds since the recorder was created. Code
// that may run without profiling holds a `TraceRecorder*` that is null; a
// TraceScope on a null (or disabled) recorder does one comparison and
// records nothing.
//
// Thread-safety: record(), TraceScope, enabled(), set_enabled(), now_ns(),
// events(), size() and clear() may be called from any thread concurrently.
// Events land in one of several buffers picked by the calling thread, so
// devices on different threads rarely share a lock; recording one event
// costs a short uncontended lock and a copy (well under a microsecond).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace aspen::profile {

// The usual values of TraceEvent::category (free-form; these are what the
// runtime writes).
namespace category {
inline constexpr const char* kKernel = "kernel";
inline constexpr const char* kCopy = "copy";
inline constexpr const char* kCollective = "collective";
inline constexpr const char* kHost = "host";
inline constexpr const char* kPlan = "plan";  // a training plan's instruction (train/plan.h), around what it runs
inline constexpr const char* kWait = "wait";  // waiting for a peer: a pipeline receive until its value arrives
}  // namespace category

struct TraceEvent {
  std::string device;    // e.g. "cpu:0"; one Chrome trace thread per device
  std::string name;      // the op, e.g. "matmul"
  std::string category;  // see `category` above
  int64_t start_ns = 0;  // steady clock, relative to the recorder's creation
  int64_t end_ns = 0;
  int64_t bytes = 0;                                      // bytes moved or touched; 0 = unknown
  int64_t flops = 0;  // the products' floating-point operations (NOTE [node FLOPs], graph/cost.h); 0 = none
  std::vector<std::pair<std::string, std::string>> args;  // a few extras: node index, shapes

  int64_t duration_ns() const { return end_ns - start_ns; }
};

class TraceRecorder {
 public:
  explicit TraceRecorder(bool enabled = true);
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }

  // Nanoseconds since this recorder was created (steady clock).
  int64_t now_ns() const { return to_ns(std::chrono::steady_clock::now()); }
  int64_t to_ns(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_).count();
  }

  // Stores a copy of `event` as given (whether or not enabled(): callers
  // that time things themselves check enabled() first).
  void record(const TraceEvent& event);
  void record(TraceEvent&& event);

  // A copy of every event recorded so far, sorted by start time (ties: the
  // longer first, so enclosing events precede the ones they contain).
  std::vector<TraceEvent> events() const;
  size_t size() const;
  void clear();

 private:
  // Events of one shard live in fixed-capacity chunks, so recording never
  // moves earlier events.
  static constexpr size_t kShards = 16;
  static constexpr size_t kChunkEvents = 1024;
  struct alignas(64) Shard {
    mutable std::mutex mu;
    std::vector<std::vector<TraceEvent>> chunks;
    std::vector<TraceEvent>& tail();  // a chunk with room; called under mu
  };
  Shard& shard_for_this_thread();

  std::chrono::steady_clock::time_point origin_;
  std::atomic<bool> enabled_;
  std::array<Shard, kShards> shards_;
};

// Records [construction, destruction) into `recorder` when it is non-null and
// enabled at construction; otherwise does nothing and costs a comparison.
class TraceScope {
 public:
  TraceScope(TraceRecorder* recorder, std::string_view device, std::string_view name,
             std::string_view cat = category::kHost, int64_t bytes = 0)
      : recorder_(recorder != nullptr && recorder->enabled() ? recorder : nullptr) {
    if (recorder_ != nullptr) begin(device, name, cat, bytes);
  }
  ~TraceScope() {
    if (recorder_ != nullptr) end();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  // Whether this scope records; guard costly argument formatting with it.
  bool active() const { return recorder_ != nullptr; }
  void set_bytes(int64_t bytes) {
    if (recorder_ != nullptr) event_.bytes = bytes;
  }
  void set_flops(int64_t flops) {
    if (recorder_ != nullptr) event_.flops = flops;
  }
  void add_arg(std::string key, std::string value) {
    if (recorder_ != nullptr) event_.args.emplace_back(std::move(key), std::move(value));
  }

 private:
  void begin(std::string_view device, std::string_view name, std::string_view cat, int64_t bytes);
  void end();

  TraceRecorder* recorder_;
  TraceEvent event_;
};

// Writes `events` as Chrome trace JSON to `path`: a "traceEvents" array of
// complete events (ph "X", ts and dur in microseconds with nanosecond
// digits, pid 1, one tid per device in order of first appearance, named by
// "thread_name" metadata), args holding "bytes" (when > 0) and the event's
// own args (a later duplicate key wins). Strings are JSON-escaped; invalid
// UTF-8 is replaced by U+FFFD. The file is replaced atomically (a temporary
// file in the same directory, fsync, rename). Failure: kIoError naming
// `path` and the OS error.
Status write_chrome_trace(const std::vector<TraceEvent>& events, const std::string& path);

// The JSON text write_chrome_trace writes.
std::string chrome_trace_json(const std::vector<TraceEvent>& events);

// The totals of `events` per device, in order of first appearance: busy time (the union of its events'
// intervals), span (first start to last end), event count, its ops grouped by (category, name), the
// costliest first, with count, total time, bytes and FLOPs over the time of the events that report them, and
// its layers (LayerTotals).
// What summary() prints and profile.json holds (profile/profile_dir.h).
struct OpTotals {
  std::string category, name;
  int64_t count = 0, total_ns = 0;
  int64_t bytes = 0, bytes_ns = 0;  // bytes / bytes_ns = GB/s over the events that report bytes
  int64_t flops = 0, flops_ns = 0;  // flops / flops_ns = GFLOP/s over the events that report FLOPs
};
// The instructions of one model layer (the event's "layer" argument: its node's scope, NOTE [name scopes];
// "" for instructions of no layer), forward and backward (argument "pass": "backward").
struct LayerTotals {
  std::string layer;
  int64_t count = 0, forward_ns = 0, backward_ns = 0, flops = 0, bytes = 0;
};
// NOTE [execution split]: where a device's wall time went. The wall is every device's first start to last end
// (the same for all devices); each instant of it is the innermost event running on the device then (the one
// that started last), by category: kernel -> compute, copy, collective, wait, host, plan -> runtime (a training
// plan's own work between the instructions it runs), any other -> other; no event -> idle. The parts sum to
// the wall exactly.
struct ExecutionSplit {
  int64_t compute_ns = 0, copy_ns = 0, collective_ns = 0, wait_ns = 0, host_ns = 0, runtime_ns = 0, other_ns = 0,
          idle_ns = 0;
  int64_t total() const {
    return compute_ns + copy_ns + collective_ns + wait_ns + host_ns + runtime_ns + other_ns + idle_ns;
  }
};
struct DeviceTotals {
  std::string device;
  int64_t busy_ns = 0, span_ns = 0, events = 0;
  std::vector<OpTotals> ops;
  std::vector<LayerTotals> layers;  // the events with a "layer" argument, by layer in order of first appearance
  ExecutionSplit split;
};
std::vector<DeviceTotals> device_totals(const std::vector<TraceEvent>& events);

// A text table per device (in order of first appearance): busy time (the
// union of its events' intervals), span and event count, then its `top_n` ops
// (grouped by category and name) by total time with count, total ms, mean
// µs, share of the device's busy time, and GB/s over the events that report
// bytes. top_n <= 0 lists every op.
std::string summary(const std::vector<TraceEvent>& events, int top_n = 10);

}  // namespace aspen::profile
