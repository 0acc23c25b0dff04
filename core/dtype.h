// core/dtype.h: the element types aspen knows, from one table.
//
// ASPEN_DTYPES is the only list: it drives the enum, the names, the sizes and
// the safetensors names. The enum values reach disk (executable cache,
// checkpoints): they are pinned; append new types, never renumber.
//
// bf16 and f16 are storage types (16 bits); arithmetic happens in f32. The
// scalar conversions here round to nearest even; vectorized and stochastic
// rounding conversions live in kernels/convert.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace aspen {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

//        name  C++ type  size  safetensors  pinned value
#define ASPEN_DTYPES(X)          \
  X(f32, float, 4, "F32", 0)     \
  X(bf16, bf16, 2, "BF16", 1)    \
  X(f16, f16, 2, "F16", 2)       \
  X(i32, int32_t, 4, "I32", 3)   \
  X(i64, int64_t, 8, "I64", 4)   \
  X(u8, uint8_t, 1, "U8", 5)     \
  X(boolean, bool, 1, "BOOL", 6)

enum class DType : uint8_t {
#define ASPEN_DTYPE_ENUM(name, type, size, st, value) name = value,
  ASPEN_DTYPES(ASPEN_DTYPE_ENUM)
#undef ASPEN_DTYPE_ENUM
};

inline constexpr int kNumDTypes = 0
#define ASPEN_DTYPE_COUNT(name, type, size, st, value) +1
    ASPEN_DTYPES(ASPEN_DTYPE_COUNT)
#undef ASPEN_DTYPE_COUNT
    ;

// Size of one element in bytes.
constexpr int dtype_size(DType t) {
  switch (t) {
#define ASPEN_DTYPE_SIZE(name, type, size, st, value) \
  case DType::name: return size;
    ASPEN_DTYPES(ASPEN_DTYPE_SIZE)
#undef ASPEN_DTYPE_SIZE
  }
  return 0;
}

// The float element types: f32, bf16, f16.
constexpr bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// "f32", "bf16", ... ("bool" for boolean).
std::string_view dtype_name(DType t);
// "F32", "BF16", ... as in safetensors headers.
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);

// Maps a C++ element type to its DType: dtype_of<float>() == DType::f32.
template <class T>
constexpr DType dtype_of();
#define ASPEN_DTYPE_OF(name, type, size, st, value) \
  template <>                                       \
  constexpr DType dtype_of<type>() {                \
    return DType::name;                             \
  }
ASPEN_DTYPES(ASPEN_DTYPE_OF)
#undef ASPEN_DTYPE_OF

// Scalar conversions, round to nearest even; NaN stays NaN (quiet), infinities stay.
inline float bf16_to_f32(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
float f16_to_f32(f16 h);
f16 f32_to_f16(float f);

}  // namespace aspen
