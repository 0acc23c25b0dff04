// Tests of kernels/conv.h's plans against the references, at the sizes the graph samples do not reach: layers
// large enough that oneDNN picks blocked layouts (the reorders in and out), ResNet's stem and its strided 1x1
// shortcut, depthwise, a channel count one past a vector width, and 10 channels (NOTE [channels-last
// backward]). Outputs between guard bytes; the same plan run twice (the per-thread scratch reused).
#include <gtest/gtest.h>

#include "kernels/conv.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::close_nmse;
using testing::Guarded;
using testing::random_vector;

struct Case {
  const char* label;
  int64_t N, C, M, groups, H, W, K, stride, pad;
};

ConvShape shape_of(const Case& c) {
  ConvShape s;
  s.N = c.N, s.C = c.C, s.M = c.M, s.groups = c.groups;
  s.D = {1, c.H, c.W}, s.K = {1, c.K, c.K}, s.S = {1, c.stride, c.stride};
  s.PadBegin = {0, c.pad, c.pad}, s.PadEnd = {0, c.pad, c.pad};
  s.set_outputs();
  return s;
}

class ConvPlans : public ::testing::TestWithParam<Case> {};

TEST_P(ConvPlans, MatchTheReference) {
  const ConvShape s = shape_of(GetParam());
  const std::vector<float> x = random_vector(size_t(s.x_numel()), 1), w = random_vector(size_t(s.w_numel()), 2),
                           dy = random_vector(size_t(s.y_numel()), 3), bias = random_vector(size_t(s.M), 4);
  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), dyd(dy.begin(), dy.end()),
      bd(bias.begin(), bias.end());
  for (ConvPass pass : {ConvPass::forward, ConvPass::backward_data, ConvPass::backward_weights}) {
    SCOPED_TRACE(s.to_string() + " pass " + std::to_string(int(pass)));
    auto plan = ConvPlan::make(s, pass, DType::f32, pass == ConvPass::forward);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    const int64_t n = pass == ConvPass::forward ? s.y_numel() : pass == ConvPass::backward_data ? s.x_numel() : s.w_numel();
    std::vector<double> want(static_cast<size_t>(n));
    if (pass == ConvPass::forward) ref::conv_forward<double>(s, xd.data(), wd.data(), bd.data(), want.data());
    if (pass == ConvPass::backward_data) ref::conv_backward_data<double>(s, dyd.data(), wd.data(), want.data());
    if (pass == ConvPass::backward_weights) ref::conv_backward_weights<double>(s, xd.data(), dyd.data(), want.data());
    for (int twice = 0; twice < 2; ++twice) {
      Guarded<float> out(size_t(n), 1e30f);
      Status st = pass == ConvPass::forward         ? plan->run(x.data(), w.data(), bias.data(), out.data())
                  : pass == ConvPass::backward_data ? plan->run(dy.data(), w.data(), nullptr, out.data())
                                                    : plan->run(x.data(), dy.data(), nullptr, out.data());
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_TRUE(close_nmse(out.cspan(), std::span<const double>(want), 1e-10));
      EXPECT_GUARDS(out);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvPlans,
                         ::testing::Values(Case{"resnet stem", 2, 3, 64, 1, 30, 30, 7, 2, 3},
                                           Case{"3x3 blocked", 2, 64, 64, 1, 9, 9, 3, 1, 1},
                                           Case{"1x1 stride 2", 3, 64, 128, 1, 8, 8, 1, 2, 0},
                                           Case{"depthwise", 2, 48, 48, 48, 11, 7, 3, 2, 1},
                                           Case{"odd channels", 1, 17, 33, 1, 6, 5, 3, 1, 1},
                                           Case{"pipelining tutorial", 4, 10, 20, 1, 12, 12, 5, 1, 0},
                                           Case{"groups", 2, 32, 64, 4, 7, 7, 3, 1, 1}),
                         [](const auto& p) {
                           std::string s = p.param.label;
                           for (char& ch : s)
                             if (ch == ' ') ch = '_';
                           return s;
                         });

// Fixed weights (forward and backward_data, f32 and bf16): the plan keeps its reordered copy, so a run after
// the weights changed without b_changed() still uses the old ones, and after b_changed() the new ones.
TEST(ConvPlans, FixedWeightsKeptUntilChanged) {
  const ConvShape s = shape_of(Case{"", 2, 32, 48, 1, 7, 6, 3, 1, 1});
  const std::vector<float> x = random_vector(size_t(s.x_numel()), 5), dy = random_vector(size_t(s.y_numel()), 6);
  std::vector<float> w = random_vector(size_t(s.w_numel()), 7);
  const std::vector<float> w2 = random_vector(size_t(s.w_numel()), 8);
  for (ConvPass pass : {ConvPass::forward, ConvPass::backward_data}) {
    SCOPED_TRACE(int(pass));
    auto plan = ConvPlan::make(s, pass, DType::f32, false, /*b_fixed=*/true);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    const std::vector<float>& a = pass == ConvPass::forward ? x : dy;
    const int64_t n = pass == ConvPass::forward ? s.y_numel() : s.x_numel();
    auto want = [&](const std::vector<float>& wv) {
      std::vector<double> r(static_cast<size_t>(n)), ad(a.begin(), a.end()), wd(wv.begin(), wv.end());
      if (pass == ConvPass::forward) ref::conv_forward<double>(s, ad.data(), wd.data(), nullptr, r.data());
      else ref::conv_backward_data<double>(s, ad.data(), wd.data(), r.data());
      return r;
    };
    std::vector<float> wbuf = w, out(static_cast<size_t>(n));
    ASSERT_TRUE(plan->run(a.data(), wbuf.data(), nullptr, out.data()).is_ok());
    EXPECT_TRUE(close_nmse(out, want(w), 1e-10));
    wbuf = w2;  // changed without telling the plan: the kept copy is used
    ASSERT_TRUE(plan->run(a.data(), wbuf.data(), nullptr, out.data()).is_ok());
    EXPECT_TRUE(close_nmse(out, want(w), 1e-10));
    plan->b_changed();
    ASSERT_TRUE(plan->run(a.data(), wbuf.data(), nullptr, out.data()).is_ok());
    EXPECT_TRUE(close_nmse(out, want(w2), 1e-10));
  }
}

TEST(ConvPlans, RefusesWhatItCannotRun) {
  ConvShape s = shape_of(Case{"", 1, 6, 4, 4, 5, 5, 3, 1, 1});
  auto plan = ConvPlan::make(s, ConvPass::forward, DType::f32);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("channels a multiple of groups"), std::string::npos) << plan.status().message();
  s = shape_of(Case{"", 1, 4, 4, 1, 5, 5, 3, 1, 1});
  plan = ConvPlan::make(s, ConvPass::forward, DType::i32);
  ASSERT_FALSE(plan.is_ok());
  EXPECT_NE(plan.status().message().find("f32, bf16 or f16"), std::string::npos) << plan.status().message();
}

}  // namespace
}  // namespace aspen::kernels
