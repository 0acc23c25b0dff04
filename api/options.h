// api/options.h: the user-facing options, named as in PopTorch where that
// helps people move over (DESIGN.md, "Names for people coming from PopTorch").
//
//   Options opts;
//   opts.device_iterations(8).output_mode(OutputMode::all).profile("run.trace.json");
//   ASPEN_ASSIGN_OR_RETURN(auto model, InferenceModel::create(graph, opts));
//
// (examples/cpp/inference_model.cc and training_model.cc use them; CI runs both.)
//
// Options not yet implemented by this build are rejected when a model is
// made, with a Status naming the option and what is supported (never
// silently ignored).
#pragma once

#include <string>

#include "compiler/pass.h"
#include "core/dtype.h"
#include "runtime/session.h"

namespace aspen::api {

using runtime::OutputMode;

struct Options {
  // Steps run per call without returning to the host (poptorch deviceIterations).
  int64_t device_iterations_ = 1;
  // Replicas (poptorch replicationFactor): devices of this process running the
  // same program on their own slice of each input. A training model's
  // replicas are data parallel (api/training_model.h).
  int64_t replication_factor_ = 1;
  // Training: the replicas of every process of this MPI job (started by
  // mpirun) form one data-parallel group, replication_factor_ per process
  // (poprun's instances × replicas). Every process must create the model with
  // the same options, in the same order.
  bool mpi_ = false;
  // Training: Megatron tensor parallelism over this many devices of the
  // process (group "tensor"). The forward graph must be one shard's, built
  // with CausalLmOptions::tensor_parallel equal to it (GPT-2 family); weights
  // and optimizer state cross the API as full tensors (models/tensor_parallel.h).
  int64_t tensor_parallel_ = 1;
  // Training under mpi: the model spans processes. The stages × shards
  // devices of one replica are that many processes, one device each, and the
  // job's P processes hold P / (stages × shards) replicas (the mesh of
  // parallel/mesh.h over processes: process (d·stages + s)·shards + t runs
  // stage s, shard t of replica d). replication_factor_ must be 1. Without
  // it, every process holds whole replicas (all their stages and shards).
  bool model_across_processes_ = false;
  // Micro-batches per optimizer step (poptorch Training.gradientAccumulation; training only).
  int64_t gradient_accumulation_ = 1;
  OutputMode output_mode_ = OutputMode::final;
  int64_t output_every_n_ = 1;
  // Compute precision and partials type (poptorch Precision): f32, or bf16 /
  // f16 matmuls (weights stay f32 and are cast, like autocast) whose partials
  // are f32 or the compute type (compiler/precision.cc). f16 has no f16
  // arithmetic on these CPUs: f16-rounded operands, f32 products and sums.
  DType precision_ = DType::f32;
  DType partials_type_ = DType::f32;
  bool recompute_ = false;  // recomputation checkpoints (poptorch recomputationCheckpoint)
  // Training with a narrow precision: master weights' compute copies rounded stochastically
  // (compiler::CompileOptions::stochastic_rounding; PopTorch's Precision.enableStochasticRounding).
  bool stochastic_rounding_ = false;
  // On-disk executable cache directory; empty: off (poptorch enableExecutableCaching).
  std::string executable_cache_;
  uint64_t random_seed_ = 0;
  // Chrome trace written here after each call; empty: off (poptorch enableProfiling).
  std::string profile_;
  profile::TraceRecorder* trace_recorder_ = nullptr;
  compiler::OptLevel opt_level_ = compiler::OptLevel::O2;
  int threads_ = 0;  // 0: every free core

  Options& device_iterations(int64_t n) { device_iterations_ = n; return *this; }
  Options& replication_factor(int64_t n) { replication_factor_ = n; return *this; }
  Options& mpi(bool on) { mpi_ = on; return *this; }
  Options& tensor_parallel(int64_t n) { tensor_parallel_ = n; return *this; }
  Options& model_across_processes(bool on) { model_across_processes_ = on; return *this; }
  Options& gradient_accumulation(int64_t n) { gradient_accumulation_ = n; return *this; }
  Options& output_mode(OutputMode m, int64_t every_n = 1) { output_mode_ = m; output_every_n_ = every_n; return *this; }
  Options& precision(DType compute, DType partials = DType::f32) { precision_ = compute; partials_type_ = partials; return *this; }
  Options& recompute(bool on) { recompute_ = on; return *this; }
  Options& executable_cache(std::string dir) { executable_cache_ = std::move(dir); return *this; }
  Options& random_seed(uint64_t s) { random_seed_ = s; return *this; }
  // Every call's instructions, written after each call: a path ending in ".json" is one Chrome trace file, any
  // other a profile directory (report.html, trace.pftrace, trace.json, profile.json; docs/profile.md).
  Options& profile(std::string path) { profile_ = std::move(path); return *this; }
  // Instead of profile(): every instruction recorded into `recorder` while it is enabled, written by the
  // caller (the commands' --profile DIR). Not owned; it must outlive the model.
  Options& trace_recorder(profile::TraceRecorder* recorder) { trace_recorder_ = recorder; return *this; }
  Options& opt_level(compiler::OptLevel l) { opt_level_ = l; return *this; }
  Options& threads(int n) { threads_ = n; return *this; }

  // Checks every option against what this build supports, for an inference
  // or a training model.
  Status validate(bool training = false) const;
};

}  // namespace aspen::api
