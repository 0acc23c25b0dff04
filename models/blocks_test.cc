// The shared blocks' own pieces: T5's relative position bias through attention.
#include "models/blocks.h"

#include <gtest/gtest.h>

#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "kernels/attention_layout.h"

namespace aspen::models {
namespace {

using graph::Builder;
using graph::OpKind;
using graph::ValueId;

// The bias is table[bucket(i, j), h]; attention with it is differentiable down to the table (by central
// differences through gather, transpose, reshape and attention's dbias).
TEST(T5RelativeBias, GathersTheTableAndTrainsIt) {
  constexpr int64_t B = 2, H = 2, T = 4, S = 6, D = 3, kBuckets = 8, kMaxDistance = 10, kOffset = 2;
  graph::Graph g;
  Builder b(g);
  const ValueId q = b.input("q", DType::f32, Shape{B, H, T, D});
  const ValueId k = b.input("k", DType::f32, Shape{B, H, S, D}), v = b.input("v", DType::f32, Shape{B, H, S, D});
  const ValueId table = b.input("table", DType::f32, Shape{kBuckets, H});
  auto bias = t5_relative_bias(b, table, T, S, kOffset, /*bidirectional=*/true, kMaxDistance);
  ASSERT_TRUE(bias.is_ok()) << bias.status().to_string();
  EXPECT_EQ(b.type(*bias).shape, (Shape{1, H, T, S}));
  b.output("bias", *bias);
  std::vector<ValueId> y = b.op(OpKind::attention, {q, k, v, *bias},
                                {{"scale", 0.5}, {"mask", std::string("none")}});
  ASSERT_EQ(y.size(), 2u) << b.status().to_string();
  const ValueId loss = graph::testing::weighted_loss(b, y[0], 3);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();

  const auto feeds = graph::testing::random_feeds(g, 17);
  auto out = graph::interpret(g, feeds);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  auto ids = kernels::t5_relative_buckets(T, S, kOffset, true, kBuckets, kMaxDistance);
  ASSERT_TRUE(ids.is_ok());
  const std::vector<double>& tab = feeds.at("table").data;
  const std::vector<double>& got = out->at("bias").data;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t x = 0; x < T * S; ++x)
      EXPECT_EQ(got[size_t(h * T * S + x)], tab[size_t((*ids)[size_t(x)] * H + h)]) << "head " << h << " element " << x;
  EXPECT_TRUE(graph::testing::check_gradients(g, loss, feeds));
}

TEST(T5RelativeBias, BadTableIsNamed) {
  graph::Graph g;
  Builder b(g);
  auto r = t5_relative_bias(b, b.input("t", DType::f32, Shape{8}), 2, 2, 0, true, 16);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "t5_relative_bias: table: expected [num_buckets, heads], found f32[8]");
}

}  // namespace
}  // namespace aspen::models
