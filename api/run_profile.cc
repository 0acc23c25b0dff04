#include "api/run_profile.h"

#include <algorithm>
#include <cstring>

#include "profile/diff.h"

namespace aspen::api {

namespace {

// An int64 carried in two f32 slots, bit for bit (the collectives move f32 and bf16; these are never added).
void put_i64(int64_t v, float* two) { std::memcpy(two, &v, sizeof v); }
int64_t get_i64(const float* two) {
  int64_t v = 0;
  std::memcpy(&v, two, sizeof v);
  return v;
}

}  // namespace

Result<std::vector<profile::TraceEvent>> gather_process_events(parallel::Communicator* job,
                                                               const std::vector<profile::TraceEvent>& mine,
                                                               const profile::TraceRecorder* clock) {
  if (!job || job->size() == 1) return mine;
  const int P = job->size(), me = job->rank();
  float barrier = 0;
  ASPEN_RETURN_IF_ERROR(job->all_reduce(&barrier, 1, DType::f32, parallel::ReduceOp::sum));
  const int64_t at_barrier = clock ? clock->now_ns() : 0;  // right after the barrier
  const std::string text = profile::chrome_trace_json(mine);
  float head[4];
  put_i64(int64_t(text.size()), head);
  put_i64(at_barrier, head + 2);
  std::vector<float> heads(size_t(4 * P));
  ASPEN_RETURN_IF_ERROR(job->all_gather(head, heads.data(), 4, DType::f32));
  const auto floats = [](int64_t bytes) { return (bytes + 3) / 4; };
  if (me != 0) {
    std::vector<float> payload(size_t(floats(int64_t(text.size()))));
    std::memcpy(payload.data(), text.data(), text.size());
    ASPEN_RETURN_IF_ERROR(job->send(payload.data(), int64_t(payload.size()), DType::f32, 0));
    return std::vector<profile::TraceEvent>{};
  }
  // Every payload first (a sender waits for its receive), then the parsing.
  std::vector<std::string> texts(static_cast<size_t>(P));
  texts[0] = text;
  for (int k = 1; k < P; ++k) {
    const int64_t bytes = get_i64(&heads[size_t(4 * k)]);
    std::vector<float> payload(size_t(floats(bytes)));
    ASPEN_RETURN_IF_ERROR(job->recv(payload.data(), int64_t(payload.size()), DType::f32, k));
    texts[size_t(k)].assign(reinterpret_cast<const char*>(payload.data()), size_t(bytes));
  }
  std::vector<profile::TraceEvent> all;
  const int64_t clock0 = get_i64(&heads[2]);
  for (int k = 0; k < P; ++k) {
    ASPEN_ASSIGN_OR_RETURN(std::vector<profile::TraceEvent> events,
                           profile::parse_chrome_trace(texts[size_t(k)], "the profile of process " + std::to_string(k)));
    const int64_t shift = clock0 - get_i64(&heads[size_t(4 * k + 2)]);
    for (profile::TraceEvent& e : events) {
      e.device = "p" + std::to_string(k) + "/" + e.device;
      e.start_ns += shift;
      e.end_ns += shift;
      all.push_back(std::move(e));
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const profile::TraceEvent& x, const profile::TraceEvent& y) {
    return x.start_ns != y.start_ns ? x.start_ns < y.start_ns : x.end_ns > y.end_ns;
  });
  return all;
}

Status write_run_profile(const std::string& dir, const std::vector<profile::TraceEvent>& events,
                         const profile::RunFacts& run, std::ostream& out) {
  ASPEN_RETURN_IF_ERROR(profile::write_profile_dir(dir, events, run));
  out << "profile: " << dir << "/report.html (open it in a browser), trace.pftrace (ui.perfetto.dev)"
      << (events.size() <= profile::kJsonTraceEvents ? ", trace.json" : "") << ", profile.json\n";
  return Status();
}

}  // namespace aspen::api
