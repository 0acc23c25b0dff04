// TrainingModel with its pipeline stages in different processes
// (Options::model_across_processes): what crosses between the stages of one
// replica besides the activations (train/runner_walk.cc), all over the
// replica's "pipe" group, whose rank is the stage:
//  - tied parameters (GPT-2's wte, used by the first and the last stage): the
//    gradients of the stages that use but do not own one are sent to its
//    owner and added in stage order (the bits of the in-process layout), and
//    after the owner's step its new value is sent back;
//  - evaluation: one micro-batch through the stages' forward programs, the
//    loss broadcast from the last stage;
//  - checkpoints: every weight and optimizer tensor broadcast from the stage
//    that holds it.
// Every process of a replica calls these in the same order; the message
// order is fixed by the parameter list, so nothing waits on timing.
#include <algorithm>
#include <cstring>

#include "train/runner.h"
#include "core/check.h"
#include "parallel/job.h"

namespace aspen::train {

int Runner::holding_stage(const std::string& name) const {
  const auto& params = programs_.params;
  if (auto it = std::find(params.begin(), params.end(), name); it != params.end())
    return owner_[size_t(it - params.begin())];
  for (size_t s = 0; s < stage_uses_.size(); ++s)
    if (stage_uses_[s].count(name)) return int(s);
  return 0;
}

Result<std::map<std::string, Tensor>> Runner::gather_spread_pipeline(bool weights) const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, type] : weights ? weight_types() : optimizer_state_types()) {
    if (type.first != DType::f32)
      return Status::invalid_argument("'" + name + "' (gathered from its pipeline stage)", "f32",
                                      std::string(dtype_name(type.first)));
    Tensor t(type.first, type.second);
    const int root = holding_stage(name);
    if (coord_of(0).pipe == root) {  // (tensor shards: gathered from the stage's shards first)
      ASPEN_ASSIGN_OR_RETURN(Tensor whole, get_full(name));
      ASPEN_CHECK(whole.nbytes() == t.nbytes());
      if (t.nbytes()) std::memcpy(t.raw(), whole.raw(), t.nbytes());
    }
    ASPEN_RETURN_IF_ERROR(pipe_group_->broadcast(t.raw(), t.numel(), DType::f32, root));
    out.emplace(name, std::move(t));
  }
  return out;
}

Result<float> Runner::evaluate_spread_pipeline(const std::map<std::string, const Tensor*>& inputs) {
  const train::PipelinePrograms& pp = *pipe_;
  const int S = int(pp.stages.size()), st = coord_of(0).pipe;
  const train::PipelinePrograms::Stage& prog = pp.stages[size_t(st)];
  const train::PipelineStage& split = pp.split.stages[size_t(st)];
  // Inputs checked first: a failure after the first message would leave the other stages waiting.
  const compiler::Executable& exe = session_->executable(prog.forward);
  ASPEN_RETURN_IF_ERROR(check_eval_inputs(exe, inputs));
  std::map<std::string, const Tensor*> feeds;
  for (const compiler::Binding& b : exe.inputs)
    if (!b.name.starts_with("pipe.")) feeds.emplace(b.name, inputs.at(b.name));
  if (broken_)
    return Status::error(Code::kFailedPrecondition, "training model", "a model whose stages are working",
                         "a step failed earlier and aborted the group", "create the model again");
  const int micros = int(options_.gradient_accumulation);
  const int eval_micro = micros;  // the tag evaluation's messages use (training's are 0 .. micros - 1)
  ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<parallel::Transport> transport, parallel::job::transport(*pipe_group_, micros));
  auto fail = [&](Status s) {
    pipe_group_->abort(s.message());
    broken_ = true;
    return s;
  };
  std::map<std::string, Tensor> received;
  for (int e : split.in_edges) {
    const train::PipelineEdge& edge = pp.split.edges[size_t(e)];
    Result<Tensor> t = transport->take({.edge = e, .micro = eval_micro, .grad = false}, edge.from, edge.type.dtype,
                                      edge.type.shape, "evaluation, stage " + std::to_string(st));
    if (!t.is_ok()) return fail(t.status());
    received.emplace(edge.name, std::move(t).value());
  }
  for (const auto& [name, t] : received) feeds.emplace(name, &t);
  Result<std::map<std::string, Tensor>> out = session_->run_replica(0, feeds, prog.forward);
  if (!out.is_ok()) return fail(out.status());
  for (int e : split.out_edges) {
    const train::PipelineEdge& edge = pp.split.edges[size_t(e)];
    if (Status s = transport->put({.edge = e, .micro = eval_micro, .grad = false}, edge.to,
                                 std::move(out->at(edge.name)));
        !s.is_ok())
      return fail(std::move(s));
  }
  if (Status s = transport->flush(); !s.is_ok()) return fail(std::move(s));
  float loss = st + 1 == S ? out->at(training_.loss).data<float>()[0] : 0.0f;
  if (Status s = pipe_group_->broadcast(&loss, 1, DType::f32, S - 1); !s.is_ok()) return fail(std::move(s));
  return loss;
}

}  // namespace aspen::train
