// Tests of graph/ops_shape.cc: reshape, transpose, slice, concat, gather,
// gather_grad. For each: the inferred type, exact values through the
// interpreter, gradients against finite differences, and a bad-input message.
#include <gtest/gtest.h>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/verify.h"

namespace aspen::graph {
namespace {

HostArray host(DType dtype, Shape shape, std::vector<double> data) {
  return HostArray(TensorType{dtype, shape}, std::move(data));
}

std::vector<double> iota(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i);
  return v;
}

TensorType f32(Shape s) { return TensorType{DType::f32, s}; }

// Interprets g (which must output "y") and returns y.
HostArray eval_y(const Graph& g, const std::map<std::string, HostArray>& feeds) {
  auto r = interpret(g, feeds);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r->at("y") : HostArray();
}

// loss = weighted sum of y; checks every float input's gradient. `fixed`
// replaces random feeds (e.g. ids with repeats).
::testing::AssertionResult gradients_ok(Graph& g, Builder& b, ValueId y, uint64_t seed,
                                        const std::map<std::string, HostArray>& fixed = {}) {
  ValueId loss = testing::weighted_loss(b, y, seed);
  if (!b.status().is_ok()) return ::testing::AssertionFailure() << "build: " << b.status().to_string();
  if (Status s = verify(g); !s.is_ok()) return ::testing::AssertionFailure() << "verify: " << s.to_string();
  std::map<std::string, HostArray> feeds = testing::random_feeds(g, seed);
  for (const auto& [name, v] : fixed) feeds[name] = v;
  return testing::check_gradients(g, loss, feeds);
}

// ---------------------------------------------------------------------------
// reshape

TEST(ShapeOps, ReshapeType) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::bf16, {2, 3, 4});
  ValueId y = b.reshape(x, {4, 6});
  ValueId z = b.reshape(y, {24});
  ValueId s = b.reshape(b.input("one", DType::i32, {1, 1}), {});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(b.type(y), (TensorType{DType::bf16, {4, 6}}));
  EXPECT_EQ(b.type(z), (TensorType{DType::bf16, {24}}));
  EXPECT_EQ(b.type(s), (TensorType{DType::i32, {}}));
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).to_string();
}

TEST(ShapeOps, ReshapeValues) {
  Graph g;
  Builder b(g);
  b.output("y", b.reshape(b.input("x", DType::f32, {2, 3}), {3, 2}));
  ASSERT_TRUE(verify(g).is_ok()) << verify(g).to_string();
  HostArray y = eval_y(g, {{"x", host(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6})}});
  EXPECT_EQ(y.type, f32({3, 2}));
  EXPECT_EQ(y.data, (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(ShapeOps, ReshapeGradient) {
  Graph g;
  Builder b(g);
  ValueId y = b.reshape(b.parameter("x", DType::f32, {3, 5, 7}), {7, 15});
  EXPECT_TRUE(gradients_ok(g, b, y, 11));
}

TEST(ShapeOps, ReshapeErrors) {
  {
    Graph g;
    Builder b(g);
    b.reshape(b.input("x", DType::f32, {2, 3}), {4, 2});
    EXPECT_EQ(b.status().message(),
              "node 1 (reshape) with inputs (f32[2, 3]): reshape: shape: expected 6 elements (the input's [2, 3]), "
              "found [4, 2] with 8 elements");
  }
  {
    Graph g;
    Builder b(g);
    b.reshape(b.input("x", DType::f32, {2, 3}), {-1, 3});
    EXPECT_EQ(b.status().message(),
              "node 1 (reshape) with inputs (f32[2, 3]): reshape: shape: expected non-negative extents, found extent "
              "-1 at dimension 0");
  }
}

// ---------------------------------------------------------------------------
// transpose

TEST(ShapeOps, TransposeType) {
  Graph g;
  Builder b(g);
  ValueId y = b.transpose(b.input("x", DType::f16, {2, 3, 4}), {2, 0, 1});
  ValueId s = b.transpose(b.input("s", DType::f32, {}), {});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(b.type(y), (TensorType{DType::f16, {4, 2, 3}}));
  EXPECT_EQ(b.type(s), f32({}));
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).to_string();
}

TEST(ShapeOps, TransposeValues) {
  {
    Graph g;
    Builder b(g);
    b.output("y", b.transpose(b.input("x", DType::f32, {2, 3}), {1, 0}));
    ASSERT_TRUE(verify(g).is_ok());
    HostArray y = eval_y(g, {{"x", host(DType::f32, {2, 3}, {0, 1, 2, 3, 4, 5})}});
    EXPECT_EQ(y.type, f32({3, 2}));
    EXPECT_EQ(y.data, (std::vector<double>{0, 3, 1, 4, 2, 5}));
  }
  {
    // out[k, i, j] = x[i, j, k] = 12 i + 4 j + k.
    Graph g;
    Builder b(g);
    b.output("y", b.transpose(b.input("x", DType::f32, {2, 3, 4}), {2, 0, 1}));
    ASSERT_TRUE(verify(g).is_ok());
    HostArray y = eval_y(g, {{"x", host(DType::f32, {2, 3, 4}, iota(24))}});
    EXPECT_EQ(y.type, f32({4, 2, 3}));
    EXPECT_EQ(y.data, (std::vector<double>{0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21,
                                           2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}));
  }
}

// NOTE [unit-axis transposes]: the builder makes a transpose that moves only axes of extent 1 a reshape (the
// same values: the transpose op itself, forced through op1, is the reference); any other stays a transpose.
TEST(ShapeOps, UnitAxisTransposesAreReshapes) {
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
    bool reshape;
  };
  for (const Case& c : {Case{{2, 1, 3, 1}, {1, 0, 3, 2}, true}, Case{{1, 4, 1, 8}, {0, 2, 1, 3}, true},
                        Case{{3, 1}, {1, 0}, true}, Case{{2, 3, 1}, {1, 0, 2}, false},
                        Case{{1, 2, 1, 3}, {3, 2, 1, 0}, false}}) {
    SCOPED_TRACE(c.shape.to_string());
    std::map<std::string, HostArray> feeds = {{"x", host(DType::f32, c.shape, iota(c.shape.numel()))}};
    Graph g, ref;
    Builder b(g), r(ref);
    const ValueId y = b.transpose(b.input("x", DType::f32, c.shape), c.perm);
    b.output("y", y);
    r.output("y", r.op1(OpKind::transpose, {r.input("x", DType::f32, c.shape)}, {{"perm", c.perm}}));
    ASSERT_TRUE(b.status().is_ok() && r.status().is_ok());
    EXPECT_EQ(g.node(g.value(y).producer).op, c.reshape ? OpKind::reshape : OpKind::transpose);
    const HostArray got = eval_y(g, feeds), want = eval_y(ref, feeds);
    EXPECT_EQ(got.type, want.type);
    EXPECT_EQ(got.data, want.data);
  }
}

TEST(ShapeOps, TransposeGradient) {
  for (std::vector<int64_t> perm : {std::vector<int64_t>{2, 0, 1}, std::vector<int64_t>{1, 2, 0}}) {
    Graph g;
    Builder b(g);
    ValueId y = b.transpose(b.parameter("x", DType::f32, {3, 5, 7}), perm);
    EXPECT_TRUE(gradients_ok(g, b, y, 12)) << "perm " << perm[0] << perm[1] << perm[2];
  }
}

TEST(ShapeOps, TransposeErrors) {
  {
    Graph g;
    Builder b(g);
    b.transpose(b.input("x", DType::f32, {2, 3, 4}), {0, 0, 1});
    EXPECT_EQ(b.status().message(),
              "node 1 (transpose) with inputs (f32[2, 3, 4]): transpose: perm: expected a permutation of [0, 3) "
              "(the input's rank), found [0, 0, 1]");
  }
  {
    Graph g;
    Builder b(g);
    b.transpose(b.input("x", DType::f32, {2, 3}), {1, 0, 2});
    EXPECT_EQ(b.status().message(),
              "node 1 (transpose) with inputs (f32[2, 3]): transpose: perm: expected a permutation of [0, 2) "
              "(the input's rank), found [1, 0, 2]");
  }
}

// ---------------------------------------------------------------------------
// slice

TEST(ShapeOps, SliceType) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5, 7});
  ValueId y = b.slice(x, -1, 2, 5);
  ValueId e = b.slice(x, 1, 4, 4);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(b.type(y), f32({3, 5, 3}));
  EXPECT_EQ(b.type(e), f32({3, 0, 7}));
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).to_string();
}

TEST(ShapeOps, SliceValues) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 4});
  b.output("y", b.slice(x, 1, 1, 3));
  b.output("rows", b.slice(x, -2, 1, 2));
  ASSERT_TRUE(verify(g).is_ok()) << verify(g).to_string();
  auto r = interpret(g, {{"x", host(DType::f32, {2, 4}, iota(8))}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->at("y").type, f32({2, 2}));
  EXPECT_EQ(r->at("y").data, (std::vector<double>{1, 2, 5, 6}));
  EXPECT_EQ(r->at("rows").type, f32({1, 4}));
  EXPECT_EQ(r->at("rows").data, (std::vector<double>{4, 5, 6, 7}));
}

TEST(ShapeOps, SliceGradient) {
  // Zeros on both sides, only after, only before, none (the whole axis), and
  // an empty slice (g left out).
  const int64_t cases[][3] = {{-1, 2, 5}, {0, 0, 2}, {1, 3, 5}, {1, 0, 5}, {2, 3, 3}};
  for (const auto& c : cases) {
    Graph g;
    Builder b(g);
    ValueId y = b.slice(b.parameter("x", DType::f32, {3, 5, 7}), c[0], c[1], c[2]);
    EXPECT_TRUE(gradients_ok(g, b, y, 13)) << "axis " << c[0] << " [" << c[1] << ", " << c[2] << ")";
  }
  // The zero pieces take x's dtype.
  Graph g;
  Builder b(g);
  ValueId y = b.slice(b.parameter("x", DType::bf16, {2, 3}), 1, 1, 2);
  EXPECT_TRUE(gradients_ok(g, b, y, 14));
}

TEST(ShapeOps, SliceErrors) {
  {
    Graph g;
    Builder b(g);
    b.slice(b.input("x", DType::f32, {3, 5, 7}), -1, 2, 8);
    EXPECT_EQ(b.status().message(),
              "node 1 (slice) with inputs (f32[3, 5, 7]): slice: range: expected 0 <= begin <= end <= 7 "
              "(dimension 2 of [3, 5, 7]), found begin 2, end 8");
  }
  {
    Graph g;
    Builder b(g);
    b.slice(b.input("x", DType::f32, {3, 5}), 0, 2, 1);
    EXPECT_EQ(b.status().message(),
              "node 1 (slice) with inputs (f32[3, 5]): slice: range: expected 0 <= begin <= end <= 3 "
              "(dimension 0 of [3, 5]), found begin 2, end 1");
  }
  {
    Graph g;
    Builder b(g);
    b.slice(b.input("x", DType::f32, {3, 5}), 2, 0, 1);
    EXPECT_EQ(b.status().message(),
              "node 1 (slice) with inputs (f32[3, 5]): slice: axis: expected an axis in [-2, 2), found 2");
  }
}

// ---------------------------------------------------------------------------
// concat

TEST(ShapeOps, ConcatType) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", DType::bf16, {2, 1, 4});
  ValueId c = b.input("c", DType::bf16, {2, 3, 4});
  ValueId y = b.concat({a, c, a}, 1);
  ValueId z = b.concat({c}, -1);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(b.type(y), (TensorType{DType::bf16, {2, 5, 4}}));
  EXPECT_EQ(b.type(z), (TensorType{DType::bf16, {2, 3, 4}}));
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).to_string();
}

TEST(ShapeOps, ConcatValues) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", DType::f32, {2, 1});
  ValueId c = b.input("c", DType::f32, {2, 2});
  b.output("y", b.concat({a, c}, 1));
  b.output("rows", b.concat({c, b.reshape(a, {1, 2})}, 0));
  ASSERT_TRUE(verify(g).is_ok()) << verify(g).to_string();
  auto r = interpret(g, {{"a", host(DType::f32, {2, 1}, {10, 20})}, {"c", host(DType::f32, {2, 2}, {1, 2, 3, 4})}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->at("y").type, f32({2, 3}));
  EXPECT_EQ(r->at("y").data, (std::vector<double>{10, 1, 2, 20, 3, 4}));
  EXPECT_EQ(r->at("rows").type, f32({3, 2}));
  EXPECT_EQ(r->at("rows").data, (std::vector<double>{1, 2, 3, 4, 10, 20}));
}

TEST(ShapeOps, ConcatGradient) {
  {
    Graph g;
    Builder b(g);
    ValueId y = b.concat({b.parameter("x0", DType::f32, {3, 2, 7}), b.parameter("x1", DType::f32, {3, 5, 7}),
                          b.parameter("x2", DType::f32, {3, 1, 7})},
                         1);
    EXPECT_TRUE(gradients_ok(g, b, y, 15));
  }
  {
    Graph g;
    Builder b(g);
    ValueId y = b.concat({b.parameter("x0", DType::f32, {3, 5, 2}), b.parameter("x1", DType::f32, {3, 5, 4}),
                          b.parameter("x2", DType::f32, {3, 5, 1})},
                         -1);
    EXPECT_TRUE(gradients_ok(g, b, y, 16));
  }
  {
    // One input used twice: its two slices of g are summed.
    Graph g;
    Builder b(g);
    ValueId x = b.parameter("x", DType::f32, {3, 5});
    ValueId y = b.concat({x, b.parameter("w", DType::f32, {2, 5}), x}, 0);
    EXPECT_TRUE(gradients_ok(g, b, y, 17));
  }
}

TEST(ShapeOps, ConcatErrors) {
  {
    Graph g;
    Builder b(g);
    b.concat({b.input("a", DType::f32, {2, 3}), b.input("c", DType::f32, {4, 5})}, 1);
    EXPECT_EQ(b.status().message(),
              "node 2 (concat) with inputs (f32[2, 3], f32[4, 5]): concat: input 1: expected f32[2, *] (input 0's "
              "type, any size on axis 1), found f32[4, 5]");
  }
  {
    Graph g;
    Builder b(g);
    b.concat({b.input("a", DType::f32, {2, 3}), b.input("c", DType::bf16, {2, 3})}, 0);
    EXPECT_EQ(b.status().message(),
              "node 2 (concat) with inputs (f32[2, 3], bf16[2, 3]): concat: input 1: expected f32[*, 3] (input 0's "
              "type, any size on axis 0), found bf16[2, 3]");
  }
  {
    Graph g;
    Builder b(g);
    b.concat({}, 0);
    EXPECT_EQ(b.status().message(),
              "node 0 (concat) with inputs (): concat: inputs: expected at least 1 inputs, found 0");
  }
}

// ---------------------------------------------------------------------------
// gather and gather_grad

TEST(ShapeOps, GatherType) {
  Graph g;
  Builder b(g);
  ValueId table = b.parameter("table", DType::bf16, {5, 3});
  ValueId y = b.gather(table, b.input("ids", DType::i32, {2, 4}));
  ValueId z = b.gather(table, b.input("one", DType::i64, {}));
  ValueId d = b.op1(OpKind::gather_grad, {b.input("ids2", DType::i64, {2, 4}), y}, {{"vocab", int64_t(7)}});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(b.type(y), (TensorType{DType::bf16, {2, 4, 3}}));
  EXPECT_EQ(b.type(z), (TensorType{DType::bf16, {3}}));
  EXPECT_EQ(b.type(d), (TensorType{DType::bf16, {7, 3}}));
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).to_string();
  EXPECT_EQ(op_info(OpKind::gather_grad).grad, nullptr);  // backward-only
}

TEST(ShapeOps, GatherValues) {
  Graph g;
  Builder b(g);
  b.output("y", b.gather(b.parameter("table", DType::f32, {3, 2}), b.input("ids", DType::i32, {2, 2})));
  ASSERT_TRUE(verify(g).is_ok()) << verify(g).to_string();
  HostArray y = eval_y(g, {{"table", host(DType::f32, {3, 2}, {0, 1, 10, 11, 20, 21})},
                           {"ids", host(DType::i32, {2, 2}, {2, 0, 1, 2})}});
  EXPECT_EQ(y.type, f32({2, 2, 2}));
  EXPECT_EQ(y.data, (std::vector<double>{20, 21, 0, 1, 10, 11, 20, 21}));
}

TEST(ShapeOps, GatherGradValues) {
  // Repeated id 1 sums its rows; id 2 never occurs and stays zero.
  Graph g;
  Builder b(g);
  ValueId ids = b.input("ids", DType::i64, {3});
  b.output("y", b.op1(OpKind::gather_grad, {ids, b.input("g", DType::f32, {3, 2})}, {{"vocab", int64_t(3)}}));
  ASSERT_TRUE(verify(g).is_ok()) << verify(g).to_string();
  HostArray y = eval_y(g, {{"ids", host(DType::i64, {3}, {1, 0, 1})},
                           {"g", host(DType::f32, {3, 2}, {1, 2, 3, 4, 5, 6})}});
  EXPECT_EQ(y.type, f32({3, 2}));
  EXPECT_EQ(y.data, (std::vector<double>{3, 4, 6, 8, 0, 0}));
}

TEST(ShapeOps, GatherGradient) {
  for (DType id_type : {DType::i32, DType::i64}) {
    Graph g;
    Builder b(g);
    ValueId table = b.parameter("table", DType::f32, {5, 7});
    ValueId y = b.gather(table, b.input("ids", id_type, {3, 2}));
    // Ids 1 and 3 repeat (the scatter-add accumulates); rows 2 and 4 get no gradient.
    EXPECT_TRUE(gradients_ok(g, b, y, 18, {{"ids", host(id_type, {3, 2}, {1, 3, 1, 1, 0, 3})}}));
  }
  // The backward is one gather_grad node; the ids get no gradient.
  Graph g;
  Builder b(g);
  ValueId table = b.parameter("table", DType::f32, {5, 7});
  ValueId loss = testing::weighted_loss(b, b.gather(table, b.input("ids", DType::i32, {4})), 19);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const size_t before = g.nodes().size();
  auto grads = append_gradients(g, loss, std::vector<ValueId>{table});
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  int gather_grads = 0;
  for (size_t i = before; i < g.nodes().size(); ++i) gather_grads += g.nodes()[i].op == OpKind::gather_grad;
  EXPECT_EQ(gather_grads, 1);
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).to_string();
}

TEST(ShapeOps, GatherErrors) {
  {
    Graph g;
    Builder b(g);
    b.gather(b.parameter("table", DType::f32, {5, 3}), b.input("ids", DType::f32, {2}));
    EXPECT_EQ(b.status().message(),
              "node 2 (gather) with inputs (f32[5, 3], f32[2]): gather: ids: expected i32 or i64 indices, found "
              "f32[2]");
  }
  {
    Graph g;
    Builder b(g);
    b.gather(b.parameter("table", DType::f32, {15}), b.input("ids", DType::i32, {2}));
    EXPECT_EQ(b.status().message(),
              "node 2 (gather) with inputs (f32[15], i32[2]): gather: table: expected rank 2, found f32[15]");
  }
  {
    // An id out of range is found when evaluating: its position, value and V.
    Graph g;
    Builder b(g);
    b.output("y", b.gather(b.parameter("table", DType::f32, {5, 3}), b.input("ids", DType::i32, {2, 2})));
    ASSERT_TRUE(verify(g).is_ok()) << verify(g).to_string();
    auto r = interpret(g, {{"table", host(DType::f32, {5, 3}, iota(15))}, {"ids", host(DType::i32, {2, 2}, {0, 4, 7, 1})}});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kOutOfRange);
    EXPECT_EQ(r.status().message(),
              "node 2 (gather): gather: ids: expected every id in [0, V) = [0, 5), found ids[1, 0] = 7");
    r = interpret(g, {{"table", host(DType::f32, {5, 3}, iota(15))}, {"ids", host(DType::i32, {2, 2}, {0, 4, 1, -1})}});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "node 2 (gather): gather: ids: expected every id in [0, V) = [0, 5), found ids[1, 1] = -1");
  }
}

TEST(ShapeOps, GatherGradErrors) {
  {
    Graph g;
    Builder b(g);
    b.op1(OpKind::gather_grad, {b.input("ids", DType::i32, {2, 4}), b.input("g", DType::f32, {2, 3, 3})},
          {{"vocab", int64_t(5)}});
    EXPECT_EQ(b.status().message(),
              "node 2 (gather_grad) with inputs (i32[2, 4], f32[2, 3, 3]): gather_grad: g: expected shape [2, 4] + "
              "[C] (the ids' shape, then C), found [2, 3, 3]");
  }
  {
    Graph g;
    Builder b(g);
    b.op1(OpKind::gather_grad, {b.input("ids", DType::i32, {2}), b.input("g", DType::f32, {2, 3})},
          {{"vocab", int64_t(-1)}});
    EXPECT_EQ(b.status().message(),
              "node 2 (gather_grad) with inputs (i32[2], f32[2, 3]): gather_grad: vocab: expected >= 0, found -1");
  }
  {
    Graph g;
    Builder b(g);
    b.output("y", b.op1(OpKind::gather_grad, {b.input("ids", DType::i32, {2}), b.input("g", DType::f32, {2, 3})},
                        {{"vocab", int64_t(4)}}));
    auto r = interpret(g, {{"ids", host(DType::i32, {2}, {4, 0})}, {"g", host(DType::f32, {2, 3}, iota(6))}});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "node 2 (gather_grad): gather_grad: ids: expected every id in [0, V) = [0, 4), found ids[0] = 4");
  }
}

}  // namespace
}  // namespace aspen::graph
