// parallel/mpi/mpi_communicator.h: the `mpi` backend (OpenMPI; built when
// CMake finds MPI, ASPEN_HAVE_MPI).
//
// One device per process: a group is an MPI communicator, and our own
// algorithms run over MPI point-to-point calls (MPI_Isend/MPI_Irecv polled
// with MPI_Testall until CommOptions::timeout, never a blocking call):
//  - all_reduce, small messages (direct): every rank sends its whole buffer
//    to every other and sums all n in rank order (the naive loop's bits).
//  - all_reduce, small messages among more than kTreeRanks ranks (tree): a
//    binomial tree, partial sums (f32) up to rank 0, each parent adding its
//    child's after its own ((x0 + x1) + (x2 + x3) for four ranks: a fixed
//    order, not rank order), then the result (rounded once at rank 0) down
//    the same tree.
//  - all_reduce, large messages (chunked): a ring reduce-scatter then a ring
//    all-gather, 2(n-1)/n of the message in and out of each rank, the
//    bandwidth optimum. Partial sums travel as f32, also for bf16 (rounded
//    once by the chunk's owner), so bf16 rings move twice the bytes in the
//    reduce-scatter half. Chunk c is summed starting at rank c+1 around the
//    ring: a fixed order, but not rank order, so its bits differ from the
//    direct path's (within f32 rounding).
//  - reduce_scatter, all_gather: pairwise exchange (each rank sends block k
//    to rank k and receives its own block from everyone): the same bytes as a
//    ring, and sums in rank order.
//  - broadcast: the root sends to every rank. send/recv: MPI_Issend (a send
//    completes when the matching recv has started), one tag per pair.
//
// A peer that does not answer within the timeout gives DeadlineExceeded
// naming the step and the ranks whose messages are outstanding; the
// communicator is then failed (later calls return Aborted). abort() fails
// this process's communicator only: MPI has no way to interrupt a peer, which
// finds out by its own timeout (or the launcher ends the job). A process
// that dies makes mpirun end the job: see docs/parallel.md.
//
// Thread-safety: one Communicator per device thread. MPI is initialized with
// MPI_THREAD_MULTIPLE, so communicators of different threads may be used
// concurrently.
#pragma once

#include <memory>

#include "parallel/communicator.h"

namespace aspen::parallel {

// Initializes MPI once per process (MPI_THREAD_MULTIPLE; errors return
// codes instead of aborting). Safe to call again. Fails when the library
// provides less than MPI_THREAD_MULTIPLE.
Status mpi_init(int* argc, char*** argv);
// Finalizes MPI if mpi_init started it (call once, after every communicator
// is destroyed).
void mpi_finalize();
// True when this process was started by mpirun/mpiexec (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE or PMIX_RANK in the environment).
bool mpi_launched();
int mpi_world_rank();  // after mpi_init
// The processes of this job on this machine, as the launcher says (OpenMPI's OMPI_COMM_WORLD_LOCAL_SIZE,
// MPICH / PMI's MPI_LOCALNRANKS); 1 when it says nothing. Needs no mpi_init.
int mpi_local_size();
// What this process last waited for in a collective or transfer ("on world rank 1, in ..., waiting for
// ..."), or "": a fixed buffer, readable from a signal handler (NOTE [launcher kill]).
const char* mpi_activity();
int mpi_world_size();

class MpiCommunicator final : public Communicator {
 public:
  // The whole job (a duplicate of MPI_COMM_WORLD). Collective over the job.
  static Result<std::unique_ptr<MpiCommunicator>> world(CommOptions options = {});
  // The processes that pass the same `color`, ordered by `key` then world
  // rank (MPI_Comm_split). Collective over the job.
  static Result<std::unique_ptr<MpiCommunicator>> split(int color, int key, CommOptions options = {});
  ~MpiCommunicator() override;

  int rank() const override;
  int size() const override;
  std::string_view backend() const override { return "mpi"; }
  void abort(const std::string& reason) override;

  // Messages of at most this many bytes take the direct path by default, or
  // the tree among more than kTreeRanks ranks.
  static constexpr int64_t kDefaultSmallBytes = 64 << 10;
  static constexpr int kTreeRanks = 8;

  // Tagged, buffered point-to-point, for schedules whose sends must not wait
  // for the receiver (pipeline stages in different processes: a stage sends
  // an activation forward while its neighbour is sending a gradient back).
  // post() copies the message and returns at once; take() waits, up to the
  // timeout, for the message of `tag` from `peer` (messages of one tag and
  // pair arrive in the order posted); flush() waits until every posted
  // message has been received. Tags are in [0, max_tag()]. These use their
  // own MPI communicator, apart from the collectives and send/recv.
  Status post(const void* data, int64_t bytes, int peer, int tag);
  Status take(void* data, int64_t bytes, int peer, int tag);
  Status flush();
  int max_tag() const;

  struct Impl;

 protected:
  Status do_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override;
  Status do_reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override;
  Status do_all_gather(const void* send, void* recv, int64_t send_count, DType dtype) override;
  Status do_broadcast(void* data, int64_t count, DType dtype, int root) override;
  Status do_send(const void* data, int64_t count, DType dtype, int peer) override;
  Status do_recv(void* data, int64_t count, DType dtype, int peer) override;

 private:
  explicit MpiCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace aspen::parallel
