// Tests of graph/ops_batchnorm.cc: inferred types, values by hand, gradients against finite differences, the
// rule errors' wording. (The fast kernel against the reference: the sweep in ops_fast_test.cc.)
#include <gtest/gtest.h>

#include <cmath>

#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"

namespace aspen::graph {
namespace {

// Channel 0 holds 1, 2 (sample 0) and 3, 4 (sample 1): mean 2.5, variance 1.25; channel 1 holds 0 and 10.
TEST(BatchNormOps, HandValuesAndTypes) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {2, 2, 2});
  const std::vector<ValueId> f =
      b.op(OpKind::batch_norm, {x, b.input("gamma", DType::f32, {2}), b.input("beta", DType::f32, {2})},
           {{"eps", 0.0}});
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(g.type(f[1]), (TensorType{DType::f32, Shape{2}}));
  b.output("y", f[0]);
  b.output("mean", f[1]);
  b.output("rstd", f[2]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto out = interpret(g, {{"x", HostArray(TensorType{DType::f32, Shape{2, 2, 2}}, {1, 2, 0, 0, 3, 4, 10, 10})},
                           {"gamma", HostArray(TensorType{DType::f32, Shape{2}}, {2, 1})},
                           {"beta", HostArray(TensorType{DType::f32, Shape{2}}, {0.5, -1})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("mean").data, (std::vector<double>{2.5, 5}));
  const double r0 = 1 / std::sqrt(1.25), r1 = 1 / std::sqrt(25.0);
  EXPECT_NEAR(out->at("rstd").data[0], r0, 1e-6);
  EXPECT_NEAR(out->at("rstd").data[1], r1, 1e-6);
  const std::vector<double> want = {(1 - 2.5) * r0 * 2 + 0.5, (2 - 2.5) * r0 * 2 + 0.5, -2, -2,
                                    (3 - 2.5) * r0 * 2 + 0.5, (4 - 2.5) * r0 * 2 + 0.5, 0,  0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out->at("y").data[i], want[i], 1e-6) << i;
}

TEST(BatchNormOps, GradientsMatchFiniteDifferences) {
  for (const Shape& shape : {Shape{3, 2, 4}, Shape{4, 3}, Shape{2, 2, 2, 3}}) {
    SCOPED_TRACE(shape.to_string());
    Graph g;
    Builder b(g);
    const ValueId x = b.input("x", DType::f32, shape);
    const ValueId gamma = b.input("gamma", DType::f32, Shape{shape[1]}), beta = b.input("beta", DType::f32, Shape{shape[1]});
    const std::vector<ValueId> f = b.op(OpKind::batch_norm, {b.mul(x, x), gamma, beta}, {{"eps", 1e-3}});
    ASSERT_EQ(f.size(), 3u);
    const ValueId loss = testing::weighted_loss(b, b.mul(f[0], f[0]), 9);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    EXPECT_TRUE(testing::check_gradients(g, loss, testing::random_feeds(g, 4, -1.0, 1.0)));
  }
}

TEST(BatchNormOps, Errors) {
  auto error = [](Shape x, Shape gamma) {
    Graph g;
    Builder b(g);
    b.op(OpKind::batch_norm,
         {b.input("x", DType::f32, x), b.input("gamma", DType::f32, gamma), b.input("beta", DType::f32, gamma)},
         {{"eps", 1e-5}});
    return b.status().message();
  };
  EXPECT_EQ(error(Shape{4}, Shape{4}),
            "node 3 (batch_norm) with inputs (f32[4], f32[4], f32[4]): batch_norm: x: expected [N, C, D...] (rank 2 "
            "or more), found f32[4]");
  EXPECT_EQ(error(Shape{2, 3, 5}, Shape{5}),
            "node 3 (batch_norm) with inputs (f32[2, 3, 5], f32[5], f32[5]): batch_norm: gamma: expected f32[3] "
            "(x's channels and dtype), found f32[5]");
}

}  // namespace
}  // namespace aspen::graph
