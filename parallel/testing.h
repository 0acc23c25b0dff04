// parallel/testing.h: helpers for communicator tests (test-only).
//
// Random inputs per rank and the naive reference of every collective: the
// definitions the backends are checked against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "parallel/communicator.h"

namespace aspen::parallel::testing {

// Bytes of `count` elements of dtype, holding values of mixed magnitude (so
// the order of additions shows in the bits), different for every seed.
inline std::vector<uint8_t> random_buffer(int64_t count, DType dtype, uint64_t seed) {
  std::vector<uint8_t> out(static_cast<size_t>(count * dtype_size(dtype)));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < count; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float mant = float(int32_t(s >> 33) % 100000) / 100000.0f;   // (-1, 1)
    const float v = mant * float(1 << ((s >> 20) % 12));               // 2^0 .. 2^11
    if (dtype == DType::f32)
      std::memcpy(out.data() + i * 4, &v, 4);
    else {
      bf16 h = f32_to_bf16(v);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

inline float get(const std::vector<uint8_t>& b, DType t, int64_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, b.data() + i * 4, 4);
    return f;
  }
  bf16 h;
  std::memcpy(&h, b.data() + i * 2, 2);
  return bf16_to_f32(h);
}

// The naive reduction of elements [offset, offset + count) of every rank's
// buffer: added in f32 in rank order, divided for mean, rounded once.
inline std::vector<uint8_t> naive_reduce(const std::vector<std::vector<uint8_t>>& in, DType t, int64_t offset,
                                         int64_t count, ReduceOp op) {
  std::vector<uint8_t> out(static_cast<size_t>(count * dtype_size(t)));
  for (int64_t i = 0; i < count; ++i) {
    float acc = get(in[0], t, offset + i);
    for (size_t k = 1; k < in.size(); ++k) acc += get(in[k], t, offset + i);
    if (op == ReduceOp::mean) acc /= float(in.size());
    if (t == DType::f32)
      std::memcpy(out.data() + i * 4, &acc, 4);
    else {
      bf16 h = f32_to_bf16(acc);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

// Largest |a - b| / max(1, |b|) over the elements (for algorithms that add in another order).
inline double max_rel_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType t) {
  double worst = 0;
  const int64_t n = int64_t(a.size()) / dtype_size(t);
  for (int64_t i = 0; i < n; ++i) {
    const double x = get(a, t, i), y = get(b, t, i);
    const double d = (x - y) / std::max(1.0, std::abs(y));
    worst = std::max(worst, std::abs(d));
    if (x != x || y != y) return 1e30;
  }
  return worst;
}

}  // namespace aspen::parallel::testing
