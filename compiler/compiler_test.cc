#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <tuple>

#include "compiler/executable.h"
#include "compiler/memory_plan.h"
#include "compiler/memory_profile.h"
#include "compiler/pass.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/verify.h"

namespace aspen::compiler {
namespace {

using graph::Builder;
using graph::Graph;
using graph::OpKind;
using graph::ValueId;

int count(const Graph& g, OpKind op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.op == op;
  return n;
}

TEST(Passes, DeadCodeKeepsInterfaceAndOutputsOnly) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4});
  b.parameter("unused", DType::f32, {2});
  b.exp(x);  // dead
  b.output("y", b.neg(x));
  ASSERT_TRUE(b.status().is_ok());
  CompileContext ctx;
  ASSERT_TRUE(make_dead_code_elimination()->run(g, ctx).is_ok());
  EXPECT_TRUE(graph::verify(g).is_ok());
  EXPECT_EQ(count(g, OpKind::exp), 0);
  EXPECT_EQ(count(g, OpKind::parameter), 1);
  EXPECT_EQ(count(g, OpKind::neg), 1);
}

TEST(Passes, CommonSubexpressionsMerge) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4});
  ValueId a = b.scale(x, 2.0), a2 = b.scale(x, 2.0), c = b.scale(x, 3.0);
  b.output("y", b.add(b.add(a, a2), c));
  ASSERT_TRUE(b.status().is_ok());
  CompileContext ctx;
  ASSERT_TRUE(make_common_subexpression_elimination()->run(g, ctx).is_ok());
  EXPECT_TRUE(graph::verify(g).is_ok());
  EXPECT_EQ(count(g, OpKind::scale), 2);  // alpha 2 once, alpha 3 once
}

TEST(Passes, ConstantsFold) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3});
  ValueId k = b.broadcast(b.exp(b.scalar(1.0f)), {3});  // foldable
  b.output("y", b.mul(x, k));
  ASSERT_TRUE(b.status().is_ok());
  CompileContext ctx;
  ASSERT_TRUE(make_constant_folding()->run(g, ctx).is_ok());
  ASSERT_TRUE(make_dead_code_elimination()->run(g, ctx).is_ok());
  EXPECT_TRUE(graph::verify(g).is_ok());
  EXPECT_EQ(count(g, OpKind::exp), 0);
  EXPECT_EQ(count(g, OpKind::broadcast), 0);
  auto out = graph::interpret(g, {{"x", graph::HostArray({DType::f32, {3}}, {1, 2, 3})}});
  ASSERT_TRUE(out.is_ok());
  EXPECT_FLOAT_EQ(float(out->at("y").data[2]), 3.0f * float(std::exp(1.0)));
}

TEST(MemoryPlan, ReusesDeadBuffersAndWorksInPlace) {
  // A chain of 10 elementwise ops over 1 KiB values: in-place reuse keeps the
  // arena at one or two values while the naive sum is ten.
  Graph g;
  Builder b(g);
  ValueId v = b.input("x", DType::f32, {256});
  for (int i = 0; i < 10; ++i) v = i % 2 ? b.exp(v) : b.scale(v, 0.5);
  b.output("y", v);
  ASSERT_TRUE(b.status().is_ok());
  auto plan = plan_memory(g);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->naive_bytes, 11 * 1024);
  EXPECT_LE(plan->arena_bytes, 2 * 1024);
  EXPECT_GE(plan->in_place, 9);
  EXPECT_NE(plan->report(g).find("naive sum 11264"), std::string::npos) << plan->report(g);
}

// No two values that are live at the same time may overlap.
TEST(MemoryPlan, LiveValuesNeverOverlap) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {8, 16});
  std::vector<ValueId> keep;
  ValueId v = x;
  for (int i = 0; i < 12; ++i) {
    v = b.add(i % 3 ? b.exp(v) : b.reduce_sum(b.broadcast(v, {2, 8, 16}), {0}), x);
    if (i % 4 == 0) keep.push_back(v);
  }
  for (size_t i = 0; i < keep.size(); ++i) v = b.add(v, keep[i]);
  b.output("y", v);
  ASSERT_TRUE(b.status().is_ok());
  auto plan = plan_memory(g);
  ASSERT_TRUE(plan.is_ok());
  std::vector<int32_t> def(size_t(g.num_values()), -1), last(size_t(g.num_values()), -1);
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
    for (auto o : g.node(i).outputs) def[size_t(o.index)] = i;
    for (auto in : g.node(i).inputs) last[size_t(in.index)] = i;
  }
  for (auto& [n, o] : g.outputs()) last[size_t(o.index)] = int32_t(g.nodes().size());
  for (int32_t a = 0; a < g.num_values(); ++a)
    for (int32_t c = a + 1; c < g.num_values(); ++c) {
      const Slot &sa = plan->slots[size_t(a)], &sc = plan->slots[size_t(c)];
      if (sa.storage != Storage::arena || sc.storage != Storage::arena) continue;
      // Live ranges [def, last]; an in-place output may start where its input ends.
      bool overlap_time = def[size_t(a)] < std::max(last[size_t(c)], def[size_t(c)]) &&
                          def[size_t(c)] < std::max(last[size_t(a)], def[size_t(a)]);
      bool overlap_bytes = sa.offset < sc.offset + sc.bytes && sc.offset < sa.offset + sa.bytes;
      EXPECT_FALSE(overlap_time && overlap_bytes) << "%" << a << " and %" << c;
    }
}

// The transformer patterns of fusion.cc, in one graph.
Graph fusable_graph() {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4, 6});
  ValueId r = b.input("r", DType::f32, {4, 6});
  ValueId h = b.add(x, r);  // residual stream
  ValueId y = b.op(OpKind::layernorm, {h, b.parameter("ln.weight", DType::f32, {6}),
                                       b.parameter("ln.bias", DType::f32, {6})},
                   {{"eps", 1e-5}})[0];
  ValueId mm = b.op1(OpKind::matmul, {y, b.parameter("fc.weight", DType::f32, {8, 6})}, {{"trans_b", int64_t(1)}});
  ValueId fc = b.gelu(b.add(mm, b.broadcast(b.parameter("fc.bias", DType::f32, {8}), {4, 8})));
  ValueId act = b.gelu(b.add(b.exp(fc), b.broadcast(b.parameter("act.bias", DType::f32, {8}), {4, 8})));
  b.output("act", act);
  b.output("h2", b.add(h, y));  // a later user of the residual stream
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return g;
}

// The memory view's curve (compiler/memory_profile.h): a point per node (small programs), never above the
// arena (values live together sit at distinct offsets), rising to the plan's peak region; long programs are
// cut to at most 1000 points, each the largest of its nodes.
TEST(MemoryProfile, CurveStaysWithinTheArena) {
  auto exe = compile(fusable_graph(), {});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const profile::ProgramMemory m = program_memory(**exe, "step");
  EXPECT_EQ(m.name, "step");
  EXPECT_EQ(m.nodes, int64_t((*exe)->graph.nodes().size()));
  EXPECT_EQ(m.stride, 1);
  ASSERT_EQ(int64_t(m.live_bytes.size()), m.nodes);
  EXPECT_EQ(m.arena_bytes, (*exe)->plan.arena_bytes);
  const int64_t top = *std::max_element(m.live_bytes.begin(), m.live_bytes.end());
  EXPECT_GT(top, 0);
  EXPECT_LE(top, m.arena_bytes);
  EXPECT_GT(m.parameter_bytes, 0);
  ASSERT_FALSE(m.at_peak.empty());
  for (size_t i = 1; i < m.at_peak.size(); ++i) EXPECT_GE(m.at_peak[i - 1].bytes, m.at_peak[i].bytes);

  Graph long_chain;  // 2500 nodes
  Builder b(long_chain);
  ValueId x = b.input("x", DType::f32, {64});
  for (int i = 0; i < 2500; ++i) x = b.add(b.exp(x), x);
  b.output("y", x);
  auto chain = compile(long_chain, {.opt_level = OptLevel::O1});
  ASSERT_TRUE(chain.is_ok()) << chain.status().to_string();
  const profile::ProgramMemory c = program_memory(**chain, "chain");
  EXPECT_GT(c.stride, 1);
  EXPECT_LE(int64_t(c.live_bytes.size()), profile::ProgramMemory::kMaxPoints);
  EXPECT_EQ(int64_t(c.live_bytes.size()), (c.nodes + c.stride - 1) / c.stride);
  for (int64_t v : c.live_bytes) EXPECT_LE(v, c.arena_bytes);
}

TEST(Passes, FusionAtO2Only) {
  Graph g = fusable_graph();
  CompileContext o2{{.opt_level = OptLevel::O2, .verify_each_pass = true}};
  ASSERT_TRUE(run_passes(g, default_pipeline(o2.options), o2).is_ok());
  EXPECT_EQ(count(g, OpKind::add_layernorm), 1);
  EXPECT_EQ(count(g, OpKind::layernorm), 0);
  EXPECT_EQ(count(g, OpKind::bias_gelu), 1);
  EXPECT_EQ(count(g, OpKind::add), 1);  // only the later residual add h + y remains
  int biased = 0;
  for (const auto& node : g.nodes()) biased += node.op == OpKind::matmul && node.inputs.size() == 3;
  EXPECT_EQ(biased, 1);
  Graph g1 = fusable_graph();
  CompileContext o1{{.opt_level = OptLevel::O1, .verify_each_pass = true}};
  ASSERT_TRUE(run_passes(g1, default_pipeline(o1.options), o1).is_ok());
  EXPECT_EQ(count(g1, OpKind::add_layernorm) + count(g1, OpKind::bias_gelu), 0);
}

TEST(Passes, FusionKeepsTheMeaning) {
  Graph g = fusable_graph();
  Graph fused = g;
  CompileContext o2{{.opt_level = OptLevel::O2, .verify_each_pass = true}};
  ASSERT_TRUE(run_passes(fused, default_pipeline(o2.options), o2).is_ok());
  std::map<std::string, graph::HostArray> feeds;
  uint64_t seed = 1;
  for (const auto& node : g.nodes()) {
    if (node.op != OpKind::input && node.op != OpKind::parameter) continue;
    graph::HostArray a(g.type(node.outputs[0]));
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = std::sin(double(++seed) * 0.37);
    feeds[node.name] = a;
  }
  auto want = graph::interpret(g, feeds);
  auto got = graph::interpret(fused, feeds);
  ASSERT_TRUE(want.is_ok() && got.is_ok());
  for (const auto& [name, w] : *want)
    for (size_t i = 0; i < w.data.size(); ++i) ASSERT_NEAR(got->at(name).data[i], w.data[i], 1e-12) << name;
}

// The reference interpreter gives `rewritten` exactly `g`'s outputs, every input and parameter filled by
// value(its node, element index).
void expect_same_outputs(const Graph& g, const Graph& rewritten,
                         const std::function<double(const graph::Node&, size_t)>& value) {
  std::map<std::string, graph::HostArray> feeds;
  for (const auto& node : g.nodes()) {
    if (node.op != OpKind::input && node.op != OpKind::parameter) continue;
    graph::HostArray a(g.type(node.outputs[0]));
    for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = value(node, i);
    feeds[node.name] = a;
  }
  auto want = graph::interpret(g, feeds);
  auto got = graph::interpret(rewritten, feeds);
  ASSERT_TRUE(want.is_ok() && got.is_ok());
  for (const auto& [name, w] : *want)
    for (size_t i = 0; i < w.data.size(); ++i) ASSERT_EQ(got->at(name).data[i], w.data[i]) << name;
}

// NOTE [matmul groups]: q, k and v of a decode step (one a, [N, K] weights, at most 8 rows) become one
// matmul_group that means what they meant; a prefill's (16 rows) stay apart; a weight made after the first
// product (a cast) moves the group to the last one's place; a product read before the last one's place and a
// weight made after the first: no group.
TEST(Passes, DecodeProductsOfOneInputGroup) {
  auto build = [](int64_t rows, bool cast_k, bool read_q_early, bool bias) {
    Graph g;
    Builder b(g);
    ValueId h = b.input("h", DType::f32, {rows, 6});
    auto linear = [&](const std::string& name, int64_t n, bool cast) {
      const auto scope = Builder::Scope::at(b, "h.3.attn." + name);  // NOTE [name scopes]
      ValueId w = b.parameter(name + ".weight", cast ? DType::f32 : DType::bf16, {n, 6});
      if (cast) w = b.cast(w, DType::bf16);
      std::vector<ValueId> in = {h, w};
      if (bias) in.push_back(b.parameter(name + ".bias", DType::f32, {n}));
      return b.op1(OpKind::matmul, in, {{"trans_b", int64_t(1)}});
    };
    ValueId q = linear("q", 8, false);
    ValueId early = read_q_early ? b.exp(q) : q;
    ValueId k = linear("k", 4, cast_k);
    ValueId v = linear("v", 4, false);
    b.output("q", early);
    b.output("kv", b.add(k, v));
    EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
    return g;
  };
  CompileContext o2{{.opt_level = OptLevel::O2, .verify_each_pass = true}};
  for (auto [rows, cast_k, early, bias, groups] :
       {std::tuple{1, false, false, false, 1}, std::tuple{8, false, false, true, 1},
        std::tuple{16, false, false, false, 0}, std::tuple{3, true, false, false, 1},
        std::tuple{3, false, true, false, 1}, std::tuple{3, true, true, true, 0}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + (cast_k ? ", k cast" : "") + (early ? ", q read early" : "") +
                 (bias ? ", biases" : ""));
    const Graph g = build(rows, cast_k, early, bias);
    Graph grouped = g;
    ASSERT_TRUE(run_passes(grouped, default_pipeline(o2.options), o2).is_ok());
    EXPECT_EQ(count(grouped, OpKind::matmul_group), groups);
    EXPECT_EQ(count(grouped, OpKind::matmul), groups ? 0 : 3);
    for (const graph::Node& n : grouped.nodes()) {  // the members' common scope; a product alone keeps its own
      if (n.op == OpKind::matmul_group) {
        EXPECT_EQ(n.scope, "h.3.attn");
      }
      if (n.op == OpKind::matmul) {
        EXPECT_EQ(n.scope.rfind("h.3.attn.", 0), 0u) << n.scope;
      }
    }
    uint64_t seed = 1;
    expect_same_outputs(g, grouped, [&](const graph::Node&, size_t) { return std::sin(double(++seed) * 0.37); });
  }
}

// Quantized decode products of one input (matmul_q, one block format) group too; another format stays apart.
TEST(Passes, QuantizedDecodeProductsGroupByFormat) {
  Graph g;
  Builder b(g);
  ValueId h = b.input("h", DType::f32, {2, 64});
  auto linear = [&](const std::string& name, int64_t n, const std::string& format) {
    const int64_t row_bytes = format == "q8_0" ? 68 : 36;  // 2 blocks of 34 (Q8_0) or 18 (Q4_0) bytes
    return b.op1(OpKind::matmul_q, {h, b.parameter(name, DType::u8, {n, row_bytes})},
                 {{"format", format}, {"k", int64_t(64)}});
  };
  b.output("q", linear("q", 8, "q8_0"));
  b.output("k", linear("k", 4, "q8_0"));
  b.output("v", linear("v", 4, "q8_0"));
  b.output("o", linear("o", 8, "q4_0"));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  Graph grouped = g;
  CompileContext o2{{.opt_level = OptLevel::O2, .verify_each_pass = true}};
  ASSERT_TRUE(run_passes(grouped, default_pipeline(o2.options), o2).is_ok());
  EXPECT_EQ(count(grouped, OpKind::matmul_group), 1);
  EXPECT_EQ(count(grouped, OpKind::matmul_q), 1);  // the Q4_0 one
  {  // a group of matmul_q without its format: named, not a crash
    Graph bad;
    Builder bb(bad);
    bb.op(OpKind::matmul_group, {bb.input("a", DType::f32, {1, 64}), bb.input("w", DType::u8, {8, 68})},
          {{"op", int64_t(OpKind::matmul_q)}, {"k", int64_t(64)}});
    EXPECT_NE(bb.status().to_string().find("format"), std::string::npos) << bb.status().to_string();
  }
  // Weight bytes 16 (f16 scales near 5e-4, quants 16); h in [-1, 1].
  expect_same_outputs(g, grouped, [](const graph::Node& node, size_t i) {
    return node.op == OpKind::parameter ? 16.0 : std::sin(double(i) * 0.37);
  });
}

// GELU as exporters write it, in pieces and in several orders, becomes one
// gelu node (and multiplications by a constant of one value become scales);
// a near miss (0.045 for 0.044715) stays as it was. The fused graph means what
// the pieces meant (within the f64 rounding of the two forms).
TEST(Passes, FusionFindsGeluInItsPieces) {
  Graph g;
  Builder b(g);
  const std::vector<int64_t> shape = {3, 5};
  ValueId x = b.input("x", DType::f32, {3, 5});
  auto c = [&](float v) { return b.broadcast(b.scalar(v), shape); };
  ValueId cube = b.mul(b.mul(x, x), x);
  auto tanh_gelu = [&](float k) {
    ValueId inner = b.mul(c(0.7978845608f), b.add(x, b.mul(c(k), cube)));
    return b.mul(b.mul(c(0.5f), x), b.add(b.tanh(inner), c(1.0f)));
  };
  b.output("tanh", tanh_gelu(0.044715f));    // HF's gelu_new
  b.output("near_miss", tanh_gelu(0.045f));  // not a GELU
  ValueId erf = b.op1(OpKind::erf, {b.op1(OpKind::div, {x, c(1.4142135f)})});
  b.output("erf", b.mul(b.mul(x, b.add(c(1.0f), erf)), c(0.5f)));  // torch's nn.GELU in TorchScript
  b.output("erf_scaled", b.mul(b.scale(b.add(erf, c(1.0f)), 0.5), x));
  b.output("half", b.mul(x, c(0.5f)));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  Graph fused = g;
  CompileContext o2{{.opt_level = OptLevel::O2, .verify_each_pass = true}};
  ASSERT_TRUE(run_passes(fused, default_pipeline(o2.options), o2).is_ok());
  EXPECT_EQ(count(fused, OpKind::gelu), 3) << fused.to_string();  // tanh, and erf twice
  EXPECT_EQ(count(fused, OpKind::tanh), 1) << fused.to_string();  // the near miss's
  for (const auto& [name, v] : fused.outputs()) {
    const bool fused_away = name == "near_miss" || fused.producer(v).op != OpKind::mul;
    EXPECT_TRUE(fused_away) << name << "\n" << fused.to_string();
  }
  std::map<std::string, graph::HostArray> feeds;
  graph::HostArray a(g.type(x));
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = -4.0 + 0.6 * double(i);
  feeds["x"] = a;
  auto want = graph::interpret(g, feeds);
  auto got = graph::interpret(fused, feeds);
  ASSERT_TRUE(want.is_ok() && got.is_ok());
  for (const auto& [name, w] : *want)
    for (size_t i = 0; i < w.data.size(); ++i) ASSERT_NEAR(got->at(name).data[i], w.data[i], 1e-6) << name << i;
}

// NOTE [attention in pieces]: torch's math SDPA as it is exported (q and kT each scaled by sqrt(scale), a
// NOTE [bernoulli dropout]: torch's bernoulli mask x * (uniform < keep) / keep becomes dropout(x) with ratio
// 1 - keep and the draw's stream, its pieces left out: the identity for a negative seed (where the draws
// would be refused), about keep of the elements kept and scaled by 1 / keep otherwise. Draws used
// elsewhere stay draws.
TEST(Passes, BernoulliMaskBecomesDropout) {
  constexpr int64_t n = 20000;
  constexpr double keep = 0.75;
  for (bool other_use : {false, true}) {
    SCOPED_TRACE(other_use);
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {n});
    ValueId seed = b.input("seed", DType::i64, {1});
    ValueId draws = b.op1(OpKind::random_uniform, {b.broadcast(b.scalar(0.0f), {n}), seed},
                          {{"low", 0.0}, {"high", 1.0}, {"stream", int64_t(9)}});
    ValueId p = b.broadcast(b.scalar(float(keep)), {n});
    ValueId mask = b.cast(b.op1(OpKind::less, {draws, p}), DType::f32);
    b.output("y", b.mul(x, b.div(mask, p)));
    if (other_use) b.output("draws", draws);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    Graph fused = g;
    ASSERT_TRUE(simplify_exported_patterns(fused).is_ok());
    ASSERT_TRUE(graph::verify(fused).is_ok());
    int dropouts = 0, draw_nodes = 0;
    for (const graph::Node& node : fused.nodes()) {
      if (node.op == OpKind::dropout) {
        ++dropouts;
        EXPECT_DOUBLE_EQ(node.attrs.f("ratio"), 1.0 - keep);
        EXPECT_EQ(node.attrs.i("stream"), 9);
      }
      draw_nodes += node.op == OpKind::random_uniform;
    }
    EXPECT_EQ(dropouts, other_use ? 0 : 1);
    EXPECT_EQ(draw_nodes, other_use ? 1 : 0);
    if (other_use) continue;
    graph::HostArray xs(graph::TensorType{DType::f32, Shape{n}});
    for (int64_t i = 0; i < n; ++i) xs.data[size_t(i)] = 1.0 + double(i % 7);
    auto run = [&](double s) {
      graph::HostArray sd(graph::TensorType{DType::i64, Shape{1}}, {s});
      auto r = graph::interpret(fused, {{"x", xs}, {"seed", sd}});
      EXPECT_TRUE(r.is_ok()) << r.status().to_string();
      return r.is_ok() ? r->at("y").data : std::vector<double>{};
    };
    EXPECT_EQ(run(-1), xs.data);
    const std::vector<double> y = run(31);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = y[size_t(i)];
      if (v != 0.0) {
        ++kept;
        EXPECT_NEAR(v, xs.data[size_t(i)] / keep, 1e-6);
      }
    }
    EXPECT_NEAR(double(kept) / n, keep, 0.015);
  }
}

// causal mask of 0 / -inf added, softmax, the NaN guard, the product with v) becomes one attention op
// that means the same; without a mask it is mask "none"; a mask that is not causal stays in pieces.
TEST(Passes, AttentionInPiecesBecomesOneOp) {
  const int64_t B = 2, H = 3, T = 5, D = 4;
  for (const std::string kind : {"causal", "none", "other"}) {
    SCOPED_TRACE(kind);
    Graph g;
    Builder b(g);
    ValueId q = b.input("q", DType::f32, {B, H, T, D});
    ValueId k = b.input("k", DType::f32, {B, H, T, D});
    ValueId v = b.input("v", DType::f32, {B, H, T, D});
    const float root = std::sqrt(std::sqrt(1.0f / float(D)));
    ValueId qs = b.mul(q, b.broadcast(b.scalar(root), {B, H, T, D}));
    ValueId kt = b.mul(b.transpose(k, {0, 1, 3, 2}), b.broadcast(b.scalar(root), {B, H, D, T}));
    ValueId scores = b.op1(OpKind::matmul, {qs, kt});
    if (kind != "none") {
      Tensor mask(DType::f32, Shape{T, T});
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j)
          mask.data<float>()[i * T + j] = (kind == "causal" ? j > i : j == 0 && i == 3) ? -INFINITY : 0.0f;
      scores = b.add(scores, b.broadcast(b.constant(std::move(mask)), {B, H, T, T}));
    }
    ValueId p = b.op1(OpKind::softmax, {scores});
    ValueId guarded = b.where(b.op1(OpKind::is_nan, {p}), b.broadcast(b.scalar(0.0f), {B, H, T, T}), p);
    b.output("out", b.op1(OpKind::matmul, {guarded, v}));
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    Graph fused = g;
    ASSERT_TRUE(simplify_exported_patterns(fused).is_ok());
    ASSERT_TRUE(graph::verify(fused).is_ok());
    const graph::Node* att = nullptr;
    for (const graph::Node& n : fused.nodes())
      if (n.op == OpKind::attention) att = &n;
    if (kind == "other") {
      EXPECT_EQ(att, nullptr);
      continue;
    }
    ASSERT_NE(att, nullptr);
    EXPECT_EQ(att->attrs.s("mask"), kind);
    EXPECT_NEAR(att->attrs.f("scale"), 1.0 / std::sqrt(double(D)), 1e-6);
    std::map<std::string, graph::HostArray> feeds;
    uint64_t seed = 3;
    for (const char* name : {"q", "k", "v"}) {
      graph::HostArray a(graph::TensorType{DType::f32, Shape{B, H, T, D}});
      for (double& e : a.data) e = std::sin(double(++seed) * 0.71);
      feeds[name] = a;
    }
    auto want = graph::interpret(g, feeds);
    auto got = graph::interpret(fused, feeds);
    ASSERT_TRUE(want.is_ok() && got.is_ok());
    for (size_t i = 0; i < want->at("out").data.size(); ++i)
      ASSERT_NEAR(got->at("out").data[i], want->at("out").data[i], 1e-6) << i;
  }
}

// A deep elementwise chain with a checkpoint every 4 layers: recomputation
// keeps the meaning and shrinks the planned peak.
TEST(Passes, RecomputationKeepsMeaningAndSavesMemory) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {32, 64});
  ValueId w = b.parameter("w", DType::f32, {64});
  ValueId v = x;
  for (int i = 0; i < 12; ++i) {
    v = b.gelu(b.add(v, b.broadcast(w, {32, 64})));
    if (i % 4 == 3) b.checkpoint(v);
  }
  ValueId loss = b.reduce_sum(b.mul(v, v), {0, 1});
  b.output("loss", loss);
  ASSERT_TRUE(b.status().is_ok());
  std::vector<ValueId> wrt = {w, x};
  auto grads = graph::append_gradients(g, loss, wrt);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  g.add_output("dw", (*grads)[0]);
  g.add_output("dx", (*grads)[1]);

  CompileOptions keep{.opt_level = OptLevel::O1, .verify_each_pass = true};
  CompileOptions recompute = keep;
  recompute.recompute = true;
  auto a = compile(g, keep), r = compile(g, recompute);
  ASSERT_TRUE(a.is_ok() && r.is_ok()) << r.status().to_string();
  EXPECT_GT((*r)->graph.nodes().size(), (*a)->graph.nodes().size());  // the recomputed clones
  EXPECT_LT((*r)->plan.arena_bytes, (*a)->plan.arena_bytes * 3 / 4)
      << (*a)->plan.report((*a)->graph) << "\n" << (*r)->plan.report((*r)->graph);
  std::map<std::string, graph::HostArray> feeds;
  graph::HostArray xa(g.type(x)), wa(g.type(w));
  for (size_t i = 0; i < xa.data.size(); ++i) xa.data[i] = std::sin(0.1 * double(i));
  for (size_t i = 0; i < wa.data.size(); ++i) wa.data[i] = 0.01 * double(i % 7);
  feeds["x"] = xa;
  feeds["w"] = wa;
  auto want = graph::interpret((*a)->graph, feeds);
  auto got = graph::interpret((*r)->graph, feeds);
  ASSERT_TRUE(want.is_ok() && got.is_ok());
  for (const auto& [name, wv] : *want)
    for (size_t i = 0; i < wv.data.size(); ++i) ASSERT_EQ(got->at(name).data[i], wv.data[i]) << name;
}

// Eight branches built first and summed afterwards: in build order all eight
// are live at once; the depth-first schedule computes each just before its add.
TEST(Passes, MemoryScheduleLowersThePeakAndKeepsTheMeaning) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {64, 64});
  std::vector<ValueId> branches;
  for (int i = 0; i < 8; ++i) branches.push_back(b.exp(b.scale(x, 0.01 * (i + 1))));
  ValueId y = branches[0];
  for (int i = 1; i < 8; ++i) y = b.add(y, branches[size_t(i)]);
  b.output("y", y);
  ASSERT_TRUE(b.status().is_ok());
  auto o1 = compile(g, {.opt_level = OptLevel::O1, .verify_each_pass = true});
  auto o2 = compile(g, {.opt_level = OptLevel::O2, .verify_each_pass = true});
  ASSERT_TRUE(o1.is_ok() && o2.is_ok()) << o2.status().to_string();
  EXPECT_LE((*o2)->plan.arena_bytes * 2, (*o1)->plan.arena_bytes)
      << (*o1)->plan.report((*o1)->graph) << "\n" << (*o2)->plan.report((*o2)->graph);
  graph::HostArray xa(g.type(x));
  for (size_t i = 0; i < xa.data.size(); ++i) xa.data[i] = std::cos(0.01 * double(i));
  auto want = graph::interpret((*o1)->graph, {{"x", xa}});
  auto got = graph::interpret((*o2)->graph, {{"x", xa}});
  ASSERT_TRUE(want.is_ok() && got.is_ok());
  EXPECT_EQ(got->at("y").data, want->at("y").data);
}

TEST(Compile, RejectsInvalidGraphsNamingTheNode) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2});
  ValueId y = b.neg(x);
  g.mutable_node(1).inputs[0] = y;
  auto exe = compile(g);
  ASSERT_FALSE(exe.is_ok());
  EXPECT_EQ(exe.status().subject().rfind("compile: node 1 (neg)", 0), 0u) << exe.status().message();
}

}  // namespace
}  // namespace aspen::compiler
