#include "kernels/lstm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::close_nmse;
using testing::Guarded;
using testing::kGradNmse;
using testing::nmse_threshold;
using testing::numeric_grad;
using testing::random_vector;
using testing::to_f64;

struct Case {
  int64_t T, B, H;
  bool reverse;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (bool rev : {false, true}) {
    c.push_back({1, 1, 1, rev});
    c.push_back({2, 3, 7, rev});
    c.push_back({5, 1, 17, rev});
    c.push_back({3, 9, 3, rev});    // several row chunks on a team, a ragged last one
    c.push_back({4, 2, 129, rev});  // one past a vector of the 4H loops
  }
  return c;
}

std::string name(const Case& c, Isa isa) {
  return "T=" + std::to_string(c.T) + " B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) +
         (c.reverse ? " reverse" : "") + " isa=" + isa_name(isa);
}

struct Inputs {
  std::vector<float> xw, r, h0, c0, dy, dc;
};

Inputs inputs(const LstmShape& s, uint64_t seed) {
  const size_t T = size_t(s.T), B = size_t(s.B), H = size_t(s.H);
  return {random_vector(T * B * 4 * H, seed, -1.5f, 1.5f), random_vector(4 * H * H, seed + 1, -0.5f, 0.5f),
          random_vector(B * H, seed + 2), random_vector(B * H, seed + 3), random_vector(T * B * H, seed + 4),
          random_vector(T * B * H, seed + 5)};
}

// Every ISA variant, forward and backward (with and without dc), against the f64 reference, writing nothing
// outside its outputs.
TEST(Lstm, FastMatchesReference) {
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (const Case& k : cases()) {
      SCOPED_TRACE(name(k, isa));
      const LstmShape s{k.T, k.B, k.H, k.reverse};
      const Inputs in = inputs(s, 11);
      const size_t TBH = size_t(k.T * k.B * k.H), BH = size_t(k.B * k.H);
      Guarded<float> y(TBH), c(TBH), g(TBH * 4), work(size_t(lstm_forward_work(s)));
      ASSERT_TRUE(lstm_forward(s, in.xw.data(), in.r.data(), in.h0.data(), in.c0.data(), y.data(), c.data(),
                               g.data(), work.data())
                      .is_ok());
      std::vector<double> ry(TBH), rc(TBH), rg(TBH * 4);
      const auto xw = to_f64(in.xw), r = to_f64(in.r), h0 = to_f64(in.h0), c0 = to_f64(in.c0);
      ref::lstm_forward<double>(s, xw.data(), r.data(), h0.data(), c0.data(), ry.data(), rc.data(), rg.data());
      EXPECT_TRUE(close_nmse(y.cspan(), ry, nmse_threshold(DType::f32)));
      EXPECT_TRUE(close_nmse(c.cspan(), rc, nmse_threshold(DType::f32)));
      EXPECT_TRUE(close_nmse(g.cspan(), rg, nmse_threshold(DType::f32)));
      EXPECT_GUARDS(y);
      EXPECT_GUARDS(c);
      EXPECT_GUARDS(g);
      EXPECT_GUARDS(work);
      for (bool with_dc : {false, true}) {
        SCOPED_TRACE(with_dc ? "with dc" : "without dc");
        Guarded<float> dxw(TBH * 4), dh0(BH), dc0(BH);
        ASSERT_TRUE(lstm_backward(s, in.dy.data(), with_dc ? in.dc.data() : nullptr, in.r.data(), in.c0.data(),
                                  c.data(), g.data(), dxw.data(), dh0.data(), dc0.data())
                        .is_ok());
        std::vector<double> rdxw(TBH * 4), rdh0(BH), rdc0(BH);
        const auto dy = to_f64(in.dy), dc = to_f64(in.dc);
        ref::lstm_backward<double>(s, dy.data(), with_dc ? dc.data() : nullptr, r.data(), c0.data(), rc.data(),
                                   rg.data(), rdxw.data(), rdh0.data(), rdc0.data());
        EXPECT_TRUE(close_nmse(dxw.cspan(), rdxw, nmse_threshold(DType::f32)));
        EXPECT_TRUE(close_nmse(dh0.cspan(), rdh0, nmse_threshold(DType::f32)));
        EXPECT_TRUE(close_nmse(dc0.cspan(), rdc0, nmse_threshold(DType::f32)));
        EXPECT_GUARDS(dxw);
        EXPECT_GUARDS(dh0);
        EXPECT_GUARDS(dc0);
      }
    }
  }
}

// The reference backward is the derivative of the reference forward: L = Σ dy·y + Σ dc·c, differentiated by
// finite differences in xw, h0 and c0 (R's gradient is the caller's product of dxw and the h_{t-1}).
TEST(Lstm, ReferenceBackwardMatchesFiniteDifferences) {
  for (bool rev : {false, true}) {
    SCOPED_TRACE(rev ? "reverse" : "forward");
    const LstmShape s{3, 2, 3, rev};
    const Inputs in = inputs(s, 5);
    const size_t TBH = size_t(s.T * s.B * s.H), BH = size_t(s.B * s.H), X = TBH * 4;
    const auto dy = to_f64(in.dy), dc = to_f64(in.dc), r = to_f64(in.r);
    // One vector of everything differentiated: xw, then h0, then c0.
    std::vector<double> all = to_f64(in.xw);
    for (float v : in.h0) all.push_back(v);
    for (float v : in.c0) all.push_back(v);
    auto loss = [&](const std::vector<double>& v) {
      std::vector<double> y(TBH), c(TBH), g(X);
      ref::lstm_forward<double>(s, v.data(), r.data(), v.data() + X, v.data() + X + BH, y.data(), c.data(), g.data());
      double l = 0;
      for (size_t i = 0; i < TBH; ++i) l += dy[i] * y[i] + dc[i] * c[i];
      return l;
    };
    const std::vector<double> want = numeric_grad(loss, all);
    std::vector<double> y(TBH), c(TBH), g(X), dxw(X), dh0(BH), dc0(BH);
    ref::lstm_forward<double>(s, all.data(), r.data(), all.data() + X, all.data() + X + BH, y.data(), c.data(),
                              g.data());
    ref::lstm_backward<double>(s, dy.data(), dc.data(), r.data(), all.data() + X + BH, c.data(), g.data(),
                               dxw.data(), dh0.data(), dc0.data());
    std::vector<float> got(dxw.begin(), dxw.end());
    got.insert(got.end(), dh0.begin(), dh0.end());
    got.insert(got.end(), dc0.begin(), dc0.end());
    EXPECT_TRUE(close_nmse(got, want, kGradNmse));
  }
}

TEST(Lstm, RejectsEmptyShapes) {
  float buf[64] = {};
  const Status st = lstm_forward(LstmShape{0, 1, 1, false}, buf, buf, buf, buf, buf, buf, buf, buf);
  EXPECT_EQ(st.message(), "lstm_forward: T: expected >= 1, found 0");
  EXPECT_FALSE(lstm_backward(LstmShape{1, 1, 0, false}, buf, nullptr, buf, buf, buf, buf, buf, buf, buf).is_ok());
}

}  // namespace
}  // namespace aspen::kernels
