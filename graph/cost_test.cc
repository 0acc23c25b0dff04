// graph/cost.h's FLOPs (NOTE [node FLOPs]) against the formulas written out by hand, and the name scopes
// (NOTE [name scopes]) the builder and autodiff give nodes.
#include "graph/cost.h"

#include <gtest/gtest.h>

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace aspen::graph {
namespace {

TEST(NodeFlops, ProductsCountTwoPerMultiplyAdd) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {3, 5, 7}), w = b.input("w", DType::f32, {7, 11});
  const ValueId y = b.matmul(x, w);                                            // [3, 5, 11], K = 7
  const ValueId wt = b.input("wt", DType::f32, {11, 7});
  const ValueId z = b.matmul(x, wt, false, true);                              // trans_b: K = 7
  const ValueId a = b.input("a", DType::f32, {7, 5}), c = b.input("c", DType::f32, {7, 4});
  const ValueId t = b.matmul(a, c, /*trans_a=*/true);                          // [5, 4], K = 7
  const ValueId e = b.gelu(y);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(node_flops(g, g.producer(y)), 2.0 * 3 * 5 * 11 * 7);
  EXPECT_EQ(node_flops(g, g.producer(z)), 2.0 * 3 * 5 * 11 * 7);
  EXPECT_EQ(node_flops(g, g.producer(t)), 2.0 * 5 * 4 * 7);
  EXPECT_EQ(node_flops(g, g.producer(e)), 0.0);  // bytes, not products
  EXPECT_EQ(node_flops(g, g.producer(x)), 0.0);
}

TEST(NodeFlops, AttentionCountsEveryMaskInFullAndItsGradientTwice) {
  Graph g;
  Builder b(g);
  // B 2, H 4 query heads over 2 key/value heads, T 3 queries, S 5 keys, D 6
  const ValueId q = b.input("q", DType::f32, {2, 4, 3, 6}), k = b.input("k", DType::f32, {2, 2, 5, 6}),
                v = b.input("v", DType::f32, {2, 2, 5, 6});
  const std::vector<ValueId> out =
      b.op(OpKind::attention, {q, k, v}, {{"scale", 0.5}, {"mask", std::string("causal")}, {"align", std::string("bottom_right")}});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const double forward = 2.0 * 2 * 4 * 3 * 5 * (6 + 6);
  EXPECT_EQ(node_flops(g, g.producer(out[0])), forward);
  const ValueId loss = b.reduce_sum(out[0], {0, 1, 2, 3});
  const std::vector<ValueId> wrt{q};
  auto grads = append_gradients(g, loss, wrt);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  int seen = 0;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::attention_grad) {
      EXPECT_EQ(node_flops(g, n), 2 * forward);
      ++seen;
    }
  EXPECT_EQ(seen, 1);
}

TEST(NodeFlops, ConvolutionsAndTheirGradients) {
  Graph g;
  Builder b(g);
  const Attrs attrs{{"strides", std::vector<int64_t>{2, 2}},     {"dilations", std::vector<int64_t>{1, 2}},
                    {"pads_begin", std::vector<int64_t>{1, 0}}, {"pads_end", std::vector<int64_t>{1, 2}},
                    {"groups", int64_t(2)}};
  const ValueId x = b.input("x", DType::f32, {2, 6, 7, 9}), w = b.input("w", DType::f32, {4, 3, 3, 3});
  const ValueId y = b.op1(OpKind::conv, {x, w}, attrs);  // [2, 4, 4, 4]
  Attrs gi = attrs, gw = attrs;
  gi.set("input_shape", std::vector<int64_t>{7, 9});
  gw.set("kernel", std::vector<int64_t>{3, 3});
  const ValueId dx = b.op1(OpKind::conv_grad_input, {y, w}, gi);
  const ValueId dw = b.op1(OpKind::conv_grad_weight, {x, y}, gw);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  // each of the 2·4·4·4 outputs: C / groups · kh · kw = 3 · 3 · 3 multiply-adds; the gradients the same
  const double f = 2.0 * (2 * 4 * 4 * 4) * (3 * 3 * 3);
  EXPECT_EQ(node_flops(g, g.producer(y)), f);
  EXPECT_EQ(node_flops(g, g.producer(dx)), f);
  EXPECT_EQ(node_flops(g, g.producer(dw)), f);
}

TEST(NameScopes, NestAndGiveGradientsTheirForwardNodesScope) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {2, 3}), w = b.parameter("w", DType::f32, {3, 3});
  ValueId y;
  {
    Builder::Scope layer(b, "h.0");
    {
      Builder::Scope fc(b, "mlp");
      y = b.matmul(x, w);
      EXPECT_EQ(b.scope(), "h.0.mlp");
    }
    y = b.gelu(y);
    {
      const auto head = Builder::Scope::at(b, "lm_head");  // a whole path, whatever the scope around it
      y = b.tanh(y);
    }
    EXPECT_EQ(b.scope(), "h.0");
  }
  EXPECT_EQ(b.scope(), "");
  const ValueId loss = b.reduce_sum(y, {0, 1});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(g.producer(x).scope, "");
  EXPECT_EQ(g.node(g.value(y).producer).scope, "lm_head");
  EXPECT_EQ(g.producer(loss).scope, "");
  const std::vector<ValueId> wrt{w};
  auto grads = append_gradients(g, loss, wrt);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  // Every gradient node is its forward node's: d tanh in lm_head, d gelu in h.0, the matmul's in h.0.mlp.
  EXPECT_EQ(g.producer((*grads)[0]).scope, "h.0.mlp");
  bool tanh_grad = false, gelu_grad = false;
  for (const Node& n : g.nodes()) {
    if (!n.backward) continue;
    if (n.op == OpKind::gelu_grad) gelu_grad = n.scope == "h.0";
    if (n.scope == "lm_head") tanh_grad = true;
  }
  EXPECT_TRUE(tanh_grad);
  EXPECT_TRUE(gelu_grad);
}

TEST(NameScopes, CommonScopeIsWholeParts) {
  EXPECT_EQ(common_scope("h.3.attn.q_proj", "h.3.attn.k_proj"), "h.3.attn");
  EXPECT_EQ(common_scope("h.3", "h.30"), "h");
  EXPECT_EQ(common_scope("h.3", "h.3"), "h.3");
  EXPECT_EQ(common_scope("h.3.mlp", "h.3"), "h.3");
  EXPECT_EQ(common_scope("", "h.3"), "");
  EXPECT_EQ(common_scope("a", "b"), "");
}

}  // namespace
}  // namespace aspen::graph
