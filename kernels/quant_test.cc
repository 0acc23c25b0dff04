// kernels/quant_test.cc: Q8_0 products against the scalar reference over odd shapes, bitwise (one result on
// every ISA and thread count), against f32 products within the quantization's error, and ggml's
// quantize_row_q8_0 rule.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "kernels/cpu.h"

namespace aspen::kernels {
namespace {

std::vector<BlockQ8_0> random_blocks(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n) * 3);
  philox_fill_uniform(std::span<float>(v), seed, 0, 0, 0.0f, 1.0f);
  std::vector<BlockQ8_0> out(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    out[size_t(b)].d = f32_to_f16(0.001f + 0.02f * v[size_t(3 * b)]).bits;
    for (int j = 0; j < 32; ++j)  // every int8, -128 included
      out[size_t(b)].qs[j] = int8_t(int((v[size_t(3 * b + 1)] * 977 + float(j) * 61.3f)) % 256 - 128);
  }
  return out;
}

TEST(Q8_0, QuantizeRowAsGgml) {
  std::vector<float> x(64);
  philox_fill_uniform(std::span<float>(x), 3, 0, 0, -2.0f, 2.0f);
  x[5] = 0.0f;
  std::vector<BlockQ8_0> q(2);
  quantize_row_q8_0(x.data(), 64, q.data());
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b * 32 + j)]));
    const float d = amax / 127.0f, id = 1.0f / d;
    EXPECT_EQ(q[size_t(b)].d, f32_to_f16(d).bits);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[size_t(b)].qs[j], int8_t(std::roundf(x[size_t(b * 32 + j)] * id)));
  }
  std::vector<float> zeros(32, 0.0f);
  quantize_row_q8_0(zeros.data(), 32, q.data());
  EXPECT_EQ(q[0].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], 0);
}

TEST(Q8_0, GemvEqualsTheReferenceBitwiseOnOddShapes) {
  for (auto [M, N, K] : {std::tuple{1, 1, 32}, std::tuple{1, 7, 64}, std::tuple{1, 8, 32}, std::tuple{1, 37, 96},
                         std::tuple{3, 19, 160}, std::tuple{1, 768, 768}, std::tuple{2, 1027, 3072}}) {
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
    const std::vector<BlockQ8_0> w = random_blocks(int64_t(N) * K / 32, uint64_t(N + K));
    std::vector<float> x(size_t(M) * K);
    philox_fill_uniform(std::span<float>(x), 9, 0, 0, -3.0f, 3.0f);
    std::vector<float> want(size_t(M) * N), got(size_t(M) * N);
    ref::gemv_q8_0(x.data(), w.data(), want.data(), M, N, K);
    ASSERT_TRUE(gemv_q8_0(x, w, got, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    // The packed layout (8 rows a stream): the same bits.
    std::vector<BlockQ8_0> packed(w.size());
    pack_q8_0_rows8(w, N, K, packed);
    std::vector<float> from_packed(got.size());
    ASSERT_TRUE(gemv_q8_0_rows8(x, packed, from_packed, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(from_packed.data(), want.data(), got.size() * 4), 0);
    {
      ScopedReferenceMode reference(true);
      ASSERT_TRUE(gemv_q8_0_rows8(x, packed, from_packed, M, N, K).is_ok());
      EXPECT_EQ(std::memcmp(from_packed.data(), want.data(), got.size() * 4), 0);
    }
    {
      ScopedReferenceMode reference(true);
      std::vector<float> again(got.size());
      ASSERT_TRUE(gemv_q8_0(x, w, again, M, N, K).is_ok());
      EXPECT_EQ(std::memcmp(again.data(), want.data(), got.size() * 4), 0);
    }
    // Against the f32 product of the dequantized weights: within x's quantization error.
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, scale = 0;
        for (int64_t k = 0; k < K; ++k) {
          const BlockQ8_0& blk = w[size_t(n * (K / 32) + k / 32)];
          const double wv = double(f16_to_f32(f16{blk.d})) * blk.qs[k % 32];
          exact += wv * x[size_t(m * K + k)];
          scale += std::fabs(wv) * 3.0 / 127.0;
        }
        EXPECT_NEAR(got[size_t(m * N + n)], exact, 0.5 * scale + 1e-6) << m << ", " << n;
      }
  }
}

// Q4_0 weights: the same products (activations in Q8_0), bitwise against the reference in both layouts and
// within x's quantization error of the f32 product of ggml's dequantized values, d · (q - 8).
TEST(Q4_0, GemvEqualsTheReferenceBitwiseOnOddShapes) {
  for (auto [M, N, K] : {std::tuple{1, 1, 32}, std::tuple{1, 9, 64}, std::tuple{2, 37, 96}, std::tuple{1, 768, 3072},
                         std::tuple{3, 1029, 768}}) {
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
    const int64_t nb = int64_t(N) * K / 32;
    std::vector<float> v(static_cast<size_t>(nb) * 17);
    philox_fill_uniform(std::span<float>(v), uint64_t(N * 7 + K), 0, 0, 0.0f, 1.0f);
    std::vector<BlockQ4_0> w(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      w[size_t(b)].d = f32_to_f16(0.001f + 0.02f * v[size_t(17 * b)]).bits;
      for (int j = 0; j < 16; ++j) w[size_t(b)].qs[j] = uint8_t(v[size_t(17 * b + 1 + j)] * 255.99f);
    }
    std::vector<float> x(size_t(M) * K);
    philox_fill_uniform(std::span<float>(x), 4, 0, 0, -2.0f, 2.0f);
    std::vector<float> want(size_t(M) * N), got(want.size()), packed_got(want.size());
    ref::gemv_q4_0(x.data(), w.data(), want.data(), M, N, K);
    ASSERT_TRUE(gemv_q4_0(x, w, got, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    std::vector<BlockQ4_0> packed(w.size());
    pack_q4_0_rows8(w, N, K, packed);
    ASSERT_TRUE(gemv_q4_0_rows8(x, packed, packed_got, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(packed_got.data(), want.data(), got.size() * 4), 0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, scale = 0;
        for (int64_t k = 0; k < K; ++k) {
          const BlockQ4_0& blk = w[size_t(n * (K / 32) + k / 32)];
          const int j = int(k % 32);
          const int q = j < 16 ? blk.qs[j] & 0xF : blk.qs[j - 16] >> 4;
          const double wv = double(f16_to_f32(f16{blk.d})) * (q - 8);
          exact += wv * x[size_t(m * K + k)];
          scale += std::fabs(wv) * 2.0 / 127.0;
        }
        EXPECT_NEAR(got[size_t(m * N + n)], exact, 0.5 * scale + 1e-6) << m << ", " << n;
      }
  }
}

// Q4_K weights: bitwise against the reference in both layouts; within x's quantization error of the f32
// product of ggml's dequantized values, (d · sc) · q - dmin · m.
TEST(Q4_K, GemvEqualsTheReferenceBitwiseOnOddShapes) {
  for (auto [M, N, K] : {std::tuple{1, 1, 256}, std::tuple{1, 11, 512}, std::tuple{2, 37, 768},
                         std::tuple{1, 771, 3072}}) {
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
    const int64_t nb = int64_t(N) * K / 256;
    std::vector<float> v(static_cast<size_t>(nb) * 144);
    philox_fill_uniform(std::span<float>(v), uint64_t(N * 5 + K), 0, 0, 0.0f, 1.0f);
    std::vector<BlockQ4_K> w(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      BlockQ4_K& blk = w[size_t(b)];
      blk.d = f32_to_f16(0.0005f + 0.002f * v[size_t(144 * b)]).bits;
      blk.dmin = f32_to_f16(0.0005f + 0.002f * v[size_t(144 * b + 1)]).bits;
      for (int j = 0; j < 12; ++j) blk.scales[j] = uint8_t(v[size_t(144 * b + 2 + j)] * 255.99f);
      for (int j = 0; j < 128; ++j) blk.qs[j] = uint8_t(v[size_t(144 * b + 14 + j % 130)] * 255.99f);
    }
    std::vector<float> x(size_t(M) * K);
    philox_fill_uniform(std::span<float>(x), 6, 0, 0, -2.0f, 2.0f);
    std::vector<float> want(size_t(M) * N), got(want.size()), packed_got(want.size());
    ref::gemv_q4_k(x.data(), w.data(), want.data(), M, N, K);
    ASSERT_TRUE(gemv_q4_k(x, w, got, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    std::vector<BlockQ4_K> packed(w.size());
    pack_q4_k_rows8(w, N, K, packed);
    ASSERT_TRUE(gemv_q4_k_rows8(x, packed, packed_got, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(packed_got.data(), want.data(), got.size() * 4), 0);
    {
      ScopedReferenceMode reference(true);
      ASSERT_TRUE(gemv_q4_k_rows8(x, packed, packed_got, M, N, K).is_ok());
      EXPECT_EQ(std::memcmp(packed_got.data(), want.data(), got.size() * 4), 0);
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, scale = 0;
        for (int64_t k = 0; k < K; ++k) {
          const BlockQ4_K& blk = w[size_t(n * (K / 256) + k / 256)];
          const int s = int(k % 256 / 32), j = int(k % 32);
          const uint8_t* sc = blk.scales;
          const int scv = s < 4 ? sc[s] & 63 : (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
          const int mv = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
          const uint8_t qb = blk.qs[32 * (s / 2) + j];
          const int q = s % 2 ? qb >> 4 : qb & 0xF;
          const double wv = double(f16_to_f32(f16{blk.d})) * scv * q - double(f16_to_f32(f16{blk.dmin})) * mv;
          exact += wv * x[size_t(m * K + k)];
          scale += std::fabs(wv) * 2.0 / 127.0;
        }
        EXPECT_NEAR(got[size_t(m * N + n)], exact, 0.5 * scale + 1e-5) << m << ", " << n;
      }
  }
  std::vector<float> x(128), y(1);
  std::vector<BlockQ4_K> w(1);
  EXPECT_FALSE(gemv_q4_k(x, w, y, 1, 1, 128).is_ok());  // K not a multiple of 256
}

TEST(Q8_0, BadShapesAreNamed) {
  std::vector<float> x(40), y(4);
  std::vector<BlockQ8_0> w(4);
  auto r = gemv_q8_0(x, w, y, 1, 1, 40);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.to_string().find("multiple of 32"), std::string::npos);
  r = gemv_q8_0(std::span<const float>(x).first(31), w, y, 1, 2, 32);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.to_string().find("gemv_q8_0: buffers"), std::string::npos);
}

}  // namespace
}  // namespace aspen::kernels
