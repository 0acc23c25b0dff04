#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/file.h"

namespace aspen {

namespace {

size_t rounded_size(size_t bytes) {
  const size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  return rounded == 0 ? kTensorAlignment : rounded;
}

// NOTE [tensor block cache]: the blocks of large tensors, freed, are kept for the next tensor of the same
// size instead of going back to malloc. A loop that makes the same tensors every step (a program's outputs,
// a pipeline's stashed activations and transfers, made on one stage's thread and freed on another's) got
// fresh blocks from glibc each time: a large block is an mmap, or the top of a thread's heap that free()
// trims, so every step faulted its pages in again (the PopTorch pipelining tutorial's 2-stage run: ~330
// page faults, about a sixth of its time, per micro-batch). Exact sizes only (a step's shapes repeat); at most
// 1/16 of the machine's memory (and 1 GiB) is held; smaller blocks stay with malloc, which reuses them well.
// Not under a sanitizer: a reused block would hide a use after free.
class BlockCache {
 public:
  static constexpr size_t kMin = size_t(64) << 10;

  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  void* take(size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    free_.erase(it);
    held_ -= rounded;
    return p;
  }
  // False: not kept (the caller frees it).
  bool give(void* p, size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_ + rounded > limit()) return false;
    free_.emplace(rounded, p);
    held_ += rounded;
    return true;
  }

 private:
  static size_t limit() {
    static const size_t l = [] {
      const double memory = physical_memory_bytes();
      const double cap = double(size_t(1) << 30);
      return size_t(memory > 0 ? std::min(cap, memory / 16) : cap);
    }();
    return l;
  }
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t held_ = 0;
};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)  // GCC's
#define ASPEN_SANITIZED 1
#elif defined(__has_feature)  // clang's (the fuzz preset)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ASPEN_SANITIZED 1
#endif
#endif
#ifdef ASPEN_SANITIZED
constexpr bool kCacheBlocks = false;
#else
constexpr bool kCacheBlocks = true;
#endif

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;  // never destroyed: tensors may be freed during exit
  return *cache;
}

void* aligned_alloc_rounded(size_t bytes, bool zero) {
  // More than the machine has is refused here (null: the caller's Status), not left to the allocator, which
  // may promise it (overcommit) and end the process when it is touched, or abort (sanitizers).
  if (const double memory = physical_memory_bytes(); memory > 0 && double(bytes) > memory) return nullptr;
  const size_t rounded = rounded_size(bytes);
  void* p = kCacheBlocks && rounded >= BlockCache::kMin ? block_cache().take(rounded) : nullptr;
  if (!p) p = std::aligned_alloc(kTensorAlignment, rounded);
  if (p && zero) std::memset(p, 0, rounded);
  return p;
}
}  // namespace

void* aligned_alloc_zeroed(size_t bytes) { return aligned_alloc_rounded(bytes, true); }

void aligned_free(void* p) { std::free(p); }

size_t tensor_block_cache_bytes() { return kCacheBlocks ? block_cache().held() : 0; }

void Tensor::Free::operator()(void* p) const {
  if (!owned || !p) return;
  if (kCacheBlocks && bytes >= BlockCache::kMin && block_cache().give(p, bytes)) return;
  aligned_free(p);
}

Tensor Tensor::view(DType dtype, Shape shape, void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.data_ = std::unique_ptr<void, Free>(data, Free(false));
  return t;
}

Result<Tensor> Tensor::allocate(DType dtype, Shape shape, bool zero) {
  int64_t n = shape.numel();
  if (n < 0 || uint64_t(n) > (uint64_t(1) << 60) / uint64_t(dtype_size(dtype)))
    return Status::invalid_argument("tensor " + shape.to_string(), "a size that fits in memory", "an overflow");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  const size_t bytes = size_t(n) * dtype_size(dtype);
  t.data_ = std::unique_ptr<void, Free>(aligned_alloc_rounded(bytes, zero), Free(true, rounded_size(bytes)));
  if (!t.data_)
    return Status::error(Code::kFailedPrecondition, "tensor " + shape.to_string() + " " + std::string(dtype_name(dtype)),
                         std::to_string(bytes) + " bytes of memory", "the allocation refused");
  return t;
}

Result<Tensor> Tensor::make(DType dtype, Shape shape) { return allocate(dtype, shape, true); }
Result<Tensor> Tensor::make_uninitialized(DType dtype, Shape shape) { return allocate(dtype, shape, false); }

Tensor::Tensor(DType dtype, Shape shape) {
  Result<Tensor> r = make(dtype, shape);
  ASPEN_CHECK(r.is_ok()) << r.status().to_string();
  *this = std::move(r).value();
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

}  // namespace aspen
