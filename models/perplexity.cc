#include "models/perplexity.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "compiler/executable.h"
#include "graph/builder.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/weights.h"
#include "runtime/session.h"

namespace aspen::models {

Result<PerplexityResult> perplexity(const std::string& model, std::span<const int32_t> tokens,
                                    const PerplexityOptions& options) {
  ASPEN_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(model));
  const ModelConfig& config = ckpt.config();  // not a causal LM: build_causal_lm names its model_type
  ASPEN_RETURN_IF_ERROR(check_fits_memory(config.path, min_parameter_count(config),
                                          inference_bytes_per_parameter(options.weights), "its weights"));
  const int64_t vocab = config.vocab(), positions = config.n_positions();
  const int64_t ctx = options.ctx > 0 ? options.ctx : std::min<int64_t>(positions, 512);
  if (ctx < 4 || ctx > positions)
    return Status::invalid_argument("perplexity: ctx",
                                    "a window in [4, n_positions = " + std::to_string(positions) + "]",
                                    std::to_string(ctx));
  const int64_t windows = int64_t(tokens.size()) / ctx;
  if (windows < 1)
    return Status::invalid_argument("perplexity: tokens", "at least one window of " + std::to_string(ctx),
                                    std::to_string(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return Status::invalid_argument("perplexity: token " + std::to_string(i),
                                      "an id in [0, " + std::to_string(vocab) + ")", std::to_string(tokens[i]));

  // One window's logits at every position: the model's own graph, its matrices as the generator keeps them
  // (NOTE [quantized linears]: a GGUF file's blocks multiplied as they are).
  ASPEN_ASSIGN_OR_RETURN(const QuantizedWeights quantized, gguf_quantized_weights(ckpt));
  graph::Graph g;
  {
    graph::Builder b(g);
    CausalLmOptions lm{.batch = 1, .seq = ctx};
    if (options.weights != DType::f32) lm.weight_dtype = options.weights;
    if (!quantized.format.empty() && options.keep_blocks) lm.quantized = &quantized;
    ASPEN_RETURN_IF_ERROR(build_causal_lm(b, config, lm));
  }
  compiler::CompileOptions co;
  co.hoist_weights = true;
  ASPEN_ASSIGN_OR_RETURN(auto exe, compiler::compile(g, co));
  runtime::SessionOptions so;
  so.threads = options.threads;
  ASPEN_ASSIGN_OR_RETURN(auto session, runtime::Session::create(std::move(exe), so));
  ASPEN_ASSIGN_OR_RETURN(WeightPlan plan, plan_weights(g, ckpt));
  ASPEN_RETURN_IF_ERROR(load_weights(
      plan, [&](const std::string& name, const Tensor& t) { return session->set_parameter(name, t); },
      [&](const std::string& name) { return session->replicas() == 1 ? session->parameter_of(0, name) : nullptr; }));

  Tensor ids(DType::i32, Shape{1, ctx}), pos(DType::i32, Shape{1, ctx});
  for (int64_t t = 0; t < ctx; ++t) pos.data<int32_t>()[t] = int32_t(t);
  PerplexityResult r;
  for (int64_t w = 0; w < windows; ++w) {
    const int32_t* window = tokens.data() + w * ctx;
    std::memcpy(ids.raw(), window, size_t(ctx) * sizeof(int32_t));
    ASPEN_ASSIGN_OR_RETURN(auto out, session->run({{"input_ids", &ids}, {"positions", &pos}}));
    const auto it = out.find("logits");
    if (it == out.end() || it->second.dtype() != DType::f32 || it->second.shape().numel() != ctx * vocab)
      return Status::error(Code::kInternal, "perplexity: the program's logits", "f32 [1, ctx, vocab]",
                           it == out.end() ? "none"
                                           : std::string(dtype_name(it->second.dtype())) +
                                                 it->second.shape().to_string());
    const float* logits = it->second.data<float>();
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      const float* row = logits + j * vocab;
      const double top = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - top);
      r.nll += std::log(sum) + top - double(row[window[j + 1]]);
      ++r.scored;
    }
    ++r.windows;
  }
  return r;
}

}  // namespace aspen::models
