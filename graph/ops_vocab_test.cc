// Tests of graph/ops_vocab.cc (the vocab-parallel cross-entropy's pieces) and
// of gather's shard form (ops_shape.cc): against the whole-vocabulary
// cross_entropy and gather, shard by shard with the collectives' sums made
// here, gradients against finite differences, and the errors' wording.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"

namespace aspen::graph {
namespace {

using testing::check_gradients;
using testing::random_feeds;

HostArray array(DType dtype, Shape shape, std::vector<double> data) {
  return HostArray(TensorType{dtype, shape}, std::move(data));
}

std::map<std::string, HostArray> run(const Graph& g, const std::map<std::string, HostArray>& feeds) {
  auto r = interpret(g, feeds);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::map<std::string, HostArray>{};
}

// The pieces for one shard of a group of T, as models/blocks.cc wires them,
// but with the global maxima and the two sums given as inputs (the
// collectives' results). Outputs: local max "m", "s", "zt", "loss", "dz".
struct ShardGraph {
  Graph g;
  ValueId loss;
};
ShardGraph shard_graph(int64_t R, int64_t Vl, int64_t T) {
  ShardGraph sg;
  Builder b(sg.g);
  const Attrs a = {{"group_size", T}};
  const ValueId z = b.input("z", DType::f32, Shape{R, Vl});
  const ValueId t = b.input("targets", DType::i32, Shape{R});
  const ValueId off = b.input("offset", DType::i32, Shape{});
  const ValueId M = b.input("M", DType::f32, Shape{R});
  b.output("m", b.op1(OpKind::reduce_max, {z}, {{"axes", std::vector<int64_t>{1}}}));
  const std::vector<ValueId> st = b.op(OpKind::vocab_ce_stats, {z, t, off, M}, a);
  b.output("s", st[0]);
  b.output("zt", st[1]);
  sg.loss = b.op1(OpKind::vocab_ce_loss, {z, t, off, M, b.input("S", DType::f32, Shape{R}),
                                           b.input("Zt", DType::f32, Shape{R})}, a);
  b.output("loss", sg.loss);
  b.output("dz", b.op1(OpKind::vocab_ce_grad, {z, t, off, M, b.input("S2", DType::f32, Shape{R}),
                                                b.input("g", DType::f32, Shape{})}, a));
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return sg;
}

// Three shards of a vocabulary of 21: each shard's pieces, their maxima and
// sums combined as the collectives would, give the whole vocabulary's
// cross_entropy loss, and the shards' gradients (group_size 3: each shard
// differentiates the sum of the three identical losses) are 3 x its gradient.
TEST(VocabOps, ShardsTogetherAreTheWholeCrossEntropy) {
  const int64_t R = 5, T = 3, Vl = 7, V = T * Vl;
  Graph whole;
  {
    Builder b(whole);
    const ValueId l = b.input("logits", DType::f32, Shape{R, V});
    const ValueId t = b.input("targets", DType::i32, Shape{R});
    const std::vector<ValueId> ce = b.op(OpKind::cross_entropy, {l, t});
    b.output("loss", ce[0]);
    b.output("dlogits", b.op1(OpKind::cross_entropy_grad, {l, t, ce[2], b.input("g", DType::f32, Shape{})}));
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  }
  auto feeds = random_feeds(whole, 11, -4.0, 4.0, V);
  feeds["targets"].data[3] = -100;  // an ignored row
  feeds["g"].data = {1.0};
  const auto ref = run(whole, feeds);

  ShardGraph sg = shard_graph(R, Vl, T);
  auto z_of = [&](int64_t s) {  // shard s's columns
    std::vector<double> z;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t v = 0; v < Vl; ++v) z.push_back(feeds["logits"].data[size_t(r * V + s * Vl + v)]);
    return array(DType::f32, {R, Vl}, z);
  };
  auto base = [&](int64_t s) {
    std::map<std::string, HostArray> f;
    f["z"] = z_of(s);
    f["targets"] = feeds["targets"];
    f["offset"] = array(DType::i32, {}, {double(s * Vl)});
    for (const char* k : {"M", "S", "Zt", "S2"}) f[k] = array(DType::f32, {R}, std::vector<double>(size_t(R), 1.0));
    f["g"] = array(DType::f32, {}, {1.0});
    return f;
  };
  // Pass 1: the maxima (all_gather then reduce_max).
  std::vector<double> M(size_t(R), -INFINITY);
  for (int64_t s = 0; s < T; ++s) {
    const auto o = run(sg.g, base(s));
    for (int64_t r = 0; r < R; ++r) M[size_t(r)] = std::max(M[size_t(r)], o.at("m").data[size_t(r)]);
  }
  // Pass 2: the sums (all_reduce).
  std::vector<double> S(size_t(R), 0.0), Zt(size_t(R), 0.0);
  for (int64_t s = 0; s < T; ++s) {
    auto f = base(s);
    f["M"] = array(DType::f32, {R}, M);
    const auto o = run(sg.g, f);
    for (int64_t r = 0; r < R; ++r) S[size_t(r)] += o.at("s").data[size_t(r)], Zt[size_t(r)] += o.at("zt").data[size_t(r)];
  }
  // Pass 3: every shard's loss and gradient.
  for (int64_t s = 0; s < T; ++s) {
    auto f = base(s);
    f["M"] = array(DType::f32, {R}, M);
    f["S"] = f["S2"] = array(DType::f32, {R}, S);
    f["Zt"] = array(DType::f32, {R}, Zt);
    const auto o = run(sg.g, f);
    EXPECT_NEAR(o.at("loss").data[0], ref.at("loss").data[0], 1e-12) << "shard " << s;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t v = 0; v < Vl; ++v)
        EXPECT_NEAR(o.at("dz").data[size_t(r * Vl + v)], 3.0 * ref.at("dlogits").data[size_t(r * V + s * Vl + v)], 1e-12)
            << "shard " << s << " row " << r << " class " << v;
  }
}

// One shard holding the whole vocabulary (group_size 1, offset 0) wired with
// the maxima and sums computed in the graph: its gradient rule gives z the
// total derivative, which finite differences of the whole chain confirm.
TEST(VocabOps, GradientOfOneShardIsTheCrossEntropyGradient) {
  Graph g;
  Builder b(g);
  const int64_t R = 4, V = 6;
  const Attrs a = {{"group_size", int64_t(1)}};
  const ValueId z = b.input("z", DType::f32, Shape{R, V});
  const ValueId t = b.input("targets", DType::i32, Shape{R});
  const ValueId off = b.input("offset", DType::i32, Shape{});
  const ValueId M = b.op1(OpKind::reduce_max, {z}, {{"axes", std::vector<int64_t>{1}}});
  const std::vector<ValueId> st = b.op(OpKind::vocab_ce_stats, {z, t, off, M}, a);
  const ValueId loss = b.op1(OpKind::vocab_ce_loss, {z, t, off, M, st[0], st[1]}, a);
  b.output("loss", loss);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = random_feeds(g, 3, -2.0, 2.0, V);
  feeds["offset"].data = {0.0};
  feeds["targets"].data[1] = -100;
  EXPECT_TRUE(check_gradients(g, loss, feeds));
}

// gather with an offset: the shard's rows for its ids, zeros for the others;
// the three shards' outputs add up to the whole table's gather, and the
// gradient (scatter-add into the shard's rows) checks against finite differences.
TEST(VocabOps, ShardGatherAddsUpToTheWholeGather) {
  const int64_t V = 12, C = 3, T = 3, Vl = V / T;
  Graph whole, part;
  {
    Builder b(whole);
    b.output("y", b.gather(b.input("table", DType::f32, Shape{V, C}), b.input("ids", DType::i32, Shape{2, 5})));
  }
  ValueId y;
  {
    Builder b(part);
    y = b.op1(OpKind::gather, {b.input("table", DType::f32, Shape{Vl, C}), b.input("ids", DType::i32, Shape{2, 5}),
                               b.input("offset", DType::i64, Shape{})});
    b.output("y", y);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  }
  auto feeds = random_feeds(whole, 4, -1.0, 1.0, V);
  const auto ref = run(whole, feeds);
  std::vector<double> sum(ref.at("y").data.size(), 0.0);
  for (int64_t s = 0; s < T; ++s) {
    std::vector<double> rows(feeds["table"].data.begin() + s * Vl * C, feeds["table"].data.begin() + (s + 1) * Vl * C);
    const auto o = run(part, {{"table", array(DType::f32, {Vl, C}, rows)},
                              {"ids", feeds["ids"]},
                              {"offset", array(DType::i64, {}, {double(s * Vl)})}});
    for (size_t k = 0; k < sum.size(); ++k) sum[k] += o.at("y").data[k];
  }
  EXPECT_EQ(sum, ref.at("y").data);
  Builder b(part);
  const ValueId loss = testing::weighted_loss(b, y, 9);
  auto pf = random_feeds(part, 5, -1.0, 1.0, V);
  pf["offset"].data = {4.0};
  EXPECT_TRUE(check_gradients(part, loss, pf));
}

TEST(VocabOps, Errors) {
  Graph g;
  Builder b(g);
  const Attrs a = {{"group_size", int64_t(2)}};
  const ValueId z = b.input("z", DType::f32, Shape{3, 4});
  const ValueId t = b.input("targets", DType::i32, Shape{3});
  b.output("s", b.op(OpKind::vocab_ce_stats,
                     {z, t, b.input("offset", DType::i32, Shape{}), b.input("M", DType::f32, Shape{3})}, a)[0]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  // A target outside the group's vocabulary (2 x 4 classes) names the row.
  auto r = interpret(g, {{"z", array(DType::f32, {3, 4}, std::vector<double>(12, 0.0))},
                         {"targets", array(DType::i32, {3}, {0, 8, -100})},
                         {"offset", array(DType::i32, {}, {4})},
                         {"M", array(DType::f32, {3}, {0, 0, 0})}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
  EXPECT_NE(r.status().message().find("vocab_ce_stats: targets row 1: expected a class index in [0, 8) (group_size x "
                                      "this shard's classes) or ignore_index -100, found 8"),
            std::string::npos)
      << r.status().message();
  // Wrong statistic shape, and a missing group size.
  Graph h;
  Builder hb(h);
  hb.op(OpKind::vocab_ce_stats, {hb.input("z", DType::f32, Shape{3, 4}), hb.input("t", DType::i32, Shape{3}),
                                 hb.input("o", DType::i32, Shape{}), hb.input("M", DType::f32, Shape{4})},
        a);
  EXPECT_NE(hb.status().message().find("vocab_ce_stats: input 3: expected f32[3] (one f32 statistic per row), found "
                                       "f32[4]"),
            std::string::npos)
      << hb.status().message();
  // gather's shard form with the whole vocabulary given: an id outside it is an error, not a zero row.
  Graph e;
  Builder eb(e);
  eb.output("y", eb.op1(OpKind::gather, {eb.input("table", DType::f32, Shape{4, 2}), eb.input("ids", DType::i32, Shape{3}),
                                         eb.input("offset", DType::i32, Shape{})},
                        {{"vocab", int64_t(8)}}));
  ASSERT_TRUE(eb.status().is_ok()) << eb.status().to_string();
  auto bad = interpret(e, {{"table", array(DType::f32, {4, 2}, std::vector<double>(8, 1.0))},
                           {"ids", array(DType::i32, {3}, {1, 5, 8})},
                           {"offset", array(DType::i32, {}, {4})}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kOutOfRange);
  EXPECT_NE(bad.status().message().find("ids[2] = 8"), std::string::npos) << bad.status().message();
  Graph k;
  Builder kb(k);
  kb.op(OpKind::vocab_ce_stats, {kb.input("z", DType::f32, Shape{3, 4}), kb.input("t", DType::i32, Shape{3}),
                                 kb.input("o", DType::i32, Shape{}), kb.input("M", DType::f32, Shape{3})});
  EXPECT_FALSE(kb.status().is_ok());
}

}  // namespace
}  // namespace aspen::graph
