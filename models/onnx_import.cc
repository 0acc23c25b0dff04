#include "models/onnx_import.h"

#include <fnmatch.h>

#include <cstring>
#include <set>
#include <unordered_map>

#include "compiler/pass.h"
#include "core/file.h"
#include "graph/builder.h"
#include "graph/interpreter.h"
#include "models/onnx_ops.h"

namespace aspen::models {

namespace {

using onnx::Ctx;
using onnx::Value;

constexpr int64_t kMinOpset = 1, kMaxOpset = 21;  // below 13: op by op (NOTE [older opsets])
// Known inputs larger than this are not folded at import (the graph computes from them instead).
constexpr int64_t kMaxFoldElements = onnx::kMaxKnownElements;

std::string quoted(const std::string& s) { return "'" + escape_for_terminal(s) + "'"; }

// Every node whose op the importer does not convert, listed at once.
Status check_ops(const io::OnnxModel& m) {
  std::vector<std::string> unknown;
  bool too_old = false;
  for (size_t k = 0; k < m.graph.nodes.size(); ++k) {
    const io::OnnxNode& n = m.graph.nodes[k];
    // onnxruntime's transformer optimizer writes com.microsoft nodes without importing the domain, and
    // onnxruntime runs such files (as version 1): so does the importer.
    const int64_t opset = m.opset(n.domain);
    if (const onnx::OpConverter* conv = onnx::find_converter(n.domain, n.op_type)) {
      if (!n.domain.empty() || opset >= conv->since) continue;
      unknown.push_back(n.label(k) + " at opset " + std::to_string(opset) + ", converted from opset " +
                        std::to_string(conv->since) + " on (its meaning changed there)");
      too_old = true;
      continue;
    }
    unknown.push_back(n.label(k) + (opset ? " at opset " + std::to_string(opset) : " (domain not imported)"));
  }
  if (unknown.empty()) return Status();
  std::string found;
  for (size_t i = 0; i < unknown.size() && i < 50; ++i) found += (i ? "; " : "") + unknown[i];
  if (unknown.size() > 50) found += "; and " + std::to_string(unknown.size() - 50) + " more";
  return Status::error(Code::kUnimplemented, m.path + ": " + std::to_string(unknown.size()) + " node(s)",
                       "ops the importer converts at the model's opset (aspen onnx inspect lists them)", found,
                       too_old ? "onnx.version_converter.convert_version(model, 17) rewrites an older model's ops" : "");
}

// The input's type: its declared element type, and its shape with every symbol bound.
Result<graph::TensorType> input_type(const io::OnnxModel& m, const io::OnnxValueInfo& v, const OnnxImportOptions& o,
                                     std::set<std::string>& unbound) {
  const std::string subject = m.path + ": graph input " + quoted(v.name);
  const std::optional<DType> dt = onnx::dtype_of_onnx(v.type);
  if (!dt)
    return Status::error(Code::kUnimplemented, subject, std::string("a tensor of ") + onnx::kAspenTypes,
                         v.type ? io::onnx_type_name(v.type) : "no tensor type");
  std::vector<int64_t> d;
  auto given = o.input_shapes.find(v.name);
  auto bound = o.constants.find(v.name);
  if (given != o.input_shapes.end() || (bound != o.constants.end() && bound->second)) {
    d = given != o.input_shapes.end()
            ? given->second
            : std::vector<int64_t>(bound->second->shape().begin(), bound->second->shape().end());
    if (v.has_shape) {
      bool agree = d.size() == v.dims.size();
      for (size_t i = 0; agree && i < d.size(); ++i) agree = v.dims[i].value < 0 || v.dims[i].value == d[i];
      if (!agree) {
        std::string shape = "[";
        for (size_t i = 0; i < d.size(); ++i) shape += (i ? ", " : "") + std::to_string(d[i]);
        return Status::invalid_argument(subject + ": shape", "one that fits the declared " + v.dims_text(),
                                        shape + "]");
      }
    }
  } else {
    if (!v.has_shape)
      return Status::invalid_argument(subject, "a declared shape, or one given (input_shapes)", "neither");
    for (const io::OnnxDim& dim : v.dims) {
      if (dim.value >= 0) {
        d.push_back(dim.value);
        continue;
      }
      auto it = dim.param.empty() ? o.dims.end() : o.dims.find(dim.param);
      if (it == o.dims.end()) {
        unbound.insert(dim.param.empty() ? "an unnamed dimension of " + quoted(v.name) : quoted(dim.param));
        d.push_back(1);
        continue;
      }
      d.push_back(it->second);
    }
  }
  Result<Shape> s = Shape::make(d.data(), int(d.size()));
  if (!s.is_ok())
    return Status::invalid_argument(subject + ": shape", "rank at most 8, extents >= 0", s.status().message());
  return graph::TensorType{*dt, *s};
}

// Runs a node whose inputs are all known against a scratch graph and the reference interpreter. Returns
// false, and leaves `out` empty, when a result would be larger than kMaxFoldElements: the caller builds the
// node into the graph instead.
Result<bool> fold(const io::OnnxNode& node, size_t index, int64_t opset, const onnx::OpConverter& conv,
                  std::vector<Value>& in, std::vector<Value>& out) {
  graph::Graph g;
  graph::Builder b(g);
  Ctx c(b, node, index, opset);
  ASPEN_RETURN_IF_ERROR(conv.convert(c, in, out));
  bool any = false;
  for (size_t k = 0; k < out.size(); ++k)
    if (!out[k].known() && out[k].id) {
      b.output("out" + std::to_string(k), *out[k].id);
      any = true;
    }
  ASPEN_RETURN_IF_ERROR(b.status());
  if (!any) return true;
  for (size_t k = 0; k < out.size(); ++k)
    if (!out[k].known() && out[k].id && b.type(*out[k].id).shape.numel() > kMaxFoldElements) {
      out.clear();
      return false;
    }
  ASPEN_ASSIGN_OR_RETURN(auto values, graph::interpret(g, {}, {.round_to_dtype = true}));
  for (size_t k = 0; k < out.size(); ++k)
    if (!out[k].known() && out[k].id) out[k] = Ctx::constant(values.at("out" + std::to_string(k)).to_tensor());
  return true;
}


// NOTE [name scopes] for an imported file: the module path its exporter wrote into the node's name
// ("/transformer/h.0/attn/MatMul" from torch.onnx, "model/dense/MatMul" from tf2onnx: all but the last part,
// joined by '.'); a name without a path (or none) gives no scope.
std::string onnx_scope(const std::string& name) {
  const size_t last = name.rfind('/');
  if (last == std::string::npos) return {};
  std::string scope;
  for (char ch : std::string_view(name).substr(0, last)) {
    if (ch == '/') {
      if (!scope.empty() && scope.back() != '.') scope += '.';
    } else {
      scope += ch;
    }
  }
  while (!scope.empty() && scope.back() == '.') scope.pop_back();
  return scope;
}

// Each node's pipeline stage (-1: untagged): by the prefixes' beginnings, or by its "aspen.stage" metadata
// (OnnxImportOptions::stage_begins).
Result<std::vector<int>> node_stages(const io::OnnxModel& m, const std::vector<std::string>& begins) {
  const std::vector<io::OnnxNode>& nodes = m.graph.nodes;
  std::vector<int> stage(nodes.size(), -1);
  if (!begins.empty()) {
    size_t from = 0;
    for (size_t s = 0; s < begins.size(); ++s) {
      size_t k = from + 1;  // a stage has at least its first node
      while (k < nodes.size() && nodes[k].name.rfind(begins[s], 0) != 0) ++k;
      if (k >= nodes.size())
        return Status::invalid_argument(
            m.path + ": stage " + std::to_string(s + 1) + "'s beginning " + quoted(begins[s]),
            "a prefix of a node's name after " + (s == 0 ? std::string("the first node") : "stage " + std::to_string(s) + "'s beginning"),
            "no such node");
      for (size_t j = from; j < k; ++j) stage[j] = int(s);
      from = k;
    }
    for (size_t j = from; j < nodes.size(); ++j) stage[j] = int(begins.size());
    return stage;
  }
  for (size_t k = 0; k < nodes.size(); ++k)
    for (const auto& [key, value] : nodes[k].metadata) {
      if (key != "aspen.stage") continue;
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 0 || v > 4096)
        return Status::invalid_argument(m.path + ": " + nodes[k].label(k) + " metadata aspen.stage",
                                        "a stage number from 0 to 4096", quoted(value));
      stage[k] = int(v);
    }
  return stage;
}
}  // namespace

Result<Tensor> tensor_from_onnx(const io::OnnxTensor& t, const std::string& what) {
  const std::optional<DType> dt = onnx::dtype_of_onnx(t.type);
  if (!dt) return Status::error(Code::kUnimplemented, what, onnx::kAspenTypes, io::onnx_type_name(t.type));
  Result<Shape> shape = Shape::make(t.dims.data(), int(t.dims.size()));
  if (!shape.is_ok())
    return Status::error(Code::kUnimplemented, what, "rank at most " + std::to_string(Shape::kMaxRank),
                         "rank " + std::to_string(t.dims.size()));
  Tensor out(*dt, *shape);
  std::memcpy(out.raw(), t.bytes.data(), out.nbytes());
  if (*dt == DType::boolean) {  // bytes other than 0 and 1 are no bool: any nonzero byte is true
    uint8_t* p = static_cast<uint8_t*>(out.raw());
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = p[i] != 0;
  }
  return out;
}

std::map<std::string, const Tensor*> OnnxImport::weight_pointers() const {
  std::map<std::string, const Tensor*> out;
  for (const auto& [name, t] : weights) out[name] = &t;
  return out;
}

Status add_onnx_loss(OnnxImport& m, const OnnxLoss& loss) {
  graph::Graph& g = m.graph;
  const std::optional<graph::ValueId> y = g.find_output(loss.output);
  if (!y) {
    std::string names;
    for (const std::string& o : m.outputs) names += (names.empty() ? "" : ", ") + quoted(o);
    return Status::invalid_argument("loss output", "an output of the model (" + names + ")", quoted(loss.output));
  }
  if (g.find_output("loss")) return Status::invalid_argument("loss", "a model without an output named 'loss'", "one");
  for (const std::string& in : m.inputs)
    if (in == loss.targets)
      return Status::invalid_argument("loss targets", "a name no graph input has", quoted(loss.targets));
  graph::Builder b(g);
  const graph::TensorType t = g.type(*y);
  graph::ValueId l;
  if (loss.kind == OnnxLoss::Kind::cross_entropy) {
    if (t.shape.rank() < 1 || t.dtype != DType::f32)
      return Status::invalid_argument("loss output " + quoted(loss.output), "f32 logits [..., classes]", t.to_string());
    const int64_t V = t.shape[-1], R = V ? t.shape.numel() / V : 0;
    std::vector<int64_t> rows(t.shape.begin(), t.shape.end() - 1);
    Result<Shape> rs = Shape::make(rows.data(), int(rows.size()));
    if (!rs.is_ok()) return rs.status();
    const graph::ValueId targets = b.input(loss.targets, DType::i64, *rs);
    std::vector<graph::ValueId> ce =
        b.op(graph::OpKind::cross_entropy, {b.reshape(*y, {R, V}), b.reshape(targets, {R})},
             {{"ignore_index", loss.ignore_index}});
    ASPEN_RETURN_IF_ERROR(b.status());
    l = ce[0];
  } else {
    const graph::ValueId targets = b.input(loss.targets, t.dtype, t.shape);
    const graph::ValueId d = b.sub(*y, targets);
    std::vector<int64_t> axes;
    for (int i = 0; i < t.shape.rank(); ++i) axes.push_back(i);
    l = b.mul(d, d);
    if (!axes.empty()) l = b.reduce_sum(l, axes);
    l = b.scale(l, t.shape.numel() ? 1.0 / double(t.shape.numel()) : 0.0);
  }
  b.output("loss", l);
  ASPEN_RETURN_IF_ERROR(b.status());
  m.inputs.push_back(loss.targets);
  m.outputs.push_back("loss");
  return Status();
}

std::map<std::string, graph::TensorType> OnnxImport::parameter_types() const {
  std::map<std::string, graph::TensorType> out;
  for (const auto& [name, t] : weights) out.emplace(name, graph::TensorType{t.dtype(), t.shape()});
  return out;
}

Status export_onnx_weights(const std::map<std::string, graph::TensorType>& parameters, const std::string& src,
                           const std::string& dst, const std::map<std::string, Tensor>& weights) {
  std::map<std::string, std::string> values;
  for (const auto& [name, type] : parameters) {
    auto it = weights.find(name);
    if (it == weights.end())
      return Status::invalid_argument("weights", "a value for parameter " + quoted(name), "none");
    const Tensor& t = it->second;
    if (t.dtype() != type.dtype || t.shape() != type.shape)
      return Status::invalid_argument("weight " + quoted(name), type.to_string(),
                                      graph::TensorType{t.dtype(), t.shape()}.to_string());
    values[name] = std::string(static_cast<const char*>(t.raw()), t.nbytes());
  }
  return io::write_onnx_with_initializers(src, dst, values);
}

int onnx_op_since(const std::string& op_type) {
  const onnx::OpConverter* conv = onnx::find_converter("", op_type);
  return conv ? conv->since : 0;
}

std::vector<std::string> onnx_supported_ops() {
  std::vector<std::string> out;
  for (const auto& [name, conv] : onnx::converters()) out.push_back(name);
  for (const auto& [name, conv] : onnx::microsoft_converters())
    out.push_back(std::string(onnx::kMicrosoftDomain) + "." + name);
  std::sort(out.begin(), out.end());
  return out;
}

Result<OnnxImport> import_onnx(const io::OnnxModel& m, const OnnxImportOptions& options) {
  const int64_t opset = m.opset("");
  if (opset < kMinOpset || opset > kMaxOpset)
    return Status::error(Code::kUnimplemented, m.path + ": opset of the default domain",
                         std::to_string(kMinOpset) + " to " + std::to_string(kMaxOpset) +
                             " (convert older models with onnx.version_converter.convert_version(model, 17))",
                         std::to_string(opset));
  ASPEN_RETURN_IF_ERROR(check_ops(m));

  OnnxImport out;
  out.opset = opset;
  graph::Builder b(out.graph);
  std::unordered_map<std::string, Value> values;

  // Inputs, with every unbound symbol named at once.
  std::set<std::string> unbound;
  std::vector<graph::TensorType> types;
  for (const io::OnnxValueInfo& v : m.graph.inputs) {
    ASPEN_ASSIGN_OR_RETURN(graph::TensorType t, input_type(m, v, options, unbound));
    types.push_back(t);
  }
  if (!unbound.empty()) {
    std::string found;
    for (const std::string& s : unbound) found += (found.empty() ? "" : ", ") + s;
    return Status::invalid_argument(m.path + ": symbolic dimensions", "an extent for each (dims, or input_shapes)",
                                    "none for " + found);
  }
  for (const auto& [name, shape] : options.input_shapes)
    if (!m.graph.find_input(name))
      return Status::invalid_argument(m.path + ": input_shapes", "names of graph inputs", quoted(name));
  for (const auto& [name, t] : options.constants)
    if (!m.graph.find_input(name) || !t)
      return Status::invalid_argument(m.path + ": constants", "names of graph inputs, with tensors", quoted(name));
  for (size_t k = 0; k < m.graph.inputs.size(); ++k) {
    const std::string& name = m.graph.inputs[k].name;
    auto bound = options.constants.find(name);
    if (bound != options.constants.end()) {
      const Tensor& t = *bound->second;
      if (t.dtype() != types[k].dtype || t.shape() != types[k].shape)
        return Status::invalid_argument(m.path + ": constant for input " + quoted(name), types[k].to_string(),
                                        graph::TensorType{t.dtype(), t.shape()}.to_string());
      values[name] = Ctx::constant(t.clone());
      continue;
    }
    Value v;
    v.type = types[k];
    v.id = b.input(name, types[k].dtype, types[k].shape);
    values[name] = v;
    out.inputs.push_back(name);
  }
  // A training BatchNormalization's running statistics are state the graph updates (NOTE [batch norm in
  // training] in onnx_ops_nn.cc): parameters whatever the frozen patterns say.
  std::set<std::string> state;
  for (const io::OnnxNode& n : m.graph.nodes) {
    if (n.op_type != "BatchNormalization" || !n.domain.empty() || n.inputs.size() < 5) continue;
    const io::OnnxAttribute* a = n.find("training_mode");
    if (a && a->i != 0) state.insert({n.inputs[3], n.inputs[4]});
  }
  // Initializers: float ones are parameters (trainable weights), the rest constants.
  for (const io::OnnxTensor& t : m.graph.initializers) {
    ASPEN_ASSIGN_OR_RETURN(Tensor x, tensor_from_onnx(t, m.path + ": initializer " + quoted(t.name)));
    Value v;
    v.type = graph::TensorType{x.dtype(), x.shape()};
    auto matches = [&](const std::vector<std::string>& patterns) {
      for (const std::string& p : patterns)
        if (fnmatch(p.c_str(), t.name.c_str(), 0) == 0) return true;
      return false;
    };
    const bool frozen =
        !state.count(t.name) && (matches(options.frozen) || (x.numel() == 1 && !matches(options.trainable)));
    if (!frozen && is_float(x.dtype())) {
      v.id = b.parameter(t.name, x.dtype(), x.shape());
      v.parameter = true;
      v.constant = std::make_shared<const Tensor>(x.clone());
      out.weights.emplace(t.name, std::move(x));
    } else {
      v = Ctx::constant(std::move(x));
    }
    values[t.name] = v;
  }
  ASPEN_RETURN_IF_ERROR(b.status());

  ASPEN_ASSIGN_OR_RETURN(const std::vector<int> stages, node_stages(m, options.stage_begins));
  for (size_t k = 0; k < m.graph.nodes.size(); ++k) {
    const io::OnnxNode& node = m.graph.nodes[k];
    const onnx::OpConverter& conv = *onnx::find_converter(node.domain, node.op_type);  // check_ops found it
    b.set_stage(stages[k]);  // every IR node this one becomes
    b.set_scope(onnx_scope(node.name));
    // The reader writes ai.onnx as "".
    const int64_t node_opset = node.domain.empty() ? opset : std::max<int64_t>(1, m.opset(node.domain));
    Ctx c(b, node, k, node_opset);
    const int n_in = int(node.inputs.size());
    if (n_in < conv.min_inputs || (conv.max_inputs >= 0 && n_in > conv.max_inputs))
      return c.error("inputs",
                     conv.max_inputs < 0 ? "at least " + std::to_string(conv.min_inputs)
                     : conv.min_inputs == conv.max_inputs
                         ? std::to_string(conv.min_inputs)
                         : std::to_string(conv.min_inputs) + " to " + std::to_string(conv.max_inputs),
                     std::to_string(n_in));
    std::vector<Value> in;
    bool all_known = true;
    int64_t known_elements = 0;
    for (const std::string& name : node.inputs) {
      if (name.empty()) {
        in.emplace_back();  // an optional input left out
        continue;
      }
      const Value& v = values.at(name);  // the reader checked it is defined before
      all_known = all_known && v.known();
      if (v.known()) known_elements += v.constant->numel();
      in.push_back(v);
    }
    std::vector<Value> results;
    Result<bool> folded = false;  // false: build the node into the graph
    if (all_known && conv.foldable && known_elements <= kMaxFoldElements)
      folded = fold(node, k, node_opset, conv, in, results);
    Status s = !folded.is_ok() ? folded.status() : *folded ? Status() : conv.convert(c, in, results);
    if (s.is_ok()) s = b.status();
    // An error the converter did not word itself (the builder's, which names aspen's own nodes) is put
    // under the ONNX node and the file, so the user sees which of their nodes it is.
    if (!s.is_ok()) return s.subject().rfind(c.label(), 0) == 0 ? s : std::move(s).with_context(m.path + ": " + c.label());
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      if (o >= results.size() || !results[o].present())
        return c.unsupported("output " + std::to_string(o) + " " + quoted(node.outputs[o]),
                             "an output the importer makes", "only " + std::to_string(results.size()));
      values[node.outputs[o]] = results[o];
    }
  }
  b.set_stage(-1);
  b.set_scope({});
  // A training Dropout's seed (NOTE [training dropout]) is an input the file did not declare.
  if (out.graph.find_input(kDropoutSeedInput) &&
      std::find(out.inputs.begin(), out.inputs.end(), kDropoutSeedInput) == out.inputs.end())
    out.inputs.push_back(kDropoutSeedInput);
  for (const io::OnnxValueInfo& v : m.graph.outputs) {
    const Value& x = values.at(v.name);
    if (x.sequence)
      return Status::error(Code::kUnimplemented, m.path + ": graph output " + quoted(v.name), "a tensor", "a sequence");
    const graph::ValueId id = x.id ? *x.id : b.constant(x.constant->clone());
    b.output(v.name, id);
    out.outputs.push_back(v.name);
  }
  ASPEN_RETURN_IF_ERROR(b.status());
  // GELU as exporters write it (eight elementwise ops) becomes one gelu: the compiler's fusion pass would
  // find it too, but a training graph is differentiated before compiling, and one gelu_grad is a third of
  // the time of the pieces' backward (GPT-2 small exported from torch: 7 % of a step).
  ASPEN_RETURN_IF_ERROR(compiler::simplify_exported_patterns(out.graph));
  return out;
}

}  // namespace aspen::models
