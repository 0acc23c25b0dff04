// parallel/communicator.h: collectives among the devices of one group.
//
// A Communicator is one device's handle on a group of `size()` devices (a mesh
// axis group, see mesh.h); `rank()` is the device's index in the group. Every
// device of the group calls the same collectives in the same order with the
// same counts and dtype (the threads backend checks this and reports a
// mismatch; MPI trusts it). Backends: `threads` (devices of one process,
// shared memory; threads/threads_communicator.h), `mpi` (one device per
// process, OpenMPI; mpi/mpi_communicator.h); data-parallel training composes
// them hierarchically (data_parallel.h). docs/parallel.md describes the
// algorithms.
//
// The contract:
//  - Element types: f32 and bf16. Reductions accumulate in f32 and a bf16
//    result is rounded (to nearest even) exactly once, after the last
//    addition: partial sums never travel or rest as bf16. ReduceOp::mean is
//    the f32 sum divided by size(), before that rounding.
//  - Layout: reduce_scatter takes size()·recv_count elements and leaves
//    rank r the reduced block r; all_gather writes size() blocks of
//    send_count elements, block r from rank r (rank-major, like NCCL).
//    all_reduce and broadcast work in place. Buffers may not overlap except
//    as stated (reduce_scatter's recv may be block r of its send).
//  - Determinism: every collective adds in an order fixed by the algorithm,
//    the group size and the message size, never by timing, so the same
//    inputs give the same bits on every run, and every rank ends with the
//    same bits. The threads backend (and both backends' small-message path)
//    adds in rank order, ((x0 + x1) + x2) + ..., the order of the naive loop.
//  - Timeouts: no call waits longer than CommOptions::timeout for its peers.
//    One that does returns DeadlineExceeded naming the collective and its
//    sequence number in this group, the rank, and the ranks it was waiting
//    for; the group is then failed and every later call, on any rank,
//    returns Aborted naming the rank that failed and why. abort() fails the
//    group on purpose (a device whose step failed tells its peers at once).
//  - send/recv: rendezvous. send returns once the matching recv (same peer
//    pair, in call order) has the data, like MPI_Ssend, so two devices that
//    both send first would wait for each other until the timeout: a schedule
//    orders its pairs.
//
// Thread-safety: a Communicator belongs to one device thread; its calls are
// not reentrant. Different devices' Communicators run concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::parallel {

enum class ReduceOp { sum, mean };
const char* reduce_op_name(ReduceOp op);

enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, reduce };
const char* collective_name(Collective c);

// How an all-reduce moves data. `direct`: every rank sees every other rank's
// whole message and reduces all of it (few synchronizations: small
// messages). `chunked`: a reduce-scatter (each rank reduces 1/n of the
// message) then an all-gather; over MPI the chunks travel around a ring
// (large messages). `tree`: over MPI, partial sums travel up a binomial tree
// to rank 0 and the result back down it (2·log2(n) steps where direct sends
// n - 1 messages per rank: small messages among many ranks); the threads
// backend, whose ranks share memory, takes the direct path for it.
// `automatic` picks by size (CommOptions::small_bytes) and, over MPI, by
// group size (the tree above kTreeRanks ranks); the others force one path
// (tests, benchmarks, threshold measurements).
enum class Algorithm { automatic, direct, chunked, tree };
const char* algorithm_name(Algorithm a);

struct CommOptions {
  // The longest any call waits for a peer before failing the group.
  std::chrono::milliseconds timeout{std::chrono::seconds(20)};
  Algorithm algorithm = Algorithm::automatic;
  // Messages of at most this many bytes take the small-message path; -1: the
  // backend's measured default (docs/parallel.md).
  int64_t small_bytes = -1;
  // Names the group in error messages, e.g. "data" or "tensor".
  std::string name = "group";
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "threads", "mpi", "hierarchical"

  // In place: data[i] = op over ranks of data[i].
  Status all_reduce(void* data, int64_t count, DType dtype, ReduceOp op);
  // recv[i] = op over ranks of send[rank()·recv_count + i].
  Status reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op);
  // recv[r·send_count + i] = send[i] of rank r.
  Status all_gather(const void* send, void* recv, int64_t send_count, DType dtype);
  // data = data of `root`.
  Status broadcast(void* data, int64_t count, DType dtype, int root);
  Status send(const void* data, int64_t count, DType dtype, int peer);
  Status recv(void* data, int64_t count, DType dtype, int peer);

  // Fails the group: every rank's current or next call returns Aborted with
  // `reason`. Safe to call from any thread.
  virtual void abort(const std::string& reason) = 0;

  // Typed conveniences.
  Status all_reduce(std::span<float> x, ReduceOp op = ReduceOp::sum) {
    return all_reduce(x.data(), static_cast<int64_t>(x.size()), DType::f32, op);
  }
  Status all_reduce(std::span<bf16> x, ReduceOp op = ReduceOp::sum) {
    return all_reduce(x.data(), static_cast<int64_t>(x.size()), DType::bf16, op);
  }

 protected:
  // Called after the arguments were checked (dtype f32 or bf16, counts >= 0,
  // root and peer in range, peer != rank).
  virtual Status do_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual Status do_reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) = 0;
  virtual Status do_all_gather(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  virtual Status do_broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual Status do_send(const void* data, int64_t count, DType dtype, int peer) = 0;
  virtual Status do_recv(void* data, int64_t count, DType dtype, int peer) = 0;

 private:
  Status check(Collective c, int64_t count, DType dtype, int peer) const;
};

}  // namespace aspen::parallel
