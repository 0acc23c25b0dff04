// tools/perplexity_command.cc: `aspen perplexity`, a model's perplexity on a text file.
//
//   aspen perplexity --model DIR|FILE.gguf --text FILE [--ctx N] [--threads N] [--dtype f32|bf16] [--json]
//
// The text is tokenized by the model's own tokenizer (as `aspen generate` does, no special tokens added) and
// scored by models::perplexity: windows of --ctx tokens, each window's second half scored (llama.cpp's
// llama-perplexity method, so the two compare on the same GGUF file). Prints the perplexity and what was
// scored; --json prints one JSON object.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "io/tokenizer.h"
#include "models/perplexity.h"
#include "models/weights.h"
#include "tools/commands.h"

namespace aspen::tools {

namespace {

struct PerplexityArgs {
  std::string model, text, dtype = "f32";
  int64_t ctx = 0;
  int threads = 0;
  bool json = false;
};

int run_perplexity(const PerplexityArgs& a) {
  auto text = read_regular_file(a.text);
  if (!text.is_ok()) return report(text.status());
  auto tokenizer = models::load_model_tokenizer(a.model);
  if (!tokenizer.is_ok()) return report(tokenizer.status());
  const std::vector<io::TokenId> ids = (*tokenizer)->encode(*text, /*add_special_tokens=*/false);
  const std::vector<int32_t> tokens(ids.begin(), ids.end());
  models::PerplexityOptions o{.ctx = a.ctx, .threads = a.threads,
                              .weights = a.dtype == "bf16" ? DType::bf16 : DType::f32};
  auto r = models::perplexity(a.model, tokens, o);
  if (!r.is_ok()) return report(r.status());
  if (a.json) {
    std::cout << nlohmann::ordered_json{{"model", a.model},           {"text", a.text},
                                        {"tokens", tokens.size()},      {"windows", r->windows},
                                        {"scored", r->scored},          {"nll", r->nll},
                                        {"perplexity", r->perplexity()}}
                     .dump()
              << "\n";
  } else {
    std::printf("perplexity %.4f over %lld tokens (%lld windows, %zu tokens of text)\n", r->perplexity(),
                static_cast<long long>(r->scored), static_cast<long long>(r->windows), tokens.size());
  }
  return 0;
}

}  // namespace

Command add_perplexity_command(CLI::App& app) {
  auto args = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "a causal LM's perplexity on a text file (llama.cpp's method)");
  cmd->add_option("--model", args->model, "model directory, or a llama.cpp GGUF file")->required();
  cmd->add_option("--text", args->text, "the text to score (UTF-8)")->required();
  cmd->add_option("--ctx", args->ctx, "tokens per window, the second half scored (0: min(n_positions, 512))")
      ->check(at_least(0));
  cmd->add_option("--threads", args->threads, "threads (0: the free cores)")->check(at_least(0));
  cmd->add_option("--dtype", args->dtype, "weights: f32, or bf16 (a GGUF file's blocks stay blocks)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_flag("--json", args->json, "one JSON object");
  cmd->footer("Example: aspen perplexity --model model.gguf --text held-out.txt --ctx 128");
  return {cmd, [args] { return run_perplexity(*args); }};
}

}  // namespace aspen::tools
