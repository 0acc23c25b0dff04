// kernels/peaks.h: what this machine can do, measured in the calling process: the ceilings the benches
// compare against and the profiles' roofline (docs/profile.md) divides by.
#pragma once

#include <cstddef>

namespace aspen::kernels {

// Peak arithmetic rates in GFLOP/s, measured on `threads` threads (OpenMP); about 0.3 s each.
double measure_f32_fma_peak(int threads);  // FMA on the widest vectors this CPU runs
// bf16 products: AMX tiles where the CPU and kernel allow them, else
// AVX512-BF16 dot products; {0, "none"} without either.
struct BfPeak {
  double gflops;
  const char* kind;
};
BfPeak measure_bf16_peak(int threads);

// Read bandwidth in bytes/s: the best of several read_sweep_seconds passes
// (both kinds) over a buffer of `bytes`, on the calling thread's OpenMP team.
// The ceiling of a decode step, which streams its weights.
double measure_read_bandwidth(size_t bytes);

// One read-only pass over [data, data + bytes) on the calling thread's OpenMP
// team: each thread sweeps a contiguous share with vector loads (AVX-512 where
// the CPU has it) and nothing is written. Returns the seconds it took. This is
// the ceiling of anything that streams weights (decode): best of several
// passes over a buffer larger than the last-level cache. With `interleaved`,
// each thread reads its share as 8 streams in lockstep (take the better of
// both: which wins depends on the host).
double read_sweep_seconds(const void* data, size_t bytes, bool interleaved = false);

}  // namespace aspen::kernels
