// models/onnx_import.h: an ONNX model (io/onnx.h's description) as an aspen graph.
//
//   ASPEN_ASSIGN_OR_RETURN(io::OnnxModel file, io::read_onnx_model("model.onnx"));
//   ASPEN_ASSIGN_OR_RETURN(models::OnnxImport m, models::import_onnx(file, {.dims = {{"batch", 2}}}));
//   auto model = *api::InferenceModel::create(m.graph);
//   model->copy_weights_to_device(m.weight_pointers());
//
// Shapes are static, as Poplar's are: every symbolic dimension of the graph's
// inputs ("batch", "sequence") is bound from `dims` or from an input's full
// shape in `input_shapes`, and the graph is built for those shapes. Values
// known at import (initializers of integer type, Constant nodes, and
// everything computed only from them and from shapes: Shape, Gather on
// shapes, Range, ConstantOfShape, Expand's target, Reshape's shape, ...) are
// folded to constants there, through the same conversions and the reference
// interpreter, so the graph keeps only the computation on the inputs.
//
// Float initializers become parameters (named as in the file; their values in
// `weights`), so the model can be trained and its weights written back,
// except those `frozen` names and those of one element (unless `trainable`
// names them): exporters write a model's scalars (an epsilon, an exponent, an
// attention scale) as initializers of shape [] or [1], and they are no
// weights. Other initializers are constants.
//
// Ops: the default domain at opsets 13 to 21, each mapped onto the IR's ops
// (decomposed where the IR has no op of its own; models/onnx_ops.cc lists
// them), and onnxruntime's fused com.microsoft ops (models/onnx_ops_microsoft.cc).
// A model with ops the importer does not know is refused before any is
// built, naming every such node (op type, domain, opset) at once; an
// attribute or input value an op does not support is an error naming the
// node, the attribute and the opset.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "compiler/pass.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "io/onnx.h"

namespace aspen::models {

struct OnnxImportOptions {
  // Extents of symbolic dimensions, by name ("batch" -> 2).
  std::map<std::string, int64_t> dims;
  // Whole shapes of graph inputs, by name (overriding what the file declares, where it declares a shape
  // these must agree with every fixed extent).
  std::map<std::string, std::vector<int64_t>> input_shapes;
  // Graph inputs bound to values at import, by name: they become constants (folded with everything
  // computed from them), as a shape or an axis an exporter left as an input. The program has no such input.
  std::map<std::string, const Tensor*> constants;
  // Float initializers kept constant (not trained), by name pattern (fnmatch: '*', '?', '[...]'), e.g.
  // "*rotary_emb.inv_freq" for a buffer the exporter wrote as an initializer.
  std::vector<std::string> frozen;
  // One-element float initializers trained all the same, by name pattern (a learnt temperature).
  std::vector<std::string> trainable;
  // Pipeline stages by node-name prefix: stage k >= 1 begins at the first node (in the file's order, after
  // stage k - 1's beginning) whose name starts with stage_begins[k - 1]; the nodes before the first such
  // node are stage 0. A prefix no later node matches is an InvalidArgument naming it. Empty: a node's
  // metadata "aspen.stage" (a stage number: aspen.poptorch's blocks write it) tags it, and untagged nodes
  // take the latest stage of their inputs (train/pipeline.h). The tags matter only to a pipelined
  // training model; inference ignores them.
  std::vector<std::string> stage_begins;
};

struct OnnxImport {
  graph::Graph graph;
  std::vector<std::string> inputs;        // the graph's inputs, in the file's order
  std::vector<std::string> outputs;       // the graph's outputs, in the file's order
  std::map<std::string, Tensor> weights;  // the value of every parameter
  int64_t opset = 0;
  // What copy_weights_to_device takes (pointers into `weights`).
  std::map<std::string, const Tensor*> weight_pointers() const;
  // Every parameter's type, by name: what export_onnx_weights checks trained weights against.
  std::map<std::string, graph::TensorType> parameter_types() const;
};

Result<OnnxImport> import_onnx(const io::OnnxModel& model, const OnnxImportOptions& options = {});

// A loss for training an imported graph: a scalar output "loss" over one of its outputs, and an input
// for the targets.
//   cross_entropy: `output` holds logits [..., V]; the targets input is i64 [...] (the logits' shape
//     without the class axis), class ids or ignore_index; the mean over the rows not ignored
//     (torch.nn.functional.cross_entropy).
//   mse: the targets input has the output's type; the mean of (output - targets)^2 (torch's mse_loss).
struct OnnxLoss {
  enum class Kind { cross_entropy, mse };
  Kind kind = Kind::cross_entropy;
  std::string output = {};          // the graph output the loss reads
  std::string targets = "targets";  // the name of the new input
  int64_t ignore_index = -100;
};
// Adds the targets input and the "loss" output to m.graph (an input or output of either name already
// there is an error naming it).
Status add_onnx_loss(OnnxImport& m, const OnnxLoss& loss);

// Writes a copy of the model file `src` to `dst` with the parameters' values from `weights` (the
// imported model's names, as TrainingModel::copy_weights_to_host returns them; entries that are no
// parameter of the import, such as optimizer state, are left out), nothing else changed.
[[nodiscard]] Status export_onnx_weights(const std::map<std::string, graph::TensorType>& parameters,
                                         const std::string& src, const std::string& dst,
                                         const std::map<std::string, Tensor>& weights);
[[nodiscard]] inline Status export_onnx_weights(const OnnxImport& m, const std::string& src, const std::string& dst,
                                                const std::map<std::string, Tensor>& weights) {
  return export_onnx_weights(m.parameter_types(), src, dst, weights);
}

// An ONNX tensor (an initializer, a test's input_<k>.pb) as an aspen tensor: its element type must be one
// aspen has (bool bytes other than 0 read as true). Unimplemented naming `what` and the type otherwise.
Result<Tensor> tensor_from_onnx(const io::OnnxTensor& t, const std::string& what);

// The run-time input a training Dropout draws its mask from (i64 [1]; NOTE [training dropout] in
// onnx_ops_nn.cc): the importer adds it (and lists it in OnnxImport::inputs) once for all of a file's
// training Dropouts; the trainer and the Python package feed it per micro-batch (-1: no dropout).
inline constexpr const char* kDropoutSeedInput = compiler::kRandomSeedInput;

// The op types (in the default domain) the importer converts, sorted.
std::vector<std::string> onnx_supported_ops();
// The oldest opset of the default domain at which the importer converts `op_type` (its meaning from that
// version on: NOTE [older opsets] in onnx_ops.cc); 0 for an op it does not convert.
int onnx_op_since(const std::string& op_type);

}  // namespace aspen::models
