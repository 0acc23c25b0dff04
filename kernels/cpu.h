// kernels/cpu.h: CPU features, kernel dispatch, and the reference switch.
//
// Every kernel has a reference version (its definition, plain loops) and a
// fast version. The fast version may exist in several instruction-set
// variants; each variant is a function compiled with ASPEN_TARGET_* so the
// rest of the binary stays baseline x86-64 and runs anywhere. Which variant
// runs is decided per call from active_isa():
//   - the best ISA this CPU has (detected once),
//   - lowered by set_isa_cap() (tests and benchmarks use this to run every
//     variant on one machine),
//   - and reference_mode() routes every kernel to its reference version.
//
// Thread-safety: the switches are atomics; flipping them while kernels run
// on other threads is allowed but each call sees one value.
#pragma once

#include <cstdint>
#include <string>

namespace aspen::kernels {

// amx: AVX512-BF16 plus AMX-BF16 tiles the OS granted this process (Linux
// hands the tile state out on request: arch_prctl(ARCH_REQ_XCOMP_PERM)). Only
// the bf16 matrix product has an AMX variant; every other kernel runs its
// AVX-512 one there.
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, amx = 4 };
const char* isa_name(Isa isa);

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, amx_bf16 = false;
  // Int8 dot products (VPDPBUSD) on AVX-512 registers and, with avx512vl, on 256-bit ones: the quantized
  // products' (kernels/quant.h) only use, on Isa::avx512 and above.
  bool avx512_vnni = false;
  bool amx_granted = false;  // the OS gave this process the tile state
  Isa best = Isa::scalar;
  std::string to_string() const;  // "avx2 fma avx512f ... (best: avx512_bf16)"
};
const CpuFeatures& cpu_features();
// The CPU's name as Linux reports it (/proc/cpuinfo's first "model name"), or "unknown".
const std::string& cpu_model_name();

// The data caches one core sees, in bytes: its own L1d and L2 and the L3 it
// shares. From /sys/devices/system/cpu/cpu0/cache (what the kernel read from
// cpuid), else sysconf, else 32 KiB / 1 MiB / 8 MiB. Kernels size their
// blocking from these (NOTE [gemm blocking] in matmul_aspen.cc).
struct CpuCaches {
  int64_t l1d = 32 << 10, l2 = 1 << 20, l3 = 8 << 20;
  std::string to_string() const;  // "L1d 32 KiB, L2 512 KiB, L3 32 MiB"
};
const CpuCaches& cpu_caches();

// The ISA kernels use now: min(cpu_features().best, cap).
Isa active_isa();
// Caps the ISA (Isa::amx = no cap). Returns the previous cap.
Isa set_isa_cap(Isa cap);

bool reference_mode();
// Routes every kernel to its reference version. Returns the previous value.
bool set_reference_mode(bool on);

// RAII forms, for tests and benchmarks.
class ScopedReferenceMode {
 public:
  explicit ScopedReferenceMode(bool on) : saved_(set_reference_mode(on)) {}
  ~ScopedReferenceMode() { set_reference_mode(saved_); }

 private:
  bool saved_;
};
class ScopedIsaCap {
 public:
  explicit ScopedIsaCap(Isa cap) : saved_(set_isa_cap(cap)) {}
  ~ScopedIsaCap() { set_isa_cap(saved_); }

 private:
  Isa saved_;
};

// The 64-byte operand of LDTILECFG (Intel SDM, "AMX tile configuration"):
// palette 1, then each tile's bytes per row and rows. Shared by the AMX GEMM
// (kernels/matmul_amx.cc) and the bench's AMX peak loop (bench/common.cc).
struct AmxTileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed));
static_assert(sizeof(AmxTileConfig) == 64);

// Palette 1 with all eight tiles 16 rows of 64 bytes: the shape aspen's AMX
// kernels use (kernels/matmul_amx.cc, kernels/attention_amx.cc). A global built
// once: GCC 12 does not see LDTILECFG read the whole struct, and removed the
// stores to a local one as dead.
const AmxTileConfig& amx_tiles_16x64();

}  // namespace aspen::kernels

// Function attributes for ISA variants. Only call a function so marked after
// checking active_isa().
#define ASPEN_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ASPEN_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define ASPEN_TARGET_AVX512_BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
