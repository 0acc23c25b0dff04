// compiler/compile.cc: the pipeline and lowering.
#include <cstring>

#include "compiler/executable.h"
#include "graph/interpreter.h"
#include "graph/verify.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;

namespace {

// Runs an op's reference kernel on device buffers: reads each input into f64,
// evaluates, rounds each output to its dtype and writes it back.
class ReferenceKernel : public graph::PreparedKernel {
 public:
  ReferenceKernel(const Node& node, std::vector<graph::TensorType> in, std::vector<graph::TensorType> out)
      : node_(node), in_types_(std::move(in)), out_types_(std::move(out)) {}

  Status run(std::span<const void* const> in, std::span<void* const> out) override {
    std::vector<graph::HostArray> ins;
    for (size_t i = 0; i < in.size(); ++i) ins.push_back(read(in_types_[i], in[i]));
    std::vector<const graph::HostArray*> ptrs;
    for (const auto& a : ins) ptrs.push_back(&a);
    std::vector<graph::HostArray> outs;
    for (const auto& t : out_types_) outs.emplace_back(t);
    ASPEN_RETURN_IF_ERROR(graph::op_info(node_.op).eval(node_, ptrs, outs));
    for (size_t i = 0; i < out.size(); ++i) write(outs[i], out[i]);
    return Status();
  }

 private:
  static graph::HostArray read(const graph::TensorType& t, const void* p) {
    Tensor tmp(t.dtype, t.shape);
    if (tmp.nbytes()) std::memcpy(tmp.raw(), p, tmp.nbytes());
    return graph::HostArray::from_tensor(tmp);
  }
  static void write(const graph::HostArray& a, void* p) {
    Tensor t = a.to_tensor();
    if (t.nbytes()) std::memcpy(p, t.raw(), t.nbytes());
  }
  Node node_;
  std::vector<graph::TensorType> in_types_, out_types_;
};

Status lower(Executable& exe) {
  const Graph& g = exe.graph;
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
    const Node& n = g.node(i);
    switch (n.op) {
      case OpKind::input:
        exe.inputs.push_back({n.name, n.outputs[0].index, g.type(n.outputs[0])});
        continue;
      case OpKind::parameter:
        exe.parameters.push_back({n.name, n.outputs[0].index, g.type(n.outputs[0])});
        continue;
      case OpKind::constant:
        exe.constants.push_back(n.constant);
        continue;
      default:
        break;
    }
    Instruction ins;
    ins.node = i;
    std::vector<graph::TensorType> in_types, out_types;
    for (graph::ValueId v : n.inputs) {
      ins.inputs.push_back(v.index);
      in_types.push_back(g.type(v));
    }
    for (graph::ValueId v : n.outputs) {
      ins.outputs.push_back(v.index);
      out_types.push_back(g.type(v));
    }
    const graph::OpInfo& info = graph::op_info(n.op);
    if (info.prepare) {
      auto k = info.prepare(n, in_types, out_types);
      if (!k.is_ok())
        return k.status().with_context("lowering node " + std::to_string(i) + " (" + info.name + ")");
      ins.kernel = std::move(k).value();
    }
    if (!ins.kernel) {  // no fast kernel, or none for these types
      ins.reference = true;
      ins.kernel = std::make_unique<ReferenceKernel>(n, in_types, out_types);
    }
    exe.program.code.push_back(std::move(ins));
  }
  for (const auto& [name, v] : g.outputs()) exe.outputs.push_back({name, v.index, g.type(v)});
  return Status();
}

}  // namespace

std::string Executable::listing() const {
  std::string s;
  for (const Instruction& ins : program.code) {
    const Node& n = graph.node(ins.node);
    s += std::string(graph::op_name(n.op)) + (ins.reference ? " [reference]" : "") + " (";
    for (size_t i = 0; i < ins.inputs.size(); ++i) {
      const Slot& sl = plan.slots[size_t(ins.inputs[i])];
      s += (i ? ", %" : "%") + std::to_string(ins.inputs[i]) + "@" +
           (sl.storage == Storage::arena ? std::to_string(sl.offset) : sl.storage == Storage::parameter ? "param" : "const");
    }
    s += ") ->";
    for (int32_t o : ins.outputs) s += " %" + std::to_string(o) + "@" + std::to_string(plan.slots[size_t(o)].offset);
    s += "\n";
  }
  return s;
}

Result<std::unique_ptr<Executable>> compile(const Graph& graph_in, const CompileOptions& options) {
  ASPEN_RETURN_IF_ERROR(Status(graph::verify(graph_in)).with_context("compile"));
  auto exe = std::make_unique<Executable>();
  exe->options = options;
  exe->graph = graph_in;
  CompileContext ctx{options};
  ASPEN_RETURN_IF_ERROR(run_passes(exe->graph, default_pipeline(options), ctx));
  ASPEN_ASSIGN_OR_RETURN(exe->plan, plan_memory(exe->graph));
  ASPEN_RETURN_IF_ERROR(lower(*exe));
  return exe;
}

Result<std::unique_ptr<Executable>> lower_optimized(Graph optimized, const CompileOptions& options) {
  auto exe = std::make_unique<Executable>();
  exe->options = options;
  exe->graph = std::move(optimized);
  ASPEN_ASSIGN_OR_RETURN(exe->plan, plan_memory(exe->graph));
  ASPEN_RETURN_IF_ERROR(lower(*exe));
  return exe;
}

}  // namespace aspen::compiler
