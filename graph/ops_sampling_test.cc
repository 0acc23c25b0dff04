// Tests of graph/ops_sampling.cc: inferred types, the reference meaning (kernels::ref::sample_tokens in
// f64), the fast kernel bound by prepare against it, runtime value errors and rule errors, worded exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "kernels/sampling.h"

namespace aspen::graph {
namespace {

using Feeds = std::map<std::string, HostArray>;

HostArray array(DType dtype, Shape shape, std::vector<double> data) {
  return HostArray(TensorType{dtype, shape}, std::move(data));
}

// ids = sample(logits, temperature, top_k, top_p, repetition_penalty, seed, step[, history]).
ValueId build_sample(Builder& b, int64_t B, int64_t V, int64_t L, DType seed_type = DType::i64) {
  std::vector<ValueId> in{b.input("logits", DType::f32, {B, V}),
                          b.input("temperature", DType::f32, {B}),
                          b.input("top_k", DType::i32, {B}),
                          b.input("top_p", DType::f32, {B}),
                          b.input("repetition_penalty", DType::f32, {B}),
                          b.input("seed", seed_type, {}),
                          b.input("step", DType::i64, {})};
  if (L >= 0) in.push_back(b.input("history", DType::i32, {B, L}));
  ValueId ids = b.op1(OpKind::sample, in);
  b.output("ids", ids);
  return ids;
}

// Logits with clear gaps (no near-ties and no near-boundary masses for random draws to land on), per-row
// settings cycling through greedy, temperature, top-k, top-p and the penalty.
Feeds sample_feeds(int64_t B, int64_t V, int64_t L, uint64_t seed, int64_t step) {
  Feeds f;
  std::vector<double> x(size_t(B * V));
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(float(std::sin(double(i) * 1.7 + double(seed)) * 3.0));
  f["logits"] = array(DType::f32, {B, V}, x);
  std::vector<double> t, k, p, r;
  for (int64_t b = 0; b < B; ++b) {
    t.push_back(b % 4 == 0 ? 0.0 : double(0.5f + 0.25f * float(b % 3)));
    k.push_back(b % 3 == 1 ? 5 : 0);
    p.push_back(b % 4 == 2 ? double(0.9f) : 1.0);
    r.push_back(b % 2 ? double(1.3f) : 1.0);
  }
  f["temperature"] = array(DType::f32, {B}, t);
  f["top_k"] = array(DType::i32, {B}, k);
  f["top_p"] = array(DType::f32, {B}, p);
  f["repetition_penalty"] = array(DType::f32, {B}, r);
  f["seed"] = array(DType::i64, {}, {double(seed)});
  f["step"] = array(DType::i64, {}, {double(step)});
  if (L >= 0) {
    std::vector<double> h;
    for (int64_t i = 0; i < B * L; ++i) h.push_back(i % 3 == 2 ? -1.0 : double((i * 7) % V));
    f["history"] = array(DType::i32, {B, L}, h);
  }
  return f;
}

TEST(SamplingOps, Types) {
  Graph g;
  Builder b(g);
  ValueId ids = build_sample(b, 3, 17, 4);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_EQ(b.type(ids), (TensorType{DType::i32, Shape{3}}));
  Graph h;
  Builder hb(h);
  build_sample(hb, 2, 5, -1, DType::i32);  // no history; an i32 seed
  EXPECT_TRUE(hb.status().is_ok()) << hb.status().to_string();
}

TEST(SamplingOps, ValuesAreTheReference) {
  const int64_t B = 5, V = 31, L = 4;
  Graph g;
  Builder b(g);
  build_sample(b, B, V, L);
  ASSERT_TRUE(b.status().is_ok());
  Feeds f = sample_feeds(B, V, L, 11, 3);
  auto out = interpret(g, f);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  std::vector<int32_t> k, h, want(B);
  for (double v : f["top_k"].data) k.push_back(int32_t(v));
  for (double v : f["history"].data) h.push_back(int32_t(v));
  kernels::ref::sample_tokens<double>(f["logits"].data.data(), h.data(), f["temperature"].data.data(), k.data(),
                                      f["top_p"].data.data(), f["repetition_penalty"].data.data(), 11, 3,
                                      want.data(), B, V, L);
  for (int64_t i = 0; i < B; ++i) EXPECT_EQ(out->at("ids").data[size_t(i)], want[size_t(i)]) << "row " << i;
  // Row 0 is greedy: the first maximum of the (penalized) logits.
}

// The fast kernel, prepared for the node's types, reproduces the interpreter (twice: its workspace keeps
// no state between runs), with and without history, across steps.
TEST(SamplingOps, FastKernelMatchesInterpreter) {
  for (int64_t L : {int64_t(-1), int64_t(0), int64_t(6)}) {
    const int64_t B = 7, V = 129;
    Graph g;
    Builder b(g);
    build_sample(b, B, V, L);
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    const Node& n = g.nodes().back();
    std::vector<TensorType> in_types;
    for (ValueId v : n.inputs) in_types.push_back(g.type(v));
    std::vector<TensorType> out_types{g.type(n.outputs[0])};
    auto kernel = op_info(OpKind::sample).prepare(n, in_types, out_types);
    ASSERT_TRUE(kernel.is_ok() && *kernel != nullptr);
    for (int64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE("L=" + std::to_string(L) + " step=" + std::to_string(step));
      Feeds f = sample_feeds(B, V, L, 5, step);
      auto want = interpret(g, f, {.round_to_dtype = true});
      ASSERT_TRUE(want.is_ok()) << want.status().to_string();
      std::vector<Tensor> ins;
      std::vector<const void*> in_ptrs;
      for (const char* name : {"logits", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "step"})
        ins.push_back(f.at(name).to_tensor());
      if (L >= 0) ins.push_back(f.at("history").to_tensor());
      for (const Tensor& t : ins) in_ptrs.push_back(t.raw());
      Tensor ids(DType::i32, Shape{B});
      std::vector<void*> out_ptrs{ids.raw()};
      for (int rep = 0; rep < 2; ++rep) {
        ASSERT_TRUE((*kernel)->run(in_ptrs, out_ptrs).is_ok());
        EXPECT_EQ(HostArray::from_tensor(ids).data, want->at("ids").data);
      }
    }
  }
}

TEST(SamplingOps, RuntimeValueErrors) {
  Graph g;
  Builder b(g);
  build_sample(b, 2, 5, 1);
  Feeds f = sample_feeds(2, 5, 1, 1, 0);
  f["top_p"].data[1] = 1.5;
  auto out = interpret(g, f);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().message(),
            "node 8 (sample): sample: argument 'top_p' row 1: expected a number in (0, 1] (1: off), found 1.5");
}

template <class F>
std::string build_error(F build) {
  Graph g;
  Builder b(g);
  build(b);
  return b.status().message();
}

TEST(SamplingOps, RuleErrors) {
  auto build = [](Builder& b, DType logits, Shape temperature, Shape seed, Shape history) {
    b.op1(OpKind::sample, {b.input("logits", logits, {2, 5}), b.input("temperature", DType::f32, temperature),
                           b.input("top_k", DType::i32, {2}), b.input("top_p", DType::f32, {2}),
                           b.input("repetition_penalty", DType::f32, {2}), b.input("seed", DType::i64, seed),
                           b.input("step", DType::i64, {}), b.input("history", DType::i32, history)});
  };
  const std::string in = "node 8 (sample) with inputs (";
  EXPECT_EQ(build_error([&](Builder& b) { build(b, DType::i32, {2}, {}, {2, 3}); }),
            in + "i32[2, 5], f32[2], i32[2], f32[2], f32[2], i64[], i64[], i32[2, 3]): sample: logits: expected a "
                 "float type (f32, bf16, f16), found i32[2, 5]");
  EXPECT_EQ(build_error([&](Builder& b) { build(b, DType::f32, {3}, {}, {2, 3}); }),
            in + "f32[2, 5], f32[3], i32[2], f32[2], f32[2], i64[], i64[], i32[2, 3]): sample: temperature: expected "
                 "f32[2] (one per row of logits), found f32[3]");
  EXPECT_EQ(build_error([&](Builder& b) { build(b, DType::f32, {2}, {1}, {2, 3}); }),
            in + "f32[2, 5], f32[2], i32[2], f32[2], f32[2], i64[1], i64[], i32[2, 3]): sample: seed: expected an i32 "
                 "or i64 scalar (rank 0), found i64[1]");
  EXPECT_EQ(build_error([&](Builder& b) { build(b, DType::f32, {2}, {}, {3, 3}); }),
            in + "f32[2, 5], f32[2], i32[2], f32[2], f32[2], i64[], i64[], i32[3, 3]): sample: history: expected i32 "
                 "[2, L] (token ids per row of logits), found i32[3, 3]");
}

}  // namespace
}  // namespace aspen::graph
