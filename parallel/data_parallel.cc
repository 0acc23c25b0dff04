#include "parallel/data_parallel.h"

#include "core/file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "parallel/reduce.h"

#ifdef ASPEN_HAVE_MPI
#include "parallel/mpi/mpi_communicator.h"
#endif

namespace aspen::parallel {

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::none: return "none";
    case Compression::bf16: return "bf16";
    case Compression::topk: return "topk";
  }
  return "?";
}

namespace {

// A u64 as the bits of two f32 elements: all_gather only copies, so any bit
// pattern travels unchanged.
void pack(uint64_t h, float* out) { std::memcpy(out, &h, sizeof h); }
uint64_t unpack(const float* in) {
  uint64_t h;
  std::memcpy(&h, in, sizeof h);
  return h;
}
}  // namespace

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (char c : s) h = (h ^ uint64_t(uint8_t(c))) * 1099511628211ull;
  return h;
}

Status check_same_everywhere(Communicator& comm, uint64_t value, const std::string& what, const std::string& shown) {
  std::vector<float> mine(2), all(size_t(2 * comm.size()));
  pack(value, mine.data());
  ASPEN_RETURN_IF_ERROR(comm.all_gather(mine.data(), all.data(), 2, DType::f32));
  for (int r = 0; r < comm.size(); ++r)
    if (unpack(all.data() + 2 * r) != value)
      return Status::invalid_argument(
          what + " on process " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()),
          shown.empty() ? std::string("the same on every process") : "the same on every process (" + shown + " here)",
          "process " + std::to_string(r) + " differs" +
              (shown.empty() ? std::string() : " (" + std::to_string(unpack(all.data() + 2 * r)) + ")"),
          "start every rank with the same config, options and model");
  return Status();
}

Status check_same_fields(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields,
                         const std::string& what) {
  std::string names;
  for (const auto& [name, value] : fields) names += name + "\n";
  // The same list of fields first (a rank of another build or config would gather a different length):
  // one collective whatever the lists hold, so ranks that differ here never wait on each other.
  ASPEN_RETURN_IF_ERROR(check_same_everywhere(comm, fnv1a(names), what + ": the list of names",
                                              std::to_string(fields.size()) + " names"));
  const size_t n = fields.size();
  std::vector<float> mine(2 * n), all(2 * n * size_t(comm.size()));
  for (size_t f = 0; f < n; ++f) pack(fnv1a(fields[f].second), mine.data() + 2 * f);
  ASPEN_RETURN_IF_ERROR(comm.all_gather(mine.data(), all.data(), int64_t(2 * n), DType::f32));
  for (size_t f = 0; f < n; ++f)
    for (int r = 0; r < comm.size(); ++r)
      if (unpack(all.data() + 2 * n * size_t(r) + 2 * f) != fnv1a(fields[f].second))
        return Status::invalid_argument(
            what + " '" + fields[f].first + "' on process " + std::to_string(comm.rank()) + " of " +
                std::to_string(comm.size()),
            "the same on every process (" + escape_for_terminal(fields[f].second) + " here)",
            "process " + std::to_string(r) + " differs", "start every process with the same config, data and model");
  return Status();
}

DataParallelGroup::~DataParallelGroup() = default;

Result<std::unique_ptr<DataParallelGroup>> DataParallelGroup::create(const DataParallelOptions& options) {
  if (options.local < 1)
    return Status::invalid_argument("data parallel: local replicas", ">= 1", std::to_string(options.local));
  if (options.bucket_bytes < 4)
    return Status::invalid_argument("data parallel: bucket_bytes", ">= 4", std::to_string(options.bucket_bytes));
  if (options.compression == Compression::topk && !(options.topk_ratio > 0.0 && options.topk_ratio <= 1.0))
    return Status::invalid_argument("data parallel: topk_ratio", "in (0, 1]", std::to_string(options.topk_ratio));
  std::unique_ptr<DataParallelGroup> g(new DataParallelGroup());
  g->options_ = options;
  CommOptions local = options.comm;
  local.name = options.comm.name + " (threads)";
  ASPEN_ASSIGN_OR_RETURN(g->local_, make_threads_group(options.local, local));
  if (options.mpi) {
#ifdef ASPEN_HAVE_MPI
    ASPEN_RETURN_IF_ERROR(mpi_init(nullptr, nullptr));
    CommOptions cross = options.comm;
    cross.name = options.comm.name + " (mpi)";
    // Making a communicator is collective over the job (MPI_Comm_dup or
    // MPI_Comm_split), so every process makes them, also when its group has
    // one process; the first checks the layout before the others are made (a
    // process with another replica count would wait in them forever).
    auto make = [&]() -> Result<std::unique_ptr<MpiCommunicator>> {
      if (options.mpi_color < 0) return MpiCommunicator::world(cross);
      return MpiCommunicator::split(options.mpi_color, mpi_world_rank(), cross);
    };
    ASPEN_ASSIGN_OR_RETURN(auto first, make());
    g->processes_ = first->size();
    g->process_ = first->rank();
    if (g->processes_ > 1)
      ASPEN_RETURN_IF_ERROR(check_same_everywhere(*first, uint64_t(options.local), "data parallel: replicas per process",
                                                  std::to_string(options.local)));
    g->cross_.push_back(std::move(first));
    for (int l = 1; l < options.local; ++l) {
      ASPEN_ASSIGN_OR_RETURN(auto c, make());
      g->cross_.push_back(std::move(c));
    }
    if (g->processes_ == 1) g->cross_.clear();
#else
    return Status::unimplemented("data parallel over MPI", "build (this one was built without MPI; install OpenMPI "
                                 "with scripts/install-deps.sh and rebuild)");
#endif
  }
  g->bucket_.resize(size_t(options.local));
  g->bucket16_.resize(size_t(options.local));
  g->residual_.resize(size_t(options.local));
  return g;
}

Status DataParallelGroup::reduce_to_owners(int l, std::span<float* const> tensors, std::span<const int64_t> counts,
                                           std::span<const int> owner) {
  if (local() > 1)
    for (size_t i = 0; i < tensors.size(); ++i)
      ASPEN_RETURN_IF_ERROR(local_[size_t(l)]->reduce(tensors[i], counts[i], DType::f32, ReduceOp::sum, owner[i]));
  if (cross_.empty()) return Status();
  std::vector<float*> mine;
  std::vector<int64_t> mine_counts;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (owner[i] == l) mine.push_back(tensors[i]), mine_counts.push_back(counts[i]);
  return all_reduce_cross(l, mine, mine_counts);
}

Status DataParallelGroup::all_reduce(int l, std::span<float* const> tensors, std::span<const int64_t> counts) {
  if (local() > 1)
    for (size_t i = 0; i < tensors.size(); ++i)
      ASPEN_RETURN_IF_ERROR(local_[size_t(l)]->all_reduce(std::span<float>(tensors[i], size_t(counts[i]))));
  if (cross_.empty()) return Status();
  return all_reduce_cross(l, tensors, counts);  // each local replica over its own communicator: the same sums
}

std::vector<Bucket> pack_buckets(std::span<const int64_t> counts, int64_t bucket_bytes, bool large_alone) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);
  std::vector<Bucket> out;
  Bucket open;  // tensors [open.first, i), open.elements of them
  auto flush = [&](size_t end) {
    if (open.elements == 0) return;
    open.end = end;
    out.push_back(open);
    open = Bucket{};
  };
  for (size_t i = 0; i < counts.size(); ++i) {
    if (large_alone && counts[i] >= cap) {  // a bucket of its own, in place
      flush(i);
      out.push_back({.first = i, .end = i + 1, .elements = counts[i], .in_place = true});
      continue;
    }
    if (open.elements > 0 && open.elements + counts[i] > cap) flush(i);
    if (open.elements == 0) open.first = i;
    open.elements += counts[i];
  }
  flush(counts.size());
  return out;
}

Status DataParallelGroup::for_each_bucket(int l, std::span<float* const> tensors, std::span<const int64_t> counts,
                                          bool large_alone, const std::function<Status(float*, int64_t)>& fn) {
  std::vector<float>& bucket = bucket_[size_t(l)];
  for (const Bucket& b : pack_buckets(counts, options_.bucket_bytes, large_alone)) {
    if (b.in_place) {
      ASPEN_RETURN_IF_ERROR(fn(tensors[b.first], b.elements));
      continue;
    }
    bucket.resize(size_t(b.elements));
    int64_t at = 0;
    for (size_t k = b.first; k < b.end; ++k) {
      std::memcpy(bucket.data() + at, tensors[k], size_t(counts[k]) * 4);
      at += counts[k];
    }
    ASPEN_RETURN_IF_ERROR(fn(bucket.data(), b.elements));
    at = 0;
    for (size_t k = b.first; k < b.end; ++k) {
      std::memcpy(tensors[k], bucket.data() + at, size_t(counts[k]) * 4);
      at += counts[k];
    }
  }
  return Status();
}

Status DataParallelGroup::all_reduce_cross(int l, std::span<float* const> tensors, std::span<const int64_t> counts) {
  Communicator& comm = *cross_[size_t(l)];
  std::vector<bf16>& bucket16 = bucket16_[size_t(l)];
  size_t bucket_index = 0;
  return for_each_bucket(l, tensors, counts, /*large_alone=*/options_.compression == Compression::none,
                         [&](float* data, int64_t n) -> Status {
                           switch (options_.compression) {
                             case Compression::none: return comm.all_reduce(data, n, DType::f32, ReduceOp::sum);
                             case Compression::topk: return all_reduce_topk(l, bucket_index++, data, n);
                             case Compression::bf16: break;
                           }
                           bucket16.resize(size_t(n));
                           detail::convert(data, DType::f32, n, bucket16.data(), DType::bf16);
                           ASPEN_RETURN_IF_ERROR(comm.all_reduce(bucket16.data(), n, DType::bf16, ReduceOp::sum));
                           detail::convert(bucket16.data(), DType::bf16, n, data, DType::f32);
                           return Status();
                         });
}

// Top-k with error feedback, on one bucket of local replica l: v = values +
// residual; the k entries of largest |v| (ties to the lower index: the same
// choice on every run) travel as (index, value) pairs, all-gathered; every
// process adds the pairs in process order into zeros, so all get the same
// bits; the residual keeps what was not sent.
Status DataParallelGroup::all_reduce_topk(int l, size_t bucket, float* values, int64_t count) {
  std::vector<std::vector<float>>& res = residual_[size_t(l)];
  if (res.size() <= bucket) res.resize(bucket + 1);
  std::vector<float>& residual = res[bucket];
  const size_t n = size_t(count);
  if (residual.size() != n) residual.assign(n, 0.0f);
  std::vector<float> r(n);  // v = values + residual
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    r[i] = values[i] + residual[i];
    finite = finite && std::isfinite(r[i]);
  }
  const size_t k = std::clamp<size_t>(size_t(std::ceil(options_.topk_ratio * double(n))), 1, n);
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = uint32_t(i);
  auto key = [&](uint32_t i) {  // NaN ranks first, as +inf: a strict weak order still
    const float x = std::abs(r[i]);
    return std::isnan(x) ? std::numeric_limits<float>::infinity() : x;
  };
  auto larger = [&](uint32_t a, uint32_t b) {
    const float x = key(a), y = key(b);
    return x > y || (x == y && a < b);
  };
  std::nth_element(order.begin(), order.begin() + std::ptrdiff_t(k - 1), order.end(), larger);
  std::sort(order.begin(), order.begin() + std::ptrdiff_t(k));  // by index
  std::vector<float> mine(2 * k);
  for (size_t j = 0; j < k; ++j) {
    const uint32_t i = order[j];
    std::memcpy(&mine[2 * j], &i, 4);  // the index's bits: all_gather only copies
    mine[2 * j + 1] = r[i];
    r[i] = 0.0f;  // sent: no longer owed
  }
  // An overflowing step (non-finite gradients) is skipped by the caller: the
  // residual stays as it was, and the non-finite entries travel so that every
  // process sees the overflow.
  if (finite) residual = std::move(r);
  std::vector<float> all(mine.size() * size_t(processes_));
  ASPEN_RETURN_IF_ERROR(cross_[size_t(l)]->all_gather(mine.data(), all.data(), int64_t(mine.size()), DType::f32));
  std::fill(values, values + n, 0.0f);
  for (int p = 0; p < processes_; ++p)
    for (size_t j = 0; j < k; ++j) {
      uint32_t i;
      std::memcpy(&i, &all[(size_t(p) * k + j) * 2], 4);
      if (i >= n) return Status::error(Code::kCorrupt, "top-k all-gather", "indices below " + std::to_string(n),
                                       std::to_string(i) + " from process " + std::to_string(p));
      values[i] += all[(size_t(p) * k + j) * 2 + 1];
    }
  return Status();
}

Status DataParallelGroup::broadcast_from(int l, std::span<float* const> tensors, std::span<const int64_t> counts,
                                         int root) {
  if (cross_.empty()) return Status();
  Communicator& comm = *cross_[size_t(l)];
  return for_each_bucket(l, tensors, counts, /*large_alone=*/true,
                         [&](float* data, int64_t n) { return comm.broadcast(data, n, DType::f32, root); });
}

Result<std::vector<float>> DataParallelGroup::gather_processes(std::span<const float> mine) {
  if (cross_.empty()) return std::vector<float>(mine.begin(), mine.end());
  std::vector<float> all(mine.size() * size_t(processes_));
  ASPEN_RETURN_IF_ERROR(cross_[0]->all_gather(mine.data(), all.data(), int64_t(mine.size()), DType::f32));
  return all;
}

Status DataParallelGroup::check_same(int l, uint64_t hash, const std::string& what) {
  if (cross_.empty() || l != 0) return Status();
  return check_same_everywhere(*cross_[0], hash, what, "");
}

void DataParallelGroup::abort(int l, const std::string& reason) {
  local_[size_t(l)]->abort(reason);
  if (!cross_.empty()) cross_[size_t(l)]->abort(reason);
}

}  // namespace aspen::parallel
