#include "kernels/scratch.h"

#include <cstdlib>

#include "core/check.h"

namespace aspen::kernels {

void* op_scratch(int slot, size_t bytes) {
  struct Slot {
    void* p = nullptr;
    size_t bytes = 0;
    ~Slot() { std::free(p); }
  };
  thread_local Slot slots[kScratchSlots];
  ASPEN_CHECK(slot >= 0 && slot < kScratchSlots) << "op_scratch: slot " << slot;
  Slot& s = slots[slot];
  if (bytes > s.bytes) {
    std::free(s.p);
    s.bytes = (bytes + 63) / 64 * 64;
    s.p = std::aligned_alloc(64, s.bytes);
    if (!s.p) s.bytes = 0;
  }
  return s.p;
}

}  // namespace aspen::kernels
