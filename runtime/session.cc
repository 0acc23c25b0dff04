#include "runtime/session.h"

#include <cstring>

namespace aspen::runtime {

using compiler::Storage;

Result<std::unique_ptr<Session>> Session::create(std::unique_ptr<compiler::Executable> exe,
                                                 const SessionOptions& options) {
  std::unique_ptr<Session> s(new Session());
  ASPEN_ASSIGN_OR_RETURN(s->device_, CpuDevice::create(options.device_name, options.threads));
  ASPEN_RETURN_IF_ERROR(s->device_->reserve_arena(std::max<int64_t>(exe->plan.arena_bytes, 64)));
  for (const compiler::Binding& p : exe->parameters) {
    ASPEN_ASSIGN_OR_RETURN(Tensor t, Tensor::make(p.type.dtype, p.type.shape));
    s->parameters_.push_back(std::move(t));
  }
  s->exe_ = std::move(exe);
  return s;
}

static const compiler::Binding* find(const std::vector<compiler::Binding>& list, const std::string& name) {
  for (const auto& b : list)
    if (b.name == name) return &b;
  return nullptr;
}

Status Session::set_parameter(const std::string& name, const Tensor& value) {
  const compiler::Binding* b = find(exe_->parameters, name);
  if (!b) return Status::error(Code::kNotFound, "parameter '" + name + "'", "a parameter of the program", "none");
  if (value.dtype() != b->type.dtype || value.shape() != b->type.shape)
    return Status::invalid_argument("parameter '" + name + "'", b->type.to_string(),
                                    std::string(dtype_name(value.dtype())) + value.shape().to_string());
  Tensor& dst = parameters_[size_t(exe_->plan.slots[size_t(b->value)].offset)];
  if (dst.nbytes()) std::memcpy(dst.raw(), value.raw(), dst.nbytes());
  return Status();
}

Result<Tensor> Session::get_parameter(const std::string& name) const {
  const compiler::Binding* b = find(exe_->parameters, name);
  if (!b) return Status::error(Code::kNotFound, "parameter '" + name + "'", "a parameter of the program", "none");
  return parameters_[size_t(exe_->plan.slots[size_t(b->value)].offset)].clone();
}

const void* Session::resolve(int32_t value) const {
  const compiler::Slot& s = exe_->plan.slots[size_t(value)];
  switch (s.storage) {
    case Storage::arena: return device_->arena() + s.offset;
    case Storage::parameter: return parameters_[size_t(s.offset)].raw();
    case Storage::constant: return exe_->constants[size_t(s.offset)]->raw();
    case Storage::none: break;
  }
  return nullptr;
}

void* Session::resolve_mut(int32_t value) { return const_cast<void*>(resolve(value)); }

Result<std::map<std::string, Tensor>> Session::run(const std::map<std::string, const Tensor*>& inputs) {
  for (const auto& [name, t] : inputs)
    if (!find(exe_->inputs, name))
      return Status::error(Code::kNotFound, "input '" + name + "'", "an input of the program", "none");
  for (const compiler::Binding& b : exe_->inputs) {
    auto it = inputs.find(b.name);
    if (it == inputs.end() || it->second == nullptr)
      return Status::invalid_argument("input '" + b.name + "'", "a tensor " + b.type.to_string(), "none given");
    const Tensor& t = *it->second;
    if (t.dtype() != b.type.dtype || t.shape() != b.type.shape)
      return Status::invalid_argument("input '" + b.name + "'", b.type.to_string(),
                                      std::string(dtype_name(t.dtype())) + t.shape().to_string());
  }
  Status status;
  std::map<std::string, Tensor> result;
  device_->team().run([&] {
    for (const compiler::Binding& b : exe_->inputs)
      if (b.type.bytes()) std::memcpy(resolve_mut(b.value), inputs.at(b.name)->raw(), size_t(b.type.bytes()));
    std::vector<const void*> in;
    std::vector<void*> out;
    for (compiler::Instruction& ins : exe_->program.code) {
      in.clear();
      out.clear();
      for (int32_t v : ins.inputs) in.push_back(resolve(v));
      for (int32_t v : ins.outputs) out.push_back(resolve_mut(v));
      status = ins.kernel->run(in, out);
      if (!status.is_ok()) {
        status = std::move(status).with_context("instruction for node " + std::to_string(ins.node) + " (" +
                                                graph::op_name(exe_->graph.node(ins.node).op) + ")");
        return;
      }
    }
    for (const compiler::Binding& b : exe_->outputs) {
      Tensor t(b.type.dtype, b.type.shape);
      if (t.nbytes()) std::memcpy(t.raw(), resolve(b.value), t.nbytes());
      result.emplace(b.name, std::move(t));
    }
  });
  if (!status.is_ok()) return status;
  return result;
}

}  // namespace aspen::runtime
