#include "api/trainer_feed.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/philox.h"
#include "io/onnx.h"
#include "models/bert.h"

namespace aspen::api {

namespace {

bool is_integer(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::u8 || t == DType::boolean; }

// Element i of a float or integer tensor, as a double (floats widen exactly).
double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32:
      return t.data<float>()[i];
    case DType::f16:
      return f16_to_f32(t.data<f16>()[i]);
    case DType::bf16:
      return bf16_to_f32(t.data<bf16>()[i]);
    case DType::i32:
      return t.data<int32_t>()[i];
    case DType::i64:
      return double(t.data<int64_t>()[i]);
    case DType::u8:
      return t.data<uint8_t>()[i];
    case DType::boolean:  // a bool column feeding a float input: 0 and 1
      return t.data<bool>()[i] ? 1.0 : 0.0;
  }
  ASPEN_CHECK(false) << "dtype " << dtype_name(t.dtype());
  return 0;
}

// Element i of an integer tensor, exactly.
int64_t integer(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::i32:
      return t.data<int32_t>()[i];
    case DType::i64:
      return t.data<int64_t>()[i];
    case DType::u8:
      return t.data<uint8_t>()[i];
    case DType::boolean:
      return t.data<bool>()[i] ? 1 : 0;
    default:
      ASPEN_CHECK(false) << "dtype " << dtype_name(t.dtype());
      return 0;
  }
}

// The values an integer dtype holds.
std::pair<int64_t, int64_t> range_of(DType t) {
  switch (t) {
    case DType::i32:
      return {INT32_MIN, INT32_MAX};
    case DType::u8:
      return {0, 255};
    case DType::boolean:
      return {0, 1};
    default:
      return {INT64_MIN, INT64_MAX};
  }
}

// The first element of an integer tensor that `to` cannot hold, or -1.
int64_t first_out_of_range(const Tensor& t, DType to) {
  const auto [lo, hi] = range_of(to);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (const int64_t x = integer(t, i); x < lo || x > hi) return i;
  return -1;
}

// Copies `src`'s elements into `dst` (as many of type `to`), converting; bind() refused floats for an
// integer input. `what` names the column in errors.
Status convert_into(const Tensor& src, DType to, void* dst, const std::string& what) {
  if (src.dtype() == to) {
    std::memcpy(dst, src.raw(), src.nbytes());
    return Status::ok();
  }
  if (is_integer(to)) {
    ASPEN_CHECK(is_integer(src.dtype())) << what;
    if (const int64_t i = first_out_of_range(src, to); i >= 0)
      return Status::invalid_argument(what + " element " + std::to_string(i),
                                      "a value an input of type " + std::string(dtype_name(to)) + " holds",
                                      std::to_string(integer(src, i)));
    for (int64_t i = 0; i < src.numel(); ++i) {
      const int64_t x = integer(src, i);
      switch (to) {
        case DType::i64:
          static_cast<int64_t*>(dst)[i] = x;
          break;
        case DType::i32:
          static_cast<int32_t*>(dst)[i] = int32_t(x);
          break;
        default:
          static_cast<uint8_t*>(dst)[i] = uint8_t(x);
          break;
      }
    }
    return Status::ok();
  }
  for (int64_t i = 0; i < src.numel(); ++i) {
    const float v = float(element(src, i));
    switch (to) {
      case DType::f16:
        static_cast<f16*>(dst)[i] = f32_to_f16(v);
        break;
      case DType::bf16:
        static_cast<bf16*>(dst)[i] = f32_to_bf16(v);
        break;
      default:
        static_cast<float*>(dst)[i] = v;
        break;
    }
  }
  return Status::ok();
}

}  // namespace

Result<TrainFeed> TrainFeed::open(const std::string& path, const train::DataLoaderOptions& options,
                                  const std::vector<int64_t>& replicas, bool arrays_allowed) {
  TrainFeed f;
  f.path_ = path;
  f.replicas_ = replicas;
  f.micro_batch_ = options.micro_batch;
  f.seq_ = options.seq;
  std::error_code ec;
  train::DataLoaderOptions o = options;
  train::DataLoaderOptions v = options;
  v.replicas = 1;  // validation: the whole split on one replica (the same loss for every layout)
  v.replica = 0;
  v.accumulation = 1;
  if (!arrays_allowed || std::filesystem::exists(std::filesystem::path(path) / "index.json", ec)) {
    for (int64_t r : replicas) {
      o.replica = r;
      ASPEN_ASSIGN_OR_RETURN(train::DataLoader loader, train::DataLoader::open(path, o));
      f.token_loaders_.push_back(std::make_unique<train::DataLoader>(std::move(loader)));
    }
    ASPEN_ASSIGN_OR_RETURN(train::DataLoader val, train::DataLoader::open(path, v));
    f.token_val_ = std::make_unique<train::DataLoader>(std::move(val));
  } else {
    ASPEN_ASSIGN_OR_RETURN(f.arrays_, train::ArrayDataset::open(path));
    for (int64_t r : replicas) {
      o.replica = r;
      ASPEN_ASSIGN_OR_RETURN(train::ArrayLoader loader, train::ArrayLoader::open(f.arrays_, o));
      f.array_loaders_.push_back(std::make_unique<train::ArrayLoader>(std::move(loader)));
    }
    ASPEN_ASSIGN_OR_RETURN(train::ArrayLoader val, train::ArrayLoader::open(f.arrays_, v));
    f.array_val_ = std::make_unique<train::ArrayLoader>(std::move(val));
  }
  return f;
}

const train::TokenIndex& TrainFeed::token_index() const {
  ASPEN_CHECK(tokens());
  return token_val_->dataset().index();
}

const train::ArrayDataset& TrainFeed::arrays() const {
  ASPEN_CHECK(arrays_);
  return *arrays_;
}

std::map<std::string, graph::TensorType> TrainFeed::columns() const {
  std::map<std::string, graph::TensorType> out;
  if (tokens()) {
    for (const char* c : {"tokens", "targets", "positions", "mask"})
      out[c] = graph::TensorType{DType::i32, Shape{micro_batch_, seq_}};
    if (packing_) out["segments"] = graph::TensorType{DType::i32, Shape{micro_batch_, seq_}};
    if (mlm_) out["token_types"] = graph::TensorType{DType::i32, Shape{micro_batch_, seq_}};
    if (mlm_ && mlm_->predictions > 0)
      out["targets"] = out["mlm_positions"] = graph::TensorType{DType::i32, Shape{micro_batch_, mlm_->predictions}};
    if (dropout_) out["dropout_seed"] = graph::TensorType{DType::i64, Shape{1}};
    return out;
  }
  for (const auto& [name, t] : arrays_->columns()) {
    std::vector<int64_t> d(t.shape().begin(), t.shape().end());
    d[0] = micro_batch_;
    out[name] = graph::TensorType{t.dtype(), *Shape::make(d.data(), int(d.size()))};
  }
  if (dropout_) out["dropout_seed"] = graph::TensorType{DType::i64, Shape{1}};
  return out;
}

std::string TrainFeed::column_names() const {
  std::string out;
  for (const auto& [name, type] : columns()) out += (out.empty() ? "" : ", ") + name + " " + type.to_string();
  return out;
}

Status TrainFeed::check_column(const std::string& input, const std::string& column, bool mapped,
                               const std::string& origin) const {
  if (columns().count(column)) return Status::ok();
  return Status::invalid_argument(origin + ": input '" + input + "'",
                                  "a data column named '" + column + "' (" + path_ + " has " + column_names() + ")",
                                  "none",
                                  mapped ? "" : "name the column that feeds it: model.inputs: {" + input + ": COLUMN}");
}

Status TrainFeed::bind(const graph::Graph& forward, const std::map<std::string, std::string>& mapping,
                       const std::string& default_origin, const std::map<std::string, std::string>& origins) {
  const std::map<std::string, graph::TensorType> cols = columns();
  for (const auto& [input, column] : mapping)
    if (!forward.find_input(input))
      return Status::invalid_argument(default_origin + ": '" + input + "'", "an input of the model",
                                      "no input of that name");
  bindings_.clear();
  for (int32_t n : forward.input_nodes()) {
    const graph::Node& node = forward.nodes()[size_t(n)];
    const std::string& input = node.name;
    auto o = origins.find(input);
    const std::string& origin = o != origins.end() ? o->second : default_origin;
    const graph::TensorType& type = forward.type(node.outputs.at(0));
    auto m = mapping.find(input);
    const std::string column = m != mapping.end() ? m->second : input;
    ASPEN_RETURN_IF_ERROR(check_column(input, column, m != mapping.end(), origin));
    auto c = cols.find(column);
    if (c->second.shape.numel() != type.shape.numel())
      return Status::invalid_argument(origin + ": input '" + input + "' from column '" + column + "'",
                                      type.to_string() + " per micro-batch of " + std::to_string(micro_batch_),
                                      c->second.to_string());
    if (is_float(c->second.dtype) && is_integer(type.dtype))
      return Status::invalid_argument(origin + ": input '" + input + "' from column '" + column + "'",
                                      "integers (the input is " + type.to_string() + ")", c->second.to_string());
    if (arrays_ && arrays_->columns().count(column) && is_integer(c->second.dtype) &&
        is_integer(type.dtype)) {  // every value fits, or say which (the dropout seed is the feed's own)
      const Tensor& all = arrays_->columns().at(column);
      if (const int64_t i = first_out_of_range(all, type.dtype); i >= 0)
        return Status::invalid_argument(origin + ": input '" + input + "' from column '" + column + "'",
                                        "values an input of type " + std::string(dtype_name(type.dtype)) + " holds",
                                        std::to_string(integer(all, i)) + " at element " + std::to_string(i));
    }
    bindings_.push_back({input, column, type});
  }
  call_.clear();
  call_slots_ = 0;
  return Status::ok();
}

// lm_loss's cross_entropy ignores targets of this id (kernels::kIgnoreIndex).
constexpr int32_t kIgnoreTarget = -100;

void TrainFeed::set_packing(int32_t eos) {
  packing_ = true;
  eos_ = eos;
}

void TrainFeed::set_masked_lm(MaskedLm m) {
  std::sort(m.special.begin(), m.special.end());
  mlm_ = std::move(m);
}

void TrainFeed::set_dropout_seed(uint64_t seed) {
  dropout_ = true;
  dropout_seed_ = seed;
}

namespace {
// A micro-batch's dropout seed column: `value` as i64 [1].
Tensor seed_column(int64_t value) {
  Tensor t(DType::i64, Shape{1});
  t.data<int64_t>()[0] = value;
  return t;
}

// A micro-batch's Philox hash (53 bits, so that it also fits a double): replica and (epoch, micro-batch of the
// epoch) under `seed` and `salt` (each use of the position its own).
uint64_t batch_hash(uint64_t seed, uint64_t salt, uint64_t replica, const train::Position& p) {
  const PhiloxBlock h = philox_block(seed ^ salt, replica, (uint64_t(p.epoch) << 40) ^ uint64_t(p.step_in_epoch));
  return ((uint64_t(h[1]) << 32) | h[0]) & ((uint64_t(1) << 53) - 1);
}
constexpr uint64_t kMlmSalt = 0x6d6c6d5f6d61736bULL;  // "mlm_mask": the masking's draws apart from dropout's
constexpr uint64_t kValidationReplica = ~uint64_t(0);  // validation batches' "replica" in batch_hash
}  // namespace

// NOTE [masked lm]: the masking of element e (row-major over the batch's [B, T]) is Philox block e under the
// batch's key, a hash of train.seed, the global replica and the position the batch was drawn at (validation:
// batch i at a replica no training batch has). Word 0 selects (below probability · 2^32), word 1 picks
// [MASK] / random / kept (80 / 10 / 10 %), word 2 the random id (multiply-shift into [0, vocab), as HF's
// randint draws over the whole vocabulary). Special tokens are never selected (HF's special_tokens_mask).
// So the masks depend on nothing but the seed and the data: not on threads, replicas' speed or a resume.
train::Columns TrainFeed::token_columns(train::Batch b, PackingStats* stats, uint64_t mlm_key,
                                        MaskedStats* masked) const {
  train::Columns c;
  if (mlm_) {  // NOTE [masked lm]: element e of the batch draws Philox block e under the batch's key
    int32_t* tok = b.inputs.data<int32_t>();
    int32_t* tgt = b.targets.data<int32_t>();
    const int64_t n = b.inputs.numel();
    const uint32_t select = uint32_t(std::min(mlm_->probability * 4294967296.0, 4294967295.0));
    int64_t predicted = 0;
    for (int64_t e = 0; e < n; ++e) {
      const int32_t id = tok[e];
      tgt[e] = kIgnoreTarget;
      if (std::binary_search(mlm_->special.begin(), mlm_->special.end(), id)) continue;
      const PhiloxBlock r = philox_block(mlm_key, 0, uint64_t(e));
      if (r[0] >= select) continue;
      tgt[e] = id;
      ++predicted;
      const float how = bits_to_unit_float(r[1]);
      if (how < 0.8f) {
        tok[e] = mlm_->mask_id;
      } else if (how < 0.9f) {
        tok[e] = int32_t((uint64_t(r[2]) * uint64_t(mlm_->vocab)) >> 32);
      }
    }
    if (masked) masked->predicted += predicted;
    c.emplace("token_types", Tensor(DType::i32, b.inputs.shape()));  // zeros: segment A
    if (const int64_t K = mlm_->predictions; K > 0) {  // the predicted rows only, in order, then padding
      const int64_t B = b.inputs.shape()[0], T = b.inputs.shape()[1];
      Tensor pos(DType::i32, Shape{B, K}), kept(DType::i32, Shape{B, K});
      const int64_t dropped = models::gather_mlm_predictions(tgt, B, T, K, pos.data<int32_t>(), kept.data<int32_t>());
      if (masked) masked->dropped += dropped;
      b.targets = std::move(kept);
      c.emplace("mlm_positions", std::move(pos));
    }
  }
  Tensor pos(DType::i32, b.inputs.shape()), mask(DType::i32, b.inputs.shape());
  const int64_t B = b.inputs.shape()[0], T = b.inputs.shape()[1];
  for (int64_t r = 0; r < B; ++r)
    for (int64_t k = 0; k < T; ++k) pos.data<int32_t>()[r * T + k] = int32_t(k), mask.data<int32_t>()[r * T + k] = 1;
  if (packing_) {  // documents end at eos: positions restart after it, the prediction across it is not trained
    Tensor seg(DType::i32, b.inputs.shape());
    const int32_t* tok = b.inputs.data<int32_t>();
    int32_t* p = pos.data<int32_t>();
    int32_t* s = seg.data<int32_t>();
    int32_t* tgt = b.targets.data<int32_t>();
    for (int64_t r = 0; r < B; ++r) {
      int32_t doc = 0, start = 0;
      for (int64_t k = 0; k < T; ++k) {
        p[r * T + k] = int32_t(k) - start;
        s[r * T + k] = doc;
        if (tok[r * T + k] == eos_) {
          tgt[r * T + k] = int32_t(kIgnoreTarget);
          if (stats) stats->kept_pairs += double(k + 1 - start) * double(k + 2 - start) / 2;
          start = int32_t(k + 1);
          ++doc;
        }
      }
      if (stats) {
        if (start < T) stats->kept_pairs += double(T - start) * double(T - start + 1) / 2;
        stats->documents += doc + (start < T ? 1 : 0);
        stats->causal_pairs += double(T) * double(T + 1) / 2;
        ++stats->rows;
      }
    }
    c.emplace("segments", std::move(seg));
  }
  c.emplace("tokens", std::move(b.inputs));
  c.emplace("targets", std::move(b.targets));
  c.emplace("positions", std::move(pos));
  c.emplace("mask", std::move(mask));
  return c;
}

Result<train::Columns> TrainFeed::next_of(size_t local, const train::Position& drawn) {
  if (tokens()) {
    ASPEN_ASSIGN_OR_RETURN(train::Batch b, token_loaders_[local]->next());
    const uint64_t key = mlm_ ? batch_hash(mlm_->seed, kMlmSalt, uint64_t(replicas_[local]), drawn) : 0;
    return token_columns(std::move(b), &packing_stats_, key, &masked_stats_);
  }
  return array_loaders_[local]->next();
}

Status TrainFeed::put(const train::Columns& batch, int64_t slot, std::map<std::string, Tensor>& out) const {
  for (const Binding& b : bindings_) {
    Tensor& dst = out.at(b.input);
    const size_t bytes = size_t(b.type.bytes());
    ASPEN_RETURN_IF_ERROR(convert_into(batch.at(b.column), b.type.dtype,
                                       static_cast<char*>(dst.raw()) + size_t(slot) * bytes,
                                       path_ + ": column '" + b.column + "' (for input '" + b.input + "')"));
  }
  return Status::ok();
}

Result<const std::map<std::string, Tensor>*> TrainFeed::next_call(int64_t micro) {
  const size_t L = tokens() ? token_loaders_.size() : array_loaders_.size();
  const int64_t slots = micro * int64_t(L);
  if (slots != call_slots_) {
    call_.clear();
    for (const Binding& b : bindings_) {
      std::vector<int64_t> d(b.type.shape.begin(), b.type.shape.end());
      if (d.empty()) d.push_back(1);
      d[0] *= slots;
      call_.emplace(b.input, Tensor(b.type.dtype, *Shape::make(d.data(), int(d.size()))));
    }
    call_slots_ = slots;
  }
  const train::Position at = position();  // the loaders move in lockstep: one position for all
  auto back = [&](Status s) {
    ASPEN_CHECK(restore(at).is_ok());
    return s;
  };
  std::vector<int64_t> drawn_by(L, 0);  // NOTE [data per replica]: kept when the call succeeds
  std::vector<std::pair<int64_t, int64_t>> last_call;
  for (int64_t m = 0; m < micro; ++m)
    for (size_t l = 0; l < L; ++l) {
      const train::Position drawn = tokens() ? token_loaders_[l]->position() : array_loaders_[l]->position();
      Result<train::Columns> batch = next_of(l, drawn);
      if (!batch.is_ok()) return back(batch.status());
      const train::ExampleOrder& order = tokens() ? token_loaders_[l]->order() : array_loaders_[l]->order();
      drawn_by[l] += int64_t(order.last().size());
      for (int64_t e : order.last()) last_call.emplace_back(order.last_epoch() * order.train_examples() + e, replicas_[l]);
      if (dropout_)
        batch->insert_or_assign("dropout_seed",
                                seed_column(int64_t(batch_hash(dropout_seed_, 0, uint64_t(replicas_[l]), drawn))));
      if (Status s = put(*batch, m * int64_t(L) + int64_t(l), call_); !s.is_ok()) return back(std::move(s));
    }
  DataStats& ds = data_stats_;
  if (ds.examples.size() != L) ds.replicas = replicas_, ds.examples.assign(L, 0);
  for (size_t l = 0; l < L; ++l) ds.examples[l] += drawn_by[l];
  ds.last_call = std::move(last_call);
  return &call_;
}

int64_t TrainFeed::val_steps() const { return tokens() ? token_val_->val_steps() : array_val_->val_steps(); }

Result<std::map<std::string, Tensor>> TrainFeed::val_batch(int64_t i) {
  train::Columns batch;
  if (tokens()) {
    ASPEN_ASSIGN_OR_RETURN(train::Batch b, token_val_->val_batch(i));
    const uint64_t key =
        mlm_ ? batch_hash(mlm_->seed, kMlmSalt, kValidationReplica, train::Position{.step_in_epoch = i}) : 0;
    batch = token_columns(std::move(b), nullptr, key);
    if (dropout_) batch.insert_or_assign("dropout_seed", seed_column(-1));  // validation: no dropout
  } else {
    ASPEN_ASSIGN_OR_RETURN(batch, array_val_->val_batch(i));
    if (dropout_) batch.insert_or_assign("dropout_seed", seed_column(-1));  // validation: no dropout
  }
  std::map<std::string, Tensor> out;
  for (const Binding& b : bindings_) out.emplace(b.input, Tensor(b.type.dtype, b.type.shape));
  ASPEN_RETURN_IF_ERROR(put(batch, 0, out));
  return out;
}

train::Position TrainFeed::position() const {
  return tokens() ? token_loaders_.front()->position() : array_loaders_.front()->position();
}

Status TrainFeed::restore(const train::Position& p) {
  for (auto& l : token_loaders_) ASPEN_RETURN_IF_ERROR(l->restore(p));
  for (auto& l : array_loaders_) ASPEN_RETURN_IF_ERROR(l->restore(p));
  return Status::ok();
}

int64_t TrainFeed::units_per_micro_batch() const { return tokens() ? micro_batch_ * seq_ : micro_batch_; }

// NOTE [onnx training]: a user's ONNX model (model.from: *.onnx) for the
// trainer. Every graph input reads a data column: model.inputs where it names
// the input; with token shards, input_ids, position_ids and attention_mask
// read tokens, positions and mask; any other input reads the column of its
// own name. An input whose declared rank is the column's takes the column's
// shape (a micro-batch of it), which binds its symbolic dimensions; other
// inputs keep the shape the file declares. The loss (model.loss over
// model.output, models::add_onnx_loss) adds the input "targets", which reads
// the column model.targets. `columns` receives the input -> column map.
Result<models::OnnxImport> import_for_training(const train::TrainConfig& c, const TrainFeed& feed,
                                               std::map<std::string, std::string>& columns) {
  ASPEN_ASSIGN_OR_RETURN(const io::OnnxModel file, io::read_onnx_model(c.model.from));
  const models::OnnxLoss loss{.kind = c.model.loss == "mse" ? models::OnnxLoss::Kind::mse
                                                            : models::OnnxLoss::Kind::cross_entropy,
                              .targets = "targets",
                              .ignore_index = c.model.ignore_index};
  const std::map<std::string, graph::TensorType> have = feed.columns();
  columns.clear();
  models::OnnxImportOptions o;
  o.frozen = c.model.frozen;
  o.trainable = c.model.trainable;
  for (const auto& [input, column] : c.model.inputs)
    if (!file.graph.find_input(input))
      return Status::invalid_argument("config: model.inputs: '" + input + "'", "an input of the model",
                                      "no input of that name");
  for (const io::OnnxValueInfo& v : file.graph.inputs) {
    std::string column = v.name;
    const bool mapped = c.model.inputs.count(v.name) > 0;
    if (auto m = c.model.inputs.find(v.name); m != c.model.inputs.end()) {
      column = m->second;
    } else if (feed.tokens()) {
      const std::map<std::string, std::string> lm = {
          {"input_ids", "tokens"}, {"position_ids", "positions"}, {"attention_mask", "mask"}};
      if (auto d = lm.find(v.name); d != lm.end()) column = d->second;
    }
    columns[v.name] = column;
    ASPEN_RETURN_IF_ERROR(feed.check_column(v.name, column, mapped, "config: model.inputs"));
    const graph::TensorType& col = have.at(column);
    if (v.has_shape && int(v.dims.size()) == col.shape.rank()) {
      o.input_shapes[v.name] = std::vector<int64_t>(col.shape.begin(), col.shape.end());
    } else if (v.has_shape) {
      for (const io::OnnxDim& d : v.dims)
        if (d.value < 0)
          return Status::invalid_argument("config: model.inputs: input '" + v.name + "' from column '" + column + "'",
                                          "a column of rank " + std::to_string(v.dims.size()) +
                                              ", whose micro-batch binds the input's dimensions " + v.dims_text(),
                                          col.to_string());
    }
  }
  ASPEN_ASSIGN_OR_RETURN(models::OnnxImport m, models::import_onnx(file, o));
  models::OnnxLoss l = loss;
  if (!c.model.output.empty()) {
    l.output = c.model.output;
  } else if (!m.outputs.empty()) {
    l.output = m.outputs.front();
  }
  ASPEN_RETURN_IF_ERROR(models::add_onnx_loss(m, l).with_context("config: model.loss (" + c.model.from + ")"));
  columns[l.targets] = c.model.targets;
  // Token ids the model has no class for would fail inside the loss at step 1.
  if (feed.tokens() && l.kind == models::OnnxLoss::Kind::cross_entropy && c.model.targets == "targets") {
    const int64_t classes = m.graph.type(*m.graph.find_output(l.output)).shape[-1];
    if (feed.token_index().vocab_size > classes)
      return Status::invalid_argument("data.train '" + c.data.train + "'",
                                      "token ids below the " + std::to_string(classes) + " classes of output '" +
                                          l.output + "' of " + c.model.from,
                                      "token shards of a " + std::to_string(feed.token_index().vocab_size) +
                                          "-token vocabulary");
  }
  return m;
}

}  // namespace aspen::api
