#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/file.h"

namespace aspen {

namespace {
void* aligned_alloc_rounded(size_t bytes, bool zero) {
  // More than the machine has is refused here (null: the caller's Status), not left to the allocator, which
  // may promise it (overcommit) and end the process when it is touched, or abort (sanitizers).
  if (const double memory = physical_memory_bytes(); memory > 0 && double(bytes) > memory) return nullptr;
  size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (rounded == 0) rounded = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, rounded);
  if (p && zero) std::memset(p, 0, rounded);
  return p;
}
}  // namespace

void* aligned_alloc_zeroed(size_t bytes) { return aligned_alloc_rounded(bytes, true); }

void aligned_free(void* p) { std::free(p); }

void Tensor::Free::operator()(void* p) const {
  if (owned) aligned_free(p);
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
  t.data_.reset(aligned_alloc_rounded(size_t(n) * dtype_size(dtype), zero));
  if (!t.data_)
    return Status::error(Code::kFailedPrecondition, "tensor " + shape.to_string() + " " + std::string(dtype_name(dtype)),
                         std::to_string(size_t(n) * dtype_size(dtype)) + " bytes of memory", "the allocation refused");
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
