// Tests of graph/ops_quant.cc: inferred types, the rule errors' wording, the kernel with fixed (packed)
// weights against the reference before and after the weights change, and the gradient refused by name.
// (The unpacked kernel against the reference for every format: the sweep in ops_fast_test.cc; the products
// themselves: kernels/quant_test.cc.)
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "graph/autodiff.h"
#include "graph/builder.h"
#include "kernels/quant.h"

namespace aspen::graph {
namespace {

Attrs q(const char* format, int64_t k) { return {{"format", std::string(format)}, {"k", k}}; }

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (float& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = float(double(s % 20001) / 10000.0 - 1.0);
  }
  return v;
}

TEST(QuantOps, TypesAndErrors) {
  {
    Graph g;
    Builder b(g);
    const ValueId y = b.op1(
        OpKind::matmul_q,
        {b.input("a", DType::f32, {2, 3, 256}), b.input("w", DType::u8, {5, 144}), b.input("bias", DType::f32, {5})},
        q("q4_k", 256));
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    EXPECT_EQ(g.type(y), (TensorType{DType::f32, Shape{2, 3, 5}}));
  }
  auto error = [](std::vector<TensorType> in, Attrs attrs) {
    Graph g;
    Builder b(g);
    std::vector<ValueId> ins;
    const char* names[] = {"a", "w", "bias"};
    for (size_t i = 0; i < in.size(); ++i) ins.push_back(b.input(names[i], in[i].dtype, in[i].shape));
    b.op1(OpKind::matmul_q, ins, std::move(attrs));
    return b.status().message();
  };
  const TensorType a{DType::f32, Shape{1, 64}}, w{DType::u8, Shape{4, 68}};
  EXPECT_EQ(error({a, w}, q("q5_k", 64)),
            "node 2 (matmul_q) with inputs (f32[1, 64], u8[4, 68]): matmul_q: format: expected q8_0, q4_0 or q4_k, "
            "found 'q5_k'");
  EXPECT_EQ(error({a, w}, q("q8_0", 48)),
            "node 2 (matmul_q) with inputs (f32[1, 64], u8[4, 68]): matmul_q: k: expected a positive multiple of 32 "
            "(the q8_0 block), found 48");
  EXPECT_EQ(error({a, {DType::u8, Shape{4, 64}}}, q("q8_0", 64)),
            "node 2 (matmul_q) with inputs (f32[1, 64], u8[4, 64]): matmul_q: w: expected u8 [N, 68] (64 values of "
            "q8_0 blocks a row), found u8[4, 64]");
  EXPECT_EQ(error({{DType::bf16, Shape{1, 64}}, w}, q("q8_0", 64)),
            "node 2 (matmul_q) with inputs (bf16[1, 64], u8[4, 68]): matmul_q: a: expected f32 [..., 64], found "
            "bf16[1, 64]");
  EXPECT_EQ(error({a, w, {DType::f32, Shape{5}}}, q("q8_0", 64)),
            "node 3 (matmul_q) with inputs (f32[1, 64], u8[4, 68], f32[5]): matmul_q: bias: expected f32 [4], found "
            "f32[5]");
}

// Q8_0 rows of random values (valid blocks, as a GGUF file holds them).
std::vector<uint8_t> q8_rows(int64_t N, int64_t K, uint64_t seed) {
  const std::vector<float> v = random_values(size_t(N * K), seed);
  std::vector<kernels::BlockQ8_0> blocks(size_t(N * K / 32));
  for (int64_t n = 0; n < N; ++n) kernels::quantize_row_q8_0(v.data() + n * K, K, blocks.data() + n * K / 32);
  std::vector<uint8_t> bytes(blocks.size() * sizeof(kernels::BlockQ8_0));
  std::memcpy(bytes.data(), blocks.data(), bytes.size());
  return bytes;
}

// With w fixed the kernel packs it once: the reference's bits; the old values until fixed_inputs_changed(),
// the new ones after.
TEST(QuantOps, FixedWeightsArePackedUntilChanged) {
  const int64_t M = 2, N = 19, K = 96;  // N % 8 != 0: rows past the last group of 8
  Graph g;
  Builder b(g);
  b.op1(OpKind::matmul_q, {b.input("a", DType::f32, {M, K}), b.input("w", DType::u8, {N, K / 32 * 34})}, q("q8_0", K));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const Node& node = g.nodes().back();
  const std::vector<TensorType> in = {g.type(node.inputs[0]), g.type(node.inputs[1])};
  const std::vector<TensorType> out = {g.type(node.outputs[0])};
  const char fixed[] = {0, 1};
  auto prepared = op_info(OpKind::matmul_q).prepare_fixed(node, in, out, std::span<const char>(fixed, 2));
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  ASSERT_TRUE(*prepared);
  PreparedKernel& kernel = **prepared;

  const std::vector<float> a = random_values(size_t(M * K), 3);
  std::vector<uint8_t> w = q8_rows(N, K, 4);
  const std::vector<uint8_t> w2 = q8_rows(N, K, 5);
  auto want = [&](const std::vector<uint8_t>& weights) {
    std::vector<float> y(size_t(M * N));
    kernels::ref::gemv_q8_0(a.data(), reinterpret_cast<const kernels::BlockQ8_0*>(weights.data()), y.data(), M, N, K);
    return y;
  };
  auto run = [&] {
    std::vector<float> y(size_t(M * N), -1.0f);
    const void* ins[] = {a.data(), w.data()};
    void* outs[] = {y.data()};
    EXPECT_TRUE(kernel.run(ins, outs).is_ok());
    return y;
  };
  EXPECT_EQ(run(), want(w));
  const std::vector<uint8_t> first = w;
  w = w2;                         // the buffer's values change...
  EXPECT_EQ(run(), want(first));  // ...and the packed copy is kept, as the contract says
  kernel.fixed_inputs_changed();
  EXPECT_EQ(run(), want(w2));
}

TEST(QuantOps, NoGradientThroughQuantizedWeights) {
  Graph g;
  Builder b(g);
  const ValueId a = b.input("a", DType::f32, {1, 32});
  const ValueId y = b.op1(OpKind::matmul_q, {a, b.input("w", DType::u8, {3, 34})}, q("q8_0", 32));
  const ValueId loss = b.reduce_sum(y, {0, 1});
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const ValueId wrt[] = {a};
  auto grads = append_gradients(g, loss, wrt);
  ASSERT_FALSE(grads.is_ok());
  EXPECT_NE(grads.status().to_string().find("matmul_q"), std::string::npos) << grads.status().to_string();
}

}  // namespace
}  // namespace aspen::graph
