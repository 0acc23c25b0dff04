// models/onnx_ops.cc: the ONNX importer's conversion context, the helpers the conversion files share and
// the converter table. The conversions, one per op type of the default domain, live by op group in
// onnx_ops_elementwise.cc, onnx_ops_shape.cc and onnx_ops_nn.cc, opsets 13 to 21 (the semantics of the
// latest version of each op; where an op changed between these opsets, as ReduceMean's axes moving from
// an attribute to an input at 18, both forms are read).
//
// Numpy broadcasting becomes explicit broadcast ops; ops the IR has no op for are decomposed exactly:
//   Reciprocal: 1 / x          Abs: max(x, -x)          Pow with a known exponent: products, sqrt, 1/x,
//   or exp(y log x) (NaN for x < 0, as C's pow at a non-integer exponent)
//   LessOrEqual: not(greater)  GreaterOrEqual: not(less)  Clip: max/min with its bounds
//   LogSoftmax: (x - max) - log(sum(exp(x - max)))      ReduceMean: reduce_sum / count
//   ReduceMin: -reduce_max(-x)                          Gemm: matmul (bias folded in when it is one row)
//   GlobalAveragePool: reduce_sum over the spatial axes / count
//   Softmax/LogSoftmax on an inner axis: transposed to the last and back
//   LayerNormalization over several axes: flattened to one
// Known inputs only (shape arithmetic; folded at import): Shape, Size, ConstantOfShape, Range, ReduceProd,
// Mod, integer Div. CumSum and GatherElements fold known values and build computed ones (a doubling scan;
// a gather at computed flat indices).
#include "models/onnx_ops.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "graph/interpreter.h"
#include "models/onnx_import.h"

namespace aspen::models::onnx {

using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

std::optional<DType> dtype_of_onnx(int32_t t) {
  switch (io::OnnxType(t)) {
    case io::OnnxType::f32:
      return DType::f32;
    case io::OnnxType::f16:
      return DType::f16;
    case io::OnnxType::bf16:
      return DType::bf16;
    case io::OnnxType::i32:
      return DType::i32;
    case io::OnnxType::i64:
      return DType::i64;
    case io::OnnxType::u8:
      return DType::u8;
    case io::OnnxType::boolean:
      return DType::boolean;
    default:
      return std::nullopt;
  }
}

// ---- Ctx ---------------------------------------------------------------------------------------------

std::string Ctx::label() const { return node.label(index_) + " at opset " + std::to_string(opset); }

Status Ctx::error(const std::string& what, const std::string& expected, const std::string& found) const {
  return Status::invalid_argument(label() + ": " + what, expected, found);
}

Status Ctx::unsupported(const std::string& what, const std::string& expected, const std::string& found) const {
  return Status::error(Code::kUnimplemented, label() + ": " + what, expected, found);
}

namespace {
std::string attr_subject(const char* name) { return std::string("attribute '") + name + "'"; }

Result<const io::OnnxAttribute*> find_attr(const Ctx& c, const char* name, io::OnnxAttrType type) {
  const io::OnnxAttribute* a = c.node.find(name);
  if (a && a->type != type)
    return c.error(attr_subject(name), "type " + io::onnx_attr_type_name(type), io::onnx_attr_type_name(a->type));
  return a;
}
}  // namespace

Result<int64_t> Ctx::attr_i(const char* name, std::optional<int64_t> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::i));
  if (a) return a->i;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

Result<float> Ctx::attr_f(const char* name, std::optional<float> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::f));
  if (a) return a->f;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

Result<std::string> Ctx::attr_s(const char* name, std::optional<std::string> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::s));
  if (a) return a->s;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

Result<std::vector<int64_t>> Ctx::attr_ints(const char* name, std::optional<std::vector<int64_t>> def) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::ints));
  if (a) return a->ints;
  if (def) return *def;
  return error(attr_subject(name), "the attribute (it has no default)", "none");
}

namespace {
Result<Tensor> tensor_of(const Ctx& c, const io::OnnxTensor& t, const std::string& what) {
  return tensor_from_onnx(t, c.label() + ": " + what);
}
}  // namespace

Result<Tensor> Ctx::attr_tensor(const char* name) const {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxAttribute* a, find_attr(*this, name, io::OnnxAttrType::tensor));
  if (!a) return error(attr_subject(name), "the attribute", "none");
  return tensor_of(*this, a->tensors.at(0), attr_subject(name));
}

ValueId Ctx::id(const Value& v) {
  if (v.id) return *v.id;
  return b.constant(v.constant->clone());
}

Value Ctx::wrap(ValueId v) const {
  Value out;
  out.id = v;
  if (v.valid()) out.type = b.type(v);
  return out;
}

Value Ctx::constant(Tensor t) {
  Value out;
  out.type = TensorType{t.dtype(), t.shape()};
  out.constant = std::make_shared<const Tensor>(std::move(t));
  return out;
}

Result<std::vector<int64_t>> Ctx::ints(const Value& v, const std::string& what) const {
  if (!v.readable())
    return unsupported(what, "a value known when the model is imported (a constant, or computed from shapes)",
                       "one computed from the graph's inputs");
  const Tensor& t = *v.constant;
  std::vector<int64_t> out;
  if (t.dtype() == DType::i64) {
    out.assign(t.span<int64_t>().begin(), t.span<int64_t>().end());
  } else if (t.dtype() == DType::i32) {
    for (int32_t x : t.span<int32_t>()) out.push_back(x);
  } else {
    return error(what, "int64 or int32 values", std::string(dtype_name(t.dtype())));
  }
  return out;
}

Result<double> Ctx::scalar(const Value& v, const std::string& what) const {
  if (!v.readable())
    return unsupported(what, "a value known when the model is imported", "one computed from the graph's inputs");
  if (v.constant->numel() != 1) return error(what, "one value", v.type.to_string());
  return graph::HostArray::from_tensor(*v.constant).data.at(0);
}

Result<int> Ctx::axis(int64_t a, int rank, const std::string& what) const {
  if (a < -rank || a >= std::max(rank, 1))
    return error(what, "an axis in [" + std::to_string(-rank) + ", " + std::to_string(rank) + ")", std::to_string(a));
  return int(a < 0 ? a + rank : a);
}

// ---- helpers ---------------------------------------------------------------------------------------

std::vector<int64_t> dims(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }
Shape shape_of(const std::vector<int64_t>& d) { return *Shape::make(d.data(), int(d.size())); }

Value to_shape(Ctx& c, const Value& v, const Shape& to) {
  if (v.type.shape == to) return v;
  return c.wrap(c.b.broadcast(c.id(v), dims(to)));
}

Value reshaped(Ctx& c, const Value& v, const std::vector<int64_t>& d) {
  if (dims(v.type.shape) == d) return v;
  return c.wrap(c.b.reshape(c.id(v), d));
}

// A scalar constant of `dtype`, broadcast to `shape`.
Value filled(Ctx& c, double v, DType dtype, const Shape& shape) {
  const bool wide_int = dtype == DType::i64 || dtype == DType::i32;  // exact, not through f32
  Tensor t(wide_int ? dtype : DType::f32, Shape{});
  if (dtype == DType::i64) t.span<int64_t>()[0] = int64_t(v);
  else if (dtype == DType::i32) t.span<int32_t>()[0] = int32_t(v);
  else t.span<float>()[0] = float(v);
  ValueId s = c.b.constant(std::move(t));
  if (!wide_int && dtype != DType::f32) s = c.b.cast(s, dtype);
  return c.wrap(c.b.broadcast(s, dims(shape)));
}


Result<ValueId> positions(Ctx& c, const Shape& s, int axis) {
  const int64_t n = s[axis];
  if (n >= (int64_t(1) << 24))
    return c.unsupported("axis " + std::to_string(axis), "fewer than 2^24 positions (exact in f32)", s.to_string());
  Tensor iota(DType::f32, Shape{n});
  for (int64_t k = 0; k < n; ++k) iota.span<float>()[size_t(k)] = float(k);
  std::vector<int64_t> along(size_t(s.rank()), 1);
  along[size_t(axis)] = n;
  return c.b.broadcast(c.b.reshape(c.b.constant(std::move(iota)), along), dims(s));
}

Result<Shape> make_shape(const Ctx& c, const std::vector<int64_t>& d, const std::string& what) {
  Result<Shape> s = Shape::make(d.data(), int(d.size()));
  if (!s.is_ok()) return c.error(what, "a shape aspen holds (rank at most 8, extents >= 0)", s.status().message());
  return s;
}

// Numpy's multidirectional broadcast of shapes.
Result<Shape> broadcast_shape(const Ctx& c, const std::vector<Shape>& shapes) {
  int rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.rank());
  std::vector<int64_t> out(size_t(rank), 1);
  for (const Shape& s : shapes)
    for (int i = 0; i < s.rank(); ++i) {
      int64_t& o = out[size_t(rank - s.rank() + i)];
      const int64_t d = s[i];
      if (d == o || d == 1) continue;
      if (o != 1) {
        std::string found;
        for (const Shape& t : shapes) found += (found.empty() ? "" : " and ") + t.to_string();
        return c.error("inputs", "shapes that broadcast together", found);
      }
      o = d;
    }
  return make_shape(c, out, "broadcast shape");
}

Status same_dtype(const Ctx& c, const std::vector<Value>& in, size_t from) {
  for (size_t k = from + 1; k < in.size(); ++k)
    if (in[k].present() && in[k].type.dtype != in[from].type.dtype)
      return c.error("input " + std::to_string(k),
                     std::string(dtype_name(in[from].type.dtype)) + " (input " + std::to_string(from) + "'s type)",
                     std::string(dtype_name(in[k].type.dtype)));
  return Status();
}

// The inputs broadcast to one shape.
Result<std::vector<Value>> broadcast_all(Ctx& c, const std::vector<Value>& in) {
  std::vector<Shape> shapes;
  for (const Value& v : in) shapes.push_back(v.type.shape);
  ASPEN_ASSIGN_OR_RETURN(const Shape to, broadcast_shape(c, shapes));
  std::vector<Value> out;
  for (const Value& v : in) out.push_back(to_shape(c, v, to));
  return out;
}

Status elementwise(Ctx& c, OpKind op, std::vector<Value>& in, std::vector<Value>& out) {
  ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
  ASPEN_ASSIGN_OR_RETURN(std::vector<Value> x, broadcast_all(c, in));
  std::vector<ValueId> ids;
  for (const Value& v : x) ids.push_back(c.id(v));
  out = {c.wrap(c.b.op1(op, ids))};
  return c.b.status();
}

Converter unary(OpKind op) {
  return [op](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    out = {c.wrap(c.b.op1(op, {c.id(in[0])}))};
    return c.b.status();
  };
}
Converter binary(OpKind op) {
  return [op](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) { return elementwise(c, op, in, out); };
}
// not(op(a, b)): LessOrEqual, GreaterOrEqual.
Converter negated(OpKind op) {
  return [op](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    ASPEN_RETURN_IF_ERROR(elementwise(c, op, in, out));
    out = {c.wrap(c.b.op1(OpKind::logical_not, {c.id(out[0])}))};
    return c.b.status();
  };
}
// Max, Min, Sum, Mean: variadic, folded left.
Converter variadic(OpKind op, bool mean) {
  return [op, mean](Ctx& c, std::vector<Value>& in, std::vector<Value>& out) {
    ASPEN_RETURN_IF_ERROR(same_dtype(c, in));
    ASPEN_ASSIGN_OR_RETURN(std::vector<Value> x, broadcast_all(c, in));
    ValueId acc = c.id(x[0]);
    for (size_t k = 1; k < x.size(); ++k) acc = c.b.op1(op, {acc, c.id(x[k])});
    if (mean && x.size() > 1) acc = c.b.scale(acc, 1.0 / double(x.size()));
    out = {c.wrap(acc)};
    return c.b.status();
  };
}

// ---- the table ----------------------------------------------------------------------------------------

// NOTE [older opsets]: a model below opset 13 is read op by op. Each op's converter reads the op as the
// ONNX versions from `since` on define it (ONNX's Changelog.md); an op whose meaning changed later than
// the model's opset is refused naming the op, the opset and the version its conversion starts at. The
// changes the converters read both ways: Squeeze/Unsqueeze axes and Split sizes as attributes (< 13),
// the Reduce ops' axes attribute (< 13, < 18), Softmax/LogSoftmax's coercion to 2-D at axis 1 (< 13).
// Left at 13 (no entry): ops not checked against their older versions.
constexpr std::pair<const char*, int> kSince[] = {
    // elementwise: numpy broadcasting from 7 (8 for the variadic ones), legacy attributes gone at 6
    {"Identity", 1}, {"Neg", 6}, {"Exp", 6}, {"Log", 6}, {"Tanh", 6}, {"Sqrt", 6}, {"Relu", 6},
    {"Sigmoid", 6}, {"Erf", 9}, {"Not", 1}, {"IsNaN", 9}, {"Reciprocal", 6}, {"Abs", 6}, {"Gelu", 20},
    {"Add", 7}, {"Sub", 7}, {"Mul", 7}, {"Div", 7}, {"Pow", 7}, {"Equal", 7}, {"Less", 7}, {"Greater", 7},
    {"LessOrEqual", 12}, {"GreaterOrEqual", 12}, {"And", 7}, {"Or", 7}, {"Max", 8}, {"Min", 8},
    {"Sum", 8}, {"Mean", 8}, {"Where", 9}, {"Trilu", 14}, {"Clip", 11}, {"Cast", 6}, {"CastLike", 15},
    {"Mod", 10}, {"Sin", 7}, {"Cos", 7}, {"Floor", 6}, {"Ceil", 6}, {"Round", 11},
    {"LeakyRelu", 6}, {"PRelu", 7}, {"Elu", 6}, {"Selu", 6}, {"Celu", 12}, {"ThresholdedRelu", 10},
    {"HardSigmoid", 6}, {"HardSwish", 14}, {"Softplus", 1}, {"Softsign", 1}, {"Mish", 18},
    // linear algebra and shapes: Reshape's shape an input from 5, Slice's bounds from 10
    {"MatMul", 1}, {"Gemm", 7}, {"Shape", 1}, {"Size", 1}, {"Constant", 1}, {"ConstantOfShape", 9},
    {"Range", 11}, {"Reshape", 5}, {"Flatten", 1}, {"Unsqueeze", 1}, {"Squeeze", 1}, {"Transpose", 1},
    {"Concat", 4}, {"Slice", 10}, {"Split", 2}, {"Expand", 8}, {"Gather", 1}, {"GatherND", 11},
    {"GatherElements", 11}, {"SplitToSequence", 11}, {"SequenceAt", 11}, {"CumSum", 11},
    // reductions, softmaxes, losses, normalizations
    {"ReduceSum", 1}, {"ReduceMean", 1}, {"ReduceMax", 1}, {"ReduceMin", 1}, {"ReduceProd", 1},
    {"GlobalAveragePool", 1}, {"Softmax", 1}, {"LogSoftmax", 1}, {"SoftmaxCrossEntropyLoss", 12}, {"NegativeLogLikelihoodLoss", 12},
    {"LayerNormalization", 17}, {"Dropout", 10}, {"RandomUniformLike", 1}, {"RandomUniform", 1},
    {"Scatter", 9}, {"ScatterElements", 11}, {"ScatterND", 11}, {"LpPool", 2}, {"GlobalLpPool", 2},
    {"InstanceNormalization", 6}, {"GroupNormalization", 18}, {"BatchNormalization", 9},
    // convolutions and pooling: later versions added attributes (count_include_pad, ceil_mode, dilations)
    // whose defaults are the older meaning
    {"Pad", 2}, {"DepthToSpace", 1}, {"SpaceToDepth", 1}, {"OneHot", 9}, {"Einsum", 12}, {"Resize", 11}, {"Upsample", 7},
    {"ArgMax", 1}, {"ArgMin", 1}, {"Hardmax", 1}, {"Conv", 1}, {"ConvTranspose", 1}, {"LRN", 1}, {"TopK", 1}, {"LSTM", 7}, {"GRU", 7}, {"RNN", 7}, {"MaxPool", 1}, {"AveragePool", 1}, {"GlobalMaxPool", 1},
};

const std::map<std::string, OpConverter>& converters() {
  static const std::map<std::string, OpConverter> table = [] {
    ConverterTable t;
    add_elementwise_converters(t);
    add_shape_converters(t);
    add_resample_converters(t);
    add_index_converters(t);
    add_nn_converters(t);
    add_conv_converters(t);
    add_rnn_converters(t);
    for (const auto& [name, since] : kSince) {
      auto it = t.find(name);
      ASPEN_CHECK(it != t.end()) << "kSince names an op with no converter: " << name;
      it->second.since = since;
    }
    return t;
  }();
  return table;
}

const OpConverter* find_converter(const std::string& domain, const std::string& op_type) {
  const std::map<std::string, OpConverter>* table = domain.empty()              ? &converters()
                                                    : domain == kMicrosoftDomain ? &microsoft_converters()
                                                                                 : nullptr;
  if (!table) return nullptr;
  auto it = table->find(op_type);
  return it == table->end() ? nullptr : &it->second;
}

}  // namespace aspen::models::onnx
