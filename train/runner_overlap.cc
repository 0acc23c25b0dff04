// The Runner's gradient exchange overlapped with the backward pass
// (DataParallelOptions::overlap): the last micro-batch of a data-parallel
// step runs with Session::run_replica's on_ready hook, which hands each
// gradient accumulator to a helper thread the moment the program has
// finished it (the compiled schedule's Executable::update_ready). The helper
// gathers them, in that order, into buckets of DataParallelOptions::
// bucket_bytes and reduces each full bucket (reduce_to_owners: inside the
// process, then across processes) while the backward pass goes on.
//
// Every replica runs the same program, so the order in which gradients become
// final, and so the buckets, are the same on every replica: the collectives
// line up, and each tensor's sum is made as without overlap (in-process the
// same bits; across processes the buckets are cut elsewhere, which changes
// only the MPI ring's chunking).
#include <condition_variable>
#include <functional>
#include <mutex>
#include <chrono>
#include <thread>

#include "train/runner.h"

namespace aspen::train {

Result<std::map<std::string, Tensor>> Runner::run_overlapped(
    int device, const std::map<std::string, const Tensor*>& feeds, int program,
    const std::vector<ExchangePiece>& pieces, size_t expected, const ExchangeFn& exchange,
    const std::function<void(const std::string&)>& abort, double& exchanged_s, int64_t& exchanged_bytes,
    double& exposed_s) {
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> ready;  // update indices, in the order they became final
    bool stop = false;       // the program failed: no more will come
  } q;
  Status exchanged;
  double helper_s = 0;  // the helper's alone until joined
  int64_t helper_bytes = 0;
  std::thread helper([&] {
    const int64_t bucket = dp_->options().bucket_bytes;
    std::vector<float*> tensors;
    std::vector<int64_t> counts;
    std::vector<int> owners;
    int64_t bytes = 0;
    for (size_t taken = 0; taken < expected;) {
      int u = -1;
      {
        std::unique_lock<std::mutex> lock(q.mu);
        q.cv.wait(lock, [&] { return q.stop || q.ready.size() > taken; });
        if (q.ready.size() <= taken) return;  // stopped
        u = q.ready[taken];
      }
      ++taken;
      const ExchangePiece& p = pieces[size_t(u)];
      tensors.push_back(p.data);
      counts.push_back(p.count);
      owners.push_back(p.owner);
      bytes += 4 * p.count;
      if (bytes < bucket && taken < expected) continue;
      profile::TraceScope scope(recording_, session_->device(device).name(), "reduce gradients",
                                profile::category::kCollective, bytes);
      const auto t0 = std::chrono::steady_clock::now();
      exchanged = exchange(tensors, counts, owners);
      helper_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      helper_bytes += bytes;
      if (!exchanged.is_ok()) {
        abort(exchanged.message());
        return;
      }
      tensors.clear(), counts.clear(), owners.clear();
      bytes = 0;
    }
  });
  size_t handed = 0;
  std::vector<char> seen(pieces.size(), 0);
  Result<std::map<std::string, Tensor>> out = session_->run_replica(device, feeds, program, [&](int u) {
    if (!pieces[size_t(u)].data || seen[size_t(u)]) return;
    seen[size_t(u)] = 1;
    ++handed;
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.ready.push_back(u);
    }
    q.cv.notify_one();
  });
  if (!out.is_ok() || handed != expected) {
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.stop = true;
    }
    q.cv.notify_one();
    if (out.is_ok())
      out = Status::error(Code::kInternal, "training: overlapped gradient exchange",
                          std::to_string(expected) + " gradients finished by the program",
                          std::to_string(handed));
    abort(out.status().message());  // a helper inside a collective returns at once
  }
  const auto program_done = std::chrono::steady_clock::now();
  helper.join();
  exposed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - program_done).count();
  exchanged_s += helper_s;
  exchanged_bytes += helper_bytes;
  if (!out.is_ok()) return out;
  ASPEN_RETURN_IF_ERROR(exchanged);
  return out;
}

}  // namespace aspen::train
