#include "core/dtype.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "core/philox.h"

namespace aspen {
namespace {

TEST(DType, TableIsConsistent) {
  EXPECT_EQ(kNumDTypes, 7);
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = DType(i);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    EXPECT_EQ(dtype_from_safetensors_name(dtype_safetensors_name(t)), t);
    EXPECT_GT(dtype_size(t), 0);
  }
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::i64), 8);
  EXPECT_EQ(dtype_safetensors_name(DType::boolean), "BOOL");
  EXPECT_EQ(dtype_of<float>(), DType::f32);
  EXPECT_EQ(dtype_of<bf16>(), DType::bf16);
  EXPECT_FALSE(dtype_from_name("f8").has_value());
  // Pinned values (they reach disk).
  EXPECT_EQ(int(DType::f32), 0);
  EXPECT_EQ(int(DType::boolean), 6);
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)).bits, 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001)))));  // signalling NaN stays NaN
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffff)).bits, 0x7f80);  // max float rounds to inf
}

__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

TEST(DType, F16RoundTripsEveryHalf) {
  ASSERT_TRUE(__builtin_cpu_supports("f16c")) << "the F16C oracle needs an x86-64 CPU with F16C";
  for (uint32_t b = 0; b < 65536; ++b) {
    f16 h{uint16_t(b)};
    float f = f16_to_f32(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << b;
      continue;
    }
    ASSERT_EQ(f32_to_f16(f).bits, b) << "half bits " << b;
    ASSERT_EQ(f, hw_f16_to_f32(uint16_t(b))) << "half bits " << b;  // F16C hardware as the oracle
  }
}

TEST(DType, F16MatchesHardwareRounding) {
  for (uint64_t i = 0; i < 200000; ++i) {
    uint32_t bits = philox_bits(7, 0, i);
    float f = from_bits(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f).bits, hw_f32_to_f16(f)) << "f32 bits " << std::hex << bits;
  }
  // Near the subnormal and overflow boundaries, densely.
  for (uint32_t bits = 0x33000000 - 64; bits < 0x38800000 + 64; bits += 997)
    ASSERT_EQ(f32_to_f16(from_bits(bits)).bits, hw_f32_to_f16(from_bits(bits))) << std::hex << bits;
  for (uint32_t bits = 0x477fe000 - 4096; bits < 0x47800000 + 4096; ++bits)
    ASSERT_EQ(f32_to_f16(from_bits(bits)).bits, hw_f32_to_f16(from_bits(bits))) << std::hex << bits;
}

}  // namespace
}  // namespace aspen
