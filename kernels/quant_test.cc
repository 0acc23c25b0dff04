// kernels/quant_test.cc: Q8_0 products against the scalar reference over odd shapes, bitwise (one result on
// every ISA, AVX2 and AVX512-VNNI, and thread count; 1 to 70 rows of x: prefill's 4-row kernels and their
// rest), against f32 products within the quantization's error, and ggml's
// quantize_row_q8_0 rule.
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

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
  for (Isa isa : testing::available_isas(Isa::avx2)) {  // the AVX2 quantizer gives the scalar loop's bits
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
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
    // Halves round away from zero, as roundf (amax 127: the scale is 1, x * id = x exactly).
    std::vector<float> halves = {127.0f,  2.5f,       -2.5f,       0.5f, -0.5f, 126.5f,
                                 -126.5f, 1.4999999f, -1.4999999f, 0.0f, -0.0f};
    halves.resize(32, 3.5f);
    quantize_row_q8_0(halves.data(), 32, q.data());
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], int8_t(std::roundf(halves[size_t(j)]))) << halves[size_t(j)];
    std::vector<float> zeros(32, 0.0f);
    quantize_row_q8_0(zeros.data(), 32, q.data());
    EXPECT_EQ(q[0].d, 0);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], 0);
  }
}

// One format's four entry points.
template <class W>
struct Format {
  void (*reference)(const float*, const W*, float*, int64_t, int64_t, int64_t);
  Status (*gemv)(std::span<const float>, std::span<const W>, std::span<float>, int64_t, int64_t, int64_t);
  void (*pack)(std::span<const W>, int64_t, int64_t, std::span<W>);
  Status (*gemv_rows8)(std::span<const float>, std::span<const W>, std::span<float>, int64_t, int64_t, int64_t);
};

// Every path (W as stored and packed, fast and in reference mode) gives the reference's bits; then the fast
// result is within x's quantization error of the f32 product of the dequantized weights (`value(n, k)`): each
// x quantized to Q8_0 moves by at most half a step, max|x| / 127 / 2 <= x_max / 254.
template <class W, class Value>
void expect_products(const Format<W>& f, const std::vector<W>& w, const std::vector<float>& x, float x_max, int64_t M,
                     int64_t N, int64_t K, Value value) {
  std::vector<float> want(size_t(M * N)), got(want.size()), other(want.size());
  f.reference(x.data(), w.data(), want.data(), M, N, K);
  std::vector<W> packed(w.size());
  f.pack(w, N, K, packed);
  // The reference mode, then each ISA's fast path this CPU has (AVX2; AVX512-VNNI's on Isa::avx512 and up).
  for (Isa cap : {Isa::scalar, Isa::avx2, Isa::amx}) {
    if (cap == Isa::avx2 && cpu_features().best < Isa::avx2) continue;
    SCOPED_TRACE(cap == Isa::scalar ? "reference mode" : std::string("fast, cap ") + isa_name(cap));
    ScopedReferenceMode mode(cap == Isa::scalar);
    ScopedIsaCap isa(cap == Isa::scalar ? Isa::amx : cap);
    std::vector<float>& out = cap == Isa::amx ? got : other;
    ASSERT_TRUE(f.gemv(x, w, out, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * 4), 0);
    ASSERT_TRUE(f.gemv_rows8(x, packed, other, M, N, K).is_ok());
    EXPECT_EQ(std::memcmp(other.data(), want.data(), want.size() * 4), 0);
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double exact = 0, scale = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double wv = value(n, k);
        exact += wv * x[size_t(m * K + k)];
        scale += std::fabs(wv) * x_max / 127.0;
      }
      EXPECT_NEAR(got[size_t(m * N + n)], exact, 0.5 * scale + 1e-6) << m << ", " << n;
    }
}

std::vector<float> random_x(int64_t n, uint64_t seed, float x_max) {
  std::vector<float> x(static_cast<size_t>(n));
  philox_fill_uniform(std::span<float>(x), seed, 0, 0, -x_max, x_max);
  return x;
}

double f16_value(uint16_t bits) { return double(f16_to_f32(f16{bits})); }

TEST(Q8_0, GemvEqualsTheReferenceBitwiseOnOddShapes) {
  const Format<BlockQ8_0> f{ref::gemv_q8_0, gemv_q8_0, pack_q8_0_rows8, gemv_q8_0_rows8};
  for (auto [M, N, K] : {std::tuple{1, 1, 32}, std::tuple{1, 7, 64}, std::tuple{1, 8, 32}, std::tuple{1, 37, 96},
                         std::tuple{3, 19, 160}, std::tuple{1, 768, 768}, std::tuple{2, 1027, 3072},
                         std::tuple{7, 24, 96}, std::tuple{70, 40, 64}}) {
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
    const std::vector<BlockQ8_0> w = random_blocks(int64_t(N) * K / 32, uint64_t(N + K));
    expect_products(f, w, random_x(int64_t(M) * K, 9, 3.0f), 3.0f, M, N, K, [&](int64_t n, int64_t k) {
      const BlockQ8_0& blk = w[size_t(n * (K / 32) + k / 32)];
      return f16_value(blk.d) * blk.qs[k % 32];
    });
  }
}

// Q4_0 weights: the same products (activations in Q8_0) against ggml's dequantized values, d · (q - 8).
TEST(Q4_0, GemvEqualsTheReferenceBitwiseOnOddShapes) {
  const Format<BlockQ4_0> f{ref::gemv_q4_0, gemv_q4_0, pack_q4_0_rows8, gemv_q4_0_rows8};
  for (auto [M, N, K] : {std::tuple{1, 1, 32}, std::tuple{1, 9, 64}, std::tuple{2, 37, 96}, std::tuple{1, 768, 3072},
                         std::tuple{3, 1029, 768}, std::tuple{6, 17, 64}, std::tuple{69, 16, 32}}) {
    SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K));
    const int64_t nb = int64_t(N) * K / 32;
    std::vector<float> v(static_cast<size_t>(nb) * 17);
    philox_fill_uniform(std::span<float>(v), uint64_t(N * 7 + K), 0, 0, 0.0f, 1.0f);
    std::vector<BlockQ4_0> w(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      w[size_t(b)].d = f32_to_f16(0.001f + 0.02f * v[size_t(17 * b)]).bits;
      for (int j = 0; j < 16; ++j) w[size_t(b)].qs[j] = uint8_t(v[size_t(17 * b + 1 + j)] * 255.99f);
    }
    expect_products(f, w, random_x(int64_t(M) * K, 4, 2.0f), 2.0f, M, N, K, [&](int64_t n, int64_t k) {
      const BlockQ4_0& blk = w[size_t(n * (K / 32) + k / 32)];
      const int j = int(k % 32);
      return f16_value(blk.d) * ((j < 16 ? blk.qs[j] & 0xF : blk.qs[j - 16] >> 4) - 8);
    });
  }
}

// Q4_K weights against ggml's dequantized values, (d · sc) · q - dmin · m.
TEST(Q4_K, GemvEqualsTheReferenceBitwiseOnOddShapes) {
  const Format<BlockQ4_K> f{ref::gemv_q4_k, gemv_q4_k, pack_q4_k_rows8, gemv_q4_k_rows8};
  for (auto [M, N, K] : {std::tuple{1, 1, 256}, std::tuple{1, 11, 512}, std::tuple{2, 37, 768},
                         std::tuple{1, 771, 3072}, std::tuple{5, 16, 256}, std::tuple{67, 9, 512}}) {
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
    expect_products(f, w, random_x(int64_t(M) * K, 6, 2.0f), 2.0f, M, N, K, [&](int64_t n, int64_t k) {
      const BlockQ4_K& blk = w[size_t(n * (K / 256) + k / 256)];
      const int s = int(k % 256 / 32), j = int(k % 32);
      const uint8_t* sc = blk.scales;
      const int scv = s < 4 ? sc[s] & 63 : (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
      const int mv = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
      const uint8_t qb = blk.qs[32 * (s / 2) + j];
      return f16_value(blk.d) * scv * (s % 2 ? qb >> 4 : qb & 0xF) - f16_value(blk.dmin) * mv;
    });
  }
  std::vector<float> x(128), y(1);
  std::vector<BlockQ4_K> w(1);
  EXPECT_FALSE(gemv_q4_k(x, w, y, 1, 1, 128).is_ok());  // K not a multiple of 256
}

// NOTE [gemv groups]: products of one x on packed weights as one group (q, k and v of a decode step; odd N:
// rows past the last group of 8; a product of fewer than 8 rows) give, each, gemv_q8_0_rows8's bits on its
// own, on every ISA and with 1 and 2 threads; a bad shape is named.
TEST(Q8_0, GroupGivesEachProductItsOwnBits) {
  const QuantFormat& f = *quant_format("q8_0");
  for (int64_t M : {1, 3, 8})
    for (const std::vector<int64_t>& ns : {std::vector<int64_t>{768, 256, 256}, std::vector<int64_t>{37, 5, 1030}}) {
      const int64_t K = 768;
      const std::vector<float> x = random_x(M * K, uint64_t(M), 3.0f);
      std::vector<std::vector<BlockQ8_0>> packed;
      for (size_t c = 0; c < ns.size(); ++c) {
        const std::vector<BlockQ8_0> w = random_blocks(ns[c] * K / 32, uint64_t(c + 11 * M));
        packed.emplace_back(w.size());
        pack_q8_0_rows8(w, ns[c], K, packed.back());
      }
      for (Isa isa : testing::available_isas())
        for (int threads : {1, 2}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + ", threads " + std::to_string(threads) + ", M " +
                       std::to_string(M) + ", N " + std::to_string(ns[1]));
          ScopedIsaCap cap(isa);
          ScopedOmpThreads t(threads);
          std::vector<std::vector<float>> got(ns.size());
          std::vector<QuantGroupCall> calls;
          for (size_t c = 0; c < ns.size(); ++c) {
            got[c].assign(size_t(M * ns[c]), std::nanf(""));
            calls.push_back({reinterpret_cast<const uint8_t*>(packed[c].data()), got[c].data(), ns[c]});
          }
          ASSERT_TRUE(f.gemv_rows8_group(x.data(), calls.data(), calls.size(), M, K).is_ok());
          for (size_t c = 0; c < ns.size(); ++c) {
            std::vector<float> want(got[c].size());
            ASSERT_TRUE(gemv_q8_0_rows8(x, packed[c], want, M, ns[c], K).is_ok());
            EXPECT_EQ(0, std::memcmp(want.data(), got[c].data(), want.size() * sizeof(float))) << "product " << c;
          }
        }
    }
  std::vector<float> x(40), y(8);
  const QuantGroupCall bad{nullptr, y.data(), 8};
  EXPECT_EQ(quant_format("q8_0")->gemv_rows8_group(x.data(), &bad, 1, 1, 40).code(), Code::kInvalidArgument);
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
