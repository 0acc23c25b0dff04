// kernels/attention_avx2.h: the AVX2 + FMA block operations of attention (private to kernels/attention*.cc;
// defined in attention_avx2.cc). For CPUs without AVX-512 (Zen 2 and 3, Haswell to Comet Lake); call only
// when active_isa() >= Isa::avx2.
#pragma once

#include <immintrin.h>

#include "kernels/attention_internal.h"
#include "kernels/cpu.h"

namespace aspen::kernels::attn {

struct Avx2 {
  // NOTE [attention fused strips]: AVX-512 only (16 rows' reductions in one transpose need 16 lanes).
  static bool fused_tile(const float*, const float*, const float*, int64_t, int64_t, int64_t, const int*, const int*,
                         const float*, float*, float*, float*) {
    return false;
  }
  ASPEN_TARGET_AVX2 static void gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
                                     int64_t ldc, int64_t m, int64_t n, int64_t kk, bool accumulate);
  ASPEN_TARGET_AVX2 static void transpose(const float* src, int64_t cols, int64_t D, float* dst);
  // NOTE [attention avx2 tiles]: a full tile's rows in registers, 8 rows' reductions at a time.
  ASPEN_TARGET_AVX2 static void softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                             const float* kv, float* m, float* l, float* o, int64_t D, bool partial);
  ASPEN_TARGET_AVX2 static void decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                                           const uint8_t* valid, int64_t D, float cs, float* out, float* lse);
  ASPEN_TARGET_AVX2 static void grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo, const int* hi,
                                          const float* kv, const float* lse2, const float* di, float cs);
};

}  // namespace aspen::kernels::attn
