#include "models/causal_lm.h"

namespace aspen::models {

Status build_causal_lm(graph::Builder& b, const ModelConfig& config, const CausalLmOptions& options) {
  if (const Gpt2Config* c = config.gpt2()) return build_gpt2(b, *c, options).status();
  if (const GptjConfig* c = config.gptj()) return build_gptj(b, *c, options).status();
  if (const LlamaConfig* c = config.llama()) return build_llama(b, *c, options).status();
  return Status::invalid_argument(config.path + ": model_type",
                                  "a causal language model (gpt2, gptj, llama, mistral, qwen2)",
                                  "'" + config.model_type + "'");
}

}  // namespace aspen::models
