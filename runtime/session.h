// runtime/session.h: loads an Executable onto one or more devices of this
// process and runs it.
//
//   auto exe = compiler::compile(graph);
//   auto session = Session::create(std::move(*exe));
//   session->set_parameter("fc.weight", w);
//   auto outputs = session->run({{"x", &x}});
//
// Parameters are state owned by the session (zeros until set) and shared,
// read-only, by every replica. Inputs are copied into a device's arena before
// its program runs and named outputs copied out after. A wrong input name,
// type or shape is a Status naming it.
//
// Replicas: with SessionOptions::replicas = R, the program runs on R devices
// side by side, each with its own thread team, arena and prepared kernels
// (lowered again from the same optimized graph). Each input then carries a
// [R] dimension (after the [iterations] one, when there is one) holding each
// replica's slice, and outputs come back with the same [R] dimension. This is
// inference replication (PopTorch's replicationFactor without gradients);
// training replicas reduce gradients through W1.5's communicators.
//
// Thread-safety: one run at a time per session.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/executable.h"
#include "core/tensor.h"
#include "profile/trace.h"
#include "runtime/device.h"

namespace aspen::runtime {

struct SessionOptions {
  int threads = 0;  // per device; 0: the free cores divided among the replicas
  std::string device_name = "cpu";  // devices are named <device_name><index>
  profile::TraceRecorder* trace = nullptr;  // when set, every instruction is recorded
  int replicas = 1;
};

// How outputs of several iterations in one call come back (PopTorch's OutputMode).
enum class OutputMode { all, final, sum, every_n };

struct RunOptions {
  // Steps run per call without returning to the host. Each input then carries
  // a leading dimension of this size (one slice per step).
  int64_t iterations = 1;
  OutputMode output_mode = OutputMode::final;
  int64_t every_n = 1;  // with OutputMode::every_n: steps every_n, 2·every_n, ...
};

// The leading dimension an output gets for these options (0: none, as one step).
int64_t returned_steps(const RunOptions& options);

class Session {
 public:
  static Result<std::unique_ptr<Session>> create(std::unique_ptr<compiler::Executable> exe,
                                                 const SessionOptions& options = {});

  const compiler::Executable& executable() const { return *replicas_.front().exe; }
  int replicas() const { return int(replicas_.size()); }
  CpuDevice& device(int replica = 0) { return *replicas_.at(size_t(replica)).device; }

  Status set_parameter(const std::string& name, const Tensor& value);
  Result<Tensor> get_parameter(const std::string& name) const;
  // Runs the program once. Every input must be given, with its exact type.
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs);
  // Runs options.iterations steps in one call; see RunOptions. Inputs carry
  // a leading [iterations] dimension when iterations > 1 (then [replicas]
  // when replicas > 1); outputs come back as the output mode says (all:
  // [iterations, ...]; every_n: [iterations / every_n, ...]; final and sum:
  // no step dimension; sum in f32 for float outputs), then [replicas].
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs,
                                            const RunOptions& options);

 private:
  struct Replica {
    std::unique_ptr<compiler::Executable> exe;
    std::unique_ptr<CpuDevice> device;
  };
  Session() = default;
  // Where one step's inputs come from and outputs go (nullptr: not returned
  // this step), by binding index; sum: accumulate f32 outputs.
  struct StepIO {
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    bool sum = false;
  };
  const void* resolve(const Replica& r, int32_t value) const;
  Status execute_program(Replica& r, const StepIO& io);

  std::vector<Replica> replicas_;
  profile::TraceRecorder* trace_ = nullptr;
  std::vector<int64_t> instruction_bytes_;  // bytes each instruction touches, for traces
  std::vector<Tensor> parameters_;          // by Slot::offset, shared by the replicas
};

}  // namespace aspen::runtime
