// parallel/threads/threads_communicator.h: the `threads` backend.
//
// The devices of one process, one OS thread each, talking through shared
// memory: a collective publishes each rank's buffer pointers, meets at a
// barrier, and every rank reads its peers' buffers directly (no copies into
// channels, no sockets). The algorithms (docs/parallel.md):
//  - all_reduce, small messages (direct): every rank sums the whole message
//    from all n buffers into private scratch, a barrier, then writes its own
//    buffer. Two barriers.
//  - all_reduce, large messages (chunked): rank r sums chunk r of all n
//    buffers into chunk r of its own buffer (a reduce-scatter in place), a
//    barrier, then copies every other chunk c from rank c's buffer (an
//    all-gather). Three barriers; each byte is read about 2n times and
//    written n times in all, against a ring's 3(n-1) reads of partial sums.
//  - reduce_scatter, all_gather, broadcast: every rank reads what it needs
//    from its peers' buffers; two barriers.
//  - send/recv: a per-pair mailbox; recv copies straight from the sender's
//    buffer (rendezvous).
// Every sum runs in rank order, so results equal the naive loop bit for bit
// whatever the algorithm and the thread timing.
//
// Waiting spins briefly, then yields, then sleeps on a condition variable in
// short slices (so idle devices leave their cores to busy ones), and gives
// up after CommOptions::timeout with DeadlineExceeded naming the ranks that
// did not arrive and what they last entered.
//
// Thread-safety: as for every Communicator, one per device thread.
// make_threads_group() may be called from any thread.
#pragma once

#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace aspen::parallel {

namespace detail {
struct ThreadsGroup;
}

class ThreadsCommunicator final : public Communicator {
 public:
  ~ThreadsCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override;
  std::string_view backend() const override { return "threads"; }
  void abort(const std::string& reason) override;

  // In place on `root`: root's data[i] = op over ranks of data[i], added in
  // rank order (the naive loop's bits); the other ranks' buffers are only
  // read. Small messages: root sums alone. Large ones: rank r sums chunk r of
  // every buffer into root's (the reduce-scatter half of the chunked
  // all-reduce, writing to one buffer). Two barriers. Data-parallel training
  // in one process reduces each gradient to the replica that updates it.
  Status reduce(void* data, int64_t count, DType dtype, ReduceOp op, int root);

  // Messages of at most this many bytes take the direct path by default.
  static constexpr int64_t kDefaultSmallBytes = 64 << 10;

 protected:
  Status do_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override;
  Status do_reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override;
  Status do_all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override;
  Status do_broadcast(void* data, int64_t count, DType dtype, int root) override;
  Status do_send(const void* data, int64_t count, DType dtype, int peer) override;
  Status do_recv(void* data, int64_t count, DType dtype, int peer) override;

 private:
  friend Result<std::vector<std::unique_ptr<ThreadsCommunicator>>> make_threads_group(int, CommOptions);
  ThreadsCommunicator(std::shared_ptr<detail::ThreadsGroup> group, int rank);

  struct Op;
  Status enter(const Op& op);
  Status barrier(const Op& op, const char* phase);

  std::shared_ptr<detail::ThreadsGroup> group_;
  int rank_ = 0;
  uint64_t epoch_ = 0;      // barriers this rank has passed
  uint64_t seq_ = 0;        // collectives this rank has entered
  std::vector<float> scratch_;  // the direct all-reduce's private sum (grown, reused)
};

// The communicators of one group of `size` devices; give element i to the
// thread of the device with rank i. The group lives until the last one dies.
Result<std::vector<std::unique_ptr<ThreadsCommunicator>>> make_threads_group(int size, CommOptions options = {});

}  // namespace aspen::parallel
