// TrainingModel's pipelined step (TrainingOptions::pipeline): each stage is a
// device of the session, running its instructions of the model's plan
// (train/plan.h: its passes in the schedule's order) on its own team;
// activations and their gradients move between stages through a
// parallel::Transport (threads in one process, MPI across processes).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "train/runner.h"
#include "train/runner_util.h"
#include "core/check.h"
#include "parallel/job.h"
#include "parallel/transport.h"

namespace aspen::train {

double PipelineStats::bubble() const {
  if (busy_s.empty() || wall_s <= 0.0) return 0.0;
  double sum = 0.0;
  for (double b : busy_s) sum += b;
  return 1.0 - sum / double(busy_s.size()) / wall_s;
}

namespace {

using Clock = std::chrono::steady_clock;
using parallel::Transport;

}  // namespace

Result<std::vector<float>> Runner::run_pipeline(const std::map<std::string, const Tensor*>& inputs) {
  const train::PipelinePrograms& pp = *pipe_;
  const int S = int(pp.stages.size()), T = tensor_shards();
  const int L = data_replicas();  // data-parallel replicas in this process
  // Device d runs stage coord_of(d).pipe, tensor shard coord_of(d).tensor of local replica data_replica(d)
  // (across processes: this process's one device runs its stage).
  auto stage_of = [&](int d) { return coord_of(d).pipe; };
  auto shard_of = [&](int d) { return coord_of(d).tensor; };
  const int64_t iters = options_.device_iterations, acc = options_.gradient_accumulation;
  // The forward graph's inputs each stage takes, and their per-micro-batch types.
  std::map<std::string, Shape> per;
  for (int s = 0; s < S; ++s) {
    if (spread() && s != coord_of(0).pipe) continue;  // another process's stage (a placeholder here)
    const compiler::Executable& exe = session_->executable(pp.stages[size_t(s)].backward_first);
    for (const compiler::Binding& b : exe.inputs) {
      if (b.name.starts_with("pipe.") || b.name == train::kLossScaleName) continue;
      auto it = inputs.find(b.name);
      if (it == inputs.end()) return Status::invalid_argument("training input '" + b.name + "'", "given", "missing");
      const Tensor& t = *it->second;
      if (t.dtype() != b.type.dtype || t.numel() != b.type.shape.numel() * iters * acc * L)
        return Status::invalid_argument(
            "training input '" + b.name + "'",
            std::string(dtype_name(b.type.dtype)) + " with " + std::to_string(iters * acc * L) +
                " micro-batches of " + b.type.shape.to_string() + " (device_iterations x gradient_accumulation" +
                (L > 1 ? " x replicas)" : ")"),
            std::string(dtype_name(t.dtype())) + t.shape().to_string());
      per.emplace(b.name, b.type.shape);
    }
  }
  std::vector<float> losses;
  for (int64_t it = 0; it < iters; ++it) {
    StepStats s;
    s.step = steps_done_ + 1;
    s.lr = training_.schedule.at(s.step);
    s.loss_scale = scaler_.scale();
    const Tensor ls = util::scalar_f32(float(s.loss_scale));
    // One transport per pipe group (a replica's shard t of every stage; keyed by its first mesh rank): the
    // endpoints are the stages.
    std::map<int, std::unique_ptr<Transport>> channels;
    auto pipe_key = [&](int d) { return mesh_->group(parallel::Axis::pipe, mesh_rank(d)).front(); };
    for (int d = 0; d < session_->replicas(); ++d) {
      if (channels.count(pipe_key(d))) continue;
      if (spread()) {
        ASPEN_ASSIGN_OR_RETURN(auto across, parallel::job::transport(*pipe_group_, int(acc)));
        channels.emplace(pipe_key(d), std::move(across));
      } else {
        channels.emplace(pipe_key(d), std::make_unique<parallel::ThreadsTransport>(training_.data_parallel.comm.timeout));
      }
    }
    std::vector<std::vector<float>> micro_losses(static_cast<size_t>(L), std::vector<float>(size_t(acc), 0.0f));
    pipe_stats_.busy_s.assign(size_t(session_->replicas()), 0.0);
    // By tensor shard: replica 0's Σg² of each parameter its stage owns (the norm instructions').
    std::vector<std::vector<float>> by_shard(static_cast<size_t>(T), std::vector<float>(pp.params.size(), 0.0f));
    const auto t0 = Clock::now();
    // Device d runs its instructions of the plan (train/plan.h) up to the step's host part: its passes in the
    // schedule's order, the edges' transfers around them, then its stage's exchange.
    auto stage_work = [&](int d) -> Status {
      const int r = data_replica(d), st = stage_of(d), sh = shard_of(d);
      Transport& ch = *channels.at(pipe_key(d));
      const train::PipelinePrograms::Stage& prog = pp.stages[size_t(st)];
      const std::vector<train::Instr>& instrs = plan_.devices[size_t(mesh_rank(d))].instrs;
      const bool last = st + 1 == S;
      auto peer_stage = [&](const train::Instr& i) { return plan_.devices[size_t(i.peer)].coord.pipe; };
      std::map<int, std::map<std::string, Tensor>> stash;  // micro-batch -> its in-edge tensors
      std::map<int, std::map<std::string, Tensor>> grads;  // micro-batch -> its out-edges' gradients
      std::map<std::string, Tensor> out;                   // the last pass's outputs (its sends follow it)
      bool decided = false;
      for (size_t k = 0; k < instrs.size() && !decided; ++k) {
        const train::Instr& in = instrs[k];
        const int m = in.micro;
        profile::TraceScope traced(trace_.get(), session_->device(d).name(), train::instr_kind_name(in.kind),
                                   profile::category::kPlan);
        if (traced.active()) traced.add_arg("instruction", train::instr_text(in));
        const bool transfer = in.kind == train::InstrKind::send || in.kind == train::InstrKind::recv;
        if (transfer && (in.payload == train::Payload::tied_gradient || in.payload == train::Payload::tied_weight)) {
          // A tied parameter's gradient on a later stage, added into its owner's (in stage order).
          ASPEN_RETURN_IF_ERROR(tied_transfer(d, in, ch));
          continue;
        }
        const std::string where = "pipeline stage " + std::to_string(st) + (T > 1 ? " shard " + std::to_string(sh) : "") +
                                  (L > 1 ? " of replica " + std::to_string(r) : "") + ", " +
                                  train::instr_text(in);
        switch (in.kind) {
          case train::InstrKind::recv: {
            const train::PipelineEdge& e = pp.split.edges[size_t(in.edge)];
            const bool grad = in.payload == train::Payload::gradient;
            profile::TraceScope wait(trace_.get(), session_->device(d).name(), (grad ? "recv grad " : "recv ") + e.name,
                                     profile::category::kCollective, e.type.bytes());
            ASPEN_ASSIGN_OR_RETURN(Tensor t, ch.take({.edge = in.edge, .micro = m, .grad = grad}, peer_stage(in),
                                                     e.type.dtype, e.type.shape,
                                                     where + ": waiting for " + (grad ? "the gradient of " : "") +
                                                         e.name + " from stage " + std::to_string(peer_stage(in))));
            if (grad) {
              grads[m].emplace(train::kPipeGradPrefix + std::to_string(in.edge), std::move(t));
            } else {
              stash[m].emplace(e.name, std::move(t));
            }
            break;
          }
          case train::InstrKind::send: {
            const bool grad = in.payload == train::Payload::gradient;
            const std::string name = grad ? train::kPipeGradPrefix + std::to_string(in.edge)
                                          : pp.split.edges[size_t(in.edge)].name;
            auto t = out.find(name);
            if (t == out.end())
              return Status::error(Code::kInternal, where, "the pass before it to output " + name, "no such output");
            ASPEN_RETURN_IF_ERROR(ch.put({.edge = in.edge, .micro = m, .grad = grad}, peer_stage(in), std::move(t->second)));
            break;
          }
          case train::InstrKind::forward:
          case train::InstrKind::backward: {
            std::map<std::string, Tensor> owned;
            for (const std::string& name : pp.split.stages[size_t(st)].inputs)
              owned.emplace(name, util::rows(*inputs.at(name), per.at(name), (it * acc + m) * L + r, 1, /*squeeze=*/true));
            std::map<std::string, const Tensor*> feeds;
            for (const auto& [name, t] : owned) feeds.emplace(name, &t);
            for (const auto& [name, t] : stash[m]) feeds.emplace(name, &t);
            const auto b0 = Clock::now();
            if (in.kind == train::InstrKind::forward) {
              ASPEN_ASSIGN_OR_RETURN(out, session_->run_replica(d, feeds, prog.forward));
              pipe_stats_.busy_s[size_t(d)] += std::chrono::duration<double>(Clock::now() - b0).count();
              if (last && (sh == 0 || spread())) micro_losses[size_t(r)][size_t(m)] = out.at(training_.loss).data<float>()[0];
              break;
            }
            for (const auto& [name, t] : grads[m]) feeds.emplace(name, &t);
            if (last && training_.loss_scaling.mode != train::LossScaling::none) feeds.emplace(train::kLossScaleName, &ls);
            const int program = in.next && prog.backward_next >= 0 ? prog.backward_next : prog.backward_first;
            Result<std::map<std::string, Tensor>> ran = Status();
            if (k + 1 < instrs.size() && instrs[k + 1].kind == train::InstrKind::reduce && instrs[k + 1].overlapped) {
              // Each of the stage's accumulators, reduced over the stage's replicas as it becomes final.
              const train::Instr& reduce = instrs[k + 1];
              std::vector<std::string> mine;
              for (int p : reduce.params) mine.push_back(accumulator_name(p, st));
              std::vector<ExchangePiece> pieces;
              for (const compiler::Binding& u : session_->executable(program).updates) {
                Tensor* t = std::find(mine.begin(), mine.end(), u.name) != mine.end() ? session_->parameter_of(d, u.name)
                                                                                      : nullptr;
                pieces.push_back(t ? ExchangePiece{t->data<float>(), t->numel(), 0} : ExchangePiece{});
              }
              parallel::DataParallelGroup* group = data_group(d);
              ran = run_overlapped(
                  d, feeds, program, pieces, mine.size(),
                  [&](std::span<float* const> t, std::span<const int64_t> c, std::span<const int> o) {
                    return group->reduce_to_owners(r, t, c, o);
                  },
                  [&](const std::string& why) { group->abort(r, why); });
            } else {
              ran = session_->run_replica(d, feeds, program);
            }
            ASPEN_ASSIGN_OR_RETURN(out, std::move(ran));
            pipe_stats_.busy_s[size_t(d)] += std::chrono::duration<double>(Clock::now() - b0).count();
            stash.erase(m);
            grads.erase(m);
            break;
          }
          case train::InstrKind::tensor_sum:  // a whole weight's gradient: each shard has its part
            for (int p : in.params) {
              Tensor* t = session_->parameter_of(d, accumulator_name(p, st));
              ASPEN_CHECK(t != nullptr);
              ASPEN_RETURN_IF_ERROR(tensor_comms_[spread() ? 0 : size_t(d)]->all_reduce(
                  std::span<float>(t->data<float>(), size_t(t->numel()))));
            }
            break;
          case train::InstrKind::reduce: {
            if (in.overlapped) break;  // ran with the backward pass before it
            std::vector<float*> tensors;
            std::vector<int64_t> counts;
            int64_t bytes = 0;
            for (int p : in.params) {
              Tensor* t = session_->parameter_of(d, accumulator_name(p, st));
              ASPEN_CHECK(t != nullptr);
              tensors.push_back(t->data<float>());
              counts.push_back(t->numel());
              bytes += 4 * t->numel();
            }
            profile::TraceScope scope(trace_.get(), session_->device(d).name(), "reduce gradients",
                                      profile::category::kCollective, bytes);
            // The stage's gradients over its replicas: into replica 0's copies (in.owners), or with tensor shards
            // (each device steps its own weights) into every copy.
            ASPEN_RETURN_IF_ERROR(in.to_owners ? data_group(d)->reduce_to_owners(r, tensors, counts, in.owners)
                                               : data_group(d)->all_reduce(r, tensors, counts));
            break;
          }
          case train::InstrKind::loss:  // across processes: the last stage's micro-batch losses to the others
            ASPEN_RETURN_IF_ERROR(pipe_group_->broadcast(micro_losses[0].data(), acc, DType::f32, peer_stage(in)));
            break;
          case train::InstrKind::norm: {  // Σg² of each parameter the stage owns (a cut one's part, by shard)
            if (prog.norm < 0) break;
            ASPEN_ASSIGN_OR_RETURN(auto o, session_->run_replica(d, {}, prog.norm));
            const Tensor& t = o.at(train::kGradSqNormName);
            for (size_t i = 0; i < prog.owned.size(); ++i) by_shard[size_t(sh)][prog.owned[i]] = t.data<float>()[i];
            break;
          }
          case train::InstrKind::decide:
            decided = true;  // the host's part (below)
            break;
          default:
            return Status::error(Code::kInternal, where, "an instruction of a pipelined step before the decision",
                                 train::instr_text(in));
        }
      }
      return ch.flush();  // every put has been taken
    };
    Status work = session_->for_each_replica([&](int d) {
      Status r = stage_work(d);
      if (!r.is_ok()) {
        for (auto& [key, ch] : channels) ch->fail("device " + std::to_string(d) + ": " + r.message());
        if (dp_) data_group(d)->abort(data_replica(d), r.message());
        if (T > 1) tensor_comms_[spread() ? 0 : size_t(d)]->abort(r.message());
      }
      return r;
    });
    if (!work.is_ok()) {
      if (dp_) broken_ = true;
      return work;
    }
    pipe_stats_.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<float> local_losses;  // [acc][L]
    for (int64_t a = 0; a < acc; ++a)
      for (int r = 0; r < L; ++r) local_losses.push_back(micro_losses[size_t(r)][size_t(a)]);
    ASPEN_ASSIGN_OR_RETURN(s.loss, step_loss(local_losses));
    // Σg², added in parameter order (the same bits as one device's norm of the same gradients).
    std::vector<float> sums(pp.params.size(), 0.0f);
    if (needs_norm()) {
      // A cut parameter's parts add over the shards, in rank order.
      if (spread() && T > 1) {  // the other shards' vectors from this stage's tensor group
        std::vector<float> all(pp.params.size() * size_t(T));
        const std::vector<float> mine = by_shard[size_t(coord_of(0).tensor)];
        ASPEN_RETURN_IF_ERROR(
            tensor_comms_[0]->all_gather(mine.data(), all.data(), int64_t(mine.size()), DType::f32));
        for (int t = 0; t < T; ++t)
          by_shard[size_t(t)].assign(all.begin() + t * pp.params.size(), all.begin() + (t + 1) * pp.params.size());
      }
      for (size_t i = 0; i < pp.params.size(); ++i) {
        if (T > 1 && !tp_replicated_[i]) {
          for (int t = 0; t < T; ++t) sums[i] += by_shard[size_t(t)][i];
        } else {
          sums[i] = by_shard[0][i];
        }
      }
      // Across processes each stage has its own entries (the others are 0, so the sum is exact).
      if (spread()) ASPEN_RETURN_IF_ERROR(pipe_group_->all_reduce(std::span<float>(sums)));
    }
    float sq = 0.0f;
    for (float x : sums) sq += x;
    // After the decision each device runs the rest of its plan: its stage's step (replica 0 of each stage, whose
    // weights the process's replicas share; with tensor shards every device its own), then the tied weights' new
    // values from their owner to the other stages' copies.
    auto apply = [&](const Tensor& lr, const Tensor& gs) -> Status {
      auto after_decision = [&](int d) -> Status {
        Transport& ch = *channels.at(pipe_key(d));
        for (const train::Instr& in : train::after_decision(plan_.devices[size_t(mesh_rank(d))])) {
          profile::TraceScope traced(trace_.get(), session_->device(d).name(), train::instr_kind_name(in.kind),
                                     profile::category::kPlan);
          if (traced.active()) traced.add_arg("instruction", train::instr_text(in));
          if (in.kind == train::InstrKind::step) {
            const int program = pp.stages[size_t(stage_of(d))].step;
            if (program >= 0)
              ASPEN_RETURN_IF_ERROR(
                  session_->run_replica(d, {{train::kLrName, &lr}, {train::kGradScaleName, &gs}}, program).status());
          } else if (in.kind == train::InstrKind::send || in.kind == train::InstrKind::recv ||
                     in.kind == train::InstrKind::copy_tied) {
            ASPEN_RETURN_IF_ERROR(tied_transfer(d, in, ch));
          } else {
            return Status::error(Code::kInternal, "pipeline device " + std::to_string(d),
                                 "an instruction of a pipelined step after the decision", train::instr_text(in));
          }
        }
        return ch.flush();
      };
      Status st = session_->for_each_replica([&](int d) {
        Status r = after_decision(d);
        if (!r.is_ok())  // a stage waiting for a tied weight from this one stops at once
          for (auto& [key, ch] : channels) ch->fail("device " + std::to_string(d) + ": " + r.message());
        return r;
      });
      if (st.is_ok()) advance_step_count();
      return st;
    };
    ASPEN_RETURN_IF_ERROR(finish_step(s, double(sq), apply));
    losses.push_back(s.loss);
  }
  return losses;
}

Status Runner::tied_transfer(int d, const train::Instr& in, parallel::Transport& transport) {
  const int st = coord_of(d).pipe;
  const int edges = int(pipe_->split.edges.size());
  const int p = in.kind == train::InstrKind::copy_tied ? -1 : in.edge;
  auto peer_stage = [&] { return plan_.devices[size_t(in.peer)].coord.pipe; };
  // A tied parameter's messages follow the edges' in the transport's key space.
  const parallel::MessageKey key{.edge = edges + p, .micro = 0, .grad = in.payload == train::Payload::tied_gradient};
  const std::string who = "pipeline stage " + std::to_string(st) + ", " + train::instr_text(in);
  if (in.kind == train::InstrKind::copy_tied) {  // tensor shards in one process: into the other stages' copies
    for (int i : in.params) {
      const std::string& name = programs_.params[size_t(i)];
      const Tensor* from = session_->parameter_of(d, name);
      ASPEN_CHECK(from != nullptr);
      for (int other : local_group(parallel::Axis::pipe, d)) {  // this replica's shard of every stage
        Tensor* to = other == d ? nullptr : session_->parameter_of(other, name);
        if (to && to != from) std::memcpy(to->raw(), from->raw(), from->nbytes());
      }
    }
    return Status();
  }
  if (in.payload == train::Payload::tied_gradient) {
    if (in.kind == train::InstrKind::send) {  // this stage's accumulator of it, to the owner
      const Tensor* t = session_->parameter_of(d, accumulator_name(p, st));
      ASPEN_CHECK(t != nullptr);
      return transport.put(key, peer_stage(), t->clone());
    }
    Tensor* into = session_->parameter_of(d, accumulator_name(p, st));
    ASPEN_CHECK(into != nullptr);
    ASPEN_ASSIGN_OR_RETURN(Tensor part, transport.take(key, peer_stage(), into->dtype(), into->shape(), who));
    float* dst = into->data<float>();
    const float* src = part.data<float>();
    for (int64_t k = 0; k < into->numel(); ++k) dst[k] += src[k];
    return Status();
  }
  Tensor* w = session_->parameter_of(d, programs_.params[size_t(p)]);  // its new value, owner to the others
  ASPEN_CHECK(w != nullptr);
  if (in.kind == train::InstrKind::send) return transport.put(key, peer_stage(), w->clone());
  ASPEN_ASSIGN_OR_RETURN(Tensor value, transport.take(key, peer_stage(), w->dtype(), w->shape(), who));
  std::memcpy(w->raw(), value.raw(), w->nbytes());
  return Status();
}

Result<float> Runner::evaluate_local_pipeline(const std::map<std::string, const Tensor*>& inputs) {
  const train::PipelinePrograms& pp = *pipe_;
  const int S = int(pp.stages.size()), T = tensor_shards();
  // Inputs checked first: a failure inside would leave the other devices waiting.
  for (int st = 0; st < S; ++st)
    ASPEN_RETURN_IF_ERROR(check_eval_inputs(session_->executable(pp.stages[size_t(st)].forward), inputs));
  std::vector<std::unique_ptr<parallel::ThreadsTransport>> channels;  // by shard
  for (int t = 0; t < T; ++t)
    channels.push_back(std::make_unique<parallel::ThreadsTransport>(training_.data_parallel.comm.timeout));
  float loss = 0.0f;
  Status st = session_->for_each_replica([&](int d) -> Status {
    if (data_replica(d) != 0) return Status();  // the first replica's devices
    const int stage = coord_of(d).pipe, t = coord_of(d).tensor;
    const train::PipelinePrograms::Stage& prog = pp.stages[size_t(stage)];
    const train::PipelineStage& split = pp.split.stages[size_t(stage)];
    Status s = [&]() -> Status {
      std::map<std::string, Tensor> received;
      for (int e : split.in_edges) {
        const train::PipelineEdge& edge = pp.split.edges[size_t(e)];
        ASPEN_ASSIGN_OR_RETURN(Tensor x, channels[size_t(t)]->take({.edge = e, .micro = 0, .grad = false}, edge.from,
                                                                   edge.type.dtype, edge.type.shape,
                                                                   "evaluation, stage " + std::to_string(stage)));
        received.emplace(edge.name, std::move(x));
      }
      std::map<std::string, const Tensor*> feeds;
      for (const std::string& name : split.inputs) feeds.emplace(name, inputs.at(name));
      for (const auto& [name, x] : received) feeds.emplace(name, &x);
      ASPEN_ASSIGN_OR_RETURN(auto out, session_->run_replica(d, feeds, prog.forward));
      for (int e : split.out_edges)
        ASPEN_RETURN_IF_ERROR(channels[size_t(t)]->put({.edge = e, .micro = 0, .grad = false},
                                                       pp.split.edges[size_t(e)].to,
                                                       std::move(out.at(pp.split.edges[size_t(e)].name))));
      if (stage + 1 == S && t == 0) loss = out.at(training_.loss).data<float>()[0];
      return Status();
    }();
    if (!s.is_ok()) {
      for (auto& ch : channels) ch->fail("device " + std::to_string(d) + ": " + s.message());
      tensor_comms_[size_t(d)]->abort(s.message());
    }
    return s;
  });
  if (!st.is_ok()) {
    broken_ = true;
    return st;
  }
  return loss;
}

}  // namespace aspen::train
