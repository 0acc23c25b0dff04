#include "kernels/peaks.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

namespace {

constexpr int64_t kPeakIters = 30'000'000;  // about 0.1 s per thread

// Keeps the accumulators alive so the loop is not optimized away.
ASPEN_TARGET_AVX512 void store_sink(__m512 s) {
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
}

// 16 independent accumulator chains hide the FMA latency (4 cycles × 2 ports
// needs at least 8). Returns flops done.
ASPEN_TARGET_AVX512 double fma_loop_avx512() {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  store_sink(s);
  return double(kPeakIters) * 16 * 16 * 2;
}

// AVX2 has 16 ymm registers: 12 chains (still more than 2 ports x 4-5 cycles
// of latency) leave room for the two operands. With 16 chains one accumulator
// spilled to the stack every step, and the loop measured 0.65 of the rate the
// GEMM kernels then reached (a peak fraction above 1: a broken ceiling).
constexpr int kAvx2Chains = 12;

ASPEN_TARGET_AVX2 double fma_loop_avx2() {
  __m256 acc[kAvx2Chains];
  for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < kAvx2Chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < kAvx2Chains; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_storeu_ps(out, s);
  volatile float sink = out[0];
  (void)sink;
  return double(kPeakIters) * kAvx2Chains * 8 * 2;
}

ASPEN_TARGET_AVX512_BF16 double dpbf16_loop() {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < kPeakIters; ++it)
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  store_sink(s);
  return double(kPeakIters) * 16 * 32 * 2;  // 32 bf16 pairs per instruction
}

// AMX: each TDPBF16PS multiplies a 16x32 bf16 tile by a 32x16 one into a
// 16x16 f32 tile: 16·16·32·2 flops. Four independent accumulators.
constexpr int64_t kAmxIters = 4'000'000;

__attribute__((target("amx-tile,amx-bf16"))) double amx_loop() {
  // Linux hands out the AMX tile state only on request, per process.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return 0;
  AmxTileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local uint16_t src[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) src[i] = 0x3f80;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (int64_t it = 0; it < kAmxIters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) static thread_local float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile float sink = out[0];
  (void)sink;
  return double(kAmxIters) * 4 * 16 * 16 * 32 * 2;
}

double parallel_rate(int threads, double (*loop)()) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double flops = 0, t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += loop();
    best = std::max(best, flops / (now() - t0));
  }
  return best / 1e9;
}

}  // namespace

double measure_f32_fma_peak(int threads) {
    const Isa best = cpu_features().best;
  if (best >= Isa::avx512) return parallel_rate(threads, fma_loop_avx512);
  if (best >= Isa::avx2) return parallel_rate(threads, fma_loop_avx2);
  return 0;
}

BfPeak measure_bf16_peak(int threads) {
  if (cpu_features().amx_bf16) {
    double amx = parallel_rate(threads, amx_loop);
    if (amx > 0) return {amx, "amx_bf16"};
  }
  if (cpu_features().best < Isa::avx512_bf16) return {0, "none"};
  return {parallel_rate(threads, dpbf16_loop), "avx512_bf16_dot"};
}

namespace {

// OR of every 64-byte line, 8 independent accumulators (one-cycle ops, so the
// loads are the only limit). The result is kept so the loads stay.
// One stream, or (`interleaved`) the range cut into 8 parts read in lockstep,
// one line of each per step: on this host (a VM with long memory latency) the
// hardware prefetchers keep more lines in flight for several streams than for
// one, and the kernels read several rows at once, so a ceiling must too.
ASPEN_TARGET_AVX512 uint64_t sweep_avx512(const char* p, int64_t lines, bool interleaved) {
  __m512i a[8];
  for (__m512i& v : a) v = _mm512_setzero_si512();
  const int64_t part = interleaved ? lines / 8 : 1;  // line distance between the 8 loads of a step
  const int64_t steps = interleaved ? part : lines / 8;
  const int64_t step = interleaved ? 1 : 8;
  for (int64_t i = 0; i < steps; ++i)
    for (int u = 0; u < 8; ++u)
      a[u] = _mm512_or_si512(a[u], _mm512_loadu_si512(reinterpret_cast<const void*>(p + (i * step + u * part) * 64)));
  for (int64_t i = steps * 8; i < lines; ++i)
    a[0] = _mm512_or_si512(a[0], _mm512_loadu_si512(reinterpret_cast<const void*>(p + i * 64)));
  for (int u = 1; u < 8; ++u) a[0] = _mm512_or_si512(a[0], a[u]);
  alignas(64) uint64_t out[8];
  _mm512_store_si512(reinterpret_cast<void*>(out), a[0]);
  return out[0] | out[1] | out[2] | out[3] | out[4] | out[5] | out[6] | out[7];
}

uint64_t sweep_portable(const char* p, int64_t lines) {
  uint64_t acc[8] = {};
  for (int64_t i = 0; i < lines; ++i)
    for (int u = 0; u < 8; ++u) {
      uint64_t v;
      std::memcpy(&v, p + i * 64 + u * 8, 8);
      acc[u] |= v;
    }
  return acc[0] | acc[1] | acc[2] | acc[3] | acc[4] | acc[5] | acc[6] | acc[7];
}

volatile uint64_t g_sweep_sink = 0;

}  // namespace

double read_sweep_seconds(const void* data, size_t bytes, bool interleaved) {
  const char* p = static_cast<const char*>(data);
  const int64_t lines = int64_t(bytes / 64);
  const bool wide = cpu_features().avx512f;
  const double t0 = now();
  uint64_t sink = 0;
#pragma omp parallel reduction(| : sink)
  {
    const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (lines + T - 1) / T, b = std::min(lines, t * per), e = std::min(lines, b + per);
    if (b < e) sink |= wide ? sweep_avx512(p + b * 64, e - b, interleaved) : sweep_portable(p + b * 64, e - b);
  }
  const double t = now() - t0;
  g_sweep_sink = g_sweep_sink | sink;
  return t;
}

double measure_read_bandwidth(size_t bytes) {
  const size_t n = bytes / 64 * 64;
  std::unique_ptr<char[]> buffer(new char[n]);
  std::memset(buffer.get(), 1, n);
  double best = 1e30;
  const auto t0 = std::chrono::steady_clock::now();
  // Both sweeps (one stream and 8 interleaved per thread: which wins depends
  // on the host), alternated, best of at least 5 rounds and half a second.
  for (int round = 0; round < 5 || std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.5;
       ++round)
    for (bool interleaved : {false, true}) best = std::min(best, read_sweep_seconds(buffer.get(), n, interleaved));
  return double(n) / best;
}

}  // namespace aspen::kernels
