#include "parallel/reduce.h"

#include <algorithm>
#include <cstring>

namespace aspen::parallel::detail {

namespace {
constexpr int64_t kBlock = 1024;  // elements summed per pass: 4 KiB of f32 stays in L1

inline void load(const void* p, DType t, int64_t n, float* dst) {
  if (t == DType::f32) {
    std::memcpy(dst, p, static_cast<size_t>(n) * 4);
  } else {
    const bf16* s = static_cast<const bf16*>(p);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  }
}
inline void add(const void* p, DType t, int64_t n, float* acc) {
  if (t == DType::f32) {
    const float* s = static_cast<const float*>(p);
    for (int64_t i = 0; i < n; ++i) acc[i] += s[i];
  } else {
    const bf16* s = static_cast<const bf16*>(p);
    for (int64_t i = 0; i < n; ++i) acc[i] += bf16_to_f32(s[i]);
  }
}
inline void store(const float* acc, int64_t n, void* p, DType t, float divisor) {
  if (t == DType::f32) {
    float* d = static_cast<float*>(p);
    if (divisor != 1.0f) {
      for (int64_t i = 0; i < n; ++i) d[i] = acc[i] / divisor;
    } else {
      std::memcpy(d, acc, static_cast<size_t>(n) * 4);
    }
  } else {
    bf16* d = static_cast<bf16*>(p);
    if (divisor != 1.0f) {
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(acc[i] / divisor);
    } else {
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(acc[i]);
    }
  }
}
}  // namespace

Range chunk_range(int64_t count, int n, int i) {
  auto boundary = [&](int k) {
    if (k >= n) return count;
    const int64_t b = count / n * k + std::min<int64_t>(k, count % n);
    return std::min(count, (b + kChunkAlign - 1) / kChunkAlign * kChunkAlign);
  };
  return Range{boundary(i), boundary(i + 1)};
}

void reduce_rows(std::span<const void* const> in, DType in_dtype, int64_t count, void* out, DType out_dtype,
                 float divisor) {
  alignas(64) float acc[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    load(at(in[0], in_dtype, b), in_dtype, n, acc);
    for (size_t k = 1; k < in.size(); ++k) add(at(in[k], in_dtype, b), in_dtype, n, acc);
    store(acc, n, at(out, out_dtype, b), out_dtype, divisor);
  }
}

void reduce_rows_to_all(std::span<const void* const> in, DType in_dtype, int64_t count, std::span<void* const> outs,
                        DType out_dtype, float divisor) {
  alignas(64) float acc[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    load(at(in[0], in_dtype, b), in_dtype, n, acc);
    for (size_t k = 1; k < in.size(); ++k) add(at(in[k], in_dtype, b), in_dtype, n, acc);
    for (void* out : outs) store(acc, n, at(out, out_dtype, b), out_dtype, divisor);
  }
}

void convert(const void* in, DType in_dtype, int64_t count, void* out, DType out_dtype, float divisor) {
  if (in_dtype == out_dtype && divisor == 1.0f) {
    if (in != out) std::memmove(out, in, static_cast<size_t>(count) * dtype_size(in_dtype));
    return;
  }
  const void* one[1] = {in};
  reduce_rows(one, in_dtype, count, out, out_dtype, divisor);
}

}  // namespace aspen::parallel::detail
