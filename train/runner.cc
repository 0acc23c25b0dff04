#include "train/runner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <charconv>
#include <limits>
#include <set>

#include "train/pipeline_balance.h"
#include "train/runner_util.h"
#include "compiler/cache.h"
#include "core/check.h"
#include "kernels/convert.h"
#include "kernels/matmul_choice.h"
#include "parallel/mesh.h"
#include "parallel/job.h"
#include "runtime/run_facts.h"

namespace aspen::train {

using namespace util;  // NOLINT: the file's helpers (train/runner_util.h)

namespace {
Status not_a_parameter(const std::string& name) {
  return Status::error(Code::kNotFound, "parameter '" + name + "'", "a parameter of the program", "none");
}
}  // namespace

Result<std::unique_ptr<Runner>> Runner::create(const graph::Graph& forward, const RunnerOptions& options,
                                               const TrainingOptions& training, const TensorSharding* sharding) {
  ASPEN_RETURN_IF_ERROR(training.schedule.validate());
  ASPEN_RETURN_IF_ERROR(training.loss_scaling.validate());
  if (!(training.clip_grad_norm >= 0.0) || !std::isfinite(training.clip_grad_norm))
    return Status::invalid_argument("training: clip_grad_norm", "a finite value >= 0 (0: off)",
                                    std::to_string(training.clip_grad_norm));
  if (options.tensor_parallel > 1 && !sharding)
    return Status::invalid_argument("training: " + std::to_string(options.tensor_parallel) + " tensor shards",
                                    "the model's rule for cutting its weights", "none given");
  std::unique_ptr<Runner> m(new Runner());
  m->options_ = options;
  m->training_ = training;
  m->sharding_ = sharding;
  m->scaler_ = train::LossScaler(training.loss_scaling);
  train::ProgramOptions po;
  po.optimizer = training.optimizer;
  po.gradient_accumulation = options.gradient_accumulation;
  po.clip = training.clip_grad_norm > 0.0;
  po.recompute_stages = training.pipeline.recompute;
  po.dynamic_loss_scale = training.loss_scaling.mode == train::LossScaling::dynamic;
  po.loss_scale_input = training.loss_scaling.mode != train::LossScaling::none;
  po.loss = training.loss;
  po.outputs = training.outputs;
  // Outputs beside the loss and kept gradients are read from one device per replica.
  const bool splits_model =
      training.pipeline.stages > 1 || options.tensor_parallel > 1 || options.model_across_processes;
  if (training.keep_gradients && (splits_model || options.mpi))
    return Status::error(Code::kUnimplemented, "training: keep_gradients",
                         "one process, one device per replica (no pipeline stages or tensor shards)",
                         "a layout that splits the model or spans processes");
  if (!training.outputs.empty() && (options.tensor_parallel > 1 || options.model_across_processes))
    return Status::error(Code::kUnimplemented,
                         "training outputs beside the loss ('" + training.outputs.front() + "', ...)",
                         "whole layers on each device of a process (replicas, pipeline stages; no tensor shards "
                         "or model across processes)",
                         "a layout that splits the model so");
  if (options.compile.stochastic_rounding && options.tensor_parallel > 1)
    return Status::error(Code::kUnimplemented, "training: stochastic rounding",
                         "whole layers on each device (replicas, pipeline stages; no tensor shards)",
                         std::to_string(options.tensor_parallel) + " tensor shards");
  const int local = int(options.replication_factor);
  const bool data_parallel = local > 1 || options.mpi;
  const int tp = int(options.tensor_parallel);
  const int stages = training.pipeline.stages;
  if (stages < 1) return Status::invalid_argument("training: pipeline stages", ">= 1", std::to_string(stages));
  po.split = data_parallel || tp > 1 || training.keep_gradients;  // replicated weights' gradients are summed
                                                                   // over the shards first
  po.shards = tp > 1 ? 1 : local;      // tensor shards (and their replicas) each step all their own weights
  if (options.mpi) {
    parallel::CommOptions jo = training.data_parallel.comm;
    jo.name = "job";
    ASPEN_ASSIGN_OR_RETURN(m->job_, parallel::job::world("training over MPI", jo));
    // The layout first, before any other group is made (making one is
    // collective over the job: a process with another layout would wait in it).
    ASPEN_RETURN_IF_ERROR(parallel::check_same_fields(*m->job_, layout_fields(options, training), "training layout"));
  }
  // The job's mesh (parallel/mesh.h) and where it lives: every device's coordinates and groups come from it.
  ASPEN_RETURN_IF_ERROR(m->read_slow_hook());
  const int P = m->job_ ? m->job_->size() : 1;
  parallel::MeshShape shape{.data = local * P, .pipe = stages, .tensor = tp};
  if (options.model_across_processes) {
    // The mesh over processes: process (d·stages + s)·tp + t (parallel::Mesh's rank order).
    const int M = stages * tp;
    if (M == 1)
      return Status::invalid_argument("options.model_across_processes", "pipeline stages or tensor shards to spread",
                                      "one stage and one shard");
    if (P % M != 0)
      return Status::invalid_argument("options.model_across_processes: the " + std::to_string(P) + " processes",
                                      "a multiple of stages x shards (" + std::to_string(stages) + " x " +
                                          std::to_string(tp) + " = " + std::to_string(M) + ")",
                                      std::to_string(P) + " processes");
    shape.data = P / M;
  }
  ASPEN_ASSIGN_OR_RETURN(m->placement_, parallel::place(shape, P, "options.replication_factor"));
  ASPEN_ASSIGN_OR_RETURN(const parallel::Mesh mesh, parallel::Mesh::create(shape));
  m->mesh_ = mesh;
  const int rank = m->job_ ? m->job_->rank() : 0;
  m->first_rank_ = rank * m->placement_.process_devices();
  if (m->spread()) {
    const parallel::Coord at = mesh.coord(rank);
    // The replica's stages of this shard ("pipe", ranked by stage), then its
    // shards of this stage ("tensor", ranked by shard); every process makes
    // both (MPI_Comm_split is collective), also a group of one. A group's
    // colour is its first rank.
    parallel::CommOptions mo = training.data_parallel.comm;
    mo.name = "pipe";
    const std::string what = "a model across processes";
    ASPEN_ASSIGN_OR_RETURN(auto pipe, parallel::job::split(what, mesh.group(parallel::Axis::pipe, rank).front(),
                                                           at.pipe, mo));
    mo.name = "tensor";
    ASPEN_ASSIGN_OR_RETURN(auto tensor, parallel::job::split(what, mesh.group(parallel::Axis::tensor, rank).front(),
                                                             at.tensor, mo));
    if (stages > 1) m->pipe_group_ = std::move(pipe);
    if (tp > 1) m->tensor_comms_.push_back(std::move(tensor));
  }
  if (data_parallel) {
    parallel::DataParallelOptions dpo = training.data_parallel;
    dpo.local = local;
    dpo.mpi = options.mpi;
    // Across processes: the replicas of this stage and shard (its position in a replica).
    dpo.mpi_color = m->spread() ? m->replica_position(0) : -1;
    ASPEN_ASSIGN_OR_RETURN(m->dp_, parallel::DataParallelGroup::create(dpo));
    if (dpo.compression == parallel::Compression::topk && training.loss_scaling.mode == train::LossScaling::dynamic)
      return Status::unimplemented("training: top-k gradient compression with dynamic loss scaling",
                                   "combination in this build (the error feedback would carry gradients across "
                                   "loss scales; use static scaling or bf16 compression)");
    // ZeRO-1 across processes: one shard per replica of the job (inside a
    // process the replicas share the state already).
    m->zero_ = dpo.shard_optimizer_state && m->dp_->processes() > 1;
    if (m->zero_) po.shards = m->dp_->replicas();
  }
  if (tp > 1 && m->zero_)
    return Status::unimplemented("training: tensor_parallel with sharded optimizer state",
                                 "layout in this build (each tensor shard keeps its part's state)");
  if (stages > 1 && m->zero_)
    return Status::unimplemented("training: " + std::to_string(stages) + " pipeline stages with sharded optimizer state",
                                 "layout in this build (pipeline stages with replicas keep the whole state)");
  // With replicas in a process, one data-parallel group per position k in a
  // replica (stage, tensor rank: mesh rank k of replica 0); dp_ is k = 0's,
  // the others are made here in the same order on every process.
  const int groups = data_parallel && !m->spread() ? m->placement_.model_devices() : 1;
  for (int k = 1; k < groups; ++k) {
    parallel::DataParallelOptions dpo = training.data_parallel;
    dpo.local = local;
    dpo.mpi = options.mpi;
    const parallel::Coord at = mesh.coord(k);
    dpo.comm.name = training.data_parallel.comm.name + (stages > 1 ? " stage " + std::to_string(at.pipe) : "") +
                    (tp > 1 ? " shard " + std::to_string(at.tensor) : "");
    ASPEN_ASSIGN_OR_RETURN(auto g, parallel::DataParallelGroup::create(dpo));
    m->more_dp_.push_back(std::move(g));
  }
  std::vector<const graph::Graph*> graphs;
  const compiler::CompileOptions copts = options.compile;
  if (stages > 1) {
    train::PipelineCut cut;
    const bool tagged = std::any_of(forward.nodes().begin(), forward.nodes().end(),
                                    [](const graph::Node& n) { return n.stage >= 0; });
    // Balance::dynamic starts from the measured cut too: its balancer's speeds are then the devices' (and the
    // run's drift), not the estimate's errors (train/rebalance.h).
    if ((training.pipeline.balance == TrainingOptions::Balance::measured ||
         training.pipeline.balance == TrainingOptions::Balance::dynamic) &&
        !tagged) {
      // Process 0 measures (the others wait in the broadcast): one cut for the whole job.
      // A failure on process 0 is broadcast too (costs of NaN), so the others stop at once.
      std::vector<float> costs(forward.nodes().size(), 0.0f);
      Status measured;
      if (!m->job_ || m->job_->rank() == 0) {
        Result<MeasuredCosts> mc = measure_pipeline_costs(forward, po, copts, int(options.threads));
        if (mc.is_ok()) {
          for (size_t i = 0; i < costs.size(); ++i) costs[i] = float(mc->node_costs[i]);
        } else {
          measured = mc.status();
          costs.assign(costs.size(), std::numeric_limits<float>::quiet_NaN());
        }
      }
      if (m->job_) ASPEN_RETURN_IF_ERROR(m->job_->broadcast(costs.data(), int64_t(costs.size()), DType::f32, 0));
      ASPEN_RETURN_IF_ERROR(measured);
      if (!costs.empty() && std::isnan(costs[0]))
        return Status::error(Code::kAborted, "training: the pipeline's measured costs", "process 0's measurement",
                             "a failure there (its error says why)");
      cut.node_costs.assign(costs.begin(), costs.end());
      m->node_costs_ = cut.node_costs;
    }
    ASPEN_ASSIGN_OR_RETURN(train::PipelinePrograms pp, train::build_pipeline_programs(forward, stages, po, cut));
    m->pipe_ = std::make_unique<train::PipelinePrograms>(std::move(pp));
    m->programs_.params = m->pipe_->params;
    for (const graph::Graph& g : m->pipe_->graphs) graphs.push_back(&g);
  } else {
    ASPEN_ASSIGN_OR_RETURN(m->programs_, train::build_training_programs(forward, po));
    for (const graph::Graph& g : m->programs_.graphs) graphs.push_back(&g);
  }
  for (int32_t i : forward.input_nodes()) m->input_names_.push_back(forward.node(i).name);

  // The evaluation program: the forward graph with only the loss as an output.
  const graph::Graph eval = train::loss_only(forward, training.loss);
  m->eval_program_ = int(graphs.size());
  graphs.push_back(&eval);
  const std::vector<const graph::Graph*> all_graphs = graphs;  // what every process agrees on
  for (const train::TrainingPrograms::Shard& sh : m->programs_.shards) {  // the full optimizer state's types
    if (sh.step < 0) continue;
    const graph::Graph& g = m->programs_.graphs[size_t(sh.step)];
    std::vector<std::string> names;
    for (int32_t i : g.parameter_nodes()) {
      const graph::Node& n = g.node(i);
      if (!has_prefix(n.name, train::kOptimizerPrefix)) continue;
      m->state_types_.emplace(n.name, std::make_pair(g.type(n.outputs[0]).dtype, g.type(n.outputs[0]).shape));
      if (n.name != train::kStepName) names.push_back(n.name);
    }
    m->shard_state_.push_back(std::move(names));
  }
  // ZeRO-1: another process's shard is stepped there; this process compiles
  // a placeholder in its place, so it never holds that shard's state.
  graph::Graph placeholder;
  {
    graph::Builder b(placeholder);
    b.output("placeholder", b.scalar(0.0f));
  }
  if (m->zero_)
    for (size_t k = 0; k < m->programs_.shards.size(); ++k)
      if (m->programs_.shards[k].step >= 0 && int(k) / local != m->dp_->process())
        graphs[size_t(m->programs_.shards[k].step)] = &placeholder;
  // Every weight's and optimizer state's type, and which names each stage uses.
  for (const graph::Graph* g : all_graphs)
    for (int32_t i : g->parameter_nodes()) {
      const graph::Node& n = g->node(i);
      if (!train::is_state_name(n.name) || has_prefix(n.name, train::kOptimizerPrefix))
        m->all_types_.emplace(n.name, std::make_pair(g->type(n.outputs[0]).dtype, g->type(n.outputs[0]).shape));
    }
  if (m->pipe_) {
    m->stage_uses_.resize(size_t(stages));
    for (int st = 0; st < stages; ++st)
      for (int prog : m->pipe_->stages[size_t(st)].programs())
        if (prog >= 0)
          for (int32_t n : m->pipe_->graphs[size_t(prog)].parameter_nodes())
            m->stage_uses_[size_t(st)].insert(m->pipe_->graphs[size_t(prog)].node(n).name);
  }
  // Tensor shards of pipeline stages: no device holds every stage's weights,
  // so evaluation runs through the stages' forward programs.
  if (tp > 1 && m->pipe_) graphs[size_t(m->eval_program_)] = &placeholder;
  // Pipeline stages across processes: this process compiles its stage's
  // programs only (placeholders keep the others' numbers), and evaluates
  // through the stages' forward programs.
  if (m->spread() && m->pipe_) {
    for (int st = 0; st < stages; ++st)
      for (int prog : m->pipe_->stages[size_t(st)].programs())
        if (st != m->coord_of(0).pipe && prog >= 0) graphs[size_t(prog)] = &placeholder;
    graphs[size_t(m->eval_program_)] = &placeholder;
  }
  m->program_names_.assign(graphs.size(), "");
  auto name_program = [&](int index, std::string name) {
    if (index >= 0 && graphs[size_t(index)] != &placeholder) m->program_names_[size_t(index)] = std::move(name);
  };
  if (m->pipe_) {
    for (int st = 0; st < stages; ++st) {
      const train::PipelinePrograms::Stage& s = m->pipe_->stages[size_t(st)];
      const std::string p = "stage " + std::to_string(st) + " ";
      name_program(s.forward, p + "forward");
      name_program(s.backward_first, p + (s.backward_next >= 0 ? "backward (first micro-batch)" : "backward"));
      name_program(s.backward_next, p + "backward");
      name_program(s.norm, p + "gradient norm");
      name_program(s.step, p + "optimizer step");
    }
  } else {
    const train::TrainingPrograms& pr = m->programs_;
    name_program(pr.fused, "step");
    name_program(pr.micro_first, pr.micro_next >= 0 ? "micro-batch (first)" : "micro-batch");
    name_program(pr.micro_next, "micro-batch");
    name_program(pr.norm, "gradient norm");
    name_program(pr.step, "optimizer step");
    for (size_t k = 0; k < pr.shards.size(); ++k) {
      const std::string shard = pr.shards.size() > 1 ? " (shard " + std::to_string(k) + ")" : "";
      name_program(pr.shards[k].norm, "gradient norm" + shard);
      name_program(pr.shards[k].step, "optimizer step" + shard);
    }
  }
  name_program(m->eval_program_, "evaluation");

  std::vector<std::unique_ptr<compiler::Executable>> exes;
  const auto compile_all = [&]() -> Status {
    exes.clear();
    m->cache_stored_ = true;
    for (const graph::Graph* g : graphs) {
      std::unique_ptr<compiler::Executable> exe;
      if (!options.executable_cache.empty()) {
        compiler::ExecutableCache cache(options.executable_cache);
        bool hit = false, stored = false;
        ASPEN_ASSIGN_OR_RETURN(exe, cache.compile(*g, copts, &hit, &stored));
        m->cache_hit_ = (exes.empty() || m->cache_hit_) && hit;
        m->cache_stored_ = m->cache_stored_ && (hit || stored);
      } else {
        ASPEN_ASSIGN_OR_RETURN(exe, compiler::compile(*g, copts));
      }
      exes.push_back(std::move(exe));
    }
    return Status();
  };
  ASPEN_RETURN_IF_ERROR(compile_all());
  if (m->job_) {
    // Every process must run the same programs with the same host decisions.
    uint64_t h = parallel::fnv1a("");
    for (const graph::Graph* g : all_graphs) h = fnv1a_mix(h, compiler::ExecutableCache::key(*g, copts));
    std::vector<std::pair<std::string, std::string>> fields = {{"programs", std::to_string(h)}};
    for (auto& f : step_fields(options, training)) fields.push_back(std::move(f));
    ASPEN_RETURN_IF_ERROR(parallel::check_same_fields(*m->job_, fields, "training model"));
  }
  if (!options.profile.empty()) m->trace_ = std::make_unique<profile::TraceRecorder>();
  m->recording_ = m->trace_ ? m->trace_.get() : options.trace;
  runtime::SessionOptions sopts;
  sopts.threads = options.threads;
  sopts.trace = m->recording_;
  // Devices: this process's part of the mesh, device d at mesh rank first_rank_ + d.
  sopts.replicas = m->placement_.process_devices();
  if (data_parallel) sopts.replica_local = {train::grad_accumulator_name("")};
  if (tp > 1) sopts.replica_local = {""};  // every shard its own weights, state and gradients
  if (stages > 1 && !m->spread() && (data_parallel || tp > 1)) {
    // A stage's devices hold only the replica-local parameters their stage uses.
    sopts.replica_uses = [uses = m->stage_uses_, mesh, first = m->first_rank_](int device, const std::string& name) {
      return uses[size_t(mesh.coord(first + device).pipe)].count(name) > 0;
    };
  }
  ASPEN_ASSIGN_OR_RETURN(m->session_, runtime::Session::create(std::move(exes), sopts));
  if (m->job_) {
    // NOTE [matmul choice] (kernels/matmul_choice.cc): every process runs process 0's kernels, so
    // that a layout's bits do not depend on which process measured what. The choices are complete
    // only now (each device prepares its kernels on its own team); a process whose own measurements
    // differed compiles again with process 0's (only where a machine measures afresh).
    // The communicator moves floats: the length as one (exact below 2^24), the text as bf16 pairs.
    std::string text = m->job_->rank() == 0 ? kernels::matmul_choices_text() : std::string();
    if (text.size() % 2) text += '\n';
    float bytes = float(std::min<size_t>(text.size(), size_t(1) << 24));
    ASPEN_RETURN_IF_ERROR(m->job_->broadcast(&bytes, 1, DType::f32, 0));
    text.resize(size_t(bytes));
    ASPEN_RETURN_IF_ERROR(m->job_->broadcast(text.data(), int64_t(bytes) / 2, DType::bf16, 0));
    ASPEN_ASSIGN_OR_RETURN(const bool replaced, kernels::adopt_matmul_choices(text, "process 0"));
    if (replaced && kernels::matmul_choice() == kernels::MatmulChoice::measured) {  // the rule ignores choices
      m->session_.reset();
      ASPEN_RETURN_IF_ERROR(compile_all());
      ASPEN_ASSIGN_OR_RETURN(m->session_, runtime::Session::create(std::move(exes), sopts));
    }
  }
  // Tensor shards: a "tensor" group per (replica, stage), each device's shard
  // state, and which parameters are whole on every shard.
  auto setup_shards = [&]() -> Status {
    parallel::CommOptions co = training.data_parallel.comm;
    co.name = "tensor";
    if (m->spread()) ASPEN_RETURN_IF_ERROR(m->session_->set_communicator(0, "tensor", m->tensor_comms_[0].get()));
    for (int d = 0; d < m->session_->replicas(); ++d)  // which shard each device is (the model's rule)
      ASPEN_RETURN_IF_ERROR(m->sharding_->prepare(*m->session_, d, m->coord_of(d).tensor));
    if (!m->spread()) m->tensor_comms_.resize(size_t(m->session_->replicas()));  // by device
    for (int d = 0; d < m->session_->replicas() && !m->spread(); ++d) {
      if (m->coord_of(d).tensor != 0) continue;  // each tensor group once, from its first shard
      const std::vector<int> members = m->local_group(parallel::Axis::tensor, d);
      ASPEN_ASSIGN_OR_RETURN(auto group, parallel::make_threads_group(int(members.size()), co));
      for (size_t t = 0; t < members.size(); ++t) {
        ASPEN_RETURN_IF_ERROR(m->session_->set_communicator(members[t], "tensor", group[t].get()));
        m->tensor_comms_[size_t(members[t])] = std::move(group[t]);
      }
    }
    for (const std::string& p : m->programs_.params)
      m->tp_replicated_.push_back(m->sharding_->whole(p));
    return Status();
  };
  if (tp > 1) ASPEN_RETURN_IF_ERROR(setup_shards());
  // Each parameter's owner: the stage whose step updates it (its gradient ends on that stage's first
  // replica), or the local replica whose optimizer shard does (ZeRO-1: shard p·L + l is local replica l's).
  m->owner_.assign(m->programs_.params.size(), 0);
  if (m->pipe_) {
    for (int st = 0; st < stages; ++st)
      for (size_t i : m->pipe_->stages[size_t(st)].owned) m->owner_[i] = st;
  } else {
    for (size_t k = 0; k < m->programs_.shards.size(); ++k)
      for (size_t i = m->programs_.shards[k].begin; i < m->programs_.shards[k].end; ++i)
        m->owner_[i] = int(k) % local;
  }
  if (m->pipe_ && m->spread())  // every message tag must fit MPI's (the largest: the last edge's, evaluation's)
    ASPEN_RETURN_IF_ERROR(parallel::job::check_tags(  // (tied parameters' messages follow the edges')
        *m->pipe_group_,
        int64_t(m->pipe_->split.edges.size() + (m->pipe_->shared.empty() ? 0 : m->programs_.params.size())),
        options.gradient_accumulation));
  ASPEN_ASSIGN_OR_RETURN(m->plan_, m->make_plan());
  if (m->job_) {  // the step each process will run: the same plan everywhere (a difference names its part)
    const train::PlanSpec& ps = m->plan_.spec;
    std::string params, edges;
    for (const train::PlanParam& p : ps.params)
      params += p.name + " " + std::to_string(p.elements) + " " + std::to_string(p.owner) + ";";
    for (const train::PlanEdge& e : ps.edges)
      edges += std::to_string(e.from) + ">" + std::to_string(e.to) + " " + std::to_string(e.bytes) + ";";
    ASPEN_RETURN_IF_ERROR(parallel::check_same_fields(
        *m->job_,
        {{"plan: mesh", ps.mesh.to_string()},
         {"plan: micro-batches", std::to_string(ps.micro_batches)},
         {"plan: parameters", params},
         {"plan: pipeline edges", edges},
         {"plan: instructions", train::plan_text(m->plan_)}},
        "training plan"));
  }
  return m;
}

std::vector<std::pair<std::string, std::string>> Runner::layout_fields(const RunnerOptions& o,
                                                                       const TrainingOptions& t) {
  return {{"options.replication_factor", std::to_string(o.replication_factor)},
          {"options.tensor_parallel", std::to_string(o.tensor_parallel)},
          {"training.pipeline.stages", std::to_string(t.pipeline.stages)},
          {"options.model_across_processes", std::to_string(int(o.model_across_processes))},
          {"options.gradient_accumulation", std::to_string(o.gradient_accumulation)},
          {"options.device_iterations", std::to_string(o.device_iterations)},
          {"training.data_parallel.shard_optimizer_state",
           std::to_string(int(t.data_parallel.shard_optimizer_state))},
          {"training.pipeline.balance", std::to_string(int(t.pipeline.balance))}};
}

std::vector<std::pair<std::string, std::string>> Runner::step_fields(const RunnerOptions& o,
                                                                     const TrainingOptions& t) {
  auto num = [](double v) {  // the shortest text that reads back as v
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  };
  const parallel::DataParallelOptions& dp = t.data_parallel;
  return {{"training.pipeline.schedule", train::pipeline_schedule_name(t.pipeline.schedule)},
          {"training.schedule.kind", std::to_string(int(t.schedule.kind))},
          {"training.schedule.lr", num(t.schedule.lr)},
          {"training.schedule.warmup_steps", std::to_string(t.schedule.warmup_steps)},
          {"training.schedule.total_steps", std::to_string(t.schedule.total_steps)},
          {"training.schedule.min_lr_ratio", num(t.schedule.min_lr_ratio)},
          {"training.clip_grad_norm", num(t.clip_grad_norm)},
          {"training.loss_scaling.mode", std::to_string(int(t.loss_scaling.mode))},
          {"training.loss_scaling.initial_scale", num(t.loss_scaling.initial_scale)},
          {"training.loss_scaling.growth_factor", num(t.loss_scaling.growth_factor)},
          {"training.loss_scaling.backoff_factor", num(t.loss_scaling.backoff_factor)},
          {"training.loss_scaling.growth_interval", std::to_string(t.loss_scaling.growth_interval)},
          {"training.loss_scaling.hysteresis", std::to_string(t.loss_scaling.hysteresis)},
          {"training.loss", t.loss},
          {"training.reduction", std::to_string(int(t.reduction))},
          {"training.data_parallel.bucket_bytes", std::to_string(dp.bucket_bytes)},
          {"training.data_parallel.compression", parallel::compression_name(dp.compression)},
          {"training.data_parallel.topk_ratio", num(dp.topk_ratio)},
          {"training.data_parallel.overlap", std::to_string(int(dp.overlap))},
          {"options.gradient_accumulation", std::to_string(o.gradient_accumulation)},
          {"options.device_iterations", std::to_string(o.device_iterations)},
          {"options.random_seed", std::to_string(o.random_seed)}};
}

std::string Runner::accumulator_name(int param, int stage) const {
  const std::string base = train::grad_accumulator_name(programs_.params[size_t(param)]);
  return pipe_ && stage != owner_[size_t(param)] ? base + "@" + std::to_string(stage) : base;
}

Status Runner::copy_weights_to_device(const std::map<std::string, const Tensor*>& weights) {
  for (const auto& [name, t] : weights) {
    if (!t) return Status::invalid_argument("weight '" + name + "'", "a tensor", "a null pointer");
    if (!is_weight(name))
      return Status::invalid_argument("weight '" + name + "'", "a model weight", "an optimizer or program state name");
    ASPEN_RETURN_IF_ERROR(set_full(name, *t));
  }
  return Status();
}

std::vector<int> Runner::local_group(parallel::Axis axis, int device) const {
  std::vector<int> out;
  for (int rank : mesh_->group(axis, mesh_rank(device)))
    if (rank >= first_rank_ && rank < first_rank_ + placement_.process_devices()) out.push_back(rank - first_rank_);
  return out;
}

Status Runner::set_full(const std::string& name, const Tensor& full) {
  const int T = tensor_shards();
  if (T == 1) {
    if (spread() && !session_->parameter_of(0, name) && all_types_.count(name)) return Status();  // another stage's
    return session_->set_parameter(name, full);
  }
  bool held = false;
  for (int d = 0; d < session_->replicas(); ++d) {  // device .. + t holds shard t (across processes: one device)
    const int r = coord_of(d).tensor;
    Tensor* dst = session_->parameter_of(d, name);
    if (!dst && pipe_) continue;  // a device of a stage that does not use it
    if (!dst) return not_a_parameter(name);
    held = true;
    ASPEN_ASSIGN_OR_RETURN(Tensor part, sharding_->cut(name, full, r, T));
    if (dst->dtype() != part.dtype() || dst->shape() != part.shape())
      return Status::invalid_argument("parameter '" + name + "' (shard " + std::to_string(r) + " of " +
                                          std::to_string(T) + ")",
                                      std::string(dtype_name(dst->dtype())) + dst->shape().to_string(),
                                      std::string(dtype_name(part.dtype())) + part.shape().to_string() +
                                          " (cut from " + full.shape().to_string() + ")");
    if (part.nbytes()) std::memcpy(dst->raw(), part.raw(), part.nbytes());
  }
  if (!held && !(spread() && all_types_.count(name)))  // (across processes: another stage's)
    return not_a_parameter(name);
  return Status();
}

Result<Tensor> Runner::get_full(const std::string& name) const {
  const int T = tensor_shards();
  if (T == 1) return session_->get_parameter(name);
  std::vector<const Tensor*> parts;
  std::vector<Tensor> gathered;  // across processes: every shard's part, all-gathered
  if (spread()) {
    const Tensor* mine = session_->parameter_of(0, name);
    if (!mine) return not_a_parameter(name);
    std::vector<char> all(mine->nbytes() * size_t(T));
    ASPEN_RETURN_IF_ERROR(tensor_comms_[0]->all_gather(mine->raw(), all.data(), mine->numel(), mine->dtype()));
    for (int r = 0; r < T; ++r) {
      Tensor part(mine->dtype(), mine->shape());
      if (part.nbytes()) std::memcpy(part.raw(), all.data() + size_t(r) * part.nbytes(), part.nbytes());
      gathered.push_back(std::move(part));
    }
    for (const Tensor& t : gathered) parts.push_back(&t);
  } else {
    // This process's first replica's shards of the stage that holds it.
    const int first = device_at({.data = coord_of(0).data, .pipe = pipe_ ? holding_stage(name) : 0, .tensor = 0});
    for (int d : local_group(parallel::Axis::tensor, first))
      parts.push_back(session_->parameter_of(d, name));
  }
  if (!parts[0]) return not_a_parameter(name);
  return sharding_->gather(name, parts);
}

std::pair<DType, Shape> Runner::full_type(const compiler::Binding& b) const {
  return full_type(b.name, {b.type.dtype, b.type.shape});
}

std::pair<DType, Shape> Runner::full_type(const std::string& name, const std::pair<DType, Shape>& shard) const {
  const int T = tensor_shards();
  Shape s = shard.second;
  if (T > 1) s = sharding_->whole_shape(name, s, T);
  return {shard.first, s};
}

namespace {

// A float tensor (f32, f16, bf16) in another of those dtypes, rounded to nearest even (through f32: widening
// is exact).
Result<Tensor> converted(const Tensor& t, DType to) {
  Tensor wide;
  const float* f32 = t.dtype() == DType::f32 ? t.data<float>() : nullptr;
  if (!f32) {
    wide = Tensor(DType::f32, t.shape());
    ASPEN_RETURN_IF_ERROR(kernels::widen_to_f32(t.dtype(), t.raw(), wide.data<float>(), t.numel()));
    if (to == DType::f32) return wide;
    f32 = wide.data<float>();
  }
  Tensor out(to, t.shape());
  ASPEN_RETURN_IF_ERROR(kernels::narrow_from_f32(to, f32, out.raw(), t.numel()));
  return out;
}

}  // namespace

Status Runner::copy_optimizer_state_to_device(const std::map<std::string, const Tensor*>& state) {
  const std::map<std::string, std::pair<DType, Shape>> types = optimizer_state_types();
  for (const auto& [name, t] : state) {
    if (!t) return Status::invalid_argument("optimizer state '" + name + "'", "a tensor", "a null pointer");
    if (!has_prefix(name, train::kOptimizerPrefix))
      return Status::invalid_argument("optimizer state '" + name + "'", "a name starting 'optimizer.'", "another name");
    // ZeRO-1: another process's shard is not kept here.
    if (zero_ && state_types_.count(name) && !session_->parameter_of(0, name)) continue;
    // State saved in another float type (a checkpoint of f32 state into f16 state, or the f32 a bf16 array
    // reaches Python in) is converted to the type this model keeps it in, rounded to nearest even.
    if (auto it = types.find(name); it != types.end() && it->second.first != t->dtype() &&
                                    is_float(it->second.first) && is_float(t->dtype())) {
      ASPEN_ASSIGN_OR_RETURN(const Tensor c, converted(*t, it->second.first));
      ASPEN_RETURN_IF_ERROR(set_full(name, c));
      continue;
    }
    ASPEN_RETURN_IF_ERROR(set_full(name, *t));
  }
  return Status();
}

Result<std::map<std::string, Tensor>> Runner::copy_weights_to_host() const {
  if (spread() && pipe_) return gather_spread_pipeline(/*weights=*/true);
  std::map<std::string, Tensor> out;
  for (const compiler::Binding& b : session_->parameters()) {
    if (!is_weight(b.name)) continue;
    ASPEN_ASSIGN_OR_RETURN(Tensor t, get_full(b.name));
    out.emplace(b.name, std::move(t));
  }
  return out;
}

Result<std::map<std::string, Tensor>> Runner::copy_optimizer_state_to_host() const {
  if (spread() && pipe_) return gather_spread_pipeline(/*weights=*/false);
  std::map<std::string, Tensor> out;
  for (const compiler::Binding& b : session_->parameters()) {
    if (!has_prefix(b.name, train::kOptimizerPrefix)) continue;
    ASPEN_ASSIGN_OR_RETURN(Tensor t, get_full(b.name));
    out.emplace(b.name, std::move(t));
  }
  if (!zero_) return out;
  // ZeRO-1: every shard's state from the process that keeps it (a collective:
  // every process calls this, in the same order).
  // State kept in half precision (OptimizerOptions::first_order_dtype) goes through f32 copies: widening is exact.
  const int L = session_->replicas();
  for (size_t k = 0; k < shard_state_.size(); ++k) {
    const int root = int(k) / L;
    std::vector<float*> ptrs;
    std::vector<int64_t> counts;
    std::map<std::string, Tensor> wide;
    for (const std::string& name : shard_state_[k]) {
      auto it = out.find(name);
      if (it == out.end()) {
        const auto& [dtype, shape] = state_types_.at(name);
        ASPEN_ASSIGN_OR_RETURN(Tensor t, Tensor::make(dtype, shape));
        it = out.emplace(name, std::move(t)).first;
      }
      Tensor* t = &it->second;
      if (t->dtype() != DType::f32) {
        ASPEN_ASSIGN_OR_RETURN(Tensor w, converted(*t, DType::f32));
        t = &wide.insert_or_assign(name, std::move(w)).first->second;
      }
      ptrs.push_back(t->data<float>());
      counts.push_back(t->numel());
    }
    ASPEN_RETURN_IF_ERROR(dp_->broadcast_from(int(k) % L, ptrs, counts, root));
    for (auto& [name, w] : wide) {
      ASPEN_ASSIGN_OR_RETURN(Tensor narrow, converted(w, out.at(name).dtype()));
      out.insert_or_assign(name, std::move(narrow));
    }
  }
  return out;
}

std::map<std::string, std::pair<DType, Shape>> Runner::full_types(bool weights) const {
  auto keep = [&](const std::string& name) { return weights ? is_weight(name) : has_prefix(name, train::kOptimizerPrefix); };
  std::map<std::string, std::pair<DType, Shape>> out;
  if (spread() && pipe_) {  // every stage's, also those other processes keep
    for (const auto& [name, type] : all_types_)
      if (keep(name)) out.emplace(name, full_type(name, type));
    return out;
  }
  for (const compiler::Binding& b : session_->parameters())
    if (keep(b.name)) out.emplace(b.name, full_type(b));
  return out;
}

std::map<std::string, std::pair<DType, Shape>> Runner::weight_types() const { return full_types(true); }

std::map<std::string, std::pair<DType, Shape>> Runner::optimizer_state_types() const {
  if (zero_) return state_types_;  // every shard's, also those kept by other processes
  return full_types(false);
}

Status Runner::read_slow_hook() {  // NOTE [slowed device]
  slow_device_ = -1, slow_fraction_ = 0;
  if (const char* slow = std::getenv("ASPEN_TEST_SLOW_DEVICE")) {
    int process = -1, device = -1;
    double fraction = 0;
    const bool ok = slow[0] == 'p' ? std::sscanf(slow, "p%d/%d:%lf", &process, &device, &fraction) == 3 && process >= 0
                                   : std::sscanf(slow, "%d:%lf", &device, &fraction) == 2;
    if (!ok || device < 0 || !(fraction > 0 && fraction < 100))
      return Status::invalid_argument("ASPEN_TEST_SLOW_DEVICE", "[p<process>/]<device>:<fraction in (0, 100)>",
                                      std::string("'") + slow + "'");
    if (process < 0 || process == (job_ ? job_->rank() : 0)) slow_device_ = device, slow_fraction_ = fraction;
  }
  return Status();
}

Result<std::vector<float>> Runner::run(const std::map<std::string, const Tensor*>& inputs) {
  ASPEN_RETURN_IF_ERROR(read_slow_hook());
  for (const auto& [name, t] : inputs) {
    if (std::find(input_names_.begin(), input_names_.end(), name) == input_names_.end())
      return Status::invalid_argument("training input '" + name + "'", "an input of the forward graph",
                                      "no input of that name");
    if (!t) return Status::invalid_argument("training input '" + name + "'", "a tensor", "a null pointer");
  }
  if (broken_)
    return Status::error(Code::kFailedPrecondition, "training model", "a model whose devices are working",
                         "a step failed earlier and aborted its groups (data, tensor or pipe)",
                         "create the model again (and reload a checkpoint)");
  last_.clear();
  last_outputs_.clear();
  output_pieces_.clear();
  Result<std::vector<float>> out = pipe_ || programs_.split() ? run_steps(inputs) : run_fused(inputs);
  if (out.is_ok()) ASPEN_RETURN_IF_ERROR(join_outputs());
  if (trace_) {  // Options::profile: a Chrome trace file, or a profile directory (profile::write_profile_path)
    ASPEN_RETURN_IF_ERROR(profile::write_profile_path(options_.profile, trace_->events(), [&] {
      profile::RunFacts run = runtime::run_facts("TrainingModel", options_.threads);
      runtime::add_session(run, *session_);
      return run;
    }));
  }
  return out;
}

Status Runner::check_eval_inputs(const compiler::Executable& exe, const std::map<std::string, const Tensor*>& inputs) {
  for (const compiler::Binding& b : exe.inputs) {
    if (b.name.starts_with("pipe.")) continue;  // a pipeline stage's edge, not the user's
    auto it = inputs.find(b.name);
    if (it == inputs.end() || !it->second || it->second->dtype() != b.type.dtype || it->second->shape() != b.type.shape)
      return Status::invalid_argument("evaluation input '" + b.name + "'", b.type.to_string(),
                                      it == inputs.end() || !it->second
                                          ? std::string("none given")
                                          : std::string(dtype_name(it->second->dtype())) +
                                                it->second->shape().to_string());
  }
  return Status();
}

Result<train::Plan> Runner::make_plan() const {
  train::PlanSpec spec;
  const int S = pipeline_stages(), T = tensor_shards();
  spec.processes = placement_.processes;
  spec.mesh = placement_.shape;
  spec.fused = !pipe_ && !programs_.split();
  spec.micro_batches = int(options_.gradient_accumulation);
  spec.schedule = training_.pipeline.schedule;
  const std::vector<std::string>& params = programs_.params;
  for (size_t i = 0; i < params.size(); ++i) {
    train::PlanParam p;
    p.name = params[i];
    p.elements = all_types_.count(params[i]) ? all_types_.at(params[i]).second.numel() : 0;
    p.owner = pipe_ ? owner_[i] : 0;
    for (int st = 0; st < S; ++st)
      if (!pipe_ || stage_uses_[size_t(st)].count(params[i])) p.stages.push_back(st);
    p.whole_on_shards = T == 1 || tp_replicated_[i];
    spec.params.push_back(std::move(p));
  }
  if (pipe_) {
    for (const train::PipelineEdge& e : pipe_->split.edges)
      spec.edges.push_back({.from = e.from, .to = e.to, .differentiable = e.differentiable, .bytes = e.type.bytes()});
    // Each stage's accumulators ("train.grad.<p>" or, a tied copy, "train.grad.<p>@<stage>"), in its compiled
    // program's order where this process compiled it (the order the exchange takes them), else its graph's.
    const std::string prefix = train::grad_accumulator_name("");
    for (int s = 0; s < S; ++s) {
      const train::PipelinePrograms::Stage& st = pipe_->stages[size_t(s)];
      std::vector<int> list;
      std::vector<std::string> names;
      if (!spread() || s == coord_of(0).pipe) {
        for (const compiler::Binding& b : session_->executable(st.backward_first).parameters) names.push_back(b.name);
      } else {
        const graph::Graph& g = pipe_->graphs[size_t(st.backward_first)];
        for (int32_t n : g.parameter_nodes()) names.push_back(g.node(n).name);
      }
      for (std::string name : names) {
        if (!name.starts_with(prefix)) continue;
        name = name.substr(prefix.size());
        if (const size_t at = name.rfind('@'); at != std::string::npos) name.resize(at);
        const auto it = std::find(params.begin(), params.end(), name);
        if (it != params.end()) list.push_back(int(it - params.begin()));
      }
      spec.accumulators.push_back(std::move(list));
    }
  } else if (!spec.fused) {
    for (const train::TrainingPrograms::Shard& sh : programs_.shards)
      spec.shards.push_back({.begin = int(sh.begin), .end = int(sh.end)});
  }
  spec.shard_optimizer_state = zero_;
  spec.overlap = dp_ && dp_->options().overlap;
  spec.compression = training_.data_parallel.compression;
  spec.bucket_bytes = training_.data_parallel.bucket_bytes;
  spec.needs_norm = needs_norm();
  return train::make_plan(spec);
}

Result<float> Runner::evaluate(const std::map<std::string, const Tensor*>& inputs) {
  if (pipe_ && (spread() || tensor_shards() > 1)) return evaluate_stages(inputs);
  if (tensor_shards() == 1) {
    ASPEN_ASSIGN_OR_RETURN(auto out, session_->run_replica(0, inputs, eval_program_));
    return out.at(training_.loss).data<float>()[0];
  }
  // Inputs checked once here: a failure inside would abort the shards' group for good.
  const compiler::Executable& exe = session_->executable(eval_program_);
  for (const auto& [name, t] : inputs)
    if (std::none_of(exe.inputs.begin(), exe.inputs.end(), [&](const compiler::Binding& b) { return b.name == name; }))
      return Status::error(Code::kNotFound, "input '" + name + "'", "an input of the evaluation program", "none");
  ASPEN_RETURN_IF_ERROR(check_eval_inputs(exe, inputs));
  float loss = 0.0f;  // every shard takes part in the program's all-reduces; they agree on the loss
  ASPEN_RETURN_IF_ERROR(session_->for_each_replica([&](int r) -> Status {
    Result<std::map<std::string, Tensor>> out = session_->run_replica(r, inputs, eval_program_);
    if (!out.is_ok()) {
      tensor_comms_[size_t(r)]->abort(out.status().message());
      broken_ = true;
      return out.status();
    }
    if (r == 0) loss = out->at(training_.loss).data<float>()[0];
    return Status();
  }));
  return loss;
}

}  // namespace aspen::train
