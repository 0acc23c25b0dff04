// Tests of the fast kernels bound by OpInfo::prepare (graph/ops_nn.cc, ops_shape.cc, ops_reduce.cc):
// each op's kernel, prepared for one node's exact types, must reproduce the reference interpreter with
// outputs rounded to their dtype. Odd shapes throughout, so no dimension hides another.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "core/tensor.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "kernels/matmul.h"

namespace aspen::graph {
namespace {

using testing::random_feeds;
using Feeds = std::map<std::string, HostArray>;

// max_i |fast_i - ref_i| / max_i |ref_i|: the error relative to the output's scale (an elementwise
// relative error is meaningless at the zeros a product or a gradient crosses). Equal infinities (the lse
// of a fully masked query) count as exact; a NaN anywhere in the fast output fails.
double max_rel_error(const HostArray& fast, const HostArray& ref) {
  double scale = 0, err = 0;
  for (double v : ref.data)
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < ref.data.size(); ++i) {
    const double a = fast.data[i], b = ref.data[i];
    if (a == b) continue;
    if (std::isnan(a) || !std::isfinite(b)) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(a - b));
  }
  return scale > 0 ? err / scale : err;
}

// The node of interest is g's last node. Prepares its fast kernel for its exact types, runs it on buffers
// holding the reference interpreter's (rounded) values of its inputs, and compares every output with the
// reference's. Output buffers start as NaN so that an element never written fails.
void expect_fast_matches(const Graph& g, const Feeds& feeds, double tol = 1e-5) {
  const Node& n = g.nodes().back();
  SCOPED_TRACE(std::string("op ") + op_name(n.op));
  auto all = interpret_all(g, feeds, {.round_to_dtype = true});
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  std::vector<TensorType> in_types, out_types;
  std::vector<Tensor> ins, outs;
  for (ValueId v : n.inputs) {
    in_types.push_back(g.type(v));
    ins.push_back((*all)[size_t(v.index)].to_tensor());
  }
  for (ValueId v : n.outputs) {
    out_types.push_back(g.type(v));
    Tensor t(g.type(v).dtype, g.type(v).shape);
    if (t.dtype() == DType::f32)
      for (float& x : t.span<float>()) x = std::numeric_limits<float>::quiet_NaN();
    outs.push_back(std::move(t));
  }
  auto kernel = op_info(n.op).prepare(n, in_types, out_types);
  ASSERT_TRUE(kernel.is_ok()) << kernel.status().to_string();
  ASSERT_TRUE(*kernel != nullptr) << "no fast kernel";
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (const Tensor& t : ins) in_ptrs.push_back(t.raw());
  for (Tensor& t : outs) out_ptrs.push_back(t.raw());
  // Twice: a kernel runs many times, and scratch it keeps must not leak state between runs.
  for (int rep = 0; rep < 2; ++rep) {
    Status s = (*kernel)->run(in_ptrs, out_ptrs);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    const HostArray& ref = (*all)[size_t(n.outputs[k].index)];
    EXPECT_LE(max_rel_error(HostArray::from_tensor(outs[k]), ref), tol)
        << "output " << k << " " << ref.type.to_string();
  }
}

void expect_fast_matches(const Graph& g, uint64_t seed = 1, double tol = 1e-5) {
  expect_fast_matches(g, random_feeds(g, seed), tol);
}

Shape shape(std::vector<int64_t> d) { return *Shape::make(d.data(), int(d.size())); }

// ---- matmul -----------------------------------------------------------------------

TEST(FastKernels, MatmulTransposesBatchesAndBias) {
  constexpr int64_t M = 3, K = 5, N = 7;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int batching = 0; batching < 3; ++batching) {  // 0: none, 1: batched b, 2: b shared by the batch
        SCOPED_TRACE("ta " + std::to_string(ta) + " tb " + std::to_string(tb) + " batching " +
                     std::to_string(batching));
        std::vector<int64_t> batch = batching ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{};
        std::vector<int64_t> as = batch, bs = batching == 1 ? batch : std::vector<int64_t>{};
        as.push_back(ta ? K : M);
        as.push_back(ta ? M : K);
        bs.push_back(tb ? N : K);
        bs.push_back(tb ? K : N);
        Graph g;
        Builder b(g);
        std::vector<ValueId> in{b.input("a", DType::f32, shape(as)), b.input("b", DType::f32, shape(bs))};
        if (ta != tb) in.push_back(b.input("bias", DType::f32, Shape{N}));  // half the cases with bias
        b.op(OpKind::matmul, in, {{"trans_a", int64_t(ta)}, {"trans_b", int64_t(tb)}});
        ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
        expect_fast_matches(g);
      }
}

// NOTE [matmul backends]: products big enough for the OpenBLAS backend (N >= 2048, 256+ rows once the
// batch folds, no b^T) run it through the same prepared kernel; the rest of the fast path is oneDNN's.
TEST(FastKernels, MatmulLargeF32OnOpenBlas) {
  constexpr int64_t K = 33, N = 2100;
  for (bool ta : {false, true}) {
    SCOPED_TRACE("ta " + std::to_string(ta));
    Graph g;
    Builder b(g);
    // No trans_a: a [2, 130, K] with b shared folds into 260 rows; trans_a: a [K, 300].
    ValueId a = b.input("a", DType::f32, ta ? Shape{K, 300} : Shape{2, 130, K});
    std::vector<ValueId> in{a, b.input("b", DType::f32, Shape{K, N}), b.input("bias", DType::f32, Shape{N})};
    b.op(OpKind::matmul, in, {{"trans_a", int64_t(ta)}});
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    const kernels::MatmulShape s = ta ? kernels::MatmulShape{.M = 300, .N = N, .K = K, .trans_a = true, .has_bias = true}
                                      : kernels::MatmulShape{.batch = 2, .M = 130, .N = N, .K = K,
                                                             .broadcast_b = true, .has_bias = true};
    if (kernels::openblas_is_openmp_build()) {
      EXPECT_EQ(kernels::matmul_backend_for(s, omp_get_max_threads()), kernels::MatmulBackend::openblas);
    }
    expect_fast_matches(g);
  }
}

// NOTE [gemv route]: decode-shaped matmuls (a few rows, shared weights, f32 or bf16 b) run the GEMV
// kernel; more rows (and the mixed case's fallback: b widened, the f32 plan) run oneDNN.
TEST(FastKernels, MatmulDecodeShapesAndBf16Weights) {
  constexpr int64_t K = 37, N = 19;
  const std::vector<std::vector<int64_t>> a_shapes = {{1, K}, {5, K}, {2, 4, K}, {9, K}, {3, 3, K}};
  for (DType wt : {DType::f32, DType::bf16})
    for (bool tb : {false, true})
      for (const auto& as : a_shapes)
        for (bool bias : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(wt)) + " tb " + std::to_string(tb) + " rows " +
                       std::to_string(shape(as).numel() / K) + " bias " + std::to_string(bias));
          Graph g;
          Builder b(g);
          std::vector<ValueId> in{b.input("a", DType::f32, shape(as)),
                                  b.input("b", wt, tb ? Shape{N, K} : Shape{K, N})};
          if (bias) in.push_back(b.input("bias", DType::f32, Shape{N}));
          ValueId y = b.op1(OpKind::matmul, in, {{"trans_b", int64_t(tb)}});
          ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
          EXPECT_EQ(g.type(y).dtype, DType::f32);
          expect_fast_matches(g);
        }
}

TEST(FastKernels, MixedMatmulRules) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, Shape{2, 4});
  ValueId w = b.input("w", DType::bf16, Shape{4, 3});
  b.op1(OpKind::matmul, {x, w}, {{"out_dtype", int64_t(DType::f32)}});  // out_dtype wants bf16 a
  EXPECT_FALSE(b.status().is_ok());
  Graph g2;
  Builder b2(g2);
  b2.op1(OpKind::matmul, {b2.input("x", DType::bf16, Shape{2, 4}), b2.input("w", DType::f32, Shape{4, 3})});
  EXPECT_FALSE(b2.status().is_ok());  // only a f32 with b bf16 mixes
  EXPECT_NE(b2.status().message().find("a's"), std::string::npos) << b2.status().message();
}

// ---- norms, softmax, cross-entropy -------------------------------------------------------

TEST(FastKernels, LayerNormForwardAndBackward) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, Shape{2, 3, 13});
  ValueId gamma = b.input("gamma", DType::f32, Shape{13}), beta = b.input("beta", DType::f32, Shape{13});
  std::vector<ValueId> y = b.op(OpKind::layernorm, {x, gamma, beta}, {{"eps", 1e-5}});
  ASSERT_EQ(y.size(), 3u);
  Graph fwd = g;
  expect_fast_matches(fwd);
  b.op(OpKind::layernorm_grad, {x, gamma, y[1], y[2], b.input("g", DType::f32, Shape{2, 3, 13})});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  expect_fast_matches(g);
}

TEST(FastKernels, RmsNormForwardAndBackward) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, Shape{5, 11});
  ValueId gamma = b.input("gamma", DType::f32, Shape{11});
  std::vector<ValueId> y = b.op(OpKind::rmsnorm, {x, gamma}, {{"eps", 1e-6}});
  ASSERT_EQ(y.size(), 2u);
  Graph fwd = g;
  expect_fast_matches(fwd);
  b.op(OpKind::rmsnorm_grad, {x, gamma, y[1], b.input("g", DType::f32, Shape{5, 11})});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  expect_fast_matches(g);
}

// Softmax's fast exp is a few f32 ulps from the C library's; 1e-5 of the output's scale holds with margin
// (about 2.5e-7 measured), so no looser tolerance is needed here, for cross-entropy or for attention.
TEST(FastKernels, SoftmaxForwardAndBackward) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, Shape{3, 5, 11});
  ValueId y = b.op1(OpKind::softmax, {x});
  Graph fwd = g;
  expect_fast_matches(fwd, random_feeds(fwd, 2, -4.0, 4.0));
  b.op1(OpKind::softmax_grad, {y, b.input("g", DType::f32, Shape{3, 5, 11})});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  expect_fast_matches(g, random_feeds(g, 2, -4.0, 4.0));
}

// i32 targets reach the kernel as they are; i64 ones through the kernel's scratch. Row 1 is ignored.
TEST(FastKernels, CrossEntropyForwardAndBackward) {
  for (DType tdt : {DType::i32, DType::i64}) {
    SCOPED_TRACE(std::string("targets ") + std::string(dtype_name(tdt)));
    Graph g;
    Builder b(g);
    ValueId logits = b.input("logits", DType::f32, Shape{5, 7});
    ValueId targets = b.input("targets", tdt, Shape{5});
    std::vector<ValueId> y = b.op(OpKind::cross_entropy, {logits, targets});
    ASSERT_EQ(y.size(), 3u);
    Graph fwd = g;
    Feeds feeds = random_feeds(fwd, 3, -3.0, 3.0, 7);
    feeds["targets"].data[1] = -100;
    expect_fast_matches(fwd, feeds);
    b.op1(OpKind::cross_entropy_grad, {logits, targets, y[2], b.input("g", DType::f32, Shape{})});
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    feeds = random_feeds(g, 3, -3.0, 3.0, 7);
    feeds["targets"].data[1] = -100;
    expect_fast_matches(g, feeds);
  }
}

TEST(FastKernels, CrossEntropyTargetOutOfRangeIsAnError) {
  Graph g;
  Builder b(g);
  b.op(OpKind::cross_entropy, {b.input("logits", DType::f32, Shape{2, 3}), b.input("targets", DType::i64, Shape{2})});
  const Node& n = g.nodes().back();
  std::vector<TensorType> in{g.type(n.inputs[0]), g.type(n.inputs[1])}, out;
  for (ValueId v : n.outputs) out.push_back(g.type(v));
  auto k = op_info(n.op).prepare(n, in, out);
  ASSERT_TRUE(k.is_ok() && *k);
  std::vector<float> logits(6, 0.5f), loss(2), lse(2), mean(1);
  std::vector<int64_t> targets{1, int64_t(1) << 33};  // would wrap to 0 if narrowed blindly
  std::vector<const void*> ins{logits.data(), targets.data()};
  std::vector<void*> outs{mean.data(), loss.data(), lse.data()};
  Status s = (*k)->run(ins, outs);
  EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
}

// ---- rotary, attention ---------------------------------------------------------------------

TEST(FastKernels, RotaryForwardAndInverse) {
  struct Case {
    const char* layout;
    int64_t rotary_dim, inverse;
  };
  for (const Case& c : {Case{"interleaved", 6, 0}, Case{"half_split", 8, 1}, Case{"half_split", 4, 0}}) {
    SCOPED_TRACE(std::string(c.layout) + " inverse " + std::to_string(c.inverse));
    Graph g;
    Builder b(g);
    b.op1(OpKind::rotary, {b.input("x", DType::f32, Shape{2, 3, 5, 8}), b.input("pos", DType::i32, Shape{2, 3})},
          {{"rotary_dim", c.rotary_dim}, {"layout", std::string(c.layout)}, {"inverse", c.inverse}});
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    expect_fast_matches(g, random_feeds(g, 4, -1.0, 1.0, 37));
  }
}

// Builds attention(q, k, v[, key_valid]) and, with grad, attention_grad after it (so that out and lse are
// the forward's, as the fast backward requires).
Graph attention_graph(int64_t T, int64_t S, const std::string& mask, int64_t kv_offset, int64_t window, DType key_valid,
                      bool grad) {
  constexpr int64_t B = 2, H = 3, D = 9;
  Graph g;
  Builder b(g);
  ValueId q = b.input("q", DType::f32, Shape{B, H, T, D});
  ValueId k = b.input("k", DType::f32, Shape{B, H, S, D}), v = b.input("v", DType::f32, Shape{B, H, S, D});
  std::vector<ValueId> in{q, k, v};
  if (key_valid != DType::f32) in.push_back(b.input("key_valid", key_valid, Shape{B, S}));
  Attrs a{{"scale", 1.0 / std::sqrt(double(D))}, {"mask", mask}, {"kv_offset", kv_offset}};
  if (window) a.set("window", window);
  std::vector<ValueId> y = b.op(OpKind::attention, in, a);
  if (grad && y.size() == 2) {
    std::vector<ValueId> gin{q, k, v, y[0], y[1], b.input("g", DType::f32, Shape{B, H, T, D})};
    if (key_valid != DType::f32) gin.push_back(in[3]);
    b.op(OpKind::attention_grad, gin, a);
  }
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return g;
}

// FlashAttention's online softmax rounds differently from the materialized f64 reference, but at these
// sizes the error stays near 3e-7 of the output's scale (measured), so the common 1e-5 holds. Batch 0
// has no valid key (out 0, lse -inf, zero gradients) whenever key_valid is given.
TEST(FastKernels, AttentionMasksForwardAndBackward) {
  struct Case {
    int64_t T, S;
    const char* mask;
    int64_t kv_offset, window;
    DType key_valid;  // f32: none
  };
  const Case cases[] = {{5, 5, "none", 0, 0, DType::f32},  {3, 7, "causal", 4, 0, DType::f32},
                        {6, 6, "causal", 0, 0, DType::u8}, {4, 9, "causal", 5, 0, DType::boolean},
                        {7, 7, "local", 0, 3, DType::f32}, {5, 5, "none", 0, 0, DType::boolean}};
  for (const Case& c : cases)
    for (bool grad : {false, true}) {
      SCOPED_TRACE(std::string(c.mask) + " T " + std::to_string(c.T) + " S " + std::to_string(c.S) + " key_valid " +
                   std::string(dtype_name(c.key_valid)) + (grad ? " backward" : " forward"));
      Graph g = attention_graph(c.T, c.S, c.mask, c.kv_offset, c.window, c.key_valid, grad);
      Feeds feeds = random_feeds(g, 5, -1.0, 1.0, 2);  // key_valid flags 0 or 1
      if (c.key_valid != DType::f32) {
        std::vector<double>& kv = feeds["key_valid"].data;
        for (size_t j = 0; j < size_t(c.S); ++j) kv[j] = 0;  // batch 0: no valid key (out 0, lse -inf)
        kv[size_t(c.S)] = 1;                                 // batch 1: key 0 valid, so every causal row has one
      }
      expect_fast_matches(g, feeds);
    }
}

// ---- elementwise ops --------------------------------------------------------------------------

TEST(FastKernels, TanhSqrtDivAndMaskCast) {
  {
    Graph g;
    Builder b(g);
    b.op1(OpKind::exp, {b.input("x", DType::f32, Shape{3, 5, 7})});
    expect_fast_matches(g, random_feeds(g, 7, -30.0, 30.0));
  }
  {
    Graph g;
    Builder b(g);
    b.op1(OpKind::sub, {b.input("a", DType::f32, Shape{5, 7}), b.input("b", DType::f32, Shape{5, 7})});
    expect_fast_matches(g, random_feeds(g, 12));
  }
  for (DType c : {DType::u8, DType::boolean}) {
    Graph g;
    Builder b(g);
    b.op1(OpKind::where,
          {b.input("c", c, Shape{4, 9}), b.input("a", DType::f32, Shape{4, 9}), b.input("b", DType::f32, Shape{4, 9})});
    expect_fast_matches(g, random_feeds(g, 13, -2.0, 2.0, c == DType::u8 ? 6 : 2));  // u8: any byte is a truth
  }
  {
    Graph g;
    Builder b(g);
    b.tanh(b.input("x", DType::f32, Shape{3, 5, 7}));
    expect_fast_matches(g, random_feeds(g, 8, -4.0, 4.0));
  }
  {
    Graph g;
    Builder b(g);
    b.sqrt(b.input("x", DType::f32, Shape{3, 5, 7}));
    expect_fast_matches(g, random_feeds(g, 9, 0.0, 9.0));
  }
  {
    Graph g;
    Builder b(g);
    b.div(b.input("a", DType::f32, Shape{5, 7}), b.input("b", DType::f32, Shape{5, 7}));
    Feeds feeds = random_feeds(g, 10);
    feeds.at("b") = random_feeds(g, 11, 0.5, 3.0).at("b");
    expect_fast_matches(g, feeds);
  }
  for (DType from : {DType::u8, DType::boolean}) {
    Graph g;
    Builder b(g);
    b.cast(b.input("m", from, Shape{3, 7}), DType::f32);
    expect_fast_matches(g, random_feeds(g, 12, 0.0, 1.0, 2));
  }
}

// ---- shape ops ---------------------------------------------------------------------------------

TEST(FastKernels, ReshapeTransposeSliceConcat) {
  {
    Graph g;
    Builder b(g);
    b.reshape(b.input("x", DType::f32, Shape{2, 3, 5}), {5, 6});
    expect_fast_matches(g);
  }
  for (std::vector<int64_t> perm : {std::vector<int64_t>{2, 0, 1}, {0, 2, 1}, {1, 0, 2}, {2, 1, 0}}) {
    Graph g;
    Builder b(g);
    b.transpose(b.input("x", DType::f32, Shape{2, 3, 5}), perm);
    expect_fast_matches(g);
  }
  {
    Graph g;
    Builder b(g);
    b.transpose(b.input("x", DType::f32, Shape{2, 3, 5, 7}), {0, 2, 1, 3});
    expect_fast_matches(g);
  }
  {  // large enough for the parallel path
    Graph g;
    Builder b(g);
    b.transpose(b.input("x", DType::f32, Shape{2, 130, 131}), {0, 2, 1});
    expect_fast_matches(g);
  }
  for (int64_t axis : {0, 1, -1}) {
    Graph g;
    Builder b(g);
    b.slice(b.input("x", DType::f32, Shape{3, 5, 7}), axis, 1, 3);
    expect_fast_matches(g);
  }
  for (int64_t axis : {0, 1, 2}) {
    Graph g;
    Builder b(g);
    std::vector<int64_t> d0{2, 3, 5}, d1 = d0, d2 = d0;
    d0[size_t(axis)] = 1;
    d1[size_t(axis)] = 4;
    d2[size_t(axis)] = 2;
    b.concat({b.input("x0", DType::f32, shape(d0)), b.input("x1", DType::f32, shape(d1)),
              b.input("x2", DType::f32, shape(d2))},
             axis);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    expect_fast_matches(g);
  }
}

TEST(FastKernels, Broadcast) {
  const std::pair<std::vector<int64_t>, std::vector<int64_t>> cases[] = {
      {{3, 1}, {2, 3, 5}},    {{5}, {2, 3, 5}},      {{}, {4, 3}}, {{2, 1, 5}, {2, 3, 5}},
      {{1, 3, 1}, {2, 3, 4}}, {{131}, {3, 100, 131}}};  // the last one large enough for the parallel path
  for (const auto& [from, to] : cases) {
    Graph g;
    Builder b(g);
    b.broadcast(b.input("x", DType::f32, shape(from)), to);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    expect_fast_matches(g);
  }
}

TEST(FastKernels, ReduceSumAndMax) {
  for (OpKind op : {OpKind::reduce_sum, OpKind::reduce_max}) {
    auto reduce = [op](Builder& b, ValueId x, std::vector<int64_t> axes, bool keepdims) {
      return op == OpKind::reduce_sum ? b.reduce_sum(x, std::move(axes), keepdims)
                                      : b.reduce_max(x, std::move(axes), keepdims);
    };
    const std::pair<std::vector<int64_t>, bool> cases[] = {{{0, 2}, false}, {{0, 2}, true},        {{3}, false},
                                                           {{1, 3}, false}, {{0, 1, 2, 3}, false}, {{0}, false},
                                                           {{}, false}};
    for (const auto& [axes, keepdims] : cases) {
      Graph g;
      Builder b(g);
      reduce(b, b.input("x", DType::f32, Shape{3, 4, 5, 7}), axes, keepdims);
      ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
      expect_fast_matches(g);
    }
    {  // a dimension of extent 1 between reduced ones, and a large input (the parallel path)
      Graph g;
      Builder b(g);
      reduce(b, b.input("x", DType::f32, Shape{67, 1, 9, 131}), {0, 1}, false);
      expect_fast_matches(g);
    }
    {  // an empty reduced axis: zeros (sum), -inf (max)
      Graph g;
      Builder b(g);
      reduce(b, b.input("x", DType::f32, Shape{3, 0, 2}), {1}, false);
      expect_fast_matches(g);
    }
  }
}

// ---- gather -------------------------------------------------------------------------------------

TEST(FastKernels, GatherAndGatherGrad) {
  for (DType ids : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(ids));
    {
      Graph g;
      Builder b(g);
      b.gather(b.input("table", DType::f32, Shape{7, 5}), b.input("ids", ids, Shape{2, 3}));
      ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
      expect_fast_matches(g, random_feeds(g, 6, -1.0, 1.0, 7));
    }
    {  // ids drawn from [0, 4) of a vocabulary of 7: repeated ids sum, unused rows are zero
      Graph g;
      Builder b(g);
      b.op1(OpKind::gather_grad, {b.input("ids", ids, Shape{3, 4}), b.input("g", DType::f32, Shape{3, 4, 5})},
            {{"vocab", int64_t(7)}});
      ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
      expect_fast_matches(g, random_feeds(g, 7, -1.0, 1.0, 4));
    }
  }
}

// A shard's rows [offset, offset + 7) of a vocabulary of 21: ids drawn from [0, 21), so most fall
// outside (zero rows; no gradient), and repeated ids inside sum.
TEST(FastKernels, ShardGatherAndGatherGrad) {
  for (DType ids : {DType::i32, DType::i64})
    for (double offset : {0.0, 7.0, 14.0}) {
      SCOPED_TRACE(std::string(dtype_name(ids)) + " offset " + std::to_string(offset));
      {
        Graph g;
        Builder b(g);
        b.op1(OpKind::gather, {b.input("table", DType::f32, Shape{7, 5}), b.input("ids", ids, Shape{3, 5}),
                               b.input("offset", ids, Shape{})},
              {{"vocab", int64_t(21)}});
        ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
        Feeds f = random_feeds(g, 6, -1.0, 1.0, 21);
        f["offset"].data = {offset};
        expect_fast_matches(g, f);
      }
      {
        Graph g;
        Builder b(g);
        b.op1(OpKind::gather_grad,
              {b.input("ids", ids, Shape{4, 5}), b.input("g", DType::f32, Shape{4, 5, 3}), b.input("offset", ids, Shape{})},
              {{"vocab", int64_t(7)}});
        ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
        Feeds f = random_feeds(g, 7, -1.0, 1.0, 21);
        f["offset"].data = {offset};
        expect_fast_matches(g, f);
      }
    }
}

// The vocab-parallel cross-entropy's pieces (ops_vocab.cc), one shard of 3 (offset 11 of 33 classes),
// odd shapes, ignored rows, i32 and i64 targets.
TEST(FastKernels, VocabCrossEntropyPieces) {
  for (DType tdt : {DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(tdt));
    const int64_t R = 9, Vl = 11;
    const Attrs a = {{"group_size", int64_t(3)}};
    auto feeds_for = [&](const Graph& g) {
      Feeds f = random_feeds(g, 5, -3.0, 3.0, 33);
      f["offset"].data = {11.0};
      f["targets"].data[2] = -100;
      for (const char* stat : {"M", "S", "Zt"})
        if (f.count(stat))
          for (double& v : f[stat].data) v = std::fabs(v) + 3.0;  // a maximum above z, positive sums
      if (f.count("g")) f["g"].data = {0.75};
      return f;
    };
    auto inputs = [&](Builder& b) {
      return std::vector<ValueId>{b.input("z", DType::f32, Shape{R, Vl}), b.input("targets", tdt, Shape{R}),
                                  b.input("offset", tdt, Shape{}), b.input("M", DType::f32, Shape{R})};
    };
    {
      Graph g;
      Builder b(g);
      b.op(OpKind::vocab_ce_stats, inputs(b), a);
      ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
      expect_fast_matches(g, feeds_for(g));
    }
    for (OpKind op : {OpKind::vocab_ce_loss, OpKind::vocab_ce_grad}) {
      Graph g;
      Builder b(g);
      std::vector<ValueId> in = inputs(b);
      in.push_back(b.input("S", DType::f32, Shape{R}));
      in.push_back(op == OpKind::vocab_ce_loss ? b.input("Zt", DType::f32, Shape{R}) : b.input("g", DType::f32, Shape{}));
      b.op(op, in, a);
      ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
      expect_fast_matches(g, feeds_for(g));
    }
  }
}

TEST(FastKernels, GatherIdOutOfRangeIsAnError) {
  Graph g;
  Builder b(g);
  b.gather(b.input("table", DType::f32, Shape{3, 2}), b.input("ids", DType::i64, Shape{2}));
  const Node& n = g.nodes().back();
  std::vector<TensorType> in{g.type(n.inputs[0]), g.type(n.inputs[1])}, out{g.type(n.outputs[0])};
  auto k = op_info(n.op).prepare(n, in, out);
  ASSERT_TRUE(k.is_ok() && *k);
  std::vector<float> table(6, 1.0f), y(4);
  std::vector<int64_t> ids{2, (int64_t(1) << 32) + 1};  // would wrap to 1 if narrowed blindly
  std::vector<const void*> ins{table.data(), ids.data()};
  std::vector<void*> outs{y.data()};
  Status s = (*k)->run(ins, outs);
  EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
}

// The shard form with the whole vocabulary given checks ids against it.
TEST(FastKernels, ShardGatherIdOutsideTheVocabularyIsAnError) {
  Graph g;
  Builder b(g);
  b.op1(OpKind::gather, {b.input("table", DType::f32, Shape{3, 2}), b.input("ids", DType::i32, Shape{2}),
                         b.input("offset", DType::i32, Shape{})},
        {{"vocab", int64_t(6)}});
  const Node& n = g.nodes().back();
  std::vector<TensorType> in{g.type(n.inputs[0]), g.type(n.inputs[1]), g.type(n.inputs[2])}, out{g.type(n.outputs[0])};
  auto k = op_info(n.op).prepare(n, in, out);
  ASSERT_TRUE(k.is_ok() && *k);
  std::vector<float> table(6, 1.0f), y(4);
  std::vector<int32_t> ids{2, 6}, offset{3};
  std::vector<const void*> ins{table.data(), ids.data(), offset.data()};
  std::vector<void*> outs{y.data()};
  Status s = (*k)->run(ins, outs);
  EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
  EXPECT_NE(s.message().find("ids[1] = 6"), std::string::npos) << s.message();
}

// ---- fallback -----------------------------------------------------------------------------------

// A bf16 node without a fast kernel gets a null one (not an error): lowering
// then runs the reference. (bf16 matmuls have one: the bf16 plan, result
// rounded; runtime/session_test.cc checks it.)
TEST(FastKernels, Bf16FallsBackToTheReference) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::bf16, Shape{3, 4});
  ValueId w = b.input("w", DType::bf16, Shape{4, 5});
  b.op(OpKind::matmul, {x, w});
  b.op(OpKind::layernorm, {x, b.input("gamma", DType::bf16, Shape{4}), b.input("beta", DType::bf16, Shape{4})},
       {{"eps", 1e-5}});
  b.transpose(x, {1, 0});
  b.reduce_sum(x, {0});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  int checked = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::input) continue;
    std::vector<TensorType> in, out;
    if (n.op == OpKind::matmul) {
      for (ValueId v : n.inputs) in.push_back(g.type(v));
      for (ValueId v : n.outputs) out.push_back(g.type(v));
      auto k = op_info(n.op).prepare(n, in, out);
      ASSERT_TRUE(k.is_ok() && *k != nullptr);
      continue;
    }
    for (ValueId v : n.inputs) in.push_back(g.type(v));
    for (ValueId v : n.outputs) out.push_back(g.type(v));
    ASSERT_NE(op_info(n.op).prepare, nullptr) << op_name(n.op);
    auto k = op_info(n.op).prepare(n, in, out);
    ASSERT_TRUE(k.is_ok()) << k.status().to_string();
    EXPECT_TRUE(*k == nullptr) << op_name(n.op);
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

}  // namespace
}  // namespace aspen::graph

namespace aspen::graph {
namespace {

// write_slice: the fast kernel (copying or in place) equals the reference;
// a bad run-time index is a Status from both.
TEST(FastKernels, WriteSliceMatchesReference) {
  for (int64_t axis : {0, 1, 2}) {
    Graph g;
    Builder b(g);
    const std::vector<int64_t> dst_dims = {3, 7, 5};
    std::vector<int64_t> src_dims = dst_dims;
    src_dims[size_t(axis)] = 2;
    ValueId dst = b.input("dst", DType::f32, *Shape::make(dst_dims.data(), 3));
    ValueId src = b.input("src", DType::f32, *Shape::make(src_dims.data(), 3));
    ValueId idx = b.input("index", DType::i32, Shape{});
    b.output("y", b.op1(OpKind::write_slice, {dst, src, idx}, {{"axis", axis}}));
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    const Node& n = g.node(3);
    std::vector<TensorType> in = {g.type(dst), g.type(src), g.type(idx)}, out = {g.type(n.outputs[0])};
    auto k = op_info(OpKind::write_slice).prepare(n, in, out);
    ASSERT_TRUE(k.is_ok() && *k);
    for (int32_t index : {0, 1, int32_t(dst_dims[size_t(axis)] - 2), int32_t(dst_dims[size_t(axis)] - 1), -1}) {
      HostArray hd(in[0]), hs(in[1]), hi(in[2]);
      for (size_t i = 0; i < hd.data.size(); ++i) hd.data[i] = double(i);
      for (size_t i = 0; i < hs.data.size(); ++i) hs.data[i] = -1.0 - double(i);
      hi.data[0] = index;
      std::vector<HostArray> want = {HostArray(out[0])};
      const std::vector<const HostArray*> ptrs = {&hd, &hs, &hi};
      Status ref = op_info(OpKind::write_slice).eval(n, ptrs, want);
      Tensor td = hd.to_tensor(), ts = hs.to_tensor(), ti = hi.to_tensor(), ty(DType::f32, out[0].shape);
      for (bool in_place : {false, true}) {
        Tensor tdc = td.clone();
        const void* ins[] = {tdc.raw(), ts.raw(), ti.raw()};
        void* outs[] = {in_place ? tdc.raw() : ty.raw()};
        Status fast = (*k)->run(ins, outs);
        ASSERT_EQ(fast.is_ok(), ref.is_ok()) << fast.to_string();
        if (!ref.is_ok()) {
          EXPECT_EQ(fast.message(), ref.message());
          EXPECT_EQ(fast.message(), "write_slice: index: expected in [0, " +
                                        std::to_string(dst_dims[size_t(axis)] - 2) + "], found " +
                                        std::to_string(index));
          continue;
        }
        const float* y = static_cast<const float*>(outs[0]);
        for (size_t i = 0; i < want[0].data.size(); ++i) ASSERT_EQ(y[i], want[0].data[i]) << axis << " " << index;
      }
    }
  }
}

TEST(FastKernels, AddOnI32) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::i32, Shape{5});
  b.output("y", b.add(x, x));
  const Node& n = g.node(1);
  std::vector<TensorType> t = {g.type(x), g.type(x)}, o = {g.type(x)};
  auto k = op_info(OpKind::add).prepare(n, t, o);
  ASSERT_TRUE(k.is_ok() && *k);
  int32_t a[5] = {1, -2, 3, 1 << 29, -7}, y[5] = {};
  const void* ins[] = {a, a};
  void* outs[] = {y};
  ASSERT_TRUE((*k)->run(ins, outs).is_ok());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(y[i], 2 * a[i]);
}

}  // namespace
}  // namespace aspen::graph
