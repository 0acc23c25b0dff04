// parallel/data_parallel.h: the communication of data-parallel training.
//
// A DataParallelGroup is every replica of one data-parallel job: `local()`
// replicas in this process (devices on their own threads) times
// `processes()` processes of an MPI job (one when not launched by mpirun).
// Replica l of process p is global replica p·local() + l.
//
// Gradients are reduced hierarchically (DESIGN.md, "Data parallel"):
//  1. inside the process, each tensor is summed over the local replicas into
//     the copy of the local replica that owns it (ThreadsCommunicator::reduce:
//     every replica sums one chunk, in rank order, straight from its peers'
//     buffers);
//  2. across processes, each owner all-reduces its tensors with the owners of
//     the same local index in the other processes (MPI), in buckets of
//     `bucket_bytes`, optionally compressed: sent as bf16, or as the top-k
//     entries of each bucket by magnitude with error feedback (what is not
//     sent is added to the next step's gradient, Stich et al. 2018);
//  3. there is no broadcast back: weights and optimizer state are shared by
//     the replicas of a process, and each owner's optimizer step updates its
//     own tensors (ZeRO-1's division of the work, with one copy per process).
// Every sum runs in an order fixed by the group's shape, so a rerun of the
// same layout gives the same bits. Ownership is the caller's (contiguous
// shards of the parameter list, train/program.h).
//
// Failures: a replica whose step fails calls abort(), and its peers' next
// collective returns kAborted instead of waiting (in this process at once;
// other processes by their timeout, or when mpirun ends the job).
//
// Thread-safety: the calls for local replica l are made on l's thread; the
// local replicas' calls run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/threads/threads_communicator.h"

namespace aspen::parallel {

enum class Compression { none, bf16, topk };

// Fails unless every rank of `comm` passes the same `value` (an all-gather);
// the error names `what`, this rank and the first rank that differs, and
// shows `shown` (this rank's value as the user knows it) when not empty.
Status check_same_everywhere(Communicator& comm, uint64_t value, const std::string& what,
                             const std::string& shown = "");
// As above for named values (name -> the value as text): the names first (one
// collective whatever each rank holds, so ranks with other lists never wait on
// each other; the error says how many this rank has), then the values: the
// error names `what`, the first field that differs ("what 'name' on process r
// of n"), this rank's value and the first rank whose value differs.
Status check_same_fields(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields,
                         const std::string& what);
const char* compression_name(Compression c);
// FNV-1a of `s` continuing from `h`: the hashes processes compare at start-up.
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull);

// One cross-process all-reduce of tensors [first, end) of a list, packed into
// a bucket (or, in_place, a tensor at least a bucket large reduced alone).
struct Bucket {
  size_t first = 0, end = 0;
  int64_t elements = 0;
  bool in_place = false;
  bool operator==(const Bucket&) const = default;
};
// How DataParallelGroup packs tensors of `counts` f32 elements: in order, a
// bucket closed when the next tensor would take it past bucket_bytes; with
// large_alone, a tensor of bucket_bytes or more alone and in place.
std::vector<Bucket> pack_buckets(std::span<const int64_t> counts, int64_t bucket_bytes, bool large_alone);

struct DataParallelOptions {
  int local = 1;        // replicas in this process
  bool mpi = false;     // join the processes of this MPI job (mpi_init first; needs ASPEN_HAVE_MPI)
  // With mpi: >= 0 joins only the processes that pass the same color (their
  // replicas of one pipeline stage or tensor shard when a model spans
  // processes), ordered by world rank; -1: every process of the job.
  int mpi_color = -1;
  int64_t bucket_bytes = int64_t(25) << 20;  // cross-process all-reduce buckets (DDP's bucket_cap_mb)
  Compression compression = Compression::none;  // of the cross-process all-reduce
  // topk: the fraction of each bucket's entries sent (at least one), in (0, 1].
  double topk_ratio = 0.01;
  // ZeRO-1 (PopTorch's replicated tensor sharding) across processes: each
  // process keeps and updates the optimizer state of its own shards only and
  // broadcasts their new weights. Inside a process the replicas already share
  // one copy of the state and split the update (api/training_model.h).
  bool shard_optimizer_state = false;
  // Reduce each bucket as soon as the step's last backward pass has finished
  // its gradients, while the pass goes on (train/runner_overlap.cc), rather
  // than after it. The same sums either way.
  bool overlap = true;
  CommOptions comm;     // timeout and names
};

class DataParallelGroup {
 public:
  static Result<std::unique_ptr<DataParallelGroup>> create(const DataParallelOptions& options);
  ~DataParallelGroup();

  int local() const { return options_.local; }
  int processes() const { return processes_; }
  int process() const { return process_; }
  int replicas() const { return options_.local * processes_; }
  int global_replica(int l) const { return process_ * options_.local + l; }
  const DataParallelOptions& options() const { return options_; }

  // On local replica l: tensors[i] (counts[i] f32 elements, this replica's
  // copy) summed over every replica of the job into the copy of local
  // replica owner[i] (the same owners in every process). Other copies keep
  // their own values.
  Status reduce_to_owners(int l, std::span<float* const> tensors, std::span<const int64_t> counts,
                          std::span<const int> owner);
  // On local replica l: tensors[i] summed over every replica of the job into
  // every replica's copy (inside the process, then across processes): for
  // replicas that each update their own copy of the weights (data parallel
  // over tensor shards).
  Status all_reduce(int l, std::span<float* const> tensors, std::span<const int64_t> counts);
  // Local replica l's `tensors` (f32) made equal to process `root`'s copies,
  // over the communicator of local index l, in buckets of bucket_bytes (the
  // weights of an optimizer-state shard after its owner's step, ZeRO-1). On
  // l's thread, or on any one thread between the replicas' calls.
  Status broadcast_from(int l, std::span<float* const> tensors, std::span<const int64_t> counts, int root);
  // Every process's `mine` (the same length everywhere), process-major.
  // Between the replicas' calls (it uses local replica 0's communicator).
  Result<std::vector<float>> gather_processes(std::span<const float> mine);
  // On local replica l: fails unless every process passes the same `hash`;
  // the error names `what`, this process and the first that differs.
  Status check_same(int l, uint64_t hash, const std::string& what);
  // Fails the group for every replica (see the file comment).
  void abort(int l, const std::string& reason);

 private:
  DataParallelGroup() = default;
  Status all_reduce_cross(int l, std::span<float* const> tensors, std::span<const int64_t> counts);

  DataParallelOptions options_;
  int processes_ = 1, process_ = 0;
  std::vector<std::unique_ptr<ThreadsCommunicator>> local_;
  std::vector<std::unique_ptr<Communicator>> cross_;  // by local index; empty with one process
  std::vector<std::vector<float>> bucket_;            // by local index: the cross-process bucket
  std::vector<std::vector<bf16>> bucket16_;           // by local index: its bf16 form
  // topk: by local index, the error feedback of each bucket of its tensors
  // (what was not sent), in the order the buckets are reduced.
  std::vector<std::vector<std::vector<float>>> residual_;
  Status all_reduce_topk(int l, size_t bucket, float* values, int64_t count);
  // Packs `tensors` into buckets of bucket_bytes (a tensor at least that
  // large alone and in place, when large_alone), runs fn on each bucket in
  // order, and copies the buckets back.
  Status for_each_bucket(int l, std::span<float* const> tensors, std::span<const int64_t> counts, bool large_alone,
                         const std::function<Status(float* data, int64_t count)>& fn);
};

}  // namespace aspen::parallel
