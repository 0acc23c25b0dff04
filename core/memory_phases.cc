#include "core/memory_phases.h"

#include <cstdio>
#include <cstring>
#include <mutex>

namespace aspen {

namespace {

constexpr size_t kKept = 200;

std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::vector<MemoryPhase>& phases() {
  static auto* p = new std::vector<MemoryPhase>;  // never destroyed: notes may come during exit
  return *p;
}

}  // namespace

MemoryPhase memory_now(std::string name) {
  MemoryPhase m{std::move(name)};
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss = kb * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.high_water = kb * 1024;
  }
  std::fclose(f);
  return m;
}

void note_memory_phase(std::string name) {
  MemoryPhase m = memory_now(std::move(name));
  std::lock_guard<std::mutex> lock(mu());
  if (phases().size() < kKept) phases().push_back(std::move(m));
  else phases().back() = std::move(m);
}

std::vector<MemoryPhase> memory_phases() {
  std::lock_guard<std::mutex> lock(mu());
  return phases();
}

}  // namespace aspen
