// Tests of the fast kernels bound by OpInfo::prepare. The sweep runs every op with a fast kernel over the
// samples its table entry lists (OpInfo::samples, graph/op_sample.h): each sample's kernel, prepared for its
// node's exact types, must reproduce the reference interpreter with outputs rounded to their dtype, or,
// where the sample says its types have none, prepare must return no kernel. The tests after the sweep
// cover what samples cannot say: run-time errors, the in-place form, backend routing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/philox.h"
#include "core/tensor.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/op_sample.h"
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

// Fills output buffers so that an element never written fails: NaN for floats, 0xA5 bytes otherwise.
void poison(Tensor& t) {
  if (t.dtype() == DType::f32) {
    for (float& x : t.span<float>()) x = std::numeric_limits<float>::quiet_NaN();
  } else if (t.dtype() == DType::bf16 || t.dtype() == DType::f16) {
    const uint16_t nan = t.dtype() == DType::bf16 ? 0x7FC0 : 0x7E00;
    uint16_t* p = static_cast<uint16_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = nan;
  } else if (t.nbytes() > 0) {
    std::memset(t.raw(), 0xA5, size_t(t.nbytes()));
  }
}

// The node of interest is g's last node. Prepares its fast kernel for its exact types, runs it on buffers
// holding the reference interpreter's (rounded) values of its inputs, and compares every output with the
// reference's. With fast false, checks instead that prepare gives no kernel (the reference runs).
void expect_fast_matches(const Graph& g, const Feeds& feeds, double tol = 1e-5, bool fast = true) {
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
    poison(t);
    outs.push_back(std::move(t));
  }
  auto kernel = op_info(n.op).prepare(n, in_types, out_types);
  ASSERT_TRUE(kernel.is_ok()) << kernel.status().to_string();
  if (!fast) {
    EXPECT_TRUE(*kernel == nullptr) << "a fast kernel where the sample expects the reference";
    return;
  }
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
  const auto expect_outputs_match = [&] {
    for (size_t k = 0; k < outs.size(); ++k) {
      const HostArray& ref = (*all)[size_t(n.outputs[k].index)];
      EXPECT_LE(max_rel_error(HostArray::from_tensor(outs[k]), ref), tol)
          << "output " << k << " " << ref.type.to_string();
    }
  };
  expect_outputs_match();
  // A kernel that can keep work made from fixed inputs (OpInfo::prepare_fixed), with every input fixed:
  // the same results on its first run, from what it kept, and after being told the inputs changed.
  if (const PrepareFixedFn prepare_fixed = op_info(n.op).prepare_fixed) {
    const std::vector<char> fixed(n.inputs.size(), 1);
    auto keeping = prepare_fixed(n, in_types, out_types, fixed);
    ASSERT_TRUE(keeping.is_ok()) << keeping.status().to_string();
    ASSERT_TRUE(*keeping != nullptr) << "no fast kernel with fixed inputs";
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE("fixed inputs, run " + std::to_string(rep));
      if (rep == 2) (*keeping)->fixed_inputs_changed();
      for (Tensor& t : outs) poison(t);
      Status s = (*keeping)->run(in_ptrs, out_ptrs);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      expect_outputs_match();
    }
  }
}

// ---- the sweep ---------------------------------------------------------------------------------

// A sample's feeds (SampleFeeds): random over the graph's inputs, then the inputs it ranges or gives.
Feeds sample_feeds(const OpSample& s) {
  const SampleFeeds& f = s.feeds;
  Feeds feeds = random_feeds(s.graph, f.seed, f.lo, f.hi, f.int_hi);
  uint64_t stream = 1000;
  for (const auto& [name, range] : f.ranges) {
    auto it = feeds.find(name);
    if (it == feeds.end()) continue;  // a sample family may range inputs some samples lack
    HostArray& a = it->second;
    const bool floats = is_float(a.type.dtype);
    ++stream;
    for (size_t i = 0; i < a.data.size(); ++i) {
      const double v = range.first + (range.second - range.first) * bits_to_unit_float(philox_bits(f.seed, stream, i));
      a.data[i] = floats ? v : std::trunc(v);
    }
  }
  if (f.quantum > 0)
    for (auto& [name, a] : feeds)
      if (is_float(a.type.dtype))
        for (double& v : a.data) v = std::round(v / f.quantum) * f.quantum;
  for (const auto& [name, values] : f.values) {
    auto it = feeds.find(name);
    if (it == feeds.end()) continue;  // a sample family may give values for inputs some samples lack
    if (it->second.data.size() != values.size()) {
      ADD_FAILURE() << "values for " << name << ": expected " << it->second.data.size() << ", found " << values.size();
      continue;
    }
    it->second.data = values;
  }
  return feeds;
}

std::vector<OpKind> ops_with_fast_kernels() {
  std::vector<OpKind> ops;
  for (int i = 0; i < kNumOps; ++i)
    if (op_info(OpKind(i)).prepare) ops.push_back(OpKind(i));
  return ops;
}

// An op with a fast kernel lists samples; an op without one lists none (there would be nothing to test).
TEST(FastKernels, EveryFastKernelHasSamples) {
  for (int i = 0; i < kNumOps; ++i) {
    const OpInfo& info = op_info(OpKind(i));
    if (info.prepare)
      EXPECT_NE(info.samples, nullptr) << "op " << info.name << " has a fast kernel and no samples (OpInfo::samples)";
    else
      EXPECT_EQ(info.samples, nullptr) << "op " << info.name << " has samples and no fast kernel";
  }
}

class FastKernelSweep : public ::testing::TestWithParam<OpKind> {};

TEST_P(FastKernelSweep, MatchesTheReference) {
  const OpKind op = GetParam();
  const OpInfo& info = op_info(op);
  ASSERT_NE(info.samples, nullptr);
  std::vector<OpSample> samples;
  SampleList list(samples);
  info.samples(list);
  int fast = 0;
  for (const OpSample& s : samples) {
    SCOPED_TRACE("sample \"" + s.label + "\"");
    ASSERT_TRUE(s.built.is_ok()) << s.built.to_string();
    ASSERT_FALSE(s.graph.nodes().empty());
    ASSERT_EQ(s.graph.nodes().back().op, op) << "the sample's last node is " << op_name(s.graph.nodes().back().op);
    expect_fast_matches(s.graph, sample_feeds(s), s.tol, s.fast);
    fast += s.fast;
  }
  EXPECT_GT(fast, 0) << "no sample runs the fast kernel";
}

INSTANTIATE_TEST_SUITE_P(EveryOp, FastKernelSweep, ::testing::ValuesIn(ops_with_fast_kernels()),
                         [](const ::testing::TestParamInfo<OpKind>& p) { return std::string(op_name(p.param)); });

// ---- what samples cannot say ---------------------------------------------------------------------

// NOTE [matmul backends]: products big enough for the OpenBLAS backend (N >= 2048, 256+ rows once the
// batch folds, no b^T) route to it when it is the OpenMP build, and to oneDNN otherwise; the sweep's
// "large" matmul samples are these shapes, so they run whichever backend this machine routes to.
TEST(FastKernels, LargeF32MatmulsRouteToOpenBlas) {
  const kernels::MatmulShape folded{.batch = 2, .M = 130, .N = 2100, .K = 33, .broadcast_b = true, .has_bias = true};
  const kernels::MatmulShape ta{.M = 300, .N = 2100, .K = 33, .trans_a = true, .has_bias = true};
  const kernels::MatmulBackend want =
      kernels::openblas_is_openmp_build() ? kernels::MatmulBackend::openblas : kernels::MatmulBackend::onednn;
  for (const kernels::MatmulShape& s : {folded, ta}) EXPECT_EQ(kernels::matmul_backend_for(s, 2), want);
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

// NOTE [packed gemv]: a decode row against a fixed bf16 [N, K] weight (the tied head) runs on a copy regrouped
// once: the bits of the same product on w as stored (prepared without fixed inputs), the old values until
// fixed_inputs_changed(), the new ones after.
TEST(FastKernels, FixedBf16RowProductIsPackedUntilChanged) {
  const int64_t N = 21, K = 70;  // rows past the last group of 8, a short last chunk of k
  Graph g;
  Builder b(g);
  b.matmul(b.input("x", DType::f32, Shape{1, K}), b.input("w", DType::bf16, Shape{N, K}), false, true);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const Node& node = g.nodes().back();
  const std::vector<TensorType> in = {g.type(node.inputs[0]), g.type(node.inputs[1])};
  const std::vector<TensorType> out = {g.type(node.outputs[0])};
  const char fixed[] = {0, 1};
  auto packed = op_info(OpKind::matmul).prepare_fixed(node, in, out, std::span<const char>(fixed, 2));
  auto plain = op_info(OpKind::matmul).prepare(node, in, out);
  ASSERT_TRUE(packed.is_ok() && plain.is_ok());
  ASSERT_TRUE(*packed && *plain);
  std::vector<float> x(static_cast<size_t>(K)), wf(static_cast<size_t>(N * K)), wf2(wf.size());
  philox_fill_uniform(std::span<float>(x), 1, 0, 0, -1.0f, 1.0f);
  philox_fill_uniform(std::span<float>(wf), 2, 0, 0, -1.0f, 1.0f);
  philox_fill_uniform(std::span<float>(wf2), 3, 0, 0, -1.0f, 1.0f);
  std::vector<bf16> w(wf.size()), w2(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = f32_to_bf16(wf[i]), w2[i] = f32_to_bf16(wf2[i]);
  auto run = [&](PreparedKernel& k, const std::vector<bf16>& weights) {
    std::vector<float> y(static_cast<size_t>(N), -1.0f);
    const void* ins[] = {x.data(), weights.data()};
    void* outs[] = {y.data()};
    EXPECT_TRUE(k.run(ins, outs).is_ok());
    return y;
  };
  std::vector<bf16> bound = w;  // the fixed input's buffer
  const std::vector<float> want = run(**plain, w), want2 = run(**plain, w2);
  EXPECT_EQ(run(**packed, bound), want);
  bound = w2;  // its values change...
  EXPECT_EQ(run(**packed, bound), want);  // ...and the packed copy is kept, as the contract says
  (**packed).fixed_inputs_changed();
  EXPECT_EQ(run(**packed, bound), want2);
  EXPECT_NE(want, want2);
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

}  // namespace
}  // namespace aspen::graph
