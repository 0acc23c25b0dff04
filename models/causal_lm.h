// models/causal_lm.h: the causal language model graph of whichever family a
// config holds (gpt2, gptj, the Llama family), for the callers that take any
// of them: generation, training, the Python package, tests and benches.
//
//   ASPEN_RETURN_IF_ERROR(build_causal_lm(b, config, {.batch = 4, .seq = 256, .with_loss = true}));
#pragma once

#include "core/status.h"
#include "graph/builder.h"
#include "models/blocks.h"
#include "models/config.h"

namespace aspen::models {

// Records the family's graph (models/gpt2.h, gptj.h, llama.h: the same inputs
// and outputs). InvalidArgument naming the config and its model_type when it
// is not a causal LM (bert).
Status build_causal_lm(graph::Builder& b, const ModelConfig& config, const CausalLmOptions& options);

}  // namespace aspen::models
