#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "compiler/executable.h"
#include "compiler/pass.h"
#include "core/philox.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/verify.h"

namespace aspen::compiler {
namespace {

using graph::Builder;
using graph::Graph;
using graph::HostArray;
using graph::OpKind;
using graph::ValueId;

// x [8, 24] -> linear(w1 [32, 24], b1) -> gelu -> linear(w2 [16, 32]) -> mean of squares, with the
// gradients of w1, b1, w2 and x as outputs.
Graph mlp() {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {8, 24});
  ValueId w1 = b.parameter("fc1.weight", DType::f32, {32, 24});
  ValueId b1 = b.parameter("fc1.bias", DType::f32, {32});
  ValueId w2 = b.parameter("fc2.weight", DType::f32, {16, 32});
  ValueId h = b.add(b.op1(OpKind::matmul, {x, w1}, {{"trans_b", int64_t(1)}}), b.broadcast(b1, {8, 32}));
  ValueId y = b.op1(OpKind::matmul, {b.gelu(h), w2}, {{"trans_b", int64_t(1)}});
  ValueId loss = b.scale(b.reduce_sum(b.mul(y, y), {0, 1}), 1.0 / 128);
  b.output("loss", loss);
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  const std::vector<ValueId> wrt{w1, b1, w2, x};
  auto grads = graph::append_gradients(g, loss, wrt);
  EXPECT_TRUE(grads.is_ok()) << grads.status().to_string();
  const char* names[] = {"grad.fc1.weight", "grad.fc1.bias", "grad.fc2.weight", "grad.x"};
  for (size_t i = 0; i < wrt.size(); ++i) g.add_output(names[i], (*grads)[i]);
  return g;
}

std::map<std::string, HostArray> mlp_feeds() {
  std::map<std::string, HostArray> feeds;
  const std::map<std::string, Shape> shapes = {
      {"x", Shape{8, 24}}, {"fc1.weight", Shape{32, 24}}, {"fc1.bias", Shape{32}}, {"fc2.weight", Shape{16, 32}}};
  uint64_t seed = 1;
  for (const auto& [name, s] : shapes) {
    Tensor t(DType::f32, s);
    philox_fill_uniform(t.span<float>(), seed++, 0, 0, -1, 1);
    feeds[name] = HostArray::from_tensor(t);
  }
  return feeds;
}

double nmse(const HostArray& got, const HostArray& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.data.size(); ++i) {
    err += (got.data[i] - want.data[i]) * (got.data[i] - want.data[i]);
    ref += want.data[i] * want.data[i];
  }
  return err / ref;
}

TEST(Precision, EveryMatmulTakesBf16AndFusionStillApplies) {
  const Graph g = mlp();
  auto exe = compile(g, {.verify_each_pass = true, .compute = DType::bf16});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const Graph& out = (*exe)->graph;
  int matmuls = 0, with_bias = 0;
  std::set<int32_t> cast_sources;
  for (const auto& n : out.nodes()) {
    if (n.op == OpKind::cast) {
      EXPECT_TRUE(cast_sources.insert(n.inputs[0].index).second) << "one cast per value";
    }
    if (n.op != OpKind::matmul) continue;
    ++matmuls;
    with_bias += n.inputs.size() == 3;
    EXPECT_EQ(n.attrs.i_or("out_dtype", -1), int64_t(DType::f32));
    EXPECT_EQ(out.type(n.inputs[0]).dtype, DType::bf16);
    EXPECT_EQ(out.type(n.inputs[1]).dtype, DType::bf16);
    EXPECT_EQ(out.type(n.outputs[0]).dtype, DType::f32);
  }
  EXPECT_GE(matmuls, 5);    // 2 forward, dw1, dw2 and the data gradients
  EXPECT_EQ(with_bias, 1);  // fc1's bias fused as the epilogue of the new matmul
  for (const auto& ins : (*exe)->program.code) {
    if (ins.kind != compiler::InstrKind::kernel) continue;
    const OpKind op = out.node(ins.node).op;
    if (op == OpKind::matmul || op == OpKind::cast) {
      EXPECT_FALSE(ins.reference) << (*exe)->listing();
    }
  }
  // The f32 compile is untouched.
  auto plain = compile(g, {.verify_each_pass = true});
  ASSERT_TRUE(plain.is_ok());
  for (const auto& n : (*plain)->graph.nodes()) {
    EXPECT_NE(n.op, OpKind::cast);
    if (n.op == OpKind::matmul) {
      EXPECT_FALSE(n.attrs.has("out_dtype"));
    }
  }
}

// The transformed graph's meaning (interpreter, rounding to each dtype) is the f32 graph's within bf16
// tolerance.
TEST(Precision, MeaningIsWithinBf16OfF32) {
  const Graph g = mlp();
  auto exe = compile(g, {.verify_each_pass = true, .compute = DType::bf16});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const auto feeds = mlp_feeds();
  auto want = graph::interpret(g, feeds, {.round_to_dtype = true});
  auto got = graph::interpret((*exe)->graph, feeds, {.round_to_dtype = true});
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const double loss = want->at("loss").data[0];
  EXPECT_LE(std::abs(got->at("loss").data[0] - loss), 1e-2 * std::abs(loss));
  for (const char* name : {"grad.fc1.weight", "grad.fc1.bias", "grad.fc2.weight", "grad.x"})
    EXPECT_LE(nmse(got->at(name), want->at(name)), 1e-3) << name;
}

// f16 compute and narrow partials: the compiled program (fast kernels only,
// no reference fallback) equals the transformed graph's meaning, which is the
// f32 graph's within the narrow type's tolerance.
TEST(Precision, F16ComputeAndNarrowPartials) {
  const Graph g = mlp();
  const auto feeds = mlp_feeds();
  auto want = graph::interpret(g, feeds, {.round_to_dtype = true});
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  const std::pair<DType, DType> cases[] = {
      {DType::f16, DType::f32}, {DType::f16, DType::f16}, {DType::bf16, DType::bf16}};
  for (const auto& [compute, partials] : cases) {
    SCOPED_TRACE(std::string(dtype_name(compute)) + " compute, " + std::string(dtype_name(partials)) + " partials");
    auto exe = compile(g, {.verify_each_pass = true, .compute = compute, .partials = partials});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    for (const auto& ins : (*exe)->program.code) EXPECT_FALSE(ins.reference) << (*exe)->listing();
    int narrow_out = 0;
    for (const auto& n : (*exe)->graph.nodes())
      if (n.op == OpKind::matmul) narrow_out += n.attrs.i_or("out_dtype", -1) == int64_t(partials);
    EXPECT_GE(narrow_out, 5);
    auto meaning = graph::interpret((*exe)->graph, feeds, {.round_to_dtype = true});
    ASSERT_TRUE(meaning.is_ok()) << meaning.status().to_string();
    const double tol = compute == DType::f16 ? (partials == DType::f32 ? 1e-6 : 1e-5) : 1e-3;
    for (const char* name : {"grad.fc1.weight", "grad.fc1.bias", "grad.fc2.weight", "grad.x"})
      EXPECT_LE(nmse(meaning->at(name), want->at(name)), tol) << name;
  }
  CompileOptions bad{.compute = DType::f16, .partials = DType::bf16};
  EXPECT_EQ(compile(g, bad).status().message(),
            "pass precision: compile options: partials: expected f32 or the compute type (f16), found bf16");
}

// Self-attention over x [1, T, 16] (q, k, v by matmuls, 2 heads of 8, causal) and its gradients: with compute
// = bf16, attention and attention_grad over T = 40 rows take bf16 q, k and v (out_dtype f32, fast kernels),
// while T = 3 (decoding's shape, NOTE [attention decode rows]) keeps f32; the meaning stays within bf16 of f32.
TEST(Precision, AttentionTakesBf16BeyondDecodeRows) {
  for (const int64_t T : {40, 3}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {T, 16});
    ValueId w = b.parameter("w", DType::f32, {16, 48});
    ValueId qkv = b.op1(OpKind::matmul, {x, w});
    auto head = [&](int64_t at) {  // [T, 16] -> [1, 2, T, 8]
      return b.transpose(b.reshape(b.slice(qkv, 1, at, at + 16), {1, T, 2, 8}), {0, 2, 1, 3});
    };
    const std::vector<ValueId> att =
        b.op(OpKind::attention, {head(0), head(16), head(32)}, {{"scale", 0.35}, {"mask", std::string("causal")}});
    ValueId loss = b.scale(b.reduce_sum(b.mul(att[0], att[0]), {0, 1, 2, 3}), 1.0 / double(T));
    b.output("loss", loss);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    const std::vector<ValueId> wrt{w, x};
    auto grads = graph::append_gradients(g, loss, wrt);
    ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
    g.add_output("grad.w", (*grads)[0]);
    g.add_output("grad.x", (*grads)[1]);
    auto exe = compile(g, {.verify_each_pass = true, .compute = DType::bf16});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    const Graph& out = (*exe)->graph;
    int attentions = 0;
    for (const auto& n : out.nodes()) {
      if (n.op != OpKind::attention && n.op != OpKind::attention_grad) continue;
      ++attentions;
      EXPECT_EQ(n.attrs.has("out_dtype"), T > 4);
      for (int k = 0; k < 3; ++k) EXPECT_EQ(out.type(n.inputs[size_t(k)]).dtype, T > 4 ? DType::bf16 : DType::f32);
      EXPECT_EQ(out.type(n.outputs[0]).dtype, DType::f32);
    }
    EXPECT_EQ(attentions, 2);
    for (const auto& ins : (*exe)->program.code) EXPECT_FALSE(ins.reference) << (*exe)->listing();
    std::map<std::string, HostArray> feeds;
    for (const auto& [name, s] : std::map<std::string, Shape>{{"x", Shape{T, 16}}, {"w", Shape{16, 48}}}) {
      Tensor t(DType::f32, s);
      philox_fill_uniform(t.span<float>(), 7, name == "x", 0, -1, 1);
      feeds[name] = HostArray::from_tensor(t);
    }
    auto want = graph::interpret(g, feeds, {.round_to_dtype = true});
    auto got = graph::interpret(out, feeds, {.round_to_dtype = true});
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    for (const char* name : {"grad.w", "grad.x"}) EXPECT_LE(nmse(got->at(name), want->at(name)), 1e-3) << name;
  }
}

TEST(Precision, PassRewritesOnlyF32Matmuls) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4, 6});
  ValueId w = b.parameter("w", DType::f32, {6, 5});
  ValueId y = b.op1(OpKind::matmul, {x, w});
  b.output("y", b.op1(OpKind::matmul, {b.exp(y), b.parameter("v", DType::f32, {5, 3})}));
  b.output("z", b.op1(OpKind::matmul, {x, w}, {{"trans_a", int64_t(0)}}));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  CompileContext ctx;
  ctx.options.compute = DType::bf16;
  ASSERT_TRUE(make_precision()->run(g, ctx).is_ok());
  ASSERT_TRUE(graph::verify(g).is_ok()) << graph::verify(g).to_string();
  int casts = 0;
  for (const auto& n : g.nodes()) casts += n.op == OpKind::cast;
  EXPECT_EQ(casts, 4);  // x and w once each (shared by both of their matmuls), exp(y), v
  ctx.options.compute = DType::i32;
  EXPECT_EQ(make_precision()->run(g, ctx).message(),
            "compile options: compute: expected f32, bf16 or f16, found i32");
}

// Stochastic rounding: the casts of parameters (w, v) take the graph's seed input and a stream per parameter;
// the input's and the activation's cast round to nearest; without the seed input the pass says so where it casts
// a parameter, and a graph that casts none (an optimizer step) needs no seed.
TEST(Precision, StochasticRoundingCastsParametersFromTheSeed) {
  for (bool with_seed : {true, false}) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {4, 6});
    ValueId y = b.op1(OpKind::matmul, {x, b.parameter("w", DType::f32, {6, 5})});
    b.output("y", b.op1(OpKind::matmul, {b.exp(y), b.parameter("v", DType::f32, {5, 3})}));
    if (with_seed) b.input(kRandomSeedInput, DType::i64, {1});  // declared after its users: the pass moves it
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    CompileContext ctx;
    ctx.options.compute = DType::f16;
    ctx.options.stochastic_rounding = true;
    Status st = make_precision()->run(g, ctx);
    if (!with_seed) {
      EXPECT_EQ(st.message(), "compile options: stochastic_rounding (casting parameter 'w'): expected a graph with "
                              "the run-time seed input 'dropout_seed' (i64[1]), found no such input");
      continue;
    }
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_TRUE(graph::verify(g).is_ok()) << graph::verify(g).to_string();
    std::set<int64_t> streams;
    int nearest = 0;
    for (const auto& n : g.nodes()) {
      if (n.op != OpKind::cast) continue;
      if (n.inputs.size() == 2) {
        EXPECT_EQ(g.producer(n.inputs[1]).name, kRandomSeedInput);
        EXPECT_EQ(g.producer(n.inputs[0]).op, OpKind::parameter);
        streams.insert(n.attrs.i("stream"));
      } else {
        ++nearest;
      }
    }
    EXPECT_EQ(streams.size(), 2u);  // w and v, each its own
    EXPECT_EQ(nearest, 2);          // x and exp(y)
  }
  Graph step;
  Builder b(step);
  b.output("y", b.mul(b.parameter("w", DType::f32, {4}), b.input("g", DType::f32, {4})));
  CompileContext ctx;
  ctx.options.compute = DType::bf16;
  ctx.options.stochastic_rounding = true;
  EXPECT_TRUE(make_precision()->run(step, ctx).is_ok());
}

TEST(Precision, OutDtypeBadInputs) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {8, 24});
  ValueId w = b.parameter("w", DType::f32, {32, 24});
  b.op1(OpKind::matmul, {x, w}, {{"trans_b", int64_t(1)}, {"out_dtype", int64_t(DType::f32)}});
  EXPECT_EQ(b.status().message(),
            "node 2 (matmul) with inputs (f32[8, 24], f32[32, 24]): matmul: a: expected bf16 or f16 (with "
            "out_dtype), found f32[8, 24]");

  Graph g2;
  Builder b2(g2);
  ValueId xb = b2.input("x", DType::bf16, {8, 24});
  ValueId wb = b2.parameter("w", DType::bf16, {32, 24});
  b2.op1(OpKind::matmul, {xb, wb}, {{"trans_b", int64_t(1)}, {"out_dtype", int64_t(DType::f16)}});
  EXPECT_EQ(b2.status().message(),
            "node 2 (matmul) with inputs (bf16[8, 24], bf16[32, 24]): matmul: out_dtype: expected f32 (0) or a's "
            "dtype (1), found 2");

  // No gradient through an out_dtype matmul: the pass runs after autodiff.
  Graph g3;
  Builder b3(g3);
  ValueId w3 = b3.parameter("w", DType::bf16, {32, 24});
  ValueId y = b3.op1(OpKind::matmul, {b3.input("x", DType::bf16, {8, 24}), w3},
                     {{"trans_b", int64_t(1)}, {"out_dtype", int64_t(DType::f32)}});
  ValueId loss = b3.reduce_sum(y, {0, 1});
  ASSERT_TRUE(b3.status().is_ok()) << b3.status().to_string();
  const std::vector<ValueId> wrt{w3};
  auto grads = graph::append_gradients(g3, loss, wrt);
  ASSERT_FALSE(grads.is_ok());
  EXPECT_EQ(grads.status().code(), Code::kUnimplemented);
  EXPECT_NE(grads.status().message().find("out_dtype"), std::string::npos) << grads.status().message();
}

}  // namespace
}  // namespace aspen::compiler
