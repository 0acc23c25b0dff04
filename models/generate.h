// models/generate.h: text generation with a KV cache, compiled once.
//
//   auto gen = Generator::open("models/testdata/gptj-tiny", {.max_batch = 2, .max_length = 48});
//   SamplingOptions s{.max_new_tokens = 32, .temperature = 0};          // greedy
//   auto ids = (*gen)->generate({{464, 2068, 7586}, {40}}, s);           // one continuation per prompt
//
// Two programs share one session (runtime/session.h): the prefill, compiled
// for [max_batch, max_prompt], and the decode step, compiled for
// [max_batch, 1]; both read the weights and the KV cache (parameters
// "state.cache.<layer>.key/value", models/blocks.h) and end in the `sample`
// op, so tokens are drawn inside the program. Nothing is recompiled between
// calls, whatever the prompts or the sampling settings.
//
// A batch of prompts of different lengths is left-padded to max_prompt (as
// Hugging Face's generate does for decoder-only models): positions count
// real tokens only (cumsum(mask) - 1, pads at 0), pads are never attended,
// and every row's newest token sits at the same cache index, so one decode
// program serves the batch. Rows beyond the prompts run as padding and are
// dropped. A row stops at a stop token (kept in its output) or after
// max_new_tokens; the call ends when every row has stopped.
//
// Sampling: temperature 0 is greedy (ties: the lowest id); otherwise
// repetition penalty, temperature, top-k, top-p, then a draw keyed by
// (seed, step, row): the same seed and prompts give the same text
// (kernels/sampling.h). The repetition penalty sees the prompt's tokens (not
// its padding) and everything generated since.
//
// Thread-safety: one generate() at a time per Generator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compiler/pass.h"
#include "core/status.h"
#include "models/config.h"
#include "parallel/threads/threads_communicator.h"
#include "runtime/session.h"

namespace aspen::models {

// What a causal LM's inference programs (generation, models/perplexity.h) hold per parameter with matrices in
// `weights` (f32 or bf16): the bound for check_fits_memory.
double inference_bytes_per_parameter(DType weights);

struct GeneratorOptions {
  int64_t max_batch = 1;   // prompts per generate() call
  int64_t max_length = 0;  // cache positions: prompt + new tokens; 0: the model's n_positions
  int64_t max_prompt = 0;  // the prefill's length (longest prompt); 0: half of max_length
  int threads = 0;         // 0: the free cores
  DType weights = DType::f32;  // f32, or bf16: matrices in bf16 under f32 activations (half the bytes per step)
  compiler::CompileOptions compile = {};
  profile::TraceRecorder* trace = nullptr;  // when set, every instruction of every step is recorded
  // > 1: Megatron tensor shards over this many devices of the process (gpt2, gptj;
  // models/tensor_parallel.h): each holds its heads' KV cache and weights.
  int64_t tensor_parallel = 1;
  // With tensor_parallel > 1: the vocabulary split over the shards too (the
  // tied embedding and LM head; CausalLmOptions::vocab_parallel).
  bool vocab_parallel = false;
};

struct SamplingOptions {
  int64_t max_new_tokens = 32;
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens = {};  // e.g. the config's eos ids
  // Called for every new token as soon as it is drawn (streaming); returning
  // false stops the whole call after this step.
  std::function<bool(int64_t row, int32_t token)> on_token = {};
};

class Generator {
 public:
  // A GPT-2 or GPT-J model directory (config.json and the weights).
  static Result<std::unique_ptr<Generator>> open(const std::string& dir, const GeneratorOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const GeneratorOptions& options() const { return options_; }
  int64_t vocab() const { return vocab_; }
  // Program 0: the prefill; 1: the decode step.
  const runtime::Session& session() const { return *session_; }

  // One continuation per prompt (the new tokens only). Errors: no prompts or
  // more than max_batch, an empty prompt, a prompt longer than max_prompt, an
  // id outside the vocabulary, prompt + max_new_tokens beyond max_length, bad
  // sampling settings — each a Status naming it.
  Result<std::vector<std::vector<int32_t>>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                                     const SamplingOptions& sampling);

 private:
  Generator() = default;
  GeneratorOptions options_;
  int64_t window_ = 0;  // the model's sliding window (0: none)
  ModelConfig config_;
  int64_t vocab_ = 0, n_positions_ = 0;
  std::unique_ptr<runtime::Session> session_;  // program 0: prefill, 1: decode
  std::vector<std::unique_ptr<parallel::ThreadsCommunicator>> tensor_comms_;  // tensor shards' group
  // Runs `program` on every tensor shard (the same inputs) and returns shard 0's outputs.
  Result<std::map<std::string, Tensor>> run_shards(const std::map<std::string, const Tensor*>& in, int program);
};

}  // namespace aspen::models
