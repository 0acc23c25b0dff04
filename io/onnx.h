// io/onnx.h: reading ONNX models into a plain description.
//
// An .onnx file is a protobuf ModelProto (onnx.proto, read with Debian's
// libonnx_proto and libprotobuf). read_onnx_model() parses it and converts it
// into the structs below, which hold nothing of protobuf: building an aspen
// graph from them is the front end's work (models/onnx_import.h). Weights
// stored outside the file (external data, as exporters write models over
// 2 GB) are read from files beside it.
//
// Everything is validated before the model is returned, so a reader of the
// description needs no checks of its own beyond what the ops mean:
//   - sizes are bounded (the file, each tensor, the node count, rank, nesting);
//   - every tensor's bytes match its element type and dimensions;
//   - external data lies inside the model's directory (no absolute paths, no
//     "..", no symbolic link out of it) and inside its file;
//   - every value a node or the graph's outputs read is defined before it (a
//     graph input, an initializer, or an output of an earlier node, as ONNX
//     requires of a graph's node order), and no value is defined twice;
//   - the default domain's opset is imported.
// Every error names the file, and where there is one the node or tensor, what
// was expected and what was found.
//
//   ASPEN_ASSIGN_OR_RETURN(io::OnnxModel m, io::read_onnx_model("model.onnx"));
//   for (const io::OnnxNode& n : m.graph.nodes) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::io {

// ONNX's TensorProto.DataType numbers (onnx.proto).
enum class OnnxType : int32_t {
  undefined = 0,
  f32 = 1,
  u8 = 2,
  i8 = 3,
  u16 = 4,
  i16 = 5,
  i32 = 6,
  i64 = 7,
  string = 8,
  boolean = 9,
  f16 = 10,
  f64 = 11,
  u32 = 12,
  u64 = 13,
  c64 = 14,
  c128 = 15,
  bf16 = 16,
};
// The name ONNX gives a type number ("FLOAT", "INT64", ...; "type 99" for one it does not define).
std::string onnx_type_name(int32_t type);
// Bytes per element of the types whose tensors the reader holds; 0 for the others
// (strings, complex and sub-byte types).
size_t onnx_type_size(int32_t type);

// A tensor's values as little-endian bytes of its element type, row-major.
struct OnnxTensor {
  std::string name;
  int32_t type = 0;           // OnnxType
  std::vector<int64_t> dims;  // empty: a scalar
  std::string bytes;          // numel() * onnx_type_size(type) bytes
  int64_t numel() const;
};

// One dimension of a declared shape: a number, a named symbol (dim_param:
// "batch", "sequence"), or unknown (neither).
struct OnnxDim {
  int64_t value = -1;  // >= 0 when the extent is known
  std::string param;   // the symbol when value < 0 (may be empty: unknown)
};

struct OnnxValueInfo {
  std::string name;
  int32_t type = 0;        // OnnxType of a tensor; 0 when not given or not a tensor
  bool has_shape = false;  // false: the rank is not declared
  std::vector<OnnxDim> dims;
  // "[batch, 12]" ('?' for an unknown extent), or "(rank not declared)".
  std::string dims_text() const;
};

struct OnnxGraph;

enum class OnnxAttrType : int32_t {
  undefined = 0,
  f = 1,
  i = 2,
  s = 3,
  tensor = 4,
  graph = 5,
  floats = 6,
  ints = 7,
  strings = 8,
  tensors = 9,
  graphs = 10,
  sparse_tensor = 11,
  sparse_tensors = 12,
  type_proto = 13,
  type_protos = 14,
};
std::string onnx_attr_type_name(OnnxAttrType type);  // "FLOAT", "INTS", ...

struct OnnxAttribute {
  std::string name;
  OnnxAttrType type = OnnxAttrType::undefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<OnnxTensor> tensors;                       // one for TENSOR
  std::vector<std::shared_ptr<const OnnxGraph>> graphs;  // one for GRAPH (If, Loop, Scan bodies)
};

struct OnnxNode {
  std::string name;  // may be empty: errors then name the node by its index and first output
  std::string op_type;
  std::string domain;               // "" for the default domain (ai.onnx)
  std::vector<std::string> inputs;  // "" marks an optional input left out
  std::vector<std::string> outputs;
  std::vector<OnnxAttribute> attributes;
  // The node's metadata_props (ONNX 1.16's NodeProto field 9: torch.onnx records each node's module path,
  // torch op and source line there), in the file's order.
  std::vector<std::pair<std::string, std::string>> metadata;
  // nullptr when the node has no attribute of that name.
  const OnnxAttribute* find(const std::string& attr) const;
  // "node 12 'MatMul_3' (MatMul)": how errors name the node; with torch.onnx's metadata, the user's layer
  // too: "node 12 'node_linear' (MatMul; from torch: layer 'encoder.fc' (Linear), aten.linear.default,
  // model.py line 31)".
  std::string label(size_t index) const;
  // That user's part alone ("" without torch.onnx's metadata).
  std::string origin() const;
};

struct OnnxGraph {
  std::string name;
  std::vector<OnnxNode> nodes;           // in the file's order, which is a topological order
  std::vector<OnnxTensor> initializers;  // constant tensors (weights), by name
  std::vector<OnnxValueInfo> inputs;     // the graph's inputs, initializers excluded
  std::vector<OnnxValueInfo> outputs;
  std::vector<OnnxValueInfo> value_info;  // declared types of intermediate values
  const OnnxTensor* find_initializer(const std::string& tensor) const;
  const OnnxValueInfo* find_input(const std::string& input) const;  // nullptr: no graph input of that name
};

struct OnnxModel {
  std::string path;  // the file read, or the name given to read_onnx_model_from_bytes
  int64_t ir_version = 0;
  std::string producer_name, producer_version;
  std::map<std::string, int64_t> opsets;  // domain ("" for ai.onnx) -> version
  OnnxGraph graph;
  // The imported opset of `domain`, or 0 when it is not imported.
  int64_t opset(const std::string& domain = "") const;
};

struct OnnxReadLimits {
  uint64_t max_file_bytes = (uint64_t(1) << 31) - 1;  // protobuf's own limit on one message
  uint64_t max_tensor_bytes = uint64_t(1) << 36;      // 64 GiB: one initializer, inside or outside the file
  size_t max_nodes = 1 << 20;
  int max_rank = 32;
  int max_graph_depth = 8;  // nested subgraphs (If inside Loop inside ...)
};

// Reads and validates `path`; external data is read from files in its directory.
Result<OnnxModel> read_onnx_model(const std::string& path, const OnnxReadLimits& limits = {});
// The same validation over bytes in memory; `name` stands in for the path in errors. External data is
// read relative to `base_dir`, and refused when base_dir is empty.
Result<OnnxModel> read_onnx_model_from_bytes(std::span<const std::byte> bytes, const std::string& name = "<memory>",
                                             const std::string& base_dir = "", const OnnxReadLimits& limits = {});
// Writes a copy of the model at `src` to `dst` (atomically) with the named initializers' values replaced
// by `values` (name -> little-endian bytes of the initializer's own type and dims, as OnnxTensor::bytes
// holds them), and nothing else changed: trained weights written back so that any ONNX runtime runs the
// fine-tuned model. Every replaced initializer is stored inside the new file (raw_data). A name that is
// no initializer, or bytes of the wrong size, is an error naming it.
[[nodiscard]] Status write_onnx_with_initializers(const std::string& src, const std::string& dst,
                                                  const std::map<std::string, std::string>& values);

// A serialized TensorProto (the input_N.pb and output_N.pb files of ONNX's backend tests).
Result<OnnxTensor> read_onnx_tensor(const std::string& path, const OnnxReadLimits& limits = {});

}  // namespace aspen::io
