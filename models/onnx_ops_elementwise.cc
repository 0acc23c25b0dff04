// models/onnx_ops_elementwise.cc: the ONNX importer's conversions of elementwise ops: arithmetic, comparisons, logic, activations, casts
// (the converter table and the shared helpers: models/onnx_ops.h, onnx_ops.cc).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "graph/interpreter.h"
#include "models/onnx_import.h"
#include "models/onnx_ops.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

graph::ValueId abs_of(Ctx& c, graph::ValueId x) { return c.b.op1(OpKind::max, {x, c.b.neg(x)}); }

namespace {

// ---- elementwise conversions --------------------------------------------------------------------------

Status convert_identity(Ctx&, std::vector<Value>& in, std::vector<Value>& out) {
  out = {in[0]};
  return Status();
}

Status convert_reciprocal(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const Value one = filled(c, 1.0, in[0].type.dtype, in[0].type.shape);
  out = {c.wrap(c.b.div(c.id(one), c.id(in[0])))};
  return c.b.status();
}


Status convert_abs(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  out = {c.wrap(abs_of(c, c.id(in[0])))};
  return c.b.status();
}

// x^y for float x and an exponent tensor (or a scalar the table below does not cover), as C's pow:
// |x|^y = exp(y log|x|), negative x times (-1)^y at an integer y and NaN at another, 1 at y = 0 (also for
// x = 0 or NaN... as pow(x, 0) is 1). x and y broadcast; y of another type is cast to x's.
ValueId general_pow(Ctx& c, ValueId x, ValueId y, const TensorType& t) {
  auto k = [&](double v) { return c.id(filled(c, v, t.dtype, t.shape)); };
  const ValueId a = abs_of(c, x);
  const ValueId p = c.b.exp(c.b.mul(y, c.b.op1(OpKind::log, {a})));
  const ValueId fy = c.b.op1(OpKind::floor, {y});
  const ValueId is_int = c.b.op1(OpKind::equal, {fy, y});
  const ValueId half_floor = c.b.op1(OpKind::floor, {c.b.scale(y, 0.5)});
  const ValueId odd = c.b.op1(OpKind::equal, {c.b.sub(y, c.b.scale(half_floor, 2.0)), k(1.0)});
  const ValueId negative = c.b.where(is_int, c.b.where(odd, c.b.neg(p), p), k(std::nan("")));
  const ValueId r = c.b.where(c.b.op1(OpKind::less, {x, k(0.0)}), negative, p);
  return c.b.where(c.b.op1(OpKind::equal, {y, k(0.0)}), k(1.0), r);
}

Status convert_pow(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const DType xt = in[0].type.dtype;
  if (xt == DType::i32 || xt == DType::i64) {
    // An integer base: computed in f32 and rounded back (exact while |x^y| < 2^24; integer exponents).
    ASPEN_ASSIGN_OR_RETURN(const Shape s, broadcast_shape(c, {in[0].type.shape, in[1].type.shape}));
    const TensorType t{DType::f32, s};
    ValueId x = c.b.cast(c.id(to_shape(c, in[0], s)), DType::f32), y = c.id(to_shape(c, in[1], s));
    if (in[1].type.dtype != DType::f32) y = c.b.cast(y, DType::f32);
    out = {c.wrap(c.b.cast(c.b.op1(OpKind::round, {general_pow(c, x, y, t)}), xt))};
    return c.b.status();
  }
  if (!is_float(xt))
    return c.unsupported("input 'X'", "a float or integer type", std::string(dtype_name(xt)));
  if (!in[1].readable() || in[1].type.shape.numel() != 1) {  // an exponent tensor
    ASPEN_ASSIGN_OR_RETURN(const Shape s, broadcast_shape(c, {in[0].type.shape, in[1].type.shape}));
    const TensorType t{in[0].type.dtype, s};
    ValueId y = c.id(to_shape(c, in[1], s));
    if (in[1].type.dtype != t.dtype) y = c.b.cast(y, t.dtype);
    out = {c.wrap(general_pow(c, c.id(to_shape(c, in[0], s)), y, t))};
    return c.b.status();
  }
  ASPEN_ASSIGN_OR_RETURN(const double y, c.scalar(in[1], "input 'Y' (the exponent)"));
  const ValueId x = c.id(in[0]);
  ValueId r;
  if (y == 1.0) {
    r = x;
  } else if (y == 2.0) {
    r = c.b.mul(x, x);
  } else if (y == 3.0) {
    r = c.b.mul(c.b.mul(x, x), x);
  } else if (y == 4.0) {
    const ValueId s = c.b.mul(x, x);
    r = c.b.mul(s, s);
  } else if (y == 0.5) {
    r = c.b.sqrt(x);
  } else if (y == -1.0) {
    r = c.id(filled(c, 1.0, in[0].type.dtype, in[0].type.shape));
    r = c.b.div(r, x);
  } else if (y == -0.5) {
    r = c.b.div(c.id(filled(c, 1.0, in[0].type.dtype, in[0].type.shape)), c.b.sqrt(x));
  } else if (y == 0.0) {
    r = c.id(filled(c, 1.0, in[0].type.dtype, in[0].type.shape));
  } else if (y == std::floor(y)) {  // another integer exponent: a negative base keeps its sign rule
    r = general_pow(c, x, c.id(filled(c, y, in[0].type.dtype, in[0].type.shape)), in[0].type);
  } else {
    r = c.b.exp(c.b.scale(c.b.op1(OpKind::log, {x}), y));
  }
  out = {c.wrap(r)};
  return c.b.status();
}

Status convert_gelu(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const io::OnnxAttribute* a = c.node.find("approximate");
  if (a && a->type != io::OnnxAttrType::s)
    return c.error("attribute 'approximate'", "type STRING", io::onnx_attr_type_name(a->type));
  const std::string approx = a ? a->s : std::string("none");
  if (approx != "none" && approx != "tanh")
    return c.error("attribute 'approximate'", "'none' or 'tanh'", "'" + approx + "'");
  out = {c.wrap(c.b.gelu(c.id(in[0]), approx == "tanh"))};
  return c.b.status();
}

Status convert_where(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (in[0].type.dtype != DType::boolean)
    return c.error("input 'condition'", "bool", std::string(dtype_name(in[0].type.dtype)));
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in, 1));
  ASPEN_ASSIGN_OR_RETURN(std::vector<Value> x, broadcast_all(c, in));
  out = {c.wrap(c.b.where(c.id(x[0]), c.id(x[1]), c.id(x[2])))};
  return c.b.status();
}

// Trilu(x [..., N, M][, k]) {upper = 1}: x where column - row >= k (upper) or <= k (lower), else 0; the
// causal masks exporters write (torch's scaled_dot_product_attention with is_causal). k must be known at
// import; the mask is a constant.
Status convert_trilu(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t upper, c.attr_i("upper", 1));
  int64_t k = 0;
  if (in.size() > 1 && in[1].present()) {
    ASPEN_ASSIGN_OR_RETURN(const double kd, c.scalar(in[1], "input 'k'"));
    k = int64_t(kd);
  }
  const std::vector<int64_t> d = dims(in[0].type.shape);
  if (d.size() < 2) return c.error("input 'input'", "a tensor of rank >= 2", in[0].type.to_string());
  const int64_t N = d[d.size() - 2], M = d[d.size() - 1];
  Tensor mask(DType::boolean, Shape{N, M});
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < M; ++j) m[i * M + j] = upper ? j - i >= k : j - i <= k;
  const ValueId cond = c.b.broadcast(c.b.constant(std::move(mask)), d);
  out = {c.wrap(c.b.where(cond, c.id(in[0]), c.id(filled(c, 0.0, in[0].type.dtype, in[0].type.shape))))};
  return c.b.status();
}

Status convert_clip(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ValueId x = c.id(in[0]);
  const TensorType t = in[0].type;
  for (size_t k = 1; k < 3; ++k) {
    if (k >= in.size() || !in[k].present()) continue;
    ASPEN_ASSIGN_OR_RETURN(const double bound, c.scalar(in[k], k == 1 ? "input 'min'" : "input 'max'"));
    x = c.b.op1(k == 1 ? OpKind::max : OpKind::min, {x, c.id(filled(c, bound, t.dtype, t.shape))});
  }
  out = {c.wrap(x)};
  return c.b.status();
}

Status convert_cast(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t to, c.attr_i("to"));
  const std::optional<DType> dt = dtype_of_onnx(int32_t(to));
  if (!dt) return c.unsupported("attribute 'to'", kAspenTypes, io::onnx_type_name(int32_t(to)));
  out = {in[0].type.dtype == *dt ? in[0] : c.wrap(c.b.cast(c.id(in[0]), *dt))};
  return c.b.status();
}

Status convert_cast_like(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  const DType dt = in[1].type.dtype;
  out = {in[0].type.dtype == dt ? in[0] : c.wrap(c.b.cast(c.id(in[0]), dt))};
  return c.b.status();
}

// A known tensor's values broadcast (numpy rules) to `to`, as doubles.
std::vector<double> broadcast_values(const Tensor& t, const Shape& to) {
  const graph::HostArray a = graph::HostArray::from_tensor(t);
  const Shape& from = t.shape();
  std::vector<double> out(size_t(to.numel()));
  const int lead = to.rank() - from.rank();
  for (int64_t i = 0; i < to.numel(); ++i) {
    int64_t rem = i, src = 0;
    for (int d = to.rank() - 1; d >= 0; --d) {
      const int64_t coord = rem % to[d];
      rem /= to[d];
      const int fd = d - lead;
      if (fd >= 0 && from[fd] != 1) src += coord * from.stride(fd);
    }
    out[size_t(i)] = a.data[size_t(src)];
  }
  return out;
}

// Known operands of an op the IR has no op for (integer Div and Mod): computed here, with broadcasting.
template <class F>
Status known_binary(Ctx& c, std::vector<Value>& in, std::vector<Value>& out, F f) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  ASPEN_ASSIGN_OR_RETURN(const Shape to, broadcast_shape(c, {in[0].type.shape, in[1].type.shape}));
  const std::vector<double> a = broadcast_values(*in[0].constant, to), b = broadcast_values(*in[1].constant, to);
  graph::HostArray y(TensorType{in[0].type.dtype, to});
  for (size_t i = 0; i < a.size(); ++i) {
    ASPEN_ASSIGN_OR_RETURN(y.data[i], f(a[i], b[i]));
  }
  out = {Ctx::constant(y.to_tensor())};
  return Status();
}


// Mod: fmod 0 takes the divisor's sign (Python's %; integers only, as ONNX requires), fmod 1 the
// dividend's (C's fmod). Known operands only (shape arithmetic).
Status convert_mod(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t fmod, c.attr_i("fmod", 0));
  if (!in[0].known() || !in[1].known())
    return c.unsupported("inputs", "values known when the model is imported", "ones computed from the graph's inputs");
  if (!fmod && is_float(in[0].type.dtype)) return c.error("attribute 'fmod'", "1 for float inputs", "0");
  return known_binary(c, in, out, [&](double a, double b) -> Result<double> {
    if (b == 0 && !fmod) return c.error("input 'B'", "no zero divisor", "0");
    double m = std::fmod(a, b);
    if (!fmod && m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
  });
}

// Div: the IR's div for float types; integers (shape arithmetic) truncate toward zero, known only.
Status convert_div(Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
  if (is_float(in[0].type.dtype)) return elementwise(c, OpKind::div, in, out);
  if (!in[0].known() || !in[1].known())
    return c.unsupported("inputs", "float types, or integers known when the model is imported",
                         std::string(dtype_name(in[0].type.dtype)) + " computed from the graph's inputs");
  return known_binary(c, in, out, [&](double a, double b) -> Result<double> {
    if (b == 0) return c.error("input 'B'", "no zero divisor", "0");
    return std::trunc(a / b);
  });
}

// ---- activations, decomposed exactly into the IR's ops (autodiff then differentiates them) -------------
// The exponential of the negative part only, exp(min(x, 0)), so that a large positive x neither overflows
// the forward value nor makes the backward 0 * inf.

struct Act {
  Ctx& c;
  TensorType t;
  ValueId x;
  ValueId k(double v) { return c.id(filled(c, v, t.dtype, t.shape)); }
  ValueId max(ValueId a, ValueId b) { return c.b.op1(OpKind::max, {a, b}); }
  ValueId min(ValueId a, ValueId b) { return c.b.op1(OpKind::min, {a, b}); }
  ValueId pos() { return max(x, k(0)); }
  ValueId neg() { return min(x, k(0)); }
  ValueId abs() { return abs_of(c, x); }
  // alpha (exp(min(x, 0) / alpha') - 1): Elu, Selu (alpha' = 1) and Celu (alpha' = alpha).
  ValueId exp_neg(double alpha, double divide_by) {
    return c.b.scale(c.b.sub(c.b.exp(c.b.scale(neg(), 1.0 / divide_by)), k(1)), alpha);
  }
  // max(x, 0) + log(1 + exp(-|x|)): log(1 + e^x) without overflow.
  ValueId softplus() {
    return c.b.add(pos(), c.b.op1(OpKind::log, {c.b.add(k(1), c.b.exp(c.b.neg(abs())))}));
  }
  ValueId hard_sigmoid(double alpha, double beta) {
    return max(k(0), min(k(1), c.b.add(c.b.scale(x, alpha), k(beta))));
  }
};

template <class F>
Converter activation(F body) {
  return [body](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) -> Status {
    const TensorType t = in[0].type;
    if (!is_float(t.dtype))
      return c.error("input 0", "a float tensor", std::string(dtype_name(t.dtype)));
    Act a{c, t, c.id(in[0])};
    ASPEN_ASSIGN_OR_RETURN(const ValueId y, body(c, a, in));
    out = {c.wrap(y)};
    return c.b.status();
  };
}

void add_activations(ConverterTable& t) {
  using R = Result<ValueId>;
  using In = std::vector<Value>&;
  add_converter(t, "LeakyRelu", activation([](Ctx& c, Act& a, In) -> R {
                  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 0.01f));
                  return c.b.add(a.pos(), c.b.scale(a.neg(), alpha));
                }), 1, 1);
  add_converter(t, "PRelu", activation([](Ctx& c, Act& a, In in) -> R {  // slope broadcast to x
                  if (in[1].type.dtype != a.t.dtype)
                    return c.error("input 'slope'", std::string(dtype_name(a.t.dtype)) + " (X's type)",
                                   std::string(dtype_name(in[1].type.dtype)));
                  ASPEN_ASSIGN_OR_RETURN(const Shape s, broadcast_shape(c, {a.t.shape, in[1].type.shape}));
                  if (s != a.t.shape)
                    return c.error("input 'slope'", "a shape that broadcasts to X's " + a.t.shape.to_string(),
                                   in[1].type.shape.to_string());
                  return c.b.add(a.pos(), c.b.mul(c.id(to_shape(c, in[1], s)), a.neg()));
                }), 2, 2);
  add_converter(t, "Elu", activation([](Ctx& c, Act& a, In) -> R {
                  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 1.0f));
                  return c.b.add(a.pos(), a.exp_neg(alpha, 1.0));
                }), 1, 1);
  add_converter(t, "Selu", activation([](Ctx& c, Act& a, In) -> R {
                  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 1.67326319217681884765625f));
                  ASPEN_ASSIGN_OR_RETURN(const float gamma, c.attr_f("gamma", 1.05070102214813232421875f));
                  return c.b.scale(c.b.add(a.pos(), a.exp_neg(alpha, 1.0)), gamma);
                }), 1, 1);
  add_converter(t, "Celu", activation([](Ctx& c, Act& a, In) -> R {
                  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 1.0f));
                  if (!(alpha != 0.0f)) return c.error("attribute 'alpha'", "non-zero", "0");
                  return c.b.add(a.pos(), a.exp_neg(alpha, alpha));
                }), 1, 1);
  add_converter(t, "ThresholdedRelu", activation([](Ctx& c, Act& a, In) -> R {
                  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 1.0f));
                  return c.b.where(c.b.op1(OpKind::greater, {a.x, a.k(alpha)}), a.x, a.k(0));
                }), 1, 1);
  add_converter(t, "HardSigmoid", activation([](Ctx& c, Act& a, In) -> R {
                  ASPEN_ASSIGN_OR_RETURN(const float alpha, c.attr_f("alpha", 0.2f));
                  ASPEN_ASSIGN_OR_RETURN(const float beta, c.attr_f("beta", 0.5f));
                  return a.hard_sigmoid(alpha, beta);
                }), 1, 1);
  add_converter(t, "HardSwish", activation([](Ctx& c, Act& a, In) -> R {
                  return c.b.mul(a.x, a.hard_sigmoid(1.0 / 6.0, 0.5));
                }), 1, 1);
  add_converter(t, "Softplus", activation([](Ctx&, Act& a, In) -> R { return a.softplus(); }), 1, 1);
  add_converter(t, "Softsign", activation([](Ctx& c, Act& a, In) -> R {
                  return c.b.div(a.x, c.b.add(a.k(1), a.abs()));
                }), 1, 1);
  add_converter(t, "Mish", activation([](Ctx& c, Act& a, In) -> R { return c.b.mul(a.x, c.b.tanh(a.softplus())); }),
                1, 1);
}

}  // namespace

void add_elementwise_converters(ConverterTable& t) {
  add_activations(t);
  add_converter(t, "Sin", unary(OpKind::sin), 1, 1);
  add_converter(t, "Cos", unary(OpKind::cos), 1, 1);
  add_converter(t, "Floor", unary(OpKind::floor), 1, 1);
  add_converter(t, "Ceil", unary(OpKind::ceil), 1, 1);
  add_converter(t, "Round", unary(OpKind::round), 1, 1);
  add_converter(t, "Identity", convert_identity, 1, 1);
  add_converter(t, "Neg", unary(OpKind::neg), 1, 1);
  add_converter(t, "Exp", unary(OpKind::exp), 1, 1);
  add_converter(t, "Log", unary(OpKind::log), 1, 1);
  add_converter(t, "Tanh", unary(OpKind::tanh), 1, 1);
  add_converter(t, "Sqrt", unary(OpKind::sqrt), 1, 1);
  add_converter(t, "Relu", unary(OpKind::relu), 1, 1);
  add_converter(t, "Sigmoid", unary(OpKind::sigmoid), 1, 1);
  add_converter(t, "Erf", unary(OpKind::erf), 1, 1);
  add_converter(t, "Not", unary(OpKind::logical_not), 1, 1);
  add_converter(t, "IsNaN", unary(OpKind::is_nan), 1, 1);
  add_converter(t, "Reciprocal", convert_reciprocal, 1, 1);
  add_converter(t, "Abs", convert_abs, 1, 1);
  add_converter(t, "Gelu", convert_gelu, 1, 1);
  add_converter(t, "Add", binary(OpKind::add), 2, 2);
  add_converter(t, "Sub", binary(OpKind::sub), 2, 2);
  add_converter(t, "Mul", binary(OpKind::mul), 2, 2);
  add_converter(t, "Div", convert_div, 2, 2);
  add_converter(t, "Pow", convert_pow, 2, 2);
  add_converter(t, "Equal", binary(OpKind::equal), 2, 2);
  add_converter(t, "Less", binary(OpKind::less), 2, 2);
  add_converter(t, "Greater", binary(OpKind::greater), 2, 2);
  add_converter(t, "LessOrEqual", negated(OpKind::greater), 2, 2);
  add_converter(t, "GreaterOrEqual", negated(OpKind::less), 2, 2);
  add_converter(t, "And", binary(OpKind::logical_and), 2, 2);
  add_converter(t, "Or", binary(OpKind::logical_or), 2, 2);
  add_converter(t, "Max", variadic(OpKind::max), 1, -1);
  add_converter(t, "Min", variadic(OpKind::min), 1, -1);
  add_converter(t, "Sum", variadic(OpKind::add), 1, -1);
  add_converter(t, "Mean", variadic(OpKind::add, true), 1, -1);
  add_converter(t, "Where", convert_where, 3, 3);
  add_converter(t, "Trilu", convert_trilu, 1, 2);
  add_converter(t, "Clip", convert_clip, 1, 3);
  add_converter(t, "Cast", convert_cast, 1, 1);
  add_converter(t, "CastLike", convert_cast_like, 2, 2);
  add_converter(t, "Mod", convert_mod, 2, 2);
}

}  // namespace aspen::models::onnx
