// Tests of graph/ops_conv.cc: inferred types, values by hand, the three passes as each other's transposes,
// gradients (and the gradients of the backward passes) against finite differences, rule errors' wording.
#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/op_sample.h"

namespace aspen::graph {
namespace {

using testing::check_gradients;
using testing::random_feeds;
using testing::weighted_loss;

Attrs conv_attrs(std::vector<int64_t> st, std::vector<int64_t> dil, std::vector<int64_t> pb, std::vector<int64_t> pe,
                 int64_t groups) {
  return {{"strides", st}, {"dilations", dil}, {"pads_begin", pb}, {"pads_end", pe}, {"groups", groups}};
}

TEST(ConvOps, Types) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {2, 6, 7, 9}), w = b.input("w", DType::f32, {4, 3, 3, 3});
  const ValueId y = b.op1(OpKind::conv, {x, w}, conv_attrs({2, 2}, {1, 2}, {1, 0}, {1, 2}, 2));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  // H: (7 + 2 - 3) / 2 + 1 = 4; W: (9 + 2 - 5) / 2 + 1 = 4
  EXPECT_EQ(g.type(y), (TensorType{DType::f32, Shape{2, 4, 4, 4}}));
  const TensorType xt = g.type(x), wt = g.type(w);  // copies: adding nodes moves the graph's type table
  Attrs gi = conv_attrs({2, 2}, {1, 2}, {1, 0}, {1, 2}, 2);
  gi.set("input_shape", std::vector<int64_t>{7, 9});
  const ValueId dx = b.op1(OpKind::conv_grad_input, {y, w}, gi);
  EXPECT_EQ(g.type(dx), xt);
  Attrs gw = conv_attrs({2, 2}, {1, 2}, {1, 0}, {1, 2}, 2);
  gw.set("kernel", std::vector<int64_t>{3, 3});
  const ValueId dw = b.op1(OpKind::conv_grad_weight, {x, y}, gw);
  EXPECT_EQ(g.type(dw), wt);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
}

// y[o] = Σ_q x[2 o - 1 + q] w[q] + bias over x = 1..5 (zero outside), w = (1, 10, 100), stride 2, pads 1, 1.
TEST(ConvOps, HandValues) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {1, 1, 5}), w = b.input("w", DType::f32, {1, 1, 3});
  b.output("y", b.op1(OpKind::conv, {x, w, b.input("bias", DType::f32, {1})}, conv_attrs({2}, {1}, {1}, {1}, 1)));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto out = interpret(g, {{"x", HostArray(TensorType{DType::f32, Shape{1, 1, 5}}, {1, 2, 3, 4, 5})},
                           {"w", HostArray(TensorType{DType::f32, Shape{1, 1, 3}}, {1, 10, 100})},
                           {"bias", HostArray(TensorType{DType::f32, Shape{1}}, {0.5})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  // o = 0: 0·1 + 1·10 + 2·100; o = 1: 2 + 30 + 400; o = 2: 4 + 50 + 0
  EXPECT_EQ(out->at("y").data, (std::vector<double>{210.5, 432.5, 54.5}));
}

// <conv(x, w), dy> = <x, conv_grad_input(dy, w)> = <w, conv_grad_weight(x, dy)>: the passes are transposes.
TEST(ConvOps, PassesAreTransposes) {
  Graph g;
  Builder b(g);
  const std::vector<int64_t> xs = {2, 4, 6, 5}, ws = {6, 2, 3, 2};
  const Attrs base = conv_attrs({2, 1}, {1, 2}, {1, 1}, {0, 1}, 2);
  const ValueId x = b.input("x", DType::f32, sample_shape(xs)), w = b.input("w", DType::f32, sample_shape(ws));
  const ValueId y = b.op1(OpKind::conv, {x, w}, base);
  const ValueId dy = b.input("dy", DType::f32, b.type(y).shape);
  Attrs gi = base, gw = base;
  gi.set("input_shape", std::vector<int64_t>{6, 5});
  gw.set("kernel", std::vector<int64_t>{3, 2});
  auto dot = [&](ValueId p, ValueId q) {
    std::vector<int64_t> all;
    for (int i = 0; i < b.type(p).shape.rank(); ++i) all.push_back(i);
    return b.reduce_sum(b.mul(p, q), all);
  };
  b.output("y", dot(y, dy));
  b.output("x", dot(x, b.op1(OpKind::conv_grad_input, {dy, w}, gi)));
  b.output("w", dot(w, b.op1(OpKind::conv_grad_weight, {x, dy}, gw)));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto out = interpret(g, random_feeds(g, 3, -1.0, 1.0));
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const double v = out->at("y").data[0];
  EXPECT_GT(std::abs(v), 1e-3);
  EXPECT_NEAR(out->at("x").data[0], v, 1e-9 * (1 + std::abs(v)));
  EXPECT_NEAR(out->at("w").data[0], v, 1e-9 * (1 + std::abs(v)));
}

struct GradCase {
  std::vector<int64_t> x, w;
  Attrs attrs;
};

class ConvGradients : public ::testing::TestWithParam<int> {};

TEST_P(ConvGradients, MatchFiniteDifferences) {
  const std::vector<GradCase> cases = {
      {{2, 3, 5, 4}, {4, 3, 3, 2}, conv_attrs({1, 2}, {1, 1}, {1, 0}, {1, 1}, 1)},
      {{1, 4, 7}, {6, 2, 3}, conv_attrs({2}, {2}, {2}, {1}, 2)},
      {{1, 3, 4, 5}, {3, 1, 2, 3}, conv_attrs({1, 1}, {1, 1}, {1, 1}, {0, 1}, 3)},  // depthwise
      {{1, 2, 3, 4, 3}, {2, 2, 2, 2, 2}, conv_attrs({1, 2, 1}, {1, 1, 1}, {0, 1, 1}, {1, 0, 0}, 1)},
  };
  const GradCase& c = cases[size_t(GetParam())];
  // conv with a bias, then each backward pass differentiated in turn (the family's own gradients).
  for (OpKind op : {OpKind::conv, OpKind::conv_grad_input, OpKind::conv_grad_weight}) {
    Graph g;
    Builder b(g);
    const ValueId x = b.input("x", DType::f32, sample_shape(c.x)), w = b.input("w", DType::f32, sample_shape(c.w));
    const ValueId fwd = b.op1(OpKind::conv, {x, w}, c.attrs);
    const Shape ys = b.type(fwd).shape;
    ValueId out;
    if (op == OpKind::conv) {
      const ValueId y = b.op1(OpKind::conv, {b.mul(x, x), w, b.input("bias", DType::f32, Shape{c.w[0]})}, c.attrs);
      out = weighted_loss(b, b.mul(y, y), 5);
    } else if (op == OpKind::conv_grad_input) {
      Attrs a = c.attrs;
      a.set("input_shape", std::vector<int64_t>(c.x.begin() + 2, c.x.end()));
      const ValueId dy = b.input("dy", DType::f32, ys);
      out = weighted_loss(b, b.mul(b.op1(op, {b.mul(dy, dy), w}, a), x), 6);
    } else {
      Attrs a = c.attrs;
      a.set("kernel", std::vector<int64_t>(c.w.begin() + 2, c.w.end()));
      const ValueId dy = b.input("dy", DType::f32, ys);
      out = weighted_loss(b, b.mul(b.op1(op, {b.mul(x, x), dy}, a), w), 7);
    }
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    EXPECT_TRUE(check_gradients(g, out, random_feeds(g, 11, -1.0, 1.0))) << op_name(op);
  }
}
INSTANTIATE_TEST_SUITE_P(Cases, ConvGradients, ::testing::Range(0, 4));

TEST(ConvOps, Errors) {
  auto error = [](std::vector<int64_t> xs, std::vector<int64_t> ws, Attrs a) {
    Graph g;
    Builder b(g);
    b.op1(OpKind::conv, {b.input("x", DType::f32, sample_shape(xs)), b.input("w", DType::f32, sample_shape(ws))},
          std::move(a));
    return b.status().message();
  };
  EXPECT_EQ(error({1, 6, 5, 5}, {4, 3, 3, 3}, conv_attrs({1, 1}, {1, 1}, {0, 0}, {0, 0}, 4)),
            "node 2 (conv) with inputs (f32[1, 6, 5, 5], f32[4, 3, 3, 3]): conv: x and w: expected groups (4) "
            "dividing C and M, and w [M, C / groups, K...], found [1, 6, 5, 5] and [4, 3, 3, 3]");
  EXPECT_EQ(error({1, 3, 2, 5}, {4, 3, 3, 3}, conv_attrs({1, 1}, {1, 1}, {0, 0}, {0, 0}, 1)),
            "node 2 (conv) with inputs (f32[1, 3, 2, 5], f32[4, 3, 3, 3]): conv: x: expected spatial extents at "
            "least the dilated kernel [4, 3, 3, 3] after padding, found [1, 3, 2, 5]");
  EXPECT_EQ(error({1, 3, 5, 5}, {4, 3, 3, 3}, conv_attrs({1}, {1, 1}, {0, 0}, {0, 0}, 1)),
            "node 2 (conv) with inputs (f32[1, 3, 5, 5], f32[4, 3, 3, 3]): conv: strides, dilations, pads_begin, "
            "pads_end: expected 2 values each, found [1], [1, 1], [0, 0], [0, 0]");
}

}  // namespace
}  // namespace aspen::graph
