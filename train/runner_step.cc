// The Runner's steps (train/runner.h): the fused step, and the host's part
// of every other (run_steps): the inputs checked and cut into micro-batches,
// the devices' walks of the plan (train/runner_walk.cc) before and after the
// host's decision, the step's loss over every process, the gradient norm,
// and the decision itself (loss scaling, clipping, non-finite checks).
#include <algorithm>
#include <chrono>
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
    // The reduced gradient (shard 0's part): across processes this process's device has its stage's.
    const Tensor* g =
        session_->parameter_of(spread() ? 0 : holder(i, 0), grad_accumulator_name(programs_.params[i]));
    if (!g) continue;  // another process's stage
    for (float x : g->span<float>())
      if (!std::isfinite(x)) return programs_.params[i];
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
  // The plan of a fused step (train/plan.h): `fused` on the one device (device_iterations steps in one
  // program), then the host's look at the losses.
  const std::vector<Instr>& instrs = plan_.devices[0].instrs;
  if (instrs.empty() || instrs[0].kind != InstrKind::fused)
    return Status::error(Code::kInternal, "training plan, device 0", "a fused step",
                         instrs.empty() ? std::string("no instructions") : instr_text(instrs[0]));
  Result<std::map<std::string, Tensor>> ran = Status();
  {
    profile::TraceScope traced(recording_, session_->device(0).name(), instr_kind_name(InstrKind::fused),
                               profile::category::kPlan);
    if (traced.active()) traced.add_arg("instruction", instr_text(instrs[0]));
    ran = session_->run(feeds, r, prog);
  }
  ASPEN_ASSIGN_OR_RETURN(auto out, std::move(ran));
  for (const std::string& name : training_.outputs) {  // each [iters, ...per] (output mode all)
    auto o = out.find(name);
    const auto b = std::find_if(exe.outputs.begin(), exe.outputs.end(),
                                [&](const compiler::Binding& x) { return x.name == name; });
    if (o == out.end() || b == exe.outputs.end())
      return Status::error(Code::kInternal, "the fused training step", "an output " + name, "none");
    add_output(name, std::move(o->second), b->type.shape);
  }
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

Result<std::map<std::string, Tensor>> Runner::copy_gradients_to_host() const {
  if (!training_.keep_gradients)
    return Status::invalid_argument("gradients", "a model made with TrainingOptions::keep_gradients",
                                    "one made without");
  if (last_.empty())
    return Status::error(Code::kFailedPrecondition, "gradients", "a training step run", "none yet");
  const double denom = last_.back().loss_scale * (training_.reduction == Reduction::mean
                                                      ? double(options_.gradient_accumulation) * double(replicas())
                                                      : 1.0);
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < programs_.params.size(); ++i) {
    const Tensor* g = session_->parameter_of(holder(i, 0), grad_accumulator_name(programs_.params[i]));
    if (!g)
      return Status::error(Code::kInternal, "gradient of '" + programs_.params[i] + "'", "its accumulator",
                           "none on the device that holds it");
    Tensor t = g->clone();
    for (float& x : t.span<float>()) x = float(double(x) / denom);
    out.emplace(programs_.params[i], std::move(t));
  }
  return out;
}

void Runner::add_output(const std::string& name, Tensor t, const Shape& per) {
  OutputPieces& p = output_pieces_[name];
  p.per = per;
  p.count += per.numel() == 0 ? 1 : t.numel() / per.numel();
  p.parts.push_back(std::move(t));
}

Status Runner::join_outputs() {
  for (auto& [name, p] : output_pieces_) {
    if (p.parts.empty()) continue;
    const Shape joined = util::prepend(p.count, p.per);
    if (p.parts.size() == 1 && p.parts.front().shape() == joined) {  // the fused step's, already whole
      last_outputs_[name] = std::move(p.parts.front());
      continue;
    }
    ASPEN_ASSIGN_OR_RETURN(Tensor all, Tensor::make_uninitialized(p.parts.front().dtype(), joined));
    char* at = static_cast<char*>(all.raw());
    for (const Tensor& t : p.parts) {
      if (t.nbytes()) std::memcpy(at, t.raw(), t.nbytes());
      at += t.nbytes();
    }
    last_outputs_[name] = std::move(all);
  }
  output_pieces_.clear();
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

Result<std::map<std::string, Shape>> Runner::data_inputs(const std::map<std::string, const Tensor*>& inputs) const {
  const int64_t iters = options_.device_iterations, acc = options_.gradient_accumulation;
  const int64_t R = data_replicas();  // the tensor shards (and stages) of a replica all take its micro-batches
  std::map<std::string, Shape> per;
  if (!pipe_) {
    for (const compiler::Binding& b : session_->executable(programs_.micro_first).inputs) {
      if (b.name == kLossScaleName) continue;
      auto it = inputs.find(b.name);
      if (it == inputs.end()) return Status::invalid_argument("training input '" + b.name + "'", "given", "missing");
      ASPEN_RETURN_IF_ERROR(check_feed(b.name, *it->second, b.type.shape, b.type.dtype, iters * acc * R, R));
      per.emplace(b.name, b.type.shape);
    }
    return per;
  }
  // The forward graph's inputs each stage of this process takes, and their per-micro-batch types.
  for (int s = 0; s < pipeline_stages(); ++s) {
    if (spread() && s != coord_of(0).pipe) continue;  // another process's stage (a placeholder here)
    for (const compiler::Binding& b : session_->executable(pipe_->stages[size_t(s)].backward_first).inputs) {
      if (b.name.starts_with("pipe.") || b.name == kLossScaleName) continue;
      auto it = inputs.find(b.name);
      if (it == inputs.end()) return Status::invalid_argument("training input '" + b.name + "'", "given", "missing");
      const Tensor& t = *it->second;
      if (t.dtype() != b.type.dtype || t.numel() != b.type.shape.numel() * iters * acc * R)
        return Status::invalid_argument(
            "training input '" + b.name + "'",
            std::string(dtype_name(b.type.dtype)) + " with " + std::to_string(iters * acc * R) +
                " micro-batches of " + b.type.shape.to_string() + " (device_iterations x gradient_accumulation" +
                (R > 1 ? " x replicas)" : ")"),
            std::string(dtype_name(t.dtype())) + t.shape().to_string());
      per.emplace(b.name, b.type.shape);
    }
  }
  return per;
}

Result<double> Runner::step_norm(const StepState& step) {
  if (!needs_norm()) return 0.0;
  const size_t n = programs_.params.size();
  const int T = tensor_shards();
  // By tensor shard: Σg² of each parameter's reduced gradient (a cut one's part), where this process's first
  // replica holds it: the owning stage's device, or the owning local replica's.
  std::vector<std::vector<float>> by_shard(static_cast<size_t>(T), std::vector<float>(n, 0.0f));
  if (spread()) {  // one device: the other shards' vectors from its tensor group
    const std::vector<float>& mine = step.sq[0];
    if (T > 1) {
      std::vector<float> all(n * size_t(T));
      ASPEN_RETURN_IF_ERROR(tensor_comms_[0]->all_gather(mine.data(), all.data(), int64_t(n), DType::f32));
      for (int t = 0; t < T; ++t) by_shard[size_t(t)].assign(all.begin() + t * n, all.begin() + (t + 1) * n);
    } else {
      by_shard[0] = mine;
    }
  } else {
    for (size_t i = 0; i < n; ++i)
      for (int t = 0; t < T; ++t) by_shard[size_t(t)][i] = step.sq[size_t(holder(i, t))][i];
  }
  // Σg², added in parameter order in f32 (the same bits for every layout); a cut parameter's parts over the
  // shards in rank order.
  std::vector<float> sums(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    if (T > 1 && !tp_replicated_[i]) {
      for (int t = 0; t < T; ++t) sums[i] += by_shard[size_t(t)][i];
    } else {
      sums[i] = by_shard[0][i];
    }
  }
  // Stages across processes: each has its own entries (the others are 0, so the sum is exact).
  if (spread() && pipe_) ASPEN_RETURN_IF_ERROR(pipe_group_->all_reduce(std::span<float>(sums)));
  float sq = 0.0f;
  for (float x : sums) sq += x;
  return double(sq);
}

Result<std::vector<float>> Runner::run_steps(const std::map<std::string, const Tensor*>& inputs) {
  const int64_t iters = options_.device_iterations, acc = options_.gradient_accumulation;
  const int D = session_->replicas(), Ld = data_replicas();
  using Shapes = std::map<std::string, Shape>;
  ASPEN_ASSIGN_OR_RETURN(const Shapes per, data_inputs(inputs));
  std::vector<float> losses;
  if (pass_s_.size() != size_t(D)) pass_s_.assign(size_t(D), {});  // NOTE [slowed device]
  for (int64_t it = 0; it < iters; ++it) {
    StepStats s;
    s.step = steps_done_ + 1;
    s.lr = training_.schedule.at(s.step);
    s.loss_scale = scaler_.scale();
    StepState step;
    step.iteration = it;
    step.inputs = &inputs;
    step.per = &per;
    step.loss_scale = scalar_f32(float(s.loss_scale));
    step.losses.resize(size_t(D));
    step.outputs.resize(size_t(D));
    for (auto& by_micro : step.outputs) by_micro.resize(size_t(acc));
    step.sq.resize(size_t(D));
    step.stats.reset(D);
    ASPEN_RETURN_IF_ERROR(open_transports(step));
    const auto t0 = std::chrono::steady_clock::now();
    ASPEN_RETURN_IF_ERROR(on_devices(step, [&](int d) { return walk_to_decision(d, step); }));
    // Where the step's time went, per device (PipelineStats; live monitoring's busy shares).
    step.stats.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pipe_stats_ = step.stats;
    if (pipe_ && !spread()) {  // by stage: the mean over its devices here
      s.stage_busy_s.assign(size_t(pipeline_stages()), 0.0);
      std::vector<int> n(size_t(pipeline_stages()), 0);
      for (int d = 0; d < D; ++d) {
        s.stage_busy_s[size_t(coord_of(d).pipe)] += step.stats.busy_s[size_t(d)];
        ++n[size_t(coord_of(d).pipe)];
      }
      for (size_t k = 0; k < n.size(); ++k) s.stage_busy_s[k] /= std::max(1, n[k]);
      s.wall_s = step.stats.wall_s;
    }
    // The loss: the mean over every micro-batch of the step (step_loss), each local replica's from its last
    // stage's first shard (a replica's shards agree on it).
    std::vector<int> loss_device;  // by local replica
    for (int l = 0; l < Ld; ++l)
      loss_device.push_back(
          spread() ? 0 : device_at({.data = coord_of(0).data + l, .pipe = pipeline_stages() - 1, .tensor = 0}));
    std::vector<float> local_losses;  // [acc][Ld]
    for (int64_t a = 0; a < acc; ++a)
      for (int l = 0; l < Ld; ++l) local_losses.push_back(step.losses[size_t(loss_device[size_t(l)])][size_t(a)]);
    ASPEN_ASSIGN_OR_RETURN(s.loss, step_loss(local_losses));
    for (int64_t a = 0; a < acc; ++a)  // the outputs in the inputs' order: micro-batch, then local replica
      for (int l = 0; l < Ld; ++l)
        for (int p = 0; p < (training_.outputs.empty() ? 0 : pipeline_stages()); ++p) {  // each from its stage
          const int d = device_at({.data = coord_of(0).data + l, .pipe = p, .tensor = 0});  // one process's
          for (auto& [name, t] : step.outputs[size_t(d)][size_t(a)]) {
            const Shape shape = t.shape();
            add_output(name, std::move(t), shape);
          }
        }
    ASPEN_ASSIGN_OR_RETURN(const double sq, step_norm(step));
    // After the decision each device runs the rest of its plan.
    auto apply = [&](const Tensor& lr, const Tensor& gs) -> Status {
      Status st = on_devices(step, [&](int d) { return walk_after_decision(d, step, lr, gs); });
      if (st.is_ok() && (pipe_ || programs_.shards.size() > 1)) advance_step_count();  // several step programs
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
