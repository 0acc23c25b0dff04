#include "models/weights.h"

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/log.h"
#include "core/memory_phases.h"
#include "kernels/convert.h"
#include "models/gguf_checkpoint.h"

namespace aspen::models {

namespace {

namespace fs = std::filesystem;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The checkpoint names that may hold the graph's parameter `name`, most likely first.
std::vector<std::string> candidates(const std::string& model_type, const std::string& name) {
  std::vector<std::string> out{name};
  if (model_type == "gpt2" || model_type == "gptj") {
    if (starts_with(name, "transformer.")) out.push_back(name.substr(std::strlen("transformer.")));
  } else if (model_type == "bert") {
    out.push_back("bert." + name);
    for (const auto& [from, to] : {std::pair<std::string, std::string>{".LayerNorm.weight", ".LayerNorm.gamma"},
                                   {".LayerNorm.bias", ".LayerNorm.beta"}})
      if (ends_with(name, from)) {
        const std::string old = name.substr(0, name.size() - from.size()) + to;
        out.push_back(old);
        out.push_back("bert." + old);
      }
  }
  return out;
}

// Checkpoint tensors a graph leaves unread on purpose: buffers, a tied head,
// BERT's pooler when the graph has none.
bool ignorable(const std::string& model_type, const std::string& tensor, const graph::Graph& g) {
  if (model_type == "gpt2" || model_type == "gptj")
    return ends_with(tensor, ".attn.bias") || ends_with(tensor, ".attn.masked_bias") ||
           (tensor == "lm_head.weight" && !g.find_parameter("lm_head.weight"));
  // Old checkpoints keep inv_freq; a GGUF file's rope_freqs was read into the config (NOTE [GGUF rope factors]).
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2")
    return ends_with(tensor, ".rotary_emb.inv_freq") || tensor == "rope_freqs.weight" ||
           (tensor == "lm_head.weight" && !g.find_parameter("lm_head.weight"));
  if (model_type == "bert")  // BertForMaskedLM's head when the graph has none; its tied decoder always;
                             // BertForPreTraining's next-sentence head
    return ends_with(tensor, "embeddings.position_ids") ||
           ((starts_with(tensor, "pooler.") || starts_with(tensor, "bert.pooler.")) &&
            !g.find_parameter("pooler.dense.weight")) ||
           (starts_with(tensor, "cls.predictions.") && !g.find_parameter("cls.predictions.bias")) ||
           tensor == "cls.predictions.decoder.weight" || tensor == "cls.predictions.decoder.bias" ||
           starts_with(tensor, "cls.seq_relationship.");
  return false;
}


}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  if (ends_with(dir, ".gguf")) return open_gguf(dir);
  Checkpoint c;
  c.dir_ = dir;
  ASPEN_ASSIGN_OR_RETURN(c.config_, load_config((fs::path(dir) / "config.json").string()));
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (fs::exists(single, ec)) {
    c.weights_path_ = single;
    ASPEN_ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::open(single));
    c.file_ = std::make_unique<io::SafetensorsFile>(std::move(f));
  } else if (fs::exists(index, ec)) {
    c.weights_path_ = index;
    ASPEN_ASSIGN_OR_RETURN(io::SafetensorsIndex i, io::SafetensorsIndex::open(index));
    c.index_ = std::make_unique<io::SafetensorsIndex>(std::move(i));
  } else {
    return Status::error(Code::kNotFound, dir, "model.safetensors or model.safetensors.index.json", "neither");
  }
  // NOTE [stored head]: tie_word_embeddings with an lm_head.weight in the file is read as transformers
  // reads it (5.x, checked against 5.25): the stored head is the head, untied. Tying it instead changed a
  // Llama's logits by 12.
  if (c.find("lm_head.weight").second) {
    if (auto* l = std::get_if<LlamaConfig>(&c.config_.family); l && l->tie_word_embeddings) l->tie_word_embeddings = false;
    if (auto* g = std::get_if<Gpt2Config>(&c.config_.family); g && g->tie_word_embeddings) g->tie_word_embeddings = false;
  }
  // A config whose dimensions the weights cannot hold (n_layer 20000 beside a
  // 2-layer file) is refused here, before a graph of its size is built.
  double stored = 0;
  for (const std::string& name : c.tensor_names()) {
    const io::TensorInfo* info = c.find(name).second;
    if (info) stored += double(info->shape.numel());
  }
  if (const double want = min_parameter_count(c.config_); want > stored) {
    char w[32], h[32];
    std::snprintf(w, sizeof w, "%.4g", want);
    std::snprintf(h, sizeof h, "%.4g", stored);
    return Status::invalid_argument(c.config_.path, "dimensions the weights in " + c.weights_path_ + " can hold (" +
                                                        std::string(h) + " values stored)",
                                    "a config of at least " + std::string(w) + " parameters",
                                    "check " + std::string(c.config_.llama()  ? "num_hidden_layers, hidden_size, vocab_size, "
                                                                                     "intermediate_size and "
                                                                                     "num_key_value_heads"
                                                           : c.config_.bert() ? "num_hidden_layers, hidden_size, vocab_size, "
                                                                                "max_position_embeddings and "
                                                                                "intermediate_size"
                                                                              : "n_layer, n_embd, vocab_size, n_positions "
                                                                                "and n_inner") +
                                        " (config.json's names) against the weights");
  }
  note_memory_phase("checkpoint opened");  // NOTE [memory phases]
  return c;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  if (gguf_) {
    std::vector<std::string> names;
    for (const io::GgufTensor& t : gguf_->tensors()) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    return names;
  }
  return file_ ? file_->names() : index_->names();
}

std::pair<const io::SafetensorsFile*, const io::TensorInfo*> Checkpoint::find(const std::string& name) const {
  if (gguf_) return {nullptr, nullptr};  // its tensors: gguf_binding()
  if (index_) return index_->find(name);
  const io::TensorInfo* info = file_->find(name);
  return {info ? file_.get() : nullptr, info};
}

Result<WeightPlan> plan_weights(const graph::Graph& g, const Checkpoint& ckpt) {
  const std::string& type = ckpt.config().model_type;
  const std::string& path = ckpt.weights_path();
  WeightPlan plan;
  std::set<std::string> used;
  for (int32_t i : g.parameter_nodes()) {
    const graph::Node& n = g.node(i);
    if (n.name.rfind(kStatePrefix, 0) == 0) continue;  // a program's state (KV cache), not a weight
    WeightBinding w{.parameter = n.name, .tensor = {}, .type = g.type(n.outputs[0])};
    if (ckpt.gguf()) {  // NOTE [GGUF models]
      ASPEN_ASSIGN_OR_RETURN(w, gguf_binding(ckpt, std::move(w)));
      used.insert(w.tensor);
      plan.bindings.push_back(std::move(w));
      continue;
    }
    const std::vector<std::string> names = candidates(type, n.name);
    for (const std::string& c : names) {
      std::tie(w.file, w.info) = ckpt.find(c);
      if (w.info) {
        w.tensor = c;
        break;
      }
    }
    if (!w.info) {
      std::string also;
      for (size_t k = 1; k < names.size(); ++k) also += (also.empty() ? "" : ", ") + ("'" + names[k] + "'");
      return Status::error(Code::kNotFound, path + ": tensor '" + n.name + "'",
                           "present (a parameter of the " + type + " graph, " + w.type.to_string() + ")", "none",
                           also.empty() ? "" : "also looked for " + also);
    }
    if (w.info->shape != w.type.shape)
      return Status::invalid_argument(path + ": tensor '" + w.tensor + "'",
                                      "shape " + w.type.shape.to_string() + " (the graph's parameter '" + n.name +
                                          "', from " + ckpt.config().path + ")",
                                      w.info->shape.to_string());
    if (!is_float(w.info->dtype))
      return Status::invalid_argument(path + ": tensor '" + w.tensor + "'", "F32, BF16 or F16",
                                      std::string(dtype_safetensors_name(w.info->dtype)));
    used.insert(w.tensor);
    plan.bindings.push_back(std::move(w));
  }
  for (const std::string& t : ckpt.tensor_names())
    if (!used.count(t) && !ignorable(type, t, g)) plan.unused.push_back(t);
  if (!plan.unused.empty()) {
    std::string list;
    for (size_t k = 0; k < plan.unused.size() && k < 8; ++k) list += (k ? ", " : "") + plan.unused[k];
    if (plan.unused.size() > 8) list += " and " + std::to_string(plan.unused.size() - 8) + " more";
    ASPEN_LOG(warning) << path << ": " << plan.unused.size() << " tensors not used by the " << type
                       << " graph: " << list;
  }
  return plan;
}

namespace {

Result<Tensor> read_safetensors_weight(const WeightBinding& w) {
  ASPEN_CHECK(w.file != nullptr && w.info != nullptr) << "an unbound WeightBinding for " << w.parameter;
  const std::span<const std::byte> bytes = w.file->data(*w.info);
  const DType from = w.info->dtype, to = w.type.dtype;
  const int64_t n = w.type.shape.numel();
  ASPEN_ASSIGN_OR_RETURN(Tensor out, Tensor::make(to, w.type.shape));
  if (from == to) {
    if (!bytes.empty()) std::memcpy(out.raw(), bytes.data(), bytes.size());
    return out;
  }
  // The mapping is read in place when aligned for its dtype; otherwise copied once to an aligned buffer.
  Tensor staged;
  const void* src = bytes.data();
  if (reinterpret_cast<uintptr_t>(src) % dtype_size(from) != 0) {
    ASPEN_ASSIGN_OR_RETURN(staged, Tensor::make(from, w.type.shape));
    std::memcpy(staged.raw(), bytes.data(), bytes.size());
    src = staged.raw();
  }
  const size_t count = size_t(n);
  auto as = [&](auto* tag) { return std::span(static_cast<const std::remove_pointer_t<decltype(tag)>*>(src), count); };
  Tensor wide;  // f16 <-> bf16 goes through f32
  std::span<const float> f32_src;
  if (from == DType::f32) {
    f32_src = as(static_cast<float*>(nullptr));
  } else {
    ASPEN_ASSIGN_OR_RETURN(wide, Tensor::make(DType::f32, w.type.shape));
    if (from == DType::bf16)
      ASPEN_RETURN_IF_ERROR(kernels::convert_bf16_to_f32(as(static_cast<bf16*>(nullptr)), wide.span<float>(), n));
    else
      ASPEN_RETURN_IF_ERROR(kernels::convert_f16_to_f32(as(static_cast<f16*>(nullptr)), wide.span<float>(), n));
    if (to == DType::f32) return wide;
    f32_src = wide.span<float>();
  }
  ASPEN_RETURN_IF_ERROR(narrow_into(f32_src, out));
  return out;
}

}  // namespace

Result<Tensor> read_weight(const WeightBinding& w) {
  Result<Tensor> t = w.gguf_tensor ? read_gguf_weight(w) : read_safetensors_weight(w);
  // NOTE [pages read once] (core/file.h): the copy is what the program keeps; the mapping's pages of it would
  // otherwise stay resident beside it (a model's load peaking at twice its size).
  if (w.gguf_tensor) w.gguf->release(*w.gguf_tensor);
  else w.file->release(*w.info);
  return t;
}

Status narrow_into(std::span<const float> values, Tensor& out) {
  const int64_t n = out.numel();
  if (out.dtype() == DType::bf16) return kernels::convert_f32_to_bf16(values, out.span<bf16>(), n);
  if (out.dtype() == DType::f16) return kernels::convert_f32_to_f16(values, out.span<f16>(), n);
  if (out.dtype() != DType::f32)
    return Status::invalid_argument("weight conversion", "f32, bf16 or f16", std::string(dtype_name(out.dtype())));
  std::memcpy(out.raw(), values.data(), out.nbytes());
  return Status();
}

Status load_weights(const WeightPlan& plan, const std::function<Status(const std::string&, const Tensor&)>& sink,
                    const WeightDestination& into) {
  constexpr size_t kPart = size_t(2) << 20;  // the file's pages resident at once while copying
  for (const WeightBinding& w : plan.bindings) {
    // A weight stored as the parameter wants it goes to the sink as a view of the mapping: no copy beside the
    // one the sink makes (the copies were the load's peak, and their blocks stayed in the tensor block cache,
    // NOTE [tensor block cache]), its pages then dropped (NOTE [pages read once]).
    if (!w.gguf_tensor && w.info->dtype == w.type.dtype) {
      const std::span<const std::byte> bytes = w.file->data(*w.info);
      if (reinterpret_cast<uintptr_t>(bytes.data()) % dtype_size(w.type.dtype) == 0 &&
          bytes.size() == size_t(w.type.shape.numel()) * dtype_size(w.type.dtype)) {
        if (Tensor* dst = into ? into(w.parameter) : nullptr;
            dst && dst->dtype() == w.type.dtype && dst->shape() == w.type.shape) {
          for (size_t at = 0; at < bytes.size(); at += kPart) {
            const size_t n = std::min(kPart, bytes.size() - at);
            std::memcpy(static_cast<std::byte*>(dst->raw()) + at, bytes.data() + at, n);
            w.file->release(bytes.subspan(at, n));  // its whole pages; the page two parts share waits for the end
          }
          w.file->release(*w.info);
          continue;
        }
        const Tensor view = Tensor::view(w.type.dtype, w.type.shape, const_cast<std::byte*>(bytes.data()));
        ASPEN_RETURN_IF_ERROR(sink(w.parameter, view));
        w.file->release(*w.info);
        continue;
      }
    }
    ASPEN_ASSIGN_OR_RETURN(Tensor t, read_weight(w));
    ASPEN_RETURN_IF_ERROR(sink(w.parameter, t));
  }
  note_memory_phase("weights loaded");  // NOTE [memory phases]
  return Status();
}

Result<std::map<std::string, Tensor>> read_weights(const graph::Graph& g, const Checkpoint& ckpt) {
  ASPEN_ASSIGN_OR_RETURN(WeightPlan plan, plan_weights(g, ckpt));
  std::map<std::string, Tensor> out;
  for (const WeightBinding& w : plan.bindings) {
    ASPEN_ASSIGN_OR_RETURN(Tensor t, read_weight(w));
    out.emplace(w.parameter, std::move(t));
  }
  return out;
}

namespace {

// The tokenizer files transformers' AutoTokenizer reads, for export.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "vocab.json", "merges.txt", "vocab.txt",
                                           "tokenizer_config.json", "special_tokens_map.json"};

}  // namespace

Status export_hf_model(const std::string& dir, const ModelConfig& config, const std::map<std::string, Tensor>& weights,
                       const std::string& tokenizer_dir) {
  const std::string subject = "export_hf_model " + dir;
  Result<std::string> config_json = to_hf_config_json(config);
  if (!config_json.is_ok()) return config_json.status().with_context(subject);
  if (weights.empty()) return Status::invalid_argument(subject, "the model's weights", "none");
  const bool drop_head = (config.gpt2() && config.gpt2()->tie_word_embeddings) ||
                         (config.llama() && config.llama()->tie_word_embeddings);
  if (config.bert() && !weights.count("cls.predictions.bias"))
    return Status::invalid_argument(subject, "a BERT with its masked-LM head (cls.predictions.*: BertForMaskedLM)",
                                    "the encoder alone");
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& [name, t] : weights) {
    if (drop_head && name == "lm_head.weight") continue;
    // BERT as BertForMaskedLM names it: the encoder under "bert.", beside the head (its decoder tied).
    tensors.emplace_back(config.bert() && !name.starts_with("cls.") ? "bert." + name : name, &t);
  }

  // Read the tokenizer files before writing anything, so a bad tokenizer_dir leaves `dir` as it was.
  std::vector<std::pair<std::string, std::string>> tokenizer;  // (file name, bytes)
  if (!tokenizer_dir.empty()) {
    std::error_code ec;
    for (const char* name : kTokenizerFiles) {
      const fs::path from = fs::path(tokenizer_dir) / name;
      if (!fs::exists(from, ec)) continue;
      ASPEN_ASSIGN_OR_RETURN(std::string bytes, read_regular_file(from.string()));
      tokenizer.emplace_back(name, std::move(bytes));
    }
    if (tokenizer.empty()) {
      std::string names;
      for (const char* name : kTokenizerFiles) names += (names.empty() ? "" : ", ") + std::string(name);
      return Status::error(Code::kNotFound, tokenizer_dir, "tokenizer files (any of " + names + ")", "none");
    }
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::error(Code::kIoError, dir, "a directory that can be created", ec.message());
  ASPEN_RETURN_IF_ERROR(
      io::write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}}));
  for (const auto& [name, bytes] : tokenizer)
    ASPEN_RETURN_IF_ERROR(write_file_atomic((fs::path(dir) / name).string(), bytes));
  return write_file_atomic((fs::path(dir) / "config.json").string(), *config_json);
}

}  // namespace aspen::models
