#include "io/onnx.h"

#include <limits.h>
#include <stdlib.h>

#include <bit>
#include <cstring>
#include <set>

#include "core/atomic_file.h"
#include "core/file.h"
#include "onnx/onnx_pb.h"  // defines ONNX_API, then includes onnx-ml.pb.h (ONNX_ML)

#include <google/protobuf/unknown_field_set.h>

namespace aspen::io {

static_assert(std::endian::native == std::endian::little, "ONNX's raw_data is little-endian, as this reader keeps it");

std::string onnx_type_name(int32_t type) {
  static const char* const kNames[] = {"UNDEFINED",      "FLOAT",    "UINT8",        "INT8",           "UINT16",
                                       "INT16",          "INT32",    "INT64",        "STRING",         "BOOL",
                                       "FLOAT16",        "DOUBLE",   "UINT32",       "UINT64",         "COMPLEX64",
                                       "COMPLEX128",     "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
                                       "FLOAT8E5M2FNUZ", "UINT4",    "INT4",         "FLOAT4E2M1",     "FLOAT8E8M0"};
  if (type >= 0 && size_t(type) < std::size(kNames)) return kNames[type];
  return "type " + std::to_string(type);
}

size_t onnx_type_size(int32_t type) {
  switch (OnnxType(type)) {
    case OnnxType::u8:
    case OnnxType::i8:
    case OnnxType::boolean:
      return 1;
    case OnnxType::u16:
    case OnnxType::i16:
    case OnnxType::f16:
    case OnnxType::bf16:
      return 2;
    case OnnxType::f32:
    case OnnxType::i32:
    case OnnxType::u32:
      return 4;
    case OnnxType::i64:
    case OnnxType::f64:
    case OnnxType::u64:
      return 8;
    default:
      return 0;
  }
}

std::string onnx_attr_type_name(OnnxAttrType type) {
  static const char* const kNames[] = {
      "UNDEFINED", "FLOAT",   "INT",    "STRING",        "TENSOR",         "GRAPH",      "FLOATS",     "INTS",
      "STRINGS",   "TENSORS", "GRAPHS", "SPARSE_TENSOR", "SPARSE_TENSORS", "TYPE_PROTO", "TYPE_PROTOS"};
  const int t = int(type);
  if (t >= 0 && size_t(t) < std::size(kNames)) return kNames[t];
  return "attribute type " + std::to_string(t);
}

int64_t OnnxTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // bounded when read (every product fits)
  return n;
}

const OnnxAttribute* OnnxNode::find(const std::string& attr) const {
  for (const OnnxAttribute& a : attributes)
    if (a.name == attr) return &a;
  return nullptr;
}

std::string OnnxNode::label(size_t index) const {
  std::string s = "node " + std::to_string(index);
  if (!name.empty())
    s += " '" + escape_for_terminal(name) + "'";
  else if (!outputs.empty())
    s += " (output '" + escape_for_terminal(outputs[0]) + "')";
  const std::string from = origin();
  return s + " (" + escape_for_terminal(domain.empty() ? op_type : domain + "." + op_type) +
         (from.empty() ? "" : "; " + from) + ")";
}

namespace {
// The quoted items of a Python list's repr: "['', 'up', 'conv2d']" -> {"", "up", "conv2d"}.
std::vector<std::string> python_list(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\'' && s[i] != '"') continue;
    const size_t end = s.find(s[i], i + 1);
    if (end == std::string::npos) break;
    out.push_back(s.substr(i + 1, end - i - 1));
    i = end;
  }
  return out;
}
}  // namespace

// NOTE [node origins]: torch.onnx (the dynamo exporter) records in each node's metadata_props its module
// path (pkg.torch.onnx.name_scopes: each enclosing module's full path from the model down, then the op), the classes
// (pkg.torch.onnx.class_hierarchy: the modules', then the aten op) and the Python stack
// (pkg.torch.onnx.stack_trace). Errors name the user's layer, its class, the torch op and the innermost
// frame outside torch's own files: what the user wrote.
std::string OnnxNode::origin() const {
  std::string scopes, classes, trace;
  for (const auto& [k, v] : metadata) {
    if (k == "pkg.torch.onnx.name_scopes") scopes = v;
    if (k == "pkg.torch.onnx.class_hierarchy") classes = v;
    if (k == "pkg.torch.onnx.stack_trace") trace = v;
  }
  if (scopes.empty() && classes.empty()) return "";
  const std::vector<std::string> path = python_list(scopes), cls = python_list(classes);
  // Each scope is the full path of a module ("", "net", "net.bn1"), then the op: the layer is the last module.
  const std::string layer = path.size() >= 2 ? path[path.size() - 2] : "";
  std::string s = "from torch: ";
  if (cls.size() >= 2) {
    std::string c = cls[cls.size() - 2];
    c = c.substr(c.rfind('.') == std::string::npos ? 0 : c.rfind('.') + 1);
    s += layer.empty() ? "the model (" + c + ")" : "layer '" + layer + "' (" + c + ")";
  } else if (!layer.empty()) {
    s += "layer '" + layer + "'";
  }
  if (!cls.empty()) s += (s.size() > 12 ? ", " : "") + cls.back();
  // The innermost frame of the user's code: File "<path>", line N, in <function>, outside torch's files.
  std::string where;
  size_t at = 0;
  while ((at = trace.find("File \"", at)) != std::string::npos) {
    const size_t q = trace.find('"', at + 6);
    const size_t line = trace.find(", line ", q == std::string::npos ? at : q);
    if (q == std::string::npos || line == std::string::npos) break;
    const std::string file = trace.substr(at + 6, q - at - 6);
    size_t n = line + 7, e = n;
    while (e < trace.size() && trace[e] >= '0' && trace[e] <= '9') ++e;
    if (file.find("/torch/") == std::string::npos && file.find("/transformers/") == std::string::npos)
      where = file.substr(file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1) + " line " +
              trace.substr(n, e - n);
    at = e;
  }
  if (!where.empty()) s += ", " + where;
  return escape_for_terminal(s);
}

std::string OnnxValueInfo::dims_text() const {
  if (!has_shape) return "(rank not declared)";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? ", " : "") + (dims[i].value >= 0      ? std::to_string(dims[i].value)
                            : dims[i].param.empty() ? std::string("?")
                                                    : escape_for_terminal(dims[i].param));
  return s + "]";
}

const OnnxValueInfo* OnnxGraph::find_input(const std::string& input) const {
  for (const OnnxValueInfo& v : inputs)
    if (v.name == input) return &v;
  return nullptr;
}

const OnnxTensor* OnnxGraph::find_initializer(const std::string& tensor) const {
  for (const OnnxTensor& t : initializers)
    if (t.name == tensor) return &t;
  return nullptr;
}

int64_t OnnxModel::opset(const std::string& domain) const {
  auto it = opsets.find(domain);
  return it == opsets.end() ? 0 : it->second;
}

namespace {

std::string quoted(const std::string& s) { return "'" + escape_for_terminal(s) + "'"; }

// Converts protobuf messages into the plain description, checking each as it goes. `where` is the file
// (and graph) that errors name.
class Reader {
 public:
  Reader(std::string file, std::string base_dir, const OnnxReadLimits& limits)
      : file_(std::move(file)), base_dir_(std::move(base_dir)), limits_(limits) {}

  Result<OnnxModel> model(::onnx::ModelProto& m);
  Result<OnnxTensor> tensor(::onnx::TensorProto& t, const std::string& what);

 private:
  Result<OnnxGraph> graph(::onnx::GraphProto& g, const std::set<std::string>& outer, int depth);
  Result<OnnxValueInfo> value_info(const ::onnx::ValueInfoProto& v, const std::string& what);
  Result<OnnxAttribute> attribute(::onnx::AttributeProto& a, const std::string& node,
                                  const std::set<std::string>& scope, int depth);
  Status external_data(const ::onnx::TensorProto& t, const std::string& what, uint64_t want, std::string& out);

  Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) const {
    return Status::error(Code::kCorrupt, file_ + ": " + subject, expected, found);
  }

  std::string file_, base_dir_;
  OnnxReadLimits limits_;
};

template <class Field, class T>
void append_le(std::string& out, const Field& values, size_t size) {
  for (const auto& v : values) {
    const T x = T(v);
    char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    out.append(b, size);  // the low `size` bytes (little-endian): int32_data holds narrower types widened
  }
}

Result<OnnxTensor> Reader::tensor(::onnx::TensorProto& t, const std::string& what) {
  OnnxTensor out;
  out.name = t.name();
  out.type = t.data_type();
  const std::string subject = what + " " + quoted(t.name());
  const size_t size = onnx_type_size(out.type);
  if (size == 0)
    return Status::error(Code::kUnimplemented, file_ + ": " + subject,
                         "a numeric element type (FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT8-64, UINT8-64, BOOL)",
                         onnx_type_name(out.type));
  if (t.dims_size() > limits_.max_rank)
    return corrupt(subject, "rank at most " + std::to_string(limits_.max_rank),
                   "rank " + std::to_string(t.dims_size()));
  uint64_t numel = 1;
  for (int i = 0; i < t.dims_size(); ++i) {
    const int64_t d = t.dims(i);
    if (d < 0) return corrupt(subject, "non-negative dims", std::to_string(d) + " at dimension " + std::to_string(i));
    if (d > 0 && numel > limits_.max_tensor_bytes / size / uint64_t(d))
      return corrupt(subject, "at most " + std::to_string(limits_.max_tensor_bytes) + " bytes",
                     "dims past that at dimension " + std::to_string(i));
    numel *= uint64_t(d);
    out.dims.push_back(d);
  }
  const uint64_t want = numel * size;
  const bool external = t.data_location() == ::onnx::TensorProto_DataLocation_EXTERNAL;
  const int typed = t.float_data_size() + t.int32_data_size() + t.int64_data_size() + t.double_data_size() +
                    t.uint64_data_size() + t.string_data_size();
  if (int(t.has_raw_data()) + int(typed > 0) + int(external) > 1)
    return corrupt(subject, "its values in one place (raw_data, a typed field, or external data)", "more than one");
  if (external) {
    ASPEN_RETURN_IF_ERROR(external_data(t, subject, want, out.bytes));
    return out;
  }
  if (t.has_raw_data() || typed == 0) {
    if (t.raw_data().size() != want)
      return corrupt(subject, std::to_string(want) + " bytes of " + onnx_type_name(out.type) + " data",
                     std::to_string(t.raw_data().size()) + " bytes");
    out.bytes.swap(*t.mutable_raw_data());
    return out;
  }
  int64_t count = 0;
  const char* field = "";
  switch (OnnxType(out.type)) {
    case OnnxType::f32:
      field = "float_data", count = t.float_data_size();
      if (count == int64_t(numel)) append_le<decltype(t.float_data()), float>(out.bytes, t.float_data(), 4);
      break;
    case OnnxType::f64:
      field = "double_data", count = t.double_data_size();
      if (count == int64_t(numel)) append_le<decltype(t.double_data()), double>(out.bytes, t.double_data(), 8);
      break;
    case OnnxType::i64:
      field = "int64_data", count = t.int64_data_size();
      if (count == int64_t(numel)) append_le<decltype(t.int64_data()), int64_t>(out.bytes, t.int64_data(), 8);
      break;
    case OnnxType::u32:
    case OnnxType::u64:
      field = "uint64_data", count = t.uint64_data_size();
      if (count == int64_t(numel)) append_le<decltype(t.uint64_data()), uint64_t>(out.bytes, t.uint64_data(), size);
      break;
    default:  // the types ONNX keeps in int32_data: 8- and 16-bit integers, bool, FLOAT16 and BFLOAT16 bits
      field = "int32_data", count = t.int32_data_size();
      if (count == int64_t(numel)) append_le<decltype(t.int32_data()), int32_t>(out.bytes, t.int32_data(), size);
      break;
  }
  if (count != int64_t(numel) || typed != count)
    return corrupt(subject, std::to_string(numel) + " values in " + field + " (" + onnx_type_name(out.type) + ")",
                   std::to_string(typed) + " values");
  return out;
}

// External data: {location, offset, length} of a file in the model's directory (and nowhere else).
Status Reader::external_data(const ::onnx::TensorProto& t, const std::string& what, uint64_t want, std::string& out) {
  std::string location;
  uint64_t offset = 0;
  bool has_length = false;
  uint64_t length = 0;
  for (const auto& kv : t.external_data()) {
    auto number = [&](uint64_t& v) -> Status {
      const std::string& s = kv.value();
      if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos)
        return corrupt(what + ": external data " + kv.key(), "a decimal number", quoted(s));
      v = std::stoull(s);
      return Status();
    };
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset") {
      ASPEN_RETURN_IF_ERROR(number(offset));
    } else if (kv.key() == "length") {
      ASPEN_RETURN_IF_ERROR(number(length));
      has_length = true;
    } else if (kv.key() != "checksum") {
      return corrupt(what + ": external data", "the keys location, offset, length, checksum",
                     "key " + quoted(kv.key()));
    }
  }
  if (location.empty()) return corrupt(what + ": external data", "a location", "none");
  if (has_length && length != want)
    return corrupt(what + ": external data length", std::to_string(want) + " bytes (its dims and type)",
                   std::to_string(length));
  if (base_dir_.empty())
    return Status::error(Code::kFailedPrecondition, file_ + ": " + what, "weights inside the model",
                         "external data in " + quoted(location) + ", and no directory to read it from");
  if (location[0] == '/' || location.find('\0') != std::string::npos || location == ".." ||
      location.rfind("../", 0) == 0 || location.find("/../") != std::string::npos ||
      (location.size() >= 3 && location.compare(location.size() - 3, 3, "/..") == 0))
    return corrupt(what + ": external data location", "a file inside the model's directory", quoted(location));
  const std::string path = base_dir_ + "/" + location;
  char real_dir[PATH_MAX], real_file[PATH_MAX];
  if (!realpath(base_dir_.c_str(), real_dir) || !realpath(path.c_str(), real_file))
    return Status::error(Code::kNotFound, file_ + ": " + what + ": external data", "the file " + quoted(path),
                         "no such file");
  const std::string dir_prefix = std::string(real_dir) + "/";
  if (std::string(real_file).rfind(dir_prefix, 0) != 0)
    return corrupt(what + ": external data location", "a file inside the model's directory",
                   quoted(location) + ", which resolves to " + quoted(real_file));
  ASPEN_ASSIGN_OR_RETURN(const InputFile in, InputFile::open(real_file, kMaxBinaryFileBytes));
  if (offset > in.size() || want > in.size() - offset)
    return corrupt(what + ": external data in " + quoted(location),
                   "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + want) + ") inside the file",
                   "a file of " + std::to_string(in.size()) + " bytes");
  out.resize(size_t(want));
  return in.pread_exact(offset, out.data(), want);
}

Result<OnnxValueInfo> Reader::value_info(const ::onnx::ValueInfoProto& v, const std::string& what) {
  OnnxValueInfo out;
  out.name = v.name();
  if (out.name.empty()) return corrupt(what, "a name", "an empty one");
  if (!v.has_type() || !v.type().has_tensor_type()) return out;  // sequences, maps, optionals: typed 0
  const auto& tt = v.type().tensor_type();
  out.type = tt.elem_type();
  if (!tt.has_shape()) return out;
  out.has_shape = true;
  if (tt.shape().dim_size() > limits_.max_rank)
    return corrupt(what + " " + quoted(out.name), "rank at most " + std::to_string(limits_.max_rank),
                   "rank " + std::to_string(tt.shape().dim_size()));
  for (const auto& d : tt.shape().dim()) {
    OnnxDim dim;
    if (d.has_dim_value()) {
      if (d.dim_value() < 0)
        return corrupt(what + " " + quoted(out.name), "non-negative dims", std::to_string(d.dim_value()));
      dim.value = d.dim_value();
    } else if (d.has_dim_param()) {
      dim.param = d.dim_param();
    }
    out.dims.push_back(std::move(dim));
  }
  return out;
}

Result<OnnxAttribute> Reader::attribute(::onnx::AttributeProto& a, const std::string& node,
                                        const std::set<std::string>& scope, int depth) {
  OnnxAttribute out;
  out.name = a.name();
  out.type = OnnxAttrType(a.type());
  const std::string subject = node + ": attribute " + quoted(a.name());
  if (!a.ref_attr_name().empty())
    return Status::error(Code::kUnimplemented, file_ + ": " + subject, "a value",
                         "a reference to the function attribute " + quoted(a.ref_attr_name()));
  switch (out.type) {
    case OnnxAttrType::f:
      out.f = a.f();
      break;
    case OnnxAttrType::i:
      out.i = a.i();
      break;
    case OnnxAttrType::s:
      out.s = a.s();
      break;
    case OnnxAttrType::floats:
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case OnnxAttrType::ints:
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case OnnxAttrType::strings:
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case OnnxAttrType::tensor: {
      ASPEN_ASSIGN_OR_RETURN(OnnxTensor t, tensor(*a.mutable_t(), subject + ": tensor"));
      out.tensors.push_back(std::move(t));
      break;
    }
    case OnnxAttrType::tensors:
      for (auto& t : *a.mutable_tensors()) {
        ASPEN_ASSIGN_OR_RETURN(OnnxTensor x, tensor(t, subject + ": tensor"));
        out.tensors.push_back(std::move(x));
      }
      break;
    case OnnxAttrType::graph: {
      ASPEN_ASSIGN_OR_RETURN(OnnxGraph g, graph(*a.mutable_g(), scope, depth + 1));
      out.graphs.push_back(std::make_shared<const OnnxGraph>(std::move(g)));
      break;
    }
    case OnnxAttrType::graphs:
      for (auto& g : *a.mutable_graphs()) {
        ASPEN_ASSIGN_OR_RETURN(OnnxGraph x, graph(g, scope, depth + 1));
        out.graphs.push_back(std::make_shared<const OnnxGraph>(std::move(x)));
      }
      break;
    default:
      return Status::error(Code::kUnimplemented, file_ + ": " + subject,
                           "a FLOAT, INT, STRING, TENSOR, GRAPH or list attribute", onnx_attr_type_name(out.type));
  }
  return out;
}

// `outer`: the names a subgraph may read from the graphs around it.
Result<OnnxGraph> Reader::graph(::onnx::GraphProto& g, const std::set<std::string>& outer, int depth) {
  if (depth > limits_.max_graph_depth)
    return corrupt("graph " + quoted(g.name()),
                   "subgraphs nested at most " + std::to_string(limits_.max_graph_depth) + " deep", "deeper");
  if (size_t(g.node_size()) > limits_.max_nodes)
    return corrupt("graph " + quoted(g.name()), "at most " + std::to_string(limits_.max_nodes) + " nodes",
                   std::to_string(g.node_size()));
  if (g.sparse_initializer_size() > 0)
    return Status::error(Code::kUnimplemented, file_ + ": graph " + quoted(g.name()), "dense initializers",
                         "sparse initializer " + quoted(g.sparse_initializer(0).values().name()));
  OnnxGraph out;
  out.name = g.name();
  std::set<std::string> scope = outer, defined;  // defined: in this graph (each once)
  auto define = [&](const std::string& name, const std::string& by) -> Status {
    if (name.empty()) return Status();
    if (!defined.insert(name).second)
      return corrupt("value " + quoted(name), "one definition", "a second one by " + by);
    scope.insert(name);
    return Status();
  };
  for (auto& t : *g.mutable_initializer()) {
    if (t.name().empty()) return corrupt("an initializer", "a name", "an empty one");
    ASPEN_ASSIGN_OR_RETURN(OnnxTensor x, tensor(t, "initializer"));
    ASPEN_RETURN_IF_ERROR(define(x.name, "an initializer"));
    out.initializers.push_back(std::move(x));
  }
  for (const auto& v : g.input()) {
    ASPEN_ASSIGN_OR_RETURN(OnnxValueInfo x, value_info(v, "graph input"));
    if (out.find_initializer(x.name)) continue;  // IR < 4 lists initializers among the inputs too
    ASPEN_RETURN_IF_ERROR(define(x.name, "a graph input"));
    out.inputs.push_back(std::move(x));
  }
  out.nodes.reserve(size_t(g.node_size()));
  for (int k = 0; k < g.node_size(); ++k) {
    ::onnx::NodeProto& n = *g.mutable_node(k);
    OnnxNode node;
    node.name = n.name();
    node.op_type = n.op_type();
    node.domain = n.domain() == "ai.onnx" ? "" : n.domain();
    node.outputs.assign(n.output().begin(), n.output().end());
    // metadata_props (field 9 of ONNX 1.16's NodeProto): unknown to the schema this reader is built with,
    // so read from the unknown fields, each a StringStringEntryProto.
    const auto& unknown = n.GetReflection()->GetUnknownFields(n);
    for (int f = 0; f < unknown.field_count(); ++f) {
      const auto& field = unknown.field(f);
      if (field.number() != 9 || field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      ::onnx::StringStringEntryProto e;
      if (e.ParseFromString(field.length_delimited()) && node.metadata.size() < 64)
        node.metadata.emplace_back(e.key().substr(0, 4096), e.value().substr(0, 16384));
    }
    const std::string label = node.label(size_t(k));
    if (node.op_type.empty()) return corrupt(label, "an op_type", "an empty one");
    for (const std::string& in : n.input()) {
      if (!in.empty() && !scope.count(in))
        return corrupt(label + ": input " + quoted(in),
                       "a value defined before the node (graph input, initializer or earlier node's output)", "none");
      node.inputs.push_back(in);
    }
    std::set<std::string> names;
    for (auto& a : *n.mutable_attribute()) {
      if (!names.insert(a.name()).second) return corrupt(label, "each attribute once", "two named " + quoted(a.name()));
      ASPEN_ASSIGN_OR_RETURN(OnnxAttribute x, attribute(a, label, scope, depth));
      node.attributes.push_back(std::move(x));
    }
    for (const std::string& o : node.outputs) ASPEN_RETURN_IF_ERROR(define(o, label));
    out.nodes.push_back(std::move(node));
  }
  for (const auto& v : g.output()) {
    ASPEN_ASSIGN_OR_RETURN(OnnxValueInfo x, value_info(v, "graph output"));
    if (!scope.count(x.name)) return corrupt("graph output " + quoted(x.name), "a value the graph defines", "none");
    out.outputs.push_back(std::move(x));
  }
  for (const auto& v : g.value_info()) {
    ASPEN_ASSIGN_OR_RETURN(OnnxValueInfo x, value_info(v, "value_info"));
    out.value_info.push_back(std::move(x));
  }
  return out;
}

Result<OnnxModel> Reader::model(::onnx::ModelProto& m) {
  OnnxModel out;
  out.path = file_;
  out.ir_version = m.ir_version();
  out.producer_name = m.producer_name();
  out.producer_version = m.producer_version();
  if (out.ir_version < 3) return corrupt("ir_version", "3 or later (opset imports)", std::to_string(out.ir_version));
  for (const auto& o : m.opset_import()) {
    const std::string domain = o.domain() == "ai.onnx" ? "" : o.domain();
    if (!out.opsets.emplace(domain, o.version()).second)
      return corrupt("opset_import", "each domain once", "domain " + quoted(domain) + " twice");
  }
  if (out.opset("") < 1) return corrupt("opset_import", "the default domain (ai.onnx) imported", "no opset for it");
  if (!m.has_graph()) return corrupt("model", "a graph", "none");
  ASPEN_ASSIGN_OR_RETURN(out.graph, graph(*m.mutable_graph(), {}, 0));
  return out;
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Result<OnnxModel> read_onnx_model_from_bytes(std::span<const std::byte> bytes, const std::string& name,
                                             const std::string& base_dir, const OnnxReadLimits& limits) {
  if (bytes.size() > limits.max_file_bytes)
    return Status::error(Code::kCorrupt, name,
                         "at most " + std::to_string(limits.max_file_bytes) +
                             " bytes (larger models keep their weights as external data)",
                         std::to_string(bytes.size()) + " bytes");
  if (bytes.empty())
    return Status::error(Code::kCorrupt, name, "an ONNX model (a protobuf ModelProto)", "an empty file");
  ::onnx::ModelProto m;
  if (!m.ParseFromArray(bytes.data(), int(bytes.size())))
    return Status::error(Code::kCorrupt, name, "an ONNX model (a protobuf ModelProto)",
                         "bytes that do not parse as one (" + std::to_string(bytes.size()) + " bytes)");
  return Reader(name, base_dir, limits).model(m);
}

Result<OnnxModel> read_onnx_model(const std::string& path, const OnnxReadLimits& limits) {
  ASPEN_ASSIGN_OR_RETURN(std::string bytes, read_regular_file(path, limits.max_file_bytes));
  return read_onnx_model_from_bytes(std::as_bytes(std::span(bytes.data(), bytes.size())), path, directory_of(path),
                                    limits);
}

Status write_onnx_with_initializers(const std::string& src, const std::string& dst,
                                    const std::map<std::string, std::string>& values) {
  // The source is validated whole first (so the copy is of a model this reader accepts).
  ASPEN_ASSIGN_OR_RETURN(const OnnxModel checked, read_onnx_model(src));
  ASPEN_ASSIGN_OR_RETURN(std::string bytes, read_regular_file(src, OnnxReadLimits{}.max_file_bytes));
  ::onnx::ModelProto m;
  if (!m.ParseFromArray(bytes.data(), int(bytes.size())))
    return Status::error(Code::kCorrupt, src, "an ONNX model", "bytes that do not parse as one");
  std::map<std::string, bool> used;
  for (const auto& [name, v] : values) used[name] = false;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    auto it = values.find(t.name());
    if (it == values.end()) continue;
    const OnnxTensor* info = checked.graph.find_initializer(t.name());
    const size_t want = info ? info->bytes.size() : 0;
    if (it->second.size() != want)
      return Status::invalid_argument("initializer " + quoted(t.name()),
                                      std::to_string(want) + " bytes (" + onnx_type_name(t.data_type()) + ")",
                                      std::to_string(it->second.size()) + " bytes");
    t.clear_float_data();
    t.clear_int32_data();
    t.clear_int64_data();
    t.clear_double_data();
    t.clear_uint64_data();
    t.clear_external_data();
    t.clear_data_location();
    t.set_raw_data(it->second);
    used[t.name()] = true;
  }
  for (const auto& [name, u] : used)
    if (!u) return Status::invalid_argument("weight " + quoted(name), "an initializer of " + src, "none of that name");
  std::string out;
  if (!m.SerializeToString(&out))
    return Status::error(Code::kInternal, dst, "a serializable model", "a serialization failure (over 2 GiB?)");
  return write_file_atomic(dst, out);
}

Result<OnnxTensor> read_onnx_tensor(const std::string& path, const OnnxReadLimits& limits) {
  ASPEN_ASSIGN_OR_RETURN(std::string bytes, read_regular_file(path, limits.max_file_bytes));
  ::onnx::TensorProto t;
  if (!t.ParseFromArray(bytes.data(), int(bytes.size())))
    return Status::error(Code::kCorrupt, path, "an ONNX tensor (a protobuf TensorProto)",
                         "bytes that do not parse as one (" + std::to_string(bytes.size()) + " bytes)");
  return Reader(path, directory_of(path), limits).tensor(t, "tensor");
}

}  // namespace aspen::io
