// train/runner_util.h: small helpers shared by the Runner's source files
// (runner.cc, runner_step.cc, runner_walk.cc); private to train/.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "train/program.h"

namespace aspen::train::util {

inline bool has_prefix(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
// A model weight: not "optimizer.*", "train.*" or "state.*".
inline bool is_weight(const std::string& name) { return !train::is_state_name(name); }

// One FNV-1a step over a 64-bit value (parallel::fnv1a hashes text): the hashes processes compare at start-up.
inline uint64_t fnv1a_mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

inline Tensor scalar_f32(float v) {
  Tensor t(DType::f32, Shape{});
  t.data<float>()[0] = v;
  return t;
}

inline Shape shape_of(const std::vector<int64_t>& dims) { return Shape::make(dims.data(), int(dims.size())).value(); }

// [lead, ...per]
inline Shape prepend(int64_t lead, const Shape& per) {
  std::vector<int64_t> dims = {lead};
  dims.insert(dims.end(), per.begin(), per.end());
  return shape_of(dims);
}

// Rows [first, first + count) of `t` seen as [N, ...per]; shape [count, ...per],
// or per itself when count is 1 and squeeze.
inline Tensor rows(const Tensor& t, const Shape& per, int64_t first, int64_t count, bool squeeze) {
  Tensor out(t.dtype(), squeeze && count == 1 ? per : prepend(count, per));
  const size_t row = size_t(per.numel()) * dtype_size(t.dtype());
  if (out.nbytes()) std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + size_t(first) * row, size_t(count) * row);
  return out;
}

}  // namespace aspen::train::util
