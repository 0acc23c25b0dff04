// kernels/logic.h: comparisons and logic, elementwise, with one byte (0 or 1) per boolean output.
//
// compare_forward compares a and b of one type (f32, i32, i64, or bytes: bool and u8) and writes 1
// where the relation holds. NaN compares false with everything (IEEE: equal(NaN, NaN) is 0). The logical
// kernels read bytes as truths (nonzero is true) and write 0 or 1. An output may be the same buffer as an
// input when the element sizes match (bytes in, bytes out).
//
// Determinism: each output element is a function of its inputs alone.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

enum class Compare : int { equal = 0, less = 1, greater = 2 };
enum class Logic : int { logical_and = 0, logical_or = 1 };

template <class T>
[[nodiscard]] Status compare_forward(Compare op, std::span<const T> a, std::span<const T> b, std::span<uint8_t> y,
                                     int64_t N);
[[nodiscard]] Status logic_forward(Logic op, std::span<const uint8_t> a, std::span<const uint8_t> b,
                                   std::span<uint8_t> y, int64_t N);
// y = !x.
[[nodiscard]] Status not_forward(std::span<const uint8_t> x, std::span<uint8_t> y, int64_t N);
// y = x is NaN.
[[nodiscard]] Status is_nan_forward(std::span<const float> x, std::span<uint8_t> y, int64_t N);

}  // namespace aspen::kernels
