#include "kernels/convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
bool is_nan_bf16(uint16_t h) { return (h & 0x7fff) > 0x7f80; }
bool is_nan_f16(uint16_t h) { return (h & 0x7fff) > 0x7c00; }

// Special values, then random bit patterns: any, within f16's exponent range,
// and exact bf16 / f16 halfway cases.
std::vector<float> test_floats() {
  const uint32_t special[] = {
      0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x7f800000, 0xff800000,              // zeros, ±1, ±inf
      0x7fc00000, 0x7f800001, 0xffbfffff, 0x7fffffff, 0xff812345, 0x7fa00000, 0xffc00001,  // NaNs
      0x00000001, 0x007fffff, 0x80000001, 0x00400000, 0x00008000, 0x00018000, 0x00008001,  // subnormals
      0x807f8000, 0x00800000, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0xff7f8000,              // min normal, max
      0x3f808000, 0x3f818000, 0x3f808001, 0xbf808000, 0x3f807fff,                          // bf16 ties
      0x477fe000, 0x477fefff, 0x477ff000, 0xc77ff000, 0x38800000, 0x387fe000, 0x33800000,  // f16 range edges
      0x33000000, 0x33000001, 0x33c00000, 0x34200000, 0x3f801000, 0x3f803000, 0xb3400000,  // f16 ties
  };
  std::vector<float> v;
  for (uint32_t u : special) v.push_back(from_bits(u));
  for (uint64_t i = 0; i < 4096; ++i) {
    const uint32_t r = philox_bits(5, 77, i), s = philox_bits(5, 78, i);
    v.push_back(from_bits(r));
    const uint32_t exp = 100 + s % 46;  // f16 subnormals to overflow
    v.push_back(from_bits((r & 0x807fffffu) | (exp << 23)));
    v.push_back(from_bits((r & 0xffff0000u) | 0x8000u));                // bf16 tie
    v.push_back(from_bits((r & 0x807fe000u) | (exp << 23) | 0x1000u));  // f16 tie (normal range)
  }
  return v;
}

TEST(Convert, Bf16AndF16ToF32Exhaustive) {
  std::vector<bf16> b(65536);
  std::vector<f16> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) b[i].bits = h[i].bits = uint16_t(i);
  std::vector<float> want_b(65536), want_h(65536);
  ref::convert_bf16_to_f32(b.data(), want_b.data(), 65536);
  ref::convert_f16_to_f32(h.data(), want_h.data(), 65536);
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    Guarded<float> out_b(65536), out_h(65536);
    ASSERT_TRUE(convert_bf16_to_f32(b, out_b.span(), 65536).is_ok());
    ASSERT_TRUE(convert_f16_to_f32(h, out_h.span(), 65536).is_ok());
    int bad_b = 0, bad_h = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      bad_b += bits_of(out_b[i]) != bits_of(want_b[i]);
      bad_h += bits_of(out_h[i]) != bits_of(want_h[i]);
    }
    EXPECT_EQ(bad_b, 0);
    EXPECT_EQ(bad_h, 0);
    EXPECT_GUARDS(out_b);
    EXPECT_GUARDS(out_h);
  }
}

// Every 16-bit pattern survives 16 -> 32 -> 16 on the fast paths (NaN comes back quiet).
TEST(Convert, RoundTripExhaustive) {
  std::vector<bf16> b(65536), b2(65536);
  std::vector<f16> h(65536), h2(65536);
  for (uint32_t i = 0; i < 65536; ++i) b[i].bits = h[i].bits = uint16_t(i);
  std::vector<float> f(65536);
  for (Isa isa : testing::available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    ASSERT_TRUE(convert_bf16_to_f32(b, f, 65536).is_ok());
    ASSERT_TRUE(convert_f32_to_bf16(f, b2, 65536).is_ok());
    ASSERT_TRUE(convert_f16_to_f32(h, f, 65536).is_ok());
    ASSERT_TRUE(convert_f32_to_f16(f, h2, 65536).is_ok());
    int bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t want_b = is_nan_bf16(uint16_t(i)) ? uint16_t(i | 0x40) : uint16_t(i);
      const uint16_t want_h = is_nan_f16(uint16_t(i)) ? uint16_t((i & 0x8000) | 0x7e00) : uint16_t(i);
      bad += (b2[i].bits != want_b) + (h2[i].bits != want_h);
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(Convert, F32ToBf16AndF16MatchReferenceBitwise) {
  const std::vector<float> x = test_floats();
  std::vector<size_t> sizes(testing::kOddSizes.begin(), testing::kOddSizes.end());
  sizes.push_back(x.size());
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    for (size_t n : sizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " N=" + std::to_string(n));
      std::vector<bf16> want_b(n);
      std::vector<f16> want_h(n);
      ref::convert_f32_to_bf16(x.data(), want_b.data(), int64_t(n));
      ref::convert_f32_to_f16(x.data(), want_h.data(), int64_t(n));
      Guarded<bf16> got_b(n);
      Guarded<f16> got_h(n);
      ASSERT_TRUE(convert_f32_to_bf16(x, got_b.span(), int64_t(n)).is_ok());
      ASSERT_TRUE(convert_f32_to_f16(x, got_h.span(), int64_t(n)).is_ok());
      int bad = 0;
      for (size_t i = 0; i < n; ++i) {
        if (got_b[i].bits != want_b[i].bits && ++bad < 5)
          ADD_FAILURE() << "bf16 of " << std::hex << bits_of(x[i]) << ": " << got_b[i].bits << " vs " << want_b[i].bits;
        if (got_h[i].bits != want_h[i].bits && ++bad < 5)
          ADD_FAILURE() << "f16 of " << std::hex << bits_of(x[i]) << ": " << got_h[i].bits << " vs " << want_h[i].bits;
      }
      EXPECT_EQ(bad, 0);
      EXPECT_GUARDS(got_b);
      EXPECT_GUARDS(got_h);
    }
  }
}

TEST(Convert, StochasticMatchesReferenceBitwise) {
  const std::vector<float> x = test_floats();
  // Offsets off a Philox block boundary, and one whose block counter's low word wraps mid-vector.
  const uint64_t offsets[] = {0, 1, 3, 6, (uint64_t(1) << 34) - 37};
  const int64_t sizes[] = {1, 3, 7, 17, 129, 1000, int64_t(x.size())};
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    for (uint64_t offset : offsets)
      for (int64_t n : sizes) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " offset=" + std::to_string(offset) + " N=" + std::to_string(n));
        std::vector<bf16> want(n);
        ref::convert_f32_to_bf16_stochastic(x.data(), want.data(), n, 42, 7, offset);
        Guarded<bf16> got(n);
        ASSERT_TRUE(convert_f32_to_bf16_stochastic(x, got.span(), n, 42, 7, offset).is_ok());
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += got[i].bits != want[i].bits;
        EXPECT_EQ(bad, 0);
        EXPECT_GUARDS(got);
      }
  }
}

// The result is one of the two bf16 neighbours of x (x itself when x is a bf16).
TEST(Convert, StochasticGivesANeighbour) {
  const std::vector<float> x = test_floats();
  std::vector<bf16> y(x.size());
  ASSERT_TRUE(convert_f32_to_bf16_stochastic(x, y, int64_t(x.size()), 1, 2, 3).is_ok());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t u = bits_of(x[i]);
    const uint16_t lo = uint16_t(u >> 16);
    if (std::isnan(x[i])) {
      EXPECT_TRUE(is_nan_bf16(y[i].bits)) << std::hex << u;
    } else if ((u & 0xffff) == 0) {
      EXPECT_EQ(y[i].bits, lo) << std::hex << u;  // exact: includes ±0, ±inf
    } else {
      EXPECT_TRUE(y[i].bits == lo || y[i].bits == uint16_t(lo + 1)) << std::hex << u;
    }
  }
}

// Mean of K stochastically rounded copies of x is x within 5 standard deviations
// of the mean: sigma = ulp · sqrt(p (1 − p) / K), p = (x − lower) / ulp.
TEST(Convert, StochasticIsUnbiased) {
  const int64_t K = 1 << 16;
  const float values[] = {1.0f + 0.3f * 0.0078125f, -3.7f, 0.1f, 1e-30f, 123456.789f};
  uint64_t offset = 0;
  for (float v : values) {
    SCOPED_TRACE(v);
    const std::vector<float> x(K, v);
    std::vector<bf16> y(K);
    ASSERT_TRUE(convert_f32_to_bf16_stochastic(x, y, K, 99, 0, offset).is_ok());
    offset += K;
    const double lower = bf16_to_f32(bf16{uint16_t(bits_of(v) >> 16)});
    const double upper = bf16_to_f32(bf16{uint16_t((bits_of(v) >> 16) + 1)});
    const double ulp = upper - lower, p = (double(v) - lower) / ulp;
    double sum = 0;
    for (const bf16& h : y) sum += bf16_to_f32(h);
    const double mean = sum / double(K), sigma = std::abs(ulp) * std::sqrt(p * (1 - p) / double(K));
    EXPECT_GT(p, 0.0);
    EXPECT_LT(p, 1.0);
    EXPECT_LE(std::abs(mean - double(v)), 5 * sigma) << "mean " << mean << " p " << p;
  }
}

TEST(Convert, StochasticSameForOneAndTwoThreadsAndSplitCalls) {
  const int64_t n = 100003;
  const std::vector<float> x = testing::random_vector(n, 8, -100.0f, 100.0f);
  std::vector<bf16> one(n), two(n), split(n), want(n);
  {
    ScopedOmpThreads t(1);
    ASSERT_TRUE(convert_f32_to_bf16_stochastic(x, one, n, 5, 6, 11).is_ok());
  }
  {
    ScopedOmpThreads t(2);
    ASSERT_TRUE(convert_f32_to_bf16_stochastic(x, two, n, 5, 6, 11).is_ok());
  }
  // Converting in two calls with offsets o and o + k gives the one-call result.
  const int64_t k = 777;
  ASSERT_TRUE(convert_f32_to_bf16_stochastic(x, split, k, 5, 6, 11).is_ok());
  ASSERT_TRUE(convert_f32_to_bf16_stochastic(std::span<const float>(x).subspan(k), std::span<bf16>(split).subspan(k),
                                             n - k, 5, 6, 11 + k)
                  .is_ok());
  ref::convert_f32_to_bf16_stochastic(x.data(), want.data(), n, 5, 6, 11);
  int bad_two = 0, bad_split = 0, bad_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad_two += one[i].bits != two[i].bits;
    bad_split += one[i].bits != split[i].bits;
    bad_ref += one[i].bits != want[i].bits;
  }
  EXPECT_EQ(bad_two, 0);
  EXPECT_EQ(bad_split, 0);
  EXPECT_EQ(bad_ref, 0);
}

// f16 stochastic rounding: a neighbour of x (x itself when x is an f16; NaN stays NaN), unbiased (the mean of
// K copies within 5 standard deviations of x, subnormal and overflowing x included), the same for one and two
// threads and split calls, and equal to the reference.
TEST(Convert, F16StochasticGivesAnUnbiasedNeighbour) {
  const std::vector<float> x = test_floats();
  std::vector<f16> y(x.size());
  ASSERT_TRUE(convert_f32_to_f16_stochastic(x, y, int64_t(x.size()), 1, 2, 3).is_ok());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(f16_to_f32(y[i]))) << x[i];
      continue;
    }
    const f16 nearest = f32_to_f16(x[i]);
    if (double(f16_to_f32(nearest)) == double(x[i])) {
      EXPECT_EQ(y[i].bits, nearest.bits) << x[i];
      continue;
    }
    const double got = f16_to_f32(y[i]);
    // Between the neighbours: no f16 strictly between x and the result.
    const f16 back{uint16_t(y[i].bits + (std::abs(got) > std::abs(double(x[i])) ? -1 : 1))};
    const double other = f16_to_f32(back);
    EXPECT_TRUE((got - double(x[i])) * (other - double(x[i])) <= 0) << x[i] << " -> " << got;
  }
  const int64_t K = 1 << 16;
  const float values[] = {1.0f + 0.3f / 1024.0f, -3.7f, 0.1f, 3e-6f, 65510.0f};
  uint64_t offset = 0;
  for (float v : values) {
    SCOPED_TRACE(v);
    const std::vector<float> xs(K, v);
    std::vector<f16> ys(K);
    ASSERT_TRUE(convert_f32_to_f16_stochastic(xs, ys, K, 99, 0, offset).is_ok());
    offset += K;
    f16 lo = f32_to_f16(v);
    if (std::abs(double(f16_to_f32(lo))) > std::abs(double(v))) lo.bits = uint16_t(lo.bits - 1);
    const double lower = f16_to_f32(lo);
    const double upper = std::abs(v) > 65504.0f ? std::copysign(65536.0, double(v)) : double(f16_to_f32(f16{uint16_t(lo.bits + 1)}));
    const double ulp = upper - lower, p = (double(v) - lower) / ulp;
    double sum = 0;
    int64_t highs = 0;
    for (const f16& h : ys) {
      const double value = f16_to_f32(h);
      highs += h.bits != lo.bits;
      sum += std::isinf(value) ? upper : value;  // beyond the largest finite f16: its step to 65536
    }
    const double mean = sum / double(K), sigma = std::abs(ulp) * std::sqrt(p * (1 - p) / double(K));
    EXPECT_GT(p, 0.0);
    EXPECT_LT(p, 1.0);
    EXPECT_LE(std::abs(mean - double(v)), 5 * sigma) << "mean " << mean << " p " << p << " highs " << highs;
  }
  const int64_t n = 100003;
  const std::vector<float> r = testing::random_vector(n, 8, -100.0f, 100.0f);
  std::vector<f16> one(n), two(n), split(n), want(n);
  {
    ScopedOmpThreads t(1);
    ASSERT_TRUE(convert_f32_to_f16_stochastic(r, one, n, 5, 6, 11).is_ok());
  }
  {
    ScopedOmpThreads t(2);
    ASSERT_TRUE(convert_f32_to_f16_stochastic(r, two, n, 5, 6, 11).is_ok());
  }
  const int64_t k = 777;
  ASSERT_TRUE(convert_f32_to_f16_stochastic(r, split, k, 5, 6, 11).is_ok());
  ASSERT_TRUE(convert_f32_to_f16_stochastic(std::span<const float>(r).subspan(k), std::span<f16>(split).subspan(k),
                                            n - k, 5, 6, 11 + k)
                  .is_ok());
  ref::convert_f32_to_f16_stochastic(r.data(), want.data(), n, 5, 6, 11);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += (one[i].bits != two[i].bits) + (one[i].bits != split[i].bits) +
                                         (one[i].bits != want[i].bits);
  EXPECT_EQ(bad, 0);
}

// widen_to_f32 / narrow_from_f32 are the bf16 and f16 conversions chosen by dtype, and refuse the others.
TEST(Convert, WidenAndNarrowByDtype) {
  const std::vector<float> x = {1.5f, -2.25f, 3.0f, 0.125f, -0.0f};
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> narrow(x.size());
    std::vector<float> back(x.size());
    ASSERT_TRUE(narrow_from_f32(t, x.data(), narrow.data(), int64_t(x.size())).is_ok());
    ASSERT_TRUE(widen_to_f32(t, narrow.data(), back.data(), int64_t(x.size())).is_ok());
    EXPECT_EQ(back, x) << dtype_name(t);  // exact in both
  }
  float f = 0;
  EXPECT_EQ(widen_to_f32(DType::i32, &f, &f, 1).message(), "widen_to_f32: from: expected bf16 or f16, found i32");
  EXPECT_EQ(narrow_from_f32(DType::f32, &f, &f, 1).message(), "narrow_from_f32: to: expected bf16 or f16, found f32");
}

TEST(Convert, BadArguments) {
  std::vector<float> x(5);
  std::vector<bf16> y(4);
  std::vector<f16> h(5);
  EXPECT_EQ(convert_f32_to_bf16(x, y, 5).message(),
            "convert_f32_to_bf16: argument 'y': expected at least 5 elements, found 4");
  EXPECT_EQ(convert_f16_to_f32(h, std::span<float>(x.data(), 3), 4).message(),
            "convert_f16_to_f32: argument 'y': expected at least 4 elements, found 3");
  EXPECT_EQ(convert_f32_to_f16(std::span<const float>(), h, 1).message(),
            "convert_f32_to_f16: argument 'x': expected a buffer of 1 elements, found a null pointer");
  EXPECT_EQ(convert_f32_to_bf16_stochastic(x, y, 4, 1, 2, std::numeric_limits<uint64_t>::max() - 2).message(),
            "convert_f32_to_bf16_stochastic: argument 'offset': expected offset + N <= 2^64, found offset = "
            "18446744073709551613, N = 4");
  EXPECT_TRUE(convert_f32_to_bf16_stochastic(x, y, 3, 1, 2, std::numeric_limits<uint64_t>::max() - 2).is_ok());
  EXPECT_EQ(convert_bf16_to_f32(y, x, -1).code(), Code::kInvalidArgument);
  EXPECT_TRUE(convert_f32_to_bf16_stochastic({}, {}, 0, 1, 2, 3).is_ok());
  EXPECT_TRUE(convert_f16_to_f32({}, {}, 0).is_ok());
}

}  // namespace
}  // namespace aspen::kernels
