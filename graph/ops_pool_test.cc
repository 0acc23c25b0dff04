// Tests of graph/ops_pool.cc: inferred types (padding, dilation, a ceil-mode end), the gradient against finite
// differences, the rule errors' wording. (Values and ties by hand: kernels/pool_test.cc; the fast kernel
// against the reference: the sweep in ops_fast_test.cc.)
#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"

namespace aspen::graph {
namespace {

Attrs pool(std::vector<int64_t> k, std::vector<int64_t> st, std::vector<int64_t> dil, std::vector<int64_t> pb,
           std::vector<int64_t> pe) {
  return {{"kernel", k}, {"strides", st}, {"dilations", dil}, {"pads_begin", pb}, {"pads_end", pe}};
}

TEST(PoolOps, TypesFollowTheExtentFormula) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {2, 3, 7, 9});
  // rows: (7 + 1 + 0 - 3) / 2 + 1 = 3; columns: (9 + 0 + 1 - (2·2 + 1)) / 1 + 1 = 6.
  const ValueId y = b.op1(OpKind::max_pool, {x}, pool({3, 3}, {2, 1}, {1, 2}, {1, 0}, {0, 1}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(g.type(y), (TensorType{DType::f32, Shape{2, 3, 3, 6}}));
}

TEST(PoolOps, GradientMatchesFiniteDifferences) {
  struct Case {
    Shape x;
    Attrs attrs;
  };
  for (const Case& c : {Case{Shape{2, 3, 6, 6}, pool({2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0})},
                        Case{Shape{1, 2, 7, 5}, pool({3, 3}, {2, 1}, {1, 1}, {1, 0}, {1, 2})},
                        Case{Shape{2, 1, 8, 7}, pool({2, 3}, {1, 2}, {2, 1}, {0, 1}, {1, 1})}}) {
    SCOPED_TRACE(c.x.to_string());
    Graph g;
    Builder b(g);
    const ValueId x = b.input("x", DType::f32, c.x);
    const ValueId y = b.op1(OpKind::max_pool, {b.mul(x, x)}, c.attrs);
    const ValueId loss = testing::weighted_loss(b, y, 5);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    EXPECT_TRUE(testing::check_gradients(g, loss, testing::random_feeds(g, 6, 0.1, 1.0)));
  }
}

TEST(PoolOps, Errors) {
  auto error = [](Shape x, Attrs attrs) {
    Graph g;
    Builder b(g);
    b.op1(OpKind::max_pool, {b.input("x", DType::f32, x)}, std::move(attrs));
    return b.status().message();
  };
  EXPECT_EQ(error(Shape{2, 3, 4}, pool({2, 2}, {2, 2}, {1, 1}, {0, 0}, {0, 0})),
            "node 1 (max_pool) with inputs (f32[2, 3, 4]): max_pool: x: expected [N, C, H, W], found f32[2, 3, 4]");
  EXPECT_EQ(error(Shape{1, 1, 2, 2}, pool({3, 3}, {1, 1}, {1, 1}, {0, 0}, {0, 0})),
            "node 1 (max_pool) with inputs (f32[1, 1, 2, 2]): max_pool: x: expected spatial extents at least the "
            "dilated kernel [3, 3] after padding, found f32[1, 1, 2, 2]");
  EXPECT_EQ(error(Shape{1, 1, 4, 4}, pool({2, 2}, {0, 2}, {1, 1}, {0, 0}, {0, 0})),
            "node 1 (max_pool) with inputs (f32[1, 1, 4, 4]): max_pool: kernel, strides, dilations, pads: expected "
            "kernel, strides, dilations >= 1 and pads >= 0, found [2, 2], [0, 2], [1, 1], [0, 0], [0, 0]");
}

}  // namespace
}  // namespace aspen::graph
