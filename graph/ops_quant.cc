// graph/ops_quant.cc: products with weights in llama.cpp's quantized blocks, the graph form of kernels/quant.h.
//
//   matmul_q(a, w, bias?) {format: "q8_0" | "q4_0" | "q4_k", k} -> y
//       a [..., k] f32; w u8 [N, row bytes]: row n holds weight row n's k values as k / block consecutive
//       blocks of `format` (q8_0: 34 bytes per 32 values, q4_0: 18 per 32, q4_k: 144 per 256; ggml's layouts,
//       as GGUF files store them); bias f32 [N]. y [..., N] f32 = a · W^T (+ bias), each row of a quantized
//       to Q8_0 first (ggml's quantize_row_q8_0) and the blocks' products summed in kernels/quant.h's fixed
//       order. That product is the op's definition: the reference is kernels::ref's scalar loop, and the fast
//       kernels equal it bit for bit on every ISA and thread count. k must be a multiple of the block.
//
// Not differentiable: quantized weights are for inference (autodiff names the op when asked through one).
// Fast kernel: kernels/quant.h's products; with w fixed (CompileOptions::hoist_weights) its rows are packed
// 8 to a stream once (pack_*_rows8; again after fixed_inputs_changed), else w is read as it is.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/quant.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

// The product's sizes: rows M of a, N of w, and k.
struct QuantDims {
  const kernels::QuantFormat* format;
  int64_t M, N, K;
  bool bias;
};

Result<QuantDims> quant_dims(const Node& n, std::span<const TensorType> in) {
  const std::string& name = n.attrs.s("format");
  const kernels::QuantFormat* l = kernels::quant_format(name);
  if (!l) return rule_error(n, "format", "q8_0, q4_0 or q4_k", "'" + name + "'");
  const int64_t K = n.attrs.i("k");
  if (K < l->block_values || K % l->block_values != 0)
    return rule_error(n, "k", "a positive multiple of " + std::to_string(l->block_values) + " (the " + name + " block)",
                      std::to_string(K));
  const TensorType &a = in[0], &w = in[1];
  if (a.dtype != DType::f32 || a.shape.rank() < 1 || a.shape[a.shape.rank() - 1] != K)
    return rule_error(n, "a", "f32 [..., " + std::to_string(K) + "]", a.to_string());
  const int64_t row_bytes = l->row_bytes(K);
  if (w.dtype != DType::u8 || w.shape.rank() != 2 || w.shape[1] != row_bytes)
    return rule_error(
        n, "w",
        "u8 [N, " + std::to_string(row_bytes) + "] (" + std::to_string(K) + " values of " + name + " blocks a row)",
        w.to_string());
  const int64_t N = w.shape[0];
  const bool bias = in.size() > 2;
  if (bias && (in[2].dtype != DType::f32 || in[2].shape != Shape{N}))
    return rule_error(n, "bias", "f32 [" + std::to_string(N) + "]", in[2].to_string());
  return QuantDims{l, a.shape.numel() / K, N, K, bias};
}

Status infer_matmul_q(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const QuantDims d, quant_dims(n, in));
  std::vector<int64_t> y = dims(in[0].shape);
  y.back() = d.N;
  ASPEN_ASSIGN_OR_RETURN(Shape shape, to_shape(n, "y", y));
  out = {TensorType{DType::f32, shape}};
  return Status();
}

void add_bias(const QuantDims& d, const float* bias, float* y) {
  for (int64_t m = 0; m < d.M; ++m)
    for (int64_t j = 0; j < d.N; ++j) y[m * d.N + j] += bias[j];
}

// The reference: kernels::ref's product on a's values rounded to f32 (the op's input type), widened back.
Status eval_matmul_q(const Node& n, Ins in, Outs out) {
  std::vector<TensorType> types;
  for (const HostArray* h : in) types.push_back(h->type);
  ASPEN_ASSIGN_OR_RETURN(const QuantDims d, quant_dims(n, types));
  const std::vector<float> a(in[0]->data.begin(), in[0]->data.end());
  std::vector<uint8_t> w(in[1]->data.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(in[1]->data[i]);
  std::vector<float> y(size_t(d.M * d.N));
  d.format->reference(a.data(), w.data(), y.data(), d.M, d.N, d.K);
  if (d.bias) {
    const std::vector<float> bias(in[2]->data.begin(), in[2]->data.end());
    add_bias(d, bias.data(), y.data());
  }
  for (size_t i = 0; i < y.size(); ++i) out[0].data[i] = double(y[i]);
  return Status();
}

Prepared prepare_matmul_q_impl(const Node& n, Types in, bool w_fixed) {
  ASPEN_ASSIGN_OR_RETURN(const QuantDims d, quant_dims(n, in));
  if (d.M < 1 || d.N < 1) return no_fast_kernel();
  if (!w_fixed)
    return make_kernel([d](In i, Out o) {
      float* y = static_cast<float*>(o[0]);
      ASPEN_RETURN_IF_ERROR(d.format->gemv(f32_in(i, 0), static_cast<const uint8_t*>(i[1]), y, d.M, d.N, d.K));
      if (d.bias) add_bias(d, f32_in(i, 2), y);
      return Status();
    });
  // w's rows packed 8 to a stream (QuantFormat::pack_rows8).
  auto packed = std::make_shared<PackedWeights>(size_t(d.N * d.format->row_bytes(d.K)));
  return make_kernel(
      [d, packed](In i, Out o) {
        float* y = static_cast<float*>(o[0]);
        const auto* p = static_cast<const uint8_t*>(packed->of(i[1], [&d](const void* w, void* to) {
          d.format->pack_rows8(static_cast<const uint8_t*>(w), d.N, d.K, static_cast<uint8_t*>(to));
        }));
        ASPEN_RETURN_IF_ERROR(d.format->gemv_rows8(f32_in(i, 0), p, y, d.M, d.N, d.K));
        if (d.bias) add_bias(d, f32_in(i, 2), y);
        return Status();
      },
      [packed] { packed->changed(); });
}

Prepared prepare_matmul_q(const Node& n, Types in, Types) { return prepare_matmul_q_impl(n, in, false); }
Prepared prepare_matmul_q_fixed(const Node& n, Types in, Types, std::span<const char> fixed) {
  return prepare_matmul_q_impl(n, in, fixed.size() > 1 && fixed[1]);
}

}  // namespace

std::vector<double> random_quant_blocks(const kernels::QuantFormat& l, int64_t N, int64_t K, uint64_t seed) {
  const int64_t blocks = N * (K / l.block_values);
  std::vector<double> out(size_t(blocks * l.block_bytes));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  };
  for (int64_t b = 0; b < blocks; ++b) {
    double* p = out.data() + b * l.block_bytes;
    for (int64_t j = 0; j < l.block_bytes; ++j) p[j] = double(next() & 0xff);
    const int scales = l.block_values == 256 ? 2 : 1;  // d (and Q4_K's dmin)
    for (int k = 0; k < scales; ++k) {
      const uint16_t h = f32_to_f16(float(0.002 + 0.01 * double(next() % 1000) / 1000.0)).bits;
      p[2 * k] = double(h & 0xff);
      p[2 * k + 1] = double(h >> 8);
    }
  }
  return out;
}

namespace {

// Every format, a batch of rows beside the decode's one, the largest batch the packed GEMV takes and one
// past it, a bias, and rows past the last group of 8 (N % 8).
void samples_matmul_q(SampleList& s) {
  struct Case {
    const char* format;
    std::vector<int64_t> a;  // a's shape (its last dim is k)
    int64_t N;
    bool bias;
  };
  for (const Case& c :
       {Case{"q8_0", {1, 64}, 13, false}, Case{"q8_0", {2, 3, 96}, 17, true}, Case{"q4_0", {1, 32}, 8, false},
        Case{"q4_0", {9, 64}, 11, true}, Case{"q4_k", {1, 256}, 9, false}, Case{"q4_k", {3, 512}, 16, true}}) {
    const kernels::QuantFormat& l = *kernels::quant_format(c.format);
    const int64_t K = c.a.back();
    OpSample& o =
        s.add(std::string(c.format) + " a " + sample_shape(c.a).to_string() + " N " + std::to_string(c.N) +
                  (c.bias ? " bias" : ""),
              [&](Builder& b) {
                std::vector<ValueId> ins = {b.input("a", DType::f32, sample_shape(c.a)),
                                            b.input("w", DType::u8, Shape{c.N, l.row_bytes(K)})};
                if (c.bias) ins.push_back(b.input("bias", DType::f32, Shape{c.N}));
                b.op1(OpKind::matmul_q, ins, {{"format", std::string(c.format)}, {"k", K}});
              });
    o.feeds.values["w"] = random_quant_blocks(l, c.N, K, uint64_t(c.N * 31 + K));
    o.tol = 0.0;  // the fast kernels are the reference's bits
  }
}

}  // namespace

void register_quant_ops(OpTable& t) {
  t.define(OpKind::matmul_q, {.min_inputs = 2,
                              .max_inputs = 3,
                              .attrs = {{"format", AttrKind::str, true}, {"k", AttrKind::i64, true}},
                              .infer = infer_matmul_q,
                              .eval = eval_matmul_q,
                              .prepare = prepare_matmul_q,
                              .prepare_fixed = prepare_matmul_q_fixed,
                              .samples = samples_matmul_q});
}

}  // namespace aspen::graph
