#include "kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::close_nmse;
using testing::Guarded;
using testing::kGradNmse;
using testing::kOddSizes;
using testing::nmse_threshold;
using testing::numeric_grad;
using testing::random_vector;
using testing::skip_big;
using testing::to_f64;

std::vector<int64_t> elementwise_sizes() {
  std::vector<int64_t> n = kOddSizes;
  n.push_back(768);
  n.push_back(70001);  // several chunks: runs on the whole team
  return n;
}

// A unary op: the public forward/backward and the f64 reference.
struct Unary {
  std::string name;
  std::function<Status(std::span<const float>, std::span<float>, int64_t)> fwd;
  std::function<Status(std::span<const float>, std::span<const float>, std::span<float>, int64_t)> bwd;
  std::function<void(const double*, double*, int64_t)> ref_fwd;
  std::function<void(const double*, const double*, double*, int64_t)> ref_bwd;
};

std::vector<Unary> unary_ops() {
  std::vector<Unary> ops;
  for (GeluKind kind : {GeluKind::tanh, GeluKind::erf}) {
    ops.push_back(
        {kind == GeluKind::tanh ? "gelu_tanh" : "gelu_erf",
         [kind](auto x, auto y, int64_t n) { return gelu_forward(x, y, n, kind); },
         [kind](auto x, auto dy, auto dx, int64_t n) { return gelu_backward(x, dy, dx, n, kind); },
         [kind](const double* x, double* y, int64_t n) { ref::gelu_forward(x, y, n, kind); },
         [kind](const double* x, const double* dy, double* dx, int64_t n) { ref::gelu_backward(x, dy, dx, n, kind); }});
  }
  ops.push_back({"silu", [](auto x, auto y, int64_t n) { return silu_forward(x, y, n); },
                 [](auto x, auto dy, auto dx, int64_t n) { return silu_backward(x, dy, dx, n); },
                 [](const double* x, double* y, int64_t n) { ref::silu_forward(x, y, n); },
                 [](const double* x, const double* dy, double* dx, int64_t n) { ref::silu_backward(x, dy, dx, n); }});
  const float alpha = -1.75f;
  ops.push_back({"scale", [alpha](auto x, auto y, int64_t n) { return scale_forward(x, y, n, alpha); },
                 [alpha](auto, auto dy, auto dx, int64_t n) { return scale_backward(dy, dx, n, alpha); },
                 [alpha](const double* x, double* y, int64_t n) { ref::scale_forward(x, y, n, double(alpha)); },
                 [alpha](const double*, const double* dy, double* dx, int64_t n) {
                   ref::scale_backward(dy, dx, n, double(alpha));
                 }});
  return ops;
}

TEST(Activation, UnaryMatchesReference) {
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (const Unary& op : unary_ops()) {
      for (int64_t n : elementwise_sizes()) {
        if (skip_big(n, isa)) continue;
        SCOPED_TRACE(op.name + " N=" + std::to_string(n) + " isa=" + isa_name(isa));
        const std::vector<float> x = random_vector(n, 1 + n, -6.0f, 6.0f), dy = random_vector(n, 2 + n);
        Guarded<float> y(n), dx(n);
        ASSERT_TRUE(op.fwd(x, y.span(), n).is_ok());
        ASSERT_TRUE(op.bwd(x, dy, dx.span(), n).is_ok());
        std::vector<double> xd = to_f64(x), dyd = to_f64(dy), want_y(n), want_dx(n);
        op.ref_fwd(xd.data(), want_y.data(), n);
        op.ref_bwd(xd.data(), dyd.data(), want_dx.data(), n);
        EXPECT_TRUE(close_nmse(y.cspan(), want_y, nmse_threshold(DType::f32)));
        EXPECT_TRUE(close_nmse(dx.cspan(), want_dx, nmse_threshold(DType::f32)));
        EXPECT_GUARDS(y);
        EXPECT_GUARDS(dx);
      }
    }
  }
}

TEST(Activation, UnaryBackwardMatchesFiniteDifferences) {
  const int64_t n = 9;
  for (const Unary& op : unary_ops()) {
    SCOPED_TRACE(op.name);
    const std::vector<float> x = random_vector(n, 11, -3.0f, 3.0f), dy = random_vector(n, 12);
    std::vector<float> dx(n);
    ASSERT_TRUE(op.bwd(x, dy, dx, n).is_ok());
    const std::vector<double> dyd = to_f64(dy);
    auto loss = [&](const std::vector<double>& xs) {
      std::vector<double> y(n);
      op.ref_fwd(xs.data(), y.data(), n);
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += dyd[i] * y[i];
      return s;
    };
    EXPECT_TRUE(close_nmse(dx, numeric_grad(loss, to_f64(x)), kGradNmse));
  }
}

TEST(Activation, ExtremeInputsSaturate) {
  const std::vector<float> x = {-1e30f, -1e4f, -100.0f, -20.0f, 0.0f, 20.0f, 100.0f, 1e4f};
  const int64_t n = int64_t(x.size());
  const std::vector<float> ones(n, 1.0f);
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (const Unary& op : unary_ops()) {
      if (op.name == "scale") continue;
      SCOPED_TRACE(op.name + " isa=" + isa_name(isa));
      std::vector<float> y(n), dx(n);
      ASSERT_TRUE(op.fwd(x, y, n).is_ok());
      ASSERT_TRUE(op.bwd(x, ones, dx, n).is_ok());
      for (int64_t i = 0; i < n; ++i) {
        const bool neg = x[i] < 0;
        EXPECT_NEAR(y[i], neg ? 0.0f : x[i], std::abs(x[i]) * 1e-6f) << "x=" << x[i];
        if (x[i] != 0.0f && std::abs(x[i]) < 1e20f) {
          EXPECT_NEAR(dx[i], neg ? 0.0f : 1.0f, 1e-6f) << "x=" << x[i];
        }
      }
    }
  }
}

TEST(Activation, BinaryMatchesReference) {
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (int64_t n : elementwise_sizes()) {
      if (skip_big(n, isa)) continue;
      SCOPED_TRACE("N=" + std::to_string(n) + " isa=" + isa_name(isa));
      const std::vector<float> a = random_vector(n, 3 + n), b = random_vector(n, 4 + n, -2.0f, 2.0f),
                               dy = random_vector(n, 5 + n);
      Guarded<float> y(n), da(n), db(n);
      std::vector<float> wy(n), wa(n), wb(n);
      ASSERT_TRUE(add_forward(a, b, y.span(), n).is_ok());
      ref::add_forward(a.data(), b.data(), wy.data(), n);
      EXPECT_EQ(y.vec(), wy);
      ASSERT_TRUE(add_backward(dy, da.span(), db.span(), n).is_ok());
      EXPECT_EQ(da.vec(), dy);
      EXPECT_EQ(db.vec(), dy);
      ASSERT_TRUE(mul_forward(a, b, y.span(), n).is_ok());
      ref::mul_forward(a.data(), b.data(), wy.data(), n);
      EXPECT_EQ(y.vec(), wy);
      ASSERT_TRUE(mul_backward(a, b, dy, da.span(), db.span(), n).is_ok());
      ref::mul_backward(a.data(), b.data(), dy.data(), wa.data(), wb.data(), n);
      EXPECT_EQ(da.vec(), wa);
      EXPECT_EQ(db.vec(), wb);
      EXPECT_GUARDS(y);
      EXPECT_GUARDS(da);
      EXPECT_GUARDS(db);
    }
  }
}

// The forward-only maps (their gradients are graph rules over other ops).
TEST(Activation, ForwardOnlyMatchReference) {
  struct Map {
    const char* name;
    Status (*fwd)(std::span<const float>, std::span<float>, int64_t);
    void (*ref)(const double*, double*, int64_t);
    float lo, hi;
  };
  const Map maps[] = {{"exp", exp_forward, ref::exp_forward<double>, -80.0f, 80.0f},
                      {"tanh", tanh_forward, ref::tanh_forward<double>, -10.0f, 10.0f},
                      {"sqrt", sqrt_forward, ref::sqrt_forward<double>, 0.0f, 1e4f}};
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (int64_t n : elementwise_sizes()) {
      if (skip_big(n, isa)) continue;
      SCOPED_TRACE("N=" + std::to_string(n) + " isa=" + isa_name(isa));
      for (const Map& m : maps) {
        SCOPED_TRACE(m.name);
        const std::vector<float> x = random_vector(n, 41 + n, m.lo, m.hi);
        Guarded<float> y(n);
        ASSERT_TRUE(m.fwd(x, y.span(), n).is_ok());
        std::vector<double> want(n);
        m.ref(to_f64(x).data(), want.data(), n);
        // Elementwise relative error (exp spans 70 decades: an NMSE would see only the largest).
        for (int64_t i = 0; i < n; ++i)
          ASSERT_NEAR(y.vec()[i], want[i], 4e-7 * std::abs(want[i]) + 1e-30) << "x=" << x[i];
        EXPECT_GUARDS(y);
      }
      const std::vector<float> a = random_vector(n, 51 + n), b = random_vector(n, 52 + n, 0.5f, 2.0f);
      std::vector<uint8_t> cond(n);
      for (int64_t i = 0; i < n; ++i) cond[i] = uint8_t((i * 7 + n) % 3 == 0 ? 0 : (i % 5) + 1);
      Guarded<float> y(n);
      std::vector<float> want(n);
      ASSERT_TRUE(sub_forward(a, b, y.span(), n).is_ok());
      ref::sub_forward(a.data(), b.data(), want.data(), n);
      EXPECT_EQ(y.vec(), want);
      ASSERT_TRUE(div_forward(a, b, y.span(), n).is_ok());
      ref::div_forward(a.data(), b.data(), want.data(), n);
      EXPECT_EQ(y.vec(), want);
      ASSERT_TRUE(where_forward(cond, a, b, y.span(), n).is_ok());
      ref::where_forward(cond.data(), a.data(), b.data(), want.data(), n);
      EXPECT_EQ(y.vec(), want);
      EXPECT_GUARDS(y);
    }
  }
  // Edges: sqrt below 0 is NaN, x / 0 is inf, exp saturates to inf and 0.
  const std::vector<float> x = {-1.0f, 0.0f, 100.0f, -200.0f};
  std::vector<float> y(4);
  ASSERT_TRUE(sqrt_forward(x, y, 4).is_ok());
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  ASSERT_TRUE(exp_forward(x, y, 4).is_ok());
  EXPECT_EQ(y[2], INFINITY);
  EXPECT_EQ(y[3], 0.0f);
  ASSERT_TRUE(div_forward(std::vector<float>{1.0f}, std::vector<float>{0.0f}, std::span(y).first(1), 1).is_ok());
  EXPECT_EQ(y[0], INFINITY);
  // int32 add wraps.
  std::vector<int32_t> c(1);
  ASSERT_TRUE(add_forward(std::vector<int32_t>{INT32_MAX}, std::vector<int32_t>{2}, std::span(c), 1).is_ok());
  EXPECT_EQ(c[0], INT32_MIN + 1);
  EXPECT_EQ(
      where_forward(std::vector<uint8_t>(2), std::vector<float>(3), std::vector<float>(3), std::span(y), 3).message(),
      "where_forward: argument 'cond': expected at least 3 elements, found 2");
}

TEST(Activation, BinaryBackwardMatchesFiniteDifferences) {
  const int64_t n = 5;
  const std::vector<float> a = random_vector(n, 21), b = random_vector(n, 22), dy = random_vector(n, 23);
  std::vector<float> da(n), db(n);
  ASSERT_TRUE(mul_backward(a, b, dy, da, db, n).is_ok());
  const std::vector<double> ad = to_f64(a), bd = to_f64(b), dyd = to_f64(dy);
  auto loss_a = [&](const std::vector<double>& v) {
    std::vector<double> y(n);
    ref::mul_forward(v.data(), bd.data(), y.data(), n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += dyd[i] * y[i];
    return s;
  };
  auto loss_b = [&](const std::vector<double>& v) {
    std::vector<double> y(n);
    ref::mul_forward(ad.data(), v.data(), y.data(), n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += dyd[i] * y[i];
    return s;
  };
  EXPECT_TRUE(close_nmse(da, numeric_grad(loss_a, ad), kGradNmse));
  EXPECT_TRUE(close_nmse(db, numeric_grad(loss_b, bd), kGradNmse));

  ASSERT_TRUE(add_backward(dy, da, db, n).is_ok());
  auto add_loss = [&](const std::vector<double>& v) {
    std::vector<double> y(n);
    ref::add_forward(v.data(), bd.data(), y.data(), n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += dyd[i] * y[i];
    return s;
  };
  EXPECT_TRUE(close_nmse(da, numeric_grad(add_loss, ad), kGradNmse));
  EXPECT_EQ(db, da);
}

TEST(Activation, InPlace) {
  const int64_t n = 1000;
  std::vector<float> x = random_vector(n, 31, -4.0f, 4.0f), want(n);
  ref::gelu_forward(x.data(), want.data(), n, GeluKind::tanh);
  ASSERT_TRUE(gelu_forward(x, x, n, GeluKind::tanh).is_ok());
  EXPECT_TRUE(close_nmse(x, want, nmse_threshold(DType::f32)));
}

TEST(Activation, ReferenceModeRoutesToReference) {
  ScopedReferenceMode on(true);
  const int64_t n = 257;
  const std::vector<float> x = random_vector(n, 41, -5.0f, 5.0f);
  std::vector<float> got(n), want(n);
  ASSERT_TRUE(gelu_forward(x, got, n, GeluKind::erf).is_ok());
  ref::gelu_forward(x.data(), want.data(), n, GeluKind::erf);
  EXPECT_EQ(got, want);
}

TEST(BiasGelu, MatchesReference) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t r : kOddSizes)
    for (int64_t c : kOddSizes) shapes.push_back({r, c});
  shapes.push_back({5, 768});
  shapes.push_back({521, 129});  // several dbias row blocks, on the whole team
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (GeluKind kind : {GeluKind::tanh, GeluKind::erf}) {
      for (auto [R, C] : shapes) {
        if (skip_big(R * C, isa)) continue;
        SCOPED_TRACE("R=" + std::to_string(R) + " C=" + std::to_string(C) + " kind=" + std::to_string(int(kind)) +
                     " isa=" + isa_name(isa));
        const std::vector<float> x = random_vector(R * C, 51 + R, -4.0f, 4.0f), bias = random_vector(C, 52 + C),
                                 dy = random_vector(R * C, 53 + C);
        Guarded<float> y(R * C), dx(R * C), dbias(C);
        ASSERT_TRUE(bias_gelu_forward(x, bias, y.span(), R, C, kind).is_ok());
        ASSERT_TRUE(bias_gelu_backward(x, bias, dy, dx.span(), dbias.span(), R, C, kind).is_ok());
        const std::vector<double> xd = to_f64(x), bd = to_f64(bias), dyd = to_f64(dy);
        std::vector<double> wy(R * C), wdx(R * C), wdb(C);
        ref::bias_gelu_forward(xd.data(), bd.data(), wy.data(), R, C, kind);
        ref::bias_gelu_backward(xd.data(), bd.data(), dyd.data(), wdx.data(), wdb.data(), R, C, kind);
        EXPECT_TRUE(close_nmse(y.cspan(), wy, nmse_threshold(DType::f32)));
        EXPECT_TRUE(close_nmse(dx.cspan(), wdx, nmse_threshold(DType::f32)));
        EXPECT_TRUE(close_nmse(dbias.cspan(), wdb, nmse_threshold(DType::f32)));
        EXPECT_GUARDS(y);
        EXPECT_GUARDS(dx);
        EXPECT_GUARDS(dbias);
      }
    }
  }
}

TEST(BiasGelu, BackwardMatchesFiniteDifferences) {
  const int64_t R = 3, C = 5;
  for (GeluKind kind : {GeluKind::tanh, GeluKind::erf}) {
    const std::vector<float> x = random_vector(R * C, 61, -3.0f, 3.0f), bias = random_vector(C, 62),
                             dy = random_vector(R * C, 63);
    std::vector<float> dx(R * C), dbias(C);
    ASSERT_TRUE(bias_gelu_backward(x, bias, dy, dx, dbias, R, C, kind).is_ok());
    const std::vector<double> xd = to_f64(x), bd = to_f64(bias), dyd = to_f64(dy);
    auto loss = [&](const std::vector<double>& xs, const std::vector<double>& bs) {
      std::vector<double> y(R * C);
      ref::bias_gelu_forward(xs.data(), bs.data(), y.data(), R, C, kind);
      double s = 0;
      for (int64_t i = 0; i < R * C; ++i) s += dyd[i] * y[i];
      return s;
    };
    EXPECT_TRUE(close_nmse(dx, numeric_grad([&](const std::vector<double>& v) { return loss(v, bd); }, xd), kGradNmse));
    EXPECT_TRUE(
        close_nmse(dbias, numeric_grad([&](const std::vector<double>& v) { return loss(xd, v); }, bd), kGradNmse));
  }
}

TEST(BiasGelu, DbiasIndependentOfThreadCount) {
  const int64_t R = 521, C = 129;
  const std::vector<float> x = random_vector(R * C, 71, -4.0f, 4.0f), bias = random_vector(C, 72),
                           dy = random_vector(R * C, 73);
  std::vector<float> dx1(R * C), db1(C), dx2(R * C), db2(C);
  {
    ScopedOmpThreads one(1);
    ASSERT_TRUE(bias_gelu_backward(x, bias, dy, dx1, db1, R, C, GeluKind::tanh).is_ok());
  }
  {
    ScopedOmpThreads two(2);
    ASSERT_TRUE(bias_gelu_backward(x, bias, dy, dx2, db2, R, C, GeluKind::tanh).is_ok());
  }
  EXPECT_EQ(0, std::memcmp(db1.data(), db2.data(), C * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), R * C * sizeof(float)));
}

TEST(Activation, BadArgumentsAreStatus) {
  std::vector<float> x(17), y(16), bias(4);
  Status s = gelu_forward(x, y, 17, GeluKind::tanh);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "gelu_forward: argument 'y': expected at least 17 elements, found 16");
  EXPECT_EQ(silu_forward(x, y, -1).message(), "silu_forward: N: expected >= 0, found -1");
  EXPECT_EQ(gelu_backward(x, x, x, 17, GeluKind(7)).message(),
            "gelu_backward: kind: expected GeluKind::tanh or GeluKind::erf, found 7");
  EXPECT_EQ(bias_gelu_forward(x, bias, x, 3, 5, GeluKind::erf).message(),
            "bias_gelu_forward: argument 'bias': expected at least 5 elements, found 4");
  EXPECT_EQ(add_forward({}, x, x, 2).message(),
            "add_forward: argument 'a': expected a buffer of 2 elements, found a null pointer");
  EXPECT_TRUE(mul_forward({}, {}, {}, 0).is_ok());
}

}  // namespace
}  // namespace aspen::kernels
