// models/perplexity.h: a causal language model's perplexity on a text, by llama.cpp's method (llama-perplexity),
// so that the two can be compared on the same file (W3.4: quantized weights cost how much accuracy).
//
// The tokens are cut into windows of `ctx` tokens (the last partial window is dropped); each window runs
// alone from position 0, and only its second half is scored: for each position j in [ctx / 2, ctx - 1), the
// negative log-likelihood of token j + 1 under the logits at j (log-softmax in f64). perplexity =
// exp(Σ nll / scored). Every token scored sees at least ctx / 2 tokens of context. (llama.cpp also puts a BOS
// token first in each window when the vocabulary asks for one; GPT-2's does not.)
//
//   ASPEN_ASSIGN_OR_RETURN(auto r, models::perplexity("model.gguf", ids, {.ctx = 128}));
//   std::cout << r.perplexity();
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::models {

struct PerplexityOptions {
  int64_t ctx = 0;             // tokens per window; 0: min(the model's n_positions, 512)
  int threads = 0;             // 0: the free cores
  DType weights = DType::f32;  // f32, or bf16 matrices (a GGUF file's quantized ones stay in their blocks)
  // A GGUF file's quantized matrices multiplied in their blocks (matmul_q, as aspen generate runs them); false:
  // widened to f32 when read (ggml's dequantized values), to see what the blocks' products cost.
  bool keep_blocks = true;
};

struct PerplexityResult {
  double nll = 0;        // Σ over the scored tokens of -log p
  int64_t scored = 0;    // tokens scored
  int64_t windows = 0;   // windows run
  double perplexity() const { return scored ? std::exp(nll / double(scored)) : 0.0; }
};

// `model`: what models::Generator opens (a Hugging Face directory, a GGUF file). InvalidArgument naming ctx
// (below 4 or beyond n_positions), the tokens (fewer than one window, an id outside the vocabulary).
Result<PerplexityResult> perplexity(const std::string& model, std::span<const int32_t> tokens,
                                    const PerplexityOptions& options = {});

}  // namespace aspen::models
