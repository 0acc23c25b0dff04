// graph/ops_fused.cc: ops the fusion pass makes (compiler/fusion.cc). Each is
// exactly the composition it replaces, so the reference kernels define it by
// that composition; they run after autodiff and are never differentiated.
//
//   bias_gelu(x, bias) {tanh}: gelu(x + broadcast(bias)); x [..., C], bias [C]
//   add_layernorm(x, residual, gamma, beta) {eps}: h = x + residual, then
//       layernorm(h): outputs h, y, mean, rstd (mean and rstd f32, like layernorm)
//   matmul_group(a, b_1, ..., b_k) {op, bias, and op's attributes}: y_i = op(a, b_i) with those attributes,
//       k outputs, op matmul (the default: trans_b) or matmul_q (format, k): products of one a (a layer's q, k
//       and v), run in one parallel region where they are decode products (NOTE [gemv groups]); with bias = 1
//       the inputs are a, b_1, bias_1, ..., b_k, bias_k and y_i = op(a, b_i, bias_i).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/activation.h"
#include "kernels/norm.h"
#include "kernels/quant.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

int64_t last_dim(const TensorType& t) { return t.shape.rank() ? t.shape[-1] : 1; }

Status infer_bias_gelu(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "x", in[0], 1));
  if (in[1] != TensorType{in[0].dtype, Shape{last_dim(in[0])}})
    return rule_error(n, "bias", TensorType{in[0].dtype, Shape{last_dim(in[0])}}.to_string(), in[1].to_string());
  out = {in[0]};
  return Status();
}

kernels::GeluKind kind_of(const Node& n) {
  return n.attrs.i_or("tanh", 1) ? kernels::GeluKind::tanh : kernels::GeluKind::erf;
}

Status eval_bias_gelu(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const int64_t C = last_dim(in[0]->type), R = in[0]->numel() / std::max<int64_t>(C, 1);
  kernels::ref::bias_gelu_forward<double>(in[0]->data.data(), in[1]->data.data(), out[0].data.data(), R, C,
                                          kind_of(n));
  return Status();
}

Prepared prepare_bias_gelu(const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t C = last_dim(in[0]), R = in[0].shape.numel() / std::max<int64_t>(C, 1);
  const kernels::GeluKind kind = kind_of(n);
  return make_kernel([R, C, kind](In i, Out o) {
    return kernels::bias_gelu_forward(in_span<float>(i, 0, R * C), in_span<float>(i, 1, C),
                                      out_span<float>(o, 0, R * C), R, C, kind);
  });
}

Status infer_add_layernorm(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "x", in[0], 1));
  ASPEN_RETURN_IF_ERROR(expect_same(n, in, 0, 1));
  const TensorType vec{in[0].dtype, Shape{last_dim(in[0])}};
  if (in[2] != vec) return rule_error(n, "gamma", vec.to_string(), in[2].to_string());
  if (in[3] != vec) return rule_error(n, "beta", vec.to_string(), in[3].to_string());
  const TensorType stat{kStat, drop_last(in[0].shape)};
  out = {in[0], in[0], stat, stat};
  return Status();
}

Status eval_add_layernorm(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  const int64_t C = last_dim(in[0]->type), R = in[0]->numel() / std::max<int64_t>(C, 1);
  kernels::ref::add_layernorm_forward<double>(in[0]->data.data(), in[1]->data.data(), in[2]->data.data(),
                                              in[3]->data.data(), out[0].data.data(), out[1].data.data(),
                                              out[2].data.data(), out[3].data.data(), R, C, n.attrs.f("eps"));
  return Status();
}

Prepared prepare_add_layernorm(const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t C = last_dim(in[0]), R = in[0].shape.numel() / std::max<int64_t>(C, 1);
  const float eps = float(n.attrs.f("eps"));
  return make_kernel([R, C, eps](In i, Out o) {
    return kernels::add_layernorm_forward(in_span<float>(i, 0, R * C), in_span<float>(i, 1, R * C),
                                          in_span<float>(i, 2, C), in_span<float>(i, 3, C),
                                          out_span<float>(o, 0, R * C), out_span<float>(o, 1, R * C),
                                          out_span<float>(o, 2, R), out_span<float>(o, 3, R), R, C, eps);
  });
}

// Samples for the kernel sweep (graph/op_sample.h): odd widths, one size large enough to split into row
// chunks, and bf16 (the reference).
void samples_bias_gelu(SampleList& s) {
  for (int64_t tanh_form : {1, 0})
    for (const Shape& x : {Shape{3, 5, 7}, Shape{260, 131}})
      s.add("f32 " + x.to_string() + (tanh_form ? " tanh" : " erf"),
            [&](Builder& b) {
              b.op(OpKind::bias_gelu, {b.input("x", DType::f32, x), b.input("bias", DType::f32, Shape{x[-1]})},
                   {{"tanh", tanh_form}});
            },
            {.lo = -4.0, .hi = 4.0});
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::bias_gelu, {b.input("x", DType::bf16, Shape{3, 4}), b.input("bias", DType::bf16, Shape{4})});
   }).fast = false;
}

void samples_add_layernorm(SampleList& s) {
  for (const Shape& x : {Shape{2, 3, 13}, Shape{130, 131}})
    s.add("f32 " + x.to_string(), [&](Builder& b) {
      b.op(OpKind::add_layernorm,
           {b.input("x", DType::f32, x), b.input("residual", DType::f32, x), b.input("gamma", DType::f32, Shape{x[-1]}),
            b.input("beta", DType::f32, Shape{x[-1]})},
           {{"eps", 1e-5}});
    });
  s.add("bf16", [](Builder& b) {
     b.op(OpKind::add_layernorm,
          {b.input("x", DType::bf16, Shape{3, 4}), b.input("residual", DType::bf16, Shape{3, 4}),
           b.input("gamma", DType::bf16, Shape{4}), b.input("beta", DType::bf16, Shape{4})},
          {{"eps", 1e-5}});
   }).fast = false;
}

// ---- matmul_group -------------------------------------------------------------------------------

// The node (a matmul or a matmul_q) that product i of a group is, and its input types (a, b_i[, bias_i]).
struct GroupPart {
  Node node;
  std::vector<TensorType> in;
  size_t b = 0;  // b_i's input index in the group node (bias_i, when present, follows it)
};

OpKind group_member(const Node& n) { return OpKind(n.attrs.i_or("op", int64_t(OpKind::matmul))); }

Result<int64_t> group_size(const Node& n, size_t inputs) {
  if (group_member(n) != OpKind::matmul && group_member(n) != OpKind::matmul_q)
    return rule_error(n, "op", "matmul or matmul_q (" + str(int64_t(OpKind::matmul)) + " or " +
                                   str(int64_t(OpKind::matmul_q)) + ")", str(n.attrs.i_or("op", 0)));
  if (group_member(n) == OpKind::matmul_q && (!n.attrs.has("format") || !n.attrs.has("k")))
    return rule_error(n, "format, k", "matmul_q's attributes (op is matmul_q)", "missing");
  ASPEN_ASSIGN_OR_RETURN(const bool bias, flag(n, "bias"));
  const size_t per = bias ? 2 : 1;
  if (inputs < 1 + per || (inputs - 1) % per)
    return rule_error(n, "inputs", bias ? "a, then (b, bias) pairs" : "a, then one b per product",
                      str(int64_t(inputs)) + " inputs");
  return int64_t((inputs - 1) / per);
}

GroupPart group_part(const Node& n, std::span<const TensorType> in, int64_t i) {
  const bool bias = n.attrs.i_or("bias", 0) == 1;
  GroupPart p;
  p.node.op = group_member(n);
  p.node.stage = n.stage;
  if (p.node.op == OpKind::matmul_q) {
    p.node.attrs.set("format", n.attrs.s("format"));
    p.node.attrs.set("k", n.attrs.i("k"));
  } else {
    p.node.attrs.set("trans_b", n.attrs.i_or("trans_b", 0));
  }
  p.b = size_t(1 + i * (bias ? 2 : 1));
  p.in = {in[0], in[p.b]};
  if (bias) p.in.push_back(in[p.b + 1]);
  return p;
}

Status infer_matmul_group(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t k, group_size(n, in.size()));
  out.clear();
  for (int64_t i = 0; i < k; ++i) {
    const GroupPart p = group_part(n, in, i);
    std::vector<TensorType> o;
    ASPEN_RETURN_IF_ERROR(op_info(p.node.op).infer(p.node, p.in, o));
    out.push_back(o[0]);
  }
  return Status();
}

Status eval_matmul_group(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<TensorType> types;
  for (const HostArray* a : in) types.push_back(a->type);
  for (size_t i = 0; i < out.size(); ++i) {
    const GroupPart p = group_part(n, types, int64_t(i));
    std::vector<const HostArray*> ins = {in[0], in[p.b]};
    if (p.in.size() == 3) ins.push_back(in[p.b + 1]);
    ASPEN_RETURN_IF_ERROR(op_info(p.node.op).eval(p.node, ins, out.subspan(i, 1)));
  }
  return Status();
}

// Quantized products (matmul_q) of one a with every weight fixed: packed once each (pack_rows8, as matmul_q
// packs them), then one gemv_rows8_group, then the biases as matmul_q adds them.
Result<std::unique_ptr<PreparedKernel>> prepare_quant_group(const std::vector<GroupPart>& parts,
                                                            std::span<const TensorType> out) {
  const kernels::QuantFormat* format = kernels::quant_format(parts[0].node.attrs.s("format"));
  if (!format || parts.size() > 16) return no_fast_kernel();
  const int64_t K = parts[0].node.attrs.i("k"), M = rows_of(parts[0].in[0].shape);
  std::vector<std::shared_ptr<PackedWeights>> packs;
  std::vector<int64_t> ns;
  std::vector<size_t> b_index;
  for (size_t i = 0; i < parts.size(); ++i) {
    ns.push_back(out[i].shape[-1]);
    b_index.push_back(parts[i].b);
    packs.push_back(std::make_shared<PackedWeights>(size_t(ns[i] * format->row_bytes(K))));
  }
  const bool bias = parts[0].in.size() == 3;
  return make_kernel(
      [format, K, M, packs, ns, b_index, bias](std::span<const void* const> i, std::span<void* const> o) {
        kernels::QuantGroupCall calls[16];
        for (size_t c = 0; c < packs.size(); ++c) {
          const int64_t N = ns[c];
          const void* p = packs[c]->of(i[b_index[c]], [format, N, K](const void* w, void* to) {
            format->pack_rows8(static_cast<const uint8_t*>(w), N, K, static_cast<uint8_t*>(to));
          });
          calls[c] = {static_cast<const uint8_t*>(p), static_cast<float*>(o[c]), N};
        }
        ASPEN_RETURN_IF_ERROR(format->gemv_rows8_group(static_cast<const float*>(i[0]), calls, packs.size(), M, K));
        for (size_t c = 0; bias && c < packs.size(); ++c) {
          const float* b = static_cast<const float*>(i[b_index[c] + 1]);
          float* y = static_cast<float*>(o[c]);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < ns[c]; ++j) y[m * ns[c] + j] += b[j];
        }
        return Status();
      },
      [packs] {
        for (const auto& p : packs) p->changed();
      });
}

// NOTE [gemv groups]: where every product goes to the GEMV with [N, K] weights of one type (decode), one
// gemv_run_group, each fixed bf16 weight packed once as the matmul packs it (NOTE [packed gemv]); quantized
// products with fixed weights, one gemv_rows8_group; otherwise each product's own kernel, in turn.
Result<std::unique_ptr<PreparedKernel>> prepare_matmul_group_fixed(const Node& n, std::span<const TensorType> in,
                                                                   std::span<const TensorType> out,
                                                                   std::span<const char> fixed) {
  const size_t k = out.size();
  std::vector<GroupPart> parts;
  std::vector<kernels::GemvShape> shapes;
  bool all_fixed = true;
  for (size_t i = 0; i < k; ++i) {
    parts.push_back(group_part(n, in, int64_t(i)));
    all_fixed = all_fixed && fixed.size() > parts[i].b && fixed[parts[i].b];
    if (parts[i].node.op != OpKind::matmul) continue;
    if (const std::optional<kernels::GemvShape> g = matmul_gemv_route(parts[i].node, parts[i].in, out.subspan(i, 1)))
      shapes.push_back(*g);
  }
  if (parts[0].node.op == OpKind::matmul_q && all_fixed) {
    ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> q, prepare_quant_group(parts, out));
    if (q) return q;
  }
  const auto alike = [&](const kernels::GemvShape& g) {
    return g.trans_b && g.M == shapes[0].M && g.K == shapes[0].K && g.weight == shapes[0].weight &&
           g.x_bf16 == shapes[0].x_bf16;
  };
  if (shapes.size() == k && k <= 16 && std::all_of(shapes.begin(), shapes.end(), alike)) {
    std::vector<std::shared_ptr<PackedWeights>> packs(k);
    std::vector<size_t> b_index(k);
    for (size_t i = 0; i < k; ++i) {
      b_index[i] = parts[i].b;
      if (fixed.size() > parts[i].b && fixed[parts[i].b] && kernels::gemv_packable(shapes[i]))
        packs[i] = std::make_shared<PackedWeights>(size_t(shapes[i].weight_bytes()));
    }
    return make_kernel(
        [shapes, packs, b_index](std::span<const void* const> i, std::span<void* const> o) {
          kernels::GemvCall calls[16];
          for (size_t c = 0; c < shapes.size(); ++c) {
            const kernels::GemvShape& g = shapes[c];
            const void* w = i[b_index[c]];
            if (packs[c]) w = packs[c]->of(w, [&g](const void* from, void* to) { kernels::gemv_pack(g, from, to); });
            calls[c] = kernels::GemvCall{g, w, packs[c] != nullptr,
                                         g.has_bias ? static_cast<const float*>(i[b_index[c] + 1]) : nullptr,
                                         static_cast<float*>(o[c])};
          }
          kernels::gemv_run_group(gemv_rows_of(shapes[0], static_cast<const float*>(i[0])),
                                  std::span<const kernels::GemvCall>(calls, shapes.size()));
          return Status();
        },
        [packs] {
          for (const auto& p : packs)
            if (p) p->changed();
        });
  }
  std::vector<std::shared_ptr<PreparedKernel>> kernels;
  const OpInfo& mm = op_info(parts[0].node.op);
  for (size_t i = 0; i < k; ++i) {
    const GroupPart& p = parts[i];
    std::vector<char> f = {fixed.size() > 0 && fixed[0], fixed.size() > p.b && fixed[p.b]};
    if (p.in.size() == 3) f.push_back(fixed.size() > p.b + 1 && fixed[p.b + 1]);
    ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedKernel> one,
                           mm.prepare_fixed ? mm.prepare_fixed(p.node, p.in, out.subspan(i, 1), f)
                                            : mm.prepare(p.node, p.in, out.subspan(i, 1)));
    if (!one) return no_fast_kernel();
    kernels.push_back(std::move(one));
  }
  std::vector<size_t> b_index;
  for (const GroupPart& p : parts) b_index.push_back(p.b);
  const bool bias = parts[0].in.size() == 3;
  return make_kernel(
      [kernels, b_index, bias](std::span<const void* const> i, std::span<void* const> o) {
        for (size_t c = 0; c < kernels.size(); ++c) {
          const void* ins[3] = {i[0], i[b_index[c]], bias ? i[b_index[c] + 1] : nullptr};
          void* outs[1] = {o[c]};
          ASPEN_RETURN_IF_ERROR(kernels[c]->run(std::span<const void* const>(ins, bias ? 3 : 2), outs));
        }
        return Status();
      },
      [kernels] {
        for (const auto& kk : kernels) kk->fixed_inputs_changed();
      });
}

Result<std::unique_ptr<PreparedKernel>> prepare_matmul_group(const Node& n, std::span<const TensorType> in,
                                                             std::span<const TensorType> out) {
  return prepare_matmul_group_fixed(n, in, out, {});
}

void samples_matmul_group(SampleList& s) {
  // q, k and v of a decode step (one row, three rows of a batch) and a prefill (16 rows: each product's own
  // kernel), f32 and bf16 weights, with and without biases.
  for (const int64_t rows : {1, 3, 16})
    for (const DType wt : {DType::f32, DType::bf16})
      for (const bool bias : {false, true})
        s.add(std::string(dtype_name(wt)) + " rows " + std::to_string(rows) + (bias ? " +bias" : ""),
              [=](Builder& b) {
                std::vector<ValueId> in = {b.input("a", DType::f32, Shape{rows, 67})};
                for (const int64_t N : {40, 13, 13}) {
                  in.push_back(b.input("b" + std::to_string(in.size()), wt, Shape{N, 67}));
                  if (bias) in.push_back(b.input("bias" + std::to_string(in.size()), DType::f32, Shape{N}));
                }
                b.op(OpKind::matmul_group, in, {{"trans_b", int64_t(1)}, {"bias", int64_t(bias)}});
              });
  // Quantized: q, k and v in Q8_0 and Q4_K blocks, rows past the last group of 8 (N % 8), one row and three,
  // with and without biases: the group gives matmul_q's bits (the sweep's fixed-input run: one
  // gemv_rows8_group; without: each product's own kernel).
  for (const char* format : {"q8_0", "q4_k"})
    for (const int64_t rows : {1, 3})
      for (const bool bias : {false, true}) {
        const kernels::QuantFormat& l = *kernels::quant_format(format);
        const int64_t K = l.block_values * 2;
        SampleFeeds feeds;
        std::vector<int64_t> ns = {16, 9, 8};
        for (size_t c = 0; c < ns.size(); ++c)
          feeds.values["w" + std::to_string(c)] = random_quant_blocks(l, ns[c], K, uint64_t(c * 7 + rows));
        OpSample& o = s.add(
            std::string(format) + " rows " + std::to_string(rows) + (bias ? " +bias" : ""),
            [&](Builder& b) {
              std::vector<ValueId> in = {b.input("a", DType::f32, Shape{rows, K})};
              for (size_t c = 0; c < ns.size(); ++c) {
                in.push_back(b.input("w" + std::to_string(c), DType::u8, Shape{ns[c], l.row_bytes(K)}));
                if (bias) in.push_back(b.input("bias" + std::to_string(c), DType::f32, Shape{ns[c]}));
              }
              b.op(OpKind::matmul_group, in,
                   {{"op", int64_t(OpKind::matmul_q)}, {"bias", int64_t(bias)}, {"format", std::string(format)},
                    {"k", K}});
            },
            feeds);
        o.tol = 0.0;  // matmul_q's fast kernels are the reference's bits
      }
}

}  // namespace

void register_fused_ops(OpTable& t) {
  t.define(OpKind::matmul_group, {.min_inputs = 2,
                                  .max_inputs = -1,
                                  .attrs = {{"op", AttrKind::i64, false},
                                            {"bias", AttrKind::i64, false},
                                            {"trans_b", AttrKind::i64, false},
                                            {"format", AttrKind::str, false},
                                            {"k", AttrKind::i64, false}},
                                  .infer = infer_matmul_group,
                                  .eval = eval_matmul_group,
                                  .prepare = prepare_matmul_group,
                                  .prepare_fixed = prepare_matmul_group_fixed,
                                  .samples = samples_matmul_group});
  t.define(OpKind::bias_gelu, {.min_inputs = 2,
                               .max_inputs = 2,
                               .attrs = {{"tanh", AttrKind::i64, false}},
                               .infer = infer_bias_gelu,
                               .eval = eval_bias_gelu,
                               .prepare = prepare_bias_gelu,
                               .samples = samples_bias_gelu});
  t.define(OpKind::add_layernorm, {.min_inputs = 4,
                                   .max_inputs = 4,
                                   .attrs = {{"eps", AttrKind::f64, true}},
                                   .infer = infer_add_layernorm,
                                   .eval = eval_add_layernorm,
                                   .prepare = prepare_add_layernorm,
                                   .samples = samples_add_layernorm});
}

}  // namespace aspen::graph
