#include "api/trainer_live.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "parallel/communicator.h"
#include "runtime/session.h"

namespace aspen::api {

// NOTE [device load]: each device's shares of the last step's wall time (up to the host's decision): in its
// passes (`busy.<device>`), waiting for a pipeline peer's values (`wait.`), in gradient exchanges outside its
// passes (`comm.`), and the exchanges' achieved GB/s (`gbps.`, overlapped ones included). `aspen monitor`
// reads them: the devices waiting on a slow one show low busy shares, the slow one a high one. Under MPI
// every process's devices ("p<k>/<device>", one all-gather per call: every process calls this); process 0
// writes them. Nothing for a single device.
Result<std::vector<std::pair<std::string, double>>> device_load(const TrainingModel& model) {
  const PipelineStats& ps = model.last_pipeline_stats();
  parallel::Communicator* job = model.job();
  const int P = job ? job->size() : 1;
  const size_t D = ps.busy_s.size();
  std::vector<std::pair<std::string, double>> load;
  if (D == 0 || D * size_t(P) < 2) return load;
  constexpr size_t kFields = 4;  // busy, wait, comm shares; GB/s
  std::vector<float> all(D * kFields * size_t(P), 0.0f), mine(D * kFields, 0.0f);
  for (size_t d = 0; d < D && ps.wall_s > 0; ++d) {
    mine[d * kFields + 0] = float(ps.busy_s[d] / ps.wall_s);
    mine[d * kFields + 1] = float(d < ps.wait_s.size() ? ps.wait_s[d] / ps.wall_s : 0.0);
    mine[d * kFields + 2] = float(d < ps.comm_s.size() ? ps.comm_s[d] / ps.wall_s : 0.0);
    if (d < ps.exchange_s.size() && ps.exchange_s[d] > 0)
      mine[d * kFields + 3] = float(double(ps.exchange_bytes[d]) / ps.exchange_s[d] / 1e9);
  }
  if (P > 1) {
    ASPEN_RETURN_IF_ERROR(job->all_gather(mine.data(), all.data(), int64_t(mine.size()), DType::f32));
  } else {
    all = mine;
  }
  constexpr const char* kNames[kFields] = {"busy.", "wait.", "comm.", "gbps."};
  for (size_t f = 0; f < kFields; ++f)
    for (int p = 0; p < P; ++p)
      for (size_t d = 0; d < D; ++d) {
        const float v = all[(size_t(p) * D + d) * kFields + f];
        if (f == 3 && v <= 0) continue;  // no exchange
        const std::string device = model.session().device(int(d)).name();
        load.emplace_back(kNames[f] + (P > 1 ? "p" + std::to_string(p) + "/" + device : device), double(v));
      }
  return load;
}

namespace {

// An all-gather of 64-bit integers: the communicators gather float types only, and a gather is a copy, so each
// integer travels as the bits of two f32 values.
Status all_gather_i64(parallel::Communicator* job, const int64_t* send, int64_t* recv, int64_t count) {
  static_assert(sizeof(int64_t) == 2 * sizeof(float));
  return job->all_gather(send, recv, 2 * count, DType::f32);
}

}  // namespace

std::vector<std::pair<std::string, double>> data_line(const std::vector<int64_t>& replicas,
                                                      const std::vector<int64_t>& examples,
                                                      std::vector<std::pair<int64_t, int64_t>> drawn) {
  std::vector<std::pair<std::string, double>> out;
  std::map<int64_t, int64_t> by_replica;  // a replica fed in several processes: its copies, counted once
  for (size_t l = 0; l < replicas.size(); ++l) by_replica[replicas[l]] = std::max(by_replica[replicas[l]], examples[l]);
  if (by_replica.size() < 2) return out;
  for (const auto& [r, n] : by_replica) out.emplace_back("data.r" + std::to_string(r), double(n));
  std::sort(drawn.begin(), drawn.end());
  drawn.erase(std::unique(drawn.begin(), drawn.end()), drawn.end());  // a replica's copies
  int64_t duplicates = 0;  // draws of an example beyond the first replica's
  for (size_t i = 1; i < drawn.size(); ++i) duplicates += drawn[i].first == drawn[i - 1].first;
  out.emplace_back("data.duplicates", double(duplicates));
  return out;
}

Result<std::vector<std::pair<std::string, double>>> data_consumed(const TrainFeed& feed, parallel::Communicator* job) {
  const TrainFeed::DataStats& ds = feed.data_stats();
  const int P = job ? job->size() : 1;
  if (P == 1) return data_line(ds.replicas, ds.examples, ds.last_call);
  // Sizes first (processes may hold different numbers of replicas), then each process's lists.
  const int64_t mine[2] = {int64_t(ds.replicas.size()), int64_t(ds.last_call.size())};
  std::vector<int64_t> sizes(size_t(2 * P));
  ASPEN_RETURN_IF_ERROR(all_gather_i64(job, mine, sizes.data(), 2));
  int64_t L = 0, N = 0;
  for (int p = 0; p < P; ++p) L = std::max(L, sizes[size_t(2 * p)]), N = std::max(N, sizes[size_t(2 * p + 1)]);
  const size_t block = size_t(2 * L + 2 * N);
  std::vector<int64_t> send(block, -1), all(block * size_t(P));
  std::copy(ds.replicas.begin(), ds.replicas.end(), send.begin());
  std::copy(ds.examples.begin(), ds.examples.end(), send.begin() + L);
  for (size_t i = 0; i < ds.last_call.size(); ++i)
    send[size_t(2 * L) + 2 * i] = ds.last_call[i].first, send[size_t(2 * L) + 2 * i + 1] = ds.last_call[i].second;
  ASPEN_RETURN_IF_ERROR(all_gather_i64(job, send.data(), all.data(), int64_t(block)));
  std::vector<int64_t> replicas, examples;
  std::vector<std::pair<int64_t, int64_t>> drawn;
  for (int p = 0; p < P; ++p) {
    const int64_t* b = all.data() + size_t(p) * block;
    for (int64_t l = 0; l < sizes[size_t(2 * p)]; ++l) replicas.push_back(b[l]), examples.push_back(b[L + l]);
    for (int64_t i = 0; i < sizes[size_t(2 * p + 1)]; ++i) drawn.emplace_back(b[2 * L + 2 * i], b[2 * L + 2 * i + 1]);
  }
  return data_line(replicas, examples, std::move(drawn));
}

namespace {

std::string per_stage(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : "/") + std::to_string(n);
  return s;
}

}  // namespace

// parallel.balance: dynamic: each move the last call made (at its start), a move that could not be made, and a
// move whose gain it measured, as a line of the log and of metrics.jsonl ("stage_move": the nodes per stage
// before and after, the step's predicted gain, what the move took; "stage_move_measured": the gain measured
// after it).
Status log_stage_moves(const TrainingModel& model, size_t& logged, size_t& failures, train::MetricsLog* metrics,
                       train::Progress& progress) {
  const std::vector<train::StageMove>& moves = model.stage_moves();
  const int64_t step = model.last_steps().empty() ? model.steps_done() : model.last_steps().front().step;
  for (; logged < moves.size(); ++logged) {
    const train::StageMove& m = moves[logged];
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "step %lld: pipeline stages %s (compute nodes per stage %s -> %s; the step predicted "
                  "%.1f %% faster%s; the move took %.0f ms)",
                  static_cast<long long>(step), m.probe ? "moved to the next cut over, a probe" : "rebalanced",
                  per_stage(m.nodes_before).c_str(), per_stage(m.nodes_after).c_str(), 100.0 * m.predicted_gain(),
                  m.probe ? ", kept only if it measures faster" : "", 1e3 * m.seconds);
    progress.message(buf);
    if (metrics)
      ASPEN_RETURN_IF_ERROR(metrics->append(
          step, {{"predicted_gain", m.predicted_gain()}, {"move_s", m.seconds}, {"probe", m.probe ? 1.0 : 0.0}},
          {{"stage_move", per_stage(m.nodes_before) + " -> " + per_stage(m.nodes_after)}}));
  }
  for (; failures < model.stage_move_failures().size(); ++failures)
    progress.message("step " + std::to_string(step) + ": pipeline stages not moved, training goes on at the old cut: " +
                     model.stage_move_failures()[failures]);
  if (const int k = model.stage_move_just_measured(); k >= 0) {
    const train::StageMove& m = moves[size_t(k)];
    const int64_t at = model.last_steps().back().step;
    char buf[160];
    std::snprintf(buf, sizeof buf, "step %lld: the move of step %lld measured: the step %.1f %% faster "
                  "(predicted %.1f %%)", static_cast<long long>(at), static_cast<long long>(m.step + 1),
                  100.0 * m.measured_gain(), 100.0 * m.predicted_gain());
    progress.message(buf);
    if (metrics)
      ASPEN_RETURN_IF_ERROR(metrics->append(at, {{"measured_gain", m.measured_gain()}},
                                            {{"stage_move_measured", std::to_string(m.step + 1)}}));
  }
  return Status();
}

}  // namespace aspen::api
