// tools/embed_command.cc: `aspen embed`, sentence embeddings of stdin lines.
//
//   printf 'A man is eating food.\nI love you.\n' | aspen embed --model DIR
//   {"text":"A man is eating food.","embedding":[0.0123,...]}
//
// Each line of stdin (UTF-8; a trailing "\r" is dropped) is one text; each
// gives one JSON object on stdout, in order: {"text": the line, "embedding":
// [d_model floats]}, the L2-normalized mean-pooled BERT output of
// models/embedder.h. Lines are read and written kBatchesPerChunk batches at
// a time (the embedder sorts each chunk by length, so batches of similar
// lengths run at short compiled lengths), so output streams and memory stays
// bounded. An empty line is embedded as the
// empty text ([CLS] [SEP]), as sentence-transformers does. Invalid UTF-8 is
// tokenized as the tokenizer does (lossily decoded) and written as U+FFFD.
// Floats are written in the shortest form that reads back to the same f32
// (at most 9 significant digits).
#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/run_profile.h"
#include "compiler/memory_profile.h"
#include "models/embedder.h"
#include "profile/profile_dir.h"
#include "runtime/run_facts.h"
#include "runtime/session.h"
#include "tools/commands.h"

namespace aspen::tools {
namespace {

constexpr int64_t kBatchesPerChunk = 16;

struct EmbedArgs {
  std::string model;
  models::EmbedderOptions options;
  std::string profile;
};

// One output line.
std::string json_line(const std::string& text, const std::vector<float>& v) {
  std::string out = "{\"text\":";
  out += nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += ",\"embedding\":[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    fmt::format_to(std::back_inserter(out), "{}", v[i]);
  }
  out += "]}\n";
  return out;
}

Status run_embed(const EmbedArgs& args) {
  const std::string profile_dir = profile::profile_dir_choice(args.profile);
  if (!profile_dir.empty()) ASPEN_RETURN_IF_ERROR(profile::make_profile_dir(profile_dir));
  profile::TraceRecorder trace;
  models::EmbedderOptions options = args.options;
  if (!profile_dir.empty()) options.trace = &trace;
  ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<models::Embedder> e, models::Embedder::open(args.model, options));
  int64_t texts = 0;
  std::vector<std::string> lines;
  std::string line;
  bool done = false;
  while (!done) {
    lines.clear();
    while (int64_t(lines.size()) < kBatchesPerChunk * e->max_batch()) {
      if (!std::getline(std::cin, line)) {
        done = true;
        break;
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
    if (std::cin.bad()) return Status::error(Code::kIoError, "stdin", "readable", "a read error");
    if (lines.empty()) break;
    ASPEN_ASSIGN_OR_RETURN(auto vectors, e->embed(lines));
    texts += int64_t(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) std::cout << json_line(lines[i], vectors[i]);
    std::cout.flush();
    if (!std::cout) return Status::error(Code::kIoError, "stdout", "writable", "a write error");
  }
  if (!profile_dir.empty()) {
    profile::RunFacts run =
        runtime::run_facts("embed", args.options.threads, {{"model", args.model}, {"texts", std::to_string(texts)}});
    for (int p = 0; p < e->session().programs(); ++p)  // one program per compiled length
      run.programs.push_back(compiler::program_memory(
          e->session().executable(p), "length " + std::to_string(e->compiled_lengths()[size_t(p)]), p));
    runtime::add_planned_memory(run, e->session());
    ASPEN_RETURN_IF_ERROR(api::write_run_profile(profile_dir, trace.events(), run, std::cerr));
  }
  return Status::ok();
}

}  // namespace

Command add_embed_command(CLI::App& app) {
  auto args = std::make_shared<EmbedArgs>();
  CLI::App* cmd = app.add_subcommand(
      "embed", "sentence embeddings of stdin lines (BERT, mean pooling, L2 normalized) as JSON lines");
  cmd->footer(
      "Example: printf 'A man is eating food.\\nI love you.\\n' | aspen embed --model all-MiniLM-L6-v2/\n"
      "Output:  {\"text\":\"A man is eating food.\",\"embedding\":[...]} per line\n"
      "DIR holds config.json (model_type bert), model.safetensors (or sharded) and tokenizer.json or vocab.txt.\n");
  cmd->add_option("--model", args->model, "Hugging Face model directory")->required();
  cmd->add_option("--batch", args->options.max_batch, "texts per run (the compiled batch)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16))
      ->capture_default_str();
  cmd->add_option("--max-length", args->options.max_length,
                  "tokens per text, [CLS]/[SEP] included (default: sentence_bert_config.json's max_seq_length, "
                  "else min(tokenizer model_max_length, max_position_embeddings))")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--threads", args->options.threads, "threads (default: the free cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--profile", args->profile, api::kProfileHelp);
  return Command{cmd, [args] { return report(run_embed(*args)); }};
}

}  // namespace aspen::tools
