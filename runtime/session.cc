#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>

#include "core/memory_phases.h"
#include "core/weight_copies.h"
#include "graph/cost.h"

namespace aspen::runtime {

using compiler::Storage;

namespace {

const compiler::Binding* find(const std::vector<compiler::Binding>& list, const std::string& name) {
  for (const auto& b : list)
    if (b.name == name) return &b;
  return nullptr;
}

Shape with_leading(std::vector<int64_t> lead, const Shape& s) {
  lead.insert(lead.end(), s.begin(), s.end());
  return *Shape::make(lead.data(), int(lead.size()));
}

// NOTE [outputs written in place]: an output's value would be computed into
// the arena and then copied into the caller's tensor by its host_read (GPT-2's
// logits: 26 MB, 10 % of a bf16 run at batch 1). Where it is safe, the value's
// producer writes into the caller's buffer instead and the copy is skipped: the
// value lives in the arena, is made by one kernel instruction that does not
// run in place over one of its inputs, is the only output bound to it, and no
// instruction after its producer touches other bytes overlapping it (a view
// of it; the plan keeps outputs to the end, so nothing else reuses them). Steps
// that return no slice of the output, and summed outputs, still use the arena.
bool writable_in_place(const compiler::Executable& exe, int32_t v) {
  const std::vector<compiler::Slot>& slots = exe.plan.slots;
  const std::vector<compiler::Instruction>& code = exe.program.code;
  if (v < 0 || slots[size_t(v)].storage != Storage::arena || slots[size_t(v)].bytes == 0) return false;
  const compiler::Slot& y = slots[size_t(v)];
  auto overlaps = [&](int32_t u) {
    const compiler::Slot& x = slots[size_t(u)];
    return u != v && x.storage == y.storage && x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
  };
  size_t producer = code.size();
  for (size_t k = 0; k < code.size(); ++k) {
    if (std::find(code[k].outputs.begin(), code[k].outputs.end(), v) == code[k].outputs.end()) continue;
    if (producer != code.size() || code[k].kind != compiler::InstrKind::kernel || code[k].derived) return false;
    producer = k;
    if (std::any_of(code[k].inputs.begin(), code[k].inputs.end(), overlaps)) return false;  // in place
  }
  if (producer == code.size()) return false;
  for (size_t k = producer + 1; k < code.size(); ++k)
    if (std::any_of(code[k].inputs.begin(), code[k].inputs.end(), overlaps) ||
        std::any_of(code[k].outputs.begin(), code[k].outputs.end(), overlaps))
      return false;
  return true;
}

// By output binding: the value written in place, or -1.
std::vector<int32_t> direct_output_values(const compiler::Executable& exe) {
  std::vector<int32_t> out;
  for (const compiler::Binding& b : exe.outputs) {
    const auto bound = std::count_if(exe.outputs.begin(), exe.outputs.end(),
                                     [&](const compiler::Binding& o) { return o.value == b.value; });
    out.push_back(bound == 1 && writable_in_place(exe, b.value) ? b.value : -1);
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Session>> Session::create(std::unique_ptr<compiler::Executable> exe,
                                                 const SessionOptions& options) {
  std::vector<std::unique_ptr<compiler::Executable>> programs;
  programs.push_back(std::move(exe));
  return create(std::move(programs), options);
}

Result<std::unique_ptr<Session>> Session::create(std::vector<std::unique_ptr<compiler::Executable>> programs,
                                                 const SessionOptions& options) {
  if (options.replicas < 1)
    return Status::invalid_argument("session: replicas", ">= 1", std::to_string(options.replicas));
  if (programs.empty()) return Status::invalid_argument("session: programs", "at least one", "none");
  int threads = options.threads;
  if (threads == 0) threads = std::max(1, CoreBudget::global().available() / options.replicas);
  std::unique_ptr<Session> s(new Session());
  if (const char* slow = std::getenv("ASPEN_TEST_SLOW_INSTRUCTION")) {  // NOTE [slowed instruction]
    Session::Slowed w;
    if (std::sscanf(slow, "%d:%d:%lf", &w.program, &w.node, &w.fraction) != 3 || w.program < 0 || w.node < 0 ||
        !(w.fraction > 0 && w.fraction < 100))
      return Status::invalid_argument("ASPEN_TEST_SLOW_INSTRUCTION", "<program>:<node>:<fraction in (0, 100)>",
                                      std::string("'") + slow + "'");
    s->slowed_ = w;
  }
  std::map<std::string, size_t> by_name;
  int64_t arena = 64;
  auto is_local = [&](const std::string& name) {
    for (const std::string& prefix : options.replica_local)
      if (name.starts_with(prefix)) return true;
    return false;
  };
  for (size_t p = 0; p < programs.size(); ++p) {
    const compiler::Executable& exe = *programs[p];
    ProgramInfo info;
    for (const compiler::Binding& b : exe.updates)
      if (info.updates_shared.empty() && !is_local(b.name)) info.updates_shared = b.name;
    for (const compiler::Binding& b : exe.parameters) {
      auto [it, added] = by_name.emplace(b.name, s->parameters_.size());
      if (added) {
        const bool local = is_local(b.name);
        Tensor t;
        if (!local) {
          ASPEN_ASSIGN_OR_RETURN(t, Tensor::make(b.type.dtype, b.type.shape));
        }
        s->parameters_.push_back(std::move(t));
        s->local_.push_back(local);
        s->parameter_list_.push_back({b.name, -1, b.type});
      } else if (s->parameter_list_[it->second].type != b.type) {
        return Status::invalid_argument("session: parameter '" + b.name + "' of program " + std::to_string(p),
                                        s->parameter_list_[it->second].type.to_string() +
                                            " (as an earlier program has it)",
                                        b.type.to_string());
      }
      info.parameter_index.push_back(it->second);
    }
    for (const compiler::Instruction& ins : exe.program.code) {
      int64_t bytes = 0;
      for (int32_t v : ins.inputs) bytes += exe.plan.slots[size_t(v)].bytes;
      for (int32_t v : ins.outputs) bytes += exe.plan.slots[size_t(v)].bytes;
      info.instruction_bytes.push_back(bytes);
      info.instruction_flops.push_back(ins.node >= 0 ? int64_t(graph::node_flops(exe.graph, exe.graph.node(ins.node))) : 0);
      std::string types;  // what the kernel runs on, for per-shape profiles
      if (ins.node >= 0)
        for (graph::ValueId v : exe.graph.node(ins.node).inputs)
          types += (types.empty() ? "" : ", ") + exe.graph.type(v).to_string();
      info.instruction_inputs.push_back(std::move(types));
    }
    for (const compiler::Binding& b : exe.updates) info.updated.push_back(by_name.at(b.name));
    for (const compiler::Instruction& ins : exe.program.code) {
      if (!ins.derived && !ins.keeps_fixed) continue;
      info.watches = true;
      for (int32_t v : ins.inputs) {
        const compiler::Slot& sl = exe.plan.slots[size_t(v)];
        if (sl.storage != Storage::parameter) continue;
        const size_t i = info.parameter_index[size_t(sl.offset)];
        // A parameter this program updates is no weight-only input (a keeps_fixed kernel may read one).
        if (std::find(info.updated.begin(), info.updated.end(), i) != info.updated.end()) continue;
        if (std::find(info.watched.begin(), info.watched.end(), i) == info.watched.end()) info.watched.push_back(i);
      }
    }
    info.ready_after.resize(exe.program.code.size());
    for (size_t u = 0; u < exe.update_ready.size(); ++u)
      if (exe.update_ready[u] >= 0) info.ready_after[size_t(exe.update_ready[u])].push_back(int(u));
    s->programs_.push_back(std::move(info));
  }
  // Every replica gets its kernels prepared on its own team: a oneDNN plan is
  // made for the team size that runs it (compile() prepared the given
  // executables on the compiling thread, whose team may differ).
  for (int r = 0; r < options.replicas; ++r) {
    Replica rep;
    ASPEN_ASSIGN_OR_RETURN(rep.device, CpuDevice::create(options.device_name + std::to_string(r), threads));
    for (const auto& exe : programs) {
      // The replica's plan is the given executable's (the same graph and options): its weight-only values
      // are reserved first, and past the weight-copy budget (core/weight_copies.h) it is lowered without.
      compiler::CompileOptions lowering = exe->options;
      if (exe->plan.derived_bytes && !take_weight_copy_bytes(exe->plan.derived_bytes)) lowering.hoist_weights = false;
      Status lowered;
      rep.device->team().run([&] {
        auto e = compiler::lower_optimized(exe->graph, lowering);
        if (e.is_ok()) {
          rep.exes.push_back(std::move(e).value());
        } else {
          lowered = e.status();
        }
      });
      if (!lowered.is_ok() && lowering.hoist_weights) give_weight_copy_bytes(exe->plan.derived_bytes);
      ASPEN_RETURN_IF_ERROR(lowered);
      const compiler::MemoryPlan& plan = rep.exes.back()->plan;
      arena = std::max(arena, plan.arena_bytes);
      Replica::Derived d;
      if (plan.derived_bytes) {
        const int64_t n = plan.derived_bytes;
        d.bytes.reset(static_cast<uint8_t*>(aligned_alloc_zeroed(size_t(n))), [n](uint8_t* p) {
          aligned_free(p);
          give_weight_copy_bytes(n);
        });
        if (!d.bytes)
          return Status::error(Code::kFailedPrecondition,
                               "session: weight-only values of program " + std::to_string(rep.derived.size()),
                               std::to_string(plan.derived_bytes) + " bytes", "the allocation refused");
      }
      rep.derived.push_back(std::move(d));
      rep.direct.push_back(direct_output_values(*rep.exes.back()));
    }
    ASPEN_RETURN_IF_ERROR(rep.device->reserve_arena(arena));
    rep.own.resize(s->parameters_.size());
    std::vector<char> held(s->parameters_.size(), 1);
    for (size_t i = 0; i < s->parameters_.size(); ++i)
      if (s->local_[i]) {
        if (options.replica_uses && !options.replica_uses(r, s->parameter_list_[i].name)) {
          held[i] = 0;
          continue;
        }
        const graph::TensorType& t = s->parameter_list_[i].type;
        ASPEN_ASSIGN_OR_RETURN(rep.own[i], Tensor::make(t.dtype, t.shape));
      }
    for (const ProgramInfo& info : s->programs_) {
      std::string missing;
      for (size_t i : info.parameter_index)
        if (!held[i] && missing.empty()) missing = s->parameter_list_[i].name;
      rep.missing.push_back(missing);
    }
    rep.held = std::move(held);
    s->replicas_.push_back(std::move(rep));
  }
  s->changes_.reset(new std::atomic<uint64_t>[s->parameters_.size()]);
  for (size_t i = 0; i < s->parameters_.size(); ++i) s->changes_[i] = 0;
  s->trace_ = options.trace;
  note_memory_phase("session created");  // NOTE [memory phases]
  return s;
}

Status Session::set_parameter(const std::string& name, const Tensor& value) {
  const compiler::Binding* b = find(parameter_list_, name);
  if (!b) return Status::error(Code::kNotFound, "parameter '" + name + "'", "a parameter of the program", "none");
  if (value.dtype() != b->type.dtype || value.shape() != b->type.shape)
    return Status::invalid_argument("parameter '" + name + "'", b->type.to_string(),
                                    std::string(dtype_name(value.dtype())) + value.shape().to_string());
  const size_t i = size_t(b - parameter_list_.data());
  changed(i);
  if (local_[i]) {
    for (Replica& r : replicas_)  // those that hold a copy
      if (r.own[i].nbytes()) std::memcpy(r.own[i].raw(), value.raw(), r.own[i].nbytes());
  } else if (parameters_[i].nbytes()) {
    std::memcpy(parameters_[i].raw(), value.raw(), parameters_[i].nbytes());
  }
  return Status();
}

Status Session::set_communicator(int replica, const std::string& group, parallel::Communicator* comm) {
  if (replica < 0 || replica >= int(replicas_.size()))
    return Status::invalid_argument("set_communicator: replica", "an index below " + std::to_string(replicas_.size()),
                                    std::to_string(replica));
  replicas_[size_t(replica)].comms[group] = comm;
  return Status();
}

int Session::replica_index(const Replica& r) const { return int(&r - replicas_.data()); }

Tensor* Session::parameter_of(int replica, const std::string& name) {
  const compiler::Binding* b = find(parameter_list_, name);
  if (!b || replica < 0 || replica >= int(replicas_.size())) return nullptr;
  const size_t i = size_t(b - parameter_list_.data());
  changed(i);  // the caller may write through the pointer
  if (!local_[i]) return &parameters_[i];
  Replica& rep = replicas_[size_t(replica)];
  return rep.held[i] ? &rep.own[i] : nullptr;  // nullptr: not held here
}

Result<Tensor> Session::get_parameter(const std::string& name) const {
  const compiler::Binding* b = find(parameter_list_, name);
  if (!b) return Status::error(Code::kNotFound, "parameter '" + name + "'", "a parameter of the program", "none");
  const size_t i = size_t(b - parameter_list_.data());
  if (!local_[i]) return parameters_[i].clone();
  for (const Replica& r : replicas_)  // the first replica that holds a copy
    if (r.held[i]) return r.own[i].clone();
  return Status::error(Code::kNotFound, "parameter '" + name + "'", "a replica that holds it", "none");
}

const void* Session::resolve(const Replica& r, int program, int32_t value) const {
  const compiler::Executable& exe = *r.exes[size_t(program)];
  const compiler::Slot& s = exe.plan.slots[size_t(value)];
  switch (s.storage) {
    case Storage::arena: return r.device->arena() + s.offset;
    case Storage::parameter: {
      const size_t i = programs_[size_t(program)].parameter_index[size_t(s.offset)];
      return local_[i] ? r.own[i].raw() : parameters_[i].raw();
    }
    case Storage::constant: return exe.constants[size_t(s.offset)]->raw();
    case Storage::derived:
      return r.derived[size_t(program)].bytes.get() + s.offset;
    case Storage::none: break;
  }
  return nullptr;
}

int64_t returned_steps(const RunOptions& o) {
  switch (o.output_mode) {
    case OutputMode::all: return o.iterations;
    case OutputMode::every_n: return o.iterations / o.every_n;
    case OutputMode::final:
    case OutputMode::sum: return 0;
  }
  return 0;
}

namespace {

// A collective instruction: a group of one is the identity; a larger group
// runs on the communicator the replica was given for the node's group.
Status run_collective(const graph::Graph& g, const graph::Node& n, const void* in, void* out,
                      const std::map<std::string, parallel::Communicator*>& comms, int replica) {
  using graph::OpKind;
  const int64_t size = n.attrs.i_or("group_size", 1);
  const std::string group = n.attrs.s("group");
  if (size == 1) {
    const int64_t bytes = g.type(n.outputs[0]).bytes();
    if (in != out && bytes) std::memcpy(out, in, size_t(bytes));
    return Status();
  }
  auto it = comms.find(group);
  if (it == comms.end() || !it->second)
    return Status::error(Code::kFailedPrecondition,
                         std::string("collective ") + graph::op_name(n.op) + " over group '" + group + "' on replica " +
                             std::to_string(replica),
                         "a communicator for the group (Session::set_communicator)", "none");
  parallel::Communicator& c = *it->second;
  if (c.size() != size)
    return Status::error(Code::kFailedPrecondition,
                         std::string("collective ") + graph::op_name(n.op) + " over group '" + group + "'",
                         "a communicator of " + std::to_string(size) + " devices (the node's group_size)",
                         std::to_string(c.size()));
  switch (n.op) {
    case OpKind::all_reduce: {
      const graph::TensorType& t = g.type(n.outputs[0]);
      if (in != out && t.bytes()) std::memcpy(out, in, size_t(t.bytes()));
      return c.all_reduce(out, t.shape.numel(), t.dtype,
                          n.attrs.s("reduce") == "mean" ? parallel::ReduceOp::mean : parallel::ReduceOp::sum);
    }
    case OpKind::reduce_scatter: {
      const graph::TensorType& t = g.type(n.outputs[0]);
      return c.reduce_scatter(in, out, t.shape.numel(), t.dtype, parallel::ReduceOp::sum);
    }
    case OpKind::all_gather: {
      const graph::TensorType& t = g.type(n.inputs[0]);
      return c.all_gather(in, out, t.shape.numel(), t.dtype);
    }
    default: break;
  }
  return Status::error(Code::kInternal, "collective instruction", "a collective op", graph::op_name(n.op));
}

const char* trace_category(compiler::InstrKind kind) {
  switch (kind) {
    case compiler::InstrKind::kernel: return profile::category::kKernel;
    case compiler::InstrKind::collective: return profile::category::kCollective;
    case compiler::InstrKind::copy: return profile::category::kCopy;
    case compiler::InstrKind::host_write:
    case compiler::InstrKind::host_read: return profile::category::kHost;
  }
  return profile::category::kKernel;
}

}  // namespace

Status Session::execute_program(Replica& r, int program, const StepIO& io) {
  using compiler::InstrKind;
  if (!r.missing[size_t(program)].empty())
    return Status::error(Code::kFailedPrecondition,
                         "program " + std::to_string(program) + " on replica " + std::to_string(replica_index(r)),
                         "a replica that holds its parameters",
                         "one without its copy of '" + r.missing[size_t(program)] + "' (SessionOptions::replica_uses)");
  std::vector<const void*> in;
  std::vector<void*> out;
  const std::string& device = r.device->name();
  compiler::Executable& exe = *r.exes[size_t(program)];
  const ProgramInfo& info = programs_[size_t(program)];
  const std::vector<int64_t>& instruction_bytes = info.instruction_bytes;
  // Weight-only values are remade when a parameter they read changed since.
  Replica::Derived& derived = r.derived[size_t(program)];
  bool remake = false;
  if (info.watches) {
    remake = !derived.made;
    derived.made = true;
    derived.made_at.resize(info.watched.size());
    for (size_t k = 0; k < info.watched.size(); ++k) {
      const uint64_t now = changes_[info.watched[k]].load(std::memory_order_relaxed);
      remake = remake || derived.made_at[k] != now;
      derived.made_at[k] = now;
    }
  }
  for (size_t i : info.updated) changed(i);
  // NOTE [outputs written in place]: value -> the caller's buffer, this step.
  std::vector<std::pair<int32_t, void*>> direct;
  if (!io.sum)
    for (size_t b = 0; b < io.outputs.size(); ++b)
      if (io.outputs[b] && r.direct[size_t(program)][b] >= 0)
        direct.emplace_back(r.direct[size_t(program)][b], io.outputs[b]);
  auto where = [&](int32_t v) -> void* {
    for (const auto& [value, p] : direct)
      if (value == v) return p;
    return const_cast<void*>(resolve(r, program, v));
  };
  for (size_t k = 0; k < exe.program.code.size(); ++k) {
    compiler::Instruction& ins = exe.program.code[k];
    if (ins.derived && !remake) continue;
    if (ins.keeps_fixed && remake) ins.kernel->fixed_inputs_changed();
    in.clear();
    out.clear();
    for (int32_t v : ins.inputs) in.push_back(where(v));
    for (int32_t v : ins.outputs) out.push_back(where(v));
    const char* what = ins.node >= 0 ? graph::op_name(exe.graph.node(ins.node).op) : compiler::instr_kind_name(ins.kind);
    std::string label = what;
    if (trace_) {
      if (ins.kind == InstrKind::host_write) label += " " + exe.inputs[size_t(ins.binding)].name;
      if (ins.kind == InstrKind::host_read) label += " " + exe.outputs[size_t(ins.binding)].name;
    }
    profile::TraceScope scope(trace_, device, label, trace_category(ins.kind), instruction_bytes[k]);
    if (scope.active()) {
      if (ins.node >= 0) {
        const graph::Node& node = exe.graph.node(ins.node);
        scope.add_arg("program", std::to_string(program));
        scope.add_arg("node", std::to_string(ins.node));
        scope.add_arg("inputs", info.instruction_inputs[k]);
        scope.add_arg("layer", node.scope);  // NOTE [name scopes]
        if (node.backward) scope.add_arg("pass", "backward");
        scope.set_flops(info.instruction_flops[k]);
      }
      if (ins.reference) scope.add_arg("kernel", "reference");
      if (ins.derived) scope.add_arg("derived", "remade");
    }
    Status status;
    const bool slowed = ins.node >= 0 && ins.node == slowed_.node && program == slowed_.program;
    const auto began = slowed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    switch (ins.kind) {
      case InstrKind::kernel: status = ins.kernel->run(in, out); break;
      case InstrKind::collective:
        status = run_collective(exe.graph, exe.graph.node(ins.node), in.empty() ? nullptr : in[0],
                                out.empty() ? nullptr : out[0], r.comms, replica_index(r));
        break;
      case InstrKind::copy: {
        const int64_t bytes = exe.plan.slots[size_t(ins.outputs[0])].bytes;
        if (bytes) std::memcpy(out[0], in[0], size_t(bytes));
        break;
      }
      case InstrKind::host_write: {
        const int64_t bytes = exe.inputs[size_t(ins.binding)].type.bytes();
        if (bytes) std::memcpy(out[0], io.inputs[size_t(ins.binding)], size_t(bytes));
        break;
      }
      case InstrKind::host_read: {
        const compiler::Binding& b = exe.outputs[size_t(ins.binding)];
        void* dst = io.outputs[size_t(ins.binding)];
        if (!dst) break;  // not returned this step
        if (io.sum) {
          float* d = static_cast<float*>(dst);
          const float* src = static_cast<const float*>(in[0]);
          for (int64_t i = 0; i < b.type.shape.numel(); ++i) d[i] += src[i];
        } else if (b.type.bytes() && dst != in[0]) {  // equal: written in place (see above)
          std::memcpy(dst, in[0], size_t(b.type.bytes()));
        }
        break;
      }
    }
    if (slowed) spin_extra(began, slowed_.fraction);  // NOTE [slowed instruction]
    if (!status.is_ok()) {
      if (remake) derived.made = false;  // made again next run
      if (ins.node >= 0)
        return std::move(status).with_context("instruction for node " + std::to_string(ins.node) + " (" + what + ")");
      return status;
    }
    if (io.on_ready)
      for (int u : programs_[size_t(program)].ready_after[k]) (*io.on_ready)(u);
  }
  return Status();
}

void spin_for(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(seconds));
  while (std::chrono::steady_clock::now() < until) {
  }
}

void spin_extra(std::chrono::steady_clock::time_point began, double fraction) {
  spin_for(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() * fraction);
}

Session::Footprint Session::footprint() const {
  Footprint f;
  for (const Tensor& t : parameters_) f.parameters += int64_t(t.nbytes());
  for (const Replica& r : replicas_) {
    for (const Tensor& t : r.own) f.replica_copies += int64_t(t.nbytes());
    f.arenas += r.device->arena_bytes();
    for (size_t p = 0; p < r.exes.size(); ++p)
      if (r.derived[p].bytes) f.weight_only += r.exes[p]->plan.derived_bytes;
  }
  return f;
}

Status Session::check_inputs(const compiler::Executable& exe, const std::map<std::string, const Tensor*>& inputs,
                             int64_t steps, int64_t R) const {
  for (const auto& [name, t] : inputs)
    if (!find(exe.inputs, name))
      return Status::error(Code::kNotFound, "input '" + name + "'", "an input of the program", "none");
  std::vector<int64_t> lead;
  if (steps > 1) lead.push_back(steps);
  if (R > 1) lead.push_back(R);
  for (const compiler::Binding& b : exe.inputs) {
    auto it = inputs.find(b.name);
    const Shape shape = with_leading(lead, b.type.shape);
    std::string want = b.type.to_string();
    if (!lead.empty()) {
      want = std::string(dtype_name(b.type.dtype)) + shape.to_string() + " (";
      if (steps > 1) want += std::to_string(steps) + " iterations" + (R > 1 ? " × " : "");
      if (R > 1) want += std::to_string(R) + " replicas";
      want += " of " + b.type.to_string() + ")";
    }
    if (it == inputs.end() || it->second == nullptr)
      return Status::invalid_argument("input '" + b.name + "'", "a tensor " + want, "none given");
    const Tensor& t = *it->second;
    if (t.dtype() != b.type.dtype || t.shape() != shape)
      return Status::invalid_argument("input '" + b.name + "'", want,
                                      std::string(dtype_name(t.dtype())) + t.shape().to_string());
  }
  return Status();
}

std::vector<std::string> Session::direct_outputs(int program) const {
  std::vector<std::string> out;
  const compiler::Executable& exe = *replicas_.front().exes.at(size_t(program));
  const std::vector<int32_t>& direct = replicas_.front().direct.at(size_t(program));
  for (size_t b = 0; b < exe.outputs.size(); ++b)
    if (direct[b] >= 0) out.push_back(exe.outputs[b].name);
  return out;
}

Result<std::map<std::string, Tensor>> Session::make_outputs(const compiler::Executable& exe,
                                                            const std::vector<int64_t>& lead, bool zero) const {
  std::map<std::string, Tensor> result;
  for (const compiler::Binding& b : exe.outputs) {
    const Shape shape = with_leading(lead, b.type.shape);
    // Every slice is written by a successful run; only sums start from zero.
    ASPEN_ASSIGN_OR_RETURN(Tensor t, zero ? Tensor::make(b.type.dtype, shape)
                                          : Tensor::make_uninitialized(b.type.dtype, shape));
    result.emplace(b.name, std::move(t));
  }
  return result;
}

namespace {
// The replica whose for_each_replica function this thread is running (-1: none).
thread_local const Session* tl_session = nullptr;
thread_local int tl_replica = -1;
}  // namespace

Status Session::for_each_replica(const std::function<Status(int)>& fn) {
  const int R = int(replicas_.size());
  std::vector<Status> status(static_cast<size_t>(R));
  std::vector<std::future<void>> done;
  for (int r = 0; r < R; ++r)
    done.push_back(replicas_[size_t(r)].device->team().submit([&, r] {
      tl_session = this;
      tl_replica = r;
      status[size_t(r)] = fn(r);
      tl_session = nullptr;
      tl_replica = -1;
    }));
  for (auto& f : done) f.get();
  for (Status& s : status)
    if (!s.is_ok() && s.code() != Code::kAborted) return s;
  for (Status& s : status)
    if (!s.is_ok()) return s;
  return Status();
}

Result<std::map<std::string, Tensor>> Session::run_replica(int replica, const std::map<std::string, const Tensor*>& inputs,
                                                           int program) {
  return run_replica(replica, inputs, program, nullptr);
}

Result<std::map<std::string, Tensor>> Session::run_replica(int replica, const std::map<std::string, const Tensor*>& inputs,
                                                           int program, const std::function<void(int update)>& on_ready) {
  if (replica < 0 || replica >= int(replicas_.size()))
    return Status::invalid_argument("run_replica: replica", "an index below " + std::to_string(replicas_.size()),
                                    std::to_string(replica));
  if (program < 0 || program >= int(programs_.size()))
    return Status::invalid_argument("run_replica: program", "an index below " + std::to_string(programs_.size()),
                                    std::to_string(program));
  if (tl_session != this || tl_replica != replica) {
    Result<std::map<std::string, Tensor>> out = Status::error(Code::kInternal, "run_replica", "a result", "none");
    replicas_[size_t(replica)].device->team().run([&] {
      tl_session = this;
      tl_replica = replica;
      out = run_replica(replica, inputs, program, on_ready);
      tl_session = nullptr;
      tl_replica = -1;
    });
    return out;
  }
  Replica& rep = replicas_[size_t(replica)];
  const compiler::Executable& exe = *rep.exes[size_t(program)];
  ASPEN_RETURN_IF_ERROR(check_inputs(exe, inputs, 1, 1));
  auto made = make_outputs(exe, {}, false);
  ASPEN_RETURN_IF_ERROR(made.status());
  std::map<std::string, Tensor> result = std::move(made).value();
  StepIO io;
  for (const compiler::Binding& b : exe.inputs) io.inputs.push_back(inputs.at(b.name)->raw());
  for (const compiler::Binding& b : exe.outputs) io.outputs.push_back(result.at(b.name).raw());
  if (on_ready) io.on_ready = &on_ready;
  ASPEN_RETURN_IF_ERROR(execute_program(rep, program, io));
  return result;
}

Result<std::map<std::string, Tensor>> Session::run(const std::map<std::string, const Tensor*>& inputs) {
  return run(inputs, RunOptions{});
}

Result<std::map<std::string, Tensor>> Session::run(const std::map<std::string, const Tensor*>& inputs,
                                                   const RunOptions& options, int program) {
  if (program < 0 || program >= int(programs_.size()))
    return Status::invalid_argument("run: program", "an index below " + std::to_string(programs_.size()),
                                    std::to_string(program));
  const compiler::Executable& exe = executable(program);
  const int64_t steps = options.iterations;
  const int64_t R = int64_t(replicas_.size());
  if (steps < 1) return Status::invalid_argument("run: iterations", ">= 1", std::to_string(steps));
  if (options.output_mode == OutputMode::every_n && (options.every_n < 1 || steps % options.every_n != 0))
    return Status::invalid_argument("run: every_n", "a divisor of iterations " + std::to_string(steps),
                                    std::to_string(options.every_n));
  ASPEN_RETURN_IF_ERROR(check_inputs(exe, inputs, steps, R));
  if (R > 1 && !programs_[size_t(program)].updates_shared.empty())
    return Status::error(Code::kFailedPrecondition,
                         "run: program " + std::to_string(program) + " on " + std::to_string(R) + " replicas",
                         "a program that updates only replica-local parameters",
                         "one that updates shared parameter '" + programs_[size_t(program)].updates_shared +
                             "' (the replicas would race)",
                         "run it on one replica at a time (run_replica)");
  for (const compiler::Binding& b : exe.outputs)
    if (options.output_mode == OutputMode::sum && b.type.dtype != DType::f32)
      return Status::unimplemented("run: OutputMode::sum of output '" + b.name + "' (" + b.type.to_string() + ")",
                                   "dtype for summing (f32)");
  // Output buffers, made before the run so the device loops never allocate.
  const int64_t kept = returned_steps(options);
  std::vector<int64_t> out_lead;
  if (kept > 0) out_lead.push_back(kept);
  if (R > 1) out_lead.push_back(R);
  auto made = make_outputs(exe, out_lead, options.output_mode == OutputMode::sum);
  ASPEN_RETURN_IF_ERROR(made.status());
  std::map<std::string, Tensor> result = std::move(made).value();

  // Replica r, step s: its slice is number (s * R + r) of the input's slices.
  std::vector<const char*> input_data;  // by position in exe.inputs (the same in every replica)
  for (const compiler::Binding& b : exe.inputs) input_data.push_back(static_cast<const char*>(inputs.at(b.name)->raw()));
  std::vector<Status> status(static_cast<size_t>(R));
  std::vector<std::future<void>> done;
  for (int64_t r = 0; r < R; ++r) {
    Replica& rep = replicas_[size_t(r)];
    done.push_back(rep.device->team().submit([&, r] {
      Status& st = status[size_t(r)];
      for (int64_t step = 0; step < steps; ++step) {
        StepIO io;
        io.sum = options.output_mode == OutputMode::sum;
        for (size_t k = 0; k < exe.inputs.size(); ++k) {
          const size_t bytes = size_t(exe.inputs[k].type.bytes());
          io.inputs.push_back(input_data[k] + (step * R + r) * bytes);
        }
        for (const compiler::Binding& b : exe.outputs) {
          char* dst = static_cast<char*>(result.at(b.name).raw());
          const size_t bytes = size_t(b.type.bytes());
          int64_t slot = -1;  // which output slice this step writes, if any
          switch (options.output_mode) {
            case OutputMode::final: slot = step == steps - 1 ? r : -1; break;
            case OutputMode::all: slot = step * R + r; break;
            case OutputMode::every_n:
              slot = (step + 1) % options.every_n == 0 ? ((step + 1) / options.every_n - 1) * R + r : -1;
              break;
            case OutputMode::sum: slot = r; break;
          }
          io.outputs.push_back(slot >= 0 ? dst + size_t(slot) * bytes : nullptr);
        }
        st = execute_program(rep, program, io);
        if (!st.is_ok()) {
          for (auto& [group, comm] : rep.comms)  // peers in a collective stop now, not at their timeout
            if (comm) comm->abort("replica " + std::to_string(r) + ": " + st.message());
          if (steps > 1) st = std::move(st).with_context("iteration " + std::to_string(step));
          if (R > 1) st = std::move(st).with_context("replica " + std::to_string(r));
          return;
        }
      }
    }));
  }
  for (auto& f : done) f.get();
  for (Status& s : status)
    if (!s.is_ok()) return s;
  return result;
}

}  // namespace aspen::runtime
