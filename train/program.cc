#include "train/program.h"

#include "graph/autodiff.h"
#include "graph/builder.h"

namespace aspen::train {

using graph::Builder;
using graph::Graph;
using graph::OpKind;
using graph::ValueId;

std::string grad_accumulator_name(const std::string& param) { return "train.grad." + param; }

bool is_state_name(std::string_view name) {
  return name.starts_with("state.") || name.starts_with(kOptimizerPrefix) || name.starts_with(kTrainPrefix);
}

namespace {
// `forward` with the loss and `keep` its only outputs.
Graph only_outputs(const Graph& forward, const std::string& loss, const std::vector<std::string>& keep) {
  Graph g = forward;
  for (const auto& [name, v] : forward.outputs())
    if (name != loss && std::find(keep.begin(), keep.end(), name) == keep.end()) g.remove_output(name);
  return g;
}
}  // namespace

Graph loss_only(const Graph& forward, const std::string& loss) { return only_outputs(forward, loss, {}); }

Result<Graph> loss_and(const Graph& forward, const std::string& loss, const std::vector<std::string>& outputs) {
  for (const std::string& o : outputs)
    if (o == loss || !forward.find_output(o))
      return Status::invalid_argument("training output '" + o + "'",
                                      "an output of the forward graph other than the loss '" + loss + "'",
                                      o == loss ? std::string("the loss") : std::string("no output of that name"));
  return only_outputs(forward, loss, outputs);
}

namespace {

// Not trained: state by name, and a parameter the forward graph updates itself (a batch norm's running
// statistics: NOTE [batch norm in training] in models/onnx_ops_nn.cc).
bool trainable(const Graph& forward, const graph::Node& n, const graph::TensorType& t) {
  return !is_state_name(n.name) && t.dtype == DType::f32 && !forward.find_update(n.name);
}

// The forward graph with only the loss as an output, its trained parameters
// and their gradients of loss (· train.loss_scale when asked).
struct Differentiated {
  Graph g;
  std::vector<ValueId> params, grads;
};

}  // namespace

Status round_gradients(Graph& g, std::span<ValueId> grads, DType dtype) {
  if (dtype == DType::f32) return Status();
  Builder b(g);
  for (ValueId& v : grads) v = round_to(b, v, dtype);
  return b.status();
}

namespace {

Result<Differentiated> differentiate(const Graph& forward, const ProgramOptions& o) {
  ASPEN_ASSIGN_OR_RETURN(Graph kept, loss_and(forward, o.loss, o.outputs));
  Differentiated d{std::move(kept), {}, {}};
  const std::optional<ValueId> loss = forward.find_output(o.loss);
  if (!loss)
    return Status::invalid_argument("training graph: output '" + o.loss + "'", "the scalar loss to minimise",
                                    "no output of that name");
  const graph::TensorType lt = forward.type(*loss);
  if (lt.dtype != DType::f32 || lt.shape.numel() != 1)
    return Status::invalid_argument("training graph: output '" + o.loss + "'", "f32 with one element",
                                    lt.to_string());
  for (int32_t i : forward.parameter_nodes()) {
    const graph::Node& n = forward.node(i);
    if (trainable(forward, n, forward.type(n.outputs[0]))) d.params.push_back(n.outputs[0]);
  }
  if (d.params.empty())
    return Status::invalid_argument("training graph", "at least one f32 parameter to train", "none");
  ValueId objective = *loss;
  if (o.loss_scale_input) {
    Builder b(d.g);
    objective = b.mul(objective, b.input(kLossScaleName, DType::f32, Shape{}));
    ASPEN_RETURN_IF_ERROR(b.status());
  }
  ASPEN_ASSIGN_OR_RETURN(d.grads, graph::append_gradients(d.g, objective, d.params));
  ASPEN_RETURN_IF_ERROR(round_gradients(d.g, d.grads, o.optimizer.gradient_dtype));
  return d;
}

std::vector<std::string> names_of(const Graph& g, const std::vector<ValueId>& params) {
  std::vector<std::string> out;
  for (ValueId p : params) out.push_back(g.producer(p).name);
  return out;
}

// Adds the accumulators and their updates: acc = g (first) or acc + g.
Status accumulate(Differentiated& d, bool first, const ProgramOptions& o) {
  Builder b(d.g);
  Tensor zero_index(DType::i32, Shape{});
  zero_index.data<int32_t>()[0] = 0;
  const ValueId zero = b.constant(std::move(zero_index));
  for (size_t i = 0; i < d.params.size(); ++i) {
    const std::string name = d.g.producer(d.params[i]).name;
    const graph::TensorType t = d.g.type(d.params[i]);
    const ValueId acc = b.parameter(grad_accumulator_name(name), t.dtype, t.shape);
    ValueId value;
    if (!first) {
      value = round_to(b, b.add(acc, d.grads[i]), o.optimizer.gradient_dtype);
    } else if (t.shape.rank() == 0) {  // write_slice needs an axis; a scalar is copied in
      value = d.grads[i];
    } else {
      value = b.op1(OpKind::write_slice, {acc, d.grads[i], zero}, {{"axis", int64_t(0)}});
    }
    b.update(acc, value);
  }
  return b.status();
}

// Contiguous groups [begin, end) of the parameters, `n` of them, cut where the
// running element count first reaches k/n of the total (each non-empty while
// there are parameters left for it).
std::vector<std::pair<size_t, size_t>> shard_ranges(const std::vector<graph::TensorType>& types, int n) {
  int64_t total = 0;
  for (const graph::TensorType& t : types) total += t.shape.numel();
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t running = 0;
  for (int k = 0; k < n; ++k) {
    size_t end = begin;
    const size_t keep = size_t(n - k - 1);  // parameters to leave for the shards after this one
    while (end < types.size()) {
      if (end > begin && (running * n >= total * (k + 1) || types.size() - end <= keep)) break;
      running += types[end].shape.numel();
      ++end;
    }
    if (k == n - 1) {
      for (; end < types.size(); ++end) running += types[end].shape.numel();
    }
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

}  // namespace

Result<TrainingPrograms> build_training_programs(const Graph& forward, const ProgramOptions& o) {
  if (o.gradient_accumulation < 1)
    return Status::invalid_argument("training: gradient_accumulation", ">= 1", std::to_string(o.gradient_accumulation));
  TrainingPrograms out;
  if (o.shards < 1) return Status::invalid_argument("training: shards", ">= 1", std::to_string(o.shards));
  const bool split = o.split || o.shards > 1 || o.gradient_accumulation > 1 || o.clip || o.dynamic_loss_scale;
  OptimizerOptions opt = o.optimizer;
  opt.grad_scale_input = true;
  if (!split) {
    ASPEN_ASSIGN_OR_RETURN(Differentiated d, differentiate(forward, o));
    Builder b(d.g);
    ASPEN_RETURN_IF_ERROR(append_optimizer(b, d.params, d.grads, opt).status());
    out.params = names_of(d.g, d.params);
    out.fused = 0;
    out.graphs.push_back(std::move(d.g));
    return out;
  }
  {
    ASPEN_ASSIGN_OR_RETURN(Differentiated d, differentiate(forward, o));
    ASPEN_RETURN_IF_ERROR(accumulate(d, /*first=*/true, o));
    out.params = names_of(d.g, d.params);
    out.micro_first = int(out.graphs.size());
    out.graphs.push_back(std::move(d.g));
  }
  if (o.gradient_accumulation > 1) {
    ASPEN_ASSIGN_OR_RETURN(Differentiated d, differentiate(forward, o));
    ASPEN_RETURN_IF_ERROR(accumulate(d, /*first=*/false, o));
    out.micro_next = int(out.graphs.size());
    out.graphs.push_back(std::move(d.g));
  }
  // The accumulators' types, from the forward graph.
  std::vector<graph::TensorType> types;
  for (const std::string& name : out.params) types.push_back(forward.type(*forward.find_parameter(name)));
  for (const auto& [begin, end] : shard_ranges(types, o.shards)) {
    TrainingPrograms::Shard shard{begin, end, -1, -1};
    if (begin == end) {
      out.shards.push_back(shard);
      continue;
    }
    {
      Graph g;
      Builder b(g);
      std::vector<ValueId> sums;
      for (size_t i = begin; i < end; ++i) {
        const ValueId acc = b.parameter(grad_accumulator_name(out.params[i]), types[i].dtype, types[i].shape);
        sums.push_back(b.reshape(b.op1(OpKind::sum_squares, {acc}), {1}));
      }
      b.output(kGradSqNormName, sums.size() == 1 ? sums[0] : b.concat(sums, 0));
      ASPEN_RETURN_IF_ERROR(b.status());
      shard.norm = int(out.graphs.size());
      out.graphs.push_back(std::move(g));
    }
    {
      Graph g;
      Builder b(g);
      std::vector<ValueId> params, grads;
      for (size_t i = begin; i < end; ++i) {
        params.push_back(b.parameter(out.params[i], types[i].dtype, types[i].shape));
        grads.push_back(b.parameter(grad_accumulator_name(out.params[i]), types[i].dtype, types[i].shape));
      }
      OptimizerOptions sharded = opt;
      sharded.update_step = o.shards == 1;
      ASPEN_RETURN_IF_ERROR(append_optimizer(b, params, grads, sharded).status());
      shard.step = int(out.graphs.size());
      out.graphs.push_back(std::move(g));
    }
    out.shards.push_back(shard);
  }
  out.norm = out.shards.front().norm;
  out.step = out.shards.front().step;
  return out;
}

}  // namespace aspen::train
