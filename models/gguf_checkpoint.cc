// models/gguf_checkpoint.cc: a llama.cpp GGUF file as a Checkpoint (models/weights.h).
//
// NOTE [GGUF models]: llama.cpp's converter (convert_hf_to_gguf.py) writes a Hugging Face model into one file:
// the config as `<architecture>.*` metadata, the tokenizer as `tokenizer.ggml.*` (io::load_gguf_tokenizer), and
// the weights under its own names, 2-D ones as [out, in] rows (GPT-2's Conv1D [in, out] matrices transposed),
// quantized or not. open_gguf rebuilds the config.json the model came from (parse_config checks it as it
// checks any), and each parameter of aspen's graph is bound to its tensor by llama.cpp's name, transposed back
// where aspen keeps the Hugging Face layout, dequantized when read (io::GgufFile::read_f32: ggml's values
// exactly). So a GGUF model runs through the same graphs as its Hugging Face directory, its Q8_0 / Q4_0 / Q4_K
// matrices multiplied in their blocks (NOTE [quantized linears]). GPT-2 and the Llama architecture ("llama":
// Llama, Mistral-shaped files without a sliding window): for Llama the converter reorders q_proj's and k_proj's
// rows (per head, row (half, i) moved to (i, half): llama.cpp's rotary pairs neighbours, Hugging Face's the two
// halves), which reading puts back (WeightBinding::gguf_rope_heads), rows of blocks as rows of values; Llama 3's
// rope scaling (a rope_freqs tensor) is read back into its parameters (NOTE [GGUF rope factors]), linear scaling
// from its metadata. Other scalings and architectures are refused by name.
#include "models/gguf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/rotary.h"
#include "models/blocks.h"
#include "models/config.h"
#include "models/llama.h"

namespace aspen::models {

namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

bool is_gguf_path(const std::string& model) {
  return model.size() >= 5 && model.compare(model.size() - 5, 5, ".gguf") == 0;
}

// An integer or real metadata value.
std::optional<double> number(const io::GgufValue& v) {
  switch (v.kind) {
    case io::GgufValue::Kind::integer:
      return double(v.i);
    case io::GgufValue::Kind::unsigned_integer:
      return double(v.u);
    case io::GgufValue::Kind::real:
      return v.f;
    default:
      return std::nullopt;
  }
}

Result<double> required_number(const io::GgufFile& f, const std::string& key) {
  const io::GgufValue* v = f.find_metadata(key);
  if (!v) return Status::error(Code::kNotFound, f.path() + ": " + key, "a number (the model's config)", "no such key");
  const std::optional<double> x = number(*v);
  if (!x) return Status::error(Code::kCorrupt, f.path() + ": " + key, "a number", "another value type");
  return *x;
}

// What both families' configs take alike: the required integers (`keys`: config key, metadata key), the
// vocabulary from the token embedding's rows, an untied head where the file has `output.weight` (the converter
// writes GPT-2's tied head as its own tensor: llama.cpp multiplies by that one), and the special token ids.
Status add_common_config(const io::GgufFile& f, std::span<const std::pair<const char*, const char*>> keys,
                         nlohmann::ordered_json& j) {
  for (const auto& [hf, key] : keys) {
    ASPEN_ASSIGN_OR_RETURN(double v, required_number(f, key));
    j[hf] = int64_t(v);
  }
  const io::GgufTensor* embd = f.find("token_embd.weight");
  if (!embd || embd->extents.size() != 2)
    return Status::error(Code::kNotFound, f.path() + ": tensor 'token_embd.weight'",
                         "the token embedding [vocab, hidden]",
                         embd ? "rank " + std::to_string(embd->extents.size()) : "none");
  j["vocab_size"] = embd->extents[1];
  j["tie_word_embeddings"] = f.find("output.weight") == nullptr;
  for (const auto& [hf, key] : {std::pair{"bos_token_id", "tokenizer.ggml.bos_token_id"},
                                std::pair{"eos_token_id", "tokenizer.ggml.eos_token_id"}})
    if (const io::GgufValue* v = f.find_metadata(key); v && number(*v)) j[hf] = int64_t(*number(*v));
  return Status();
}

// GPT-2's config.json from gpt2.* metadata.
Result<std::string> gpt2_config_json(const io::GgufFile& f) {
  nlohmann::ordered_json j;
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  const std::pair<const char*, const char*> keys[] = {{"n_positions", "gpt2.context_length"},
                                                      {"n_embd", "gpt2.embedding_length"},
                                                      {"n_inner", "gpt2.feed_forward_length"},
                                                      {"n_layer", "gpt2.block_count"},
                                                      {"n_head", "gpt2.attention.head_count"}};
  ASPEN_RETURN_IF_ERROR(add_common_config(f, keys, j));
  ASPEN_ASSIGN_OR_RETURN(const double eps, required_number(f, "gpt2.attention.layer_norm_epsilon"));
  j["layer_norm_epsilon"] = eps;
  j["activation_function"] = "gelu_new";
  return j.dump();
}

// NOTE [GGUF rope factors]: for Llama 3's rope scaling llama.cpp's converter does not write the scaling's
// parameters; it writes their effect, a tensor `rope_freqs` of one factor per frequency (llama.cpp divides each
// inverse frequency by it). transformers' "llama3" rule: with x = 1/wavelength = inv_freq / 2π,
// s = clamp((original_max_position_embeddings * x - low_freq_factor) / (high_freq_factor - low_freq_factor), 0, 1)
// and the factor is 1 / ((1 - s) / factor + s): 1 at high frequencies, `factor` at low ones, and between them s is
// a line in x. So factor is the largest factor, and two factors between 1 and it give the line (slope a, offset
// b); the line fixes the parameters up to one scale, taken as low_freq_factor = 1 (Llama 3's): high = 1 - 1/b,
// original = -a/b, rounded to the integer it is. The parameters are then checked by recomputing every factor of
// the tensor from them as the rotary kernel applies them (within the float32 rounding the file stored them in);
// a tensor that is not of this rule (too few factors between the ends, or one that does not agree) is refused
// by name, never run approximately.
Result<nlohmann::ordered_json> llama3_rope(const io::GgufFile& f, double theta, int64_t rotary) {
  const std::string what = f.path() + ": tensor 'rope_freqs.weight'";
  ASPEN_ASSIGN_OR_RETURN(Tensor t, f.read_f32("rope_freqs.weight"));
  if (rotary < 2 || rotary % 2 || t.numel() != rotary / 2)
    return Status::error(Code::kCorrupt, what, std::to_string(rotary / 2) + " factors (one per rotary frequency)",
                         std::to_string(t.numel()));
  const float* ff = t.data<float>();
  const int64_t n = rotary / 2;
  const double two_pi = 2.0 * 3.14159265358979323846;
  auto x_of = [&](int64_t i) { return std::pow(theta, -2.0 * double(i) / double(rotary)) / two_pi; };
  double factor = 1.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(ff[i] >= 1.0f && std::isfinite(ff[i])))
      return Status::error(Code::kUnimplemented, what, "factors >= 1 (Llama 3's rope scaling)",
                           "factor " + std::to_string(ff[i]) + " at frequency " + std::to_string(i));
    factor = std::max(factor, double(ff[i]));
  }
  const double tol = 1e-4;
  std::vector<int64_t> mid;  // the frequencies strictly between the ends
  for (int64_t i = 0; i < n; ++i)
    if (ff[i] > 1.0 + tol && ff[i] < factor * (1.0 - tol)) mid.push_back(i);
  if (factor == 1.0) return nlohmann::ordered_json{{"rope_type", "default"}, {"rope_theta", theta}};
  if (mid.size() < 2)
    return Status::error(Code::kUnimplemented, what,
                         "Llama 3's rope scaling with at least two factors between 1 and the largest (to recover its "
                         "parameters)",
                         std::to_string(mid.size()));
  auto smooth = [&](int64_t i) { return (1.0 / ff[i] - 1.0 / factor) / (1.0 - 1.0 / factor); };
  const int64_t i1 = mid.front(), i2 = mid.back();
  const double a = (smooth(i2) - smooth(i1)) / (x_of(i2) - x_of(i1)), b = smooth(i1) - a * x_of(i1);
  double high = 1.0 - 1.0 / b;
  const double original = std::round(-a / b);
  if (const double r = std::round(high * 1000.0) / 1000.0; std::abs(r - high) < 1e-5 * high) high = r;  // 4, not 3.9999998
  if (!(b < 0 && a > 0 && high > 1.0 && original >= 1.0 && std::isfinite(high)))
    return Status::error(Code::kUnimplemented, what, "factors rising from 1 to the largest as Llama 3's rule does",
                         "factors falling");
  // Every factor as the rotary kernel will apply it (kernels::rotary_inv_freq, the frequencies the model runs
  // with) against the file's.
  kernels::RotaryFrequencies unscaled{float(theta)}, scaled{float(theta)};
  scaled.scaling = kernels::RotaryFrequencies::Scaling::llama3;
  scaled.factor = factor;
  scaled.low_freq_factor = 1.0;
  scaled.high_freq_factor = high;
  scaled.original_max_positions = int64_t(original);
  for (int64_t i = 0; i < n; ++i) {
    const double want =
        double(kernels::rotary_inv_freq(i, rotary, unscaled)) / double(kernels::rotary_inv_freq(i, rotary, scaled));
    if (std::abs(want - double(ff[i])) > tol * want)
      return Status::error(Code::kUnimplemented, what,
                           "the factors of Llama 3's rope scaling (factor " + std::to_string(factor) +
                               ", high_freq_factor " + std::to_string(high) + ", original_max_position_embeddings " +
                               std::to_string(int64_t(original)) + " fit the others)",
                           "factor " + std::to_string(ff[i]) + " at frequency " + std::to_string(i) + ", not " +
                               std::to_string(want));
  }
  return nlohmann::ordered_json{{"rope_type", "llama3"},   {"rope_theta", theta},
                                {"factor", factor},        {"low_freq_factor", 1.0},
                                {"high_freq_factor", high}, {"original_max_position_embeddings", int64_t(original)}};
}

// Llama's config.json (transformers 5's keys) from llama.* metadata.
Result<std::string> llama_config_json(const io::GgufFile& f) {
  nlohmann::ordered_json j;
  j["model_type"] = "llama";
  j["architectures"] = {"LlamaForCausalLM"};
  const std::pair<const char*, const char*> keys[] = {{"max_position_embeddings", "llama.context_length"},
                                                      {"hidden_size", "llama.embedding_length"},
                                                      {"intermediate_size", "llama.feed_forward_length"},
                                                      {"num_hidden_layers", "llama.block_count"},
                                                      {"num_attention_heads", "llama.attention.head_count"}};
  ASPEN_RETURN_IF_ERROR(add_common_config(f, keys, j));
  auto optional = [&](const char* key) -> std::optional<double> {
    const io::GgufValue* v = f.find_metadata(key);
    return v ? number(*v) : std::nullopt;
  };
  j["num_key_value_heads"] = int64_t(optional("llama.attention.head_count_kv").value_or(j["num_attention_heads"]));
  if (const std::optional<double> d = optional("llama.attention.key_length")) j["head_dim"] = int64_t(*d);
  ASPEN_ASSIGN_OR_RETURN(const double eps, required_number(f, "llama.attention.layer_norm_rms_epsilon"));
  j["rms_norm_eps"] = eps;
  if (const std::optional<double> w = optional("llama.attention.sliding_window"); w && *w > 0)
    return Status::error(Code::kUnimplemented, f.path() + ": llama.attention.sliding_window",
                         "0 (a sliding window is not read from GGUF yet)", std::to_string(int64_t(*w)));
  const double theta = optional("llama.rope.freq_base").value_or(10000.0);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
  if (const io::GgufValue* v = f.find_metadata("llama.rope.scaling.type");
      v && v->kind == io::GgufValue::Kind::string && v->s != "none") {
    if (v->s != "linear")
      return Status::error(Code::kUnimplemented, f.path() + ": llama.rope.scaling.type",
                           "none or linear (others are not read yet)", quoted(v->s));
    ASPEN_ASSIGN_OR_RETURN(const double factor, required_number(f, "llama.rope.scaling.factor"));
    j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", theta}, {"factor", factor}};
  }
  if (f.find("rope_freqs.weight")) {
    const int64_t head_dim = j.contains("head_dim") ? j["head_dim"].get<int64_t>()
                                                    : j["hidden_size"].get<int64_t>() / j["num_attention_heads"].get<int64_t>();
    const int64_t rotary = int64_t(optional("llama.rope.dimension_count").value_or(double(head_dim)));
    ASPEN_ASSIGN_OR_RETURN(j["rope_parameters"], llama3_rope(f, theta, rotary));
  }
  j["hidden_act"] = "silu";
  return j.dump();
}

// Where a parameter lives in the file: llama.cpp's name, whether the stored matrix is the parameter transposed,
// and over how many heads its rows are in the converter's rotary order (0: as Hugging Face's).
struct TensorAt {
  std::string name;
  bool transpose = false;
  int64_t rope_heads = 0;
};

// A layer's parameter "<prefix><layer>.<rest>" as llama.cpp names it, "blk.<layer>.<part><leaf>": `parts` maps
// the family's names of rest without ".weight" / ".bias" to llama.cpp's; null when p is none of them.
const std::pair<const char*, const char*>* layer_part(const std::string& p, const std::string& prefix,
                                                     std::span<const std::pair<const char*, const char*>> parts,
                                                     std::string* name, std::string* leaf) {
  if (p.compare(0, prefix.size(), prefix) != 0) return nullptr;
  const size_t dot = p.find('.', prefix.size());
  if (dot == std::string::npos) return nullptr;
  const std::string layer = p.substr(prefix.size(), dot - prefix.size()), rest = p.substr(dot + 1);
  for (const auto& part : parts)
    for (const char* l : {".weight", ".bias"})
      if (rest == std::string(part.first) + l) {
        *name = "blk." + layer + "." + part.second + l;
        *leaf = l;
        return &part;
      }
  return nullptr;
}

// llama.cpp's name for aspen's Llama parameter (Hugging Face's names; no transposes). The converter reorders
// q_proj's and k_proj's rows (weights and biases alike) for its rotary layout.
std::optional<TensorAt> llama_tensor(const std::string& p, const LlamaConfig& c) {
  static const std::pair<const char*, const char*> whole[] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                              {"model.norm.weight", "output_norm.weight"},
                                                              {"lm_head.weight", "output.weight"}};
  for (const auto& [hf, gg] : whole)
    if (p == hf) return TensorAt{gg};
  static const std::pair<const char*, const char*> parts[] = {
      {"input_layernorm", "attn_norm"},     {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},       {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},       {"self_attn.o_proj", "attn_output"},
      {"mlp.gate_proj", "ffn_gate"},        {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  std::string name, leaf;
  const auto* part = layer_part(p, "model.layers.", parts, &name, &leaf);
  if (!part) return std::nullopt;
  const std::string hf = part->first;
  const int64_t heads = hf == "self_attn.q_proj" ? c.n_head : hf == "self_attn.k_proj" ? c.kv_heads() : 0;
  return TensorAt{name, false, heads};
}

// llama.cpp's name for aspen's GPT-2 parameter; its Conv1D matrices are stored transposed.
std::optional<TensorAt> gpt2_tensor(const std::string& p) {
  static const std::pair<const char*, const char*> whole[] = {{"transformer.wte.weight", "token_embd.weight"},
                                                              {"transformer.wpe.weight", "position_embd.weight"},
                                                              {"transformer.ln_f.weight", "output_norm.weight"},
                                                              {"transformer.ln_f.bias", "output_norm.bias"},
                                                              {"lm_head.weight", "output.weight"}};
  for (const auto& [hf, gg] : whole)
    if (p == hf) return TensorAt{gg};
  static const std::pair<const char*, const char*> parts[] = {
      {"ln_1", "attn_norm"},          {"ln_2", "ffn_norm"},   {"attn.c_attn", "attn_qkv"},
      {"attn.c_proj", "attn_output"}, {"mlp.c_fc", "ffn_up"}, {"mlp.c_proj", "ffn_down"}};
  std::string name, leaf;
  const auto* part = layer_part(p, "transformer.h.", parts, &name, &leaf);
  if (!part) return std::nullopt;
  const bool conv1d = std::string(part->first).find("c_") != std::string::npos && leaf == ".weight";
  return TensorAt{name, conv1d};
}

}  // namespace

Result<Checkpoint> Checkpoint::open_gguf(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(io::GgufFile file, io::GgufFile::open(path));
  const io::GgufValue* arch = file.find_metadata("general.architecture");
  const std::string name = arch && arch->kind == io::GgufValue::Kind::string ? arch->s : "";
  if (name != "gpt2" && name != "llama")
    return Status::error(Code::kUnimplemented, path + ": general.architecture",
                         "gpt2 or llama (GGUF models of other families are not read yet)",
                         name.empty() ? std::string("none") : quoted(name));
  ASPEN_ASSIGN_OR_RETURN(std::string json, name == "gpt2" ? gpt2_config_json(file) : llama_config_json(file));
  Checkpoint c;
  c.dir_ = std::filesystem::path(path).parent_path().string();
  c.weights_path_ = path;
  ASPEN_ASSIGN_OR_RETURN(c.config_, parse_config(json, path));
  c.gguf_ = std::make_unique<io::GgufFile>(std::move(file));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& model) {
  if (!is_gguf_path(model)) return load_config((std::filesystem::path(model) / "config.json").string());
  ASPEN_ASSIGN_OR_RETURN(Checkpoint c, Checkpoint::open_gguf(model));
  return c.config();
}

Result<std::unique_ptr<io::Tokenizer>> load_model_tokenizer(const std::string& model) {
  if (!is_gguf_path(model)) return io::load_tokenizer(model);
  ASPEN_ASSIGN_OR_RETURN(io::GgufFile file, io::GgufFile::open(model));
  return io::load_gguf_tokenizer(file);
}

namespace {

// The graph's format name of a ggml block type matmul_q multiplies by ("" for the others).
std::string block_format(uint32_t type) {
  switch (io::GgmlType(type)) {
    case io::GgmlType::q8_0:
      return "q8_0";
    case io::GgmlType::q4_0:
      return "q4_0";
    case io::GgmlType::q4_k:
      return "q4_k";
    default:
      return "";
  }
}

// The GGUF tensor of a GPT-2 or Llama parameter (the head: output.weight, else the tied token embedding).
std::optional<TensorAt> tensor_of(const io::GgufFile& f, const ModelConfig& config, const std::string& parameter) {
  std::optional<TensorAt> at;
  if (const LlamaConfig* c = config.llama()) at = llama_tensor(parameter, *c);
  else at = gpt2_tensor(parameter);
  if (at && parameter == "lm_head.weight" && !f.find(at->name)) at->name = "token_embd.weight";
  return at;
}

// The converter's rotary row order put back: per head of d rows, stored row 2i + t is Hugging Face's row
// t (d / 2) + i (t = 0, 1). `rows` rows of `row_bytes` bytes each (values or blocks).
void unpermute_rope_rows(std::byte* data, int64_t rows, size_t row_bytes, int64_t heads) {
  const int64_t d = rows / heads;
  std::vector<std::byte> head(size_t(d) * row_bytes);
  for (int64_t h = 0; h < heads; ++h) {
    std::byte* base = data + size_t(h * d) * row_bytes;
    std::memcpy(head.data(), base, head.size());
    for (int64_t i = 0; i < d / 2; ++i)
      for (int64_t t = 0; t < 2; ++t)
        std::memcpy(base + size_t(t * (d / 2) + i) * row_bytes, head.data() + size_t(2 * i + t) * row_bytes,
                    row_bytes);
  }
}

}  // namespace

Result<QuantizedWeights> gguf_quantized_weights(const Checkpoint& ckpt) {
  QuantizedWeights q;
  const io::GgufFile* f = ckpt.gguf();
  if (!f) return q;
  std::vector<std::string> names = {"lm_head.weight"};
  if (const Gpt2Config* g = ckpt.config().gpt2()) {
    for (int64_t i = 0; i < g->n_layer; ++i)
      for (const char* part : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
        names.push_back("transformer.h." + std::to_string(i) + "." + part + ".weight");
  } else if (const LlamaConfig* c = ckpt.config().llama()) {
    for (int64_t i = 0; i < c->n_layer; ++i)
      for (const char* part : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
        names.push_back("model.layers." + std::to_string(i) + "." + part + ".weight");
  } else {
    return q;
  }
  for (const std::string& name : names) {
    const std::optional<TensorAt> at = tensor_of(*f, ckpt.config(), name);
    const io::GgufTensor* t = at ? f->find(at->name) : nullptr;
    if (!t || t->extents.size() != 2) continue;  // plan_weights names what is missing
    const std::string format = block_format(t->type);
    if (!format.empty() && quantized_row_bytes(format, t->extents[0]) > 0) q.format[name] = format;
  }
  return q;
}

Result<WeightBinding> gguf_binding(const Checkpoint& ckpt, WeightBinding w) {
  const io::GgufFile& f = *ckpt.gguf();
  const std::optional<TensorAt> at = tensor_of(f, ckpt.config(), w.parameter);
  if (!at)
    return Status::error(Code::kNotFound, f.path() + ": parameter '" + w.parameter + "'",
                         "one llama.cpp names (a GPT-2 or Llama graph's)", "a name it has none for");
  const io::GgufTensor* t = f.find(at->name);
  if (!t)
    return Status::error(Code::kNotFound, f.path() + ": tensor '" + at->name + "'",
                         "present (the graph's parameter '" + w.parameter + "', " + w.type.to_string() + ")", "none");
  if (w.type.dtype == DType::u8) {  // NOTE [quantized linears]: the blocks as stored, rows [out, in]
    const std::string format = block_format(t->type);
    const int64_t K = t->extents[0], N = t->extents.size() == 2 ? t->extents[1] : 0;
    if (format.empty() || N != w.type.shape[0] || quantized_row_bytes(format, K) != w.type.shape[1])
      return Status::invalid_argument(
          f.path() + ": tensor '" + t->name + "'",
          "blocks for the graph's parameter '" + w.parameter + "' (u8 " + w.type.shape.to_string() + ")",
          io::ggml_type_name(t->type) + " " + t->shape().to_string());
    w.tensor = t->name;
    w.gguf = &f;
    w.gguf_tensor = t;
    w.gguf_rope_heads = at->rope_heads;
    return w;
  }
  Shape want = w.type.shape;
  if (at->transpose) {
    if (want.rank() != 2)
      return Status::error(Code::kInternal, "parameter '" + w.parameter + "'", "a matrix", want.to_string());
    want = Shape{want[1], want[0]};
  }
  if (t->shape() != want)
    return Status::invalid_argument(f.path() + ": tensor '" + t->name + "'",
                                    "shape " + want.to_string() + " (the graph's parameter '" + w.parameter + "'" +
                                        (at->transpose ? ", stored transposed" : "") + ")",
                                    t->shape().to_string());
  if (at->rope_heads > 0 && (want[0] % (2 * at->rope_heads) != 0))
    return Status::invalid_argument(f.path() + ": tensor '" + t->name + "'",
                                    "rows in whole heads of " + std::to_string(at->rope_heads) + " (even each)",
                                    t->shape().to_string());
  w.tensor = t->name;
  w.gguf = &f;
  w.gguf_tensor = t;
  w.transpose = at->transpose;
  w.gguf_rope_heads = at->rope_heads;
  return w;
}

Result<Tensor> read_gguf_weight(const WeightBinding& w) {
  if (w.type.dtype == DType::u8) {  // the blocks, byte for byte
    const std::span<const std::byte> bytes = w.gguf->data(*w.gguf_tensor);
    ASPEN_ASSIGN_OR_RETURN(Tensor out, Tensor::make_uninitialized(DType::u8, w.type.shape));
    if (bytes.size() != out.nbytes())
      return Status::error(Code::kInternal, "parameter '" + w.parameter + "'", std::to_string(out.nbytes()) + " bytes",
                           std::to_string(bytes.size()));
    std::memcpy(out.raw(), bytes.data(), bytes.size());
    if (w.gguf_rope_heads > 0)
      unpermute_rope_rows(static_cast<std::byte*>(out.raw()), w.type.shape[0], size_t(w.type.shape[1]),
                          w.gguf_rope_heads);
    return out;
  }
  ASPEN_ASSIGN_OR_RETURN(Tensor values, w.gguf->read_f32(w.gguf_tensor->name));
  if (w.gguf_rope_heads > 0) {
    const int64_t rows = values.shape()[0];
    unpermute_rope_rows(static_cast<std::byte*>(values.raw()), rows, size_t(values.numel() / rows) * sizeof(float),
                        w.gguf_rope_heads);
  }
  Tensor f32;
  if (w.transpose) {  // stored [N, K] rows, the parameter [K, N]
    const int64_t N = values.shape()[0], K = values.shape()[1];
    ASPEN_ASSIGN_OR_RETURN(f32, Tensor::make_uninitialized(DType::f32, Shape{K, N}));
    const float* src = values.data<float>();
    float* dst = f32.data<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) dst[k * N + n] = src[n * K + k];
  } else {
    f32 = std::move(values);
  }
  if (w.type.dtype == DType::f32) return f32;
  ASPEN_ASSIGN_OR_RETURN(Tensor out, Tensor::make_uninitialized(w.type.dtype, w.type.shape));
  ASPEN_RETURN_IF_ERROR(narrow_into(f32.span<float>(), out));
  return out;
}

}  // namespace aspen::models
