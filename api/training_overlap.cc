// TrainingModel's gradient exchange overlapped with the backward pass
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
#include <mutex>
#include <thread>

#include "api/training_model.h"

namespace aspen::api {

void TrainingModel::map_updates_to_params() {
  std::map<std::string, int> by_name;
  for (size_t i = 0; i < programs_.params.size(); ++i)
    by_name.emplace(train::grad_accumulator_name(programs_.params[i]), int(i));
  update_param_.assign(size_t(session_->programs()), {});
  for (int p : {programs_.micro_first, programs_.micro_next}) {
    if (p < 0) continue;
    for (const compiler::Binding& u : session_->executable(p).updates) {
      auto it = by_name.find(u.name);
      update_param_[size_t(p)].push_back(it == by_name.end() ? -1 : it->second);
    }
  }
}

Result<std::map<std::string, Tensor>> TrainingModel::run_with_exchange(
    int l, const std::map<std::string, const Tensor*>& feeds, int program) {
  const std::vector<int>& param_of = update_param_.at(size_t(program));
  const size_t n = programs_.params.size();
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> ready;  // parameter indices, in the order they became final
    bool stop = false;       // the program failed: no more will come
  } q;
  Status exchanged;
  std::thread helper([&] {
    const int64_t bucket = dp_->options().bucket_bytes;
    std::vector<float*> tensors;
    std::vector<int64_t> counts;
    std::vector<int> owners;
    int64_t bytes = 0;
    for (size_t taken = 0; taken < n;) {
      int i = -1;
      {
        std::unique_lock<std::mutex> lock(q.mu);
        q.cv.wait(lock, [&] { return q.stop || q.ready.size() > taken; });
        if (q.ready.size() <= taken) return;  // stopped
        i = q.ready[taken];
      }
      ++taken;
      tensors.push_back(grads_[size_t(l)][size_t(i)]);
      counts.push_back(grad_counts_[size_t(i)]);
      owners.push_back(owner_[size_t(i)]);
      bytes += 4 * grad_counts_[size_t(i)];
      if (bytes < bucket && taken < n) continue;
      profile::TraceScope scope(trace_.get(), session_->device(l).name(), "reduce gradients",
                                profile::category::kCollective, bytes);
      exchanged = dp_->reduce_to_owners(l, tensors, counts, owners);
      if (!exchanged.is_ok()) {
        dp_->abort(l, exchanged.message());
        return;
      }
      tensors.clear(), counts.clear(), owners.clear();
      bytes = 0;
    }
  });
  std::vector<char> seen(n, 0);
  Result<std::map<std::string, Tensor>> out = session_->run_replica(l, feeds, program, [&](int u) {
    const int i = param_of[size_t(u)];
    if (i < 0 || seen[size_t(i)]) return;
    seen[size_t(i)] = 1;
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.ready.push_back(i);
    }
    q.cv.notify_one();
  });
  bool all = true;
  for (char c : seen) all = all && c;
  if (!out.is_ok() || !all) {
    {
      std::lock_guard<std::mutex> lock(q.mu);
      q.stop = true;
    }
    q.cv.notify_one();
    if (out.is_ok())
      out = Status::error(Code::kInternal, "training: overlapped gradient exchange",
                          "every accumulator finished by the micro-batch program", "some never were");
    dp_->abort(l, out.status().message());  // a helper inside a collective returns at once
  }
  helper.join();
  if (!out.is_ok()) return out;
  ASPEN_RETURN_IF_ERROR(exchanged);
  return out;
}

}  // namespace aspen::api
