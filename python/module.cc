// python/module.cc: aspen._aspen, the Python package's one extension module: a thin binding of the C++
// API (api/, models/, io/tokenizer.h). The package's Python code (python/aspen/) adapts frameworks and
// types around it; nothing here knows torch or Keras (docs/python.md).
//
// NOTE [python arrays] Arrays cross in both directions without copies where they can:
//  - An input is any object nanobind reads as a CPU array (numpy's buffer protocol or DLPack, so torch
//    tensors too). C-contiguous memory becomes a Tensor::view of the caller's memory (the runtime copies it
//    into its arena, so no alignment is needed); other strides are gathered into one owned copy, counted in
//    input_copies() so that tests can tell the two paths apart.
//  - An output Tensor moves to the heap and a numpy array is made over its memory, kept alive by a capsule
//    that frees the Tensor with the last reference. bf16 outputs, which numpy lacks, are widened to f32 (a
//    copy: the one dtype that needs it).
//
// Errors: every Status becomes a Python exception carrying its message (subject, expected, found):
// InvalidArgument, OutOfRange and Corrupt raise ValueError; NotFound FileNotFoundError; IoError OSError;
// Unimplemented NotImplementedError (a RuntimeError); the rest RuntimeError. Arguments are checked here
// before anything reaches code that would abort on them (ASPEN_CHECK), so bad input never ends the
// interpreter. The GIL is released while aspen computes.
#include "python/binding.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>

#include "api/inference_model.h"
#include "api/training_model.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "graph/builder.h"
#include "io/onnx.h"
#include "kernels/convert.h"
#include "models/bert.h"
#include "models/causal_lm.h"
#include "models/onnx_import.h"
#include "models/weights.h"
#include "parallel/job.h"
#include "train/pipeline.h"

using namespace nb::literals;

namespace aspen::python {

namespace {

// ---- errors ------------------------------------------------------------------------------------------

PyObject* exception_for(Code code) {
  switch (code) {
    case Code::kInvalidArgument:
    case Code::kOutOfRange:
    case Code::kCorrupt:
      return PyExc_ValueError;
    case Code::kNotFound:
      return PyExc_FileNotFoundError;
    case Code::kIoError:
      return PyExc_OSError;
    case Code::kUnimplemented:
      return PyExc_NotImplementedError;
    default:
      return PyExc_RuntimeError;
  }
}

// ---- arrays (NOTE [python arrays]) -------------------------------------------------------------------

using InArray = nb::ndarray<nb::ro, nb::device::cpu>;

std::atomic<int64_t> g_input_copies{0};

// The element types that cross, as DLPack spells them: one table for both directions.
struct DlpackType {
  DType dtype;
  nb::dlpack::dtype_code code;
};
constexpr DlpackType kDlpackTypes[] = {
    {DType::f32, nb::dlpack::dtype_code::Float}, {DType::f16, nb::dlpack::dtype_code::Float},
    {DType::bf16, nb::dlpack::dtype_code::Bfloat}, {DType::i32, nb::dlpack::dtype_code::Int},
    {DType::i64, nb::dlpack::dtype_code::Int},     {DType::u8, nb::dlpack::dtype_code::UInt},
    {DType::boolean, nb::dlpack::dtype_code::Bool}};

DType dtype_of(const nb::dlpack::dtype& t, const std::string& what) {
  for (const DlpackType& k : kDlpackTypes)
    if (t.lanes == 1 && t.code == uint8_t(k.code) && t.bits == dtype_size(k.dtype) * 8) return k.dtype;
  static const char* names[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string found = (t.code < 7 ? names[t.code] : "code " + std::to_string(t.code)) +
                            std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
  bad_argument(what, "float32, float16, bfloat16, int32, int64, uint8 or bool elements", found);
}

nb::dlpack::dtype dlpack_of(DType d) {
  nb::dlpack::dtype t{};
  t.lanes = 1;
  t.bits = uint8_t(dtype_size(d) * 8);
  for (const DlpackType& k : kDlpackTypes)
    if (k.dtype == d) t.code = uint8_t(k.code);
  return t;
}

std::string shape_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// "a, b, c", for messages that list what there is.
std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::vector<int64_t> shape_of_array(const InArray& a) {
  std::vector<int64_t> d;
  for (size_t i = 0; i < a.ndim(); ++i) d.push_back(int64_t(a.shape(i)));
  return d;
}

// An input of element type `dt` (dtype_of the array's) as a Tensor of `shape` (the same number of
// elements as the array): a view of C-contiguous memory, else one counted copy in C order.
Tensor input_tensor(const InArray& a, DType dt, const Shape& shape) {
  const size_t es = dtype_size(dt);
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) contiguous = false;
    expect *= int64_t(a.shape(i));
  }
  if (contiguous) return Tensor::view(dt, shape, const_cast<void*>(a.data()));
  Tensor t = take(Tensor::make_uninitialized(dt, shape));
  g_input_copies.fetch_add(1, std::memory_order_relaxed);
  const size_t n = a.ndim();
  std::vector<int64_t> idx(n, 0);
  char* dst = static_cast<char*>(t.raw());
  const char* base = static_cast<const char*>(a.data());
  for (int64_t k = 0, total = t.numel(); k < total; ++k) {
    int64_t off = 0;
    for (size_t i = 0; i < n; ++i) off += idx[i] * a.stride(i);
    std::memcpy(dst + size_t(k) * es, base + off * int64_t(es), es);
    for (size_t i = n; i-- > 0;) {
      if (++idx[i] < int64_t(a.shape(i))) break;
      idx[i] = 0;
    }
  }
  return t;
}

}  // namespace

// A numpy array over `t`'s memory, owned by a capsule (f32 for bf16). `merge` leading dimensions are
// folded into the next one (PopTorch's combined batch).
nb::object to_numpy(Tensor t, int merge) {
  if (t.dtype() == DType::bf16) {
    Tensor w = take(Tensor::make_uninitialized(DType::f32, t.shape()));
    kernels::ref::convert_bf16_to_f32(t.data<bf16>(), w.data<float>(), t.numel());
    t = std::move(w);
  }
  std::vector<size_t> shape;
  size_t lead = 1;
  for (int i = 0; i < t.shape().rank(); ++i) {
    if (i < merge) {
      lead *= size_t(t.shape()[i]);
      continue;
    }
    shape.push_back(size_t(t.shape()[i]) * (i == merge ? lead : 1));
  }
  if (merge > 0 && merge >= t.shape().rank() && lead > 1) shape.push_back(lead);  // a scalar per step: [steps]
  auto* owned = new Tensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::numpy> arr(owned->raw(), shape.size(), shape.data(), owner, nullptr, dlpack_of(owned->dtype()));
  return nb::cast(arr, nb::rv_policy::reference);
}

namespace {

// Arrays by name as Tensors of their own shapes (weights, optimizer state); `kind` names them in errors.
std::map<std::string, Tensor> tensors_of(const std::map<std::string, InArray>& arrays, const char* kind) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, a] : arrays) {
    const std::vector<int64_t> d = shape_of_array(a);
    const DType dt = dtype_of(a.dtype(), std::string(kind) + " '" + name + "'");
    out.emplace(name, input_tensor(a, dt, take(Shape::make(d.data(), int(d.size())))));
  }
  return out;
}

std::map<std::string, const Tensor*> pointers(const std::map<std::string, Tensor>& ts) {
  std::map<std::string, const Tensor*> out;
  for (const auto& [name, t] : ts) out[name] = &t;
  return out;
}

nb::dict numpy_dict(std::map<std::string, Tensor> ts) {
  nb::dict d;
  for (auto& [name, t] : ts) d[nb::str(name.c_str())] = to_numpy(std::move(t));
  return d;
}

// ---- options -----------------------------------------------------------------------------------------

DType parse_dtype(const std::string& s, const std::string& what) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  bad_argument(what, "f32, bf16 or f16", "'" + s + "'");
}

// The package's Options as a dict of C++ option names (python/aspen/options.py makes it).
api::Options options_from(const nb::dict& d) {
  api::Options o;
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "device_iterations") o.device_iterations(nb::cast<int64_t>(v));
    else if (key == "replication_factor") o.replication_factor(nb::cast<int64_t>(v));
    else if (key == "gradient_accumulation") o.gradient_accumulation(nb::cast<int64_t>(v));
    else if (key == "output_mode") {
      const std::string m = nb::cast<std::string>(v);
      if (m == "all") o.output_mode_ = api::OutputMode::all;
      else if (m == "final") o.output_mode_ = api::OutputMode::final;
      else if (m == "sum") o.output_mode_ = api::OutputMode::sum;
      else if (m == "every_n") o.output_mode_ = api::OutputMode::every_n;
      else bad_argument("options.output_mode", "all, final, sum or every_n", "'" + m + "'");
    } else if (key == "output_every_n") o.output_every_n_ = nb::cast<int64_t>(v);
    else if (key == "precision") o.precision_ = parse_dtype(nb::cast<std::string>(v), "options.precision");
    else if (key == "partials") o.partials_type_ = parse_dtype(nb::cast<std::string>(v), "options.partials type");
    else if (key == "executable_cache") o.executable_cache(nb::cast<std::string>(v));
    else if (key == "random_seed") o.random_seed(nb::cast<uint64_t>(v));
    else if (key == "profile") o.profile(nb::cast<std::string>(v));
    else if (key == "threads") o.threads(nb::cast<int>(v));
    else if (key == "mpi") o.mpi(nb::cast<bool>(v));
    else if (key == "recompute") o.recompute(nb::cast<bool>(v));
    else if (key == "stochastic_rounding") o.stochastic_rounding_ = nb::cast<bool>(v);
    else bad_argument("options key '" + key + "'", "an option aspen knows", "an unknown key");
  }
  return o;
}

api::TrainingOptions training_from(const nb::dict& d) {
  api::TrainingOptions t;
  t.optimizer.weight_decay = 0.0;
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "optimizer") {
      const std::string s = nb::cast<std::string>(v);
      if (s == "adamw") t.optimizer.kind = train::OptimizerKind::adamw;
      else if (s == "sgd") t.optimizer.kind = train::OptimizerKind::sgd;
      else if (s == "lamb") t.optimizer.kind = train::OptimizerKind::lamb;
      else if (s == "rmsprop") t.optimizer.kind = train::OptimizerKind::rmsprop;
      else bad_argument("optimizer", "adamw, sgd, lamb or rmsprop", "'" + s + "'");
    } else if (key == "lr") t.schedule.lr = nb::cast<double>(v);
    else if (key == "beta1") t.optimizer.beta1 = nb::cast<double>(v);
    else if (key == "beta2") t.optimizer.beta2 = nb::cast<double>(v);
    else if (key == "eps") t.optimizer.eps = nb::cast<double>(v);
    else if (key == "weight_decay") t.optimizer.weight_decay = nb::cast<double>(v);
    else if (key == "momentum") t.optimizer.momentum = nb::cast<double>(v);
    else if (key == "nesterov") t.optimizer.nesterov = nb::cast<bool>(v);
    else if (key == "alpha") t.optimizer.alpha = nb::cast<double>(v);
    else if (key == "centered") t.optimizer.centered = nb::cast<bool>(v);
    else if (key == "l2_weight_decay") t.optimizer.l2_weight_decay = nb::cast<bool>(v);
    else if (key == "gradient_dtype") t.optimizer.gradient_dtype = parse_dtype(nb::cast<std::string>(v), key);
    else if (key == "first_order_dtype") t.optimizer.first_order_dtype = parse_dtype(nb::cast<std::string>(v), key);
    else if (key == "second_order_dtype") t.optimizer.second_order_dtype = parse_dtype(nb::cast<std::string>(v), key);
    else if (key == "clip_grad_norm") t.clip_grad_norm = nb::cast<double>(v);
    else if (key == "loss_scaling") {
      const double s = nb::cast<double>(v);
      if (s > 0) {
        t.loss_scaling.mode = train::LossScaling::static_scale;
        t.loss_scaling.initial_scale = s;
      }
    } else if (key == "dynamic_loss_scaling") {
      if (nb::cast<bool>(v)) t.loss_scaling.mode = train::LossScaling::dynamic;
    } else if (key == "keep_gradients") {
      t.keep_gradients = nb::cast<bool>(v);
    } else if (key == "outputs") {
      t.outputs = nb::cast<std::vector<std::string>>(v);
    } else if (key == "groups") {  // parameter groups beyond the first (python/aspen/optim.py)
      for (nb::handle h : nb::cast<nb::list>(v)) {
        const nb::dict gd = nb::cast<nb::dict>(h);
        train::ParamGroup grp;
        for (auto [gk, gv] : gd) {
          const std::string name = nb::cast<std::string>(gk);
          if (name == "params") grp.params = nb::cast<std::vector<std::string>>(gv);
          else if (name == "lr_scale") grp.lr_scale = nb::cast<double>(gv);
          else if (name == "weight_decay") grp.weight_decay = nb::cast<double>(gv);
          else if (name == "beta1") grp.beta1 = nb::cast<double>(gv);
          else if (name == "beta2") grp.beta2 = nb::cast<double>(gv);
          else if (name == "eps") grp.eps = nb::cast<double>(gv);
          else if (name == "momentum") grp.momentum = nb::cast<double>(gv);
          else if (name == "alpha") grp.alpha = nb::cast<double>(gv);
          else bad_argument("parameter group key '" + name + "'", "params, lr_scale, weight_decay, beta1, beta2, "
                            "eps, momentum or alpha", "an unknown key");
        }
        t.optimizer.groups.push_back(std::move(grp));
      }
    } else if (key == "pipeline_stages") {
      t.pipeline.stages = nb::cast<int>(v);
    } else if (key == "stage_begins") {
      // the import's (OnnxProgram: models::OnnxImportOptions::stage_begins)
    } else if (key == "pipeline_schedule") {
      const std::string s = nb::cast<std::string>(v);
      auto parsed = train::parse_pipeline_schedule(s);
      if (!parsed.is_ok()) bad_argument("pipeline_schedule", "gpipe or 1f1b", "'" + s + "'");
      t.pipeline.schedule = *parsed;
    } else if (key == "reduction") {
      const std::string s = nb::cast<std::string>(v);
      if (s == "mean") t.reduction = api::Reduction::mean;
      else if (s == "sum") t.reduction = api::Reduction::sum;
      else bad_argument("reduction", "mean or sum", "'" + s + "'");
    } else bad_argument("training key '" + key + "'", "a setting aspen knows", "an unknown key");
  }
  return t;
}

// An fnmatch pattern that matches `name` alone.
std::string literal_pattern(const std::string& name) {
  std::string p;
  for (char ch : name) {
    if (ch == '*' || ch == '?' || ch == '[' || ch == '\\') p += std::string("[") + ch + "]";
    else p += ch;
  }
  return p;
}

// ---- an ONNX model, compiled for inference or training -----------------------------------------------

class OnnxProgram {
 public:
  // `loss`: none for inference; else {"output": the graph output that is the loss} for a model that computes
  // its own, or {"kind": "cross_entropy" | "mse", "output": the output it reads, "targets": the new input's
  // name, "ignore_index": n}. `trained`: with training, the initializers to train (the rest are constants);
  // none: every float initializer, as `aspen train` does.
  OnnxProgram(const std::string& path, const std::map<std::string, std::vector<int64_t>>& input_shapes,
              const nb::dict& options, std::optional<nb::dict> training, std::optional<nb::dict> loss,
              std::optional<std::vector<std::string>> trained)
      : path_(path) {
    options_ = options_from(options);
    io::OnnxModel file = take(io::read_onnx_model(path));
    models::OnnxImportOptions o;
    for (const auto& [name, shape] : input_shapes) {
      if (!file.graph.find_input(name)) {
        std::vector<std::string> names;
        for (const auto& v : file.graph.inputs) names.push_back(v.name);
        bad_argument("input '" + name + "'", "an input of " + path + " (" + joined(names) + ")",
                     "no input of that name");
      }
      o.input_shapes[name] = shape;
    }
    if (training && training->contains("stage_begins"))  // Options.setPipelineStages of an ONNX file
      o.stage_begins = nb::cast<std::vector<std::string>>((*training)["stage_begins"]);
    if (trained) {
      const std::set<std::string> keep(trained->begin(), trained->end());
      std::set<std::string> have;
      for (const io::OnnxTensor& t : file.graph.initializers) {
        have.insert(t.name);
        if (keep.count(t.name)) o.trainable.push_back(literal_pattern(t.name));
        else o.frozen.push_back(literal_pattern(t.name));
      }
      for (const std::string& n : keep)
        if (!have.count(n)) bad_argument("parameter '" + n + "'", "an initializer of " + path, "none of that name");
    }
    init(take(models::import_onnx(file, o)), training, loss);
  }

  // A built-in family's model from a Hugging Face directory (causal LMs: logits, and with training the
  // loss over "targets"; bert: last_hidden_state, and pooler_output when the checkpoint has the pooler),
  // compiled for [batch, seq].
  static std::unique_ptr<OnnxProgram> from_hf(const std::string& dir, int64_t batch, int64_t seq,
                                              const nb::dict& options, std::optional<nb::dict> training) {
    if (batch < 1 || seq < 1)
      bad_argument("input_ids", "a [batch, sequence] array with both extents >= 1",
                   "[" + std::to_string(batch) + ", " + std::to_string(seq) + "]");
    std::unique_ptr<OnnxProgram> p(new OnnxProgram());
    p->path_ = dir;
    p->options_ = options_from(options);
    models::Checkpoint ckpt = take(models::Checkpoint::open(dir));
    const models::ModelConfig& cfg = ckpt.config();
    if (seq > cfg.n_positions())
      bad_argument("input_ids sequence", "at most the model's " + std::to_string(cfg.n_positions()) + " positions",
                   std::to_string(seq));
    models::OnnxImport m;
    graph::Builder b(m.graph);
    const bool with_loss = training.has_value();
    // A model trained with a sparse layout attends through it (NOTE [model layouts] in models/config.cc).
    const std::optional<kernels::BlockLayout> layout = take(models::model_layout(cfg, seq, dir));
    if (cfg.causal_lm()) {
      check(models::build_causal_lm(
          b, cfg, {.batch = batch, .seq = seq, .with_loss = with_loss, .layout = layout ? &*layout : nullptr}));
    } else if (const auto* bc = cfg.bert()) {
      if (with_loss) bad_argument(dir, "a model that trains here (gpt2, gptj, llama, mistral, qwen2)", "model_type bert");
      const bool pooler = ckpt.find("pooler.dense.weight").first || ckpt.find("bert.pooler.dense.weight").first;
      check(models::build_bert(b, *bc, {.batch = batch, .seq = seq, .pooler = pooler, .layout = layout ? &*layout : nullptr})
                .status());
    }
    check(b.status());
    for (int32_t n : m.graph.input_nodes()) m.inputs.push_back(m.graph.node(n).name);
    for (const auto& [name, v] : m.graph.outputs()) m.outputs.push_back(name);
    m.weights = take(models::read_weights(m.graph, ckpt));
    std::optional<nb::dict> loss;
    if (with_loss) {
      nb::dict l;
      l["output"] = "loss";
      loss = l;
    }
    p->init(std::move(m), training, loss);
    return p;
  }

  // What both sources share: the loss added or found, the model compiled, its weights on the device.
  void init(models::OnnxImport imp, std::optional<nb::dict> training, std::optional<nb::dict> loss) {
    imp_ = std::move(imp);
    training_ = training.has_value();
    if (training_) {
      api::TrainingOptions t = training_from(*training);
      const nb::dict l = loss ? *loss : nb::dict();
      const std::string output = l.contains("output") ? nb::cast<std::string>(l["output"]) : std::string();
      if (l.contains("kind")) {
        models::OnnxLoss ol;
        const std::string kind = nb::cast<std::string>(l["kind"]);
        if (kind == "cross_entropy") ol.kind = models::OnnxLoss::Kind::cross_entropy;
        else if (kind == "mse") ol.kind = models::OnnxLoss::Kind::mse;
        else bad_argument("loss", "cross_entropy or mse", "'" + kind + "'");
        ol.output = output.empty() && !imp_.outputs.empty() ? imp_.outputs.front() : output;
        if (l.contains("targets")) ol.targets = nb::cast<std::string>(l["targets"]);
        if (l.contains("ignore_index")) ol.ignore_index = nb::cast<int64_t>(l["ignore_index"]);
        check(models::add_onnx_loss(imp_, ol));
        t.loss = "loss";
      } else {
        if (std::find(imp_.outputs.begin(), imp_.outputs.end(), output) == imp_.outputs.end()) {
          bad_argument("loss output '" + output + "'", "an output of " + path_ + " (" + joined(imp_.outputs) + ")",
                       "none of that name");
        }
        t.loss = output;
      }
      // Stochastic rounding draws from the micro-batch's run-time seed (NOTE [stochastic cast]): the input a
      // training Dropout takes, declared here when the model has none (fed as for dropout, below).
      if (options_.stochastic_rounding_ && !imp_.graph.find_input(models::kDropoutSeedInput)) {
        graph::Builder b(imp_.graph);
        b.input(models::kDropoutSeedInput, DType::i64, Shape{1});
        check(b.status());
        imp_.inputs.push_back(models::kDropoutSeedInput);
      }
      nb::gil_scoped_release unlocked;
      training_model_ = take(api::TrainingModel::create(imp_.graph, options_, t));
      check(training_model_->copy_weights_to_device(imp_.weight_pointers()));
    } else {
      nb::gil_scoped_release unlocked;
      inference_model_ = take(api::InferenceModel::create(imp_.graph, options_));
      check(inference_model_->copy_weights_to_device(imp_.weight_pointers()));
    }
    parameter_types_ = imp_.parameter_types();  // what export_onnx checks the device's weights against
    imp_.weights.clear();                       // the device holds them now
  }

  // The inputs a caller gives (a training Dropout's seed is the binding's own).
  std::vector<std::string> inputs() const {
    std::vector<std::string> out;
    for (const std::string& n : imp_.inputs)
      if (n != models::kDropoutSeedInput) out.push_back(n);
    return out;
  }
  const std::vector<std::string>& outputs() const { return imp_.outputs; }
  bool training() const { return training_; }
  bool cache_hit() const { return training_ ? training_model_->cache_hit() : inference_model_->cache_hit(); }

  // The forward graph's type of each input: (dtype name, shape of one micro-batch).
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> input_types() const {
    std::map<std::string, std::pair<std::string, std::vector<int64_t>>> out;
    for (const std::string& name : imp_.inputs) {
      const graph::TensorType& t = imp_.graph.type(*imp_.graph.find_input(name));
      out[name] = {std::string(dtype_name(t.dtype)), std::vector<int64_t>(t.shape.begin(), t.shape.end())};
    }
    return out;
  }

  // One call: device_iterations steps (training: of gradient_accumulation micro-batches each) on the
  // replicas, every input a combined batch (its micro-batches' first dimensions merged) or with the
  // leading dimensions apart.
  nb::dict run(const std::map<std::string, InArray>& arrays) {
    std::map<std::string, Tensor> feeds = prepare(arrays);
    const std::map<std::string, const Tensor*> ptrs = pointers(feeds);
    std::map<std::string, Tensor> out;
    {
      nb::gil_scoped_release unlocked;
      out = take(training_ ? training_model_->run(ptrs) : inference_model_->run(ptrs));
    }
    nb::dict d;
    for (auto& [name, t] : out) {
      // The leading [iterations][replicas] dimensions the output mode left, merged into the first.
      int merge = 0;
      if (!training_)
        if (auto v = imp_.graph.find_output(name)) merge = t.shape().rank() - imp_.graph.type(*v).shape.rank();
      d[nb::str(name.c_str())] = to_numpy(std::move(t), merge);
    }
    return d;
  }

  // bench/python_overhead.py's reference: seconds per C++ run() of these inputs, `calls` calls in a loop
  // (inputs prepared once, outputs dropped), without Python in between.
  double time_run(const std::map<std::string, InArray>& arrays, int64_t calls) {
    if (calls < 1) bad_argument("calls", ">= 1", std::to_string(calls));
    std::map<std::string, Tensor> feeds = prepare(arrays);
    const std::map<std::string, const Tensor*> ptrs = pointers(feeds);
    nb::gil_scoped_release unlocked;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i)
      take(training_ ? training_model_->run(ptrs) : inference_model_->run(ptrs));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / double(calls);
  }

 private:
  // The program's inputs from the call's arrays: shapes and dtypes checked, views where contiguous.
  std::map<std::string, Tensor> prepare(const std::map<std::string, InArray>& arrays) {
    const int64_t iters = options_.device_iterations_, R = options_.replication_factor_;
    const int64_t per_call = iters * R * (training_ ? options_.gradient_accumulation_ : 1);
    std::map<std::string, Tensor> feeds;
    for (const auto& [name, a] : arrays) {
      auto in = imp_.graph.find_input(name);
      const std::string what = "input '" + name + "'";
      if (!in) bad_argument(what, "an input of the model (" + joined(imp_.inputs) + ")", "no input of that name");
      const DType dt = dtype_of(a.dtype(), what);
      const graph::TensorType& t = imp_.graph.type(*in);
      const std::vector<int64_t> got = shape_of_array(a);
      std::vector<int64_t> per(t.shape.begin(), t.shape.end()), merged = per, apart = per;
      if (per_call > 1) {
        if (merged.empty()) merged = {per_call};
        else merged[0] *= per_call;
        apart.insert(apart.begin(), per_call);
      }
      if (got != merged && got != apart)
        bad_argument(what,
                     std::string(dtype_name(t.dtype)) + shape_text(merged) +
                         (per_call > 1 ? " (" + std::to_string(per_call) + " micro-batches of " + shape_text(per) +
                                             ", their first dimensions merged)"
                                       : ""),
                     std::string(dtype_name(dt)) + shape_text(got));
      if (dt != t.dtype) bad_argument(what, std::string(dtype_name(t.dtype)) + " elements", std::string(dtype_name(dt)));
      // The session wants [iterations][replicas] + per apart (inference); training takes the merged form.
      std::vector<int64_t> want = per;
      if (training_) {
        want = merged;
      } else {
        if (R > 1) want.insert(want.begin(), R);
        if (iters > 1) want.insert(want.begin(), iters);
      }
      feeds.emplace(name, input_tensor(a, dt, take(Shape::make(want.data(), int(want.size())))));
    }
    // A training Dropout's seed (NOTE [training dropout] in models/onnx_ops_nn.cc), one per micro-batch: a
    // hash of the options' random seed, the process and the micro-batch's place in the run, so that the
    // masks differ across micro-batches and steps and repeat with the seed. Inference: -1 (no dropout).
    if (imp_.graph.find_input(models::kDropoutSeedInput) && !feeds.count(models::kDropoutSeedInput)) {
      Tensor s(DType::i64, Shape{training_ ? per_call : 1});
      if (!training_ && per_call > 1) s = Tensor(DType::i64, iters > 1 && R > 1 ? Shape{iters, R, 1}
                                                               : Shape{per_call, 1});
      const uint64_t rank = options_.mpi_ ? uint64_t(parallel::job::rank()) : 0;
      const uint64_t first = uint64_t(training_model_ ? training_model_->steps_done() : 0) * uint64_t(per_call);
      int64_t* p = s.data<int64_t>();
      for (int64_t k = 0; k < s.numel(); ++k) {
        const PhiloxBlock h = philox_block(options_.random_seed_ ^ 0x64726f706f7574ULL, rank, first + uint64_t(k));
        p[k] = training_ ? int64_t(((uint64_t(h[1]) << 32) | h[0]) & ((uint64_t(1) << 53) - 1)) : -1;
      }
      feeds.emplace(models::kDropoutSeedInput, std::move(s));
    }
    for (const std::string& name : imp_.inputs)
      if (!feeds.count(name)) bad_argument("input '" + name + "'", "an array", "none given");
    return feeds;
  }

 public:

  nb::dict weights() const {
    std::map<std::string, Tensor> w;
    {
      nb::gil_scoped_release unlocked;
      w = take(training_ ? training_model_->copy_weights_to_host() : inference_model_->copy_weights_to_host());
    }
    return numpy_dict(std::move(w));
  }

  // The last step's gradients by parameter (a training model made with keep_gradients).
  nb::dict gradients() const {
    if (!training_) bad_argument("gradients", "a training model", "an inference model");
    std::map<std::string, Tensor> g;
    {
      nb::gil_scoped_release unlocked;
      g = take(training_model_->copy_gradients_to_host());
    }
    return numpy_dict(std::move(g));
  }

  void set_weights(const std::map<std::string, InArray>& arrays) {
    const std::map<std::string, Tensor> ts = tensors_of(arrays, "weight");
    const std::map<std::string, const Tensor*> ptrs = pointers(ts);
    nb::gil_scoped_release unlocked;
    check(training_ ? training_model_->copy_weights_to_device(ptrs) : inference_model_->copy_weights_to_device(ptrs));
  }

  // The optimizer state ("optimizer.*": moments, momentum buffers, the step count), for a model that
  // leaves the device and comes back (detachFromDevice).
  nb::dict optimizer_state() const {
    if (!training_) bad_argument("optimizer_state", "a training model", "an inference model");
    std::map<std::string, Tensor> st;
    {
      nb::gil_scoped_release unlocked;
      st = take(training_model_->copy_optimizer_state_to_host());
    }
    return numpy_dict(std::move(st));
  }

  void set_optimizer_state(const std::map<std::string, InArray>& arrays, int64_t steps_done) {
    if (!training_) bad_argument("set_optimizer_state", "a training model", "an inference model");
    const std::map<std::string, Tensor> ts = tensors_of(arrays, "state");
    const std::map<std::string, const Tensor*> ptrs = pointers(ts);
    nb::gil_scoped_release unlocked;
    check(training_model_->copy_optimizer_state_to_device(ptrs));
    training_model_->set_steps_done(steps_done);
  }

  int64_t steps_done() const { return training_ ? training_model_->steps_done() : 0; }
  int pipeline_stages() const { return training_ ? training_model_->pipeline_stages() : 1; }

  void set_learning_rate(double lr) {
    if (!training_) bad_argument("set_learning_rate", "a training model", "an inference model");
    if (!(lr >= 0)) bad_argument("learning rate", ">= 0", std::to_string(lr));
    training_model_->set_learning_rate(lr);
  }

  // What the last training call did, step by step: (loss, lr, grad_norm, loss_scale, skipped).
  std::vector<nb::dict> last_steps() const {
    std::vector<nb::dict> out;
    if (!training_) return out;
    for (const api::StepStats& s : training_model_->last_steps()) {
      nb::dict d;
      d["step"] = s.step;
      d["loss"] = s.loss;
      d["lr"] = s.lr;
      d["grad_norm"] = s.grad_norm;
      d["loss_scale"] = s.loss_scale;
      d["skipped"] = s.skipped;
      out.push_back(d);
    }
    return out;
  }

  // A copy of the model file with the device's weights (trained ones for a training model).
  void export_onnx(const std::string& dst) const {
    std::map<std::string, Tensor> w;
    nb::gil_scoped_release unlocked;
    w = take(training_ ? training_model_->copy_weights_to_host() : inference_model_->copy_weights_to_host());
    check(models::export_onnx_weights(parameter_types_, path_, dst, w));
  }

 private:
  OnnxProgram() = default;
  std::string path_;
  api::Options options_;
  models::OnnxImport imp_;
  std::map<std::string, graph::TensorType> parameter_types_;
  bool training_ = false;
  std::unique_ptr<api::InferenceModel> inference_model_;
  std::unique_ptr<api::TrainingModel> training_model_;
};

// What an ONNX file declares, before anything is imported: its inputs as (name, element type, dims with a
// symbolic or unknown extent as its name or None; None for an undeclared rank), its outputs' names and
// its initializers' names.
nb::dict onnx_signature(const std::string& path) {
  io::OnnxModel file = take(io::read_onnx_model(path));
  nb::list inputs, outputs;
  for (const io::OnnxValueInfo& v : file.graph.inputs) {
    nb::object dims = nb::none();
    if (v.has_shape) {
      nb::list l;
      for (const io::OnnxDim& d : v.dims) {
        if (d.value >= 0) l.append(d.value);
        else if (!d.param.empty()) l.append(nb::str(d.param.c_str()));
        else l.append(nb::none());
      }
      dims = l;
    }
    inputs.append(nb::make_tuple(nb::str(v.name.c_str()), nb::str(io::onnx_type_name(v.type).c_str()), dims));
  }
  for (const io::OnnxValueInfo& v : file.graph.outputs) outputs.append(nb::str(v.name.c_str()));
  nb::list initializers;
  for (const io::OnnxTensor& t : file.graph.initializers) initializers.append(nb::str(t.name.c_str()));
  nb::dict d;
  d["initializers"] = initializers;
  d["inputs"] = inputs;
  d["outputs"] = outputs;
  return d;
}

}  // namespace
}  // namespace aspen::python

NB_MODULE(_aspen, m) {
  using namespace aspen::python;
  m.doc() = "aspen's C++ engine (the aspen package wraps it; see docs/python.md)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(exception_for(e.status.code()), e.what());
    }
  });

  m.def("input_copies", [] { return g_input_copies.load(); },
        "Inputs gathered into a copy because their memory was not C-contiguous, since the module loaded.");

  m.def("onnx_signature", &onnx_signature, "path"_a);

  // MPI, for Options.Distributed (python/aspen/options.py): initialized by the first model that asks,
  // finalized at exit. (rank, size) of the job.
  m.def("mpi_init", [] {
    namespace job = aspen::parallel::job;
    if (!job::available()) check(job::init("Distributed"));  // names the build without MPI
    if (!job::launched())
      bad_argument("Distributed", "a process started by mpirun", "no MPI job (OMPI_COMM_WORLD_SIZE, PMI_SIZE unset)");
    check(job::init("Distributed"));
    return std::make_pair(job::rank(), job::size());
  });
  m.def("mpi_finalize", [] { aspen::parallel::job::finalize(); });

  nb::class_<OnnxProgram>(m, "OnnxProgram")
      .def(nb::init<const std::string&, const std::map<std::string, std::vector<int64_t>>&, const nb::dict&,
                    std::optional<nb::dict>, std::optional<nb::dict>, std::optional<std::vector<std::string>>>(),
           "path"_a, "input_shapes"_a, "options"_a, "training"_a = nb::none(), "loss"_a = nb::none(),
           "trained"_a = nb::none())
      .def_prop_ro("inputs", &OnnxProgram::inputs)
      .def_prop_ro("outputs", &OnnxProgram::outputs)
      .def_prop_ro("training", &OnnxProgram::training)
      .def_prop_ro("cache_hit", &OnnxProgram::cache_hit)
      .def_static("from_hf", &OnnxProgram::from_hf, "model_dir"_a, "batch"_a, "seq"_a, "options"_a,
                  "training"_a = nb::none())
      .def("input_types", &OnnxProgram::input_types)
      .def("run", &OnnxProgram::run, "inputs"_a)
      .def("time_run", &OnnxProgram::time_run, "inputs"_a, "calls"_a)
      .def("weights", &OnnxProgram::weights)
      .def("gradients", &OnnxProgram::gradients)
      .def("set_weights", &OnnxProgram::set_weights, "weights"_a)
      .def("set_learning_rate", &OnnxProgram::set_learning_rate, "lr"_a)
      .def("optimizer_state", &OnnxProgram::optimizer_state)
      .def("set_optimizer_state", &OnnxProgram::set_optimizer_state, "state"_a, "steps_done"_a)
      .def_prop_ro("steps_done", &OnnxProgram::steps_done)
      .def_prop_ro("pipeline_stages", &OnnxProgram::pipeline_stages)
      .def("last_steps", &OnnxProgram::last_steps)
      .def("export_onnx", &OnnxProgram::export_onnx, "path"_a);

  bind_text(m);
}
