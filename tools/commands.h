// tools/commands.h: how the `aspen` commands that live in their own files
// plug into the command line (private to tools/).
//
// Each add_*_command registers its subcommand on `app` (options bound to
// state the returned `run` owns) and returns the subcommand and what to run
// when it was given. run() prints and returns the process exit code (0 ok,
// 1 an error it printed as "aspen: error: ...", 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>

#include "core/file.h"
#include "core/status.h"

namespace aspen::tools {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Prints a failed Status the way every command does (control bytes escaped:
// a message may quote a hostile file); returns the exit code.
inline int report(const Status& s) {
  if (s.is_ok()) return 0;
  std::cerr << "aspen: error: " << escape_for_terminal(s.to_string()) << "\n";
  return 1;
}

// Exit codes: 0 done, 1 a failure (printed), 2 bad usage, 130 stopped by Ctrl-C (128 + SIGINT).
inline constexpr int kExitUsage = 2, kExitInterrupted = 128 + 2;  // SIGINT

// A CLI11 check that an integer option is at least `lo`, with our wording:
// "--steps: expected an integer >= 1, found -5".
inline CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "expected an integer, found '" + text + "'";
        if (v < lo) return "expected an integer >= " + std::to_string(lo) + ", found " + text;
        return {};
      },
      ">= " + std::to_string(lo));
}

// The commands, one file each (tools/<name>_command.cc).
Command add_embed_command(CLI::App& app);         // aspen embed: sentence embeddings of stdin lines
Command add_generate_command(CLI::App& app);      // aspen generate: streamed text from a causal LM
Command add_perplexity_command(CLI::App& app);    // aspen perplexity: a causal LM on a text file
Command add_onnx_command(CLI::App& app);          // aspen onnx inspect|run: a user's own ONNX model
Command add_prepare_data_command(CLI::App& app);  // aspen prepare-data: token shards for training
Command add_profile_command(CLI::App& app);       // aspen profile diff: two profiles compared
Command add_monitor_command(CLI::App& app);       // aspen monitor: devices' load while a run trains
Command add_train_command(CLI::App& app);         // aspen train: the training job

}  // namespace aspen::tools
