// graph/ops_matmul.cc: matmul, the graph form of kernels/matmul.h (and of kernels/gemv.h for a decode step's
// products); split from ops_nn.cc, whose other blocks it shares helpers with (ops_nn_util.h).
//
//   matmul(a, b[, bias]) {trans_a, trans_b}: a [..., M, K] ([..., K, M] with trans_a), b [K, N] ([N, K] with
//       trans_b) shared by the batch or with a's batch dimensions, bias [N]; out [..., M, N] (kernels/matmul.h)
//       {out_dtype}: a and b bf16 (or f16), bias and out in out_dtype: f32, or a's dtype (narrow partials)
//       a and b share a dtype, with one exception: a f32, b bf16 (no out_dtype) -> bias and out f32, the
//       product of a rounded to bf16 (nearest even) with b, accumulated in f32: bf16 weights under f32
//       activations, rounded as autocast rounds them (NOTE [mixed matmul])
//
// Gradient rule:
//   matmul:        da = g op(b)^T, db = op(a)^T g (transposes folded into trans flags; a shared b sums over
//                  the batch by one matmul of a and g reshaped to [batch*M, .]), dbias = reduce_sum(g, all but last);
//                  none with out_dtype (Unimplemented: precision runs after autodiff) or mixed dtypes
#include <cmath>
#include <memory>
#include <optional>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "graph/ops_util.h"
#include "kernels/convert.h"
#include "kernels/gemv.h"
#include "kernels/matmul.h"
#include "kernels/scratch.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using namespace nnutil;

// ---- matmul -------------------------------------------------------------------

struct MatmulDims {
  kernels::MatmulShape shape;
  std::vector<int64_t> out;  // [..., M, N]
  DType out_dtype = DType::f32;
  DType b_dtype = DType::f32;  // a's, or bf16 in the mixed case (NOTE [mixed matmul])
};

// The output dtype: a's, or the out_dtype attribute (f32 or a's dtype, with
// bf16 or f16 a and b: the partials type of compiler/precision.cc).
Result<DType> matmul_out_dtype(const Node& n, const TensorType& a) {
  if (!n.attrs.has("out_dtype")) return a.dtype;
  const int64_t od = n.attrs.i("out_dtype");
  if (a.dtype != DType::bf16 && a.dtype != DType::f16)
    return rule_error(n, "a", "bf16 or f16 (with out_dtype)", a.to_string());
  if (od != int64_t(DType::f32) && od != int64_t(a.dtype))
    return rule_error(n, "out_dtype",
                      "f32 (" + str(int64_t(DType::f32)) + ") or a's dtype (" + str(int64_t(a.dtype)) + ")", str(od));
  return DType(od);
}

bool is_mixed_matmul(const Node& n, const TensorType& a, const TensorType& b) {
  return a.dtype == DType::f32 && b.dtype == DType::bf16 && !n.attrs.has("out_dtype");
}

Result<MatmulDims> matmul_dims(const Node& n, std::span<const TensorType> in) {
  const TensorType &ta_type = in[0], &tb_type = in[1];
  ASPEN_RETURN_IF_ERROR(expect_float(n, "a", ta_type));
  ASPEN_ASSIGN_OR_RETURN(const DType out_dtype, matmul_out_dtype(n, ta_type));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "a", ta_type, 2));
  // NOTE [mixed matmul]: a f32 with b bf16 (weights kept in bf16, activations in f32) is the one mixed
  // case; a is rounded to bf16 and the product is f32, with no out_dtype.
  const bool mixed = is_mixed_matmul(n, ta_type, tb_type);
  if (!mixed) ASPEN_RETURN_IF_ERROR(expect_dtype(n, "b", tb_type, ta_type.dtype, "a's"));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "b", tb_type, 2));
  ASPEN_ASSIGN_OR_RETURN(const bool trans_a, flag(n, "trans_a"));
  ASPEN_ASSIGN_OR_RETURN(const bool trans_b, flag(n, "trans_b"));
  const Shape &a = ta_type.shape, &b = tb_type.shape;
  const int ra = a.rank(), rb = b.rank();
  if (rb != 2 && rb != ra)
    return rule_error(n, "b", "rank 2 (shared across the batch) or rank " + str(ra) + " (a's)", tb_type.to_string());
  for (int i = 0; i < rb - 2; ++i)
    if (b[i] != a[i]) return rule_error(n, "batch dimension " + str(i), str(a[i]) + " (a's)", str(b[i]));
  MatmulDims d;
  kernels::MatmulShape& s = d.shape;
  s.M = trans_a ? a[-1] : a[-2];
  s.K = trans_a ? a[-2] : a[-1];
  s.N = trans_b ? b[-2] : b[-1];
  const int64_t bk = trans_b ? b[-1] : b[-2];
  if (bk != s.K)
    return rule_error(n, "K", str(s.K) + (trans_a ? " (a's second-to-last dimension)" : " (a's last dimension)"),
                      str(bk));
  if (in.size() > 2)
    ASPEN_RETURN_IF_ERROR(expect_type(n, "bias", in[2], TensorType{out_dtype, Shape{s.N}},
                                      n.attrs.has("out_dtype") ? "[N] in out_dtype" : "[N] in a's dtype"));
  s.batch = 1;
  for (int i = 0; i < ra - 2; ++i) {
    s.batch *= a[i];
    d.out.push_back(a[i]);
  }
  s.trans_a = trans_a;
  s.trans_b = trans_b;
  s.broadcast_b = rb == 2;
  s.has_bias = in.size() > 2;
  s.input = ta_type.dtype;
  d.b_dtype = tb_type.dtype;
  d.out_dtype = out_dtype;
  d.out.push_back(s.M);
  d.out.push_back(s.N);
  return d;
}

Status infer_matmul(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(MatmulDims d, matmul_dims(n, in));
  ASPEN_ASSIGN_OR_RETURN(Shape s, to_shape(n, "output shape", d.out));
  out = {TensorType{d.out_dtype, s}};
  return Status();
}

Status eval_matmul(const Node& n, Ins in, Outs out) {
  std::vector<TensorType> types;
  for (const HostArray* a : in) types.push_back(a->type);
  ASPEN_ASSIGN_OR_RETURN(MatmulDims d, matmul_dims(n, types));
  const double* a = in[0]->data.data();
  std::vector<double> rounded;
  if (is_mixed_matmul(n, types[0], types[1])) {  // NOTE [mixed matmul]: a rounded to bf16 first
    rounded.resize(in[0]->data.size());
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = double(bf16_to_f32(f32_to_bf16(float(a[i]))));
    a = rounded.data();
  }
  kernels::ref::matmul<double, double>(a, in[1]->data.data(), in.size() > 2 ? in[2]->data.data() : nullptr,
                                       out[0].data.data(), d.shape);
  return Status();
}

ValueId mm(Builder& b, ValueId x, ValueId y, bool trans_a, bool trans_b) {
  Attrs a;
  if (trans_a) a.set("trans_a", int64_t(1));
  if (trans_b) a.set("trans_b", int64_t(1));
  return b.op1(OpKind::matmul, {x, y}, std::move(a));
}

// Swaps the last two axes of a rank-r value.
std::vector<int64_t> swap_last_two(int r) {
  std::vector<int64_t> p;
  for (int i = 0; i < r; ++i) p.push_back(i);
  std::swap(p[size_t(r - 2)], p[size_t(r - 1)]);
  return p;
}

// With op(x) = x or x^T as the flags say and C = op(A) op(B):
//   dop(A) = G op(B)^T, dop(B) = op(A)^T G; each transpose folds into a trans flag.
Grads grad_matmul(Builder& b, const Node& n, OutGrads g) {
  if (n.attrs.has("out_dtype"))
    return Status::error(Code::kUnimplemented, "matmul: gradient with out_dtype",
                         "a matmul without out_dtype (precision runs after autodiff)", "out_dtype");
  if (b.type(n.inputs[0]).dtype != b.type(n.inputs[1]).dtype)
    return Status::error(Code::kUnimplemented, "matmul: gradient with a " + b.type(n.inputs[0]).to_string() +
                         " and b " + b.type(n.inputs[1]).to_string(),
                         "a and b of one dtype (bf16 weights with f32 activations are for inference)", "mixed dtypes");
  const ValueId A = n.inputs[0], B = n.inputs[1], G = *g[0];
  const bool ta = n.attrs.i_or("trans_a", 0) != 0, tb = n.attrs.i_or("trans_b", 0) != 0;
  const Shape as = b.type(A).shape;
  const int ra = as.rank();
  const bool fold = b.type(B).shape.rank() == 2 && ra > 2;  // b shared by a batch
  ValueId da, db;
  if (!ta) da = mm(b, G, B, false, !tb);                                       // [.., M, K] = G op(B)^T
  else if (!fold) da = mm(b, B, G, tb, true);                                  // [.., K, M] = op(B) G^T
  else da = b.transpose(mm(b, G, B, false, !tb), swap_last_two(ra));           // (G op(B)^T)^T per entry
  if (!fold) {
    db = tb ? mm(b, G, A, true, ta)   // [.., N, K] = G^T op(A)
            : mm(b, A, G, !ta, false);  // [.., K, N] = op(A)^T G
  } else {
    const Shape gs = b.type(G).shape;
    const int64_t rows = gs.numel() / gs[-1];
    ValueId a2 = b.reshape(ta ? b.transpose(A, swap_last_two(ra)) : A, {rows, ta ? as[-2] : as[-1]});
    ValueId g2 = b.reshape(G, {rows, gs[-1]});
    db = tb ? mm(b, g2, a2, true, false) : mm(b, a2, g2, true, false);
  }
  std::vector<std::optional<ValueId>> r{da, db};
  if (n.inputs.size() > 2) {
    std::vector<int64_t> axes;
    for (int i = 0; i < ra - 1; ++i) axes.push_back(i);
    r.push_back(b.reduce_sum(G, axes));
  }
  return r;
}

// ---- fast kernel ------------------------------------------------------------------------------

// A plan made once here (oneDNN primitive creation is the expensive part); run() binds pointers. The plan
// is made for the preparing thread's OpenMP team size. Empty extents (which oneDNN refuses) fall back.
// bf16 a and b with f32 out (out_dtype) use the plan's bf16 input.
// The rest of the mixed-precision family, for which oneDNN 2.6 has no CPU
// primitive (f16 matmul) or we keep one plan shape (narrow partials):
//   f16 a, b:         widened to f32 in scratch, then the f32 plan. Products of
//                     f16 values are exact in f32, so this is an f16 matmul with
//                     f32 accumulation, at f32 speed (no f16 arithmetic here).
//   out bf16 / f16:   the f32 result rounded (RNE) to the partials type; the
//                     accumulation itself is f32 inside oneDNN either way.
// Scratch is per leader thread and grows once (the first run), so steady
// state allocates nothing. A bias in a narrow out_dtype falls back.
float* matmul_scratch(int which, int64_t n) {
  float* p = kernels::op_scratch_of<float>(which, n);
  ASPEN_CHECK(p != nullptr) << "matmul: out of memory for " << n << " floats of scratch";
  return p;
}

// NOTE [gemv route]: a decode step's matmuls (f32 activations, a few rows, one weight matrix shared by
// the batch, no trans_a) go to kernels/gemv.h: they are bound by weight bytes per second, and the GEMV
// kernel streams them near the memory's read rate where oneDNN's M = 1 path reaches about half of it.
// The batch folds into M (a is [batch, M, K] contiguous and b is shared), up to kGemvMaxRows rows.
// NOTE [mixed matmul]: a mixed matmul (a f32, b bf16: bf16 weights under f32 activations) rounds a to
// bf16 (to nearest even, as autocast rounds activations) and multiplies bf16 by bf16 with f32
// accumulation, on every path: the decode rows round a into scratch for the GEMV; other shapes (prefill)
// round it into scratch and run the bf16 plan, on AMX or AVX512-BF16 where the CPU has them. Widening b
// to f32 on every call instead (what this did first) made bf16 prefill slower than f32. Where the CPU
// has no bf16 arithmetic the bf16 plan widens both (NOTE [bf16 without AVX-512]), so the result is the
// same on every machine up to summation order, and the reference (eval_matmul) rounds a the same way.
constexpr int64_t kGemvMaxRows = 8;

// NOTE [fixed weights]: with b fixed (prepare_fixed: a weight, under
// CompileOptions::hoist_weights) the plan is made for a fixed B (aspen's
// kernels pack it once: kernels/matmul_aspen.cc, NOTE [fixed b]; the backend
// choice measures that), and fixed_inputs_changed() tells the plan to pack it
// again. The GEMV route streams B as it is, except a bf16 [N, K] B for one row (NOTE [packed gemv]: regrouped
// once into 8-row streams, again after fixed_inputs_changed()).
Prepared prepare_matmul_impl(const Node& n, Types in, Types out, bool b_fixed);
Prepared prepare_matmul(const Node& n, Types in, Types out) { return prepare_matmul_impl(n, in, out, false); }
Prepared prepare_matmul_fixed(const Node& n, Types in, Types out, std::span<const char> fixed) {
  return prepare_matmul_impl(n, in, out, fixed.size() > 1 && fixed[1]);
}

}  // namespace

std::optional<kernels::GemvShape> matmul_gemv_route(const Node& n, std::span<const TensorType> in,
                                                    std::span<const TensorType> out) {
  const DType in_t = in[0].dtype, out_t = out[0].dtype;
  const bool plain = floats_are_f32(in, out);
  const bool mixed = in_t == DType::f32 && in[1].dtype == DType::bf16 && out_t == DType::f32;
  if (!plain && !mixed) return std::nullopt;
  const Result<MatmulDims> d = matmul_dims(n, in);
  if (!d.is_ok()) return std::nullopt;
  const kernels::MatmulShape& s = d->shape;
  if (s.batch < 1 || s.M < 1 || s.N < 1 || s.K < 1 || s.trans_a || !s.broadcast_b || s.batch * s.M > kGemvMaxRows)
    return std::nullopt;
  const kernels::GemvShape g{.M = s.batch * s.M, .N = s.N, .K = s.K, .trans_b = s.trans_b,
                             .has_bias = s.has_bias, .weight = d->b_dtype, .x_bf16 = mixed};
  if (!kernels::gemv_validate(g).is_ok()) return std::nullopt;
  return g;
}

const float* gemv_rows_of(const kernels::GemvShape& g, const float* a) {
  if (!g.x_bf16) return a;
  // NOTE [mixed matmul]: a rounded to bf16 (a few rows: cheap beside the weights' stream)
  const int64_t na = g.M * g.K;
  float* ra = matmul_scratch(0, na);
  for (int64_t j = 0; j < na; ++j) ra[j] = bf16_to_f32(f32_to_bf16(a[j]));
  return ra;
}

namespace {

Prepared prepare_matmul_impl(const Node& n, Types in, Types out, bool b_fixed) {
  const DType in_t = in[0].dtype, out_t = out[0].dtype;
  const bool plain = floats_are_f32(in, out);
  const bool bf16_in = in_t == DType::bf16 && (out_t == DType::f32 || out_t == DType::bf16);
  const bool f16_in = in_t == DType::f16 && (out_t == DType::f32 || out_t == DType::f16);
  const bool mixed = in_t == DType::f32 && in[1].dtype == DType::bf16 && out_t == DType::f32;
  if (!plain && !bf16_in && !f16_in && !mixed) return no_fast_kernel();
  ASPEN_ASSIGN_OR_RETURN(const MatmulDims d, matmul_dims(n, in));
  kernels::MatmulShape s = d.shape;
  if (s.batch < 1 || s.M < 1 || s.N < 1 || s.K < 1) return no_fast_kernel();
  if (s.has_bias && out_t != DType::f32) return no_fast_kernel();
  if (const std::optional<kernels::GemvShape> route = matmul_gemv_route(n, in, out)) {
    const kernels::GemvShape g = *route;
    auto round_a = [g](const float* a) { return gemv_rows_of(g, a); };
    if (b_fixed && kernels::gemv_packable(g)) {  // NOTE [packed gemv]: a fixed bf16 [N, K] regrouped once
      auto packed = std::make_shared<PackedWeights>(size_t(g.weight_bytes()));
      return make_kernel(
          [g, round_a, packed](In i, Out o) {
            const void* p = packed->of(i[1], [&g](const void* w, void* to) { kernels::gemv_pack(g, w, to); });
            kernels::gemv_run_packed(g, round_a(f32_in(i, 0)), p, g.has_bias ? f32_in(i, 2) : nullptr,
                                     static_cast<float*>(o[0]));
            return Status();
          },
          [packed] { packed->changed(); });
    }
    return make_kernel([g, round_a](In i, Out o) {
      kernels::gemv_run(g, round_a(f32_in(i, 0)), i[1], g.has_bias ? f32_in(i, 2) : nullptr,
                        static_cast<float*>(o[0]));
      return Status();
    });
  }
  if (f16_in) s.input = DType::f32;
  if (mixed) s.input = DType::bf16;  // NOTE [mixed matmul]
  s.b_fixed = b_fixed && !f16_in && (s.broadcast_b || s.batch == 1);  // f16: b is widened into scratch per run
  ASPEN_ASSIGN_OR_RETURN(kernels::MatmulPlan made, kernels::MatmulPlan::create(s));
  auto plan = std::make_shared<kernels::MatmulPlan>(std::move(made));
  const bool bias = s.has_bias;
  auto changed = [plan] { plan->b_changed(); };
  if (plain || (bf16_in && out_t == DType::f32))
    return make_kernel(
        [plan, bias](In i, Out o) {
          plan->run(i[0], i[1], bias ? f32_in(i, 2) : nullptr, static_cast<float*>(o[0]));
          return Status();
        },
        changed);
  const int64_t na = in[0].shape.numel(), nb = in[1].shape.numel(), nc = out[0].shape.numel();
  return make_kernel(
      [plan, bias, f16_in, mixed, out_t, na, nb, nc](In i, Out o) {
        const void *a = i[0], *b = i[1];
        if (mixed) {  // NOTE [mixed matmul]: a rounded to bf16, then the bf16 plan
          bf16* ra = reinterpret_cast<bf16*>(matmul_scratch(0, (na + 1) / 2));
          ASPEN_RETURN_IF_ERROR(kernels::convert_f32_to_bf16(in_span<float>(i, 0, na), {ra, size_t(na)}, na));
          a = ra;
        }
        if (f16_in) {
          float* wa = matmul_scratch(0, na);
          float* wb = matmul_scratch(1, nb);
          ASPEN_RETURN_IF_ERROR(kernels::convert_f16_to_f32(in_span<f16>(i, 0, na), {wa, size_t(na)}, na));
          ASPEN_RETURN_IF_ERROR(kernels::convert_f16_to_f32(in_span<f16>(i, 1, nb), {wb, size_t(nb)}, nb));
          a = wa;
          b = wb;
        }
        float* c = out_t == DType::f32 ? static_cast<float*>(o[0]) : matmul_scratch(2, nc);
        plan->run(a, b, bias ? f32_in(i, 2) : nullptr, c);
        const std::span<const float> cs(c, size_t(nc));
        if (out_t == DType::bf16) return kernels::convert_f32_to_bf16(cs, out_span<bf16>(o, 0, nc), nc);
        if (out_t == DType::f16) return kernels::convert_f32_to_f16(cs, out_span<f16>(o, 0, nc), nc);
        return Status();
      },
      changed);
}

// Samples for the kernel sweep (graph/op_sample.h).

// NOTE [matmul backends]: every transpose and batching, with and without bias, on oneDNN; products big
// enough for the OpenBLAS backend (N >= 2048, 256+ rows once the batch folds, no b^T); decode-shaped
// products (a few rows, shared weights, f32 or bf16 b: the GEMV kernel, NOTE [gemv route]); bf16 inputs
// with f32 or bf16 out (the bf16 plan, rounded).
// A bf16 (f16) out: the reference rounds the exact sum, the kernel its f32 sum; where the two straddle a
// rounding boundary they land one ulp apart (bf16: 2^-7 of the value's power of two, below its scale).
constexpr double kNarrowTol = 1.6e-2;
void samples_matmul(SampleList& s) {
  constexpr int64_t M = 3, K = 5, N = 7;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int batching = 0; batching < 3; ++batching) {  // 0: none, 1: batched b, 2: b shared by the batch
        std::vector<int64_t> batch = batching ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{};
        std::vector<int64_t> as = batch, bs = batching == 1 ? batch : std::vector<int64_t>{};
        as.push_back(ta ? K : M);
        as.push_back(ta ? M : K);
        bs.push_back(tb ? N : K);
        bs.push_back(tb ? K : N);
        const bool bias = ta != tb;  // half the cases
        s.add("ta " + std::to_string(ta) + " tb " + std::to_string(tb) + " batching " + std::to_string(batching) +
                  (bias ? " bias" : ""),
              [&](Builder& b) {
                std::vector<ValueId> in{b.input("a", DType::f32, sample_shape(as)),
                                        b.input("b", DType::f32, sample_shape(bs))};
                if (bias) in.push_back(b.input("bias", DType::f32, Shape{N}));
                b.op(OpKind::matmul, in, {{"trans_a", int64_t(ta)}, {"trans_b", int64_t(tb)}});
              });
      }
  for (bool ta : {false, true})  // OpenBLAS-sized: a [2, 130, 33] folding into 260 rows, or a^T [33, 300]
    s.add(std::string("large, bias") + (ta ? ", ta" : ", batch folded"), [&](Builder& b) {
      b.op(OpKind::matmul,
           {b.input("a", DType::f32, ta ? Shape{33, 300} : Shape{2, 130, 33}),
            b.input("b", DType::f32, Shape{33, 2100}), b.input("bias", DType::f32, Shape{2100})},
           {{"trans_a", int64_t(ta)}});
    });
  constexpr int64_t DK = 37, DN = 19;
  const std::vector<std::vector<int64_t>> decode_a = {{1, DK}, {5, DK}, {2, 4, DK}, {9, DK}, {3, 3, DK}};
  for (DType wt : {DType::f32, DType::bf16})
    for (bool tb : {false, true})
      for (const auto& as : decode_a)
        for (bool bias : {false, true})
          s.add("decode " + std::string(dtype_name(wt)) + " weights, tb " + std::to_string(tb) + ", rows " +
                    std::to_string(sample_shape(as).numel() / DK) + (bias ? ", bias" : ""),
                [&](Builder& b) {
                  std::vector<ValueId> in{b.input("a", DType::f32, sample_shape(as)),
                                          b.input("b", wt, tb ? Shape{DN, DK} : Shape{DK, DN})};
                  if (bias) in.push_back(b.input("bias", DType::f32, Shape{DN}));
                  b.op(OpKind::matmul, in, {{"trans_b", int64_t(tb)}});
                });
  for (DType in : {DType::bf16, DType::f16})  // the narrow plan (bf16) or widened to f32 (f16)
    for (DType out : {DType::f32, in})
      for (bool tb : {false, true})
        for (bool bias : {false, true}) {
          OpSample& c = s.add(std::string(dtype_name(in)) + " in, " + std::string(dtype_name(out)) + " out, tb " +
                                  std::to_string(tb) + (bias ? ", bias" : ""),
                              [&](Builder& b) {
                                std::vector<ValueId> x{b.input("a", in, Shape{2, 9, K}),
                                                       b.input("b", in, tb ? Shape{N, K} : Shape{K, N})};
                                if (bias) x.push_back(b.input("bias", out, Shape{N}));
                                b.op(OpKind::matmul, x, {{"trans_b", int64_t(tb)}, {"out_dtype", int64_t(out)}});
                              });
          if (out != DType::f32) c.tol = kNarrowTol;
          c.fast = !bias || out == DType::f32;  // a bias in a narrow out_dtype falls back
        }
  s.add("bf16 without out_dtype", [](Builder& b) {
     b.op(OpKind::matmul, {b.input("a", DType::bf16, Shape{3, 4}), b.input("b", DType::bf16, Shape{4, 5})});
   }).tol = kNarrowTol;
}

}  // namespace

void register_matmul_ops(OpTable& t) {
  t.define(OpKind::matmul, {.min_inputs = 2,
                            .max_inputs = 3,
                            .attrs = {{"trans_a", AttrKind::i64, false},
                                      {"trans_b", AttrKind::i64, false},
                                      {"out_dtype", AttrKind::i64, false}},
                            .infer = infer_matmul,
                            .grad = grad_matmul,
                            .eval = eval_matmul,
                            .prepare = prepare_matmul,
                            .prepare_fixed = prepare_matmul_fixed,
                            .samples = samples_matmul});
}

}  // namespace aspen::graph
