#include "kernels/scratch.h"

#include <atomic>
#include <cstdlib>

#include "core/check.h"

namespace aspen::kernels {

namespace {
std::atomic<int64_t> g_scratch_bytes{0};
}  // namespace

int64_t op_scratch_bytes() { return g_scratch_bytes.load(std::memory_order_relaxed); }

void* op_scratch(int slot, size_t bytes) {
  struct Slot {
    void* p = nullptr;
    size_t bytes = 0;
    ~Slot() {
      std::free(p);
      g_scratch_bytes.fetch_sub(int64_t(bytes), std::memory_order_relaxed);
    }
  };
  thread_local Slot slots[kScratchSlots];
  ASPEN_CHECK(slot >= 0 && slot < kScratchSlots) << "op_scratch: slot " << slot;
  Slot& s = slots[slot];
  if (bytes > s.bytes) {
    std::free(s.p);
    const size_t had = s.bytes;
    s.bytes = (bytes + 63) / 64 * 64;
    s.p = std::aligned_alloc(64, s.bytes);
    if (!s.p) s.bytes = 0;
    g_scratch_bytes.fetch_add(int64_t(s.bytes) - int64_t(had), std::memory_order_relaxed);
  }
  return s.p;
}

}  // namespace aspen::kernels
