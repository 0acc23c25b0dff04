// models/init.h: fresh weights for a model trained from scratch, as Hugging
// Face initializes GPT-2 and GPT-J (_init_weights):
//   *.bias                     zeros
//   norm weights               ones (LayerNorm: ln_*, *LayerNorm*; RMSNorm: *layernorm*, *norm.weight)
//   everything else            normal(0, std)   (embeddings, projections, the LM head)
//   GPT-2's c_proj.weight      normal(0, std / sqrt(2 · n_layer))   (GPT-2's scaled residual init)
// Each parameter draws from its own Philox stream, keyed by the seed and a
// hash of its name, so the values do not depend on the order of parameters
// or the thread count. Parameters named "state.*" (program state) are skipped.
//
// Thread-safety: pure function of its arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/graph.h"

namespace aspen::models {

struct InitOptions {
  uint64_t seed = 0;
  double std = 0.02;             // HF's initializer_range
  int64_t n_layer = 1;           // for the scaled residual init
  bool scaled_residual = false;  // GPT-2's c_proj rule
};

// Every f32 parameter of `g` (weights, by their names), freshly drawn.
Result<std::map<std::string, Tensor>> init_weights(const graph::Graph& g, const InitOptions& options);

}  // namespace aspen::models
