// runtime/session.h: loads an Executable onto a device and runs it.
//
//   auto exe = compiler::compile(graph);
//   auto session = Session::create(std::move(*exe));
//   session->set_parameter("fc.weight", w);
//   auto outputs = session->run({{"x", &x}});
//
// Parameters are state owned by the session (zeros until set); inputs are
// copied into the arena before the program runs and named outputs copied out
// after. A wrong input name, type or shape is a Status naming it.
//
// Thread-safety: one run at a time per session (calls serialize on the
// device's team).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "compiler/executable.h"
#include "core/tensor.h"
#include "profile/trace.h"
#include "runtime/device.h"

namespace aspen::runtime {

struct SessionOptions {
  int threads = 0;  // 0: every free core
  std::string device_name = "cpu0";
  profile::TraceRecorder* trace = nullptr;  // when set, every instruction is recorded
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

  const compiler::Executable& executable() const { return *exe_; }
  CpuDevice& device() { return *device_; }

  Status set_parameter(const std::string& name, const Tensor& value);
  Result<Tensor> get_parameter(const std::string& name) const;
  // Runs the program once. Every input must be given, with its exact type.
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs);
  // Runs options.iterations steps in one call; see RunOptions. Inputs carry
  // a leading [iterations] dimension when iterations > 1; outputs come back
  // as the output mode says (all: [iterations, ...]; every_n: [iterations /
  // every_n, ...]; final and sum: the output's own shape, sum in f32 for
  // float outputs).
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs,
                                            const RunOptions& options);

 private:
  Session() = default;
  const void* resolve(int32_t value) const;
  void* resolve_mut(int32_t value);
  Status execute_program();

  profile::TraceRecorder* trace_ = nullptr;
  std::vector<int64_t> instruction_bytes_;  // bytes each instruction touches, for traces

  std::unique_ptr<compiler::Executable> exe_;
  std::unique_ptr<CpuDevice> device_;
  std::vector<Tensor> parameters_;  // by Slot::offset
};

}  // namespace aspen::runtime
