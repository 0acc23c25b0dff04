// Tests of graph/ops_lstm.cc: inferred types, one step by hand, gradients of every input against finite
// differences (through y, through c, through both), the rule errors' wording. (The fast kernel against the
// reference: the sweep in ops_fast_test.cc.)
#include <gtest/gtest.h>

#include <cmath>

#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"

namespace aspen::graph {
namespace {

double sig(double x) { return 1 / (1 + std::exp(-x)); }

// One step, one unit: z = xw + h0 r, gates in ONNX's order i, o, f, c.
TEST(LstmOps, OneStepByHand) {
  Graph g;
  Builder b(g);
  const ValueId xw = b.input("xw", DType::f32, {1, 1, 4});
  const std::vector<ValueId> f = b.op(OpKind::lstm, {xw, b.input("r", DType::f32, {4, 1}),
                                                     b.input("h0", DType::f32, {1, 1}), b.input("c0", DType::f32, {1, 1})});
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(g.type(f[0]), (TensorType{DType::f32, Shape{1, 1, 1}}));
  EXPECT_EQ(g.type(f[2]), (TensorType{DType::f32, Shape{1, 1, 4}}));
  b.output("y", f[0]);
  b.output("c", f[1]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const std::vector<double> x = {0.1, -0.2, 0.3, 0.4}, r = {0.5, 0.6, -0.7, 0.8};
  const double h0 = 0.25, c0 = -0.5;
  auto out = interpret(g, {{"xw", HostArray(TensorType{DType::f32, Shape{1, 1, 4}}, x)},
                           {"r", HostArray(TensorType{DType::f32, Shape{4, 1}}, r)},
                           {"h0", HostArray(TensorType{DType::f32, Shape{1, 1}}, {h0})},
                           {"c0", HostArray(TensorType{DType::f32, Shape{1, 1}}, {c0})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const double i = sig(x[0] + h0 * r[0]), o = sig(x[1] + h0 * r[1]), fg = sig(x[2] + h0 * r[2]);
  const double cc = std::tanh(x[3] + h0 * r[3]), c = fg * c0 + i * cc;
  EXPECT_NEAR(out->at("c").data[0], c, 1e-12);
  EXPECT_NEAR(out->at("y").data[0], o * std::tanh(c), 1e-12);
}

// Loss through y, through c, or both; both directions; every input (xw, r, h0, c0) differentiated.
TEST(LstmOps, GradientsMatchFiniteDifferences) {
  for (int reverse : {0, 1})
    for (int through : {0, 1, 2}) {  // y, c, both
      SCOPED_TRACE(std::string(reverse ? "reverse" : "forward") + " through " + std::to_string(through));
      const int64_t T = 3, B = 2, H = 3;
      Graph g;
      Builder b(g);
      const ValueId xw = b.input("xw", DType::f32, {T, B, 4 * H});
      const ValueId r = b.input("r", DType::f32, {4 * H, H});
      const ValueId h0 = b.input("h0", DType::f32, {B, H}), c0 = b.input("c0", DType::f32, {B, H});
      const std::vector<ValueId> f = b.op(OpKind::lstm, {b.mul(xw, xw), r, h0, c0}, {{"reverse", int64_t(reverse)}});
      ASSERT_EQ(f.size(), 3u);
      ValueId loss = through == 1 ? testing::weighted_loss(b, f[1], 3) : testing::weighted_loss(b, f[0], 3);
      if (through == 2) loss = b.add(loss, testing::weighted_loss(b, f[1], 4));
      ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
      EXPECT_TRUE(testing::check_gradients(g, loss, testing::random_feeds(g, 7, -1.0, 1.0)));
    }
}

TEST(LstmOps, Errors) {
  auto error = [](Shape xw, Shape r, Shape h) {
    Graph g;
    Builder b(g);
    b.op(OpKind::lstm, {b.input("xw", DType::f32, xw), b.input("r", DType::f32, r), b.input("h0", DType::f32, h),
                        b.input("c0", DType::f32, h)});
    return b.status().message();
  };
  EXPECT_EQ(error(Shape{2, 3, 6}, Shape{6, 1}, Shape{3, 1}),
            "node 4 (lstm) with inputs (f32[2, 3, 6], f32[6, 1], f32[3, 1], f32[3, 1]): lstm: xw: expected [T, B, "
            "4H] with T, B, H >= 1, found f32[2, 3, 6]");
  EXPECT_EQ(error(Shape{2, 3, 8}, Shape{8, 3}, Shape{3, 2}),
            "node 4 (lstm) with inputs (f32[2, 3, 8], f32[8, 3], f32[3, 2], f32[3, 2]): lstm: r: expected f32[8, 2] "
            "([4H, H] of xw's dtype), found f32[8, 3]");
}

}  // namespace
}  // namespace aspen::graph
