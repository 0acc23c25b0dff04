// compiler/compile.cc: the pipeline and lowering.
#include <algorithm>
#include <cstring>

#include "compiler/executable.h"
#include "core/memory_phases.h"
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

bool is_collective(OpKind op) { return graph::op_has(op, graph::kCommunicates); }

Status lower(Executable& exe) {
  const Graph& g = exe.graph;
  for (int32_t i : g.input_nodes()) {
    const Node& n = g.node(i);
    Instruction ins;
    ins.kind = InstrKind::host_write;
    ins.binding = int32_t(exe.inputs.size());
    ins.outputs = {n.outputs[0].index};
    exe.inputs.push_back({n.name, n.outputs[0].index, g.type(n.outputs[0])});
    exe.program.code.push_back(std::move(ins));
  }
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
    const Node& n = g.node(i);
    switch (n.op) {
      case OpKind::input:
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
    if (exe.plan.views[size_t(i)]) continue;  // its output is its input's bytes
    Instruction ins;
    ins.node = i;
    ins.derived = exe.plan.derived(g, i);
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
    if (is_collective(n.op)) {
      ins.kind = InstrKind::collective;
      exe.program.code.push_back(std::move(ins));
      continue;
    }
    // Weight-only inputs (constants, parameters no update writes, derived
    // values) of a kernel that can keep work made from them.
    std::vector<char> fixed;
    if (!exe.plan.weight_only.empty() && info.prepare_fixed) {
      for (graph::ValueId v : n.inputs) fixed.push_back(exe.plan.weight_only[size_t(v.index)]);
      if (std::find(fixed.begin(), fixed.end(), 1) == fixed.end()) fixed.clear();
    }
    if (!fixed.empty()) {
      auto k = info.prepare_fixed(n, in_types, out_types, fixed);
      if (!k.is_ok()) return k.status().with_context("lowering node " + std::to_string(i) + " (" + info.name + ")");
      ins.kernel = std::move(k).value();
      ins.keeps_fixed = ins.kernel != nullptr;
    } else if (info.prepare) {
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
  // Updates not planned in place: a copy into the parameter as soon as both
  // the new value exists and nothing later reads the old one (so the
  // parameter is final early: Executable::update_ready, which lets a
  // data-parallel step start reducing a gradient while the backward pass
  // goes on). The value stays live to the end (it is a root), so copying
  // early is safe. A copy must not read a parameter that this step also
  // updates (it would see the new value).
  std::vector<int32_t> writer(size_t(g.num_values()), -1);  // value -> the instruction that writes it
  for (size_t k = 0; k < exe.program.code.size(); ++k)
    for (int32_t o : exe.program.code[k].outputs) writer[size_t(o)] = int32_t(k);
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i)  // a view is written with its bytes' owner
    if (exe.plan.views[size_t(i)])
      writer[size_t(g.node(i).outputs[0].index)] = writer[size_t(g.node(i).inputs[0].index)];
  std::vector<std::pair<int32_t, Instruction>> copies;  // (after instruction, copy), in update order
  for (const auto& [name, v] : g.updates()) {
    const graph::ValueId p = *g.find_parameter(name);
    exe.updates.push_back({name, v.index, g.type(v)});
    const Slot &src = exe.plan.slots[size_t(v.index)], &dst = exe.plan.slots[size_t(p.index)];
    int32_t after = writer[size_t(v.index)];  // -1: a parameter or constant, there from the start
    // The last instruction that reads the parameter's bytes (its old value; in
    // place, also a later reader of the new one): after it, nothing does.
    for (size_t k = 0; k < exe.program.code.size(); ++k)
      for (int32_t in : exe.program.code[k].inputs)
        if (exe.plan.slots[size_t(in)].storage == dst.storage && exe.plan.slots[size_t(in)].offset == dst.offset)
          after = std::max(after, int32_t(k));
    if (src.storage == dst.storage && src.offset == dst.offset) {  // in place: final once written and read
      exe.update_ready.push_back(after);
      continue;
    }
    if (src.storage == Storage::parameter)
      for (const auto& [other, ov] : g.updates())
        if (exe.plan.slots[size_t(g.find_parameter(other)->index)].offset == src.offset)
          return Status::error(Code::kUnimplemented, "update of parameter '" + name + "'",
                                       "a value that does not read parameter '" + other +
                                           "', which this step also updates",
                                       "%" + std::to_string(v.index));
    Instruction ins;
    ins.kind = InstrKind::copy;
    ins.inputs = {v.index};
    ins.outputs = {p.index};
    copies.emplace_back(after, std::move(ins));
    exe.update_ready.push_back(-2 - int32_t(copies.size() - 1));  // resolved below: copy k's place
  }
  // Splice the copies in after their instructions (stable: update order among equals).
  std::vector<int32_t> copy_at(copies.size());
  std::vector<Instruction> code;
  code.reserve(exe.program.code.size() + copies.size());
  std::vector<int32_t> moved(exe.program.code.size());
  std::vector<size_t> order(copies.size());
  for (size_t c = 0; c < copies.size(); ++c) order[c] = c;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return copies[a].first < copies[b].first; });
  size_t next = 0;
  auto emit_copies_after = [&](int32_t k) {
    while (next < order.size() && copies[order[next]].first == k) {
      copy_at[order[next]] = int32_t(code.size());
      code.push_back(std::move(copies[order[next]].second));
      ++next;
    }
  };
  emit_copies_after(-1);
  for (size_t k = 0; k < exe.program.code.size(); ++k) {
    moved[k] = int32_t(code.size());
    code.push_back(std::move(exe.program.code[k]));
    emit_copies_after(int32_t(k));
  }
  exe.program.code = std::move(code);
  for (int32_t& r : exe.update_ready) r = r <= -2 ? copy_at[size_t(-2 - r)] : r >= 0 ? moved[size_t(r)] : -1;
  for (const auto& [name, v] : g.outputs()) {
    Instruction ins;
    ins.kind = InstrKind::host_read;
    ins.binding = int32_t(exe.outputs.size());
    ins.inputs = {v.index};
    exe.outputs.push_back({name, v.index, g.type(v)});
    exe.program.code.push_back(std::move(ins));
  }
  return Status();
}

}  // namespace

const char* instr_kind_name(InstrKind kind) {
  switch (kind) {
    case InstrKind::host_write: return "host_write";
    case InstrKind::kernel: return "kernel";
    case InstrKind::collective: return "collective";
    case InstrKind::copy: return "copy";
    case InstrKind::host_read: return "host_read";
  }
  return "?";
}

std::string Executable::listing() const {
  auto slot = [&](int32_t v) {
    const Slot& sl = plan.slots[size_t(v)];
    std::string where = sl.storage == Storage::arena       ? std::to_string(sl.offset)
                        : sl.storage == Storage::parameter ? "param:" + parameters[size_t(sl.offset)].name
                        : sl.storage == Storage::derived   ? "derived:" + std::to_string(sl.offset)
                                                           : "const";
    return "%" + std::to_string(v) + "@" + where;
  };
  std::string s;
  for (const Instruction& ins : program.code) {
    if (ins.kind == InstrKind::kernel || ins.kind == InstrKind::collective) {
      s += std::string(ins.kind == InstrKind::collective ? "collective " : "") +
           graph::op_name(graph.node(ins.node).op) + (ins.reference ? " [reference]" : "") +
           (ins.derived ? " [derived]" : "");
    } else {
      s += instr_kind_name(ins.kind);
      if (ins.kind == InstrKind::host_write) s += " \"" + inputs[size_t(ins.binding)].name + "\"";
      if (ins.kind == InstrKind::host_read) s += " \"" + outputs[size_t(ins.binding)].name + "\"";
    }
    s += " (";
    for (size_t i = 0; i < ins.inputs.size(); ++i) s += (i ? ", " : "") + slot(ins.inputs[i]);
    s += ") ->";
    for (int32_t o : ins.outputs) s += " " + slot(o);
    s += "\n";
  }
  return s;
}

Result<std::unique_ptr<Executable>> compile(const Graph& graph_in, const CompileOptions& options) {
  ASPEN_RETURN_IF_ERROR(Status(graph::verify(graph_in)).with_context("compile"));
  Graph g = graph_in;
  CompileContext ctx{options};
  ASPEN_RETURN_IF_ERROR(run_passes(g, default_pipeline(options), ctx));
  return lower_optimized(std::move(g), options);
}

Result<std::unique_ptr<Executable>> lower_optimized(Graph optimized, const CompileOptions& options) {
  auto exe = std::make_unique<Executable>();
  exe->options = options;
  exe->graph = std::move(optimized);
  ASPEN_ASSIGN_OR_RETURN(exe->plan, plan_memory(exe->graph, options.hoist_weights));
  ASPEN_RETURN_IF_ERROR(lower(*exe));
  note_memory_phase("compiled");  // NOTE [memory phases]
  return exe;
}

}  // namespace aspen::compiler
