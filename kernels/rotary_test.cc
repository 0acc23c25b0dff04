#include "kernels/rotary.h"

#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <string>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

std::vector<int32_t> random_positions(int64_t n, uint64_t seed, int32_t max_pos) {
  std::vector<float> r = testing::random_vector(size_t(n), seed, 0.0f, float(max_pos));
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t(r[i]);
  return p;
}

const char* layout_name(RotaryLayout l) { return l == RotaryLayout::interleaved ? "interleaved" : "half_split"; }

struct Dims {
  int64_t D, rd;
};
constexpr Dims kDims[] = {{8, 8}, {64, 64}, {64, 32}, {7, 6}, {129, 34}};
constexpr RotaryLayout kLayouts[] = {RotaryLayout::interleaved, RotaryLayout::half_split};

TEST(Rotary, FastMatchesReference) {
  struct BH {
    int64_t B, H, max_T;
  };
  const BH bhs[] = {{1, 1, 129}, {2, 3, 17}};
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    for (RotaryLayout layout : kLayouts)
      for (const BH& bh : bhs)
        for (int64_t T : testing::kOddSizes) {
          if (T > bh.max_T) continue;
          for (const Dims& d : kDims) {
            SCOPED_TRACE(std::string(isa_name(isa)) + " " + layout_name(layout) + " B=" + std::to_string(bh.B) +
                         " T=" + std::to_string(T) + " H=" + std::to_string(bh.H) + " D=" + std::to_string(d.D) +
                         " rd=" + std::to_string(d.rd));
            const int64_t n = bh.B * T * bh.H * d.D;
            const std::vector<float> x = testing::random_vector(size_t(n), uint64_t(n + d.rd));
            const std::vector<int32_t> pos = random_positions(bh.B * T, uint64_t(T), 4096);
            std::vector<float> want(n), want_back(n);
            ref::rotary_forward<float>(x.data(), pos.data(), want.data(), bh.B, T, bh.H, d.D, d.rd, layout, 10000.0f);
            ref::rotary_backward<float>(x.data(), pos.data(), want_back.data(), bh.B, T, bh.H, d.D, d.rd, layout,
                                        10000.0f);

            Guarded<float> y(n), dx(n), inplace(n);
            ASSERT_TRUE(rotary_forward(x, pos, y.span(), bh.B, T, bh.H, d.D, d.rd, layout).is_ok());
            EXPECT_TRUE(testing::close_nmse(y.cspan(), want, testing::nmse_threshold(DType::f32)));
            ASSERT_TRUE(rotary_backward(x, pos, dx.span(), bh.B, T, bh.H, d.D, d.rd, layout).is_ok());
            EXPECT_TRUE(testing::close_nmse(dx.cspan(), want_back, testing::nmse_threshold(DType::f32)));
            for (int64_t i = 0; i < n; ++i) inplace[size_t(i)] = x[size_t(i)];
            ASSERT_TRUE(rotary_forward(inplace.cspan(), pos, inplace.span(), bh.B, T, bh.H, d.D, d.rd, layout).is_ok());
            EXPECT_TRUE(testing::close_nmse(inplace.cspan(), want, testing::nmse_threshold(DType::f32)));
            EXPECT_GUARDS(y);
            EXPECT_GUARDS(dx);
            EXPECT_GUARDS(inplace);
          }
        }
  }
}

TEST(Rotary, ReferenceModeRoutesToReference) {
  const int64_t B = 1, T = 5, H = 2, D = 12, rd = 8, n = B * T * H * D;
  const std::vector<float> x = testing::random_vector(n, 3);
  const std::vector<int32_t> pos = {0, 1, 2, 700, 9};
  std::vector<float> want(n), got(n);
  ref::rotary_forward<float>(x.data(), pos.data(), want.data(), B, T, H, D, rd, RotaryLayout::half_split, 500.0f);
  ScopedReferenceMode on(true);
  ASSERT_TRUE(rotary_forward(x, pos, got, B, T, H, D, rd, RotaryLayout::half_split, 500.0f).is_ok());
  EXPECT_EQ(got, want);
}

// Hugging Face's static rope_scaling frequencies, as transformers 5.24's
// ROPE_INIT_FUNCTIONS computes them (f32): Llama 3.1's llama3 settings
// (base 500000, head dim 128, factor 8, low/high frequency factors 1 and 4,
// 8192 original positions) over all three bands (kept: p <= 28, blended:
// 29..34, divided: p >= 35), and linear (base 10000, factor 4). aspen computes
// in f64 and rounds once, HF in f32 step by step: equal within 1e-6 relative.
TEST(Rotary, ScaledFrequenciesMatchHuggingFace) {
  RotaryFrequencies llama3(500000.0f);
  llama3.scaling = RotaryFrequencies::Scaling::llama3;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_positions = 8192;
  const std::pair<int64_t, double> want3[] = {{0, 1.0},
                                              {20, 0.016560440883040428},
                                              {29, 0.0021665706299245358},
                                              {30, 0.0013718936825171113},
                                              {32, 0.0005248460220173001},
                                              {34, 0.0001785077911335975},
                                              {40, 3.428102354519069e-05},
                                              {63, 3.068925877869333e-07}};
  for (const auto& [p, want] : want3) EXPECT_NEAR(rotary_inv_freq(p, 128, llama3), want, 1e-6 * want) << "p=" << p;
  RotaryFrequencies linear(10000.0f);
  linear.scaling = RotaryFrequencies::Scaling::linear;
  linear.factor = 4.0;
  const std::pair<int64_t, double> want_linear[] = {{0, 0.25}, {10, 0.05928434059023857}, {63, 2.8869548259535804e-05}};
  for (const auto& [p, want] : want_linear)
    EXPECT_NEAR(rotary_inv_freq(p, 128, linear), want, 1e-6 * want) << "p=" << p;
}

// Dynamic NTK scaling against transformers' _compute_dynamic_ntk_parameters (5.24; base 1000, head dim 8,
// max_position_embeddings 16, factor 4): up to 16 positions the plain frequencies, past them the base grows
// with the run's length (HF in f32: within 1e-6 relative). The kernels take the length from the
// positions: a forward over positions up to 39 equals the reference at seq_len 40, and positions below 16
// rotate exactly as without scaling.
TEST(Rotary, DynamicFrequenciesMatchHuggingFace) {
  RotaryFrequencies dyn(1000.0f);
  dyn.scaling = RotaryFrequencies::Scaling::dynamic;
  dyn.factor = 4.0;
  dyn.original_max_positions = 16;
  const std::pair<int64_t, std::array<double, 4>> want[] = {
      {10, {1.0, 0.17782793939113617, 0.03162277862429619, 0.005623413249850273}},
      {16, {1.0, 0.17782793939113617, 0.03162277862429619, 0.005623413249850273}},
      {17, {1.0, 0.16508084535598755, 0.027251683175563812, 0.004498730413615704}},
      {40, {1.0, 0.09296097606420517, 0.008641742169857025, 0.0008033447084017098}}};
  for (const auto& [len, inv] : want) {
    dyn.seq_len = len;
    for (int64_t p = 0; p < 4; ++p)
      EXPECT_NEAR(rotary_inv_freq(p, 8, dyn), inv[size_t(p)], 1e-6 * inv[size_t(p)]) << "seq_len " << len << " p=" << p;
  }
  const int64_t B = 2, T = 20, H = 2, D = 8;
  const std::vector<float> x = testing::random_vector(size_t(B * T * H * D), 91);
  for (const int32_t top : {15, 39}) {
    std::vector<int32_t> pos(size_t(B * T));
    for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = int32_t((i * 7) % (top + 1));
    pos[3] = top;
    std::vector<float> got(x.size()), want_y(x.size()), plain(x.size());
    ASSERT_TRUE(rotary_forward(x, pos, got, B, T, H, D, D, RotaryLayout::half_split, dyn).is_ok());
    RotaryFrequencies at = dyn;
    at.seq_len = top + 1;
    ref::rotary_forward<float>(x.data(), pos.data(), want_y.data(), B, T, H, D, D, RotaryLayout::half_split, at);
    for (size_t i = 0; i < got.size(); ++i)  // the fast rows fuse multiply-adds: an ulp or so apart
      ASSERT_NEAR(got[i], want_y[i], 1e-6) << "positions up to " << top << ", element " << i;
    ASSERT_TRUE(rotary_forward(x, pos, plain, B, T, H, D, D, RotaryLayout::half_split, 1000.0f).is_ok());
    if (top < 16) {
      EXPECT_EQ(got, plain);
    } else {
      EXPECT_NE(got, plain);
    }
  }
}

// Pins both pair layouts and the inverse frequencies against hand-computed values.
TEST(Rotary, KnownValues) {
  EXPECT_EQ(rotary_inv_freq(0, 4, 10000.0f), 1.0f);
  EXPECT_EQ(rotary_inv_freq(1, 4, 10000.0f), 0.01f);
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<int32_t> pos = {1};
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    std::vector<float> y(4);
    ASSERT_TRUE(rotary_forward(x, pos, y, 1, 1, 1, 4, 4, RotaryLayout::interleaved).is_ok());
    EXPECT_NEAR(y[0], 1 * c1 - 2 * s1, 1e-6);  // pair (0, 1), angle 1
    EXPECT_NEAR(y[1], 2 * c1 + 1 * s1, 1e-6);
    EXPECT_NEAR(y[2], 3 * c2 - 4 * s2, 1e-6);  // pair (2, 3), angle 0.01
    EXPECT_NEAR(y[3], 4 * c2 + 3 * s2, 1e-6);
    ASSERT_TRUE(rotary_forward(x, pos, y, 1, 1, 1, 4, 4, RotaryLayout::half_split).is_ok());
    EXPECT_NEAR(y[0], 1 * c1 - 3 * s1, 1e-6);  // pair (0, 2), angle 1
    EXPECT_NEAR(y[2], 3 * c1 + 1 * s1, 1e-6);
    EXPECT_NEAR(y[1], 2 * c2 - 4 * s2, 1e-6);  // pair (1, 3), angle 0.01
    EXPECT_NEAR(y[3], 4 * c2 + 2 * s2, 1e-6);
  }
}

// loss = sum(w · forward(x)) in f64; its gradient in x is backward(w).
TEST(Rotary, BackwardMatchesFiniteDifferences) {
  const int64_t B = 1, T = 3, H = 2, D = 8, rd = 6, n = B * T * H * D;
  const std::vector<int32_t> pos = {0, 5, 1000};
  const std::vector<float> x = testing::random_vector(n, 11);
  const std::vector<float> w = testing::random_vector(n, 12);
  for (RotaryLayout layout : kLayouts) {
    auto loss = [&](const std::vector<double>& xd) {
      std::vector<double> y(xd.size());
      ref::rotary_forward<double>(xd.data(), pos.data(), y.data(), B, T, H, D, rd, layout, 10000.0f);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += double(w[i]) * y[i];
      return l;
    };
    const std::vector<double> num = testing::numeric_grad(loss, testing::to_f64(x));
    for (Isa isa : testing::available_isas()) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " " + layout_name(layout));
      ScopedIsaCap cap(isa);
      Guarded<float> dx(n);
      ASSERT_TRUE(rotary_backward(w, pos, dx.span(), B, T, H, D, rd, layout).is_ok());
      EXPECT_TRUE(testing::close_nmse(dx.cspan(), num, testing::kGradNmse));
      EXPECT_GUARDS(dx);
    }
  }
}

TEST(Rotary, BackwardUndoesForward) {
  const int64_t B = 2, T = 7, H = 3, D = 20, rd = 16, n = B * T * H * D;
  const std::vector<float> x = testing::random_vector(n, 21);
  const std::vector<int32_t> pos = random_positions(B * T, 22, 100000);
  for (RotaryLayout layout : kLayouts) {
    std::vector<float> y(n), back(n);
    ASSERT_TRUE(rotary_forward(x, pos, y, B, T, H, D, rd, layout).is_ok());
    ASSERT_TRUE(rotary_backward(y, pos, back, B, T, H, D, rd, layout).is_ok());
    EXPECT_TRUE(testing::close_nmse(back, x, 1e-12));
  }
}

TEST(Rotary, SameForOneAndTwoThreads) {
  const int64_t B = 2, T = 33, H = 4, D = 64, rd = 64, n = B * T * H * D;  // above the parallel threshold
  const std::vector<float> x = testing::random_vector(n, 31);
  const std::vector<int32_t> pos = random_positions(B * T, 32, 8192);
  for (RotaryLayout layout : kLayouts) {
    std::vector<float> one(n), two(n);
    {
      ScopedOmpThreads t(1);
      ASSERT_TRUE(rotary_forward(x, pos, one, B, T, H, D, rd, layout).is_ok());
    }
    {
      ScopedOmpThreads t(2);
      ASSERT_TRUE(rotary_forward(x, pos, two, B, T, H, D, rd, layout).is_ok());
    }
    EXPECT_EQ(one, two);
  }
}

TEST(Rotary, BadArguments) {
  std::vector<float> x(7 * 2), y(7 * 2);
  std::vector<int32_t> pos = {0, 1};
  Status s = rotary_forward(x, pos, y, 1, 2, 1, 7, 7, RotaryLayout::interleaved);
  EXPECT_EQ(s.message(), "rotary_forward: argument 'rotary_dim': expected an even number, found 7");
  s = rotary_forward(x, pos, y, 1, 2, 1, 7, 8, RotaryLayout::half_split);
  EXPECT_EQ(s.message(), "rotary_forward: argument 'rotary_dim': expected at most D = 7, found 8");
  s = rotary_forward(x, pos, y, 1, 2, 1, 7, 6, RotaryLayout::half_split, 0.0f);
  EXPECT_EQ(s.message(), "rotary_forward: argument 'base': expected a finite number > 0, found 0.000000");
  std::vector<float> big(48), short_x(47);
  s = rotary_forward(short_x, pos, big, 1, 2, 3, 8, 8, RotaryLayout::interleaved);
  EXPECT_EQ(s.message(), "rotary_forward: argument 'x': expected at least 48 elements, found 47");
  s = rotary_backward(big, std::span<const int32_t>(pos.data(), 1), big, 1, 2, 3, 8, 8, RotaryLayout::interleaved);
  EXPECT_EQ(s.message(), "rotary_backward: argument 'pos': expected at least 2 elements, found 1");
  s = rotary_backward(big, pos, short_x, 1, 2, 3, 8, 8, RotaryLayout::interleaved);
  EXPECT_EQ(s.message(), "rotary_backward: argument 'dx': expected at least 48 elements, found 47");
  EXPECT_TRUE(rotary_forward({}, {}, {}, 0, 5, 2, 8, 8, RotaryLayout::interleaved).is_ok());
  EXPECT_TRUE(rotary_backward({}, pos, {}, 1, 2, 0, 8, 8, RotaryLayout::half_split).is_ok());
  s = rotary_forward(x, pos, y, -1, 2, 1, 7, 6, RotaryLayout::interleaved);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = rotary_forward(x, pos, y, int64_t(1) << 40, int64_t(1) << 40, 1, 8, 8, RotaryLayout::interleaved);
  EXPECT_EQ(s.subject(), "rotary_forward: shape");
}

}  // namespace
}  // namespace aspen::kernels
