#include "parallel/mpi/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "parallel/reduce.h"

namespace aspen::parallel {

namespace {

bool g_we_initialized = false;

// NOTE [launcher kill]: when a rank dies, mpirun ends the job by sending the
// survivors SIGTERM, which would kill them silently mid-wait. What each wait
// is for lives in this buffer, and a SIGTERM handler (installed by mpi_init
// when none is set) writes it out before exiting 143. Async-signal-safe:
// the handler only reads the buffer and calls write and _exit.
char g_activity[512] = "";

void on_sigterm(int) {
  static const char head[] = "aspen: terminated by the MPI launcher (SIGTERM; another rank probably died) ";
  ssize_t ignored = write(2, head, sizeof(head) - 1);
  ignored = write(2, g_activity, strnlen(g_activity, sizeof(g_activity)));
  ignored = write(2, "\n", 1);
  (void)ignored;
  _exit(143);
}

void set_activity(int world_rank, const std::string& subj, const std::string& step) {
  std::snprintf(g_activity, sizeof(g_activity), "on world rank %d, in %s, waiting for %s", world_rank, subj.c_str(),
                step.c_str());
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

// Tags on the collectives' communicator (messages of one pair never overtake).
constexpr int kTagDirect = 1, kTagRingReduce = 2, kTagRingGather = 3, kTagExchange = 4, kTagBroadcast = 5,
              kTagTreeUp = 6, kTagTreeDown = 7;

}  // namespace

const char* mpi_activity() { return g_activity; }

bool mpi_launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

int mpi_local_size() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* e = std::getenv(name)) return std::max(1, std::atoi(e));
  return 1;
}

Status mpi_init(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return Status();
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) return Status::error(Code::kFailedPrecondition, "MPI_Init_thread", "success", mpi_error(rc));
  g_we_initialized = true;
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_MULTIPLE)
    return Status::error(Code::kUnimplemented, "MPI_Init_thread", "MPI_THREAD_MULTIPLE (device threads call MPI)",
                         "thread level " + std::to_string(provided));
  return Status();
}

void mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized && !finalized) MPI_Finalize();
}

int mpi_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int mpi_world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct MpiCommunicator::Impl {
  MPI_Comm coll = MPI_COMM_NULL;  // collectives
  MPI_Comm p2p = MPI_COMM_NULL;   // send/recv
  MPI_Comm tagged = MPI_COMM_NULL;  // post/take
  int max_tag = 32767;              // MPI_TAG_UB (the standard's least)
  // post(): messages on their way, each with its own copy of the bytes.
  struct Posted {
    std::vector<uint8_t> bytes;
    MPI_Request req = MPI_REQUEST_NULL;
    int peer = 0, tag = 0;
  };
  std::vector<Posted> posted;
  uint64_t posts = 0, takes = 0;
  int rank = 0, size = 1;
  int world_rank = 0;
  CommOptions options;
  uint64_t seq = 0;
  std::vector<uint64_t> sent, received;  // p2p messages per peer
  std::vector<float> work, tmp;          // ring partial sums (f32), grown and reused
  std::vector<uint8_t> blocks;           // direct / exchange receive blocks

  std::mutex mu;
  bool failed = false;
  std::string failure;

  struct Pending {
    int peer = 0;
    bool is_recv = false;
    int64_t bytes = 0;
  };
  std::vector<MPI_Request> reqs;
  std::vector<Pending> pending;

  std::string subject(Collective c, uint64_t n) const {
    return std::string(collective_name(c)) + " #" + std::to_string(n) + " (mpi group '" + options.name + "', rank " +
           std::to_string(rank) + " of " + std::to_string(size) + ")";
  }
  Status check_failed(const std::string& subj) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) return Status();
    return Status::error(Code::kAborted, subj, "a working communicator", "it failed earlier: " + failure);
  }
  Status fail(Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) {
      failed = true;
      failure = s.message();
    }
    return s;
  }
  Status post(bool is_recv, void* buf, int64_t bytes, int peer, int tag, MPI_Comm comm, const std::string& subj,
              bool synchronous = false) {
    if (bytes > INT_MAX)
      return Status::error(Code::kUnimplemented, subj, "messages below 2 GiB", std::to_string(bytes) + " bytes");
    MPI_Request r;
    const int n = static_cast<int>(bytes);
    const int rc = is_recv ? MPI_Irecv(buf, n, MPI_BYTE, peer, tag, comm, &r)
                   : synchronous ? MPI_Issend(buf, n, MPI_BYTE, peer, tag, comm, &r)
                                 : MPI_Isend(buf, n, MPI_BYTE, peer, tag, comm, &r);
    if (rc != MPI_SUCCESS)
      return fail(Status::error(Code::kIoError, subj, std::string(is_recv ? "MPI_Irecv" : "MPI_Isend") + " to succeed",
                                mpi_error(rc)));
    reqs.push_back(r);
    pending.push_back({peer, is_recv, bytes});
    return Status();
  }
  // The subject of a tagged message, and its peer and tag checked.
  Result<std::string> tagged_subject(const char* what, uint64_t n, const char* dir, int peer, int tag) {
    const std::string subj = std::string(what) + " #" + std::to_string(n) + " (tag " + std::to_string(tag) + ") " +
                             dir + " rank " + std::to_string(peer) + " (mpi group '" + options.name + "', rank " +
                             std::to_string(rank) + " of " + std::to_string(size) + ")";
    ASPEN_RETURN_IF_ERROR(check_failed(subj));
    if (peer < 0 || peer >= size || peer == rank)
      return Status::invalid_argument(subj, "a peer in [0, " + std::to_string(size) + ") other than this rank",
                                      std::to_string(peer));
    if (tag < 0 || tag > max_tag)
      return Status::invalid_argument(subj, "a tag in [0, " + std::to_string(max_tag) + "]", std::to_string(tag));
    return subj;
  }
  Status post_send(const void* buf, int64_t bytes, int peer, int tag, const std::string& subj) {
    return post(false, const_cast<void*>(buf), bytes, peer, tag, coll, subj);
  }
  Status post_recv(void* buf, int64_t bytes, int peer, int tag, const std::string& subj) {
    return post(true, buf, bytes, peer, tag, coll, subj);
  }
  // Polls every posted request until all complete, yielding the core between
  // polls once it has waited a little (ranks may share cores).
  Status wait(const std::string& subj, const std::string& step) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + options.timeout;
    set_activity(world_rank, subj, step);
    for (int polls = 0;; ++polls) {
      int done = 0;
      const int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail(Status::error(Code::kIoError, subj, step + " to complete", "MPI_Testall: " + mpi_error(rc)));
      if (done) {
        reqs.clear();
        pending.clear();
        return Status();
      }
      if (polls > 64) sched_yield();
      if ((polls & 127) == 0 && Clock::now() >= deadline) {
        std::string missing;
        for (size_t i = 0; i < reqs.size(); ++i) {
          if (reqs[i] == MPI_REQUEST_NULL) continue;
          const Pending& p = pending[i];
          missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(p.peer) + " (" +
                     (p.is_recv ? "receive of " : "send of ") + std::to_string(p.bytes) + " bytes)";
          if (p.is_recv) MPI_Cancel(&reqs[i]);
        }
        reqs.clear();
        pending.clear();
        return fail(Status::error(Code::kDeadlineExceeded, subj,
                                  step + " to finish within " + std::to_string(options.timeout.count()) + " ms",
                                  "still waiting for " + missing,
                                  "a rank died, hangs, or called collectives in a different order"));
      }
    }
  }
};

MpiCommunicator::MpiCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Posted messages not yet received (the group failed before its flush):
  // MPI may still read their bytes, so those buffers are kept, never freed,
  // with their requests (a few messages, once, on a failure path).
  static std::mutex kept_mu;
  static auto* kept = new std::vector<Impl::Posted>();
  for (auto& p : impl_->posted) {
    int done = 1;
    if (!finalized && p.req != MPI_REQUEST_NULL) MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
    if (done) continue;
    std::lock_guard<std::mutex> lock(kept_mu);
    kept->push_back(std::move(p));
  }
  if (!finalized && !impl_->failed) {
    MPI_Comm_free(&impl_->coll);
    MPI_Comm_free(&impl_->p2p);
    MPI_Comm_free(&impl_->tagged);
  }
}

namespace {
Result<std::unique_ptr<MpiCommunicator::Impl>> make_impl(MPI_Comm base, CommOptions options) {
  auto impl = std::make_unique<MpiCommunicator::Impl>();
  if (options.timeout.count() <= 0)
    return Status::invalid_argument("mpi group '" + options.name + "'", "a timeout > 0 ms",
                                    std::to_string(options.timeout.count()) + " ms");
  int rc = MPI_Comm_dup(base, &impl->coll);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(base, &impl->p2p);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(base, &impl->tagged);
  if (rc != MPI_SUCCESS)
    return Status::error(Code::kIoError, "mpi group '" + options.name + "'", "MPI_Comm_dup to succeed", mpi_error(rc));
  MPI_Comm_set_errhandler(impl->coll, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(impl->p2p, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(impl->tagged, MPI_ERRORS_RETURN);
  void* ub = nullptr;
  int has_ub = 0;
  MPI_Comm_get_attr(impl->tagged, MPI_TAG_UB, &ub, &has_ub);
  if (has_ub && ub) impl->max_tag = *static_cast<int*>(ub);
  MPI_Comm_rank(impl->coll, &impl->rank);
  MPI_Comm_size(impl->coll, &impl->size);
  MPI_Comm_rank(MPI_COMM_WORLD, &impl->world_rank);
  impl->options = std::move(options);
  impl->sent.assign(static_cast<size_t>(impl->size), 0);
  impl->received.assign(static_cast<size_t>(impl->size), 0);
  return impl;
}

Status require_init(const std::string& name) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return Status::error(Code::kFailedPrecondition, "mpi group '" + name + "'", "MPI initialized (mpi_init)",
                         "MPI not initialized");
  return Status();
}
}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::world(CommOptions options) {
  if (options.name == "group") options.name = "world";
  ASPEN_RETURN_IF_ERROR(require_init(options.name));
  ASPEN_ASSIGN_OR_RETURN(auto impl, make_impl(MPI_COMM_WORLD, std::move(options)));
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(impl)));
}

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::split(int color, int key, CommOptions options) {
  ASPEN_RETURN_IF_ERROR(require_init(options.name));
  MPI_Comm part;
  const int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &part);
  if (rc != MPI_SUCCESS)
    return Status::error(Code::kIoError, "mpi group '" + options.name + "'", "MPI_Comm_split to succeed", mpi_error(rc));
  auto impl = make_impl(part, std::move(options));
  MPI_Comm_free(&part);
  if (!impl.is_ok()) return impl.status();
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(impl).value()));
}

int MpiCommunicator::rank() const { return impl_->rank; }
int MpiCommunicator::size() const { return impl_->size; }

void MpiCommunicator::abort(const std::string& reason) {
  (void)impl_->fail(Status::error(Code::kAborted, "mpi group '" + impl_->options.name + "'", "no abort",
                            "rank " + std::to_string(impl_->rank) + " aborted: " + reason));
}

Status MpiCommunicator::do_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  Impl& m = *impl_;
  const std::string subj = m.subject(Collective::all_reduce, ++m.seq);
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  const int n = m.size, r = m.rank;
  const float divisor = op == ReduceOp::mean ? float(n) : 1.0f;
  const int64_t esize = dtype_size(dtype), bytes = count * esize;
  if (n == 1 || count == 0) return Status();
  const int64_t small = m.options.small_bytes >= 0 ? m.options.small_bytes : kDefaultSmallBytes;
  const bool tree = m.options.algorithm == Algorithm::tree ||
                    (m.options.algorithm == Algorithm::automatic && bytes <= small && n > kTreeRanks);
  const bool direct =
      !tree && (m.options.algorithm == Algorithm::direct || (m.options.algorithm == Algorithm::automatic && bytes <= small));
  if (tree) {
    // Up: at distance d, rank r (a multiple of 2d) adds r + d's partial sum
    // after its own; r + d is then done with this half. Partials are f32.
    float* work = static_cast<float*>(data);
    if (dtype != DType::f32) {
      m.work.resize(static_cast<size_t>(count));
      detail::convert(data, dtype, count, m.work.data(), DType::f32);
      work = m.work.data();
    }
    m.tmp.resize(static_cast<size_t>(count));
    int top = 1;
    while (top < n) top *= 2;
    for (int d = 1; d < n; d *= 2) {
      if (r % (2 * d) == d) {
        ASPEN_RETURN_IF_ERROR(m.post_send(work, count * 4, r - d, kTagTreeUp, subj));
        ASPEN_RETURN_IF_ERROR(m.wait(subj, "the tree's send to rank " + std::to_string(r - d)));
        break;
      }
      if (r % (2 * d) == 0 && r + d < n) {
        ASPEN_RETURN_IF_ERROR(m.post_recv(m.tmp.data(), count * 4, r + d, kTagTreeUp, subj));
        ASPEN_RETURN_IF_ERROR(m.wait(subj, "the partial sum from rank " + std::to_string(r + d)));
        const void* parts[2] = {work, m.tmp.data()};
        detail::reduce_rows(parts, DType::f32, count, work, DType::f32, 1.0f);
      }
    }
    if (r == 0) detail::convert(work, DType::f32, count, data, dtype, divisor);  // rounded once
    // Down: the same tree from the top; a rank receives before it passes on.
    for (int d = top / 2; d >= 1; d /= 2) {
      if (r % (2 * d) == 0 && r + d < n) {
        ASPEN_RETURN_IF_ERROR(m.post_send(data, bytes, r + d, kTagTreeDown, subj));
        ASPEN_RETURN_IF_ERROR(m.wait(subj, "the tree's send to rank " + std::to_string(r + d)));
      } else if (r % (2 * d) == d) {
        ASPEN_RETURN_IF_ERROR(m.post_recv(data, bytes, r - d, kTagTreeDown, subj));
        ASPEN_RETURN_IF_ERROR(m.wait(subj, "the result from rank " + std::to_string(r - d)));
      }
    }
    return Status();
  }
  if (direct) {
    m.blocks.resize(static_cast<size_t>(bytes * n));
    for (int k = 0; k < n; ++k) {
      if (k == r) continue;
      ASPEN_RETURN_IF_ERROR(m.post_recv(m.blocks.data() + k * bytes, bytes, k, kTagDirect, subj));
      ASPEN_RETURN_IF_ERROR(m.post_send(data, bytes, k, kTagDirect, subj));
    }
    ASPEN_RETURN_IF_ERROR(m.wait(subj, "the direct exchange"));
    std::vector<const void*> in(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) in[k] = k == r ? data : m.blocks.data() + k * bytes;
    detail::reduce_rows(in, dtype, count, data, dtype, divisor);
    return Status();
  }
  // Ring. Partial sums are f32: for bf16 the message is widened first.
  float* work = static_cast<float*>(data);
  if (dtype != DType::f32) {
    m.work.resize(static_cast<size_t>(count));
    detail::convert(data, dtype, count, m.work.data(), DType::f32);
    work = m.work.data();
  }
  int64_t largest = 0;
  for (int k = 0; k < n; ++k) largest = std::max(largest, detail::chunk_range(count, n, k).size());
  m.tmp.resize(static_cast<size_t>(largest));
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    const detail::Range out = detail::chunk_range(count, n, mod(r - s - 1, n));
    const detail::Range in = detail::chunk_range(count, n, mod(r - s - 2, n));
    ASPEN_RETURN_IF_ERROR(m.post_recv(m.tmp.data(), in.size() * 4, prev, kTagRingReduce, subj));
    ASPEN_RETURN_IF_ERROR(m.post_send(work + out.begin, out.size() * 4, next, kTagRingReduce, subj));
    ASPEN_RETURN_IF_ERROR(m.wait(subj, "ring reduce-scatter step " + std::to_string(s + 1) + " of " +
                                           std::to_string(n - 1)));
    const void* parts[2] = {m.tmp.data(), work + in.begin};
    detail::reduce_rows(parts, DType::f32, in.size(), work + in.begin, DType::f32, 1.0f);
  }
  const detail::Range own = detail::chunk_range(count, n, r);
  detail::convert(work + own.begin, DType::f32, own.size(), detail::at(data, dtype, own.begin), dtype, divisor);
  for (int s = 0; s < n - 1; ++s) {
    const detail::Range out = detail::chunk_range(count, n, mod(r - s, n));
    const detail::Range in = detail::chunk_range(count, n, mod(r - s - 1, n));
    ASPEN_RETURN_IF_ERROR(m.post_recv(detail::at(data, dtype, in.begin), in.size() * esize, prev, kTagRingGather, subj));
    ASPEN_RETURN_IF_ERROR(m.post_send(detail::at(data, dtype, out.begin), out.size() * esize, next, kTagRingGather, subj));
    ASPEN_RETURN_IF_ERROR(m.wait(subj, "ring all-gather step " + std::to_string(s + 1) + " of " + std::to_string(n - 1)));
  }
  return Status();
}

Status MpiCommunicator::do_reduce_scatter(const void* send_buf, void* recv_buf, int64_t recv_count, DType dtype,
                                          ReduceOp op) {
  Impl& m = *impl_;
  const std::string subj = m.subject(Collective::reduce_scatter, ++m.seq);
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  const int n = m.size, r = m.rank;
  const int64_t bytes = recv_count * dtype_size(dtype);
  m.blocks.resize(static_cast<size_t>(bytes * n));
  for (int k = 0; k < n && bytes > 0; ++k) {
    if (k == r) continue;
    ASPEN_RETURN_IF_ERROR(m.post_recv(m.blocks.data() + k * bytes, bytes, k, kTagExchange, subj));
    ASPEN_RETURN_IF_ERROR(m.post_send(detail::at(send_buf, dtype, k * recv_count), bytes, k, kTagExchange, subj));
  }
  ASPEN_RETURN_IF_ERROR(m.wait(subj, "the pairwise exchange"));
  std::vector<const void*> in(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) in[k] = k == r ? detail::at(send_buf, dtype, r * recv_count) : m.blocks.data() + k * bytes;
  detail::reduce_rows(in, dtype, recv_count, recv_buf, dtype, op == ReduceOp::mean ? float(n) : 1.0f);
  return Status();
}

Status MpiCommunicator::do_all_gather(const void* send_buf, void* recv_buf, int64_t send_count, DType dtype) {
  Impl& m = *impl_;
  const std::string subj = m.subject(Collective::all_gather, ++m.seq);
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  const int n = m.size, r = m.rank;
  const int64_t bytes = send_count * dtype_size(dtype);
  std::memmove(detail::at(recv_buf, dtype, r * send_count), send_buf, static_cast<size_t>(bytes));
  for (int k = 0; k < n && bytes > 0; ++k) {
    if (k == r) continue;
    ASPEN_RETURN_IF_ERROR(m.post_recv(detail::at(recv_buf, dtype, k * send_count), bytes, k, kTagExchange, subj));
    ASPEN_RETURN_IF_ERROR(m.post_send(detail::at(recv_buf, dtype, r * send_count), bytes, k, kTagExchange, subj));
  }
  return m.wait(subj, "the pairwise exchange");
}

Status MpiCommunicator::do_broadcast(void* data, int64_t count, DType dtype, int root) {
  Impl& m = *impl_;
  const std::string subj = m.subject(Collective::broadcast, ++m.seq);
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  const int64_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return Status();
  if (m.rank == root) {
    for (int k = 0; k < m.size; ++k)
      if (k != root) ASPEN_RETURN_IF_ERROR(m.post_send(data, bytes, k, kTagBroadcast, subj));
  } else {
    ASPEN_RETURN_IF_ERROR(m.post_recv(data, bytes, root, kTagBroadcast, subj));
  }
  return m.wait(subj, "the broadcast from rank " + std::to_string(root));
}

Status MpiCommunicator::do_send(const void* data, int64_t count, DType dtype, int peer) {
  Impl& m = *impl_;
  const uint64_t id = ++m.sent[static_cast<size_t>(peer)];
  const std::string subj = m.subject(Collective::send, id) + " to rank " + std::to_string(peer);
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  ASPEN_RETURN_IF_ERROR(
      m.post(false, const_cast<void*>(data), count * dtype_size(dtype), peer, 0, m.p2p, subj, /*synchronous=*/true));
  return m.wait(subj, "the matching recv on rank " + std::to_string(peer));
}

Status MpiCommunicator::do_recv(void* data, int64_t count, DType dtype, int peer) {
  Impl& m = *impl_;
  const uint64_t id = ++m.received[static_cast<size_t>(peer)];
  const std::string subj = m.subject(Collective::recv, id) + " from rank " + std::to_string(peer);
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  ASPEN_RETURN_IF_ERROR(m.post(true, data, count * dtype_size(dtype), peer, 0, m.p2p, subj));
  return m.wait(subj, "the matching send from rank " + std::to_string(peer));
}

int MpiCommunicator::max_tag() const { return impl_->max_tag; }

Status MpiCommunicator::post(const void* data, int64_t bytes, int peer, int tag) {
  Impl& m = *impl_;
  ASPEN_ASSIGN_OR_RETURN(const std::string subj, m.tagged_subject("post", ++m.posts, "to", peer, tag));
  if (bytes < 0 || bytes > INT_MAX)
    return Status::error(Code::kUnimplemented, subj, "messages below 2 GiB", std::to_string(bytes) + " bytes");
  // Free what has arrived, so a long schedule keeps only its messages in flight.
  std::erase_if(m.posted, [](Impl::Posted& p) {
    int done = 0;
    MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
  Impl::Posted& p = m.posted.emplace_back();
  p.bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  p.peer = peer;
  p.tag = tag;
  const int rc = MPI_Isend(p.bytes.data(), static_cast<int>(bytes), MPI_BYTE, peer, tag, m.tagged, &p.req);
  if (rc != MPI_SUCCESS) {
    m.posted.pop_back();
    return m.fail(Status::error(Code::kIoError, subj, "MPI_Isend to succeed", mpi_error(rc)));
  }
  return Status();
}

Status MpiCommunicator::take(void* data, int64_t bytes, int peer, int tag) {
  Impl& m = *impl_;
  ASPEN_ASSIGN_OR_RETURN(const std::string subj, m.tagged_subject("take", ++m.takes, "from", peer, tag));
  ASPEN_RETURN_IF_ERROR(m.post(true, data, bytes, peer, tag, m.tagged, subj));
  return m.wait(subj, "the message of tag " + std::to_string(tag) + " from rank " + std::to_string(peer));
}

Status MpiCommunicator::flush() {
  Impl& m = *impl_;
  const std::string subj = "flush of " + std::to_string(m.posted.size()) + " posted messages (mpi group '" +
                           m.options.name + "', rank " + std::to_string(m.rank) + " of " + std::to_string(m.size) + ")";
  ASPEN_RETURN_IF_ERROR(m.check_failed(subj));
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + m.options.timeout;
  set_activity(m.world_rank, subj, "the receivers of posted messages");
  for (int polls = 0; !m.posted.empty(); ++polls) {
    std::erase_if(m.posted, [](Impl::Posted& p) {
      int done = 0;
      MPI_Test(&p.req, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
    if (m.posted.empty()) break;
    if (polls > 64) sched_yield();
    if ((polls & 127) == 0 && Clock::now() >= deadline) {
      std::string missing;
      for (const Impl::Posted& p : m.posted)
        missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(p.peer) + " (tag " +
                   std::to_string(p.tag) + ", " + std::to_string(p.bytes.size()) + " bytes)";
      return m.fail(Status::error(Code::kDeadlineExceeded, subj,
                                  "every message received within " + std::to_string(m.options.timeout.count()) + " ms",
                                  "not yet received by " + missing,
                                  "a rank died, hangs, or runs another schedule"));
    }
  }
  return Status();
}

}  // namespace aspen::parallel
