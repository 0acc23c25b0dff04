#include "parallel/threads/threads_communicator.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "parallel/reduce.h"

namespace aspen::parallel {

namespace detail {

// One rank's published state. The plain fields are written by their rank
// before it arrives at a collective's entry barrier and read by peers until
// the collective's last barrier; the barrier's atomics order the accesses.
struct alignas(64) RankSlot {
  Collective kind = Collective::all_reduce;
  int64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  // Progress, read only for error messages.
  std::atomic<uint64_t> entered_seq{0};
  std::atomic<int> entered_kind{0};
  std::atomic<uint64_t> epoch{0};
};

// Messages from one rank to another, one at a time (rendezvous).
struct alignas(64) Mailbox {
  std::atomic<uint64_t> posted{0};  // messages the sender has offered
  std::atomic<uint64_t> taken{0};   // messages the receiver has copied
  const void* data = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
};

struct ThreadsGroup {
  ThreadsGroup(int size, CommOptions o)
      : n(size), options(std::move(o)), slots(new RankSlot[size]), mail(new Mailbox[size_t(size) * size]) {}

  // Wakes sleeping waiters; cheap when nobody sleeps (see wait_until).
  void wake() {
    if (sleepers.load() > 0) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }
  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!failed.load()) {
        failure = why;
        failed.store(true);
      }
    }
    cv.notify_all();
  }
  std::string failure_text() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }

  const int n;
  const CommOptions options;
  std::unique_ptr<RankSlot[]> slots;
  std::unique_ptr<Mailbox[]> mail;  // [src * n + dst]
  alignas(64) std::atomic<uint64_t> arrivals{0};  // barrier arrivals, all ranks, all time
  alignas(64) std::atomic<bool> failed{false};
  std::atomic<int> sleepers{0};
  std::mutex mu;
  std::condition_variable cv;
  std::string failure;  // guarded by mu; set once
};

}  // namespace detail

using detail::ThreadsGroup;

struct ThreadsCommunicator::Op {
  Collective kind = Collective::all_reduce;
  int64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t seq = 0;  // this rank's collective number, from 1 (p2p: the message number on the pair)
  int peer = -1;     // send/recv
};

namespace {

using Clock = std::chrono::steady_clock;

std::string describe(const ThreadsGroup& g, int rank, Collective kind, uint64_t seq) {
  return std::string(collective_name(kind)) + " #" + std::to_string(seq) + " (threads group '" + g.options.name +
         "', rank " + std::to_string(rank) + " of " + std::to_string(g.n) + ")";
}

std::string ms(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

// Spins, yields, then sleeps in 1 ms slices until done(); fails on the
// group's failure or after the timeout (then `on_timeout()` builds the error
// and the group is failed with it).
template <class Done, class OnTimeout>
Status wait_until(ThreadsGroup& g, const std::string& subject, Done done, OnTimeout on_timeout) {
  auto aborted = [&] {
    return Status::error(Code::kAborted, subject, "a working group", "the group failed: " + g.failure_text(),
                         "the first error above (on another rank) is the cause");
  };
  for (int i = 0; i < 2000; ++i) {
    if (done()) return Status();
    if ((i & 63) == 0 && g.failed.load()) return aborted();
    _mm_pause();
  }
  const auto deadline = Clock::now() + g.options.timeout;
  for (int yields = 0;; ++yields) {
    if (done()) return Status();
    if (g.failed.load()) return aborted();
    if (Clock::now() >= deadline) {
      Status s = on_timeout();
      g.fail(s.message());
      return s;
    }
    if (yields < 256) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(g.mu);
    g.sleepers.fetch_add(1);
    if (!done() && !g.failed.load()) g.cv.wait_for(lock, std::chrono::milliseconds(1));
    g.sleepers.fetch_sub(1);
  }
}

// "rank 3 (last entered broadcast #16)".
std::string whereabouts(const ThreadsGroup& g, int k) {
  const uint64_t seq = g.slots[k].entered_seq.load();
  std::string s = "rank " + std::to_string(k);
  if (seq == 0) return s + " (has entered no collective)";
  return s + " (last entered " + collective_name(static_cast<Collective>(g.slots[k].entered_kind.load())) + " #" +
         std::to_string(seq) + ")";
}

}  // namespace

ThreadsCommunicator::ThreadsCommunicator(std::shared_ptr<ThreadsGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}
ThreadsCommunicator::~ThreadsCommunicator() = default;

int ThreadsCommunicator::size() const { return group_->n; }

void ThreadsCommunicator::abort(const std::string& reason) {
  group_->fail("rank " + std::to_string(rank_) + " aborted: " + reason);
}

Result<std::vector<std::unique_ptr<ThreadsCommunicator>>> make_threads_group(int size, CommOptions options) {
  if (size < 1) return Status::invalid_argument("threads group '" + options.name + "'", "size >= 1", std::to_string(size));
  if (options.timeout.count() <= 0)
    return Status::invalid_argument("threads group '" + options.name + "'", "a timeout > 0 ms",
                                    std::to_string(options.timeout.count()) + " ms");
  auto group = std::make_shared<ThreadsGroup>(size, std::move(options));
  std::vector<std::unique_ptr<ThreadsCommunicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::unique_ptr<ThreadsCommunicator>(new ThreadsCommunicator(group, r)));
  return out;
}

Status ThreadsCommunicator::barrier(const Op& op, const char* phase) {
  ThreadsGroup& g = *group_;
  ++epoch_;
  g.slots[rank_].epoch.store(epoch_);
  const uint64_t target = uint64_t(g.n) * epoch_;
  if (g.arrivals.fetch_add(1) + 1 == target) g.wake();
  const uint64_t my_epoch = epoch_;
  return wait_until(
      g, describe(g, rank_, op.kind, op.seq), [&] { return g.arrivals.load() >= target; },
      [&] {
        std::string missing;
        for (int k = 0; k < g.n; ++k)
          if (g.slots[k].epoch.load() < my_epoch) missing += (missing.empty() ? "" : ", ") + whereabouts(g, k);
        return Status::error(Code::kDeadlineExceeded, describe(g, rank_, op.kind, op.seq),
                             "every rank at the " + std::string(phase) + " barrier within " + ms(g.options.timeout),
                             "still waiting for " + missing,
                             "a rank stopped, hangs, or called collectives in a different order");
      });
}

Status ThreadsCommunicator::enter(const Op& op) {
  ThreadsGroup& g = *group_;
  detail::RankSlot& s = g.slots[rank_];
  s.kind = op.kind;
  s.count = op.count;
  s.dtype = op.dtype;
  s.op = op.op;
  s.root = op.root;
  s.src = op.src;
  s.dst = op.dst;
  s.entered_kind.store(static_cast<int>(op.kind));
  s.entered_seq.store(op.seq);
  ASPEN_RETURN_IF_ERROR(barrier(op, "entry"));
  // Every rank checks every slot, so all of them see the same mismatch.
  auto call = [&](const detail::RankSlot& x) {
    std::string c = std::string(collective_name(x.kind)) + "(" + std::string(dtype_name(x.dtype)) + ", " +
                    std::to_string(x.count) + " elements";
    if (x.kind == Collective::all_reduce || x.kind == Collective::reduce_scatter) c += std::string(", ") + reduce_op_name(x.op);
    if (x.kind == Collective::broadcast || x.kind == Collective::reduce) c += ", root " + std::to_string(x.root);
    return c + ")";
  };
  for (int k = 0; k < g.n; ++k) {
    const detail::RankSlot& x = g.slots[k];
    const detail::RankSlot& y = g.slots[0];
    if (x.kind != y.kind || x.count != y.count || x.dtype != y.dtype || x.op != y.op || x.root != y.root) {
      Status st = Status::error(Code::kFailedPrecondition, describe(g, rank_, op.kind, op.seq),
                                "the same call on every rank", "rank 0 called " + call(g.slots[0]) + ", rank " +
                                                                   std::to_string(k) + " called " + call(x),
                                "every device must run the same collectives in the same order");
      g.fail(st.message());
      return st;
    }
  }
  return Status();
}

Status ThreadsCommunicator::do_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  ThreadsGroup& g = *group_;
  Op o{Collective::all_reduce, count, dtype, op, 0, data, data, ++seq_};
  ASPEN_RETURN_IF_ERROR(enter(o));
  const int n = g.n;
  const float divisor = op == ReduceOp::mean ? float(n) : 1.0f;
  const int64_t bytes = count * dtype_size(dtype);
  const int64_t small = g.options.small_bytes >= 0 ? g.options.small_bytes : kDefaultSmallBytes;
  const bool direct = g.options.algorithm == Algorithm::direct || g.options.algorithm == Algorithm::tree ||
                      (g.options.algorithm == Algorithm::automatic && bytes <= small);
  std::vector<const void*> in(static_cast<size_t>(n));
  if (direct) {
    for (int k = 0; k < n; ++k) in[k] = g.slots[k].dst;
    scratch_.resize(static_cast<size_t>((bytes + 3) / 4));
    detail::reduce_rows(in, dtype, count, scratch_.data(), dtype, divisor);
    ASPEN_RETURN_IF_ERROR(barrier(o, "read-done"));  // nobody reads our buffer any more
    std::memcpy(data, scratch_.data(), static_cast<size_t>(bytes));
    return Status();
  }
  // Chunk rank_ of every buffer: summed block by block and the sum written
  // back into that chunk of every buffer (no rank touches another's chunk, so
  // one pass reads each byte once and writes it once).
  const detail::Range mine = detail::chunk_range(count, n, rank_);
  std::vector<void*> out(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    in[k] = detail::at(g.slots[k].dst, dtype, mine.begin);
    out[k] = detail::at(g.slots[k].dst, dtype, mine.begin);
  }
  detail::reduce_rows_to_all(in, dtype, mine.size(), out, dtype, divisor);
  return barrier(o, "reduce");  // every chunk of every buffer is final
}

Status ThreadsCommunicator::do_reduce_scatter(const void* send_buf, void* recv_buf, int64_t recv_count, DType dtype,
                                              ReduceOp op) {
  ThreadsGroup& g = *group_;
  Op o{Collective::reduce_scatter, recv_count, dtype, op, 0, send_buf, recv_buf, ++seq_};
  ASPEN_RETURN_IF_ERROR(enter(o));
  std::vector<const void*> in(static_cast<size_t>(g.n));
  for (int k = 0; k < g.n; ++k) in[k] = detail::at(g.slots[k].src, dtype, rank_ * recv_count);
  detail::reduce_rows(in, dtype, recv_count, recv_buf, dtype, op == ReduceOp::mean ? float(g.n) : 1.0f);
  return barrier(o, "exit");
}

Status ThreadsCommunicator::do_all_gather(const void* send_buf, void* recv_buf, int64_t send_count, DType dtype) {
  ThreadsGroup& g = *group_;
  Op o{Collective::all_gather, send_count, dtype, ReduceOp::sum, 0, send_buf, recv_buf, ++seq_};
  ASPEN_RETURN_IF_ERROR(enter(o));
  const size_t bytes = static_cast<size_t>(send_count * dtype_size(dtype));
  for (int k = 0; k < g.n; ++k) std::memmove(detail::at(recv_buf, dtype, k * send_count), g.slots[k].src, bytes);
  return barrier(o, "exit");
}

Status ThreadsCommunicator::do_broadcast(void* data, int64_t count, DType dtype, int root) {
  ThreadsGroup& g = *group_;
  Op o{Collective::broadcast, count, dtype, ReduceOp::sum, root, data, data, ++seq_};
  ASPEN_RETURN_IF_ERROR(enter(o));
  if (rank_ != root) std::memcpy(data, g.slots[root].dst, static_cast<size_t>(count * dtype_size(dtype)));
  return barrier(o, "exit");
}

Status ThreadsCommunicator::reduce(void* data, int64_t count, DType dtype, ReduceOp op, int root) {
  ThreadsGroup& g = *group_;
  if (root < 0 || root >= g.n)
    return Status::invalid_argument("reduce (threads)", "root in [0, " + std::to_string(g.n) + ")", std::to_string(root));
  if (dtype != DType::f32 && dtype != DType::bf16)
    return Status::invalid_argument("reduce (threads)", "dtype f32 or bf16", std::string(dtype_name(dtype)));
  if (count < 0) return Status::invalid_argument("reduce (threads): count", ">= 0", std::to_string(count));
  Op o{Collective::reduce, count, dtype, op, root, data, data, ++seq_};
  ASPEN_RETURN_IF_ERROR(enter(o));
  const float divisor = op == ReduceOp::mean ? float(g.n) : 1.0f;
  const int64_t small = g.options.small_bytes >= 0 ? g.options.small_bytes : kDefaultSmallBytes;
  const bool direct = g.options.algorithm == Algorithm::direct || g.options.algorithm == Algorithm::tree ||
                      (g.options.algorithm == Algorithm::automatic && count * dtype_size(dtype) <= small);
  std::vector<const void*> in(static_cast<size_t>(g.n));
  void* out = g.slots[root].dst;
  if (direct) {
    if (rank_ == root) {
      for (int k = 0; k < g.n; ++k) in[k] = g.slots[k].dst;
      detail::reduce_rows(in, dtype, count, out, dtype, divisor);
    }
  } else {
    const detail::Range mine = detail::chunk_range(count, g.n, rank_);
    for (int k = 0; k < g.n; ++k) in[k] = detail::at(g.slots[k].dst, dtype, mine.begin);
    detail::reduce_rows(in, dtype, mine.size(), detail::at(out, dtype, mine.begin), dtype, divisor);
  }
  return barrier(o, "exit");  // root's buffer is complete; peers' are no longer read
}

Status ThreadsCommunicator::do_send(const void* data, int64_t count, DType dtype, int peer) {
  ThreadsGroup& g = *group_;
  detail::Mailbox& m = g.mail[size_t(rank_) * g.n + peer];
  const uint64_t id = m.posted.load() + 1;
  const std::string subject = describe(g, rank_, Collective::send, id) + " to rank " + std::to_string(peer);
  if (g.failed.load())
    return Status::error(Code::kAborted, subject, "a working group", "the group failed: " + g.failure_text());
  m.data = data;
  m.count = count;
  m.dtype = dtype;
  m.posted.store(id);
  g.wake();
  return wait_until(
      g, subject, [&] { return m.taken.load() >= id; },
      [&] {
        return Status::error(Code::kDeadlineExceeded, subject, "rank " + std::to_string(peer) + " to receive it within " +
                                                                   ms(g.options.timeout),
                             "still waiting for " + whereabouts(g, peer) + "; it has received " +
                                 std::to_string(m.taken.load()) + " of our messages",
                             "a send waits for its matching recv (rendezvous)");
      });
}

Status ThreadsCommunicator::do_recv(void* data, int64_t count, DType dtype, int peer) {
  ThreadsGroup& g = *group_;
  detail::Mailbox& m = g.mail[size_t(peer) * g.n + rank_];
  const uint64_t id = m.taken.load() + 1;
  const std::string subject = describe(g, rank_, Collective::recv, id) + " from rank " + std::to_string(peer);
  ASPEN_RETURN_IF_ERROR(wait_until(
      g, subject, [&] { return m.posted.load() >= id; },
      [&] {
        return Status::error(Code::kDeadlineExceeded, subject,
                             "rank " + std::to_string(peer) + " to send within " + ms(g.options.timeout),
                             "still waiting for " + whereabouts(g, peer) + "; it has sent " +
                                 std::to_string(m.posted.load()) + " messages to this rank",
                             "a rank stopped, hangs, or the schedule's sends and recvs do not pair up");
      }));
  if (m.count != count || m.dtype != dtype) {
    Status st = Status::error(Code::kFailedPrecondition, subject,
                              std::to_string(count) + " " + std::string(dtype_name(dtype)) + " elements",
                              "rank " + std::to_string(peer) + " sent " + std::to_string(m.count) + " " +
                                  std::string(dtype_name(m.dtype)) + " elements");
    g.fail(st.message());
    return st;
  }
  std::memcpy(data, m.data, static_cast<size_t>(count * dtype_size(dtype)));
  m.taken.store(id);
  g.wake();
  return Status();
}

}  // namespace aspen::parallel
