// core/tensor.h: an owning, contiguous host tensor.
//
// Storage is 64-byte aligned (one cache line, one AVX-512 register) and
// zero-initialized. A Tensor is move-only; copy explicitly with clone().
// A view (Tensor::view) borrows memory someone else owns instead: a numpy
// array handed to the Python package, read as a run's input without a copy.
// Typed access checks the dtype: data<float>() on a bf16 tensor is a bug.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "core/check.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace aspen {

inline constexpr size_t kTensorAlignment = 64;

class Tensor {
 public:
  Tensor() = default;
  // Allocates numel × dtype_size bytes, zeroed. Fails (not aborts) on overflow
  // or when the allocation is refused.
  static Result<Tensor> make(DType dtype, Shape shape);
  // As make(), without zeroing: for a buffer its maker writes completely (a run's outputs, 26 MB of
  // GPT-2's logits, where the zeroing alone costs a pass over memory).
  static Result<Tensor> make_uninitialized(DType dtype, Shape shape);
  // Contiguous memory at `data` that the caller owns and keeps alive (and, when
  // the view is only read, need not be writable), any alignment: nothing is
  // allocated, copied or freed. For inputs, which the runtime copies into its
  // arena (runtime/session.h); clone() makes an owning copy.
  static Tensor view(DType dtype, Shape shape, void* data);
  bool owns_data() const { return data_.get_deleter().owned; }
  // As make(), for sizes that are known good; aborts on failure.
  Tensor(DType dtype, Shape shape);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor clone() const;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }

  void* raw() { return data_.get(); }
  const void* raw() const { return data_.get(); }
  template <class T>
  T* data() {
    ASPEN_CHECK(dtype_of<T>() == dtype_) << "data<" << dtype_name(dtype_of<T>()) << "> of a " << dtype_name(dtype_) << " tensor";
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    ASPEN_CHECK(dtype_of<T>() == dtype_) << "data<" << dtype_name(dtype_of<T>()) << "> of a " << dtype_name(dtype_) << " tensor";
    return static_cast<const T*>(raw());
  }
  template <class T>
  std::span<T> span() { return {data<T>(), size_t(numel())}; }
  template <class T>
  std::span<const T> span() const { return {data<T>(), size_t(numel())}; }

 private:
  static Result<Tensor> allocate(DType dtype, Shape shape, bool zero);
  struct Free {
    constexpr Free() noexcept : owned(true) {}
    explicit constexpr Free(bool own, size_t n = 0) noexcept : owned(own), bytes(n) {}
    bool owned;        // false: a view's
    size_t bytes = 0;  // the block's size, rounded (owned: it may go back to the block cache)
    void operator()(void* p) const;
  };
  DType dtype_ = DType::f32;
  Shape shape_;
  std::unique_ptr<void, Free> data_;
};

// 64-byte aligned, zeroed allocation of `bytes` (rounded up to 64); nullptr on
// failure. Release with aligned_free.
void* aligned_alloc_zeroed(size_t bytes);
void aligned_free(void* p);
// The bytes of freed tensors' blocks held for reuse (NOTE [tensor block cache], core/tensor.cc): resident
// memory no plan holds (the profile names it).
size_t tensor_block_cache_bytes();

}  // namespace aspen
