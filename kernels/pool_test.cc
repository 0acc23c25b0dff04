#include "kernels/pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::random_vector;

// 1 2 | 0 3        the four 2x2 windows of a 4x4 plane (stride 2): maxima 4, 3, 9, 8;
// 4 0 | 3 1        the second window's 3 appears twice: its gradient goes to the first (row 0, column 3).
// 5 9 | 8 8        the fourth window's 8 twice: to row 2, column 2.
// 6 2 | 7 0
TEST(MaxPool, HandValuesAndTiesGoToTheFirstMaximum) {
  const MaxPoolShape s{.N = 1, .C = 1, .H = 4, .W = 4, .OH = 2, .OW = 2, .KH = 2, .KW = 2, .SH = 2, .SW = 2};
  const std::vector<float> x = {1, 2, 0, 3, 4, 0, 3, 1, 5, 9, 8, 8, 6, 2, 7, 0};
  std::vector<float> y(4), dx(16, -1.0f);
  ASSERT_TRUE(max_pool_forward(s, x.data(), y.data()).is_ok());
  EXPECT_EQ(y, (std::vector<float>{4, 3, 9, 8}));
  const std::vector<float> dy = {10, 20, 30, 40};
  ASSERT_TRUE(max_pool_backward(s, x.data(), dy.data(), dx.data()).is_ok());
  std::vector<float> want(16, 0.0f);
  want[4] = 10, want[3] = 20, want[9] = 30, want[10] = 40;
  EXPECT_EQ(dx, want);
}

// Padding never wins (all-negative input, padded windows), a NaN propagates, a window wholly in the
// padding gives -inf and no gradient.
TEST(MaxPool, PaddingNanAndEmptyWindows) {
  const MaxPoolShape s{.N = 1, .C = 1, .H = 2, .W = 2, .OH = 2, .OW = 3, .KH = 2, .KW = 2, .SH = 2, .SW = 2,
                       .PH = 1, .PW = 1};
  // Columns read: window 0 -> [-1, 0], window 1 -> [1, 2], window 2 -> [3, 4] (past the input: empty).
  const std::vector<float> x = {-5, -2, -3, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> y(6);
  ASSERT_TRUE(max_pool_forward(s, x.data(), y.data()).is_ok());
  EXPECT_EQ(y[0], -5.0f);  // row 0 only (row -1 is padding), column 0
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[3], -3.0f);
  EXPECT_TRUE(std::isnan(y[4]));
  std::vector<float> dx(4, 7.0f);
  const std::vector<float> dy = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(max_pool_backward(s, x.data(), dy.data(), dx.data()).is_ok());
  EXPECT_EQ(dx, (std::vector<float>{1, 2, 4, 5}));
  MaxPoolShape bad = s;
  bad.SH = 0;
  EXPECT_FALSE(max_pool_forward(bad, x.data(), y.data()).is_ok());
}

// The fast kernels against the f64 reference over odd shapes (several planes for the team, overlapping
// windows, dilation, uneven padding), with ties (inputs on a coarse grid): equal, since a maximum is one of
// the inputs and each gradient a sum of dy in the same order.
TEST(MaxPool, FastMatchesReferenceOverOddShapes) {
  const std::vector<MaxPoolShape> shapes = {
      {.N = 3, .C = 5, .H = 28, .W = 28, .OH = 14, .OW = 14, .KH = 2, .KW = 2, .SH = 2, .SW = 2},
      {.N = 2, .C = 7, .H = 9, .W = 11, .OH = 5, .OW = 6, .KH = 3, .KW = 3, .SH = 2, .SW = 2, .PH = 1, .PW = 1},
      {.N = 1, .C = 3, .H = 13, .W = 6, .OH = 5, .OW = 5, .KH = 3, .KW = 2, .SH = 2, .SW = 1, .PH = 0, .PW = 0,
       .DH = 2, .DW = 1},
      {.N = 64, .C = 9, .H = 5, .W = 5, .OH = 3, .OW = 3, .KH = 3, .KW = 3, .SH = 2, .SW = 2, .PH = 1, .PW = 1}};
  for (const MaxPoolShape& s : shapes) {
    SCOPED_TRACE("N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " " + std::to_string(s.H) + "x" +
                 std::to_string(s.W));
    const size_t X = size_t(s.N * s.C * s.H * s.W), Y = size_t(s.N * s.C * s.OH * s.OW);
    std::vector<float> x = random_vector(X, 3, -2.0f, 2.0f);
    for (float& v : x) v = std::round(v * 2.0f) / 2.0f;  // ties
    const std::vector<float> dy = random_vector(Y, 4, -1.0f, 1.0f);
    std::vector<float> y(Y), dx(X);
    ASSERT_TRUE(max_pool_forward(s, x.data(), y.data()).is_ok());
    ASSERT_TRUE(max_pool_backward(s, x.data(), dy.data(), dx.data()).is_ok());
    const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
    std::vector<double> yr(Y), dxr(X);
    ref::max_pool_forward<double>(s, xd.data(), yr.data());
    ref::max_pool_backward<double>(s, xd.data(), dyd.data(), dxr.data());
    for (size_t i = 0; i < Y; ++i) ASSERT_EQ(double(y[i]), yr[i]) << "y " << i;
    for (size_t i = 0; i < X; ++i) ASSERT_NEAR(double(dx[i]), dxr[i], 1e-6) << "dx " << i;
  }
}

// NOTE [2x2 pools]' own kernels, on every ISA, against the float reference bit for bit: odd extents (the last
// row or column in no window, so dx 0 there), ties, NaNs (a later NaN wins the window), -0.0 gradients (the
// reference adds them to +0.0), and the tutorials' planes.
TEST(MaxPool, TwoByTwoWindowsMatchTheReferenceOnEveryIsa) {
  const std::vector<MaxPoolShape> shapes = {
      {.N = 2, .C = 3, .H = 9, .W = 11, .OH = 4, .OW = 5, .KH = 2, .KW = 2, .SH = 2, .SW = 2},
      {.N = 1, .C = 1, .H = 2, .W = 2, .OH = 1, .OW = 1, .KH = 2, .KW = 2, .SH = 2, .SW = 2},
      {.N = 2, .C = 2, .H = 6, .W = 17, .OH = 3, .OW = 8, .KH = 2, .KW = 2, .SH = 2, .SW = 2},
      {.N = 1, .C = 2, .H = 4, .W = 64, .OH = 2, .OW = 32, .KH = 2, .KW = 2, .SH = 2, .SW = 2},
      {.N = 4, .C = 10, .H = 24, .W = 24, .OH = 12, .OW = 12, .KH = 2, .KW = 2, .SH = 2, .SW = 2},
      {.N = 3, .C = 20, .H = 8, .W = 37, .OH = 4, .OW = 18, .KH = 2, .KW = 2, .SH = 2, .SW = 2}};
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (const MaxPoolShape& s : shapes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " " +
                   std::to_string(s.H) + "x" + std::to_string(s.W));
      const size_t X = size_t(s.N * s.C * s.H * s.W), Y = size_t(s.N * s.C * s.OH * s.OW);
      std::vector<float> x = random_vector(X, 5, -2.0f, 2.0f);
      for (size_t i = 0; i < X; ++i) {
        x[i] = std::round(x[i] * 2.0f) / 2.0f;                                  // ties
        if (i % 37 == 5) x[i] = std::numeric_limits<float>::quiet_NaN();        // NaNs, some windows two
      }
      std::vector<float> dy = random_vector(Y, 6, -1.0f, 1.0f);
      for (size_t i = 0; i < Y; i += 7) dy[i] = -0.0f;
      std::vector<float> y(Y), dx(X, 42.0f), yr(Y), dxr(X);
      ASSERT_TRUE(max_pool_forward(s, x.data(), y.data()).is_ok());
      ASSERT_TRUE(max_pool_backward(s, x.data(), dy.data(), dx.data()).is_ok());
      ref::max_pool_forward<float>(s, x.data(), yr.data());
      ref::max_pool_backward<float>(s, x.data(), dy.data(), dxr.data());
      for (size_t i = 0; i < Y; ++i)
        ASSERT_TRUE(std::isnan(yr[i]) ? std::isnan(y[i]) : y[i] == yr[i]) << "y " << i << ": " << y[i] << " vs " << yr[i];
      for (size_t i = 0; i < X; ++i)
        ASSERT_EQ(std::signbit(dx[i]), std::signbit(dxr[i])) << "dx " << i;
      for (size_t i = 0; i < X; ++i) ASSERT_EQ(dx[i], dxr[i]) << "dx " << i;
    }
  }
}

}  // namespace
}  // namespace aspen::kernels
