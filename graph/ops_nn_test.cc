// Tests of graph/ops_nn.cc: inferred types, evaluation against the kernels'
// reference templates, gradients against finite differences, and the exact
// wording of rule errors.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rotary.h"
#include "kernels/softmax.h"

namespace aspen::graph {
namespace {

using testing::check_gradients;
using testing::random_feeds;
using testing::weighted_loss;

HostArray array(DType dtype, Shape shape, std::vector<double> data) {
  return HostArray(TensorType{dtype, shape}, std::move(data));
}

TensorType f32(Shape s) { return TensorType{DType::f32, s}; }

// The message of the builder's first error after `build`.
template <class F>
std::string build_error(F build) {
  Graph g;
  Builder b(g);
  build(b);
  return b.status().message();
}

// Runs g and returns every named output; fails the test on an error.
std::map<std::string, HostArray> run(const Graph& g, const std::map<std::string, HostArray>& feeds) {
  auto r = interpret(g, feeds);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::map<std::string, HostArray>{};
}

std::vector<ValueId> matmul(Builder& b, ValueId a, ValueId w, bool ta, bool tb, std::optional<ValueId> bias = {}) {
  std::vector<ValueId> in{a, w};
  if (bias) in.push_back(*bias);
  return b.op(OpKind::matmul, in, {{"trans_a", int64_t(ta)}, {"trans_b", int64_t(tb)}});
}

// ---- matmul -------------------------------------------------------------------

struct MatmulCase {
  bool ta, tb, shared, bias;
  std::vector<int64_t> batch;
};

constexpr int64_t kM = 3, kK = 4, kN = 5;

std::vector<int64_t> cat(std::vector<int64_t> a, std::vector<int64_t> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// y = matmul(a, w[, bias]) for the case; returns y.
ValueId build_matmul(Builder& b, const MatmulCase& c) {
  std::vector<int64_t> as = cat(c.batch, c.ta ? std::vector<int64_t>{kK, kM} : std::vector<int64_t>{kM, kK});
  std::vector<int64_t> bs = cat(c.shared ? std::vector<int64_t>{} : c.batch,
                                c.tb ? std::vector<int64_t>{kN, kK} : std::vector<int64_t>{kK, kN});
  ValueId a = b.input("a", DType::f32, *Shape::make(as.data(), int(as.size())));
  ValueId w = b.parameter("w", DType::f32, *Shape::make(bs.data(), int(bs.size())));
  std::optional<ValueId> bias;
  if (c.bias) bias = b.parameter("bias", DType::f32, Shape{kN});
  std::vector<ValueId> y = matmul(b, a, w, c.ta, c.tb, bias);
  return y.empty() ? ValueId{} : y[0];
}

std::string name(const MatmulCase& c) {
  std::string batch;
  for (int64_t d : c.batch) batch += std::to_string(d) + ",";
  return std::string("ta=") + (c.ta ? "1" : "0") + " tb=" + (c.tb ? "1" : "0") + (c.shared ? " shared" : " batched") +
         (c.bias ? " +bias" : "") + " batch=[" + batch + "]";
}

TEST(NnOps, MatmulTypes) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", DType::f32, {2, 3, 4});
  ValueId at = b.input("at", DType::f32, {2, 4, 3});
  ValueId w = b.parameter("w", DType::f32, {4, 5});
  ValueId wt = b.parameter("wt", DType::f32, {5, 4});
  ValueId wb = b.parameter("wb", DType::f32, {2, 5, 4});
  ValueId bias = b.parameter("bias", DType::f32, {5});
  EXPECT_EQ(b.type(matmul(b, a, w, false, false)[0]), f32({2, 3, 5}));
  EXPECT_EQ(b.type(matmul(b, at, wt, true, true, bias)[0]), f32({2, 3, 5}));
  EXPECT_EQ(b.type(matmul(b, a, wb, false, true)[0]), f32({2, 3, 5}));
  EXPECT_EQ(b.type(matmul(b, at, w, true, false)[0]), f32({2, 3, 5}));
  ValueId h = b.input("h", DType::bf16, {3, 4});
  ValueId hw = b.parameter("hw", DType::bf16, {4, 6});
  EXPECT_EQ(b.type(matmul(b, h, hw, false, false)[0]), (TensorType{DType::bf16, {3, 6}}));
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
}

TEST(NnOps, MatmulHandValues) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", DType::f32, {2, 3});
  ValueId w = b.parameter("w", DType::f32, {3, 2});
  ValueId bias = b.parameter("bias", DType::f32, {2});
  b.output("y", matmul(b, a, w, false, false, bias)[0]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto out = run(g, {{"a", array(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6})},
                     {"w", array(DType::f32, {3, 2}, {1, 0, 0, 1, 1, 1})},
                     {"bias", array(DType::f32, {2}, {10, 20})}});
  EXPECT_EQ(out["y"].data, (std::vector<double>{14, 25, 20, 31}));
}

TEST(NnOps, MatmulMatchesReference) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared : {false, true})
        for (bool bias : {false, true}) {
          const MatmulCase c{ta, tb, shared, bias, {2, 3}};
          SCOPED_TRACE(name(c));
          Graph g;
          Builder b(g);
          b.output("y", build_matmul(b, c));
          ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
          auto feeds = random_feeds(g, 7);
          auto out = run(g, feeds);
          kernels::MatmulShape s{.batch = 6, .M = kM, .N = kN, .K = kK, .trans_a = ta, .trans_b = tb,
                                 .broadcast_b = shared, .has_bias = bias};
          std::vector<double> want(size_t(s.c_elements()));
          kernels::ref::matmul<double, double>(feeds["a"].data.data(), feeds["w"].data.data(),
                                               bias ? feeds["bias"].data.data() : nullptr, want.data(), s);
          EXPECT_EQ(out["y"].type, f32({2, 3, kM, kN}));
          EXPECT_EQ(out["y"].data, want);
        }
}

TEST(NnOps, MatmulGradients) {
  std::vector<MatmulCase> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared : {false, true}) cases.push_back({ta, tb, shared, ta == tb, {2}});
  cases.push_back({true, false, true, true, {2, 1}});  // shared b, rank-4 a, transposed
  cases.push_back({false, true, true, true, {2, 1}});
  cases.push_back({true, true, true, true, {}});       // plain 2-D
  for (const MatmulCase& c : cases) {
    SCOPED_TRACE(name(c));
    Graph g;
    Builder b(g);
    ValueId loss = weighted_loss(b, build_matmul(b, c), 11);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    EXPECT_TRUE(check_gradients(g, loss, random_feeds(g, 3)));
  }
}

TEST(NnOps, MatmulErrors) {
  EXPECT_EQ(build_error([](Builder& b) {
              matmul(b, b.input("a", DType::f32, {4, 8}), b.input("b", DType::f32, {5, 3}), false, false);
            }),
            "node 2 (matmul) with inputs (f32[4, 8], f32[5, 3]): matmul: K: expected 8 (a's last dimension), found 5");
  EXPECT_EQ(build_error([](Builder& b) {
              matmul(b, b.input("a", DType::f32, {8, 4}), b.input("b", DType::f32, {5, 3}), true, false);
            }),
            "node 2 (matmul) with inputs (f32[8, 4], f32[5, 3]): matmul: K: expected 8 (a's second-to-last "
            "dimension), found 5");
  EXPECT_EQ(build_error([](Builder& b) {
              matmul(b, b.input("a", DType::f32, {2, 3, 4}), b.input("b", DType::f32, {3, 4, 5}), false, false);
            }),
            "node 2 (matmul) with inputs (f32[2, 3, 4], f32[3, 4, 5]): matmul: batch dimension 0: expected 2 (a's), "
            "found 3");
  EXPECT_EQ(build_error([](Builder& b) {
              matmul(b, b.input("a", DType::f32, {3, 4}), b.input("b", DType::f32, {4, 5}), false, false,
                     b.input("c", DType::f32, {4}));
            }),
            "node 3 (matmul) with inputs (f32[3, 4], f32[4, 5], f32[4]): matmul: bias: expected f32[5] ([N] in a's "
            "dtype), found f32[4]");
  EXPECT_EQ(build_error([](Builder& b) {
              matmul(b, b.input("a", DType::f32, {2, 2, 3, 4}), b.input("b", DType::f32, {2, 4, 5}), false, false);
            }),
            "node 2 (matmul) with inputs (f32[2, 2, 3, 4], f32[2, 4, 5]): matmul: b: expected rank 2 (shared across "
            "the batch) or rank 4 (a's), found f32[2, 4, 5]");
  EXPECT_EQ(build_error([](Builder& b) {
              b.op(OpKind::matmul, {b.input("a", DType::f32, {3, 4}), b.input("b", DType::f32, {4, 5})},
                   {{"trans_a", int64_t(2)}});
            }),
            "node 2 (matmul) with inputs (f32[3, 4], f32[4, 5]): matmul: trans_a: expected 0 or 1, found 2");
}

// ---- layernorm / rmsnorm ----------------------------------------------------------------

TEST(NnOps, LayernormTypesAndValues) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  ValueId gamma = b.parameter("gamma", DType::f32, {5});
  ValueId beta = b.parameter("beta", DType::f32, {5});
  std::vector<ValueId> y = b.op(OpKind::layernorm, {x, gamma, beta}, {{"eps", 1e-5}});
  ASSERT_EQ(y.size(), 3u) << b.status().to_string();
  EXPECT_EQ(b.type(y[0]), f32({3, 5}));
  EXPECT_EQ(b.type(y[1]), f32({3}));
  EXPECT_EQ(b.type(y[2]), f32({3}));
  ValueId h = b.input("h", DType::bf16, {2, 4, 5});
  ValueId hg = b.parameter("hg", DType::bf16, {5});
  std::vector<ValueId> hy = b.op(OpKind::layernorm, {h, hg, hg}, {{"eps", 0.0}});
  ASSERT_EQ(hy.size(), 3u) << b.status().to_string();
  EXPECT_EQ(b.type(hy[0]), (TensorType{DType::bf16, {2, 4, 5}}));
  EXPECT_EQ(b.type(hy[2]), f32({2, 4}));  // statistics stay f32
  b.output("y", y[0]);
  b.output("mean", y[1]);
  b.output("rstd", y[2]);
  b.output("hy", hy[0]);
  auto feeds = random_feeds(g, 5);
  auto out = run(g, feeds);
  std::vector<double> wy(15), wm(3), wr(3);
  kernels::ref::layernorm_forward<double>(feeds["x"].data.data(), feeds["gamma"].data.data(), feeds["beta"].data.data(),
                                          wy.data(), wm.data(), wr.data(), 3, 5, 1e-5);
  EXPECT_EQ(out["y"].data, wy);
  EXPECT_EQ(out["mean"].data, wm);
  EXPECT_EQ(out["rstd"].data, wr);
}

TEST(NnOps, LayernormGradient) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  std::vector<ValueId> y = b.op(OpKind::layernorm,
                                {x, b.parameter("gamma", DType::f32, {5}), b.parameter("beta", DType::f32, {5})},
                                {{"eps", 1e-5}});
  ValueId loss = weighted_loss(b, y[0], 1);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_TRUE(check_gradients(g, loss, random_feeds(g, 9)));
}

TEST(NnOps, LayernormStatisticsAreNotDifferentiated) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  std::vector<ValueId> y = b.op(OpKind::layernorm,
                                {x, b.parameter("gamma", DType::f32, {5}), b.parameter("beta", DType::f32, {5})},
                                {{"eps", 1e-5}});
  ValueId loss = weighted_loss(b, y[1], 1);
  ASSERT_TRUE(b.status().is_ok());
  std::vector<ValueId> wrt{x};
  auto r = append_gradients(g, loss, wrt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
  EXPECT_EQ(r.status().message(),
            "autodiff: node 3 (layernorm): layernorm: gradient of output 1 (mean): expected none (only output 0, y, is "
            "differentiated), found one");
}

TEST(NnOps, LayernormErrors) {
  EXPECT_EQ(build_error([](Builder& b) {
              b.op(OpKind::layernorm,
                   {b.input("x", DType::f32, {3, 5}), b.input("g", DType::f32, {4}), b.input("b", DType::f32, {5})},
                   {{"eps", 1e-5}});
            }),
            "node 3 (layernorm) with inputs (f32[3, 5], f32[4], f32[5]): layernorm: gamma: expected f32[5] (x's last "
            "dimension and dtype), found f32[4]");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId x = b.input("x", DType::f32, {3, 5});
              ValueId gm = b.input("g", DType::f32, {5});
              b.op(OpKind::layernorm, {x, gm, gm}, {{"eps", -1.0}});
            }),
            "node 2 (layernorm) with inputs (f32[3, 5], f32[5], f32[5]): layernorm: eps: expected a finite number >= "
            "0, found -1.000000");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId x = b.input("x", DType::f32, {3, 5});
              ValueId gm = b.input("g", DType::f32, {5});
              ValueId s = b.input("s", DType::f32, {5});
              b.op(OpKind::layernorm_grad, {x, gm, s, s, x});
            }),
            "node 3 (layernorm_grad) with inputs (f32[3, 5], f32[5], f32[5], f32[5], f32[3, 5]): layernorm_grad: mean: "
            "expected f32[3] (the forward's saved statistic), found f32[5]");
}

TEST(NnOps, RmsnormTypesValuesAndGradient) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  ValueId gamma = b.parameter("gamma", DType::f32, {5});
  std::vector<ValueId> y = b.op(OpKind::rmsnorm, {x, gamma}, {{"eps", 1e-6}});
  ASSERT_EQ(y.size(), 2u) << b.status().to_string();
  EXPECT_EQ(b.type(y[0]), f32({3, 5}));
  EXPECT_EQ(b.type(y[1]), f32({3}));
  ValueId loss = weighted_loss(b, y[0], 2);
  b.output("y", y[0]);
  b.output("rstd", y[1]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = random_feeds(g, 4);
  auto out = run(g, feeds);
  std::vector<double> wy(15), wr(3);
  kernels::ref::rmsnorm_forward<double>(feeds["x"].data.data(), feeds["gamma"].data.data(), wy.data(), wr.data(), 3, 5,
                                        1e-6);
  EXPECT_EQ(out["y"].data, wy);
  EXPECT_EQ(out["rstd"].data, wr);
  EXPECT_TRUE(check_gradients(g, loss, feeds));
}

TEST(NnOps, RmsnormErrors) {
  EXPECT_EQ(build_error([](Builder& b) {
              b.op(OpKind::rmsnorm, {b.input("x", DType::f32, {3, 5}), b.input("g", DType::bf16, {5})},
                   {{"eps", 1e-6}});
            }),
            "node 2 (rmsnorm) with inputs (f32[3, 5], bf16[5]): rmsnorm: gamma: expected f32[5] (x's last dimension "
            "and dtype), found bf16[5]");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId x = b.input("x", DType::f32, {3, 5});
              b.op(OpKind::rmsnorm_grad,
                   {x, b.input("g", DType::f32, {5}), b.input("r", DType::f32, {3}), b.input("d", DType::f32, {5, 3})});
            }),
            "node 4 (rmsnorm_grad) with inputs (f32[3, 5], f32[5], f32[3], f32[5, 3]): rmsnorm_grad: g: expected "
            "f32[3, 5] (x's type), found f32[5, 3]");
  EXPECT_EQ(build_error([](Builder& b) {
              b.op(OpKind::rmsnorm, {b.input("x", DType::f32, {3, 0}), b.input("g", DType::f32, {0})},
                   {{"eps", 1e-6}});
            }),
            "node 2 (rmsnorm) with inputs (f32[3, 0], f32[0]): rmsnorm: x: last dimension: expected >= 1, found "
            "f32[3, 0]");
}

// ---- softmax ------------------------------------------------------------------------

TEST(NnOps, Softmax) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 7});
  ValueId y = b.op1(OpKind::softmax, {x});
  EXPECT_EQ(b.type(y), f32({2, 7}));
  ValueId loss = weighted_loss(b, y, 3);
  b.output("y", y);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = random_feeds(g, 6, -2.0, 2.0);
  auto out = run(g, feeds);
  std::vector<double> want(14);
  kernels::ref::softmax_forward<double>(feeds["x"].data.data(), want.data(), 2, 7);
  EXPECT_EQ(out["y"].data, want);
  EXPECT_TRUE(check_gradients(g, loss, feeds));

  Graph h;
  Builder hb(h);
  hb.output("y", hb.op1(OpKind::softmax, {hb.input("x", DType::f32, {1, 2})}));
  auto hand = run(h, {{"x", array(DType::f32, {1, 2}, {0.0, std::log(3.0)})}});
  EXPECT_NEAR(hand["y"].data[0], 0.25, 1e-15);
  EXPECT_NEAR(hand["y"].data[1], 0.75, 1e-15);
}

TEST(NnOps, SoftmaxErrors) {
  EXPECT_EQ(build_error([](Builder& b) { b.op1(OpKind::softmax, {b.input("x", DType::i32, {2, 3})}); }),
            "node 1 (softmax) with inputs (i32[2, 3]): softmax: x: expected a float type (f32, bf16, f16), found "
            "i32[2, 3]");
  EXPECT_EQ(build_error([](Builder& b) {
              b.op1(OpKind::softmax_grad, {b.input("y", DType::f32, {2, 3}), b.input("g", DType::f32, {2, 4})});
            }),
            "node 2 (softmax_grad) with inputs (f32[2, 3], f32[2, 4]): softmax_grad: g: expected f32[2, 3] (y's type), "
            "found f32[2, 4]");
}

// ---- cross_entropy ----------------------------------------------------------------------

TEST(NnOps, CrossEntropy) {
  Graph g;
  Builder b(g);
  ValueId logits = b.input("logits", DType::f32, {4, 5});
  ValueId targets = b.input("targets", DType::i32, {4});
  std::vector<ValueId> ce = b.op(OpKind::cross_entropy, {logits, targets});
  ASSERT_EQ(ce.size(), 3u) << b.status().to_string();
  EXPECT_EQ(b.type(ce[0]), f32({}));
  EXPECT_EQ(b.type(ce[1]), f32({4}));
  EXPECT_EQ(b.type(ce[2]), f32({4}));
  ValueId loss = weighted_loss(b, ce[0], 4);
  b.output("mean", ce[0]);
  b.output("loss", ce[1]);
  b.output("lse", ce[2]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = random_feeds(g, 8, -2.0, 2.0);
  feeds["targets"] = array(DType::i32, {4}, {1, -100, 4, 0});
  auto out = run(g, feeds);
  const std::vector<int32_t> t{1, -100, 4, 0};
  std::vector<double> wl(4), wlse(4), wm(1);
  kernels::ref::cross_entropy_forward<double>(feeds["logits"].data.data(), t.data(), wl.data(), wlse.data(), wm.data(),
                                              4, 5, -100);
  EXPECT_EQ(out["mean"].data, wm);
  EXPECT_EQ(out["loss"].data, wl);
  EXPECT_EQ(out["lse"].data, wlse);
  EXPECT_EQ(out["loss"].data[1], 0.0);
  EXPECT_TRUE(check_gradients(g, loss, feeds));
}

TEST(NnOps, CrossEntropyHandValuesI64AndIgnoreIndex) {
  Graph g;
  Builder b(g);
  std::vector<ValueId> ce = b.op(OpKind::cross_entropy,
                                 {b.input("logits", DType::f32, {3, 4}), b.input("targets", DType::i64, {3})},
                                 {{"ignore_index", int64_t(-1)}});
  ASSERT_EQ(ce.size(), 3u) << b.status().to_string();
  b.output("mean", ce[0]);
  b.output("loss", ce[1]);
  auto out = run(g, {{"logits", array(DType::f32, {3, 4}, std::vector<double>(12, 0.0))},
                     {"targets", array(DType::i64, {3}, {3, -1, 0})}});
  EXPECT_NEAR(out["mean"].data[0], std::log(4.0), 1e-15);
  EXPECT_NEAR(out["loss"].data[0], std::log(4.0), 1e-15);
  EXPECT_EQ(out["loss"].data[1], 0.0);
}

TEST(NnOps, CrossEntropyErrors) {
  EXPECT_EQ(build_error([](Builder& b) {
              b.op(OpKind::cross_entropy, {b.input("l", DType::f32, {4, 5}), b.input("t", DType::i32, {3})});
            }),
            "node 2 (cross_entropy) with inputs (f32[4, 5], i32[3]): cross_entropy: targets: expected [4] (one per row "
            "of logits), found i32[3]");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId l = b.input("l", DType::f32, {4, 5});
              b.op(OpKind::cross_entropy_grad, {l, b.input("t", DType::i32, {4}), b.input("s", DType::f32, {4}),
                                                b.input("g", DType::f32, {1})});
            }),
            "node 4 (cross_entropy_grad) with inputs (f32[4, 5], i32[4], f32[4], f32[1]): cross_entropy_grad: g: "
            "expected f32[] (the mean loss's type), found f32[1]");

  // A target out of range is found when evaluating.
  Graph g;
  Builder b(g);
  b.output("mean", b.op(OpKind::cross_entropy, {b.input("l", DType::f32, {4, 5}), b.input("t", DType::i32, {4})})[0]);
  auto r = interpret(g, {{"l", array(DType::f32, {4, 5}, std::vector<double>(20, 0.5))},
                         {"t", array(DType::i32, {4}, {0, -100, 7, 1})}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
  EXPECT_EQ(r.status().message(),
            "node 2 (cross_entropy): cross_entropy: targets row 2: expected a class index in [0, 5) or ignore_index "
            "-100, found 7");

  // The per-row loss is not differentiated.
  Graph h;
  Builder hb(h);
  ValueId l = hb.input("l", DType::f32, {4, 5});
  std::vector<ValueId> ce = hb.op(OpKind::cross_entropy, {l, hb.input("t", DType::i32, {4})});
  ValueId loss = weighted_loss(hb, ce[1], 1);
  std::vector<ValueId> wrt{l};
  auto gr = append_gradients(h, loss, wrt);
  ASSERT_FALSE(gr.is_ok());
  EXPECT_EQ(gr.status().message(),
            "autodiff: node 2 (cross_entropy): cross_entropy: gradient of output 1 (loss): expected none (only output "
            "0, mean loss, is differentiated), found one");
}

// ---- rotary ------------------------------------------------------------------------------

constexpr int64_t kB = 2, kT = 3, kH = 2, kD = 6, kRd = 4;
const std::vector<double> kPositions{0, 3, 7, 1, 12, 5};

ValueId rotary(Builder& b, ValueId x, ValueId pos, const char* layout, bool inverse = false) {
  Attrs a{{"rotary_dim", kRd}, {"layout", std::string(layout)}, {"base", 100.0}};
  if (inverse) a.set("inverse", int64_t(1));
  return b.op1(OpKind::rotary, {x, pos}, std::move(a));
}

TEST(NnOps, Rotary) {
  for (const char* layout : {"interleaved", "half_split"}) {
    SCOPED_TRACE(layout);
    const kernels::RotaryLayout kl =
        std::string(layout) == "interleaved" ? kernels::RotaryLayout::interleaved : kernels::RotaryLayout::half_split;
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {kB, kT, kH, kD});
    ValueId pos = b.input("pos", DType::i32, {kB, kT});
    ValueId y = rotary(b, x, pos, layout);
    EXPECT_EQ(b.type(y), f32({kB, kT, kH, kD}));
    ValueId back = rotary(b, y, pos, layout, /*inverse=*/true);
    ValueId loss = weighted_loss(b, y, 5);
    b.output("y", y);
    b.output("inv", rotary(b, x, pos, layout, /*inverse=*/true));
    b.output("back", back);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    auto feeds = random_feeds(g, 10);
    feeds["pos"] = array(DType::i32, {kB, kT}, kPositions);
    auto out = run(g, feeds);
    const std::vector<int32_t> p(kPositions.begin(), kPositions.end());
    std::vector<double> fwd(size_t(kB * kT * kH * kD)), bwd(fwd.size());
    kernels::ref::rotary_forward<double>(feeds["x"].data.data(), p.data(), fwd.data(), kB, kT, kH, kD, kRd, kl, 100.0f);
    kernels::ref::rotary_backward<double>(feeds["x"].data.data(), p.data(), bwd.data(), kB, kT, kH, kD, kRd, kl,
                                          100.0f);
    EXPECT_EQ(out["y"].data, fwd);
    EXPECT_EQ(out["inv"].data, bwd);
    for (size_t i = 0; i < fwd.size(); ++i) EXPECT_NEAR(out["back"].data[i], feeds["x"].data[i], 1e-14);
    EXPECT_TRUE(check_gradients(g, loss, feeds));
  }
}

TEST(NnOps, RotaryGradientOfInverse) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {kB, kT, kH, kD});
  ValueId pos = b.input("pos", DType::i32, {kB, kT});
  ValueId loss = weighted_loss(b, rotary(b, x, pos, "half_split", /*inverse=*/true), 6);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = random_feeds(g, 12);
  feeds["pos"] = array(DType::i32, {kB, kT}, kPositions);
  EXPECT_TRUE(check_gradients(g, loss, feeds));
}

TEST(NnOps, RotaryErrors) {
  EXPECT_EQ(build_error([](Builder& b) {
              b.op1(OpKind::rotary, {b.input("x", DType::f32, {2, 3, 2, 6}), b.input("p", DType::i32, {2, 3})},
                    {{"rotary_dim", int64_t(3)}, {"layout", std::string("interleaved")}});
            }),
            "node 2 (rotary) with inputs (f32[2, 3, 2, 6], i32[2, 3]): rotary: rotary_dim: expected an even number in "
            "[0, 6] (D = x's last dimension), found 3");
  EXPECT_EQ(build_error([](Builder& b) {
              b.op1(OpKind::rotary, {b.input("x", DType::f32, {2, 3, 2, 6}), b.input("p", DType::i64, {2, 3})},
                    {{"rotary_dim", int64_t(4)}, {"layout", std::string("interleaved")}});
            }),
            "node 2 (rotary) with inputs (f32[2, 3, 2, 6], i64[2, 3]): rotary: positions: expected i32[2, 3] (i32 [B, "
            "T] of x [B, T, H, D]), found i64[2, 3]");
  EXPECT_EQ(build_error([](Builder& b) {
              b.op1(OpKind::rotary, {b.input("x", DType::f32, {2, 3, 2, 6}), b.input("p", DType::i32, {2, 3})},
                    {{"rotary_dim", int64_t(4)}, {"layout", std::string("neox")}});
            }),
            "node 2 (rotary) with inputs (f32[2, 3, 2, 6], i32[2, 3]): rotary: layout: expected \"interleaved\" or "
            "\"half_split\", found \"neox\"");
}

// ---- attention ---------------------------------------------------------------------------

struct AttentionCase {
  const char* mask;
  int64_t window, kv_offset;
  bool key_valid;
  int64_t kv_heads = 2;  // of aH = 2 query heads; 1: multi-query (both read one k, v)
  bool segments = false;  // two documents of 2 keys (kSegments)
  int64_t window_right = 0;
  bool layout = false;  // kLayout: blocks of 2, query block 0 sees key block 0 only
  double alibi = 0;     // > 0: ALiBi with this bias max
};

constexpr int64_t aB = 1, aH = 2, aT = 3, aS = 4, aD = 3;
const std::vector<double> kKeyValid{1, 0, 1, 1};
const std::vector<double> kSegments{3, 3, 8, 8};
const std::vector<double> kLayout{1, 0, 1, 1};  // [1, 2, 2]

Attrs attention_attrs(const AttentionCase& c) {
  Attrs a{{"scale", 0.7}, {"mask", std::string(c.mask)}};
  if (c.window) a.set("window", c.window);
  if (c.window_right) a.set("window_right", c.window_right);
  if (c.kv_offset) a.set("kv_offset", c.kv_offset);
  if (c.layout) a.set("layout_block", int64_t(2));
  if (c.alibi > 0) a.set("alibi_bias_max", c.alibi);
  return a;
}

kernels::AttentionMask kernel_mask(const AttentionCase& c, const std::vector<uint8_t>& key_valid,
                                   const std::vector<int32_t>& segments, const std::vector<uint8_t>& layout) {
  kernels::AttentionMask m;
  const std::string kind = c.mask;
  m.kind = kind == "none" ? kernels::AttentionMask::Kind::none
           : kind == "causal" ? kernels::AttentionMask::Kind::causal
                              : kernels::AttentionMask::Kind::local;
  m.window = c.window;
  m.window_right = c.window_right;
  m.kv_offset = c.kv_offset;
  if (c.key_valid) m.key_valid = key_valid;
  if (c.segments) m.segments = segments;
  if (c.layout) {
    m.layout = layout;
    m.layout_block = 2;
    m.layout_heads = 1;
  }
  static const std::vector<float> slopes = kernels::alibi_slopes(aH, 8.0);
  if (c.alibi > 0) m.alibi_slopes = slopes;
  return m;
}

TEST(NnOps, Attention) {
  const AttentionCase cases[] = {{"causal", 0, 1, false}, {"local", 2, 1, false}, {"none", 0, 0, true},
                                 {"causal", 0, 1, true}, {"causal", 0, 1, true, 1}, {"local", 2, 0, false, 1},
                                 {"causal", 0, 1, true, 2, true}, {"local", 2, 1, false, 1, true, 1},
                                 {"none", 0, 0, false, 2, true}, {"causal", 0, 1, true, 1, false, 0, true},
                                 {"none", 0, 0, false, 2, true, 0, true},
                                 {"causal", 0, 1, true, 1, false, 0, false, 8.0}};
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(std::string(c.mask) + (c.key_valid ? " +key_valid" : "") + " kv_heads " +
                 std::to_string(c.kv_heads) + (c.segments ? " +segments" : "") + " window_right " +
                 std::to_string(c.window_right) + (c.layout ? " +layout" : ""));
    Graph g;
    Builder b(g);
    const int64_t aK = c.kv_heads;
    std::vector<ValueId> in{b.input("q", DType::f32, {aB, aH, aT, aD}), b.input("k", DType::f32, {aB, aK, aS, aD}),
                            b.input("v", DType::f32, {aB, aK, aS, aD})};
    if (c.key_valid) in.push_back(b.input("key_valid", DType::u8, {aB, aS}));
    if (c.segments) in.push_back(b.input("segments", DType::i32, {aB, aS}));
    const int64_t rows = (c.kv_offset + aT + 1) / 2;
    if (c.layout) in.push_back(b.input("layout", DType::u8, {1, rows, 2}));
    std::vector<ValueId> y = b.op(OpKind::attention, in, attention_attrs(c));
    ASSERT_EQ(y.size(), 2u) << b.status().to_string();
    EXPECT_EQ(b.type(y[0]), f32({aB, aH, aT, aD}));
    EXPECT_EQ(b.type(y[1]), f32({aB, aH, aT}));
    ValueId loss = weighted_loss(b, y[0], 7);
    b.output("out", y[0]);
    b.output("lse", y[1]);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    auto feeds = random_feeds(g, 13);
    if (c.key_valid) feeds["key_valid"] = array(DType::u8, {aB, aS}, kKeyValid);
    if (c.segments) feeds["segments"] = array(DType::i32, {aB, aS}, kSegments);
    const std::vector<double> layout_values(kLayout.begin(), kLayout.begin() + rows * 2);
    if (c.layout) feeds["layout"] = array(DType::u8, {1, rows, 2}, layout_values);
    const std::vector<uint8_t> lay(layout_values.begin(), layout_values.end());
    auto out = run(g, feeds);
    const std::vector<uint8_t> kv(kKeyValid.begin(), kKeyValid.end());
    const std::vector<int32_t> seg(kSegments.begin(), kSegments.end());
    std::vector<double> wo(size_t(aB * aH * aT * aD)), wl(size_t(aB * aH * aT));
    kernels::ref::attention_forward<double>(feeds["q"].data.data(), feeds["k"].data.data(), feeds["v"].data.data(),
                                            wo.data(), wl.data(), aB, aH, aK, aT, aS, aD, 0.7, kernel_mask(c, kv, seg, lay));
    EXPECT_EQ(out["out"].data, wo);
    EXPECT_EQ(out["lse"].data, wl);
    EXPECT_TRUE(check_gradients(g, loss, feeds));
  }
}

// A bias input, broadcast over batch or heads, and its gradient (dbias summed over what it broadcasts), by
// central differences with the other inputs.
TEST(NnOps, AttentionBiasGradient) {
  for (const Shape& bias_shape : {Shape{1, aH, aT, aS}, Shape{aB, 1, aT, aS}, Shape{aB, aH, aT, aS}}) {
    SCOPED_TRACE("bias " + bias_shape.to_string());
    Graph g;
    Builder b(g);
    std::vector<ValueId> in{b.input("q", DType::f32, {aB, aH, aT, aD}), b.input("k", DType::f32, {aB, 1, aS, aD}),
                            b.input("v", DType::f32, {aB, 1, aS, aD}), b.input("key_valid", DType::u8, {aB, aS}),
                            b.input("bias", DType::f32, bias_shape)};
    std::vector<ValueId> y = b.op(OpKind::attention, in,
                                  {{"scale", 0.7}, {"mask", std::string("causal")}, {"kv_offset", int64_t(1)}});
    ASSERT_EQ(y.size(), 2u) << b.status().to_string();
    ValueId loss = weighted_loss(b, y[0], 7);
    b.output("out", y[0]);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    auto feeds = random_feeds(g, 21);
    feeds["key_valid"] = array(DType::u8, {aB, aS}, kKeyValid);
    auto out = run(g, feeds);
    const std::vector<uint8_t> kv(kKeyValid.begin(), kKeyValid.end());
    const std::vector<float> bias(feeds["bias"].data.begin(), feeds["bias"].data.end());
    kernels::AttentionMask m;
    m.kind = kernels::AttentionMask::Kind::causal;
    m.kv_offset = 1;
    m.key_valid = kv;
    m.bias = bias;
    m.bias_batch = bias_shape[0];
    m.bias_heads = bias_shape[1];
    std::vector<double> wo(size_t(aB * aH * aT * aD)), wl(size_t(aB * aH * aT));
    kernels::ref::attention_forward<double>(feeds["q"].data.data(), feeds["k"].data.data(), feeds["v"].data.data(),
                                            wo.data(), wl.data(), aB, aH, 1, aT, aS, aD, 0.7, m);
    EXPECT_EQ(out["out"].data, wo);
    EXPECT_TRUE(check_gradients(g, loss, feeds));
  }
}

// Dropout with a fixed run-time seed: the interpreter equals the reference with the same multipliers, and
// autodiff's gradients (attention_grad regenerating them) match central differences.
TEST(NnOps, AttentionDropoutGradient) {
  Graph g;
  Builder b(g);
  std::vector<ValueId> in{b.input("q", DType::f32, {aB, aH, aT, aD}), b.input("k", DType::f32, {aB, 1, aS, aD}),
                          b.input("v", DType::f32, {aB, 1, aS, aD}), b.input("seed", DType::i64, {1})};
  std::vector<ValueId> y = b.op(OpKind::attention, in,
                                {{"scale", 0.7}, {"mask", std::string("causal")}, {"kv_offset", int64_t(1)},
                                 {"dropout", 0.4}, {"dropout_stream", int64_t(2)}});
  ASSERT_EQ(y.size(), 2u) << b.status().to_string();
  ValueId loss = weighted_loss(b, y[0], 7);
  b.output("out", y[0]);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = random_feeds(g, 23);
  feeds["seed"] = array(DType::i64, {1}, {77});
  auto out = run(g, feeds);
  kernels::AttentionMask m;
  m.kind = kernels::AttentionMask::Kind::causal;
  m.kv_offset = 1;
  m.dropout = 0.4f;
  m.dropout_seed = 77;
  m.dropout_stream = 2;
  std::vector<double> wo(size_t(aB * aH * aT * aD)), wl(size_t(aB * aH * aT));
  kernels::ref::attention_forward<double>(feeds["q"].data.data(), feeds["k"].data.data(), feeds["v"].data.data(),
                                          wo.data(), wl.data(), aB, aH, 1, aT, aS, aD, 0.7, m);
  EXPECT_EQ(out["out"].data, wo);
  {  // a negative seed: no dropout (evaluation)
    auto eval = feeds;
    eval["seed"] = array(DType::i64, {1}, {-1});
    kernels::AttentionMask off = m;
    off.dropout = 0.0f;
    std::vector<double> eo(wo.size()), el(wl.size());
    kernels::ref::attention_forward<double>(feeds["q"].data.data(), feeds["k"].data.data(), feeds["v"].data.data(),
                                            eo.data(), el.data(), aB, aH, 1, aT, aS, aD, 0.7, off);
    EXPECT_EQ(run(g, eval)["out"].data, eo);
    EXPECT_NE(eo, wo);
  }
  int dropped = 0;  // the multipliers drop something here (else the test would not test dropout)
  for (int64_t x = 0; x < aB * aH * aT * aS; ++x)
    dropped += kernels::attention_dropout_multiplier(m, aH, aT, aS, x / (aH * aT * aS), (x / (aT * aS)) % aH,
                                                      (x / aS) % aT, x % aS) == 0.0f;
  EXPECT_GT(dropped, 0);
  EXPECT_TRUE(check_gradients(g, loss, feeds));
}

TEST(NnOps, AttentionLseIsNotDifferentiated) {
  Graph g;
  Builder b(g);
  ValueId q = b.input("q", DType::f32, {1, 1, 2, 2});
  std::vector<ValueId> y = b.op(OpKind::attention, {q, q, q}, {{"scale", 1.0}, {"mask", std::string("none")}});
  ValueId loss = weighted_loss(b, y[1], 1);
  std::vector<ValueId> wrt{q};
  auto r = append_gradients(g, loss, wrt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
  EXPECT_EQ(r.status().message(),
            "autodiff: node 1 (attention): attention: gradient of output 1 (lse): expected none (only output 0, out, "
            "is differentiated), found one");
}

TEST(NnOps, AttentionErrors) {
  EXPECT_EQ(build_error([](Builder& b) {
              b.op(OpKind::attention,
                   {b.input("q", DType::f32, {1, 2, 3, 3}), b.input("k", DType::f32, {1, 2, 4, 4}),
                    b.input("v", DType::f32, {1, 2, 4, 4})},
                   {{"scale", 1.0}, {"mask", std::string("none")}});
            }),
            "node 3 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 4, 4], f32[1, 2, 4, 4]): attention: k: "
            "dimension 3 (D): expected 3 (q's), found 4");
  EXPECT_EQ(build_error([](Builder& b) {
              const ValueId k = b.input("k", DType::f32, {1, 2, 4, 3});
              b.op(OpKind::attention, {b.input("q", DType::f32, {1, 3, 3, 3}), k, k},
                   {{"scale", 1.0}, {"mask", std::string("none")}});
            }),
            "node 2 (attention) with inputs (f32[1, 3, 3, 3], f32[1, 2, 4, 3], f32[1, 2, 4, 3]): attention: k: "
            "dimension 1 (Hk): expected a divisor of q's heads (3), found 2");
  {  // run-time inputs are checked as the kernels check them: segments out of order
    Graph g;
    Builder b(g);
    const ValueId q = b.input("q", DType::f32, {1, 1, 3, 2});
    b.output("out", b.op(OpKind::attention, {q, q, q, b.input("s", DType::i32, {1, 3})},
                         {{"scale", 1.0}, {"mask", std::string("causal")}})[0]);
    auto r = interpret(g, {{"q", array(DType::f32, {1, 1, 3, 2}, std::vector<double>(6, 0.5))},
                           {"s", array(DType::i32, {1, 3}, {0, 2, 1})}});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "node 2 (attention): attention: mask.segments row 0: expected non-decreasing segment ids (documents one "
              "after another), found 2 then 1 at key 2");
  }
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q, b.input("s", DType::i32, {1, 3}), b.input("m", DType::u8, {1, 3})},
                   {{"scale", 1.0}, {"mask", std::string("causal")}});
            }),
            "node 3 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3], i32[1, 3], u8[1, 3]): "
            "attention: input 4: expected key_valid (u8 or bool [B, S]), then segments (i32 [B, S]), then layout "
            "(u8 [heads, query blocks, key blocks]), then dropout_seed (i64 [1]), then bias (q's dtype [1 or B, 1 or "
            "H, T, S]), each at most once, found u8[1, 3]");
  EXPECT_EQ(build_error([](Builder& b) {  // dropout needs its seed
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q}, {{"scale", 1.0}, {"mask", std::string("causal")}, {"dropout", 0.1}});
            }),
            "node 1 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3]): attention: "
            "dropout_seed: expected an i64 [1] input with dropout > 0, found none");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q, b.input("seed", DType::i64, {1})},
                   {{"scale", 1.0}, {"mask", std::string("causal")}, {"dropout", 1.0}});
            }),
            "node 2 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3], i64[1]): attention: "
            "dropout: expected a probability in [0, 1), found 1.000000");
  {  // the run-time seed is checked
    Graph g;
    Builder b(g);
    const ValueId q = b.input("q", DType::f32, {1, 1, 3, 2});
    b.output("out", b.op(OpKind::attention, {q, q, q, b.input("seed", DType::i64, {1})},
                         {{"scale", 1.0}, {"mask", std::string("causal")}, {"dropout", 0.5}})[0]);
    auto r = interpret(g, {{"q", array(DType::f32, {1, 1, 3, 2}, std::vector<double>(6, 0.5))},
                           {"seed", array(DType::i64, {1}, {0.5})}});
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().message(),
              "node 2 (attention): attention: dropout_seed: expected an integer in (-2^53, 2^53) (negative: no "
              "dropout), found 0.500000");
  }
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {2, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q, b.input("bias", DType::f32, {2, 3, 3, 3})},
                   {{"scale", 1.0}, {"mask", std::string("causal")}});
            }),
            "node 2 (attention) with inputs (f32[2, 2, 3, 3], f32[2, 2, 3, 3], f32[2, 2, 3, 3], f32[2, 3, 3, 3]): "
            "attention: bias: expected f32 [1 or 2, 1 or 2, 3, 3] ([batch, heads, T, S], broadcast), found "
            "f32[2, 3, 3, 3]");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q, b.input("bias", DType::f32, {1, 1, 3, 3})},
                   {{"scale", -1.0}, {"mask", std::string("none")}});
            }),
            "node 2 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 1, 3, 3]): "
            "attention: scale: expected > 0 with a bias, found -1.000000");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 5, 3});
              b.op(OpKind::attention, {q, q, q, b.input("l", DType::u8, {2, 2, 3})},
                   {{"scale", 1.0}, {"mask", std::string("causal")}, {"layout_block", int64_t(2)}});
            }),
            "node 2 (attention) with inputs (f32[1, 2, 5, 3], f32[1, 2, 5, 3], f32[1, 2, 5, 3], u8[2, 2, 3]): "
            "attention: layout: expected u8 [1 or 2, 3, 3] (heads, query blocks, key blocks of 2), found u8[2, 2, 3]");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q},
                   {{"scale", 1.0}, {"mask", std::string("causal")}, {"align", std::string("bottom_right")},
                    {"kv_offset", int64_t(1)}});
            }),
            "node 1 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3]): attention: "
            "kv_offset: expected none with align \"bottom_right\" (it is S - T), found 1");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q}, {{"scale", 1.0}, {"mask", std::string("local")}});
            }),
            "node 1 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3]): attention: window: "
            "expected present with mask \"local\", found none");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention, {q, q, q, b.input("m", DType::u8, {1, 4})},
                   {{"scale", 1.0}, {"mask", std::string("causal")}});
            }),
            "node 2 (attention) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3], u8[1, 4]): attention: "
            "key_valid: expected u8 or bool [1, 3] ([B, S]), found u8[1, 4]");
  EXPECT_EQ(build_error([](Builder& b) {
              ValueId q = b.input("q", DType::f32, {1, 2, 3, 3});
              b.op(OpKind::attention_grad, {q, q, q, q, b.input("l", DType::f32, {1, 2}), q},
                   {{"scale", 1.0}, {"mask", std::string("none")}});
            }),
            "node 2 (attention_grad) with inputs (f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3], f32[1, 2, 3, 3], "
            "f32[1, 2], f32[1, 2, 3, 3]): attention_grad: lse: expected f32[1, 2, 3] (the forward's saved statistic), "
            "found f32[1, 2]");
}

}  // namespace
}  // namespace aspen::graph
