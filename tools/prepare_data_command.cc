// tools/prepare_data_command.cc: `aspen prepare-data`, text files in, token
// shards out (train/data.h; the format is in docs/formats.md).
//
//   aspen prepare-data --tokenizer DIR --input FILE... --output DIR
//                      [--shard-tokens N] [--split-lines]
//
// Each input file is one document (with --split-lines: each non-empty line);
// the tokenizer's end-of-text token follows every document. Prints the totals
// and the tokenizer's throughput.
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "tools/commands.h"
#include "train/data.h"

namespace aspen::tools {

namespace {

struct PrepareDataArgs {
  std::string tokenizer, output;
  std::vector<std::string> inputs;
  int64_t shard_tokens = train::kDefaultShardTokens;
  bool split_lines = false;
};

int run_prepare_data(const PrepareDataArgs& a) {
  auto tokenizer = io::load_tokenizer(a.tokenizer);
  if (!tokenizer.is_ok()) return report(tokenizer.status());
  train::PrepareOptions o;
  o.tokenizer_dir = a.tokenizer;
  o.inputs = a.inputs;
  o.output_dir = a.output;
  o.shard_tokens = a.shard_tokens;
  o.split_lines = a.split_lines;
  auto stats = train::prepare_token_shards(**tokenizer, o);
  if (!stats.is_ok()) return report(stats.status());
  const train::TokenIndex& idx = stats->index;
  const double tok_s = stats->tokenize_seconds > 0 ? double(idx.total_tokens) / stats->tokenize_seconds : 0;
  const double mb_s = stats->tokenize_seconds > 0 ? double(stats->input_bytes) / 1e6 / stats->tokenize_seconds : 0;
  std::cout << "inputs: " << idx.inputs.size() << " files, " << stats->input_bytes << " bytes\n"
            << "documents: " << idx.documents << "\n"
            << "tokens: " << idx.total_tokens << " (" << train::token_dtype_name(idx.dtype) << ", vocab "
            << idx.vocab_size << ", eos " << idx.eos_id << ")\n"
            << "shards: " << idx.shards.size() << " of at most " << a.shard_tokens << " tokens\n"
            << std::fixed << std::setprecision(0) << "tokenize: " << tok_s << " tokens/s (" << std::setprecision(2)
            << mb_s << " MB/s, " << std::setprecision(3) << stats->tokenize_seconds << " s); total "
            << stats->total_seconds << " s\n"
            << "index: " << a.output << "/index.json\n";
  return 0;
}

}  // namespace

Command add_prepare_data_command(CLI::App& app) {
  auto args = std::make_shared<PrepareDataArgs>();
  CLI::App* cmd = app.add_subcommand("prepare-data", "tokenize text files into token shards for training");
  cmd->footer(
      "Example: aspen prepare-data --tokenizer models/testdata/gpt2-tiny "
      "--input ../shared/data/tinyshakespeare.txt --output data/shakespeare\n"
      "(one file = one document unless --split-lines; the tokenizer's end-of-text token follows each document; "
      "writes shard-NNNNN.tok files and index.json, format in docs/formats.md)");
  cmd->add_option("--tokenizer", args->tokenizer, "directory with tokenizer.json or vocab.json + merges.txt")
      ->required();
  cmd->add_option("--input", args->inputs, "text files (UTF-8), one or more")->required();
  cmd->add_option("--output", args->output, "output directory (created if missing)")->required();
  cmd->add_option("--shard-tokens", args->shard_tokens, "tokens per shard at most (default 64Mi)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--split-lines", args->split_lines, "each non-empty line is a document");
  return Command{cmd, [args] { return run_prepare_data(*args); }};
}

}  // namespace aspen::tools
