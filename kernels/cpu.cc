#include "kernels/cpu.h"

#include <algorithm>
#include <atomic>

namespace aspen::kernels {

namespace {
std::atomic<int> g_cap{int(Isa::avx512_bf16)};
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
  f.amx_bf16 = __builtin_cpu_supports("amx-bf16");
  unsigned eax, ebx, ecx, edx;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  f.f16c = (ecx >> 29) & 1u;
  if (f.avx2 && f.fma && f.f16c) f.best = Isa::avx2;
  if (f.best == Isa::avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) f.best = Isa::avx512;
  if (f.best == Isa::avx512 && f.avx512_bf16) f.best = Isa::avx512_bf16;
  return f;
}
}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_bf16: return "avx512_bf16";
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
  add(amx_bf16, "amx_bf16");
  return s + " (best: " + isa_name(best) + ")";
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa active_isa() { return Isa(std::min(int(cpu_features().best), g_cap.load(std::memory_order_relaxed))); }
Isa set_isa_cap(Isa cap) { return Isa(g_cap.exchange(int(cap))); }
bool reference_mode() { return g_reference.load(std::memory_order_relaxed); }
bool set_reference_mode(bool on) { return g_reference.exchange(on); }

}  // namespace aspen::kernels
