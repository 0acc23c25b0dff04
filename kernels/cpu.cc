#include "kernels/cpu.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

namespace aspen::kernels {

namespace {
std::atomic<int> g_cap{int(Isa::amx)};
std::atomic<bool> g_reference{false};

CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = true;  // checked below through cpuid-backed builtins where GCC knows them
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
  f.amx_bf16 = __builtin_cpu_supports("amx-bf16");
  unsigned eax, ebx, ecx, edx;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  f.f16c = (ecx >> 29) & 1u;
  if (f.avx2 && f.fma && f.f16c) f.best = Isa::avx2;
  if (f.best == Isa::avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) f.best = Isa::avx512;
  if (f.best == Isa::avx512 && f.avx512_bf16) f.best = Isa::avx512_bf16;
  if (f.best == Isa::avx512_bf16 && f.amx_bf16 && __builtin_cpu_supports("amx-tile")) {
    // Linux gives a process the AMX tile state only when it asks (once, for all its threads).
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    if (f.amx_granted) f.best = Isa::amx;
  }
  return f;
}
}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::amx:
      return "amx";
  }
  return "?";
}

std::string CpuFeatures::to_string() const {
  std::string s;
  auto add = [&](bool on, const char* n) {
    if (on) s += std::string(s.empty() ? "" : " ") + n;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_vnni, "avx512_vnni");
  add(amx_bf16, "amx_bf16");
  if (amx_bf16 && !amx_granted) s += " (amx tile state refused by the OS)";
  return s + " (best: " + isa_name(best) + ")";
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

namespace {

// The data (or unified) cache of `level` as /sys writes its size ("48K",
// "2048K", "32M"); 0 when unreadable.
int64_t sys_cache_bytes(int level) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream lf(dir + "level"), tf(dir + "type"), sf(dir + "size");
    int l = 0;
    std::string type, size;
    if (!(lf >> l) || !(tf >> type) || !(sf >> size)) return 0;
    if (l != level || (type != "Data" && type != "Unified")) continue;
    char* end = nullptr;
    const long long v = std::strtoll(size.c_str(), &end, 10);
    if (v <= 0) return 0;
    const char unit = end ? *end : 0;
    return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
  }
  return 0;
}

CpuCaches detect_caches() {
  CpuCaches c;
  const int64_t defaults[3] = {c.l1d, c.l2, c.l3};
  const int names[3] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE};
  int64_t* out[3] = {&c.l1d, &c.l2, &c.l3};
  for (int i = 0; i < 3; ++i) {
    int64_t v = sys_cache_bytes(i + 1);
    if (v <= 0) v = sysconf(names[i]);
    // A guest may report its host's figures or nothing; keep them sane.
    *out[i] = v >= 4096 && v <= (int64_t(1) << 34) ? v : defaults[i];
  }
  return c;
}

std::string bytes_text(int64_t v) {
  return v % (1 << 20) == 0 ? std::to_string(v >> 20) + " MiB" : std::to_string(v >> 10) + " KiB";
}

}  // namespace

std::string CpuCaches::to_string() const {
  return "L1d " + bytes_text(l1d) + ", L2 " + bytes_text(l2) + ", L3 " + bytes_text(l3);
}

const CpuCaches& cpu_caches() {
  static const CpuCaches c = detect_caches();
  return c;
}

Isa active_isa() { return Isa(std::min(int(cpu_features().best), g_cap.load(std::memory_order_relaxed))); }
Isa set_isa_cap(Isa cap) { return Isa(g_cap.exchange(int(cap))); }
bool reference_mode() { return g_reference.load(std::memory_order_relaxed); }
bool set_reference_mode(bool on) { return g_reference.exchange(on); }

namespace {
AmxTileConfig make_tiles_16x64() {
  AmxTileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}
alignas(64) const AmxTileConfig kTiles16x64 = make_tiles_16x64();
}  // namespace

const AmxTileConfig& amx_tiles_16x64() { return kTiles16x64; }

const std::string& cpu_model_name() {
  static const std::string name = [] {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("model name", 0) == 0) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          const size_t start = line.find_first_not_of(" \t", colon + 1);
          if (start != std::string::npos) return line.substr(start);
        }
      }
    return std::string("unknown");
  }();
  return name;
}

}  // namespace aspen::kernels
