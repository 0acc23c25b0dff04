// train/config_test.cc: the training config file (defaults, a full file,
// to_yaml round trips, every kind of error with its message, overrides) and
// every example in configs/.
#include "train/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace aspen::train {
namespace {

// The error of parsing `yaml` as "cfg.yaml"; fails the test when it parses.
Status parse_error(const std::string& yaml) {
  auto r = parse_train_config(yaml, "cfg.yaml");
  EXPECT_FALSE(r.is_ok()) << "parsed:\n" << yaml;
  return r.status();
}

TrainConfig parse_ok(const std::string& yaml) {
  auto r = parse_train_config(yaml, "cfg.yaml");
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value() : TrainConfig{};
}

TEST(TrainConfig, EmptyFileIsTheDefaults) {
  EXPECT_EQ(parse_ok(""), TrainConfig{});
  EXPECT_EQ(parse_ok("# only a comment\n\n"), TrainConfig{});
  EXPECT_EQ(parse_ok("model:\noptimizer:\n"), TrainConfig{});  // empty sections keep their defaults
  const TrainConfig c;
  EXPECT_EQ(c.name, "run");
  EXPECT_EQ(c.model.family, "gpt2");
  EXPECT_EQ(c.optimizer.no_decay, (std::vector<std::string>{"bias", "ln_", "norm"}));
  EXPECT_EQ(c.global_batch(), 4);
  EXPECT_TRUE(c.validate().is_ok()) << c.validate().to_string();
}

TEST(TrainConfig, FullFile) {
  const TrainConfig c = parse_ok(R"(
name: full-run
model:
  family: gptj
  n_layer: 2
  n_head: 2
  d_model: 64
  n_positions: 128
  d_ff: 96
  rotary_dim: 16
  vocab: 1000
  init_std: 0.01
data:
  train: data/ts
  tokenizer: io/testdata/bpe1k
  seq: 64
  val_fraction: 0.1
optimizer:
  name: sgd
  lr: 1e-2
  beta1: 0.8
  beta2: 0.99
  eps: 1e-6
  weight_decay: 0
  momentum: 0.9
  nesterov: true
  no_decay: [bias]
  clip_grad_norm: 1.0
schedule: {name: cosine, warmup_steps: 10, min_lr_ratio: 0.1}
precision:
  compute: bf16
  partials: bf16
  loss_scaling: dynamic
  loss_scale: 1024
  growth_factor: 4
  backoff_factor: 0.25
  growth_interval: 100
  hysteresis: 3
batch: {micro: 2, accumulation: 4, replicas: 2, global: 16}
train: {steps: 50, seed: 18446744073709551615, threads: 2, device_iterations: 5}
checkpoint: {dir: ckpt, interval: 25, keep: 3}
eval: {interval: 10, batches: 2}
log: {run_dir: runs/x, interval: 5, progress: lines}
sample:
  prompts:
    - "To be"
    - 'or not: to be'
  max_new_tokens: 16
  temperature: 0.7
  top_k: 40
  top_p: 0.9
)");
  EXPECT_EQ(c.name, "full-run");
  EXPECT_EQ(c.model.family, "gptj");
  EXPECT_EQ(c.model.d_ff, 96);
  EXPECT_EQ(c.model.rotary_dim, 16);
  EXPECT_EQ(c.model.vocab, 1000);
  EXPECT_EQ(c.model.init_std, 0.01);
  EXPECT_EQ(c.data.train, "data/ts");
  EXPECT_EQ(c.data.seq, 64);
  EXPECT_EQ(c.optimizer.name, "sgd");
  EXPECT_EQ(c.optimizer.lr, 1e-2);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(c.optimizer.nesterov);
  EXPECT_EQ(c.optimizer.no_decay, std::vector<std::string>{"bias"});
  EXPECT_EQ(c.schedule.name, "cosine");
  EXPECT_EQ(c.schedule.warmup_steps, 10);
  EXPECT_EQ(c.precision.loss_scaling, "dynamic");
  EXPECT_EQ(c.precision.growth_factor, 4.0);
  EXPECT_EQ(c.precision.hysteresis, 3);
  EXPECT_EQ(c.global_batch(), 16);
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_EQ(c.train.threads, 2);
  EXPECT_EQ(c.train.device_iterations, 5);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.eval.interval, 10);
  EXPECT_EQ(c.log.progress, "lines");
  EXPECT_EQ(c.sample.prompts, (std::vector<std::string>{"To be", "or not: to be"}));
  EXPECT_EQ(c.sample.top_p, 0.9);
}

TEST(TrainConfig, ToYamlRoundTrips) {
  TrainConfig d;
  EXPECT_EQ(parse_ok(to_yaml(d)), d);

  TrainConfig c;
  c.name = "r.1_x-y";
  c.model.from = "models/my gpt2";  // a space: quoted
  c.model.init_std = 1.0 / 3.0;     // no short decimal form: shortest exact digits
  c.data.train = "";
  c.data.tokenizer = "null";  // would read as null unquoted
  c.data.val_fraction = 0.1;
  c.optimizer.lr = 3e-4;
  c.optimizer.eps = 1e-8;
  c.optimizer.beta2 = 0.95;
  c.optimizer.no_decay = {};
  c.schedule.min_lr_ratio = 1e-300;
  c.train.seed = 18446744073709551615ull;
  c.train.threads = 7;
  c.checkpoint.dir = "~";
  c.log.run_dir = "-dash";
  TrainConfig onnx = c;  // the map key type (model.inputs), with names YAML must quote
  onnx.model.from = "block.onnx";
  onnx.model.inputs = {{"input.1", "x"}, {"mask:0", "a b"}, {"ids", "null"}};
  onnx.model.frozen = {"*inv_freq"};
  onnx.sample.prompts = {};
  ASSERT_TRUE(onnx.validate().is_ok()) << onnx.validate().to_string();
  EXPECT_EQ(parse_ok(to_yaml(onnx)), onnx) << to_yaml(onnx);
  EXPECT_NE(to_yaml(onnx).find("  inputs: {ids: \"null\", input.1: x, \"mask:0\": \"a b\"}\n"), std::string::npos)
      << to_yaml(onnx);
  c.sample.prompts = {
      "",     "a, b", "[x]",        "it's \"quoted\"", "tab\there", "line\nbreak", "#hash", "héllo wörld",
      "true", "12",   "key: value", "back\\slash",     "bell\x07"};
  ASSERT_TRUE(c.validate().is_ok()) << c.validate().to_string();
  const std::string yaml = to_yaml(c);
  const TrainConfig back = parse_ok(yaml);
  EXPECT_EQ(back, c) << yaml;
  EXPECT_EQ(to_yaml(back), yaml);
  // Every key is written, sections in order.
  EXPECT_NE(yaml.find("\nmodel:\n  from: \"models/my gpt2\"\n  family: gpt2\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  lr: 0.0003\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  no_decay: []\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("\nsample:\n  prompts: [\"\", \"a, b\", "), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  eps: 1e-8\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  top_p: 1\n"), std::string::npos) << yaml;

  // Doubles come back bit for bit, at the fixed/scientific boundaries too.
  for (double v : {0.0, 1e-4, 9.999999999999999e-5, 1.5e-4, 0.1 + 0.2, 123456.789, 1e15 - 1, 1e15, 1e300, 5e-324,
                   2.2250738585072014e-308}) {
    TrainConfig x;
    x.model.init_std = v;
    EXPECT_EQ(parse_ok(to_yaml(x)).model.init_std, v) << to_yaml(x);
  }
}

// ---- errors: each kind, with its exact message ---------------------------------------

TEST(TrainConfigErrors, UnknownKeySuggestsTheClosestKnownOne) {
  Status s = parse_error("name: x\noptimiser:\n  lr: 1\n");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "cfg.yaml:2: optimiser: expected a top-level key (name, model, data, optimizer, schedule, precision, "
            "batch, parallel, train, checkpoint, eval, log, sample), found an unknown key (hint: did you mean 'optimizer'?)");

  s = parse_error("schedule:\n  name: cosine\n  warmup_step: 10\n");
  EXPECT_EQ(s.message(),
            "cfg.yaml:3: schedule.warmup_step: expected a key of 'schedule' (name, warmup_steps, min_lr_ratio), "
            "found an unknown key (hint: did you mean 'warmup_steps'?)");

  // Too far from every key: no suggestion.
  s = parse_error("optimizer:\n  lerning_rate: 0.1\n");
  EXPECT_EQ(s.subject(), "cfg.yaml:2: optimizer.lerning_rate");
  EXPECT_EQ(s.found(), "an unknown key");
  EXPECT_EQ(s.hint(), "");

  // A key of another section.
  s = parse_error("lr: 0.1\n");
  EXPECT_EQ(s.subject(), "cfg.yaml:1: lr");
  EXPECT_EQ(s.hint(), "did you mean 'optimizer.lr'?");
  s = parse_error("model:\n  interval: 5\n");
  EXPECT_EQ(s.hint(), "did you mean 'checkpoint.interval', 'eval.interval' or 'log.interval'?");
}

TEST(TrainConfigErrors, WrongTypes) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"optimizer:\n  lr: fast\n", "cfg.yaml:2: optimizer.lr: expected a number >= 0, found 'fast'"},
      {"optimizer:\n  lr: \"0.1\"\n",
       "cfg.yaml:2: optimizer.lr: expected a number >= 0, found the quoted string '0.1'"},
      {"optimizer:\n  lr: .inf\n", "cfg.yaml:2: optimizer.lr: expected a number >= 0, found '.inf'"},
      {"optimizer:\n  lr:\n", "cfg.yaml:2: optimizer.lr: expected a number >= 0, found no value"},
      {"optimizer:\n  no_decay: {bias: 1}\n",
       "cfg.yaml:2: optimizer.no_decay: expected a list of strings, found a map"},
      {"optimizer:\n  no_decay: bias\n", "cfg.yaml:2: optimizer.no_decay: expected a list of strings, found 'bias'"},
      {"optimizer:\n  nesterov: yes\n", "cfg.yaml:2: optimizer.nesterov: expected true or false, found 'yes'"},
      {"model:\n  n_layer: 2.5\n", "cfg.yaml:2: model.n_layer: expected an integer >= 1, found 2.5"},
      {"model:\n  n_layer: 1e3\n", "cfg.yaml:2: model.n_layer: expected an integer >= 1, found 1e3"},
      {"model:\n  n_layer: [2]\n", "cfg.yaml:2: model.n_layer: expected an integer >= 1, found a list"},
      {"train:\n  seed: -1\n", "cfg.yaml:2: train.seed: expected an integer >= 0, found -1"},
      {"train:\n  threads: 99999999999\n", "cfg.yaml:2: train.threads: expected an integer >= 0, found 99999999999"},
      {"model:\n  family: {a: b}\n", "cfg.yaml:2: model.family: expected one of 'gpt2', 'gptj', 'llama', found a map"},
      {"model:\n  inputs: [a]\n", "cfg.yaml:2: model.inputs: expected a map of strings, found a list"},
      {"model:\n  inputs:\n    x: [a]\n", "cfg.yaml:3: model.inputs.x: expected a string, found a list"},
      {"model:\n  inputs:\n    x: a\n    x: b\n", "cfg.yaml:4: model.inputs.x: expected each key once, found it again"},
      {"sample:\n  prompts:\n    - a\n    - [b]\n", "cfg.yaml:4: sample.prompts[1]: expected a string, found a list"},
      {"model: 3\n",
       "cfg.yaml:1: model: expected a map of the keys of 'model' (from, family, n_layer, n_head, d_model, "
       "n_positions, d_ff, rotary_dim, n_kv_head, vocab, init_std, loss, output, targets, ignore_index, inputs, "
       "attention, attention_dropout, max_positions, frozen, trainable), found 3"},
      {"- a\n- b\n",
       "cfg.yaml:1: expected a map of top-level keys (name, model, data, optimizer, schedule, precision, batch, "
       "parallel, train, checkpoint, eval, log, sample), found a list"},
      {"optimizer:\n  lr: 0.1\n  eps: 1e-6\n  lr: 0.2\n",
       "cfg.yaml:4: optimizer.lr: expected each key once, found it again (first on line 2)"},
  };
  for (const Case& c : cases) {
    Status s = parse_error(c.yaml);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.yaml;
    EXPECT_EQ(s.message(), c.message) << c.yaml;
  }
}

TEST(TrainConfigErrors, OutOfRangeAndUnknownChoices) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"model:\n  n_layer: -2\n", "cfg.yaml:2: model.n_layer: expected an integer >= 1, found -2"},
      {"data:\n  seq: 0\n", "cfg.yaml:2: data.seq: expected an integer >= 1, found 0"},
      {"data:\n  val_fraction: 1\n", "cfg.yaml:2: data.val_fraction: expected a number in [0, 1), found 1"},
      {"optimizer:\n  lr: -0.1\n", "cfg.yaml:2: optimizer.lr: expected a number >= 0, found -0.1"},
      {"optimizer:\n  beta2: 1.0\n", "cfg.yaml:2: optimizer.beta2: expected a number in [0, 1), found 1"},
      {"optimizer:\n  eps: 0\n", "cfg.yaml:2: optimizer.eps: expected a number > 0, found 0"},
      {"sample:\n  top_p: 0\n", "cfg.yaml:2: sample.top_p: expected a number in (0, 1], found 0"},
      {"optimizer:\n  name: adam\n",
       "cfg.yaml:2: optimizer.name: expected one of 'adamw', 'sgd', 'lamb', found 'adam' (hint: did you mean "
       "'adamw'?)"},
      {"precision:\n  compute: fp16\n",
       "cfg.yaml:2: precision.compute: expected one of 'f32', 'bf16', 'f16', found 'fp16' (hint: did you mean 'f16'?)"},
      {"log:\n  progress: tqdm\n",
       "cfg.yaml:2: log.progress: expected one of 'auto', 'bar', 'lines', 'off', found 'tqdm'"},
      {"parallel:\n  balance: timed\n",
       "cfg.yaml:2: parallel.balance: expected one of 'estimated', 'measured', 'dynamic', found 'timed'"},
  };
  for (const Case& c : cases) {
    Status s = parse_error(c.yaml);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.yaml;
    EXPECT_EQ(s.message(), c.message) << c.yaml;
  }
}

TEST(TrainConfigErrors, KeysThatDisagree) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"batch:\n  micro: 4\n  accumulation: 2\n  global: 16\n",
       "cfg.yaml:4: batch.global: expected 0 or micro * accumulation * replicas = 4 * 2 * 1 = 8, found 16"},
      {"precision:\n  compute: bf16\n  partials: f16\n",
       "cfg.yaml:3: precision.partials: expected 'f32' or the compute type 'bf16', found 'f16'"},
      {"model:\n  d_model: 128\n  n_head: 5\n",
       "cfg.yaml:3: model.n_head: expected a divisor of model.d_model = 128, found 5"},
      {"model:\n  rotary_dim: 8\n",
       "cfg.yaml:2: model.rotary_dim: expected 0 for family 'gpt2' (gpt2 has no rotary embeddings; llama rotates "
       "every channel), found 8"},
      {"model:\n  family: gptj\n  rotary_dim: 64\n",
       "cfg.yaml:3: model.rotary_dim: expected at most head_dim = d_model / n_head = 32, found 64"},
      {"model:\n  family: gptj\n  rotary_dim: 7\n", "cfg.yaml:3: model.rotary_dim: expected an even number, found 7"},
      {"model:\n  family: gptj\n  d_model: 132\n  n_head: 4\n",
       "cfg.yaml: model.rotary_dim: expected an even head_dim (0 means head_dim), found head_dim = 33"},
      {"data:\n  seq: 512\n", "cfg.yaml:2: data.seq: expected at most model.n_positions = 256, found 512"},
      {"schedule:\n  warmup_steps: 2000\n",
       "cfg.yaml:2: schedule.warmup_steps: expected at most train.steps = 1000, found 2000"},
      {"optimizer:\n  name: sgd\n  nesterov: true\n",
       "cfg.yaml:3: optimizer.nesterov: expected false when optimizer.momentum is 0, found true "
       "(hint: Nesterov's method needs a momentum > 0)"},
      {"name: a/b\n",
       "cfg.yaml:1: name: expected letters, digits, '.', '_' or '-' (it names the directory runs/<name>), found 'a/b'"},
      // The keys of an ONNX model: refused for the built-in families; what those alone have refused for ONNX.
      {"model:\n  inputs: {x: a}\n",
       "cfg.yaml:2: model.inputs: expected its default unless model.from names an .onnx file, found a value for a "
       "model from scratch (hint: the built-in families know their inputs and loss)"},
      {"model:\n  from: hf/gpt2\n  loss: mse\n",
       "cfg.yaml:3: model.loss: expected its default unless model.from names an .onnx file, found a value with "
       "model.from 'hf/gpt2' (hint: the built-in families know their inputs and loss)"},
      {"model:\n  from: m.onnx\nparallel:\n  tensor_parallel: 2\n",
       "cfg.yaml:4: parallel.tensor_parallel: expected 1 for an ONNX model (tensor shards split the built-in "
       "families' layers), found 2"},
      {"model:\n  from: m.onnx\nsample:\n  prompts: [hi]\n",
       "cfg.yaml:4: sample.prompts: expected none for an ONNX model (samples come from the built-in families), "
       "found a list of 1"},
      {"model:\n  from: m.onnx\n  targets: ''\n", "cfg.yaml:3: model.targets: expected a data column's name, found ''"},
  };
  for (const Case& c : cases) {
    Status s = parse_error(c.yaml);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.yaml;
    EXPECT_EQ(s.message(), c.message) << c.yaml;
  }
  // A fine-tune takes its shape from config.json: the scratch-model checks do not apply.
  EXPECT_TRUE(parse_train_config("model:\n  from: hf/gpt2\n  n_head: 5\ndata:\n  seq: 1024\n", "cfg.yaml").is_ok());
}

// model.attention as DeepSpeed's sparsity config: names, numbers and DeepSpeed's own rejections.
TEST(TrainConfig, SparseAttention) {
  ModelSection m;
  auto none = sparse_attention(m, 4, 1);
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
  m.attention = {{"kind", "longformer"}, {"block", "32"}, {"num_sliding_window_blocks", "5"}};
  auto lf = sparse_attention(m, 4, 7);
  ASSERT_TRUE(lf.is_ok()) << lf.status().to_string();
  ASSERT_TRUE(lf->has_value());
  EXPECT_EQ((*lf)->kind, kernels::SparsityConfig::Kind::bslongformer);
  EXPECT_EQ((*lf)->block, 32);
  EXPECT_EQ((*lf)->num_sliding_window_blocks, 5);
  EXPECT_EQ((*lf)->attention, kernels::SparsityConfig::Attention::unidirectional);  // a decoder's default
  EXPECT_EQ((*lf)->seed, 7u);
  const std::pair<std::map<std::string, std::string>, std::string> bad[] = {
      {{{"block", "16"}},
       "model.attention.kind: expected a kind of layout (dense, fixed, variable, bigbird, bslongformer (or "
       "longformer) or local_sliding_window), found none (hint: e.g. model.attention: {kind: bigbird, block: 64})"},
      {{{"kind", "sparse"}}, "model.attention.kind: expected one of dense, fixed, variable, bigbird, bslongformer (or "
                             "longformer) or local_sliding_window, found 'sparse'"},
      {{{"kind", "fixed"}, {"block", "x"}}, "model.attention.block: expected an integer >= 1, found 'x'"},
      {{{"kind", "fixed"}, {"block", "0"}}, "model.attention.block: expected an integer >= 1, found '0'"},
      {{{"kind", "fixed"}, {"attention", "causal"}},
       "model.attention.attention: expected unidirectional or bidirectional, found 'causal'"},
      {{{"kind", "bigbird"}, {"different_layout_per_head", "yes"}},
       "model.attention.different_layout_per_head: expected true or false, found 'yes'"},
      // DeepSpeed's FixedSparsityConfig takes no num_random_blocks: a key the kind ignores is refused, not dropped.
      {{{"kind", "fixed"}, {"num_random_blocks", "3"}},
       "model.attention.num_random_blocks: expected a key of fixed sparsity (kind, block, different_layout_per_head, "
       "num_local_blocks, num_global_blocks, attention, horizontal_global_attention, num_different_global_patterns), "
       "found '3' (hint: only variable, bigbird read num_random_blocks (DeepSpeed's sparsity configs))"},
      {{{"kind", "bigbird"}, {"blocks", "4"}},
       "model.attention.blocks: expected a key of bigbird sparsity (kind, block, different_layout_per_head, "
       "num_random_blocks, num_sliding_window_blocks, num_global_blocks, attention), found '4'"},
      {{{"kind", "variable"}, {"global_block_indices", "[0, x]"}},
       "model.attention.global_block_indices: expected a list of integers >= 0 (e.g. [0, 2]), found '0, x'"},
  };
  for (const auto& [attention, message] : bad) {
    m.attention = attention;
    auto r = sparse_attention(m, 4, 1);
    ASSERT_FALSE(r.is_ok()) << message;
    EXPECT_EQ(r.status().message(), message);
  }
  m.attention = {{"kind", "variable"}, {"global_block_indices", "[0, 4]"}, {"global_block_end_indices", "2, 6"},
                 {"local_window_blocks", "[2]"}};
  auto variable = sparse_attention(m, 4, 1);
  ASSERT_TRUE(variable.is_ok()) << variable.status().to_string();
  EXPECT_EQ((*variable)->global_block_indices, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ((*variable)->global_block_end_indices, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ((*variable)->local_window_blocks, (std::vector<int64_t>{2}));
  m.attention = {{"kind", "fixed"}, {"num_local_blocks", "4"}, {"num_global_blocks", "3"}};
  auto fixed = sparse_attention(m, 4, 1);
  ASSERT_FALSE(fixed.is_ok());
  EXPECT_EQ(fixed.status().message(),
            "model.attention: fixed sparsity: num_local_blocks: expected a multiple of num_global_blocks (3), found 4");
}

// One entry of model.attention from the command line (`--set model.attention.kind=bigbird`), and the block
// lists of DeepSpeed's Variable and Longformer configs as YAML lists.
TEST(TrainConfig, SparseAttentionEntriesFromOverridesAndYamlLists) {
  TrainConfig c = parse_ok("model:\n  attention: {kind: variable, global_block_indices: [0, 4]}\n");
  EXPECT_EQ(c.model.attention.at("global_block_indices"), "[0, 4]");
  ASSERT_TRUE(apply_override(c, "model.attention.kind=bslongformer").is_ok());
  ASSERT_TRUE(apply_override(c, "model.attention.block=8").is_ok());
  ASSERT_TRUE(apply_override(c, "model.attention.global_block_end_indices=[2, 6]").is_ok());
  EXPECT_EQ(c.model.attention, (std::map<std::string, std::string>{{"kind", "bslongformer"},
                                                                    {"block", "8"},
                                                                    {"global_block_indices", "[0, 4]"},
                                                                    {"global_block_end_indices", "[2, 6]"}}));
  ASSERT_TRUE(apply_override(c, "model.attention.block=").is_ok());  // an empty value removes the entry
  EXPECT_EQ(c.model.attention.count("block"), 0u);
  auto l = sparse_attention(c.model, 2, 1);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_EQ((*l)->global_block_end_indices, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(apply_override(c, "model.attention.block={a: 1}").message(),
            "override 'model.attention.block={a: 1}': model.attention.block: expected a single value for an entry of "
            "model.attention, found a map");
}

TEST(TrainConfigErrors, BadYamlAndMissingFile) {
  Status s = parse_error("optimizer:\n  lr: [1, 2\n");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.subject(), "cfg.yaml:3");
  EXPECT_EQ(s.expected(), "valid YAML");
  EXPECT_FALSE(s.found().empty());

  s = parse_error("name: a\n---\nname: b\n");
  EXPECT_EQ(s.message(), "cfg.yaml:3: expected one YAML document, found 2 documents");

  auto r = load_train_config("/nonexistent/train.yaml");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().subject(), "/nonexistent/train.yaml");
}

// ---- overrides -----------------------------------------------------------------------------

TEST(TrainConfigOverride, SetsKeysSectionsAndLists) {
  TrainConfig c;
  ASSERT_TRUE(apply_override(c, "optimizer.lr=1e-3").is_ok());
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  ASSERT_TRUE(apply_override(c, "sample.prompts=[a, b c]").is_ok());
  EXPECT_EQ(c.sample.prompts, (std::vector<std::string>{"a", "b c"}));
  ASSERT_TRUE(apply_override(c, "sample.prompts=[\"ROMEO:\", \"JULIET:\"]").is_ok());
  EXPECT_EQ(c.sample.prompts, (std::vector<std::string>{"ROMEO:", "JULIET:"}));
  // Unquoted, "ROMEO:" followed by ',' is a one-key map in YAML: refused, not misread.
  EXPECT_EQ(apply_override(c, "sample.prompts=[ROMEO:, JULIET:]").message(),
            "override 'sample.prompts=[ROMEO:, JULIET:]': sample.prompts[0]: expected a string, found a map");
  ASSERT_TRUE(apply_override(c, "name=second").is_ok());
  EXPECT_EQ(c.name, "second");
  ASSERT_TRUE(apply_override(c, "model={n_layer: 2, n_head: 2}").is_ok());
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 2);
  EXPECT_EQ(c.model.d_model, 128);  // the rest of the section is kept
  ASSERT_TRUE(apply_override(c, "data.train=").is_ok());
  EXPECT_EQ(c.data.train, "");
  ASSERT_TRUE(apply_override(c, "precision.compute=bf16").is_ok());
  EXPECT_TRUE(c.validate().is_ok());
}

TEST(TrainConfigOverride, SameChecksAsTheFile) {
  TrainConfig c;
  const TrainConfig before = c;
  struct Case {
    const char* assignment;
    const char* message;
  };
  const Case cases[] = {
      {"optimizer.lr=fast", "override 'optimizer.lr=fast': optimizer.lr: expected a number >= 0, found 'fast'"},
      {"optimizer.lr=-1", "override 'optimizer.lr=-1': optimizer.lr: expected a number >= 0, found -1"},
      {"optimizer.name=adam",
       "override 'optimizer.name=adam': optimizer.name: expected one of 'adamw', 'sgd', 'lamb', found 'adam' "
       "(hint: did you mean 'adamw'?)"},
      {"schedule.warmup_step=3",
       "override 'schedule.warmup_step=3': schedule.warmup_step: expected a key of 'schedule' (name, warmup_steps, "
       "min_lr_ratio), found an unknown key (hint: did you mean 'warmup_steps'?)"},
      {"optimiser.lr=1",
       "override 'optimiser.lr=1': optimiser: expected a section (name, model, data, optimizer, schedule, precision, "
       "batch, parallel, train, checkpoint, eval, log, sample), found an unknown key (hint: did you mean 'optimizer'?)"},
      {"sample.prompts={a: b}",
       "override 'sample.prompts={a: b}': sample.prompts: expected a list of strings, found a map"},
      {"model={n_layer: 0}", "override 'model={n_layer: 0}': model.n_layer: expected an integer >= 1, found 0"},
      {"optimizer.lr", "override 'optimizer.lr': expected key.path=value (e.g. optimizer.lr=1e-3), found no '='"},
      {"=3", "override '=3': expected key.path=value (e.g. optimizer.lr=1e-3), found no key before '='"},
  };
  for (const Case& k : cases) {
    Status s = apply_override(c, k.assignment);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << k.assignment;
    EXPECT_EQ(s.message(), k.message) << k.assignment;
    EXPECT_EQ(c, before) << k.assignment;  // unchanged on error
  }
  // A whole-section override that fails part-way changes nothing either.
  EXPECT_FALSE(apply_override(c, "model={n_layer: 2, n_head: -1}").is_ok());
  EXPECT_EQ(apply_override(c, "model={n_layer: 2, n_layer: 3}").message(),
            "override 'model={n_layer: 2, n_layer: 3}': model.n_layer: expected each key once, found it again");
  EXPECT_EQ(c, before);
  Status s = apply_override(c, "optimizer.lr=[1, 2");
  EXPECT_EQ(s.subject(), "override 'optimizer.lr=[1, 2': optimizer.lr");
  EXPECT_EQ(s.expected(), "a YAML value");
}

// ---- the examples in configs/ ---------------------------------------------------------------

TEST(TrainConfigExamples, EveryFileInConfigsParsesAndValidates) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ASPEN_CONFIGS_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    auto r = load_train_config(entry.path().string());
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    if (r.is_ok()) {
      EXPECT_EQ(parse_ok(to_yaml(r.value())), r.value()) << entry.path();
    }
  }
  EXPECT_GE(count, 3);
}

std::string training_md() {
  std::ifstream f(ASPEN_TRAINING_MD);
  EXPECT_TRUE(f) << ASPEN_TRAINING_MD;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The YAML examples of docs/training.md are configs that parse.
TEST(TrainConfigExamples, DocsExamplesParse) {
  const std::string doc = training_md();
  int count = 0;
  for (size_t at = doc.find("```yaml\n"); at != std::string::npos; at = doc.find("```yaml\n", at + 1)) {
    const size_t begin = at + 8, end = doc.find("```", begin);
    ASSERT_NE(end, std::string::npos);
    auto r = parse_train_config(doc.substr(begin, end - begin), "docs/training.md");
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    ++count;
  }
  EXPECT_GE(count, 1);
}

// docs/training.md documents every key: each key that to_yaml writes
// ("  key: value" lines) appears there as `key`.
TEST(TrainConfigExamples, DocsListEveryKey) {
  const std::string doc = training_md();
  std::istringstream yaml(to_yaml(TrainConfig{}));
  int keys = 0;
  for (std::string line; std::getline(yaml, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::string key = line.substr(line.find_first_not_of(' '), line.find(':') - line.find_first_not_of(' '));
    EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << key;
    ++keys;
  }
  EXPECT_EQ(keys, 98);  // 86 keys + 12 section headers
}

}  // namespace
}  // namespace aspen::train

namespace aspen::train {
namespace {

// The config's keys reach the runner's options through training_options() alone.
TEST(TrainConfig, TrainingOptionsBindEveryStepKey) {
  TrainConfig c;
  for (const char* o : {"optimizer.name=sgd", "optimizer.lr=0.25", "optimizer.momentum=0.8", "optimizer.nesterov=true",
                        "optimizer.clip_grad_norm=1.5", "schedule.name=cosine", "schedule.warmup_steps=3",
                        "train.steps=40", "precision.loss_scaling=dynamic", "precision.loss_scale=1024",
                        "parallel.reduction=sum", "parallel.bucket_mb=2", "parallel.compression=bf16",
                        "parallel.timeout_s=9", "parallel.overlap=false", "parallel.pipeline_stages=2",
                        "parallel.schedule=gpipe", "parallel.balance=measured"})
    ASSERT_TRUE(apply_override(c, o).is_ok()) << o;
  auto t = training_options(c);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->optimizer.kind, OptimizerKind::sgd);
  EXPECT_FLOAT_EQ(float(t->optimizer.momentum), 0.8f);
  EXPECT_TRUE(t->optimizer.nesterov);
  EXPECT_DOUBLE_EQ(t->schedule.lr, 0.25);
  EXPECT_EQ(t->schedule.kind, ScheduleKind::cosine);
  EXPECT_EQ(t->schedule.warmup_steps, 3);
  EXPECT_EQ(t->schedule.total_steps, 40);
  EXPECT_DOUBLE_EQ(t->clip_grad_norm, 1.5);
  EXPECT_EQ(t->loss_scaling.mode, LossScaling::dynamic);
  EXPECT_DOUBLE_EQ(t->loss_scaling.initial_scale, 1024.0);
  EXPECT_EQ(t->reduction, Reduction::sum);
  EXPECT_EQ(t->data_parallel.bucket_bytes, int64_t(2) << 20);
  EXPECT_EQ(t->data_parallel.compression, parallel::Compression::bf16);
  EXPECT_EQ(t->data_parallel.comm.timeout, std::chrono::seconds(9));
  EXPECT_FALSE(t->data_parallel.overlap);
  EXPECT_EQ(t->pipeline.stages, 2);
  EXPECT_EQ(t->pipeline.schedule, PipelineSchedule::gpipe);
  EXPECT_EQ(t->pipeline.balance, TrainingOptions::Balance::measured);
  ASSERT_TRUE(apply_override(c, "parallel.balance=dynamic").is_ok());
  EXPECT_EQ(training_options(c)->pipeline.balance, TrainingOptions::Balance::dynamic);
}

}  // namespace
}  // namespace aspen::train
