// The Runner's walk of a step's plan (train/runner.h): every device of the
// session runs its instructions (train/plan.h) on its own team, whatever the
// layout: its passes (a pipeline stage's in the schedule's order, or the
// micro programs of accumulation), the edges' and tied parameters'
// transfers through a parallel::Transport (threads in one process, MPI
// across processes), the reductions over its data and tensor groups and the
// norms up to the host's decision; after it, the step, ZeRO-1's broadcasts
// and the tied weights' new values.
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

// NOTE [slowed device]: the slowed device spins before each pass for `fraction` of that program's last pass on
// it, so that whatever waits for its results (a peer stage, an exchange overlapped with the pass) waits as it
// would for a slower core; a program's first pass spins after itself.
bool Runner::slow_before(int d, int program) const {
  if (d != slow_device_ || size_t(d) >= pass_s_.size()) return false;
  auto it = pass_s_[size_t(d)].find(program);
  if (it == pass_s_[size_t(d)].end()) return false;
  runtime::spin_for(it->second * slow_fraction_);
  return true;
}

void Runner::slow_after(int d, int program, std::chrono::steady_clock::time_point began, double excluded_s,
                        bool spun) const {
  if (d != slow_device_ || size_t(d) >= pass_s_.size()) return;
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() - std::max(0.0, excluded_s);
  pass_s_[size_t(d)][program] = took;
  if (!spun) slow_before(d, program);
}

void PipelineStats::reset(int devices) {
  const size_t n = size_t(std::max(0, devices));
  busy_s.assign(n, 0.0), wait_s.assign(n, 0.0), comm_s.assign(n, 0.0), exchange_s.assign(n, 0.0);
  exchange_bytes.assign(n, 0);
  wall_s = 0.0;
}

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

Transport* Runner::transport_of(StepState& step, int device) {
  if (step.transports.empty()) return nullptr;
  return step.transports.at(mesh_->group(parallel::Axis::pipe, mesh_rank(device)).front()).get();
}

std::vector<Tensor*> Runner::accumulators(int device, std::span<const int> params) const {
  const int stage = coord_of(device).pipe;
  std::vector<Tensor*> out;
  for (int p : params) {
    Tensor* t = session_->parameter_of(device, accumulator_name(p, stage));
    ASPEN_CHECK(t != nullptr);
    out.push_back(t);
  }
  return out;
}

Status Runner::open_transports(StepState& step) {
  if (!pipe_) return Status();  // no edges: nothing travels point to point
  for (int d = 0; d < session_->replicas(); ++d) {
    const int key = mesh_->group(parallel::Axis::pipe, mesh_rank(d)).front();
    if (step.transports.count(key)) continue;
    if (spread()) {
      ASPEN_ASSIGN_OR_RETURN(auto across, parallel::job::transport(*pipe_group_, int(options_.gradient_accumulation)));
      step.transports.emplace(key, std::move(across));
    } else {
      step.transports.emplace(key, std::make_unique<parallel::ThreadsTransport>(training_.data_parallel.comm.timeout));
    }
  }
  return Status();
}

Status Runner::on_devices(StepState& step, const std::function<Status(int)>& fn) {
  Status st = session_->for_each_replica([&](int d) {
    Status r = fn(d);
    if (!r.is_ok()) {  // the others stop at once rather than at their timeout
      for (auto& [key, t] : step.transports) t->fail("device " + std::to_string(d) + ": " + r.message());
      if (dp_) data_group(d)->abort(data_replica(d), r.message());
      if (!tensor_comms_.empty()) tensor_comms_[spread() ? 0 : size_t(d)]->abort(r.message());
    }
    return r;
  });
  if (!st.is_ok() && (dp_ || !tensor_comms_.empty())) broken_ = true;
  return st;
}

Status Runner::walk_to_decision(int d, StepState& step) {
  const std::vector<Instr>& instrs = plan_.devices[size_t(mesh_rank(d))].instrs;
  const parallel::Coord at = coord_of(d);
  const int st = at.pipe, sh = at.tensor, r = data_replica(d);
  const PipelinePrograms::Stage* prog = pipe_ ? &pipe_->stages[size_t(st)] : nullptr;
  const bool last = st + 1 == pipeline_stages();  // the stage that computes the loss
  const int64_t acc = options_.gradient_accumulation;
  const std::vector<std::string>* stage_inputs = pipe_ ? &pipe_->split.stages[size_t(st)].inputs : nullptr;
  auto peer_stage = [&](const Instr& i) { return plan_.devices[size_t(i.peer)].coord.pipe; };
  std::vector<float>& losses = step.losses[size_t(d)];
  std::vector<float>& sq = step.sq[size_t(d)];
  losses.assign(size_t(acc), 0.0f);
  sq.assign(programs_.params.size(), 0.0f);
  std::map<int, std::map<std::string, Tensor>> stash;  // micro-batch -> its in-edge tensors
  std::map<int, std::map<std::string, Tensor>> grads;  // micro-batch -> its out-edges' gradients
  std::map<std::string, Tensor> out;                   // the last pass's outputs (its sends follow it)
  Transport* transport = transport_of(step, d);        // this device's pipe group's (none without stages)
  PipelineStats& stats = step.stats;                   // this device's entries only
  auto exchanged = [&](Clock::time_point began, int64_t bytes) {  // an exchange outside the passes
    const double c = std::chrono::duration<double>(Clock::now() - began).count();
    stats.comm_s[size_t(d)] += c, stats.exchange_s[size_t(d)] += c, stats.exchange_bytes[size_t(d)] += bytes;
  };
  for (size_t k = 0; k < instrs.size() && instrs[k].kind != InstrKind::decide; ++k) {
    const Instr& in = instrs[k];
    const int m = in.micro;
    profile::TraceScope traced(recording_, session_->device(d).name(), instr_kind_name(in.kind),
                               profile::category::kPlan);
    const bool transfer = in.kind == InstrKind::send || in.kind == InstrKind::recv;
    if (traced.active()) {
      traced.add_arg("instruction", instr_text(in));
      if (transfer)  // an arrow from the send to its receive (profile/perfetto.h)
        traced.add_arg(in.kind == InstrKind::send ? "flow_out" : "flow_in", transfer_key(in, mesh_rank(d)));
    }
    if (transfer && (in.payload == Payload::tied_gradient || in.payload == Payload::tied_weight)) {
      // A tied parameter's gradient on a later stage, added into its owner's (in stage order).
      ASPEN_RETURN_IF_ERROR(tied_transfer(d, in, *transport));
      continue;
    }
    auto where = [&] {
      return "training plan, device " + std::to_string(mesh_rank(d)) + " (stage " + std::to_string(st) + ", shard " +
             std::to_string(sh) + ", replica " + std::to_string(at.data) + "), " + instr_text(in);
    };
    switch (in.kind) {
      case InstrKind::recv: {
        const PipelineEdge& e = pipe_->split.edges[size_t(in.edge)];
        const bool grad = in.payload == Payload::gradient;
        profile::TraceScope wait(recording_, session_->device(d).name(), (grad ? "recv grad " : "recv ") + e.name,
                                 profile::category::kWait, e.type.bytes());
        const auto w0 = Clock::now();
        ASPEN_ASSIGN_OR_RETURN(Tensor t, transport->take({.edge = in.edge, .micro = m, .grad = grad}, peer_stage(in),
                                                         e.type.dtype, e.type.shape,
                                                         where() + ": waiting for " + (grad ? "the gradient of " : "") +
                                                             e.name + " from stage " + std::to_string(peer_stage(in))));
        stats.wait_s[size_t(d)] += std::chrono::duration<double>(Clock::now() - w0).count();
        if (grad) {
          grads[m].emplace(kPipeGradPrefix + std::to_string(in.edge), std::move(t));
        } else {
          stash[m].emplace(e.name, std::move(t));
        }
        break;
      }
      case InstrKind::send: {
        const bool grad = in.payload == Payload::gradient;
        const std::string name = grad ? kPipeGradPrefix + std::to_string(in.edge) : pipe_->split.edges[size_t(in.edge)].name;
        auto t = out.find(name);
        if (t == out.end())
          return Status::error(Code::kInternal, where(), "the pass before it to output " + name, "no such output");
        traced.set_bytes(int64_t(t->second.nbytes()));
        ASPEN_RETURN_IF_ERROR(transport->put({.edge = in.edge, .micro = m, .grad = grad}, peer_stage(in),
                                             std::move(t->second)));
        break;
      }
      case InstrKind::forward:
      case InstrKind::backward: {
        // This micro-batch's rows of the data inputs the pass takes (a stage's, or all of them).
        std::map<std::string, Tensor> owned;
        for (const auto& [name, per] : *step.per)
          if (!stage_inputs ||
              std::find(stage_inputs->begin(), stage_inputs->end(), name) != stage_inputs->end())
            owned.emplace(name, util::rows(*step.inputs->at(name), per,
                                           (step.iteration * acc + m) * data_replicas() + r, 1, /*squeeze=*/true));
        std::map<std::string, const Tensor*> feeds;
        for (const auto& [name, t] : owned) feeds.emplace(name, &t);
        for (const auto& [name, t] : stash[m]) feeds.emplace(name, &t);
        const auto b0 = Clock::now();
        if (in.kind == InstrKind::forward) {  // a pipeline stage's
          const bool spun = slow_before(d, prog->forward);
          const auto p0 = Clock::now();
          ASPEN_ASSIGN_OR_RETURN(out, session_->run_replica(d, feeds, prog->forward));
          slow_after(d, prog->forward, p0, 0.0, spun);
          stats.busy_s[size_t(d)] += std::chrono::duration<double>(Clock::now() - b0).count();
          if (last) losses[size_t(m)] = out.at(training_.loss).data<float>()[0];
          // The values the stage's backward reads wait with the micro-batch's in-edges (NOTE [stashed
          // activations] in train/pipeline.cc); so do the training outputs, which the backward then lacks.
          for (auto it = out.begin(); it != out.end();) {
            const bool saved = util::has_prefix(it->first, kPipeSavedPrefix);
            const bool output = !training_.pipeline.recompute &&
                                std::find(training_.outputs.begin(), training_.outputs.end(), it->first) !=
                                    training_.outputs.end();
            if (saved) stash[m].insert_or_assign(it->first, std::move(it->second));
            if (output) step.outputs[size_t(d)][size_t(m)][it->first] = std::move(it->second);
            it = saved || output ? out.erase(it) : std::next(it);
          }
          break;
        }
        for (const auto& [name, t] : grads[m]) feeds.emplace(name, &t);
        if (last && training_.loss_scaling.mode != LossScaling::none) feeds.emplace(kLossScaleName, &step.loss_scale);
        const int program = prog ? (in.next && prog->backward_next >= 0 ? prog->backward_next : prog->backward_first)
                                 : (in.next ? programs_.micro_next : programs_.micro_first);
        Result<std::map<std::string, Tensor>> ran = Status();
        double exposed = 0;  // an overlapped exchange's wait after the pass
        const bool spun = slow_before(d, program);
        const auto p0 = Clock::now();
        if (k + 1 < instrs.size() && instrs[k + 1].kind == InstrKind::reduce && instrs[k + 1].overlapped) {
          // Each accumulator the reduce takes, reduced over the data group as soon as this pass finishes it.
          const Instr& reduce = instrs[k + 1];
          std::map<std::string, int> owner_of;  // accumulator -> the local replica that gets its sum
          for (size_t j = 0; j < reduce.params.size(); ++j)
            owner_of.emplace(accumulator_name(reduce.params[j], st), reduce.to_owners ? reduce.owners[j] : 0);
          std::vector<ExchangePiece> pieces;  // by update of the program (none: not exchanged)
          for (const compiler::Binding& u : session_->executable(program).updates) {
            auto it = owner_of.find(u.name);
            Tensor* t = it == owner_of.end() ? nullptr : session_->parameter_of(d, u.name);
            pieces.push_back(t ? ExchangePiece{t->data<float>(), t->numel(), it->second} : ExchangePiece{});
          }
          parallel::DataParallelGroup* group = data_group(d);
          ran = run_overlapped(
              d, feeds, program, pieces, owner_of.size(),
              [&](std::span<float* const> t, std::span<const int64_t> c, std::span<const int> o) {
                return group->reduce_to_owners(r, t, c, o);
              },
              [&](const std::string& why) { group->abort(r, why); }, stats.exchange_s[size_t(d)],
              stats.exchange_bytes[size_t(d)], exposed);
        } else {
          ran = session_->run_replica(d, feeds, program);
        }
        ASPEN_ASSIGN_OR_RETURN(out, std::move(ran));
        slow_after(d, program, p0, exposed, spun);
        // The wait for an overlapped exchange after the pass is the exchange's, not the pass's.
        stats.busy_s[size_t(d)] += std::chrono::duration<double>(Clock::now() - b0).count() - exposed;
        stats.comm_s[size_t(d)] += exposed;
        if (!pipe_) losses[size_t(m)] = out.at(training_.loss).data<float>()[0];  // the micro program's
        for (const std::string& name : training_.outputs) {  // beside the loss (by the stage computing each)
          if (pipe_ && (!training_.pipeline.recompute || pipe_->split.output_stage.at(name) != st)) continue;
          auto o = out.find(name);
          if (o == out.end())
            return Status::error(Code::kInternal, where(), "the pass to output " + name, "no such output");
          step.outputs[size_t(d)][size_t(m)][name] = std::move(o->second);
        }
        stash.erase(m);
        grads.erase(m);
        break;
      }
      case InstrKind::tensor_sum: {  // a whole weight's gradient: each shard has its part
        profile::TraceScope scope(recording_, session_->device(d).name(), "sum gradients over tensor shards",
                                  profile::category::kCollective);
        const auto c0 = Clock::now();
        int64_t bytes = 0;
        for (Tensor* t : accumulators(d, in.params)) {
          bytes += int64_t(t->nbytes());
          ASPEN_RETURN_IF_ERROR(tensor_comms_[spread() ? 0 : size_t(d)]->all_reduce(
              std::span<float>(t->data<float>(), size_t(t->numel()))));
        }
        if (scope.active()) scope.set_bytes(bytes);
        exchanged(c0, bytes);
        break;
      }
      case InstrKind::reduce: {
        if (in.overlapped) break;  // ran with the backward pass before it
        std::vector<float*> tensors;
        std::vector<int64_t> counts;
        int64_t bytes = 0;
        for (Tensor* t : accumulators(d, in.params)) {
          tensors.push_back(t->data<float>());
          counts.push_back(t->numel());
          bytes += int64_t(t->nbytes());
        }
        profile::TraceScope scope(recording_, session_->device(d).name(), "reduce gradients",
                                  profile::category::kCollective, bytes);
        // Over the data group: into the owners' copies (in.owners), or (tensor shards: each device steps its
        // own weights) into every copy.
        const auto c0 = Clock::now();
        ASPEN_RETURN_IF_ERROR(in.to_owners ? data_group(d)->reduce_to_owners(r, tensors, counts, in.owners)
                                           : data_group(d)->all_reduce(r, tensors, counts));
        exchanged(c0, bytes);
        break;
      }
      case InstrKind::loss:  // across processes: the last stage's micro-batch losses to the others
        ASPEN_RETURN_IF_ERROR(pipe_group_->broadcast(losses.data(), acc, DType::f32, peer_stage(in)));
        break;
      case InstrKind::norm: {  // Σg² of each parameter of an optimizer shard (or the stage's; a cut one's part)
        const int program = prog ? prog->norm : programs_.shards[size_t(in.shard)].norm;
        if (program < 0) break;
        ASPEN_ASSIGN_OR_RETURN(auto o, session_->run_replica(d, {}, program));
        const float* t = o.at(kGradSqNormName).data<float>();
        if (prog) {
          for (size_t i = 0; i < prog->owned.size(); ++i) sq[prog->owned[i]] = t[i];
        } else {
          const TrainingPrograms::Shard& shard = programs_.shards[size_t(in.shard)];
          for (size_t i = shard.begin; i < shard.end; ++i) sq[i] = t[i - shard.begin];
        }
        break;
      }
      default:
        return Status::error(Code::kInternal, where(), "an instruction of a step before the host's decision",
                             instr_text(in));
    }
  }
  return transport ? transport->flush() : Status();  // every put has been taken
}

Status Runner::walk_after_decision(int d, StepState& step, const Tensor& lr, const Tensor& grad_scale) {
  const int st = coord_of(d).pipe;
  Transport* transport = transport_of(step, d);
  for (const Instr& in : after_decision(plan_.devices[size_t(mesh_rank(d))])) {
    profile::TraceScope traced(recording_, session_->device(d).name(), instr_kind_name(in.kind),
                               profile::category::kPlan);
    if (traced.active()) traced.add_arg("instruction", instr_text(in));
    switch (in.kind) {
      case InstrKind::step: {  // the optimizer shard's (or the stage's) step
        const int program = pipe_ ? pipe_->stages[size_t(st)].step : programs_.shards[size_t(in.shard)].step;
        if (program >= 0)
          ASPEN_RETURN_IF_ERROR(
              session_->run_replica(d, {{kLrName, &lr}, {kGradScaleName, &grad_scale}}, program).status());
        break;
      }
      case InstrKind::broadcast: {  // ZeRO-1: the shard's new weights from the process that stepped it
        const TrainingPrograms::Shard& shard = programs_.shards[size_t(in.shard)];
        std::vector<float*> w;
        std::vector<int64_t> counts;
        for (size_t i = shard.begin; i < shard.end; ++i) {
          Tensor* t = session_->parameter_of(d, programs_.params[i]);
          ASPEN_CHECK(t != nullptr);
          w.push_back(t->data<float>());
          counts.push_back(t->numel());
        }
        ASPEN_RETURN_IF_ERROR(data_group(d)->broadcast_from(data_replica(d), w, counts, in.peer));
        break;
      }
      case InstrKind::send:
      case InstrKind::recv:
      case InstrKind::copy_tied:  // a tied weight's new value from its owner to the other stages' copies
        ASPEN_RETURN_IF_ERROR(tied_transfer(d, in, *transport));
        break;
      default:
        return Status::error(Code::kInternal, "training plan, device " + std::to_string(mesh_rank(d)),
                             "an instruction of a step after the host's decision", instr_text(in));
    }
  }
  return transport ? transport->flush() : Status();
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

}  // namespace aspen::train
