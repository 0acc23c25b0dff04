#include "api/inference_model.h"

#include "compiler/cache.h"
#include "runtime/run_facts.h"

namespace aspen::api {

Status Options::validate(bool training) const {
  auto positive = [](const char* name, int64_t v) {
    return v >= 1 ? Status() : Status::invalid_argument(std::string("options.") + name, ">= 1", std::to_string(v));
  };
  ASPEN_RETURN_IF_ERROR(positive("device_iterations", device_iterations_));
  ASPEN_RETURN_IF_ERROR(positive("replication_factor", replication_factor_));
  ASPEN_RETURN_IF_ERROR(positive("gradient_accumulation", gradient_accumulation_));
  if (!training && gradient_accumulation_ != 1)
    return Status::unimplemented("options.gradient_accumulation = " + std::to_string(gradient_accumulation_),
                                 "value for an inference model (1)");
  if (precision_ != DType::f32 && precision_ != DType::bf16 && precision_ != DType::f16)
    return Status::invalid_argument("options.precision", "f32, bf16 or f16", std::string(dtype_name(precision_)));
  if (partials_type_ != DType::f32 && partials_type_ != precision_)
    return Status::invalid_argument("options.precision partials type",
                                    "f32 or the compute type (" + std::string(dtype_name(precision_)) + ")",
                                    std::string(dtype_name(partials_type_)));
  if (!training && recompute_) return Status::unimplemented("options.recompute", "setting for an inference model (off)");
  if (output_mode_ == OutputMode::every_n && (output_every_n_ < 1 || device_iterations_ % output_every_n_ != 0))
    return Status::invalid_argument("options.output_mode every_n",
                                    "a divisor of device_iterations " + std::to_string(device_iterations_),
                                    std::to_string(output_every_n_));
  if (!training && mpi_) return Status::unimplemented("options.mpi", "setting for an inference model (off)");
  if (model_across_processes_ && !mpi_)
    return Status::invalid_argument("options.model_across_processes", "options.mpi on (it spreads a model over the "
                                    "processes of an MPI job)", "mpi off");
  if (model_across_processes_ && replication_factor_ != 1)
    return Status::invalid_argument("options.replication_factor with model_across_processes",
                                    "1 (one device per process; the processes hold the replicas)",
                                    std::to_string(replication_factor_));
  ASPEN_RETURN_IF_ERROR(positive("tensor_parallel", tensor_parallel_));
  if (!training && tensor_parallel_ != 1)
    return Status::unimplemented("options.tensor_parallel", "setting for an inference model (1)");
  if (threads_ < 0) return Status::invalid_argument("options.threads", ">= 0 (0: all free cores)", std::to_string(threads_));
  return Status();
}

Result<std::unique_ptr<InferenceModel>> InferenceModel::create(const graph::Graph& graph, const Options& options) {
  ASPEN_RETURN_IF_ERROR(options.validate());
  std::unique_ptr<InferenceModel> m(new InferenceModel());
  m->options_ = options;
  compiler::CompileOptions copts;
  copts.opt_level = options.opt_level_;
  copts.compute = options.precision_;  // bf16/f16: matmuls read narrow casts, f32 accumulation (compiler/precision.cc)
  copts.partials = options.partials_type_;
  copts.hoist_weights = true;  // weights change only through the session: weight-only values are made once
  std::unique_ptr<compiler::Executable> exe;
  if (!options.executable_cache_.empty()) {
    compiler::ExecutableCache cache(options.executable_cache_);
    ASPEN_ASSIGN_OR_RETURN(exe, cache.compile(graph, copts, &m->cache_hit_, &m->cache_stored_));
  } else {
    ASPEN_ASSIGN_OR_RETURN(exe, compiler::compile(graph, copts));
  }
  if (!options.profile_.empty()) m->trace_ = std::make_unique<profile::TraceRecorder>();
  runtime::SessionOptions sopts;
  sopts.threads = options.threads_;
  sopts.replicas = int(options.replication_factor_);
  sopts.trace = m->trace_ ? m->trace_.get() : options.trace_recorder_;
  ASPEN_ASSIGN_OR_RETURN(m->session_, runtime::Session::create(std::move(exe), sopts));
  return m;
}

Status InferenceModel::copy_weights_to_device(const std::map<std::string, const Tensor*>& weights) {
  for (const auto& [name, t] : weights) {
    if (!t) return Status::invalid_argument("weight '" + name + "'", "a tensor", "a null pointer");
    ASPEN_RETURN_IF_ERROR(session_->set_parameter(name, *t));
  }
  return Status();
}

Result<std::map<std::string, Tensor>> InferenceModel::copy_weights_to_host() const {
  std::map<std::string, Tensor> out;
  for (const compiler::Binding& b : session_->parameters()) {
    ASPEN_ASSIGN_OR_RETURN(Tensor t, session_->get_parameter(b.name));
    out.emplace(b.name, std::move(t));
  }
  return out;
}

Result<std::map<std::string, Tensor>> InferenceModel::run(const std::map<std::string, const Tensor*>& inputs) {
  runtime::RunOptions r;
  r.iterations = options_.device_iterations_;
  r.output_mode = options_.output_mode_;
  r.every_n = options_.output_every_n_;
  ASPEN_ASSIGN_OR_RETURN(auto out, session_->run(inputs, r));
  if (trace_) {  // Options::profile: a Chrome trace file, or a profile directory (profile::write_profile_path)
    ASPEN_RETURN_IF_ERROR(profile::write_profile_path(options_.profile_, trace_->events(), [&] {
      profile::RunFacts run = runtime::run_facts("InferenceModel", options_.threads_);
      runtime::add_session(run, *session_);
      return run;
    }));
  }
  return out;
}

std::string InferenceModel::profile_summary() const { return trace_ ? profile::summary(trace_->events()) : ""; }

}  // namespace aspen::api
