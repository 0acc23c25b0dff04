#include "core/dtype.h"

namespace aspen {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
#define ASPEN_DTYPE_ST(name, type, size, st, value) \
  case DType::name: return st;
    ASPEN_DTYPES(ASPEN_DTYPE_ST)
#undef ASPEN_DTYPE_ST
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtype_name(DType(i)) == name) return DType(i);
  return std::nullopt;
}

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (dtype_safetensors_name(DType(i)) == name) return DType(i);
  return std::nullopt;
}

// IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float f16_to_f32(f16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);  // inf or quiet NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | uint32_t(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (a < 0x33000000u) return f16{sign};  // below half the smallest subnormal (2^-25)
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(a >> 23);  // 14 + (113 - e) - 1 ... bits to drop beyond the 13
    // value = man * 2^(e-150); half subnormal unit = 2^-24 -> q = man >> (126 - e)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return f16{uint16_t(sign | q)};
  }
  // normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits
  uint32_t r = a - 0x38000000u;  // exponent - 112
  r += 0xfffu + ((r >> 13) & 1u);
  return f16{uint16_t(sign | (r >> 13))};
}

}  // namespace aspen
