// models/weights.h: a Hugging Face model directory (config.json and
// safetensors weights) and the tensors it gives a graph's parameters.
//
//   ASPEN_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open("models/gpt2"));
//   ... build the graph from ckpt.config() ...
//   ASPEN_ASSIGN_OR_RETURN(WeightPlan plan, plan_weights(graph, ckpt));
//   ASPEN_RETURN_IF_ERROR(load_weights(plan, [&](const std::string& name, const Tensor& t) {
//     return session->set_parameter(name, t);
//   }));
//
// A directory holds config.json and either model.safetensors or a sharded
// model.safetensors.index.json (read through io::SafetensorsIndex).
//
// plan_weights binds every parameter of the graph to one checkpoint tensor
// before anything is read, so a bad checkpoint fails before a session is half
// loaded. The graph uses the family's own names (gpt2.h, gptj.h, bert.h); a
// checkpoint may also carry them as
//   gpt2, gptj: without "transformer." (GPT2Model / GPTJModel checkpoints),
//   bert:       with "bert." (BertForX checkpoints), and LayerNorm
//               ".gamma"/".beta" for ".weight"/".bias" (old conversions).
// Tied embeddings need nothing: the GPT-2 graph reads transformer.wte.weight
// for its head. Every parameter must be present with the exact shape, in f32,
// bf16 or f16 (converted to the parameter's dtype when read). Checkpoint
// tensors the graph does not use are listed in WeightPlan::unused and logged
// as a warning, except buffers and heads known to be unused on purpose
// (GPT-2/GPT-J attn.bias and attn.masked_bias, BERT's position_ids, a tied
// lm_head.weight, BERT's pooler when the graph has none).
//
// export_hf_model is the other direction: it writes a directory that
// transformers' from_pretrained (and Checkpoint::open) loads unchanged.
//
// Reading converts straight from the memory-mapped file into the tensor
// handed on: load_weights streams one tensor at a time, so loading never holds
// a second copy of the model (not even the file's pages: each tensor's are
// dropped from resident memory once copied, NOTE [pages read once] in core/file.h).
//
// Thread-safety: a Checkpoint is immutable once opened; a WeightPlan points
// into it and is valid while it lives.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "models/config.h"

namespace aspen::models {

class Checkpoint {
 public:
  // Reads <dir>/config.json and opens the weights; errors name the file. A path ending in ".gguf" is a
  // llama.cpp GGUF file instead (open_gguf).
  static Result<Checkpoint> open(const std::string& dir);
  // NOTE [GGUF models] (models/gguf_checkpoint.cc): the config from the file's metadata, the weights from its
  // tensors under llama.cpp's names, dequantized when read. GPT-2 and Llama; other architectures are refused
  // by name.
  static Result<Checkpoint> open_gguf(const std::string& path);
  const io::GgufFile* gguf() const { return gguf_.get(); }

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  // model.safetensors or model.safetensors.index.json.
  const std::string& weights_path() const { return weights_path_; }
  std::vector<std::string> tensor_names() const;  // sorted
  // (shard, tensor), or (nullptr, nullptr) when absent.
  std::pair<const io::SafetensorsFile*, const io::TensorInfo*> find(const std::string& name) const;

 private:
  Checkpoint() = default;
  std::string dir_, weights_path_;
  ModelConfig config_;
  std::unique_ptr<io::SafetensorsFile> file_;    // one file, or
  std::unique_ptr<io::SafetensorsIndex> index_;  // a sharded checkpoint
  std::unique_ptr<io::GgufFile> gguf_;           // or a GGUF file
};

// A model given as a directory (config.json, tokenizer files) or a GGUF file (its metadata): its config and its
// tokenizer, as `aspen generate --model` takes either.
Result<ModelConfig> load_model_config(const std::string& model);
// A GGUF checkpoint's matrices kept in their blocks (NOTE [quantized linears] in models/blocks.h): those whose
// type the graph's matmul_q takes (Q8_0, Q4_0, Q4_K); the others load dequantized. Empty for other checkpoints.
struct QuantizedWeights;
Result<QuantizedWeights> gguf_quantized_weights(const Checkpoint& ckpt);
Result<std::unique_ptr<io::Tokenizer>> load_model_tokenizer(const std::string& model);

// One parameter bound to the checkpoint tensor that fills it.
struct WeightBinding {
  std::string parameter;   // the graph's name
  std::string tensor;      // the checkpoint's name
  graph::TensorType type;  // the parameter's dtype and shape
  const io::SafetensorsFile* file = nullptr;
  const io::TensorInfo* info = nullptr;
  // A GGUF checkpoint's tensor instead (file and info null); transposed: stored [N, K] for a [K, N] parameter.
  const io::GgufFile* gguf = nullptr;
  const io::GgufTensor* gguf_tensor = nullptr;
  bool transpose = false;
  // llama.cpp's converter reorders a Llama q_proj's or k_proj's rows for its rotary layout (per head, the two
  // halves interleaved); > 0: put them back, over this many heads (NOTE [GGUF models]).
  int64_t gguf_rope_heads = 0;
};

struct WeightPlan {
  std::vector<WeightBinding> bindings;  // in the graph's parameter order
  std::vector<std::string> unused;      // checkpoint tensors no parameter reads (sorted; ignorable ones left out)
};

// Binds every parameter of `g` (see the header comment for names, shapes and dtypes).
Result<WeightPlan> plan_weights(const graph::Graph& g, const Checkpoint& ckpt);

// The bound tensor, converted to the parameter's dtype (the file's pages of it then dropped from resident memory).
Result<Tensor> read_weight(const WeightBinding& w);

// Reads each bound tensor in turn and hands it to `sink` (then frees it). A tensor stored in the parameter's
// dtype reaches `sink` as a view of the file's mapping (valid during the call; copy it): no copy is made
// for it before the sink's own. With `into`, such a tensor is copied straight into the tensor `into` gives for
// its parameter (when not null and of the parameter's type) instead, a few MiB at a time, each part's pages
// dropped once copied: loading then holds the parameters and a few MiB of the file, never a whole tensor twice.
using WeightDestination = std::function<Tensor*(const std::string& parameter)>;
Status load_weights(const WeightPlan& plan, const std::function<Status(const std::string&, const Tensor&)>& sink,
                    const WeightDestination& into = {});

// Every parameter's tensor by name (holds the whole model: for tests and small models).
Result<std::map<std::string, Tensor>> read_weights(const graph::Graph& g, const Checkpoint& ckpt);

// Writes a Hugging Face model directory (created if missing) that
// transformers.AutoModelForCausalLM (BERT: AutoModelForMaskedLM).from_pretrained
// loads unchanged:
//   config.json        to_hf_config_json(config),
//   model.safetensors  `weights` by name and dtype as given, metadata format=pt;
//                      lm_head.weight is left out when the config ties it to
//                      transformer.wte.weight (transformers re-ties it); a
//                      BERT's encoder goes under "bert." beside its cls.*
//                      head, as BertForMaskedLM names them (InvalidArgument
//                      without the head),
//   tokenizer files    copied from `tokenizer_dir` when given: whichever of
//                      tokenizer.json, vocab.json, merges.txt, vocab.txt,
//                      tokenizer_config.json, special_tokens_map.json exist
//                      (NotFound when none does).
// Each file is written atomically; config.json goes last, so a directory with
// a config.json from this call has all of its files. Other files in `dir` are
// left alone. Errors name the file.
Status export_hf_model(const std::string& dir, const ModelConfig& config, const std::map<std::string, Tensor>& weights,
                       const std::string& tokenizer_dir = "");

}  // namespace aspen::models
