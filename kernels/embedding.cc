#include "kernels/embedding.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

// ---------------------------------------------------------------------------
// Reference: the definition.
namespace ref {
template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t N, int64_t V, int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = table[int64_t(ids[n]) * C + c];
}
template <class T>
void embedding_backward(const int32_t* ids, const T* dout, T* dtable, int64_t N, int64_t V, int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) dtable[int64_t(ids[n]) * C + c] += dout[n * C + c];
}

template void embedding_forward<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t);
template void embedding_forward<double>(const int32_t*, const double*, double*, int64_t, int64_t, int64_t);
template void embedding_backward<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t);
template void embedding_backward<double>(const int32_t*, const double*, double*, int64_t, int64_t, int64_t);
}  // namespace ref

// ---------------------------------------------------------------------------
// Fast path.
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements moved; below this one thread is faster
constexpr int64_t kColumnGroup = 16;       // a thread's columns start on a 64-byte boundary of the row

// d[0, len) += g[0, len)
using AddFn = void (*)(float* d, const float* g, int64_t len);

[[gnu::always_inline]] inline void add_body(float* d, const float* g, int64_t len) {
  for (int64_t c = 0; c < len; ++c) d[c] += g[c];
}
void add_scalar(float* d, const float* g, int64_t len) { add_body(d, g, len); }
ASPEN_TARGET_AVX2 void add_avx2(float* d, const float* g, int64_t len) { add_body(d, g, len); }
ASPEN_TARGET_AVX512 void add_avx512(float* d, const float* g, int64_t len) {
  int64_t c = 0;
  for (; c + 16 <= len; c += 16) _mm512_storeu_ps(d + c, _mm512_add_ps(_mm512_loadu_ps(d + c), _mm512_loadu_ps(g + c)));
  if (c < len) {
    const __mmask16 m = __mmask16((1u << (len - c)) - 1);
    _mm512_mask_storeu_ps(d + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d + c), _mm512_maskz_loadu_ps(m, g + c)));
  }
}

AddFn pick_add() {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return add_avx512;
  if (isa == Isa::avx2) return add_avx2;
  return add_scalar;
}

void forward_fast(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
  if (C == 0) return;  // spans may be null
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * C, table + int64_t(ids[n]) * C, size_t(C) * sizeof(float));
}

// Each thread owns a contiguous block of column groups and walks every n in
// ascending order: each dtable element sees its additions in the reference's
// order whatever the thread count.
void backward_fast(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C) {
  const AddFn add = pick_add();
  const int64_t groups = (C + kColumnGroup - 1) / kColumnGroup;
#pragma omp parallel if (N * C >= kParallelMin)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = std::min(C, groups * t / nt * kColumnGroup);
    const int64_t c1 = std::min(C, groups * (t + 1) / nt * kColumnGroup);
    if (c1 > c0)
      for (int64_t n = 0; n < N; ++n) add(dtable + int64_t(ids[n]) * C + c0, dout + n * C + c0, c1 - c0);
  }
}

Status check_embedding(const char* kernel, std::span<const int32_t> ids, const char* in_name, std::span<const float> in,
                       int64_t in_rows, const char* out_name, std::span<float> out, int64_t out_rows, int64_t N,
                       int64_t V, int64_t C) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "N", N));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "V", V));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "C", C));
  const std::string k(kernel);
  int64_t in_n = 0, out_n = 0;
  if (__builtin_mul_overflow(in_rows, C, &in_n) || __builtin_mul_overflow(out_rows, C, &out_n))
    return Status::invalid_argument(
        k + ": shape", "N·C and V·C to fit in int64",
        "N = " + std::to_string(N) + ", V = " + std::to_string(V) + ", C = " + std::to_string(C));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "ids", ids, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, in_name, in, in_n));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, out_name, out, out_n));
  for (int64_t n = 0; n < N; ++n)
    if (ids[size_t(n)] < 0 || ids[size_t(n)] >= V)
      return Status::error(Code::kOutOfRange, k + ": argument 'ids'",
                           "every id in [0, V) = [0, " + std::to_string(V) + ")",
                           "ids[" + std::to_string(n) + "] = " + std::to_string(ids[size_t(n)]));
  return Status();
}

}  // namespace

Status embedding_forward(std::span<const int32_t> ids, std::span<const float> table, std::span<float> out, int64_t N,
                         int64_t V, int64_t C) {
  ASPEN_RETURN_IF_ERROR(check_embedding("embedding_forward", ids, "table", table, V, "out", out, N, N, V, C));
  if (reference_mode())
    ref::embedding_forward<float>(ids.data(), table.data(), out.data(), N, V, C);
  else
    forward_fast(ids.data(), table.data(), out.data(), N, C);
  return Status();
}

Status embedding_backward(std::span<const int32_t> ids, std::span<const float> dout, std::span<float> dtable, int64_t N,
                          int64_t V, int64_t C) {
  ASPEN_RETURN_IF_ERROR(check_embedding("embedding_backward", ids, "dout", dout, N, "dtable", dtable, V, N, V, C));
  if (reference_mode())
    ref::embedding_backward<float>(ids.data(), dout.data(), dtable.data(), N, V, C);
  else
    backward_fast(ids.data(), dout.data(), dtable.data(), N, C);
  return Status();
}

}  // namespace aspen::kernels
