// graph/ops_elementwise.cc: elementwise ops. Inputs of a binary op have equal
// types (broadcast explicitly); the output has that type.
//
// Gradient rules, one line of meaning each:
//   add:   da = g, db = g              sub:  da = g, db = -g
//   mul:   da = g b, db = g a          scale: dx = alpha g        neg: dx = -g
//   exp:   dx = g y                    gelu: dx = gelu_grad(x, g) silu: dx = silu_grad(x, g)
//   tanh:  dx = g (1 - y^2)            sqrt: dx = g / (2 y)
//   div:   da = g / b, db = -(g y) / b   (y = a / b)
//   where: da = where(c, g, 0), db = where(c, 0, g), no gradient to c
//   relu:  dx = relu_grad(x, g)        sigmoid: dx = g y (1 - y)     log: dx = g / x
//   erf:   dx = g (2 / sqrt(pi)) exp(-x^2)
//   sin:   dx = g cos(x)               cos: dx = -g sin(x)
//   floor, ceil, round: no gradient (zero almost everywhere, as in PyTorch)
//   max:   da = where(a < b, 0, g), db = where(a < b, g, 0)   (a tie goes to a)
//   min:   da = where(a > b, 0, g), db = where(a > b, g, 0)
//   cast:  dx = cast(g, x's dtype) between float types (a stochastic cast too; none for its seed); none from or
//          to integers
// neg, max and min take integers too (the reference runs them: imported graphs' shape arithmetic).
// Fast kernels (all in kernels/: activation.h, convert.h): every op on f32 (add also on i32; where's
// condition bool or u8); cast f32 <-> bf16, f32 <-> f16, f32 -> f32 and u8/bool -> f32 (masks).
#include <cmath>
#include <cstring>

#include "core/philox.h"
#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_registry.h"
#include "graph/ops_util.h"
#include "kernels/activation.h"
#include "kernels/convert.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using Grads = Result<std::vector<std::optional<ValueId>>>;
using OutGrads = std::span<const std::optional<ValueId>>;

Status infer_binary(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_same(n, in, 0, 1));
  out = {in[0]};
  return Status();
}

Status infer_binary_float(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "input 0", in[0]));
  return infer_binary(n, in, out);
}

Status infer_unary_float(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "input", in[0]));
  out = {in[0]};
  return Status();
}

// neg: any numeric type (integers too: shape arithmetic of imported graphs); not bool.
Status infer_unary_numeric(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  if (in[0].dtype == DType::boolean) return rule_error(n, "input", "a numeric type", in[0].to_string());
  out = {in[0]};
  return Status();
}

Status infer_unary_grad(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_same(n, in, 0, 1));
  out = {in[0]};
  return Status();
}

template <class F>
Status map1(std::span<const HostArray* const> in, std::span<HostArray> out, F f) {
  const std::vector<double>& x = in[0]->data;
  for (size_t i = 0; i < x.size(); ++i) out[0].data[i] = f(x[i]);
  return Status();
}
template <class F>
Status map2(std::span<const HostArray* const> in, std::span<HostArray> out, F f) {
  const std::vector<double>&a = in[0]->data, &b = in[1]->data;
  for (size_t i = 0; i < a.size(); ++i) out[0].data[i] = f(a[i], b[i]);
  return Status();
}

kernels::GeluKind gelu_kind(const Node& n) {
  return n.attrs.i_or("tanh", 1) ? kernels::GeluKind::tanh : kernels::GeluKind::erf;
}

// Gradient rules.
Grads grad_add(Builder&, const Node&, OutGrads g) { return std::vector<std::optional<ValueId>>{g[0], g[0]}; }
Grads grad_sub(Builder& b, const Node&, OutGrads g) {
  return std::vector<std::optional<ValueId>>{g[0], b.neg(*g[0])};
}
Grads grad_mul(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.mul(*g[0], n.inputs[1]), b.mul(*g[0], n.inputs[0])};
}
Grads grad_scale(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.scale(*g[0], n.attrs.f("alpha"))};
}
Grads grad_neg(Builder& b, const Node&, OutGrads g) { return std::vector<std::optional<ValueId>>{b.neg(*g[0])}; }
Grads grad_exp(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.mul(*g[0], n.outputs[0])};
}
Grads grad_gelu(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{
      b.op1(OpKind::gelu_grad, {n.inputs[0], *g[0]}, {{"tanh", n.attrs.i_or("tanh", 1)}})};
}
Grads grad_silu(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::silu_grad, {n.inputs[0], *g[0]})};
}
Grads grad_tanh(Builder& b, const Node& n, OutGrads g) {
  const ValueId y = n.outputs[0];
  const TensorType t = b.type(y);  // a copy: b.scalar() may move the value table
  const ValueId one = b.broadcast(b.scalar(1.0f, t.dtype), dims(t.shape));
  return std::vector<std::optional<ValueId>>{b.mul(*g[0], b.sub(one, b.mul(y, y)))};
}
Grads grad_sqrt(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.div(*g[0], b.scale(n.outputs[0], 2.0))};
}
Grads grad_div(Builder& b, const Node& n, OutGrads g) {
  const ValueId den = n.inputs[1];
  return std::vector<std::optional<ValueId>>{b.div(*g[0], den), b.neg(b.div(b.mul(*g[0], n.outputs[0]), den))};
}
Grads grad_where(Builder& b, const Node& n, OutGrads g) {
  ValueId zero = zeros_like(b, *g[0]);
  return std::vector<std::optional<ValueId>>{std::nullopt, b.where(n.inputs[0], *g[0], zero),
                                             b.where(n.inputs[0], zero, *g[0])};
}
Grads grad_relu(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::relu_grad, {n.inputs[0], *g[0]})};
}
Grads grad_sigmoid(Builder& b, const Node& n, OutGrads g) {
  const ValueId y = n.outputs[0];
  const TensorType t = b.type(y);
  const ValueId one = b.broadcast(b.scalar(1.0f, t.dtype), dims(t.shape));
  return std::vector<std::optional<ValueId>>{b.mul(*g[0], b.mul(y, b.sub(one, y)))};
}
Grads grad_erf(Builder& b, const Node& n, OutGrads g) {
  const ValueId x = n.inputs[0];
  constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
  return std::vector<std::optional<ValueId>>{b.mul(*g[0], b.scale(b.exp(b.neg(b.mul(x, x))), kTwoOverSqrtPi))};
}
Grads grad_log(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.div(*g[0], n.inputs[0])};
}
Grads grad_sin(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.mul(*g[0], b.op1(OpKind::cos, {n.inputs[0]}))};
}
Grads grad_cos(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.neg(b.mul(*g[0], b.op1(OpKind::sin, {n.inputs[0]})))};
}
Grads no_grad(Builder&, const Node&, OutGrads) { return std::vector<std::optional<ValueId>>{std::nullopt}; }

// The reference of a unary op that is one function of doubles.
double sin_d(double x) { return std::sin(x); }
double cos_d(double x) { return std::cos(x); }
double floor_d(double x) { return std::floor(x); }
double ceil_d(double x) { return std::ceil(x); }
double round_d(double x) { return std::nearbyint(x); }  // the default rounding mode: half to even
template <double (*F)(double)>
Status eval_map(const Node&, std::span<const HostArray* const> in, std::span<HostArray> out) {
  return map1(in, out, F);
}
// max (min): the gradient goes to the larger (smaller) input, to a at a tie.
Grads grad_max_min(Builder& b, const Node& n, OutGrads g) {
  const ValueId other_wins = b.op1(n.op == OpKind::max ? OpKind::less : OpKind::greater, {n.inputs[0], n.inputs[1]});
  const ValueId zero = zeros_like(b, *g[0]);
  return std::vector<std::optional<ValueId>>{b.where(other_wins, zero, *g[0]), b.where(other_wins, *g[0], zero)};
}
// A stochastic cast's gradient passes straight through, as a rounding's does; none for its seed.
Grads grad_cast(Builder& b, const Node& n, OutGrads g) {
  const DType from = b.type(n.inputs[0]).dtype;
  std::vector<std::optional<ValueId>> out(n.inputs.size());
  if (is_float(from) && is_float(b.type(n.outputs[0]).dtype)) out[0] = b.cast(*g[0], from);
  return out;
}

Status infer_where(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  if (in[0].dtype != DType::boolean && in[0].dtype != DType::u8)
    return rule_error(n, "condition", "bool or u8", in[0].to_string());
  if (in[0].shape != in[1].shape)
    return rule_error(n, "condition shape", in[1].shape.to_string() + " (the values' shape)", in[0].shape.to_string());
  ASPEN_RETURN_IF_ERROR(expect_same(n, in, 1, 2));
  out = {in[1]};
  return Status();
}

Status infer_cast(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const int64_t dt = n.attrs.i("dtype");
  if (dt < 0 || dt >= kNumDTypes) return rule_error(n, "dtype", "a dtype id in [0, 7)", std::to_string(dt));
  if (in.size() > 1) {  // NOTE [stochastic cast]
    if (in[0].dtype != DType::f32 || (DType(dt) != DType::bf16 && DType(dt) != DType::f16))
      return rule_error(n, "x and dtype", "f32 to bf16 or f16 with a seed (stochastic rounding)",
                        in[0].to_string() + " to " + std::string(dtype_name(DType(dt))));
    if (in[1] != TensorType{DType::i64, Shape{1}}) return rule_error(n, "seed", "i64[1]", in[1].to_string());
  }
  out = {TensorType{DType(dt), in[0].shape}};
  return Status();
}

// NOTE [stochastic cast]: cast(x f32, seed i64[1]) {dtype bf16 or f16, stream} rounds stochastically
// (kernels/convert.h: element i with philox_bits(seed, stream, i)), unbiased and reproducible from the seed;
// a negative seed (validation, inference) rounds to nearest. The precision pass casts master weights so under
// Precision.enableStochasticRounding (compiler/precision.cc), with the micro-batch's run-time seed.
// Seeds are integers below 2^53 in magnitude (the interpreter holds them as doubles, as dropout's).
Status check_seed(double seed) {
  if (!(std::abs(seed) < 9007199254740992.0))
    return Status::invalid_argument("cast: seed", "an integer below 2^53 in magnitude", std::to_string(seed));
  return Status();
}

double stochastic_round(DType to, double x, int64_t seed, uint64_t stream, uint64_t i) {
  if (seed < 0) return round_to(to, x);
  const uint32_t r = philox_bits(uint64_t(seed), stream, i);
  return to == DType::bf16 ? double(bf16_to_f32(kernels::f32_to_bf16_stochastic(float(x), r)))
                           : double(f16_to_f32(kernels::f32_to_f16_stochastic(float(x), r)));
}

// Fast kernels (f32; other dtypes fall back to the reference for now).
using Prepared = Result<std::unique_ptr<PreparedKernel>>;
using In = std::span<const void* const>;
using Out = std::span<void* const>;

bool all_f32(std::span<const TensorType> in, std::span<const TensorType> out) {
  for (const auto& t : in)
    if (t.dtype != DType::f32) return false;
  for (const auto& t : out)
    if (t.dtype != DType::f32) return false;
  return true;
}

template <Status (*K)(std::span<const float>, std::span<const float>, std::span<float>, int64_t)>
Prepared prepare_binary(const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  return make_kernel([n](In i, Out o) {
    return K(in_span<float>(i, 0, n), in_span<float>(i, 1, n), out_span<float>(o, 0, n), n);
  });
}

// add also runs on i32 (counters and positions of generation state).
Prepared prepare_add(const Node& n, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (in[0].dtype == DType::i32) {
    const int64_t count = out[0].shape.numel();
    return make_kernel([count](In i, Out o) {
      return kernels::add_forward(in_span<int32_t>(i, 0, count), in_span<int32_t>(i, 1, count),
                                  out_span<int32_t>(o, 0, count), count);
    });
  }
  return prepare_binary<kernels::add_forward>(n, in, out);
}

// y[k] = F(x[k]) on f32.
template <Status (*F)(std::span<const float>, std::span<float>, int64_t)>
Prepared prepare_unary(const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  return make_kernel([n](In i, Out o) { return F(in_span<float>(i, 0, n), out_span<float>(o, 0, n), n); });
}

// where(cond, a, b) on f32 values; cond is bool or u8, one byte per element.
Prepared prepare_where(const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in.subspan(1), out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  return make_kernel([n](In i, Out o) {
    return kernels::where_forward(in_span<uint8_t>(i, 0, n), in_span<float>(i, 1, n), in_span<float>(i, 2, n),
                                  out_span<float>(o, 0, n), n);
  });
}

Prepared prepare_scale(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  const float alpha = float(node.attrs.f("alpha"));
  return make_kernel([n, alpha](In i, Out o) {
    return kernels::scale_forward(in_span<float>(i, 0, n), out_span<float>(o, 0, n), n, alpha);
  });
}

Prepared prepare_neg(const Node&, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  return make_kernel([n](In i, Out o) {
    return kernels::scale_forward(in_span<float>(i, 0, n), out_span<float>(o, 0, n), n, -1.0f);
  });
}

Prepared prepare_gelu(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  const kernels::GeluKind kind = gelu_kind(node);
  if (node.op == OpKind::gelu)
    return make_kernel([n, kind](In i, Out o) {
      return kernels::gelu_forward(in_span<float>(i, 0, n), out_span<float>(o, 0, n), n, kind);
    });
  return make_kernel([n, kind](In i, Out o) {
    return kernels::gelu_backward(in_span<float>(i, 0, n), in_span<float>(i, 1, n), out_span<float>(o, 0, n), n, kind);
  });
}

Prepared prepare_silu(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  if (!all_f32(in, out)) return no_fast_kernel();
  const int64_t n = out[0].shape.numel();
  if (node.op == OpKind::silu)
    return make_kernel([n](In i, Out o) {
      return kernels::silu_forward(in_span<float>(i, 0, n), out_span<float>(o, 0, n), n);
    });
  return make_kernel([n](In i, Out o) {
    return kernels::silu_backward(in_span<float>(i, 0, n), in_span<float>(i, 1, n), out_span<float>(o, 0, n), n);
  });
}

// cast: f32 <-> bf16 through kernels/convert.h, f32 -> f32 a copy; other pairs use the reference.
Prepared prepare_cast(const Node& node, std::span<const TensorType> in, std::span<const TensorType> out) {
  const DType from = in[0].dtype, to = out[0].dtype;
  const int64_t n = out[0].shape.numel();
  if (in.size() > 1) {  // NOTE [stochastic cast]
    const uint64_t stream = uint64_t(node.attrs.i_or("stream", 0));
    return make_kernel([n, to, stream](In i, Out o) {
      const int64_t seed = *static_cast<const int64_t*>(i[1]);
      ASPEN_RETURN_IF_ERROR(check_seed(double(seed)));
      const auto x = in_span<float>(i, 0, n);
      if (to == DType::bf16)
        return seed < 0 ? kernels::convert_f32_to_bf16(x, out_span<bf16>(o, 0, n), n)
                        : kernels::convert_f32_to_bf16_stochastic(x, out_span<bf16>(o, 0, n), n, uint64_t(seed), stream, 0);
      return seed < 0 ? kernels::convert_f32_to_f16(x, out_span<f16>(o, 0, n), n)
                      : kernels::convert_f32_to_f16_stochastic(x, out_span<f16>(o, 0, n), n, uint64_t(seed), stream, 0);
    });
  }
  if (from == DType::f32 && to == DType::bf16)
    return make_kernel([n](In i, Out o) {
      return kernels::convert_f32_to_bf16(in_span<float>(i, 0, n), out_span<bf16>(o, 0, n), n);
    });
  if (from == DType::bf16 && to == DType::f32)
    return make_kernel([n](In i, Out o) {
      return kernels::convert_bf16_to_f32(in_span<bf16>(i, 0, n), out_span<float>(o, 0, n), n);
    });
  if (from == DType::f32 && to == DType::f16)
    return make_kernel([n](In i, Out o) {
      return kernels::convert_f32_to_f16(in_span<float>(i, 0, n), out_span<f16>(o, 0, n), n);
    });
  if (from == DType::f16 && to == DType::f32)
    return make_kernel([n](In i, Out o) {
      return kernels::convert_f16_to_f32(in_span<f16>(i, 0, n), out_span<float>(o, 0, n), n);
    });
  if (from == DType::f32 && to == DType::f32)
    return make_kernel([n](In i, Out o) {
      if (n > 0 && i[0] != o[0]) std::memcpy(o[0], i[0], size_t(n) * sizeof(float));
      return Status();
    });
  if ((from == DType::u8 || from == DType::boolean) && to == DType::f32)  // masks into arithmetic: 0 or the byte's value
    return make_kernel([n](In i, Out o) {
      return kernels::convert_u8_to_f32(in_span<uint8_t>(i, 0, n), out_span<float>(o, 0, n), n);
    });
  return no_fast_kernel();
}

// Samples for the kernel sweep (graph/op_sample.h): an odd shape, one large enough to split into chunks
// (kernels/chunks.h), and bf16, which falls back to the reference.
const Shape kOdd{3, 5, 7}, kLarge{2, 130, 131};

// x = input "x" (and "y" for binary ops) of `dtype`, then the op.
void unary_samples(SampleList& s, OpKind op, Attrs attrs, SampleFeeds feeds = {}) {
  for (const Shape& shape : {kOdd, kLarge})
    s.add(
        "f32 " + shape.to_string(), [&](Builder& b) { b.op(op, {b.input("x", DType::f32, shape)}, attrs); }, feeds);
  s.add(
       "bf16", [&](Builder& b) { b.op(op, {b.input("x", DType::bf16, kOdd)}, attrs); }, feeds)
      .fast = false;
}
void binary_samples(SampleList& s, OpKind op, Attrs attrs = {}, SampleFeeds feeds = {}) {
  for (const Shape& shape : {kOdd, kLarge})
    s.add(
        "f32 " + shape.to_string(),
        [&](Builder& b) {
          b.op(op, {b.input("x", DType::f32, shape), b.input("y", DType::f32, shape)}, attrs);
        },
        feeds);
  s.add(
       "bf16",
       [&](Builder& b) {
         b.op(op, {b.input("x", DType::bf16, kOdd), b.input("y", DType::bf16, kOdd)}, attrs);
       },
       feeds)
      .fast = false;
}

void samples_add(SampleList& s) {
  binary_samples(s, OpKind::add);
  s.add("i32", [](Builder& b) { b.add(b.input("x", DType::i32, kOdd), b.input("y", DType::i32, kOdd)); },
        {.ranges = {{"x", {-1e9, 1e9}}, {"y", {-1e9, 1e9}}}});
}
void samples_sub(SampleList& s) { binary_samples(s, OpKind::sub); }
void samples_mul(SampleList& s) { binary_samples(s, OpKind::mul); }
void samples_div(SampleList& s) {
  binary_samples(s, OpKind::div, {}, {.ranges = {{"y", {0.5, 3.0}}}});
  binary_samples(s, OpKind::div, {}, {.ranges = {{"y", {-3.0, -0.5}}}});
}
void samples_scale(SampleList& s) { unary_samples(s, OpKind::scale, {{"alpha", -0.37}}); }
void samples_neg(SampleList& s) { unary_samples(s, OpKind::neg, {}); }
void samples_exp(SampleList& s) { unary_samples(s, OpKind::exp, {}, {.lo = -30.0, .hi = 30.0}); }
void samples_tanh(SampleList& s) { unary_samples(s, OpKind::tanh, {}, {.lo = -6.0, .hi = 6.0}); }
void samples_sqrt(SampleList& s) { unary_samples(s, OpKind::sqrt, {}, {.lo = 0.0, .hi = 9.0}); }
void samples_silu(SampleList& s) { unary_samples(s, OpKind::silu, {}, {.lo = -8.0, .hi = 8.0}); }
void samples_gelu(SampleList& s) {
  for (int64_t tanh_form : {1, 0}) unary_samples(s, OpKind::gelu, {{"tanh", tanh_form}}, {.lo = -5.0, .hi = 5.0});
}
void samples_silu_grad(SampleList& s) { binary_samples(s, OpKind::silu_grad, {}, {.lo = -8.0, .hi = 8.0}); }
void samples_gelu_grad(SampleList& s) {
  for (int64_t tanh_form : {1, 0}) binary_samples(s, OpKind::gelu_grad, {{"tanh", tanh_form}}, {.lo = -5.0, .hi = 5.0});
}
void samples_relu(SampleList& s) { unary_samples(s, OpKind::relu, {}); }
void samples_relu_grad(SampleList& s) { binary_samples(s, OpKind::relu_grad); }
void samples_sigmoid(SampleList& s) { unary_samples(s, OpKind::sigmoid, {}, {.lo = -20.0, .hi = 20.0}); }
void samples_erf(SampleList& s) { unary_samples(s, OpKind::erf, {}, {.lo = -5.0, .hi = 5.0}); }
void samples_log(SampleList& s) { unary_samples(s, OpKind::log, {}, {.lo = 1e-3, .hi = 10.0}); }
void samples_sin(SampleList& s) { unary_samples(s, OpKind::sin, {}, {.lo = -10.0, .hi = 10.0}); }
void samples_cos(SampleList& s) { unary_samples(s, OpKind::cos, {}, {.lo = -10.0, .hi = 10.0}); }
// Rounding: values on a grid of quarters, so that halves (ties) and integers are drawn often.
void samples_rounding(SampleList& s, OpKind op) {
  unary_samples(s, op, {}, {.lo = -6.0, .hi = 6.0, .quantum = 0.25});
}
void samples_floor(SampleList& s) { samples_rounding(s, OpKind::floor); }
void samples_ceil(SampleList& s) { samples_rounding(s, OpKind::ceil); }
void samples_round(SampleList& s) { samples_rounding(s, OpKind::round); }
void samples_max(SampleList& s) { binary_samples(s, OpKind::max); }
void samples_min(SampleList& s) { binary_samples(s, OpKind::min); }
void samples_where(SampleList& s) {
  for (DType c : {DType::u8, DType::boolean})
    for (const Shape& shape : {kOdd, kLarge})
      s.add(std::string("condition ") + std::string(dtype_name(c)) + " " + shape.to_string(),
            [&](Builder& b) {
              b.where(b.input("c", c, shape), b.input("a", DType::f32, shape), b.input("b", DType::f32, shape));
            },
            {.int_hi = c == DType::u8 ? 6 : 2});  // u8: any nonzero byte is a truth
  s.add("bf16 values",
        [](Builder& b) {
          b.where(b.input("c", DType::u8, kOdd), b.input("a", DType::bf16, kOdd), b.input("b", DType::bf16, kOdd));
        },
        {.int_hi = 2})
      .fast = false;
}
void samples_cast(SampleList& s) {
  const std::pair<DType, DType> fast[] = {
      {DType::f32, DType::bf16}, {DType::bf16, DType::f32}, {DType::f32, DType::f16},    {DType::f16, DType::f32},
      {DType::f32, DType::f32},  {DType::u8, DType::f32},   {DType::boolean, DType::f32}};
  for (const auto& [from, to] : fast)
    for (const Shape& shape : {kOdd, kLarge})
      s.add(std::string(dtype_name(from)) + " to " + std::string(dtype_name(to)) + " " + shape.to_string(),
            [&](Builder& b) { b.cast(b.input("x", from, shape), to); }, {.lo = -300.0, .hi = 300.0, .int_hi = 3});
  // Stochastic rounding (NOTE [stochastic cast]): the fast kernels draw the reference's bits; -1 rounds to nearest.
  for (DType to : {DType::bf16, DType::f16})
    for (double seed : {987654321.0, -1.0})
      s.add("f32 to " + std::string(dtype_name(to)) + " stochastic, seed " + std::to_string(int64_t(seed)),
            [&](Builder& b) {
              b.op1(OpKind::cast, {b.input("x", DType::f32, kLarge), b.input("seed", DType::i64, Shape{1})},
                    {{"dtype", int64_t(to)}, {"stream", int64_t(77)}});
            },
            {.lo = -300.0, .hi = 300.0, .values = {{"seed", {seed}}}});
  s.add("i32 to f32", [](Builder& b) { b.cast(b.input("x", DType::i32, kOdd), DType::f32); }).fast = false;
  s.add("bf16 to f16", [](Builder& b) { b.cast(b.input("x", DType::bf16, kOdd), DType::f16); }).fast = false;
}

}  // namespace

void register_elementwise_ops(OpTable& t) {
  t.define(OpKind::add, {.flags = kElementwise,
                         .min_inputs = 2,
                         .max_inputs = 2,
                         .infer = infer_binary,
                         .grad = grad_add,
                         .eval = [](const Node&, auto in, auto out) { return map2(in, out, std::plus<double>()); },
                         .prepare = prepare_add,
                         .samples = samples_add});
  t.define(OpKind::sub, {.flags = kElementwise,
                         .min_inputs = 2,
                         .max_inputs = 2,
                         .infer = infer_binary,
                         .grad = grad_sub,
                         .eval = [](const Node&, auto in, auto out) { return map2(in, out, std::minus<double>()); },
                         .prepare = prepare_binary<kernels::sub_forward>,
                         .samples = samples_sub});
  t.define(OpKind::mul,
           {.flags = kElementwise,
            .min_inputs = 2,
            .max_inputs = 2,
            .infer = infer_binary,
            .grad = grad_mul,
            .eval = [](const Node&, auto in, auto out) { return map2(in, out, std::multiplies<double>()); },
            .prepare = prepare_binary<kernels::mul_forward>,
            .samples = samples_mul});
  t.define(OpKind::scale, {.flags = kElementwise,
                           .min_inputs = 1,
                           .max_inputs = 1,
                           .attrs = {{"alpha", AttrKind::f64, true}},
                           .infer = infer_unary_float,
                           .grad = grad_scale,
                           .eval =
                               [](const Node& n, auto in, auto out) {
                                 const double a = n.attrs.f("alpha");
                                 return map1(in, out, [a](double x) { return a * x; });
                               },
                           .prepare = prepare_scale,
                           .samples = samples_scale});
  t.define(OpKind::neg, {.flags = kElementwise,
                         .min_inputs = 1,
                         .max_inputs = 1,
                         .infer = infer_unary_numeric,
                         .grad = grad_neg,
                         .eval = [](const Node&, auto in, auto out) { return map1(in, out, std::negate<double>()); },
                         .prepare = prepare_neg,
                         .samples = samples_neg});
  t.define(OpKind::exp,
           {.flags = kElementwise,
            .min_inputs = 1,
            .max_inputs = 1,
            .infer = infer_unary_float,
            .grad = grad_exp,
            .eval = [](const Node&, auto in, auto out) { return map1(in, out, [](double x) { return std::exp(x); }); },
            .prepare = prepare_unary<kernels::exp_forward>,
            .samples = samples_exp});
  t.define(OpKind::tanh,
           {.flags = kElementwise,
            .min_inputs = 1,
            .max_inputs = 1,
            .infer = infer_unary_float,
            .grad = grad_tanh,
            .eval = [](const Node&, auto in, auto out) { return map1(in, out, [](double x) { return std::tanh(x); }); },
            .prepare = prepare_unary<kernels::tanh_forward>,
            .samples = samples_tanh});
  t.define(OpKind::sqrt,
           {.flags = kElementwise,
            .min_inputs = 1,
            .max_inputs = 1,
            .infer = infer_unary_float,
            .grad = grad_sqrt,
            .eval = [](const Node&, auto in, auto out) { return map1(in, out, [](double x) { return std::sqrt(x); }); },
            .prepare = prepare_unary<kernels::sqrt_forward>,
            .samples = samples_sqrt});
  t.define(OpKind::div, {.flags = kElementwise,
                         .min_inputs = 2,
                         .max_inputs = 2,
                         .infer = infer_binary_float,
                         .grad = grad_div,
                         .eval = [](const Node&, auto in, auto out) { return map2(in, out, std::divides<double>()); },
                         .prepare = prepare_binary<kernels::div_forward>,
                         .samples = samples_div});
  t.define(OpKind::gelu, {.flags = kElementwise,
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .attrs = {{"tanh", AttrKind::i64, false}},
                          .infer = infer_unary_float,
                          .grad = grad_gelu,
                          .eval =
                              [](const Node& n, auto in, auto out) {
                                kernels::ref::gelu_forward<double>(in[0]->data.data(), out[0].data.data(),
                                                                   in[0]->numel(), gelu_kind(n));
                                return Status();
                              },
                          .prepare = prepare_gelu,
                          .samples = samples_gelu});
  t.define(OpKind::silu, {.flags = kElementwise,
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .infer = infer_unary_float,
                          .grad = grad_silu,
                          .eval =
                              [](const Node&, auto in, auto out) {
                                kernels::ref::silu_forward<double>(in[0]->data.data(), out[0].data.data(),
                                                                   in[0]->numel());
                                return Status();
                              },
                          .prepare = prepare_silu,
                          .samples = samples_silu});
  t.define(OpKind::where, {.min_inputs = 3,
                           .max_inputs = 3,
                           .infer = infer_where,
                           .grad = grad_where,
                           .eval =
                               [](const Node&, auto in, auto out) {
                                 for (size_t i = 0; i < out[0].data.size(); ++i)
                                   out[0].data[i] = in[0]->data[i] != 0 ? in[1]->data[i] : in[2]->data[i];
                                 return Status();
                               },
                           .prepare = prepare_where,
                           .samples = samples_where});
  t.define(OpKind::cast, {.min_inputs = 1,
                          .max_inputs = 2,
                          .attrs = {{"dtype", AttrKind::i64, true}, {"stream", AttrKind::i64, false}},
                          .infer = infer_cast,
                          .grad = grad_cast,
                          .eval =
                              [](const Node& n, auto in, auto out) {
                                if (in.size() > 1) {  // NOTE [stochastic cast]
                                  ASPEN_RETURN_IF_ERROR(check_seed(in[1]->data[0]));
                                  const int64_t seed = int64_t(in[1]->data[0]);
                                  const uint64_t stream = uint64_t(n.attrs.i_or("stream", 0));
                                  for (size_t i = 0; i < out[0].data.size(); ++i)
                                    out[0].data[i] =
                                        stochastic_round(out[0].type.dtype, in[0]->data[i], seed, stream, i);
                                  return Status();
                                }
                                for (size_t i = 0; i < out[0].data.size(); ++i)
                                  out[0].data[i] = round_to(out[0].type.dtype, in[0]->data[i]);
                                return Status();
                              },
                          .prepare = prepare_cast,
                          .samples = samples_cast});
  t.define(OpKind::gelu_grad, {.flags = kElementwise,
                               .min_inputs = 2,
                               .max_inputs = 2,
                               .attrs = {{"tanh", AttrKind::i64, false}},
                               .infer = infer_unary_grad,
                               .eval =
                                   [](const Node& n, auto in, auto out) {
                                     kernels::ref::gelu_backward<double>(in[0]->data.data(), in[1]->data.data(),
                                                                         out[0].data.data(), in[0]->numel(),
                                                                         gelu_kind(n));
                                     return Status();
                                   },
                               .prepare = prepare_gelu,
                               .samples = samples_gelu_grad});
  t.define(OpKind::silu_grad, {.flags = kElementwise,
                               .min_inputs = 2,
                               .max_inputs = 2,
                               .infer = infer_unary_grad,
                               .eval =
                                   [](const Node&, auto in, auto out) {
                                     kernels::ref::silu_backward<double>(in[0]->data.data(), in[1]->data.data(),
                                                                         out[0].data.data(), in[0]->numel());
                                     return Status();
                                   },
                               .prepare = prepare_silu,
                               .samples = samples_silu_grad});
  t.define(OpKind::relu, {.flags = kElementwise,
                          .min_inputs = 1,
                          .max_inputs = 1,
                          .infer = infer_unary_float,
                          .grad = grad_relu,
                          .eval =
                              [](const Node&, auto in, auto out) {
                                kernels::ref::relu_forward<double>(in[0]->data.data(), out[0].data.data(),
                                                                   in[0]->numel());
                                return Status();
                              },
                          .prepare = prepare_unary<kernels::relu_forward>,
                          .samples = samples_relu});
  t.define(OpKind::relu_grad, {.flags = kElementwise,
                               .min_inputs = 2,
                               .max_inputs = 2,
                               .infer = infer_unary_grad,
                               .eval =
                                   [](const Node&, auto in, auto out) {
                                     kernels::ref::relu_backward<double>(in[0]->data.data(), in[1]->data.data(),
                                                                         out[0].data.data(), in[0]->numel());
                                     return Status();
                                   },
                               .prepare = prepare_binary<kernels::relu_backward>,
                               .samples = samples_relu_grad});
  t.define(OpKind::sigmoid, {.flags = kElementwise,
                             .min_inputs = 1,
                             .max_inputs = 1,
                             .infer = infer_unary_float,
                             .grad = grad_sigmoid,
                             .eval =
                                 [](const Node&, auto in, auto out) {
                                   kernels::ref::sigmoid_forward<double>(in[0]->data.data(), out[0].data.data(),
                                                                         in[0]->numel());
                                   return Status();
                                 },
                             .prepare = prepare_unary<kernels::sigmoid_forward>,
                             .samples = samples_sigmoid});
  t.define(OpKind::erf,
           {.flags = kElementwise,
            .min_inputs = 1,
            .max_inputs = 1,
            .infer = infer_unary_float,
            .grad = grad_erf,
            .eval = [](const Node&, auto in, auto out) { return map1(in, out, [](double x) { return std::erf(x); }); },
            .prepare = prepare_unary<kernels::erf_forward>,
            .samples = samples_erf});
  t.define(OpKind::log,
           {.flags = kElementwise,
            .min_inputs = 1,
            .max_inputs = 1,
            .infer = infer_unary_float,
            .grad = grad_log,
            .eval = [](const Node&, auto in, auto out) { return map1(in, out, [](double x) { return std::log(x); }); },
            .prepare = prepare_unary<kernels::log_forward>,
            .samples = samples_log});
  struct Unary {
    OpKind op;
    GradFn grad;
    EvalFn eval;
    PrepareFn prepare;
    SampleFn samples;
  };
  for (const Unary& u : {Unary{OpKind::sin, grad_sin, eval_map<sin_d>, prepare_unary<kernels::sin_forward>, samples_sin},
                         Unary{OpKind::cos, grad_cos, eval_map<cos_d>, prepare_unary<kernels::cos_forward>, samples_cos},
                         Unary{OpKind::floor, no_grad, eval_map<floor_d>, prepare_unary<kernels::floor_forward>,
                               samples_floor},
                         Unary{OpKind::ceil, no_grad, eval_map<ceil_d>, prepare_unary<kernels::ceil_forward>,
                               samples_ceil},
                         Unary{OpKind::round, no_grad, eval_map<round_d>, prepare_unary<kernels::round_forward>,
                               samples_round}})
    t.define(u.op, {.flags = kElementwise,
                    .min_inputs = 1,
                    .max_inputs = 1,
                    .infer = infer_unary_float,
                    .grad = u.grad,
                    .eval = u.eval,
                    .prepare = u.prepare,
                    .samples = u.samples});
  t.define(OpKind::max, {.flags = kElementwise,
                         .min_inputs = 2,
                         .max_inputs = 2,
                         .infer = infer_binary,
                         .grad = grad_max_min,
                         .eval =
                             [](const Node&, auto in, auto out) {
                               kernels::ref::max_forward<double>(in[0]->data.data(), in[1]->data.data(),
                                                                 out[0].data.data(), in[0]->numel());
                               return Status();
                             },
                         .prepare = prepare_binary<kernels::max_forward>,
                         .samples = samples_max});
  t.define(OpKind::min, {.flags = kElementwise,
                         .min_inputs = 2,
                         .max_inputs = 2,
                         .infer = infer_binary,
                         .grad = grad_max_min,
                         .eval =
                             [](const Node&, auto in, auto out) {
                               kernels::ref::min_forward<double>(in[0]->data.data(), in[1]->data.data(),
                                                                 out[0].data.data(), in[0]->numel());
                               return Status();
                             },
                         .prepare = prepare_binary<kernels::min_forward>,
                         .samples = samples_min});
}

}  // namespace aspen::graph
