// Tests of the IR machinery: builder, verifier, interpreter, autodiff, and the
// elementwise, reduce and collective op groups.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/verify.h"

namespace aspen::graph {
namespace {

HostArray arr(DType t, Shape s, std::vector<double> d) { return HostArray(TensorType{t, s}, std::move(d)); }

TEST(OpTable, EveryOpHasAnEntry) {
  for (int i = 0; i < kNumOps; ++i) {
    const OpInfo& info = op_info(OpKind(i));
    EXPECT_STREQ(info.name, op_name(OpKind(i)));
    EXPECT_EQ(op_from_name(info.name), OpKind(i));
  }
  EXPECT_FALSE(op_from_name("conv2d").has_value());
}

// Serialized executables hold op numbers: these must never change. (A new op
// adds its own line here; changing a line is a cache-format break.)
TEST(OpTable, NumbersAreTheSerializedOnes) {
  const char* const by_number[] = {"input",
                                   "parameter",
                                   "constant",
                                   "add",
                                   "sub",
                                   "mul",
                                   "scale",
                                   "neg",
                                   "exp",
                                   "gelu",
                                   "silu",
                                   "where",
                                   "cast",
                                   "reshape",
                                   "transpose",
                                   "slice",
                                   "concat",
                                   "broadcast",
                                   "reduce_sum",
                                   "reduce_max",
                                   "gather",
                                   "matmul",
                                   "layernorm",
                                   "rmsnorm",
                                   "softmax",
                                   "cross_entropy",
                                   "rotary",
                                   "attention",
                                   "gelu_grad",
                                   "silu_grad",
                                   "gather_grad",
                                   "layernorm_grad",
                                   "rmsnorm_grad",
                                   "softmax_grad",
                                   "cross_entropy_grad",
                                   "attention_grad",
                                   "all_reduce",
                                   "reduce_scatter",
                                   "all_gather",
                                   "logical_not",
                                   "is_nan",
                                   "bias_gelu",
                                   "add_layernorm",
                                   "adamw",
                                   "write_slice",
                                   "sample",
                                   "tanh",
                                   "sqrt",
                                   "div",
                                   "sgd",
                                   "lamb",
                                   "sum_squares",
                                   "vocab_ce_stats",
                                   "vocab_ce_loss",
                                   "vocab_ce_grad",
                                   "relu",
                                   "relu_grad",
                                   "sigmoid",
                                   "erf",
                                   "log",
                                   "max",
                                   "min",
                                   "equal",
                                   "less",
                                   "greater",
                                   "logical_and",
                                   "logical_or",
                                   "sin",
                                   "cos",
                                   "floor",
                                   "ceil",
                                   "round",
                                   "dropout",
                                   "conv",
                                   "conv_grad_input",
                                   "conv_grad_weight",
                                   "random_uniform",
                                   "batch_norm",
                                   "batch_norm_grad",
                                   "lstm",
                                   "lstm_grad",
                                   "max_pool",
                                   "max_pool_grad",
                                   "matmul_q",
                                   "matmul_group"};
  ASSERT_EQ(std::size(by_number), size_t(kNumOps));
  for (int i = 0; i < kNumOps; ++i) EXPECT_STREQ(op_name(OpKind(i)), by_number[i]) << "op #" << i;
}

// The passes' knowledge of ops is the table's flags: spot-check what they say.
TEST(OpTable, FlagsSayWhatThePassesMayDo) {
  EXPECT_TRUE(op_has(OpKind::gelu, kElementwise));
  EXPECT_FALSE(op_has(OpKind::matmul, kElementwise));
  EXPECT_TRUE(op_has(OpKind::adamw, kWritesInPlace));
  EXPECT_FALSE(op_has(OpKind::adamw, kElementwise));
  for (OpKind op : {OpKind::all_reduce, OpKind::reduce_scatter, OpKind::all_gather})
    EXPECT_TRUE(op_has(op, kCommunicates)) << op_name(op);
  for (OpKind op : {OpKind::input, OpKind::parameter, OpKind::constant}) EXPECT_TRUE(op_has(op, kSource));
  EXPECT_FALSE(op_has(OpKind::constant, kUnique));  // equal constants merge
  for (int i = 0; i < kNumOps; ++i) {
    if (!op_has(OpKind(i), kSource)) continue;
    EXPECT_EQ(op_info(OpKind(i)).max_inputs, 0) << op_name(OpKind(i));
  }
}

TEST(Builder, RecordsAndInterprets) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 3});
  ValueId w = b.parameter("w", DType::f32, {2, 3});
  ValueId y = b.add(b.mul(x, w), b.scale(x, 0.5));
  b.output("y", y);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_TRUE(verify(g).is_ok());
  EXPECT_EQ(g.type(y).to_string(), "f32[2, 3]");
  auto out = interpret(g, {{"x", arr(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6})},
                           {"w", arr(DType::f32, {2, 3}, {2, 2, 2, -1, -1, -1})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("y").data, (std::vector<double>{2.5, 5, 7.5, -2, -2.5, -3}));
  EXPECT_NE(g.to_string().find("= mul(%0, %1) : f32[2, 3]"), std::string::npos) << g.to_string();
}

TEST(Builder, FirstErrorIsStickyAndNamesTheNode) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 3});
  ValueId y = b.input("y", DType::f32, {3, 2});
  ValueId bad = b.add(x, y);
  EXPECT_FALSE(bad.valid());
  EXPECT_EQ(b.status().message(),
            "node 2 (add) with inputs (f32[2, 3], f32[3, 2]): add: inputs 0 and 1: expected equal types, found "
            "f32[2, 3] and f32[3, 2]");
  const size_t nodes = g.nodes().size();
  EXPECT_FALSE(b.gelu(x).valid());  // later ops record nothing
  EXPECT_EQ(g.nodes().size(), nodes);
}

TEST(Builder, DuplicateNamesAndBadAttributes) {
  Graph g;
  Builder b(g);
  b.parameter("w", DType::f32, {2});
  b.parameter("w", DType::f32, {2});
  EXPECT_EQ(b.status().message(), "parameter 'w': expected a unique name, found it twice");
  Graph g2;
  Builder b2(g2);
  ValueId x = b2.input("x", DType::f32, {2});
  b2.op1(OpKind::scale, {x}, {{"alpha", 2.0}, {"beta", int64_t(1)}});
  EXPECT_EQ(b2.status().message(),
            "node 1 (scale) with inputs (f32[2]): scale: attribute 'beta': expected one of {alpha}, found an unknown "
            "attribute");
  Graph g3;
  Builder b3(g3);
  ValueId z = b3.input("z", DType::f32, {2});
  b3.op1(OpKind::scale, {z});
  EXPECT_EQ(b3.status().message(),
            "node 1 (scale) with inputs (f32[2]): scale: attribute 'alpha': expected present (a float), found none");
  Graph g4;
  Builder b4(g4);
  ValueId i = b4.input("i", DType::i32, {2});
  b4.gelu(i);
  EXPECT_EQ(b4.status().message(),
            "node 1 (gelu) with inputs (i32[2]): gelu: input: expected a float type (f32, bf16, f16), found i32[2]");
}

TEST(Verifier, RejectsMalformedGraphs) {
  // A node that refers to a value defined after it (a cycle), built by hand.
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2});
  ValueId y = b.neg(x);
  ASSERT_TRUE(b.status().is_ok());
  g.mutable_node(1).inputs[0] = y;  // neg now reads its own output
  Status s = verify(g);
  EXPECT_EQ(s.message(),
            "node 1 (neg) with inputs (%1?): neg: input %1: expected a value defined earlier in the graph, found a "
            "later or missing value (a cycle?)");
  // A recorded output type that disagrees with the rule.
  Graph h;
  Builder c(h);
  ValueId u = c.input("u", DType::f32, {2});
  c.exp(u);
  Node n = h.node(1);
  Graph h2;
  Builder c2(h2);
  c2.input("u", DType::f32, {2});
  h2.add_node(n, {TensorType{DType::f32, Shape{3}}});
  EXPECT_EQ(verify(h2).message(), "node 1 (exp) with inputs (f32[2]): output 0: expected f32[2], found f32[3] recorded");
}

TEST(Interpreter, MissingAndMistypedFeeds) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2});
  b.output("y", b.neg(x));
  EXPECT_EQ(interpret(g, {}).status().message(), "input 'x': expected a value fed by name, found none");
  EXPECT_EQ(interpret(g, {{"x", arr(DType::f32, {3}, {1, 2, 3})}}).status().message(),
            "input 'x': expected f32[2], found f32[3]");
}

TEST(Interpreter, RoundsToDtypeWhenAsked) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::bf16, {1});
  b.output("y", b.scale(x, 1.0 / 3.0));
  auto exact = interpret(g, {{"x", arr(DType::bf16, {1}, {1.0})}});
  auto rounded = interpret(g, {{"x", arr(DType::bf16, {1}, {1.0})}}, {.round_to_dtype = true});
  EXPECT_DOUBLE_EQ(exact->at("y").data[0], 1.0 / 3.0);
  EXPECT_EQ(rounded->at("y").data[0], double(bf16_to_f32(f32_to_bf16(1.0f / 3.0f))));
}

// NOTE [integer saturation]: a folded double beyond an integer type's range becomes its nearest end, as
// torch's open-ended slice (an end of 2^63 - 1, held as the double 2^63) needs; a plain cast gave INT64_MIN.
TEST(Interpreter, IntegersSaturateWhenRoundedBack) {
  const double big = 9223372036854775807.0;  // 2^63: what INT64_MAX is as a double
  const std::vector<double> v = {big, -big, 1e30, -1e30, std::nan(""), 5.7, -5.7, 300.0, -1.0};
  const HostArray a(TensorType{DType::i64, Shape{int64_t(v.size())}}, v);
  const Tensor t = a.to_tensor();
  const std::vector<int64_t> want = {INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 0, 5, -5, 300, -1};
  EXPECT_EQ(std::vector<int64_t>(t.span<int64_t>().begin(), t.span<int64_t>().end()), want);
  const Tensor t32 = HostArray(TensorType{DType::i32, Shape{int64_t(v.size())}}, v).to_tensor();
  const std::vector<int32_t> want32 = {INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, 0, 5, -5, 300, -1};
  EXPECT_EQ(std::vector<int32_t>(t32.span<int32_t>().begin(), t32.span<int32_t>().end()), want32);
  const Tensor t8 = HostArray(TensorType{DType::u8, Shape{int64_t(v.size())}}, v).to_tensor();
  const std::vector<uint8_t> want8 = {255, 0, 255, 0, 0, 5, 0, 255, 0};
  EXPECT_EQ(std::vector<uint8_t>(t8.span<uint8_t>().begin(), t8.span<uint8_t>().end()), want8);
}

TEST(ReduceOps, BroadcastAndReduceValues) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 1});
  ValueId y = b.broadcast(x, {3, 2, 4});
  b.output("y", y);
  b.output("s", b.reduce_sum(y, {0, 2}));
  b.output("m", b.reduce_max(b.input("z", DType::f32, {2, 3}), {-1}, true));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto out = interpret(g, {{"x", arr(DType::f32, {2, 1}, {1, 2})}, {"z", arr(DType::f32, {2, 3}, {1, 5, 2, -1, -3, -2})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("y").type.to_string(), "f32[3, 2, 4]");
  EXPECT_EQ(out->at("y").data[5], 2.0);
  EXPECT_EQ(out->at("s").data, (std::vector<double>{12, 24}));
  EXPECT_EQ(out->at("m").type.to_string(), "f32[2, 1]");
  EXPECT_EQ(out->at("m").data, (std::vector<double>{5, -1}));
  Graph g2;
  Builder b2(g2);
  b2.broadcast(b2.input("x", DType::f32, {3}), {2, 4});
  EXPECT_EQ(b2.status().message(),
            "node 1 (broadcast) with inputs (f32[3]): broadcast: dimension 1: expected 3 or a 1 in the input to "
            "broadcast from, found input [3] against [2, 4]");
}

// d/dx of a small composite, against finite differences of the interpreter.
TEST(Autodiff, ElementwiseAndReduceGradients) {
  for (bool tanh_form : {true, false}) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {3, 5});
    ValueId w = b.parameter("w", DType::f32, {5});
    ValueId c = b.input("c", DType::boolean, {3, 5});
    ValueId wb = b.broadcast(w, {3, 5});
    ValueId h = b.add(b.mul(x, wb), b.sub(b.exp(b.scale(x, 0.3)), wb));
    ValueId y = b.where(c, b.gelu(h, tanh_form), b.silu(b.neg(h)));
    ValueId loss = testing::weighted_loss(b, b.reduce_sum(y, {0}, true), 5);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    auto feeds = testing::random_feeds(g, 11, -1.0, 1.0, 2);
    EXPECT_TRUE(testing::check_gradients(g, loss, feeds));
  }
}

// tanh, sqrt and div: values by hand, gradients against finite differences
// (inputs of sqrt and denominators of div kept away from 0).
TEST(Autodiff, TanhSqrtDivValuesAndGradients) {
  {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {3});
    ValueId y = b.input("y", DType::f32, {3});
    b.output("tanh", b.tanh(x));
    b.output("sqrt", b.sqrt(y));
    b.output("div", b.div(x, y));
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    auto out = interpret(g, {{"x", arr(DType::f32, {3}, {0.5, -2, 6})}, {"y", arr(DType::f32, {3}, {4, 0.25, 9})}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(out->at("tanh").data, (std::vector<double>{std::tanh(0.5), std::tanh(-2.0), std::tanh(6.0)}));
    EXPECT_EQ(out->at("sqrt").data, (std::vector<double>{2, 0.5, 3}));
    EXPECT_EQ(out->at("div").data, (std::vector<double>{0.125, -8, 6.0 / 9}));
  }
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  ValueId p = b.input("p", DType::f32, {3, 5});  // fed in [0.5, 2)
  ValueId y = b.div(b.tanh(b.mul(x, p)), b.sqrt(p));
  ValueId loss = testing::weighted_loss(b, b.add(y, b.div(p, b.sqrt(b.mul(p, p)))), 6);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = testing::random_feeds(g, 13, -1.0, 1.0);
  feeds.at("p") = testing::random_feeds(g, 14, 0.5, 2.0).at("p");
  EXPECT_TRUE(testing::check_gradients(g, loss, feeds));
}

// relu, sigmoid, erf, log, max and min: gradients against finite differences (relu's and max/min's
// kinks avoided: x drawn away from 0, and a and b of max/min kept apart), and the comparisons and logic
// by hand, NaN included.
TEST(Autodiff, ReluSigmoidErfLogMaxMinGradients) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  ValueId p = b.input("p", DType::f32, {3, 5});  // fed in [0.5, 2)
  ValueId lo = b.scale(p, -1.0);                 // in (-2, -0.5]: 3 lo stays below x
  auto f = [&](OpKind op, std::vector<ValueId> in) { return b.op1(op, std::move(in)); };
  ValueId y =
      b.add(b.mul(f(OpKind::relu, {x}), f(OpKind::sigmoid, {x})), b.mul(f(OpKind::erf, {x}), f(OpKind::log, {p})));
  ValueId z = b.add(b.op1(OpKind::max, {x, b.scale(lo, 3.0)}), b.op1(OpKind::min, {b.scale(p, 4.0), b.exp(x)}));
  ValueId loss = testing::weighted_loss(b, b.add(y, z), 7);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = testing::random_feeds(g, 15, -1.0, 1.0);
  for (double& v : feeds.at("x").data)
    if (std::fabs(v) < 0.05) v = 0.05;  // relu's kink at 0 is no place for finite differences
  feeds.at("p") = testing::random_feeds(g, 16, 0.5, 2.0).at("p");
  EXPECT_TRUE(testing::check_gradients(g, loss, feeds));
}

// sin and cos against finite differences; floor, ceil and round pass no gradient (PyTorch's zero) and
// round halves to even, as ONNX Round and torch.round.
TEST(Autodiff, SinCosGradientsAndRounding) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  ValueId y = b.add(b.mul(b.op1(OpKind::sin, {x}), b.op1(OpKind::cos, {b.scale(x, 2.5)})),
                    b.op1(OpKind::floor, {b.scale(x, 3.0)}));
  ValueId loss = testing::weighted_loss(b, y, 8);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto feeds = testing::random_feeds(g, 17, -3.0, 3.0);
  for (double& v : feeds.at("x").data) v = std::round(v * 3.0) / 3.0 + 1.0 / 6.0;  // floor's steps kept away
  EXPECT_TRUE(testing::check_gradients(g, loss, feeds));

  Graph h;
  Builder c(h);
  ValueId v = c.input("v", DType::f32, {8});
  c.output("round", c.op1(OpKind::round, {v}));
  c.output("floor", c.op1(OpKind::floor, {v}));
  c.output("ceil", c.op1(OpKind::ceil, {v}));
  ASSERT_TRUE(c.status().is_ok()) << c.status().to_string();
  const std::vector<double> in = {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -2.4};
  auto out = interpret(h, {{"v", arr(DType::f32, {8}, in)}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("round").data, (std::vector<double>{-2, -2, -0, 0, 2, 2, 3, -2}));
  EXPECT_EQ(out->at("floor").data, (std::vector<double>{-3, -2, -1, 0, 1, 2, 2, -3}));
  EXPECT_EQ(out->at("ceil").data, (std::vector<double>{-2, -1, -0, 1, 2, 3, 3, -2}));
}

// dropout: the kept share is 1 - ratio, kept values are scaled by 1 / (1 - ratio), the same seed and
// stream give the same mask and another stream or seed another, seed -1 is the identity, and the gradient
// (the same mask drawn again) agrees with finite differences.
TEST(Autodiff, DropoutMaskAndGradient) {
  constexpr int64_t n = 40000;
  constexpr double ratio = 0.3;
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {n});
  ValueId seed = b.input("seed", DType::i64, {1});
  b.output("a", b.op1(OpKind::dropout, {x, seed}, {{"ratio", ratio}, {"stream", int64_t(1)}}));
  b.output("b", b.op1(OpKind::dropout, {x, seed}, {{"ratio", ratio}, {"stream", int64_t(1)}}));
  b.output("c", b.op1(OpKind::dropout, {x, seed}, {{"ratio", ratio}, {"stream", int64_t(2)}}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const std::vector<double> ones(n, 1.0);
  auto run = [&](double s) {
    auto out = interpret(g, {{"x", arr(DType::f32, {n}, ones)}, {"seed", arr(DType::i64, {1}, {s})}});
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    return *out;
  };
  auto out = run(77);
  int64_t kept = 0, differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = out.at("a").data[size_t(i)];
    EXPECT_TRUE(a == 0.0 || a == double(float(1.0 / (1.0 - ratio)))) << a;
    kept += a != 0.0;
    differ += (a != 0.0) != (out.at("c").data[size_t(i)] != 0.0);
  }
  EXPECT_EQ(out.at("a").data, out.at("b").data);
  EXPECT_NEAR(double(kept) / n, 1.0 - ratio, 0.01);
  EXPECT_NEAR(double(differ) / n, 2 * ratio * (1 - ratio), 0.01);  // independent masks
  EXPECT_NE(run(78).at("a").data, out.at("a").data);
  EXPECT_EQ(run(-1).at("a").data, ones);

  Graph h;
  Builder c(h);
  ValueId y = c.input("y", DType::f32, {4, 9});
  ValueId sd = c.input("seed", DType::i64, {1});
  ValueId loss = testing::weighted_loss(c, c.op1(OpKind::dropout, {c.mul(y, y), sd}, {{"ratio", 0.5}}), 9);
  ASSERT_TRUE(c.status().is_ok()) << c.status().to_string();
  auto feeds = testing::random_feeds(h, 18, -1.0, 1.0);
  feeds.at("seed") = arr(DType::i64, {1}, {4242});
  EXPECT_TRUE(testing::check_gradients(h, loss, feeds));
}

// random_uniform: draws in [low, high) with the uniform mean and spread, the same for the same seed and
// stream and not for another stream, no gradient through it, and a negative seed refused by name.
TEST(Builder, RandomUniformDraws) {
  constexpr int64_t n = 40000;
  Graph g;
  Builder b(g);
  ValueId like = b.input("x", DType::f32, {n});
  ValueId seed = b.input("seed", DType::i64, {1});
  const Attrs at = {{"low", -1.0}, {"high", 3.0}, {"stream", int64_t(4)}};
  b.output("a", b.op1(OpKind::random_uniform, {like, seed}, at));
  b.output("b", b.op1(OpKind::random_uniform, {like, seed}, at));
  b.output("c", b.op1(OpKind::random_uniform, {like, seed}, {{"low", -1.0}, {"high", 3.0}, {"stream", int64_t(5)}}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto run = [&](double s) {
    return interpret(g, {{"x", arr(DType::f32, {n}, std::vector<double>(n, 7.0))}, {"seed", arr(DType::i64, {1}, {s})}});
  };
  auto out = run(11);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  double sum = 0, sq = 0;
  for (double v : out->at("a").data) {
    ASSERT_GE(v, -1.0);
    ASSERT_LT(v, 3.0);
    sum += v, sq += v * v;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.03);
  EXPECT_NEAR(var, 16.0 / 12.0, 0.03);
  EXPECT_EQ(out->at("a").data, out->at("b").data);
  EXPECT_NE(out->at("a").data, out->at("c").data);
  auto refused = run(-1);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("random_uniform: seed: expected >= 0 (the graph draws random values: a "
                                            "training step; export the model in eval mode for validation or "
                                            "inference), found -1"),
            std::string::npos)
      << refused.status().message();
  // No gradient flows through the draws: d/dx sum(x * draws) = draws.
  Graph h;
  Builder c(h);
  ValueId x = c.input("x", DType::f32, {5});
  ValueId sd = c.input("seed", DType::i64, {1});
  ValueId draws = c.op1(OpKind::random_uniform, {x, sd}, at);
  ValueId loss = c.reduce_sum(c.mul(x, draws), {0});
  ASSERT_TRUE(c.status().is_ok()) << c.status().to_string();
  auto feeds = testing::random_feeds(h, 3, -1.0, 1.0);
  feeds.at("seed") = arr(DType::i64, {1}, {21});
  EXPECT_TRUE(testing::check_gradients(h, loss, feeds));
}

TEST(Builder, ComparisonsAndLogicByHand) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4});
  ValueId y = b.input("y", DType::f32, {4});
  ValueId lt = b.op1(OpKind::less, {x, y}), gt = b.op1(OpKind::greater, {x, y}), eq = b.op1(OpKind::equal, {x, y});
  b.output("lt", lt);
  b.output("gt", gt);
  b.output("eq", eq);
  b.output("and", b.op1(OpKind::logical_and, {lt, b.op1(OpKind::logical_not, {b.op1(OpKind::is_nan, {x})})}));
  b.output("or", b.op1(OpKind::logical_or, {gt, eq}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(g.type(lt).dtype, DType::boolean);
  const double nan = std::nan("");
  auto out = interpret(g, {{"x", arr(DType::f32, {4}, {1, 2, nan, -1})}, {"y", arr(DType::f32, {4}, {2, 2, 0, -3})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("lt").data, (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(out->at("gt").data, (std::vector<double>{0, 0, 0, 1}));
  EXPECT_EQ(out->at("eq").data, (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(out->at("and").data, (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(out->at("or").data, (std::vector<double>{0, 1, 0, 1}));
  Graph g2;
  Builder b2(g2);
  b2.op1(OpKind::logical_and, {b2.input("a", DType::f32, {2}), b2.input("b", DType::f32, {2})});
  EXPECT_EQ(b2.status().message(),
            "node 2 (logical_and) with inputs (f32[2], f32[2]): logical_and: a: expected bool, found f32[2]");
}

TEST(Builder, DivOfIntegersIsRejected) {
  Graph g;
  Builder b(g);
  ValueId i = b.input("i", DType::i32, {2});
  b.div(i, i);
  EXPECT_EQ(b.status().message(),
            "node 1 (div) with inputs (i32[2], i32[2]): div: input 0: expected a float type (f32, bf16, f16), found "
            "i32[2]");
}

// cast rounds, so finite differences need a step far above the rounding
// error; the function is linear, so a large step is exact.
TEST(Autodiff, CastGradient) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {7});
  ValueId y = b.cast(b.cast(x, DType::bf16), DType::f32);
  ValueId loss = testing::weighted_loss(b, y, 2);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_TRUE(testing::check_gradients(g, loss, testing::random_feeds(g, 3), 1e-5, 0.25));
}

TEST(Autodiff, UnusedWrtGetsZerosAndBadLossIsRejected) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2});
  ValueId unused = b.parameter("u", DType::f32, {4});
  ValueId loss = b.reduce_sum(b.mul(x, x), {0});
  ASSERT_TRUE(b.status().is_ok());
  std::vector<ValueId> wrt = {x, unused};
  auto grads = append_gradients(g, loss, wrt);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  g.add_output("dx", (*grads)[0]);
  g.add_output("du", (*grads)[1]);
  auto out = interpret(g, {{"x", arr(DType::f32, {2}, {3, -1})}, {"u", arr(DType::f32, {4}, {1, 1, 1, 1})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("dx").data, (std::vector<double>{6, -2}));
  EXPECT_EQ(out->at("du").data, (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(append_gradients(g, x, wrt).status().message(),
            "autodiff: loss: expected a float value with one element, found f32[2]");
}

TEST(Autodiff, MissingGradientRuleIsAStatus) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 3});
  ValueId loss = b.reduce_sum(b.op1(OpKind::gelu_grad, {x, x}), {0, 1});  // a backward-only op
  ASSERT_TRUE(b.status().is_ok());
  std::vector<ValueId> wrt = {x};
  EXPECT_EQ(append_gradients(g, loss, wrt).status().message(),
            "autodiff: node 1 (gelu_grad): expected a gradient rule, found none, and an input needs a gradient");
}

// reduce_max: the gradient reaches the maximum (finite differences away from ties), and ties share it
// evenly, as torch.amax's backward.
TEST(Autodiff, ReduceMaxGradient) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 4, 5});
  ValueId loss = testing::weighted_loss(b, b.reduce_max(x, {0, 2}, true), 10);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_TRUE(testing::check_gradients(g, loss, testing::random_feeds(g, 19, -1.0, 1.0)));

  Graph h;
  Builder c(h);
  ValueId y = c.input("y", DType::f32, {4});
  ValueId l = c.reduce_sum(c.reduce_max(y, {0}), {});
  std::vector<ValueId> wrt = {y};
  auto grads = append_gradients(h, l, wrt);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  c.output("dy", (*grads)[0]);
  auto out = interpret(h, {{"y", arr(DType::f32, {4}, {1, 3, 3, 2})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out->at("dy").data, (std::vector<double>{0, 0.5, 0.5, 0}));
}

TEST(CollectiveOps, TypesGradientsAndOneDeviceMeaning) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4, 3});
  Attrs one{{"group", std::string("data")}, {"group_size", int64_t(1)}};
  Attrs ar = one;
  ar.set("reduce", std::string("sum"));
  ValueId y = b.op1(OpKind::all_reduce, {x}, ar);
  ValueId z = b.op1(OpKind::all_gather, {b.op1(OpKind::reduce_scatter, {y}, one)}, one);
  ValueId loss = testing::weighted_loss(b, z, 3);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_TRUE(testing::check_gradients(g, loss, testing::random_feeds(g, 2)));

  Graph g2;
  Builder b2(g2);
  ValueId x2 = b2.input("x", DType::f32, {5, 3});
  ValueId rs = b2.op1(OpKind::reduce_scatter, {x2}, {{"group", std::string("data")}, {"group_size", int64_t(2)}});
  EXPECT_FALSE(rs.valid());
  EXPECT_EQ(b2.status().message(),
            "node 1 (reduce_scatter) with inputs (f32[5, 3]): reduce_scatter: dimension 0: expected a multiple of "
            "group_size 2, found 5");
  Graph g3;
  Builder b3(g3);
  ValueId x3 = b3.input("x", DType::f32, {4});
  b3.output("y", b3.op1(OpKind::all_gather, {x3}, {{"group", std::string("tensor")}, {"group_size", int64_t(2)}}));
  ASSERT_TRUE(b3.status().is_ok());
  EXPECT_EQ(b3.type(g3.outputs()[0].second).to_string(), "f32[8]");
  EXPECT_EQ(interpret(g3, {{"x", arr(DType::f32, {4}, {1, 2, 3, 4})}}).status().message(),
            "node 1 (all_gather): all_gather over group 'tensor': expected a supported group size for the one-device "
            "reference interpreter (1), found an unsupported one");
}

}  // namespace
}  // namespace aspen::graph
