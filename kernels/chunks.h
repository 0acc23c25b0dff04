// kernels/chunks.h: how the row and elementwise kernels split work (private to
// kernels/).
//
// A kernel body handles a half-open range [begin, end) of elements or rows.
// ASPEN_STAMP_VARIANTS compiles it three times (AVX-512, AVX2, portable), and
// <body>_run picks the variant for active_isa() and runs it over fixed-size
// chunks spread over the calling thread's OpenMP team. The chunks are the
// same on one thread or many, so results do not depend on the team size.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu.h"

namespace aspen::kernels::chunks {

template <class A>
using RangeFn = void (*)(const A&, int64_t, int64_t);

template <class A>
RangeFn<A> pick(RangeFn<A> avx512, RangeFn<A> avx2, RangeFn<A> portable) {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return avx512;
  if (isa == Isa::avx2) return avx2;
  return portable;
}

// Below this many elements in all, a fork/join costs more than it saves.
inline constexpr int64_t kParallelMin = 1 << 16;

// Runs fn over [0, n) in chunks of `grain` items of `item` elements each.
template <class A>
void run_chunks(RangeFn<A> fn, const A& a, int64_t n, int64_t grain, int64_t item) {
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1 || n * item < kParallelMin) {
    for (int64_t k = 0; k < chunks; ++k) fn(a, k * grain, std::min(n, (k + 1) * grain));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) fn(a, k * grain, std::min(n, (k + 1) * grain));
}

// A deterministic column reduction: per-chunk partial sums [blocks, C] are
// added in block order. out[c] = sum over blocks k of partial[k, c]; this body
// handles columns [c0, c1) (stamp it with ASPEN_STAMP_VARIANTS).
struct ColSum {
  const float* partial;
  float* out;
  int64_t blocks, C;
};
inline __attribute__((always_inline)) void col_sum(const ColSum& a, int64_t c0, int64_t c1) {
  float* out = a.out;
#pragma omp simd
  for (int64_t c = c0; c < c1; ++c) out[c] = a.partial[c];
  for (int64_t k = 1; k < a.blocks; ++k) {
    const float* p = a.partial + k * a.C;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) out[c] += p[c];
  }
}

}  // namespace aspen::kernels::chunks

#define ASPEN_STAMP_VARIANTS(body, A)                                                         \
  ASPEN_TARGET_AVX512 void body##_avx512(const A& a, int64_t b, int64_t e) { body(a, b, e); } \
  ASPEN_TARGET_AVX2 void body##_avx2(const A& a, int64_t b, int64_t e) { body(a, b, e); }     \
  void body##_portable(const A& a, int64_t b, int64_t e) { body(a, b, e); }                   \
  void body##_run(const A& a, int64_t n, int64_t grain, int64_t item) {                       \
    ::aspen::kernels::chunks::run_chunks(                                                     \
        ::aspen::kernels::chunks::pick<A>(body##_avx512, body##_avx2, body##_portable), a, n, grain, item); \
  }
