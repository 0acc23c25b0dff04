#include "core/weight_copies.h"

#include <unistd.h>

#include <atomic>

namespace aspen {

namespace {
std::atomic<int64_t> g_taken{0};
std::atomic<int64_t> g_kernel_copies{0};
}  // namespace

void count_kernel_copy_bytes(int64_t delta) { g_kernel_copies.fetch_add(delta, std::memory_order_relaxed); }
int64_t kernel_copy_bytes() { return g_kernel_copies.load(std::memory_order_relaxed); }

int64_t weight_copy_budget() {
  static const int64_t budget = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) / 4 : int64_t(1) << 30;
  }();
  return budget;
}

bool take_weight_copy_bytes(int64_t bytes) {
  if (bytes <= 0) return true;
  int64_t now = g_taken.load(std::memory_order_relaxed);
  while (true) {
    if (now + bytes > weight_copy_budget()) return false;
    if (g_taken.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed)) return true;
  }
}

void give_weight_copy_bytes(int64_t bytes) {
  if (bytes > 0) g_taken.fetch_sub(bytes, std::memory_order_relaxed);
}

int64_t weight_copy_bytes() { return g_taken.load(std::memory_order_relaxed); }

}  // namespace aspen
