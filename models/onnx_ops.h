// models/onnx_ops.h: how the ONNX importer converts one node (private to
// models/onnx_import.cc and onnx_ops.cc).
//
// A converter reads its node's attributes and input Values through a Ctx and
// emits IR ops with the Ctx's builder. A Value is a graph value, or a tensor
// known at import; the driver runs a converter whose inputs are all known
// against a scratch graph and the reference interpreter, so one conversion
// serves both building and folding. Converters that need a known input (a
// Reshape's shape, a Slice's bounds) read it with Ctx::ints and fail naming
// the input when it is not known.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/builder.h"
#include "io/onnx.h"

namespace aspen::models::onnx {

// The most elements a value known at import may have: a larger one (a ConstantOfShape or an Expand of a
// huge shape) is computed by the graph instead, and a larger folded result is not folded, so that a
// hostile or mistaken file cannot make the importer allocate without bound (the device's memory plan
// then says whether the value fits).
inline constexpr int64_t kMaxKnownElements = int64_t(1) << 24;

struct Value {
  graph::TensorType type;
  std::optional<graph::ValueId> id;        // in the graph being built
  std::shared_ptr<const Tensor> constant;  // known at import (or, for a parameter, its value in the file)
  bool parameter = false;                  // a float initializer: a graph value whose file value is readable
  std::shared_ptr<const std::vector<Value>> sequence;  // an ONNX sequence (SplitToSequence): its tensors
  // Known at import: folded with whatever is computed from it. A parameter is not (it trains).
  bool known() const { return constant != nullptr && !parameter; }
  // Its value can be read at import: known, or a parameter's value in the file (an exporter's scalar
  // constant, such as a Pow exponent, arrives as a float initializer).
  bool readable() const { return constant != nullptr; }
  bool present() const { return id.has_value() || constant != nullptr || sequence != nullptr; }  // false: left out
};

class Ctx {
 public:
  Ctx(graph::Builder& builder, const io::OnnxNode& n, size_t index, int64_t op_set)
      : b(builder), node(n), opset(op_set), index_(index) {}

  graph::Builder& b;
  const io::OnnxNode& node;

  // "node 3 'attn/MatMul' (MatMul) at opset 17".
  std::string label() const;
  // InvalidArgument: "<label>: <what>: expected E, found F".
  Status error(const std::string& what, const std::string& expected, const std::string& found) const;
  // Unimplemented: a valid model the importer does not convert.
  Status unsupported(const std::string& what, const std::string& expected, const std::string& found) const;

  // Attributes, with their ONNX defaults where the op has one (no default: required).
  bool has(const char* name) const { return node.find(name) != nullptr; }
  Result<int64_t> attr_i(const char* name, std::optional<int64_t> def = std::nullopt) const;
  Result<float> attr_f(const char* name, std::optional<float> def = std::nullopt) const;
  Result<std::string> attr_s(const char* name, std::optional<std::string> def = std::nullopt) const;
  Result<std::vector<int64_t>> attr_ints(const char* name,
                                         std::optional<std::vector<int64_t>> def = std::nullopt) const;
  Result<Tensor> attr_tensor(const char* name) const;

  // The value as a graph value (a known one is added as a constant).
  graph::ValueId id(const Value& v);
  Value wrap(graph::ValueId v) const;
  static Value constant(Tensor t);
  // A readable integer tensor's values; `what` names the input in the error when it is not readable.
  Result<std::vector<int64_t>> ints(const Value& v, const std::string& what) const;
  // A readable scalar (one element of any type) as a double.
  Result<double> scalar(const Value& v, const std::string& what) const;
  // An axis in [-rank, rank) as an index in [0, rank).
  Result<int> axis(int64_t a, int rank, const std::string& what) const;

  const int64_t opset;
  size_t index() const { return index_; }  // the node's index in the file's graph

 private:
  size_t index_;
};

using Converter = std::function<Status(Ctx& c, std::vector<Value>& in, std::vector<Value>& out)>;

struct OpConverter {
  Converter convert;
  int min_inputs = 1, max_inputs = 1;  // -1: any number
  bool foldable = true;                // false: never evaluated at import (sequence ops)
  // The oldest opset whose meaning of the op the converter reads (NOTE [older opsets] in onnx_ops.cc):
  // a node of an older model is refused by name.
  int since = 13;
};

// Every op type of the default domain the importer converts: one table, filled by one function per op
// group, each in its own file (a new op is added to its group's file only).
const std::map<std::string, OpConverter>& converters();
using ConverterTable = std::map<std::string, OpConverter>;
inline void add_converter(ConverterTable& t, const char* name, Converter f, int min_inputs, int max_inputs,
                          bool foldable = true) {
  t[name] = OpConverter{std::move(f), min_inputs, max_inputs, foldable};
}
void add_elementwise_converters(ConverterTable& t);  // onnx_ops_elementwise.cc
void add_shape_converters(ConverterTable& t);        // onnx_ops_shape.cc
void add_resample_converters(ConverterTable& t);     // onnx_ops_resample.cc
void add_index_converters(ConverterTable& t);        // onnx_ops_index.cc
void add_nn_converters(ConverterTable& t);           // onnx_ops_nn.cc
void add_conv_converters(ConverterTable& t);         // onnx_ops_conv.cc
void add_rnn_converters(ConverterTable& t);          // onnx_ops_rnn.cc
// The com.microsoft ops that onnxruntime's transformer optimizer writes (FastGelu, BiasGelu, Gelu,
// SkipLayerNormalization, SkipSimplifiedLayerNormalization, Attention): models/onnx_ops_microsoft.cc.
inline constexpr const char* kMicrosoftDomain = "com.microsoft";
const std::map<std::string, OpConverter>& microsoft_converters();
// The converter of `op_type` in `domain` ("": the default domain, as io/onnx.h writes it), or nullptr.
const OpConverter* find_converter(const std::string& domain, const std::string& op_type);

// Helpers the conversion files share.
std::vector<int64_t> dims(const Shape& s);
Shape shape_of(const std::vector<int64_t>& d);
Value to_shape(Ctx& c, const Value& v, const Shape& to);                  // broadcast (when it differs)
Value reshaped(Ctx& c, const Value& v, const std::vector<int64_t>& d);    // reshape (when it differs)
Value filled(Ctx& c, double v, DType dtype, const Shape& shape);          // a scalar of dtype, broadcast
graph::ValueId abs_of(Ctx& c, graph::ValueId x);                           // |x| as max(x, -x)
Tensor i64_tensor(const std::vector<int64_t>& v, bool scalar = false);    // [n] (or [] with scalar)
// Gather of in = {data, indices} on a checked axis (onnx_ops_index.cc; strided Slice gathers too).
Status gather_on(Ctx& c, std::vector<Value>& in, int axis, std::vector<Value>& out);
// f32 of shape s holding each element's index along `axis` (class ids, positions: exact below 2^24, which
// an axis past refuses by name).
Result<graph::ValueId> positions(Ctx& c, const Shape& s, int axis);
// The axis' largest value of x (f32) and the first (or `last`) of `pos` (f32, x's shape) where x holds it,
// both with the axis kept as 1: a reduction of where(x == largest, pos, sentinel); pos holds positions
// along the axis. ArgMax / ArgMin, Hardmax, TopK and MaxPool's Indices.
std::pair<graph::ValueId, graph::ValueId> largest_along(Ctx& c, graph::ValueId x, graph::ValueId pos, int axis,
                                                         bool last);
Result<Shape> make_shape(const Ctx& c, const std::vector<int64_t>& d, const std::string& what);
Result<Shape> broadcast_shape(const Ctx& c, const std::vector<Shape>& shapes);  // numpy's broadcast
// InvalidArgument unless every present input from `from` on has input `from`'s element type.
Status same_dtype(const Ctx& c, const std::vector<Value>& in, size_t from = 0);
Result<std::vector<Value>> broadcast_all(Ctx& c, const std::vector<Value>& in);  // to one shape
// `op` over the inputs, of one type, broadcast.
Status elementwise(Ctx& c, graph::OpKind op, std::vector<Value>& in, std::vector<Value>& out);
Converter unary(graph::OpKind op);
Converter binary(graph::OpKind op);
Converter negated(graph::OpKind op);                    // not(op(a, b)): LessOrEqual, GreaterOrEqual
Converter variadic(graph::OpKind op, bool mean = false);  // Max, Min, Sum, Mean: folded left

// What errors expect of an element type: the ONNX types dtype_of_onnx maps.
inline constexpr const char* kAspenTypes =
    "an element type aspen has (FLOAT, FLOAT16, BFLOAT16, INT32, INT64, UINT8, BOOL)";
// ONNX element types as aspen dtypes; nullopt for those aspen has no dtype for.
std::optional<DType> dtype_of_onnx(int32_t onnx_type);

}  // namespace aspen::models::onnx
