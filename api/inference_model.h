// api/inference_model.h: a compiled graph on a device, ready to run.
//
//   ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<InferenceModel> model, InferenceModel::create(graph, opts));
//   ASPEN_RETURN_IF_ERROR(model->copy_weights_to_device({{"w1", &w1}}));
//   ASPEN_ASSIGN_OR_RETURN(auto out, model->run({{"x", &x}}));
//
// (examples/cpp/inference_model.cc is a whole program; CI runs it.)
//
// create() compiles once (through the executable cache when the options name
// one); run() executes device_iterations steps per call and returns outputs
// by the output mode. With a profile path, every call's instructions are
// traced and the Chrome trace rewritten after the call.
//
// Thread-safety: one call at a time.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "api/options.h"
#include "graph/graph.h"
#include "profile/trace.h"
#include "runtime/session.h"

namespace aspen::api {

class InferenceModel {
 public:
  static Result<std::unique_ptr<InferenceModel>> create(const graph::Graph& graph, const Options& options = {});

  const Options& options() const { return options_; }
  bool cache_hit() const { return cache_hit_; }
  bool cache_stored() const { return cache_stored_; }  // a miss whose entry was written
  const compiler::Executable& executable() const { return session_->executable(); }
  const runtime::Session& session() const { return *session_; }

  Status copy_weights_to_device(const std::map<std::string, const Tensor*>& weights);
  Result<std::map<std::string, Tensor>> copy_weights_to_host() const;
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs);

  // The per-op summary of everything traced so far (empty without a profile path).
  std::string profile_summary() const;

 private:
  InferenceModel() = default;
  Options options_;
  bool cache_hit_ = false, cache_stored_ = false;
  std::unique_ptr<profile::TraceRecorder> trace_;
  std::unique_ptr<runtime::Session> session_;
};

}  // namespace aspen::api
