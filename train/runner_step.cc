// TrainingModel's steps (train/runner.h): the fused step, the split
// step's micro-batches, gradient exchange, norms and optimizer update on
// every local replica, the host's decisions between them (loss scaling,
// clipping, non-finite checks), and the losses by output mode.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "train/runner.h"
#include "train/runner_util.h"
#include "core/check.h"

namespace aspen::train {

using namespace util;  // NOLINT: the file's helpers (train/runner_util.h)

Result<std::string> Runner::first_non_finite(const std::string& prefix) const {
  for (const compiler::Binding& b : session_->parameters()) {
    if (!has_prefix(b.name, prefix.c_str()) || b.type.dtype != DType::f32) continue;
    if (prefix.empty() && !is_weight(b.name)) continue;
    ASPEN_ASSIGN_OR_RETURN(Tensor t, session_->get_parameter(b.name));
    for (float x : t.span<float>())
      if (!std::isfinite(x)) return b.name;
  }
  return std::string();
}

Result<std::string> Runner::first_non_finite_gradient() const {
  for (size_t i = 0; i < programs_.params.size(); ++i) {
    // Where the reduced gradient is: this process's first replica's shard 0 of the owning stage, or the
    // owning local replica.
    const int d0 = coord_of(0).data;
    const float* g = spread() ? grads_[0][i]
                              : grads_[size_t(pipe_ ? device_at({.data = d0, .pipe = owner_[i], .tensor = 0})
                                                    : device_at({.data = d0 + owner_[i], .pipe = 0, .tensor = 0}))][i];
    if (!g) continue;  // another process's stage
    for (int64_t k = 0; k < grad_counts_[i]; ++k)
      if (!std::isfinite(g[k])) return programs_.params[i];
  }
  return std::string();
}

Status Runner::check_finite_weights(int64_t step, float loss) const {
  ASPEN_ASSIGN_OR_RETURN(const std::string bad, first_non_finite(""));
  return Status::error(Code::kFailedPrecondition, "training step " + std::to_string(step),
                       "a finite loss", "loss " + std::to_string(loss) + "; " +
                           (bad.empty() ? std::string("the weights are still finite")
                                        : "first non-finite tensor after the update: weight '" + bad + "'"));
}

namespace {

// A feed of `count` micro-batches of shape `per`: [count, ...per], [count /
// replicas, replicas, ...per], or the leading dimensions merged into per's
// first (PopTorch's combined batch); per itself when count is 1.
Status check_feed(const std::string& name, const Tensor& t, const Shape& per, DType dtype, int64_t count,
                  int64_t replicas) {
  const Shape want = prepend(count, per);
  bool ok = t.shape() == want || (count == 1 && t.shape() == per);
  if (!ok && replicas > 1) {
    std::vector<int64_t> d = {count / replicas, replicas};
    d.insert(d.end(), per.begin(), per.end());
    ok = t.shape() == shape_of(d);
  }
  if (!ok && per.rank() >= 1) {
    std::vector<int64_t> m(per.begin(), per.end());
    m[0] *= count;
    ok = t.shape() == shape_of(m);
  }
  if (t.dtype() != dtype || !ok)
    return Status::invalid_argument("training input '" + name + "'",
                                    std::string(dtype_name(dtype)) + want.to_string() +
                                        " (device_iterations x gradient_accumulation" +
                                        (replicas > 1 ? " x replicas" : "") + " micro-batches of " +
                                        per.to_string() + ")",
                                    std::string(dtype_name(t.dtype())) + t.shape().to_string());
  return Status();
}

}  // namespace

Result<std::vector<float>> Runner::run_fused(const std::map<std::string, const Tensor*>& inputs) {
  const int64_t iters = options_.device_iterations;
  const int prog = programs_.fused;
  const compiler::Executable& exe = session_->executable(prog);
  std::map<std::string, Tensor> owned;
  for (const compiler::Binding& b : exe.inputs) {
    if (b.name == train::kLrName || b.name == train::kGradScaleName || b.name == train::kLossScaleName) continue;
    auto it = inputs.find(b.name);
    if (it == inputs.end())
      return Status::invalid_argument("training input '" + b.name + "'", "given", "missing");
    ASPEN_RETURN_IF_ERROR(check_feed(b.name, *it->second, b.type.shape, b.type.dtype, iters, 1));
    owned.emplace(b.name, rows(*it->second, b.type.shape, 0, iters, /*squeeze=*/true));
  }
  const double ls = scaler_.scale();
  std::vector<double> lrs;
  Tensor lr(DType::f32, iters > 1 ? Shape{iters} : Shape{}), gs(DType::f32, iters > 1 ? Shape{iters} : Shape{}),
      lst(DType::f32, iters > 1 ? Shape{iters} : Shape{});
  for (int64_t i = 0; i < iters; ++i) {
    lrs.push_back(training_.schedule.at(steps_done_ + 1 + i));
    lr.data<float>()[i] = float(lrs.back());
    gs.data<float>()[i] = float(1.0 / ls);
    lst.data<float>()[i] = float(ls);
  }
  std::map<std::string, const Tensor*> feeds;
  for (const auto& [name, t] : owned) feeds.emplace(name, &t);
  for (const compiler::Binding& b : exe.inputs) {
    if (b.name == train::kLrName) feeds.emplace(b.name, &lr);
    if (b.name == train::kGradScaleName) feeds.emplace(b.name, &gs);
    if (b.name == train::kLossScaleName) feeds.emplace(b.name, &lst);
  }
  runtime::RunOptions r;
  r.iterations = iters;
  r.output_mode = runtime::OutputMode::all;
  ASPEN_ASSIGN_OR_RETURN(auto out, session_->run(feeds, r, prog));
  const Tensor& loss = out.at(training_.loss);
  std::vector<float> losses(loss.span<float>().begin(), loss.span<float>().end());
  for (int64_t i = 0; i < iters; ++i) {
    StepStats s;
    s.step = ++steps_done_;
    s.loss = losses[size_t(i)];
    s.lr = lrs[size_t(i)];
    s.loss_scale = ls;
    last_.push_back(s);
    if (!std::isfinite(s.loss)) return check_finite_weights(s.step, s.loss);
  }
  return losses;
}

Status Runner::replica_micro_batches(int l, int64_t it, const std::map<std::string, const Tensor*>& inputs,
                                            const std::vector<std::pair<std::string, Shape>>& data_inputs,
                                            const Tensor& loss_scale, ReplicaStep& out) {
  // Device l's instructions of the plan (train/plan.h) before the host's decision: its micro-batches, the
  // exchange of their gradients, the norms of the shards it holds.
  const std::vector<train::Instr>& instrs = plan_.devices[size_t(mesh_rank(l))].instrs;
  const int64_t acc = options_.gradient_accumulation;
  out.losses.clear();
  out.sq.assign(programs_.params.size(), 0.0f);
  for (size_t k = 0; k < instrs.size(); ++k) {
    const train::Instr& in = instrs[k];
    if (in.kind == train::InstrKind::decide) return Status();
    profile::TraceScope traced(trace_.get(), session_->device(l).name(), train::instr_kind_name(in.kind),
                               profile::category::kPlan);
    if (traced.active()) traced.add_arg("instruction", train::instr_text(in));
    switch (in.kind) {
      case train::InstrKind::backward: {  // forward and backward of micro-batch in.micro
        std::map<std::string, Tensor> owned;
        for (const auto& [name, per] : data_inputs)
          owned.emplace(name, rows(*inputs.at(name), per, (it * acc + in.micro) * data_replicas() + data_replica(l), 1,
                                   /*squeeze=*/true));
        std::map<std::string, const Tensor*> feeds;
        for (const auto& [name, t] : owned) feeds.emplace(name, &t);
        if (training_.loss_scaling.mode != train::LossScaling::none) feeds.emplace(train::kLossScaleName, &loss_scale);
        const int program = in.next ? programs_.micro_next : programs_.micro_first;
        const bool exchange =
            k + 1 < instrs.size() && instrs[k + 1].kind == train::InstrKind::reduce && instrs[k + 1].overlapped;
        ASPEN_ASSIGN_OR_RETURN(auto o, exchange ? run_with_exchange(l, feeds, program)
                                                : session_->run_replica(l, feeds, program));
        out.losses.push_back(o.at(training_.loss).data<float>()[0]);
        break;
      }
      case train::InstrKind::tensor_sum: {  // a whole weight's gradient: each shard has its part
        profile::TraceScope scope(trace_.get(), session_->device(l).name(), "sum gradients over tensor shards",
                                  profile::category::kCollective);
        int64_t bytes = 0;
        for (int i : in.params) {
          bytes += 4 * grad_counts_[size_t(i)];
          ASPEN_RETURN_IF_ERROR(tensor_comms_[size_t(l)]->all_reduce(
              std::span<float>(grads_[size_t(l)][size_t(i)], size_t(grad_counts_[size_t(i)]))));
        }
        if (scope.active()) scope.set_bytes(bytes);
        break;
      }
      case train::InstrKind::reduce: {
        if (in.overlapped) break;  // ran with the backward pass before it
        profile::TraceScope scope(trace_.get(), session_->device(l).name(), "reduce gradients",
                                  profile::category::kCollective);
        std::vector<float*> tensors;
        std::vector<int64_t> counts;
        int64_t bytes = 0;
        for (int i : in.params) {
          tensors.push_back(grads_[size_t(l)][size_t(i)]);
          counts.push_back(grad_counts_[size_t(i)]);
          bytes += 4 * grad_counts_[size_t(i)];
        }
        if (scope.active()) scope.set_bytes(bytes);
        // Into the owners' copies, or (replicas of tensor shards, each stepping its own weights) every copy.
        ASPEN_RETURN_IF_ERROR(in.to_owners
                                  ? dp_->reduce_to_owners(l, tensors, counts, in.owners)
                                  : data_group(l)->all_reduce(data_replica(l), tensors, counts));
        break;
      }
      case train::InstrKind::norm: {  // Σg² of each tensor of a shard this replica holds (train/program.h)
        const train::TrainingPrograms::Shard& sh = programs_.shards[size_t(in.shard)];
        if (sh.norm < 0) break;
        ASPEN_ASSIGN_OR_RETURN(auto o, session_->run_replica(l, {}, sh.norm));
        const Tensor& t = o.at(train::kGradSqNormName);
        for (size_t i = sh.begin; i < sh.end; ++i) out.sq[i] = t.data<float>()[i - sh.begin];
        break;
      }
      default:
        return Status::error(Code::kInternal, "training plan, device " + std::to_string(mesh_rank(l)),
                             "a step's instruction before the host's decision", train::instr_text(in));
    }
  }
  return Status();
}

Status Runner::replica_after_decision(int l, const Tensor& lr, const Tensor& grad_scale) {
  for (const train::Instr& in : train::after_decision(plan_.devices[size_t(mesh_rank(l))])) {
    profile::TraceScope traced(trace_.get(), session_->device(l).name(), train::instr_kind_name(in.kind),
                               profile::category::kPlan);
    if (traced.active()) traced.add_arg("instruction", train::instr_text(in));
    if (in.kind != train::InstrKind::step && in.kind != train::InstrKind::broadcast)
      return Status::error(Code::kInternal, "training plan, device " + std::to_string(mesh_rank(l)),
                           "a step's instruction after the host's decision", train::instr_text(in));
    const train::TrainingPrograms::Shard& sh = programs_.shards[size_t(in.shard)];
    if (in.kind == train::InstrKind::step) {
      if (sh.step >= 0)
        ASPEN_RETURN_IF_ERROR(
            session_->run_replica(l, {{train::kLrName, &lr}, {train::kGradScaleName, &grad_scale}}, sh.step).status());
    } else if (in.kind == train::InstrKind::broadcast) {  // ZeRO-1: the shard's new weights from its process
      std::vector<float*> w;
      std::vector<int64_t> counts;
      for (size_t i = sh.begin; i < sh.end; ++i) {
        Tensor* t = session_->parameter_of(l, programs_.params[i]);
        ASPEN_CHECK(t != nullptr);
        w.push_back(t->data<float>());
        counts.push_back(t->numel());
      }
      ASPEN_RETURN_IF_ERROR(dp_->broadcast_from(l, w, counts, in.peer));
    }
  }
  return Status();
}

Result<float> Runner::step_loss(const std::vector<float>& local) {
  // local: [acc][L] this process's micro-batch losses. All of them from
  // every process ([P][acc][L]), added in double in the order of their index
  // in the global batch (micro-batch a of replica g is number a·R + g): the
  // same bits for every layout.
  const int64_t acc = options_.gradient_accumulation, L = int64_t(local.size()) / acc;
  std::vector<float> all = local;
  if (dp_) {
    ASPEN_ASSIGN_OR_RETURN(all, dp_->gather_processes(local));
  }
  const int64_t P = int64_t(all.size()) / (acc * L);
  double sum = 0.0;
  for (int64_t a = 0; a < acc; ++a)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t l = 0; l < L; ++l) sum += double(all[size_t((p * acc + a) * L + l)]);
  return float(sum / double(acc * P * L));
}

Result<std::vector<float>> Runner::run_split(const std::map<std::string, const Tensor*>& inputs) {
  const int64_t iters = options_.device_iterations, acc = options_.gradient_accumulation;
  const int L = session_->replicas();
  const compiler::Executable& micro = session_->executable(programs_.micro_first);
  std::vector<std::pair<std::string, Shape>> data_inputs;
  for (const compiler::Binding& b : micro.inputs) {
    if (b.name == train::kLossScaleName) continue;
    auto it = inputs.find(b.name);
    if (it == inputs.end())
      return Status::invalid_argument("training input '" + b.name + "'", "given", "missing");
    const int64_t R = data_replicas();  // the tensor shards of a replica all take its micro-batches
    ASPEN_RETURN_IF_ERROR(check_feed(b.name, *it->second, b.type.shape, b.type.dtype, iters * acc * R, R));
    data_inputs.emplace_back(b.name, b.type.shape);
  }
  // Runs fn on every local replica; a failure aborts the data-parallel group.
  auto on_replicas = [&](const std::function<Status(int)>& fn) -> Status {
    Status st = session_->for_each_replica([&](int l) {
      Status r = fn(l);
      if (!r.is_ok() && dp_) data_group(l)->abort(data_replica(l), r.message());
      if (!r.is_ok() && !tensor_comms_.empty()) tensor_comms_[size_t(l)]->abort(r.message());
      return r;
    });
    if (!st.is_ok() && (dp_ || !tensor_comms_.empty())) broken_ = true;
    return st;
  };
  std::vector<float> losses;
  std::vector<ReplicaStep> rs(static_cast<size_t>(L));
  for (int64_t it = 0; it < iters; ++it) {
    StepStats s;
    s.step = steps_done_ + 1;
    s.lr = training_.schedule.at(s.step);
    s.loss_scale = scaler_.scale();
    const Tensor ls = scalar_f32(float(s.loss_scale));
    ASPEN_RETURN_IF_ERROR(on_replicas(
        [&](int l) { return replica_micro_batches(l, it, inputs, data_inputs, ls, rs[size_t(l)]); }));
    // The loss: the mean over every micro-batch of the step (step_loss).
    const int Ld = data_replicas(), T = tensor_shards();  // a replica's tensor shards agree on the loss: shard 0's
    std::vector<float> local_losses;  // [acc][Ld]
    for (int64_t a = 0; a < acc; ++a)
      for (int l = 0; l < Ld; ++l) {
        // (Across processes each shard's process has its one device.)
        const int shard0 = spread() ? 0 : device_at({.data = coord_of(0).data + l, .pipe = 0, .tensor = 0});
        local_losses.push_back(rs[size_t(shard0)].losses[size_t(a)]);
      }
    ASPEN_ASSIGN_OR_RETURN(s.loss, step_loss(local_losses));
    // Tensor shards: replica 0's shards' Σg² of their parts (across
    // processes, all-gathered from the shards of this process's replica).
    std::vector<std::vector<float>> shard_sq;
    if (T > 1 && needs_norm()) {
      const size_t n = programs_.params.size();
      if (spread()) {
        std::vector<float> all(n * size_t(T));
        ASPEN_RETURN_IF_ERROR(tensor_comms_[0]->all_gather(rs[0].sq.data(), all.data(), int64_t(n), DType::f32));
        for (int t = 0; t < T; ++t) shard_sq.emplace_back(all.begin() + t * n, all.begin() + (t + 1) * n);
      } else {
        for (int t = 0; t < T; ++t) shard_sq.push_back(rs[size_t(t)].sq);
      }
    }
    float sq_f32 = 0.0f;  // Σ over parameters in order, in f32: the same bits for every layout
    for (size_t i = 0; i < programs_.params.size(); ++i) {
      if (T > 1 && !tp_replicated_[i]) {  // a cut weight: the shards' parts, in rank order
        float part = 0.0f;
        for (int t = 0; t < T && !shard_sq.empty(); ++t) part += shard_sq[size_t(t)][i];
        sq_f32 += part;
      } else {
        sq_f32 += rs[size_t(owner_[i])].sq[i];
      }
    }
    const double sq = double(sq_f32);
    auto apply = [&](const Tensor& lr, const Tensor& gs) -> Status {
      Status st = on_replicas([&](int l) { return replica_after_decision(l, lr, gs); });
      if (st.is_ok() && programs_.shards.size() > 1) advance_step_count();
      return st;
    };
    ASPEN_RETURN_IF_ERROR(finish_step(s, sq, apply));
    losses.push_back(s.loss);
  }
  return losses;
}

void Runner::advance_step_count() {  // the shards read the count; it advances once (train/program.h)
  // Every copy once: one shared, or (tensor shards) each device's own.
  std::vector<Tensor*> seen;
  for (int d = 0; d < session_->replicas(); ++d) {
    Tensor* count = session_->parameter_of(d, train::kStepName);
    if (!count || std::find(seen.begin(), seen.end(), count) != seen.end()) continue;  // a stage that steps nothing
    seen.push_back(count);
    count->data<float>()[0] += 1.0f;
  }
  ASPEN_CHECK(!seen.empty() || spread());
}

Status Runner::finish_step(StepStats& s, double sq,
                                  const std::function<Status(const Tensor& lr, const Tensor& grad_scale)>& apply) {
  const int64_t acc = options_.gradient_accumulation;
  const bool finite = std::isfinite(sq) && std::isfinite(s.loss);
  // Tensor shards each differentiate the whole loss (their sum is T times it).
  const double denom = s.loss_scale * double(tensor_shards()) *
                       (training_.reduction == Reduction::mean ? double(acc) * double(replicas()) : 1.0);
  s.grad_norm = needs_norm() ? std::sqrt(sq) / denom : -1.0;
  if (!finite && training_.loss_scaling.mode != train::LossScaling::dynamic) {
    ASPEN_ASSIGN_OR_RETURN(const std::string bad, first_non_finite_gradient());
    steps_done_ = s.step;
    last_.push_back(s);
    return Status::error(Code::kFailedPrecondition, "training step " + std::to_string(s.step),
                         "a finite loss and gradients",
                         "loss " + std::to_string(s.loss) + ", gradient norm " + std::to_string(s.grad_norm) +
                             (bad.empty() ? std::string() : "; first non-finite tensor: the gradient of '" + bad + "'") +
                             " (the update was not applied)");
  }
  s.skipped = !scaler_.update(finite);
  if (!s.skipped) {
    double clip = 1.0;
    if (training_.clip_grad_norm > 0.0) clip = std::min(1.0, training_.clip_grad_norm / (s.grad_norm + 1e-6));
    const Tensor lr = scalar_f32(float(s.lr)), gs = scalar_f32(float(clip / denom));
    ASPEN_RETURN_IF_ERROR(apply(lr, gs));
  }
  steps_done_ = s.step;
  last_.push_back(s);
  return Status();
}

}  // namespace aspen::train
