// api/training_model.h: the facade over train/runner.h. What is the API's
// own: validating the user's Options, binding them to the runner's, the
// model family's tensor-sharding rule (models/tensor_parallel.h), and the
// losses by output mode.
#include "api/training_model.h"

#include <algorithm>
#include <chrono>

#include "models/tensor_parallel.h"
#include "train/runner.h"

namespace aspen::api {

namespace {

// GPT-2's and Llama's Megatron cut (models/tensor_parallel.h).
class ModelSharding final : public train::TensorSharding {
 public:
  explicit ModelSharding(bool vocab_parallel) : vocab_(vocab_parallel) {}
  bool whole(const std::string& name) const override {
    return models::shard_kind(name, vocab_) == models::ShardKind::replicated;
  }
  Result<Tensor> cut(const std::string& name, const Tensor& full, int shard, int shards) const override {
    return models::shard_weight(name, full, shard, shards, vocab_);
  }
  Result<Tensor> gather(const std::string& name, std::span<const Tensor* const> parts) const override {
    return models::gather_weight(name, parts, vocab_);
  }
  Shape whole_shape(const std::string& name, const Shape& part, int shards) const override {
    std::vector<int64_t> d(part.begin(), part.end());
    switch (models::shard_kind(name, vocab_)) {
      case models::ShardKind::rows: d[0] *= shards; break;
      case models::ShardKind::columns:
      case models::ShardKind::qkv_columns: d.back() *= shards; break;
      case models::ShardKind::replicated: break;
    }
    return Shape::make(d.data(), int(d.size())).value();
  }
  Status prepare(runtime::Session& session, int device, int shard) const override {
    if (Tensor* off = session.parameter_of(device, models::kVocabOffsetName); off && vocab_) {
      // The shard's rows of the vocabulary: the embedding table's, or (a last stage) the untied lm_head's.
      const Tensor* rows = nullptr;
      for (const char* table : models::kVocabTableNames)
        if (!rows) rows = session.parameter_of(device, table);
      if (!rows) rows = session.parameter_of(device, "lm_head.weight");
      if (!rows)
        return Status::error(Code::kInvalidArgument, "training: vocab-parallel shard graph",
                             "an embedding table or lm_head.weight beside the vocabulary offset", "neither");
      off->data<int32_t>()[0] = int32_t(shard * rows->shape()[0]);
    }
    // Attention dropout: each shard's heads (models/blocks.h).
    if (Tensor* index = session.parameter_of(device, models::kTensorShardIndexName)) index->data<int32_t>()[0] = shard;
    return Status();
  }

 private:
  bool vocab_;
};

// Options bound to the runner's (the one place they are copied).
train::RunnerOptions runner_options(const Options& o) {
  train::RunnerOptions r;
  r.device_iterations = o.device_iterations_;
  r.gradient_accumulation = o.gradient_accumulation_;
  r.replication_factor = o.replication_factor_;
  r.mpi = o.mpi_;
  r.tensor_parallel = o.tensor_parallel_;
  r.model_across_processes = o.model_across_processes_;
  r.random_seed = o.random_seed_;
  r.profile = o.profile_;
  r.trace = o.trace_recorder_;
  r.executable_cache = o.executable_cache_;
  r.compile.opt_level = o.opt_level_;
  r.compile.compute = o.precision_;
  r.compile.partials = o.partials_type_;
  r.compile.stochastic_rounding = o.stochastic_rounding_;
  r.compile.recompute = o.recompute_;
  r.threads = o.threads_;
  return r;
}

Result<std::map<std::string, Tensor>> losses_by_mode(const Options& options, const std::vector<float>& losses) {
  std::map<std::string, Tensor> out;
  const int64_t n = int64_t(losses.size());
  switch (options.output_mode_) {
    case OutputMode::all: {
      Tensor t(DType::f32, Shape{n});
      std::copy(losses.begin(), losses.end(), t.data<float>());
      out.emplace("loss", std::move(t));
      break;
    }
    case OutputMode::every_n: {
      const int64_t every = options.output_every_n_;
      Tensor t(DType::f32, Shape{n / every});
      for (int64_t i = 0; i < n / every; ++i) t.data<float>()[i] = losses[size_t((i + 1) * every - 1)];
      out.emplace("loss", std::move(t));
      break;
    }
    case OutputMode::final:
    case OutputMode::sum: {
      float s = 0.0f;
      for (float x : losses) s += x;
      Tensor t(DType::f32, Shape{});
      t.data<float>()[0] = options.output_mode_ == OutputMode::final ? losses.back() : s;
      out.emplace("loss", std::move(t));
      break;
    }
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<TrainingModel>> TrainingModel::create(const graph::Graph& forward, const Options& options,
                                                             const TrainingOptions& training) {
  ASPEN_RETURN_IF_ERROR(options.validate(/*training=*/true));
  std::unique_ptr<TrainingModel> m(new TrainingModel());
  m->options_ = options;
  if (options.tensor_parallel_ > 1) {
    m->vocab_parallel_ = models::is_vocab_parallel(forward);
    m->sharding_ = std::make_unique<ModelSharding>(m->vocab_parallel_);
  }
  const bool dynamic = training.pipeline.balance == TrainingOptions::Balance::dynamic && training.pipeline.stages > 1;
  if (dynamic) {  // refused before anything is compiled or measured
    const char* what = "training: parallel.balance: dynamic (stages rebalanced while training)";
    if (options.mpi_ || options.model_across_processes_)
      return Status::error(Code::kUnimplemented, what, "pipeline stages in one process",
                           "an MPI job (its processes would have to move their stages' state between them: not in "
                           "this build; use balance: measured)");
    if (std::any_of(forward.nodes().begin(), forward.nodes().end(), [](const graph::Node& n) { return n.stage >= 0; }))
      return Status::invalid_argument(what, "a model without stage tags", "stage tags (they decide the cut)");
  }
  ASPEN_ASSIGN_OR_RETURN(m->runner_,
                         train::Runner::create(forward, runner_options(options), training, m->sharding_.get()));
  if (dynamic) {
    ASPEN_ASSIGN_OR_RETURN(train::StageBalancer b,
                           train::StageBalancer::create(forward, training.loss, m->runner_->pipeline_stage_of(),
                                                        m->runner_->pipeline_node_costs(),
                                                        int(options.gradient_accumulation_),
                                                        training.pipeline.rebalance));
    m->balancer_ = std::make_unique<train::StageBalancer>(std::move(b));
  }
  return m;
}

// NOTE [moving stages] (train/pipeline.cc): the new cut keeps the first one's grouping, so the runner made for it
// computes what the old one would have: only where each layer runs changes.
Status TrainingModel::move_stages(const std::vector<int>& stage_of) {
  const auto t0 = std::chrono::steady_clock::now();
  ASPEN_ASSIGN_OR_RETURN(auto weights, runner_->copy_weights_to_host());
  ASPEN_ASSIGN_OR_RETURN(auto state, runner_->copy_optimizer_state_to_host());
  const TrainingOptions training = runner_->training_options();
  const int64_t steps = runner_->steps_done();
  const train::LossScaler scaler = runner_->loss_scaler();
  // A runner for `cut` holding the state: the old runner goes first (its devices hold the cores the new one's
  // take); when the new cut cannot be made, the old one is made again, so nothing is lost.
  auto make = [&](const std::vector<int>& cut) -> Result<std::unique_ptr<train::Runner>> {
    graph::Graph tagged = balancer_->forward();
    for (size_t i = 0; i < cut.size(); ++i)
      if (cut[i] >= 0) tagged.mutable_node(int32_t(i)).stage = cut[i];
    ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<train::Runner> r,
                           train::Runner::create(tagged, runner_options(options_), training, sharding_.get()));
    std::map<std::string, const Tensor*> w, st;
    for (const auto& [name, t] : weights) w.emplace(name, &t);
    for (const auto& [name, t] : state) st.emplace(name, &t);
    ASPEN_RETURN_IF_ERROR(r->copy_weights_to_device(w));
    ASPEN_RETURN_IF_ERROR(r->copy_optimizer_state_to_device(st));
    r->set_steps_done(steps);
    r->loss_scaler() = scaler;
    if (r->pipeline_stage_of() != cut)
      return Status::error(Code::kInternal, "training: moving pipeline stages", "the cut the balancer chose",
                           "another cut from the stage tags");
    return r;
  };
  runner_.reset();
  Result<std::unique_ptr<train::Runner>> next = make(stage_of);
  if (!next.is_ok()) {
    Result<std::unique_ptr<train::Runner>> back = make(balancer_->stage_of());
    if (!back.is_ok()) {  // the state stays readable on the host (copy_*_to_host), the model must be made again
      stranded_ = std::make_unique<Stranded>(Stranded{std::move(weights), std::move(state), steps});
      return Status(next.status()).with_context(
          "moving pipeline stages; the old cut could not be made again either (" + back.status().to_string() +
          "): the weights and optimizer state of step " + std::to_string(steps) +
          " can still be copied to the host, then the model must be made again");
    }
    // Training goes on at the old cut; the balancer does not propose this one again.
    runner_ = std::move(back).value();
    balancer_->abandoned();
    move_failures_.push_back(next.status().to_string());
    return Status();
  }
  runner_ = std::move(next).value();
  balancer_->moved(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status();
}

Status TrainingModel::stranded_error() const {
  return Status::error(Code::kFailedPrecondition, "training model", "a model on its devices",
                       "one whose move between pipeline cuts failed (its weights and optimizer state can be copied to "
                       "the host; make the model again)");
}

std::map<std::string, Tensor> TrainingModel::copy_of(const std::map<std::string, Tensor>& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : m) out.emplace(name, t.clone());
  return out;
}

const std::vector<train::StageMove>& TrainingModel::stage_moves() const {
  static const std::vector<train::StageMove> none;
  return balancer_ ? balancer_->moves() : none;
}
int TrainingModel::stage_move_just_measured() const { return just_measured_; }

TrainingModel::~TrainingModel() = default;

Result<std::map<std::string, Tensor>> TrainingModel::run(const std::map<std::string, const Tensor*>& inputs) {
  if (next_cut_) {
    const std::vector<int> cut = std::move(*next_cut_);
    next_cut_.reset();
    ASPEN_RETURN_IF_ERROR(move_stages(cut));
  }
  if (!runner_) return stranded_error();
  ASPEN_ASSIGN_OR_RETURN(const std::vector<float> losses, runner_->run(inputs));
  just_measured_ = -1;
  if (balancer_)
    for (const StepStats& s : runner_->last_steps()) {
      ASPEN_ASSIGN_OR_RETURN(std::optional<std::vector<int>> cut, balancer_->observe(s.step, s.stage_busy_s, s.wall_s));
      if (cut) next_cut_ = std::move(cut);
      if (balancer_->just_measured() >= 0) just_measured_ = balancer_->just_measured();
    }
  ASPEN_ASSIGN_OR_RETURN(auto out, losses_by_mode(options_, losses));
  for (auto& [name, t] : runner_->take_last_outputs()) out[name] = std::move(t);
  return out;
}

const TrainingOptions& TrainingModel::training_options() const { return runner_->training_options(); }
const train::TrainingPrograms& TrainingModel::programs() const { return runner_->programs(); }
const runtime::Session& TrainingModel::session() const { return runner_->session(); }
const std::vector<std::string>& TrainingModel::program_names() const { return runner_->program_names(); }
parallel::Communicator* TrainingModel::job() const { return runner_->job(); }
bool TrainingModel::cache_hit() const { return runner_->cache_hit(); }
bool TrainingModel::cache_stored() const { return runner_->cache_stored(); }
int TrainingModel::replicas() const { return runner_->replicas(); }
int TrainingModel::process() const { return runner_->process(); }
int TrainingModel::processes() const { return runner_->processes(); }
bool TrainingModel::optimizer_state_sharded() const { return runner_->optimizer_state_sharded(); }
bool TrainingModel::model_across_processes() const { return runner_->model_across_processes(); }
Status TrainingModel::copy_weights_to_device(const std::map<std::string, const Tensor*>& weights) {
  return runner_->copy_weights_to_device(weights);
}
Result<std::map<std::string, Tensor>> TrainingModel::copy_gradients_to_host() const {
  return runner_->copy_gradients_to_host();
}
Result<std::map<std::string, Tensor>> TrainingModel::copy_weights_to_host() const {
  if (!runner_ && stranded_) return copy_of(stranded_->weights);
  if (!runner_) return stranded_error();
  return runner_->copy_weights_to_host();
}
Status TrainingModel::copy_optimizer_state_to_device(const std::map<std::string, const Tensor*>& state) {
  return runner_->copy_optimizer_state_to_device(state);
}
Result<std::map<std::string, Tensor>> TrainingModel::copy_optimizer_state_to_host() const {
  if (!runner_ && stranded_) return copy_of(stranded_->state);
  if (!runner_) return stranded_error();
  return runner_->copy_optimizer_state_to_host();
}
std::map<std::string, std::pair<DType, Shape>> TrainingModel::weight_types() const { return runner_->weight_types(); }
std::map<std::string, std::pair<DType, Shape>> TrainingModel::optimizer_state_types() const {
  return runner_->optimizer_state_types();
}
void TrainingModel::set_learning_rate(double lr) { runner_->set_learning_rate(lr); }
const std::vector<StepStats>& TrainingModel::last_steps() const { return runner_->last_steps(); }
const PipelineStats& TrainingModel::last_pipeline_stats() const { return runner_->last_pipeline_stats(); }
int TrainingModel::pipeline_stages() const { return runner_->pipeline_stages(); }
std::vector<int> TrainingModel::pipeline_stage_of() const { return runner_->pipeline_stage_of(); }
Result<float> TrainingModel::evaluate(const std::map<std::string, const Tensor*>& inputs) {
  return runner_->evaluate(inputs);
}
int64_t TrainingModel::steps_done() const { return runner_ ? runner_->steps_done() : stranded_ ? stranded_->steps : 0; }
void TrainingModel::set_steps_done(int64_t n) { runner_->set_steps_done(n); }
const train::LossScaler& TrainingModel::loss_scaler() const { return runner_->loss_scaler(); }
train::LossScaler& TrainingModel::loss_scaler() { return runner_->loss_scaler(); }
std::string TrainingModel::profile_summary() const { return runner_->profile_summary(); }
const train::Plan& TrainingModel::plan() const { return runner_->plan(); }

}  // namespace aspen::api
