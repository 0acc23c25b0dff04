// tools/generate_command.cc: `aspen generate`, text in, streamed text out.
//
//   aspen generate --model DIR|FILE.gguf --prompt TEXT [--max-new-tokens N] [--temperature T]
//                  [--top-k K] [--top-p P] [--repetition-penalty R] [--seed S]
//                  [--max-length L] [--threads N] [--tensor-parallel N [--vocab-parallel]] [--echo]
//                  [--dtype f32|bf16] [--show-special] [--profile DIR]
//
// DIR holds config.json, the weights and the tokenizer (tokenizer.json, or
// vocab.json + merges.txt). The new text goes to stdout as it is drawn: each
// step prints what decoding all new tokens adds, holding back a trailing
// incomplete UTF-8 sequence (shown as U+FFFD by the decoder) until the next
// token completes it, so the printed text is exactly the decode of the whole
// continuation. Stops at the config's eos ids or after --max-new-tokens.
// Special tokens (an eos, <|endoftext|>) are left out of the text unless
// --show-special. Every sampling flag is checked before the model loads; a
// timings line goes to stderr at the end, as llama.cpp prints one. --profile DIR (or ASPEN_PROFILE=DIR)
// records every instruction of the prefill and the decode steps and writes the profile there at the end
// (docs/profile.md).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "api/run_profile.h"
#include "compiler/memory_profile.h"
#include "io/tokenizer.h"
#include "models/config.h"
#include "models/generate.h"
#include "models/weights.h"
#include "profile/profile_dir.h"
#include "runtime/run_facts.h"
#include "tools/commands.h"

namespace aspen::tools {

namespace {

struct GenerateArgs {
  std::string model, prompt;
  int64_t max_new_tokens = 32, max_length = 0;
  float temperature = 1.0f, top_p = 1.0f, repetition_penalty = 1.0f;
  int32_t top_k = 50;
  uint64_t seed = 0;
  int threads = 0;
  int64_t tensor_parallel = 1;
  bool vocab_parallel = false;
  bool echo = false, show_special = false;
  std::string dtype = "f32";
  std::string profile;
};

// Every flag the sampler reads, before anything loads.
Status check_sampling_flags(const GenerateArgs& a) {
  if (!std::isfinite(a.temperature) || a.temperature < 0)
    return Status::invalid_argument("--temperature", "a finite number >= 0 (0: greedy)", std::to_string(a.temperature));
  if (a.top_k < 0) return Status::invalid_argument("--top-k", "an integer >= 0 (0: off)", std::to_string(a.top_k));
  if (!(a.top_p > 0 && a.top_p <= 1))
    return Status::invalid_argument("--top-p", "a number in (0, 1] (1: off)", std::to_string(a.top_p));
  if (!std::isfinite(a.repetition_penalty) || a.repetition_penalty <= 0)
    return Status::invalid_argument("--repetition-penalty", "a finite number > 0 (1: off)",
                                    std::to_string(a.repetition_penalty));
  if (a.max_new_tokens < 1)
    return Status::invalid_argument("--max-new-tokens", "an integer >= 1", std::to_string(a.max_new_tokens));
  if (a.max_length < 0) return Status::invalid_argument("--max-length", "an integer >= 0", std::to_string(a.max_length));
  return Status();
}

// The length of `text` without a trailing run of U+FFFD (an incomplete UTF-8
// sequence the next token may complete).
size_t stable_prefix(const std::string& text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  size_t end = text.size();
  while (end >= 3 && text.compare(end - 3, 3, kReplacement) == 0) end -= 3;
  return end;
}

int run_generate(const GenerateArgs& a) {
  if (Status s = check_sampling_flags(a); !s.is_ok()) {
    report(s);
    return kExitUsage;
  }
  auto config = models::load_model_config(a.model);  // a directory, or a GGUF file
  if (!config.is_ok()) return report(config.status());
  auto tokenizer = models::load_model_tokenizer(a.model);
  if (!tokenizer.is_ok()) return report(tokenizer.status());
  // With the post-processor's special tokens, as transformers' tokenizer(prompt) gives them: Llama's BOS
  // (GPT-2's post-processor adds nothing).
  const std::vector<io::TokenId> prompt = (*tokenizer)->encode(a.prompt, /*add_special_tokens=*/true);
  if (prompt.empty()) return report(Status::invalid_argument("--prompt", "text that encodes to at least one token", "none"));
  const int64_t context = a.max_length > 0 ? a.max_length : config->n_positions();
  if (context > 0 && int64_t(prompt.size()) >= context)
    return report(Status::invalid_argument(
        "--prompt", "a prompt shorter than the context, to leave room for new tokens",
        "your prompt is " + std::to_string(prompt.size()) + " tokens; this model's context is " +
            std::to_string(context) + (a.max_length > 0 ? " (--max-length)" : "")));
  const std::string profile_dir = profile::profile_dir_choice(a.profile);
  if (!profile_dir.empty())
    if (Status s = profile::make_profile_dir(profile_dir); !s.is_ok()) return report(s);
  profile::TraceRecorder trace;
  models::GeneratorOptions go;
  if (!profile_dir.empty()) go.trace = &trace;
  go.weights = a.dtype == "bf16" ? DType::bf16 : DType::f32;
  go.max_length = a.max_length;
  go.threads = a.threads;
  go.tensor_parallel = a.tensor_parallel;
  go.vocab_parallel = a.vocab_parallel;
  // Compiled once for this prompt's length: the prefill is padded to it.
  go.max_prompt = int64_t(prompt.size());
  auto gen = models::Generator::open(a.model, go);
  if (!gen.is_ok()) return report(gen.status());
  models::SamplingOptions s;
  s.max_new_tokens = a.max_new_tokens;
  s.temperature = a.temperature;
  s.top_k = a.top_k;
  s.top_p = a.top_p;
  s.repetition_penalty = a.repetition_penalty;
  s.seed = a.seed;
  for (int64_t id : (*gen)->config().eos_token_ids) s.stop_tokens.push_back(int32_t(id));
  if (a.echo) std::cout << a.prompt << std::flush;
  std::vector<io::TokenId> generated;
  size_t printed = 0;
  const bool skip_special = !a.show_special;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  clock::time_point first, last;
  s.on_token = [&](int64_t, int32_t token) {
    last = clock::now();
    if (generated.empty()) first = last;
    generated.push_back(token);
    const std::string text = (*tokenizer)->decode(generated, skip_special);
    const size_t stable = stable_prefix(text);
    if (stable > printed) {
      std::cout << text.substr(printed, stable - printed) << std::flush;
      printed = stable;
    }
    return true;
  };
  auto out = (*gen)->generate({prompt}, s);
  if (!out.is_ok()) {
    std::cout << "\n";
    return report(out.status());
  }
  const std::string text = (*tokenizer)->decode(generated, skip_special);
  std::cout << text.substr(std::min(printed, text.size())) << "\n" << std::flush;
  // The prefill ends with the first new token; the rest are decode steps.
  const double prefill = std::chrono::duration<double>(first - start).count();
  const double decode = std::chrono::duration<double>(last - first).count();
  char line[200];
  std::snprintf(line, sizeof line,
                "timings: prompt %zu tokens in %.3f s (%.1f tokens/s); generated %zu tokens in %.3f s (%.1f tokens/s)",
                prompt.size(), prefill, prefill > 0 ? double(prompt.size()) / prefill : 0.0, generated.size(),
                prefill + decode, generated.size() > 1 && decode > 0 ? double(generated.size() - 1) / decode : 0.0);
  if (!generated.empty()) std::cerr << line << "\n";
  if (!profile_dir.empty()) {
    profile::RunFacts run = runtime::run_facts("generate", a.threads,
                                           {{"model", a.model},
                                            {"dtype", a.dtype},
                                            {"prompt_tokens", std::to_string(prompt.size())},
                                            {"new_tokens", std::to_string(generated.size())}});
    const runtime::Session& session = (*gen)->session();
    for (int p = 0; p < session.programs(); ++p)  // models::Generator compiles the prefill, then one decode step
      run.programs.push_back(compiler::program_memory(
          session.executable(p),
          session.programs() == 2 ? (p == 0 ? "prefill" : "decode") : "program " + std::to_string(p), p));
    runtime::add_planned_memory(run, session);
    if (Status st = api::write_run_profile(profile_dir, trace.events(), run, std::cerr); !st.is_ok())
      return report(st);
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a GPT-2, GPT-J or Llama-family model directory (streamed)");
  cmd->footer(
      "Example: aspen generate --model models/testdata/gptj-tiny --prompt \"ROMEO:\" --max-new-tokens 32 "
      "--temperature 0\n(--temperature 0 is greedy; otherwise top-k, top-p and the seed apply; the same seed gives "
      "the same text)");
  cmd->add_option("--model", args->model,
                  "model directory (config.json, weights, tokenizer), or a llama.cpp GGUF file (GPT-2, Llama)")
      ->required();
  cmd->add_option("--prompt", args->prompt, "the text to continue")->required();
  cmd->add_option("--max-new-tokens", args->max_new_tokens, "new tokens at most (default 32)")->check(at_least(1));
  cmd->add_option("--temperature", args->temperature, "0: greedy; default 1");
  cmd->add_option("--top-k", args->top_k, "keep the k likeliest tokens (0: off; default 50)");
  cmd->add_option("--top-p", args->top_p, "nucleus: the likeliest tokens holding this much probability (1: off)");
  cmd->add_option("--repetition-penalty", args->repetition_penalty, "HF repetition penalty (1: off)");
  cmd->add_option("--seed", args->seed, "random seed (default 0)")->check(at_least(0));
  cmd->add_option("--max-length", args->max_length, "KV-cache positions, prompt included (0: the model's maximum)")
      ->check(at_least(0));
  cmd->add_option("--threads", args->threads, "threads (0: the free cores)")->check(at_least(0));
  cmd->add_option("--dtype", args->dtype,
                  "weights: f32, or bf16 (matrices in bf16: about half the bytes per step on CPUs with AVX-512)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_flag("--show-special", args->show_special, "print special tokens (an eos, <|endoftext|>) in the text");
  cmd->add_option("--tensor-parallel", args->tensor_parallel,
                  "Megatron tensor shards over this many devices (gpt2, gptj; threads is then per shard)")
      ->check(CLI::Range(int64_t(1), int64_t(64)));
  cmd->add_flag("--vocab-parallel", args->vocab_parallel,
                "with --tensor-parallel: the vocabulary split over the shards too (it must divide)");
  cmd->add_flag("--echo", args->echo, "print the prompt before the continuation");
  cmd->add_option("--profile", args->profile, api::kProfileHelp);
  return Command{cmd, [args] { return run_generate(*args); }};
}

}  // namespace aspen::tools
