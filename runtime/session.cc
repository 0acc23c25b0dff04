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
  s->trace_ = options.trace;
  for (const compiler::Instruction& ins : s->exe_->program.code) {
    int64_t bytes = 0;
    for (int32_t v : ins.inputs) bytes += s->exe_->plan.slots[size_t(v)].bytes;
    for (int32_t v : ins.outputs) bytes += s->exe_->plan.slots[size_t(v)].bytes;
    s->instruction_bytes_.push_back(bytes);
  }
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

int64_t returned_steps(const RunOptions& o) {
  switch (o.output_mode) {
    case OutputMode::all: return o.iterations;
    case OutputMode::every_n: return o.iterations / o.every_n;
    case OutputMode::final:
    case OutputMode::sum: return 0;
  }
  return 0;
}

Status Session::execute_program() {
  std::vector<const void*> in;
  std::vector<void*> out;
  const std::string& device = device_->name();
  for (size_t k = 0; k < exe_->program.code.size(); ++k) {
    compiler::Instruction& ins = exe_->program.code[k];
    in.clear();
    out.clear();
    for (int32_t v : ins.inputs) in.push_back(resolve(v));
    for (int32_t v : ins.outputs) out.push_back(resolve_mut(v));
    profile::TraceScope scope(trace_, device, graph::op_name(exe_->graph.node(ins.node).op),
                              profile::category::kKernel, instruction_bytes_[k]);
    if (scope.active()) {
      scope.add_arg("node", std::to_string(ins.node));
      if (ins.reference) scope.add_arg("kernel", "reference");
    }
    Status status = ins.kernel->run(in, out);
    if (!status.is_ok())
      return std::move(status).with_context("instruction for node " + std::to_string(ins.node) + " (" +
                                            graph::op_name(exe_->graph.node(ins.node).op) + ")");
  }
  return Status();
}

Result<std::map<std::string, Tensor>> Session::run(const std::map<std::string, const Tensor*>& inputs) {
  return run(inputs, RunOptions{});
}

namespace {

std::vector<int64_t> with_leading(int64_t n, const Shape& s) {
  std::vector<int64_t> d = {n};
  d.insert(d.end(), s.begin(), s.end());
  return d;
}

}  // namespace

Result<std::map<std::string, Tensor>> Session::run(const std::map<std::string, const Tensor*>& inputs,
                                                   const RunOptions& options) {
  const int64_t steps = options.iterations;
  if (steps < 1) return Status::invalid_argument("run: iterations", ">= 1", std::to_string(steps));
  if (options.output_mode == OutputMode::every_n && (options.every_n < 1 || steps % options.every_n != 0))
    return Status::invalid_argument("run: every_n", "a divisor of iterations " + std::to_string(steps),
                                    std::to_string(options.every_n));
  for (const auto& [name, t] : inputs)
    if (!find(exe_->inputs, name))
      return Status::error(Code::kNotFound, "input '" + name + "'", "an input of the program", "none");
  for (const compiler::Binding& b : exe_->inputs) {
    auto it = inputs.find(b.name);
    std::string want = b.type.to_string();
    Shape shape = b.type.shape;
    if (steps > 1) {
      auto d = with_leading(steps, b.type.shape);
      shape = *Shape::make(d.data(), int(d.size()));
      want = std::string(dtype_name(b.type.dtype)) + shape.to_string() + " (" + std::to_string(steps) +
             " iterations of " + b.type.to_string() + ")";
    }
    if (it == inputs.end() || it->second == nullptr)
      return Status::invalid_argument("input '" + b.name + "'", "a tensor " + want, "none given");
    const Tensor& t = *it->second;
    if (t.dtype() != b.type.dtype || t.shape() != shape)
      return Status::invalid_argument("input '" + b.name + "'", want,
                                      std::string(dtype_name(t.dtype())) + t.shape().to_string());
  }
  // Output buffers, made before the run so the device loop never allocates.
  const int64_t kept = returned_steps(options);
  std::map<std::string, Tensor> result;
  for (const compiler::Binding& b : exe_->outputs) {
    Shape shape = b.type.shape;
    if (kept > 0) {
      auto d = with_leading(kept, b.type.shape);
      shape = *Shape::make(d.data(), int(d.size()));
    }
    ASPEN_ASSIGN_OR_RETURN(Tensor t, Tensor::make(b.type.dtype, shape));
    result.emplace(b.name, std::move(t));
  }
  const bool summing = options.output_mode == OutputMode::sum;
  for (const compiler::Binding& b : exe_->outputs)
    if (summing && b.type.dtype != DType::f32)
      return Status::unimplemented("run: OutputMode::sum of output '" + b.name + "' (" + b.type.to_string() + ")",
                                   "dtype for summing (f32)");
  Status status;
  device_->team().run([&] {
    for (int64_t step = 0; step < steps && status.is_ok(); ++step) {
      for (const compiler::Binding& b : exe_->inputs) {
        const size_t bytes = size_t(b.type.bytes());
        if (bytes) std::memcpy(resolve_mut(b.value), static_cast<const char*>(inputs.at(b.name)->raw()) + step * bytes, bytes);
      }
      status = execute_program();
      if (!status.is_ok()) {
        if (steps > 1) status = std::move(status).with_context("iteration " + std::to_string(step));
        return;
      }
      for (const compiler::Binding& b : exe_->outputs) {
        Tensor& dst = result.at(b.name);
        const size_t bytes = size_t(b.type.bytes());
        const void* src = resolve(b.value);
        switch (options.output_mode) {
          case OutputMode::final:
            if (step == steps - 1 && bytes) std::memcpy(dst.raw(), src, bytes);
            break;
          case OutputMode::all:
            if (bytes) std::memcpy(static_cast<char*>(dst.raw()) + step * bytes, src, bytes);
            break;
          case OutputMode::every_n:
            if ((step + 1) % options.every_n == 0 && bytes)
              std::memcpy(static_cast<char*>(dst.raw()) + ((step + 1) / options.every_n - 1) * bytes, src, bytes);
            break;
          case OutputMode::sum: {
            float* d = dst.data<float>();
            const float* s = static_cast<const float*>(src);
            for (int64_t i = 0; i < b.type.shape.numel(); ++i) d[i] += s[i];
            break;
          }
        }
      }
    }
  });
  if (!status.is_ok()) return status;
  return result;
}

}  // namespace aspen::runtime
