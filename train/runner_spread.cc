// The Runner with its pipeline stages in different processes
// (Options::model_across_processes): what crosses between the stages of one
// replica besides the activations (train/runner_walk.cc), all over the
// replica's "pipe" group, whose rank is the stage:
//  - tied parameters (GPT-2's wte, used by the first and the last stage): the
//    gradients of the stages that use but do not own one are sent to its
//    owner and added in stage order (the bits of the in-process layout), and
//    after the owner's step its new value is sent back;
//  - evaluation (evaluate_stages, also for tensor shards of stages in one
//    process): one micro-batch through the stages' forward programs, the
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
    Tensor t(type.first, type.second);
    const int root = holding_stage(name);
    if (coord_of(0).pipe == root) {  // (tensor shards: gathered from the stage's shards first)
      ASPEN_ASSIGN_OR_RETURN(Tensor whole, get_full(name));
      ASPEN_CHECK(whole.nbytes() == t.nbytes());
      if (t.nbytes()) std::memcpy(t.raw(), whole.raw(), t.nbytes());
    }
    ASPEN_RETURN_IF_ERROR(pipe_group_->broadcast(t.raw(), t.numel(), t.dtype(), root));
    out.emplace(name, std::move(t));
  }
  return out;
}

Result<float> Runner::evaluate_stages(const std::map<std::string, const Tensor*>& inputs) {
  const PipelinePrograms& pp = *pipe_;
  const int S = int(pp.stages.size());
  // Inputs checked first: a failure after the first message would leave the other stages waiting.
  for (int st = 0; st < S; ++st)
    if (!spread() || st == coord_of(0).pipe)
      ASPEN_RETURN_IF_ERROR(check_eval_inputs(session_->executable(pp.stages[size_t(st)].forward), inputs));
  if (broken_)
    return Status::error(Code::kFailedPrecondition, "training model", "a model whose stages are working",
                         "a step failed earlier and aborted the group", "create the model again");
  // Evaluation's messages are micro-batch `gradient_accumulation` (training's are 0 .. accumulation - 1).
  const int micro = int(options_.gradient_accumulation);
  StepState step;
  ASPEN_RETURN_IF_ERROR(open_transports(step));
  float loss = 0.0f;
  const Status walked = on_devices(step, [&](int d) -> Status {
    if (data_replica(d) != 0) return Status();  // the first replica's devices
    const int stage = coord_of(d).pipe;
    const PipelineStage& split = pp.split.stages[size_t(stage)];
    parallel::Transport& transport = *transport_of(step, d);
    std::map<std::string, Tensor> received;
    for (int e : split.in_edges) {
      const PipelineEdge& edge = pp.split.edges[size_t(e)];
      ASPEN_ASSIGN_OR_RETURN(Tensor x, transport.take({.edge = e, .micro = micro, .grad = false}, edge.from,
                                                      edge.type.dtype, edge.type.shape,
                                                      "evaluation, stage " + std::to_string(stage)));
      received.emplace(edge.name, std::move(x));
    }
    std::map<std::string, const Tensor*> feeds;
    for (const std::string& name : split.inputs) feeds.emplace(name, inputs.at(name));
    for (const auto& [name, x] : received) feeds.emplace(name, &x);
    ASPEN_ASSIGN_OR_RETURN(auto out, session_->run_replica(d, feeds, pp.stages[size_t(stage)].forward));
    for (int e : split.out_edges) {
      const PipelineEdge& edge = pp.split.edges[size_t(e)];
      ASPEN_RETURN_IF_ERROR(transport.put({.edge = e, .micro = micro, .grad = false}, edge.to,
                                          std::move(out.at(edge.name))));
    }
    if (stage + 1 == S && (spread() || coord_of(d).tensor == 0)) loss = out.at(training_.loss).data<float>()[0];
    return transport.flush();
  });
  ASPEN_RETURN_IF_ERROR(walked);
  if (spread()) {  // from the last stage's processes to the others
    if (Status s = pipe_group_->broadcast(&loss, 1, DType::f32, S - 1); !s.is_ok()) {
      pipe_group_->abort(s.message());
      broken_ = true;
      return s;
    }
  }
  return loss;
}

}  // namespace aspen::train
