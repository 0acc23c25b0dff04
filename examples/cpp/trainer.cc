// examples/cpp/trainer.cc: the training job behind `aspen train`
// (api/trainer.h) from C++: a small GPT-2 from scratch on the built-in
// addition corpus (train/demo.h), with validation, a checkpoint, and the
// trained model exported as a Hugging Face directory.
//
//   trainer [RUN_DIR]   exits 0 when the validation loss ends below the first step's loss
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

#include "api/trainer.h"
#include "train/config.h"
#include "train/demo.h"

namespace {

int fail(const aspen::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace aspen;
  namespace fs = std::filesystem;
  const std::string dir = argc > 1 ? argv[1] : (fs::temp_directory_path() / "aspen_example_trainer").string();
  fs::remove_all(dir);
  // The corpus: "7+45=52" problems as byte tokens, written as token shards.
  if (Status s = train::write_byte_tokenizer(dir + "/tokenizer"); !s.is_ok()) return fail(s);
  if (auto idx = train::write_addition_shards(train::make_addition_task(/*seed=*/0), /*repeats=*/2, dir + "/data",
                                              dir + "/tokenizer");
      !idx.is_ok())
    return fail(idx.status());

  // The config as a YAML file would give it (train/config.h: every key has a default).
  Result<train::TrainConfig> config = train::parse_train_config(
      "name: example\n"
      "model: {family: gpt2, n_layer: 2, n_head: 2, d_model: 64, n_positions: 64}\n"
      "data: {train: " + dir + "/data, tokenizer: " + dir + "/tokenizer, seq: 32, val_fraction: 0.05}\n"
      "optimizer: {name: adamw, lr: 0.003}\n"
      "schedule: {name: cosine, warmup_steps: 5}\n"
      "batch: {micro: 8, accumulation: 2}\n"
      "train: {steps: 40, threads: 2}\n"
      "eval: {interval: 20, batches: 2}\n"
      "checkpoint: {interval: 20}\n"
      "log: {run_dir: " + dir + "/run, progress: off}\n",
      "examples/cpp/trainer.cc");
  if (!config.is_ok()) return fail(config.status());

  std::ostringstream log;  // the job's messages (nullptr: stderr)
  api::TrainerOptions options;
  options.out = &log;
  Result<std::unique_ptr<api::Trainer>> trainer = api::Trainer::create(*config, options);
  if (!trainer.is_ok()) return fail(trainer.status());
  Result<api::TrainResult> result = (*trainer)->run();
  if (!result.is_ok()) return fail(result.status());
  std::printf("%lld steps: loss %.3f -> %.3f, validation %.3f, %.0f tokens/s\nmodel: %s\n",
              static_cast<long long>(result->steps), result->first_loss, result->last_loss, result->last_val_loss,
              result->tokens_per_s, result->model_dir.c_str());
  const bool learned = result->last_val_loss > 0 && result->last_val_loss < result->first_loss &&
                       fs::exists(result->model_dir + "/config.json");
  if (argc <= 1) fs::remove_all(dir);
  return learned ? 0 : 1;
}
