#include "graph/interpreter.h"

#include <cmath>
#include <limits>

#include "graph/verify.h"

namespace aspen::graph {

double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::f32: return double(float(v));
    case DType::bf16: return double(bf16_to_f32(f32_to_bf16(float(v))));
    case DType::f16: return double(f16_to_f32(f32_to_f16(float(v))));
    case DType::i32:
    case DType::i64:
    case DType::u8: return std::trunc(v);
    case DType::boolean: return v != 0 ? 1.0 : 0.0;
  }
  return v;
}

HostArray HostArray::from_tensor(const Tensor& t) {
  HostArray a(TensorType{t.dtype(), t.shape()});
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::f32: a.data[i] = t.data<float>()[i]; break;
      case DType::bf16: a.data[i] = bf16_to_f32(t.data<bf16>()[i]); break;
      case DType::f16: a.data[i] = f16_to_f32(t.data<f16>()[i]); break;
      case DType::i32: a.data[i] = t.data<int32_t>()[i]; break;
      case DType::i64: a.data[i] = double(t.data<int64_t>()[i]); break;
      case DType::u8: a.data[i] = t.data<uint8_t>()[i]; break;
      case DType::boolean: a.data[i] = t.data<bool>()[i] ? 1 : 0; break;
    }
  }
  return a;
}

namespace {
// NOTE [integer saturation]: a double outside an integer type's range converts to its nearest end (NaN to
// 0) instead of the undefined behaviour of a plain cast, which on x86 turned 2^63 - 1 (torch's export of an
// open-ended slice, `x[:, 1:]`, held as the double 2^63) into INT64_MIN: an empty slice, and a wrong loss.
template <class I>
I saturate(double v) {
  if (std::isnan(v)) return 0;
  // The ends as doubles: 2^63 for int64 (the max itself rounds up to it), exact for the narrower types.
  constexpr double lo = double(std::numeric_limits<I>::min()), hi = double(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return I(v);
}
}  // namespace

Tensor HostArray::to_tensor() const {
  Tensor t(type.dtype, type.shape);
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = data[i];
    switch (type.dtype) {
      case DType::f32: t.data<float>()[i] = float(v); break;
      case DType::bf16: t.data<bf16>()[i] = f32_to_bf16(float(v)); break;
      case DType::f16: t.data<f16>()[i] = f32_to_f16(float(v)); break;
      case DType::i32: t.data<int32_t>()[i] = saturate<int32_t>(v); break;
      case DType::i64: t.data<int64_t>()[i] = saturate<int64_t>(v); break;
      case DType::u8: t.data<uint8_t>()[i] = saturate<uint8_t>(v); break;
      case DType::boolean: t.data<bool>()[i] = v != 0; break;
    }
  }
  return t;
}

Result<std::vector<HostArray>> interpret_all(const Graph& g, const std::map<std::string, HostArray>& feeds,
                                             const InterpretOptions& options) {
  ASPEN_RETURN_IF_ERROR(verify(g));
  std::vector<HostArray> values(size_t(g.num_values()));
  std::vector<const HostArray*> in;
  std::vector<HostArray> out;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const Node& n = g.nodes()[ni];
    in.clear();
    for (ValueId v : n.inputs) in.push_back(&values[size_t(v.index)]);
    out.clear();
    for (ValueId v : n.outputs) out.emplace_back(g.type(v));
    if (n.op == OpKind::input || n.op == OpKind::parameter) {
      auto it = feeds.find(n.name);
      const char* what = n.op == OpKind::input ? "input" : "parameter";
      if (it == feeds.end())
        return Status::error(Code::kNotFound, std::string(what) + " '" + n.name + "'", "a value fed by name",
                             "none");
      if (it->second.type != out[0].type || int64_t(it->second.data.size()) != out[0].numel())
        return Status::invalid_argument(std::string(what) + " '" + n.name + "'", out[0].type.to_string(),
                                        it->second.type.to_string());
      out[0].data = it->second.data;
    } else {
      Status s = op_info(n.op).eval(n, in, out);
      if (!s.is_ok()) return std::move(s).with_context("node " + std::to_string(ni) + " (" + op_name(n.op) + ")");
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (options.round_to_dtype)
        for (double& d : out[i].data) d = round_to(out[i].type.dtype, d);
      values[size_t(n.outputs[i].index)] = std::move(out[i]);
    }
  }
  return values;
}

Result<std::map<std::string, HostArray>> interpret(const Graph& g, const std::map<std::string, HostArray>& feeds,
                                                   const InterpretOptions& options) {
  ASPEN_ASSIGN_OR_RETURN(std::vector<HostArray> values, interpret_all(g, feeds, options));
  std::map<std::string, HostArray> result;
  for (const auto& [name, v] : g.outputs()) result[name] = values[size_t(v.index)];
  return result;
}

Result<StepResult> interpret_step(const Graph& g, const std::map<std::string, HostArray>& feeds,
                                  const InterpretOptions& options) {
  ASPEN_ASSIGN_OR_RETURN(std::vector<HostArray> values, interpret_all(g, feeds, options));
  StepResult r;
  for (const auto& [name, v] : g.outputs()) r.outputs[name] = values[size_t(v.index)];
  for (const auto& [name, v] : g.updates()) r.updates[name] = values[size_t(v.index)];
  return r;
}

}  // namespace aspen::graph
