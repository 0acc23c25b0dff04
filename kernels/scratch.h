// kernels/scratch.h: per-thread scratch for an op's temporary copies (operands widened from bf16 / f16,
// tensors in another layout) that the op's kernel makes and drops within one run.
//
// Slot k of the calling thread holds at least the bytes asked for, 64-byte aligned, grown as needed and kept
// for the thread's life (its contents are not kept across a call that grows it). Kernels of a program run
// one at a time on their device's leader thread and never nest, so each may use any slots; a kernel must
// not hold a slot across a call to another kernel that takes slots. (Plans that pack inside parallel
// regions keep their own per-worker scratch: kernels/matmul_aspen.cc.)
#pragma once

#include <cstddef>
#include <cstdint>

namespace aspen::kernels {

inline constexpr int kScratchSlots = 8;

// nullptr when the memory cannot be had.
void* op_scratch(int slot, size_t bytes);
// The bytes every thread's slots hold now (the profile's memory view names them).
int64_t op_scratch_bytes();
template <class T>
T* op_scratch_of(int slot, int64_t n) {
  return static_cast<T*>(op_scratch(slot, size_t(n) * sizeof(T)));
}

}  // namespace aspen::kernels
