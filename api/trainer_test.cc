// The training job end to end on a tiny GPT-2 and the addition corpus:
// resuming is bitwise identical to not stopping, a checkpoint of another
// model is refused, a non-finite loss stops the run and leaves the last
// checkpoint intact, and fine-tuning starts from a Hugging Face directory.
#include "api/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/trainer_feed.h"
#include "api/trainer_live.h"
#include "graph/builder.h"
#include "io/test_files.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/demo.h"
#include "train/report.h"

namespace aspen::api {
namespace {

namespace fs = std::filesystem;

const std::string kTestdata = ASPEN_MODELS_TESTDATA;

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("aspen_trainer_test_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// The addition corpus and byte tokenizer, once per test binary.
const std::string& corpus() {
  static TempDir dir("corpus");
  static bool made = [] {
    EXPECT_TRUE(train::write_byte_tokenizer(dir.path + "/tok").is_ok());
    EXPECT_TRUE(train::write_addition_shards(train::make_addition_task(0), 1, dir.path + "/data", dir.path + "/tok")
                    .is_ok());
    return true;
  }();
  (void)made;
  return dir.path;
}

train::TrainConfig tiny_config(const std::string& run_dir) {
  train::TrainConfig c;
  c.name = "tiny";
  c.model.n_layer = 2, c.model.n_head = 2, c.model.d_model = 32, c.model.n_positions = 32;
  c.data.train = corpus() + "/data";
  c.data.tokenizer = corpus() + "/tok";
  c.data.seq = 16;
  c.data.val_fraction = 0.05;
  c.optimizer.lr = 3e-3;
  c.schedule.name = "cosine";
  c.schedule.warmup_steps = 3;
  c.batch.micro = 4;
  c.train.steps = 20;
  c.train.threads = 2;
  c.checkpoint.interval = 0;
  c.eval.interval = 5;
  c.eval.batches = 2;
  c.log.run_dir = run_dir;
  c.log.progress = "off";
  return c;
}

// tiny_config laid out over `replicas` x `stages` x `tp` devices of one
// thread, each step a global batch of `batch` examples in micro-batches of
// `micro` (accumulation fills the rest); SGD with momentum when `sgd`.
train::TrainConfig layout_config(const std::string& dir, int64_t replicas, int64_t stages, int64_t tp, int64_t micro,
                                 int64_t batch, bool sgd) {
  train::TrainConfig c = tiny_config(dir);
  if (sgd) {
    c.optimizer.name = "sgd";
    c.optimizer.lr = 0.05;
    c.optimizer.momentum = 0.9;
  }
  c.batch.micro = micro;
  c.batch.replicas = replicas;
  c.batch.accumulation = batch / (micro * replicas);
  c.parallel.pipeline_stages = stages;
  c.parallel.tensor_parallel = tp;
  c.train.threads = 1;
  return c;
}

Result<TrainResult> train(const train::TrainConfig& c, bool resume = false, int64_t stop_at = 0) {
  std::ostringstream sink;
  ASPEN_ASSIGN_OR_RETURN(auto t, Trainer::create(c, {.resume = resume, .out = &sink, .stop_at = stop_at}));
  return t->run();
}

void expect_same_bits(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << what << " " << name;
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << what << " " << name << " differs";
  }
}

// The largest |a - b| / (1 + |a|) over two checkpoints' weights (shapes must match).
double max_weight_diff(const train::Checkpoint& a, const train::Checkpoint& b) {
  double worst = 0.0;
  for (const auto& [name, t] : a.weights) {
    const Tensor& u = b.weights.at(name);
    EXPECT_EQ(u.shape(), t.shape()) << name;
    if (u.shape() != t.shape()) return 1e30;
    for (int64_t i = 0; i < t.numel(); ++i)
      worst = std::max(worst, double(std::abs(t.data<float>()[i] - u.data<float>()[i])) /
                                  (1.0 + std::abs(double(t.data<float>()[i]))));
  }
  return worst;
}

// 20 steps straight against 10 + resume + 10: the weights and the optimizer
// state bit for bit, for the fused step and for the split one (accumulation,
// clipping, dynamic loss scaling: loader position, accumulators and scaler).
TEST(Trainer, ResumeIsBitwiseIdenticalToNotStopping) {
  for (bool split : {false, true}) {
    SCOPED_TRACE(split ? "split" : "fused");
    TempDir straight("straight"), stopped("stopped");
    train::TrainConfig a = tiny_config(straight.path), b = tiny_config(stopped.path);
    for (train::TrainConfig* c : {&a, &b}) {
      if (!split) continue;
      c->batch.micro = 2, c->batch.accumulation = 2;
      c->optimizer.clip_grad_norm = 0.5;
      c->precision.loss_scaling = "dynamic";
      c->precision.loss_scale = 1024;
    }
    auto ra = train(a);
    ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
    EXPECT_EQ(ra->steps, 20);
    EXPECT_LT(ra->last_loss, ra->first_loss);  // it learns
    auto rb1 = train(b, false, 10);
    ASSERT_TRUE(rb1.is_ok()) << rb1.status().to_string();
    EXPECT_EQ(rb1->steps, 10);
    EXPECT_FALSE(fs::exists(stopped.path + "/model"));  // stopped: no export yet
    auto rb2 = train(b, /*resume=*/true);
    ASSERT_TRUE(rb2.is_ok()) << rb2.status().to_string();
    EXPECT_EQ(rb2->steps, 20);
    auto ca = train::load_checkpoint(straight.path + "/checkpoints");
    auto cb = train::load_checkpoint(stopped.path + "/checkpoints");
    ASSERT_TRUE(ca.is_ok() && cb.is_ok());
    EXPECT_EQ(ca->step, 20);
    EXPECT_EQ(cb->step, 20);
    expect_same_bits(ca->weights, cb->weights, "weights");
    expect_same_bits(ca->optimizer, cb->optimizer, "optimizer state");
    EXPECT_EQ(ra->last_loss, rb2->last_loss);
    EXPECT_EQ(ra->last_val_loss, rb2->last_val_loss);
    // The metrics of the resumed run continue the first part's lines.
    auto la = train::read_metric(straight.path + "/metrics.jsonl", "loss");
    auto lb = train::read_metric(stopped.path + "/metrics.jsonl", "loss");
    ASSERT_TRUE(la.is_ok() && lb.is_ok());
    EXPECT_EQ(*la, *lb);
    // The exported model loads.
    auto m = models::Checkpoint::open(stopped.path + "/model");
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  }
}

// data.packing: the feed restarts positions after each eos, numbers the
// A 1-layer GPT-2 of width 16 over `vocab` for a feed's micro-batches of 4 x 16 tokens, with its loss (and the
// packed documents' segments).
graph::Graph feed_model(int64_t vocab, bool segments) {
  models::ModelConfig mc;
  mc.model_type = "gpt2";
  mc.family = models::Gpt2Config{.vocab = vocab, .n_positions = 32, .d_model = 16, .n_layer = 1, .n_head = 2};
  graph::Graph g;
  graph::Builder b(g);
  const Status s = models::build_causal_lm(b, mc, {.batch = 4, .seq = 16, .with_loss = true, .segments = segments});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return g;
}

// NOTE [data per replica]: each replica's examples counted and the replicas' slices of a call disjoint (a
// real feed of two replicas); the line's rules: two replicas drawing the same example is a duplicate, one
// replica's copies in two processes (pipeline stages there) are not, and counted once.
TEST(Trainer, DataEachReplicaDrewIsCountedAndDuplicatesAreFound) {
  const train::DataLoaderOptions lo{.seq = 16, .micro_batch = 4, .replicas = 2};
  auto feed = TrainFeed::open(corpus() + "/data", lo, {0, 1}, false);
  ASSERT_TRUE(feed.is_ok()) << feed.status().to_string();
  const graph::Graph g = feed_model(feed->token_index().vocab_size, false);
  ASSERT_TRUE(feed->bind(g, {{"input_ids", "tokens"}}, "test").is_ok());
  for (int call = 0; call < 3; ++call) ASSERT_TRUE(feed->next_call(2).is_ok());
  const TrainFeed::DataStats& ds = feed->data_stats();
  EXPECT_EQ(ds.examples, (std::vector<int64_t>{24, 24}));  // 3 calls x 2 micro-batches x 4 examples
  EXPECT_EQ(ds.last_call.size(), 16u);
  using Line = std::vector<std::pair<std::string, double>>;
  auto line = data_consumed(*feed, nullptr);
  ASSERT_TRUE(line.is_ok()) << line.status().to_string();
  EXPECT_EQ(*line, (Line{{"data.r0", 24.0}, {"data.r1", 24.0}, {"data.duplicates", 0.0}}));
  // Sharded wrong: replicas 0 and 1 drew examples 5 and 6 both (2 duplicates); replica 2 drew example 5 too (1 more).
  EXPECT_EQ(data_line({0, 1, 2}, {2, 2, 2}, {{5, 0}, {6, 0}, {5, 1}, {6, 1}, {5, 2}, {7, 2}}),
            (Line{{"data.r0", 2.0}, {"data.r1", 2.0}, {"data.r2", 2.0}, {"data.duplicates", 3.0}}));
  // Replica 0 in two processes (its stages) and replica 1: copies are not duplicates, nor counted twice.
  EXPECT_EQ(data_line({0, 0, 1}, {2, 2, 2}, {{5, 0}, {6, 0}, {5, 0}, {6, 0}, {7, 1}, {8, 1}}),
            (Line{{"data.r0", 2.0}, {"data.r1", 2.0}, {"data.duplicates", 0.0}}));
  EXPECT_TRUE(data_line({0, 0}, {2, 2}, {{5, 0}, {5, 0}}).empty());  // one replica: no line
}

// documents and leaves the prediction across a boundary untrained; the
// trainer builds the block-diagonal graph and reports what the mask keeps.
TEST(Trainer, PackingKeepsDocumentsApart) {
  const train::DataLoaderOptions lo{.seq = 16, .micro_batch = 4};
  auto feed = TrainFeed::open(corpus() + "/data", lo, {0}, false);
  ASSERT_TRUE(feed.is_ok()) << feed.status().to_string();
  const int32_t eos = feed->token_index().eos_id;
  feed->set_packing(eos);
  const graph::Graph g = feed_model(feed->token_index().vocab_size, true);
  ASSERT_TRUE(feed->bind(g, {{"input_ids", "tokens"}}, "test").is_ok());
  auto call = feed->next_call(1);
  ASSERT_TRUE(call.is_ok()) << call.status().to_string();
  const int32_t* tok = (*call)->at("input_ids").data<int32_t>();
  const int32_t* pos = (*call)->at("positions").data<int32_t>();
  const int32_t* seg = (*call)->at("segments").data<int32_t>();
  const int32_t* tgt = (*call)->at("targets").data<int32_t>();
  int64_t boundaries = 0;
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t k = 0; k < 16; ++k) {
      const int64_t i = r * 16 + k;
      const bool starts = k == 0 || tok[i - 1] == eos;
      EXPECT_EQ(pos[i], starts ? 0 : pos[i - 1] + 1) << "row " << r << " token " << k;
      EXPECT_EQ(seg[i], k == 0 ? 0 : seg[i - 1] + (starts ? 1 : 0)) << "row " << r << " token " << k;
      if (tok[i] == eos) {
        EXPECT_EQ(tgt[i], -100) << "row " << r << " token " << k;
        ++boundaries;
      } else if (k + 1 < 16) {
        EXPECT_EQ(tgt[i], tok[i + 1]);
      }
    }
  EXPECT_GT(boundaries, 4);  // the addition problems are shorter than a row
  EXPECT_EQ(feed->packing_stats().rows, 4);

  for (const char* family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    TempDir run(std::string("packing_") + family);
    train::TrainConfig c = tiny_config(run.path);
    c.model.family = family;
    c.data.packing = true;
    auto r = train(c);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_LT(r->last_loss, r->first_loss);
    EXPECT_GT(r->documents_per_row, 1.0);
    EXPECT_GT(r->kept_attention_pairs, 0.0);
    EXPECT_LT(r->kept_attention_pairs, 1.0);
  }
}

// model.attention: DeepSpeed's sparsity configs train every causal family
// (with packing too); a bad one is refused naming the key.
TEST(Trainer, SparseAttentionTrains) {
  for (const char* family : {"gpt2", "gptj", "llama"}) {
    SCOPED_TRACE(family);
    TempDir run(std::string("sparse_") + family);
    train::TrainConfig c = tiny_config(run.path);
    c.model.family = family;
    c.model.attention = {{"kind", "bigbird"}, {"block", "4"}, {"num_sliding_window_blocks", "1"}};
    c.data.packing = std::string(family) == "llama";
    auto r = train(c);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_LT(r->last_loss, r->first_loss);
    // The model keeps its layout (NOTE [model layouts]): the export records it, a fine-tune of the export
    // trains through it again, and the generator opens it (models/generate_test.cc checks its tokens).
    auto m = models::Checkpoint::open(run.path + "/model");
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_TRUE(m->config().sparse_attention.has_value());
    EXPECT_EQ(m->config().sparse_attention->kind, kernels::SparsityConfig::Kind::bigbird);
    EXPECT_EQ(m->config().sparse_attention->block, 4);
    EXPECT_EQ(m->config().sparse_attention->seed, c.train.seed);
    EXPECT_EQ(m->config().sparse_attention->attention, kernels::SparsityConfig::Attention::unidirectional);
    if (std::string(family) != "gpt2") continue;
    {
      auto gen = models::Generator::open(run.path + "/model", {.max_batch = 2, .max_length = 24, .threads = 1});
      ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
      auto out = (*gen)->generate({{1, 2, 3}, {4}}, {.max_new_tokens = 8, .temperature = 0.0f});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ((*out)[1].size(), 8u);
    }
    TempDir again("sparse_again");
    train::TrainConfig f = tiny_config(again.path);
    f.model.from = run.path + "/model";
    f.train.steps = 2;
    f.schedule.warmup_steps = 0;
    ASSERT_TRUE(train(f).is_ok());
    auto m2 = models::Checkpoint::open(again.path + "/model");
    ASSERT_TRUE(m2.is_ok()) << m2.status().to_string();
    ASSERT_TRUE(m2->config().sparse_attention.has_value());
    EXPECT_EQ(m2->config().sparse_attention->seed, c.train.seed);
  }
  TempDir run("sparse_bad");
  train::TrainConfig c = tiny_config(run.path);
  c.model.attention = {{"kind", "bigbird"}, {"block", "4"}, {"num_sliding_window_blocks", "9"}};
  auto r = train(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("model.attention"), std::string::npos) << r.status().message();
  c.model.attention = {{"kind", "bigbird"}, {"blocks", "4"}};
  r = train(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("model.attention.blocks: expected a key of bigbird sparsity (kind, block"), std::string::npos)
      << r.status().message();
}

// model.attention_dropout: every causal family trains with it; the training losses differ from a run
// without it while validation (no dropout) gives the same loss when nothing is learnt (lr 0); a run stopped
// and resumed draws the uninterrupted run's patterns (the same bits); tensor shards draw the one device's patterns.
TEST(Trainer, AttentionDropoutTrainsResumesAndSkipsValidation) {
  for (const char* family : {"gpt2", "gptj", "llama"}) {
    SCOPED_TRACE(family);
    TempDir with("dropout_" + std::string(family)), without("no_dropout_" + std::string(family));
    train::TrainConfig c = tiny_config(with.path), d = tiny_config(without.path);
    c.model.family = d.model.family = family;
    c.model.attention_dropout = 0.2;
    c.train.steps = d.train.steps = 10;
    auto r = train(c);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_LT(r->last_loss, r->first_loss);
    auto q = train(d);
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    EXPECT_NE(r->first_loss, q->first_loss);  // the same weights and data: only dropout differs
  }
  {  // lr 0: the weights never move; validation has no dropout, training has
    TempDir with("dropout_lr0"), without("no_dropout_lr0");
    train::TrainConfig c = tiny_config(with.path), d = tiny_config(without.path);
    c.optimizer.lr = d.optimizer.lr = 0;
    c.schedule.name = d.schedule.name = "constant";
    c.schedule.warmup_steps = d.schedule.warmup_steps = 0;
    c.model.attention_dropout = 0.5;
    c.train.steps = d.train.steps = 5;
    auto r = train(c), q = train(d);
    ASSERT_TRUE(r.is_ok() && q.is_ok()) << r.status().to_string() << q.status().to_string();
    EXPECT_NE(r->last_loss, q->last_loss);
    ASSERT_GE(r->last_val_loss, 0);
    EXPECT_EQ(r->last_val_loss, q->last_val_loss);
  }
  {  // 10 steps straight against 5 + resume + 5
    TempDir straight("dropout_straight"), stopped("dropout_stopped");
    train::TrainConfig a = tiny_config(straight.path), b = tiny_config(stopped.path);
    a.model.attention_dropout = b.model.attention_dropout = 0.3;
    a.train.steps = b.train.steps = 10;
    auto ra = train(a);
    ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
    ASSERT_TRUE(train(b, false, 5).is_ok());
    auto rb = train(b, /*resume=*/true);
    ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
    auto ca = train::load_checkpoint(straight.path + "/checkpoints");
    auto cb = train::load_checkpoint(stopped.path + "/checkpoints");
    ASSERT_TRUE(ca.is_ok() && cb.is_ok());
    expect_same_bits(ca->weights, cb->weights, "weights");
    EXPECT_EQ(ra->last_loss, rb->last_loss);
  }
  // Tensor shards: each shard's heads draw the whole model's pattern for them (the state "state.tensor.shard"),
  // so 2 shards train as one device does with the same dropout, to rounding (the llama family: GQA heads too).
  for (const char* family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    TempDir one(std::string("dropout_one_") + family), shards(std::string("dropout_tp_") + family);
    train::TrainConfig a = layout_config(one.path, 1, 1, 1, 2, 4, true), b = layout_config(shards.path, 1, 1, 2, 2, 4, true);
    for (train::TrainConfig* c : {&a, &b}) {
      c->model.family = family;
      c->model.attention_dropout = 0.3;
    }
    auto ra = train(a), rb = train(b);
    ASSERT_TRUE(ra.is_ok() && rb.is_ok()) << ra.status().to_string() << rb.status().to_string();
    auto ca = train::load_checkpoint(one.path + "/checkpoints");
    auto cb = train::load_checkpoint(shards.path + "/checkpoints");
    ASSERT_TRUE(ca.is_ok() && cb.is_ok());
    EXPECT_LT(max_weight_diff(*ca, *cb), 1e-5);
    EXPECT_NEAR(ra->last_loss, rb->last_loss, 1e-5 * ra->last_loss);
  }
}

TEST(Trainer, RefusesTheCheckpointOfAnotherModel) {
  TempDir run("other");
  train::TrainConfig c = tiny_config(run.path);
  c.train.steps = 2;
  c.schedule.warmup_steps = 0;
  c.eval.interval = 0;
  ASSERT_TRUE(train(c).is_ok());
  c.model.d_model = 48;
  c.train.steps = 4;
  auto r = train(c, /*resume=*/true);
  ASSERT_FALSE(r.is_ok());
  const std::string msg = r.status().to_string();
  EXPECT_NE(msg.find(run.path + "/checkpoints"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[32]"), std::string::npos) << msg;  // what the checkpoint has
  EXPECT_NE(msg.find("f32[48]"), std::string::npos) << msg;  // what this model expects
}

// Weights pushed to infinity by an absurd learning rate: the run stops at the
// first non-finite loss, naming the step, and the checkpoint of step 4 stays
// whole and loadable.
TEST(Trainer, NonFiniteLossStopsAndKeepsTheLastCheckpoint) {
  TempDir run("nan");
  train::TrainConfig c = tiny_config(run.path);
  c.train.steps = 4;
  c.eval.interval = 0;
  ASSERT_TRUE(train(c).is_ok());
  c.train.steps = 12;
  c.optimizer.lr = 1e30;
  c.schedule.name = "constant";
  c.schedule.warmup_steps = 0;
  auto r = train(c, /*resume=*/true);
  ASSERT_FALSE(r.is_ok());
  const std::string msg = r.status().to_string();
  EXPECT_NE(msg.find("training step "), std::string::npos) << msg;
  EXPECT_NE(msg.find("first non-finite tensor"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the checkpoint of step 4"), std::string::npos) << msg;
  auto ck = train::load_checkpoint(run.path + "/checkpoints");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ(ck->step, 4);
}

// Fine-tuning: the tiny Hugging Face GPT-2 (vocabulary 1000 >= the corpus's 257).
TEST(Trainer, FineTunesAHuggingFaceDirectory) {
  TempDir run("finetune");
  train::TrainConfig c = tiny_config(run.path);
  c.model.from = kTestdata + "/gpt2-tiny";
  c.train.steps = 4;
  c.eval.interval = 2;
  auto r = train(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 4);
  EXPECT_GT(r->last_val_loss, 0.0);
  auto m = models::Checkpoint::open(run.path + "/model");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->config().model_type, "gpt2");
  ASSERT_NE(m->config().gpt2(), nullptr);
  EXPECT_EQ(m->config().gpt2()->vocab, 1000);
  EXPECT_TRUE(fs::exists(run.path + "/loss.svg"));
  EXPECT_TRUE(fs::exists(run.path + "/config.yaml"));
}

// NOTE [fine-tuning loads in place]: before its first step a fine-tuning job holds the checkpoint's weights, bit
// for bit (each read from the file straight into its parameter after the model is made).
TEST(Trainer, FineTuningStartsFromTheCheckpointsWeights) {
  TempDir run("finetune_start");
  train::TrainConfig c = tiny_config(run.path);
  c.model.from = kTestdata + "/gpt2-tiny";
  std::ostringstream log;
  auto tr = Trainer::create(c, {.out = &log});
  ASSERT_TRUE(tr.is_ok()) << tr.status().to_string();
  auto held = (*tr)->model()->copy_weights_to_host();
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  auto ckpt = models::Checkpoint::open(c.model.from);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  graph::Graph g;
  graph::Builder b(g);
  ASSERT_TRUE(models::build_causal_lm(b, ckpt->config(), {.batch = 1, .seq = 1}).is_ok());
  auto file = models::read_weights(g, *ckpt);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_EQ(held->size(), file->size());
  for (const auto& [name, t] : *file) {
    auto it = held->find(name);
    ASSERT_NE(it, held->end()) << name;
    ASSERT_EQ(it->second.nbytes(), t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(it->second.raw(), t.raw(), t.nbytes()), 0) << name;
  }
}

// ---- nothing a user had is lost ----------------------------------------------------------------

// A second job on a run directory is refused while the first holds it, naming the holder.
TEST(Trainer, TwoJobsInOneRunDirectory) {
  TempDir run("two_jobs");
  train::TrainConfig c = tiny_config(run.path);
  std::ostringstream sink;
  auto first = Trainer::create(c, {.out = &sink});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto second = Trainer::create(c, {.out = &sink, .overwrite = true});
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(second.status().message(),
            "run directory '" + run.path + "': expected no other job using it, found one running (pid " +
                std::to_string(getpid()) + ", holding " + run.path + "/.lock) (hint: wait for it to finish, or give "
                "this job another directory)");
  // A checkpoint directory outside the run directory is locked too.
  TempDir other("two_jobs_other");
  train::TrainConfig d = tiny_config(other.path);
  d.checkpoint.dir = run.path + "/../" + fs::path(run.path).filename().string() + "_ckpt";
  auto third = Trainer::create(d, {.out = &sink});
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  train::TrainConfig e = tiny_config(run.path + "_e");
  e.checkpoint.dir = d.checkpoint.dir;
  auto fourth = Trainer::create(e, {.out = &sink});
  ASSERT_FALSE(fourth.is_ok());
  EXPECT_EQ(fourth.status().subject(), "checkpoint directory (checkpoint.dir) '" + d.checkpoint.dir + "'");
  first->reset();
  third->reset();
  fs::remove_all(d.checkpoint.dir);
  fs::remove_all(run.path + "_e");
}

// Rerunning a config over a finished run is refused unless resuming or overwriting.
TEST(Trainer, RefusesARunDirectoryThatHoldsARun) {
  TempDir run("rerun");
  train::TrainConfig c = tiny_config(run.path);
  c.train.steps = 4;
  c.eval.interval = 0;
  ASSERT_TRUE(train(c).is_ok());
  auto again = Trainer::create(c);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(again.status().message(),
            "run directory '" + run.path + "': expected a new or empty run directory, found an earlier run's files: "
            "metrics.jsonl, an exported model, 1 checkpoint (newest step-00000004) (hint: --resume continues that "
            "run, --overwrite deletes it and starts again, --run-dir DIR (or log.run_dir) starts elsewhere)");
  // --overwrite: the old run's files go; the new run's metrics are its own.
  std::ostringstream sink;
  c.train.steps = 2;
  c.schedule.warmup_steps = 0;
  auto t = Trainer::create(c, {.out = &sink, .overwrite = true});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_NE(sink.str().find("replacing the earlier run in " + run.path), std::string::npos) << sink.str();
  EXPECT_FALSE(fs::exists(run.path + "/model"));
  ASSERT_TRUE((*t)->run().is_ok());
  auto steps = train::read_metric(run.path + "/metrics.jsonl", "loss");
  ASSERT_TRUE(steps.is_ok());
  EXPECT_EQ(steps->size(), 2u);
  auto list = train::list_checkpoints(run.path + "/checkpoints");
  ASSERT_TRUE(list.is_ok());
  EXPECT_EQ(*list, std::vector<std::string>{run.path + "/checkpoints/step-00000002"});
}

// Every output directory is checked before step 1, not at the first save.
TEST(Trainer, UnwritableOutputDirectoryFailsBeforeTraining) {
  TempDir run("unwritable");
  train::TrainConfig c = tiny_config(run.path + "/run");
  { std::ofstream(run.path + "/file") << "x"; }
  c.checkpoint.dir = run.path + "/file/checkpoints";
  auto t = Trainer::create(c);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kIoError);
  EXPECT_EQ(t.status().subject(), "checkpoint directory (checkpoint.dir) '" + run.path + "/file/checkpoints'");
  EXPECT_EQ(t.status().expected(), "a directory that exists or can be created");
}

// A flipped byte in the latest checkpoint is an error naming the file; nothing
// falls back silently, and the hint names the checkpoint before it, which
// resume_from then loads.
TEST(Trainer, DamagedCheckpointIsRefusedAndAnEarlierOneCanBeChosen) {
  TempDir run("damaged");
  train::TrainConfig c = tiny_config(run.path);
  c.train.steps = 6;
  c.eval.interval = 0;
  c.checkpoint.interval = 2;
  ASSERT_TRUE(train(c, false, 4).is_ok());
  const std::string latest = run.path + "/checkpoints/step-00000004/model.safetensors";
  std::string bytes = io::test_files::read_bytes(latest);
  bytes.back() ^= 0x40;
  io::test_files::write_bytes(latest, bytes);
  auto r = Trainer::create(c, {.resume = true});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_EQ(r.status().subject(), latest);
  EXPECT_EQ(r.status().hint(), "the checkpoint is damaged; to resume from the one before it: --resume-from " +
                                   run.path + "/checkpoints/step-00000002");
  std::ostringstream sink;
  auto from = Trainer::create(c, {.out = &sink, .resume_from = run.path + "/checkpoints/step-00000002"});
  ASSERT_TRUE(from.is_ok()) << from.status().to_string();
  EXPECT_EQ((*from)->step(), 2);
  auto done = (*from)->run();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  EXPECT_EQ(done->steps, 6);
}

// Every field of trainer.json read back is checked (a version-1 checkpoint has no checksum to catch an edit).
TEST(Trainer, TrainerStateFieldsAreValidated) {
  TempDir run("trainer_state");
  train::TrainConfig c = tiny_config(run.path);
  c.train.steps = 4;
  c.eval.interval = 0;
  ASSERT_TRUE(train(c, false, 2).is_ok());
  const std::string path = run.path + "/checkpoints/step-00000002/trainer.json";
  const std::string text = io::test_files::read_bytes(path);
  auto with = [&](const std::string& key, const std::string& value) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
    j["version"] = 1;
    j.erase("files");
    j.erase("trainer_crc32c");
    if (key == "scale") j["trainer"]["loss_scaler"]["scale"] = nlohmann::ordered_json::parse(value);
    if (key == "skipped") j["trainer"]["loss_scaler"]["skipped"] = nlohmann::ordered_json::parse(value);
    if (key == "epoch") j["trainer"]["data_position"]["epoch"] = nlohmann::ordered_json::parse(value);
    io::test_files::write_bytes(path, j.dump());
    std::ostringstream sink;
    return Trainer::create(c, {.resume = true, .out = &sink}).status();
  };
  for (const char* bad : {"-1", "2", "1e300"}) {
    const Status s = with("scale", bad);
    EXPECT_EQ(s.code(), Code::kCorrupt) << bad;
    EXPECT_EQ(s.subject(), run.path + "/checkpoints: trainer.json: loss_scaler: scale") << s.to_string();
    EXPECT_EQ(s.expected(), "1 (precision.loss_scaling is none)") << bad;
  }
  EXPECT_EQ(with("skipped", "7").expected(), "in [0, 2] (the steps done)");
  EXPECT_EQ(with("epoch", "-3").subject(), run.path + "/checkpoints: trainer.json: data_position");
  EXPECT_TRUE(with("scale", "1").is_ok());
}

// A token shard truncated under a run: a Corrupt error naming the shard, not a SIGBUS.
TEST(Trainer, TruncatedShardIsAnErrorNotACrash) {
  TempDir run("truncated");
  fs::copy(corpus() + "/data", run.path + "/data");
  train::TrainConfig c = tiny_config(run.path + "/run");
  c.data.train = run.path + "/data";
  c.train.steps = 4;
  c.eval.interval = 0;
  c.checkpoint.interval = 1;
  ASSERT_TRUE(train(c, false, 2).is_ok());
  std::ostringstream sink;
  auto t = Trainer::create(c, {.resume = true, .out = &sink});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto index = train::read_token_index(run.path + "/data");
  ASSERT_TRUE(index.is_ok() && !index->shards.empty());
  const std::string shard = run.path + "/data/" + index->shards.front().name;
  fs::resize_file(shard, 64);
  auto r = (*t)->run();
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().subject().find(shard), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().subject().find("training stopped at step 2 (the checkpoint of step 2 in " + run.path +
                                      "/run/checkpoints is intact)"),
            std::string::npos)
      << r.status().to_string();
  EXPECT_NE(r.status().found().find("truncated"), std::string::npos) << r.status().to_string();
}

// A shard cut under a run, after some steps finished: the run stops at the
// first step that reads past the cut and first writes a checkpoint of the last
// finished step (nothing a user had is lost). The cut is placed from the
// loader's own order, so the failing step is known.
TEST(Trainer, FailureAfterFinishedStepsCheckpointsTheLastOne) {
  TempDir run("cut");
  fs::copy(corpus() + "/data", run.path + "/data");
  train::TrainConfig c = tiny_config(run.path + "/run");
  c.data.train = run.path + "/data";
  c.train.steps = 50;
  c.eval.interval = 0;
  c.checkpoint.interval = 0;
  train::DataLoaderOptions lo;
  lo.seq = c.data.seq, lo.micro_batch = c.batch.micro, lo.val_fraction = c.data.val_fraction, lo.seed = c.train.seed;
  auto loader = train::DataLoader::open(c.data.train, lo);
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  // need(k): tokens step k reads up to; the first k >= 3 reaching past all earlier steps.
  auto need = [&](int64_t k) {
    int64_t end = 0;
    for (int64_t e : loader->batch_examples(0, k)) end = std::max(end, (e + 1) * c.data.seq + 1);
    return end;
  };
  int64_t covered = std::max({need(0), need(1), need(2)}), fail_at = 3;
  while (need(fail_at) <= covered) covered = std::max(covered, need(fail_at++));
  ASSERT_LT(fail_at, 40);
  auto index = train::read_token_index(c.data.train);
  ASSERT_TRUE(index.is_ok());
  ASSERT_EQ(index->shards.size(), 1u);
  const std::string shard = c.data.train + "/" + index->shards.front().name;
  std::ostringstream sink;
  auto t = Trainer::create(c, {.out = &sink});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  fs::resize_file(shard, uint64_t(train::kTokenShardHeaderBytes) + uint64_t(covered) * 2);  // uint16 tokens
  auto r = (*t)->run();
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().subject().find("training stopped at step " + std::to_string(fail_at) + " (a checkpoint of step " +
                                      std::to_string(fail_at) + " was written to " + run.path + "/run/checkpoints)"),
            std::string::npos)
      << r.status().to_string();
  auto ck = train::load_checkpoint(run.path + "/run/checkpoints");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ(ck->step, fail_at);
}

// A stop request (Ctrl-C in the CLI) ends the run after the step in flight with a checkpoint of it.
TEST(Trainer, StopRequestCheckpointsTheLastStep) {
  TempDir run("stop");
  train::TrainConfig c = tiny_config(run.path);
  c.train.steps = 10;
  c.eval.interval = 0;
  c.log.progress = "lines";
  c.log.interval = 1;
  std::atomic<bool> stop{false};
  // The progress line of step 3 asks to stop, as a signal handler would.
  struct Trip : std::streambuf {
    std::atomic<bool>* flag;
    std::string seen;
    int overflow(int ch) override {
      seen.push_back(char(ch));
      if (seen.find(" 3/10 ") != std::string::npos) flag->store(true);
      return ch;
    }
  } trip;
  trip.flag = &stop;
  std::ostream out(&trip);
  auto t = Trainer::create(c, {.out = &out, .stop_requested = &stop});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto r = (*t)->run();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->interrupted);
  EXPECT_EQ(r->steps, 3);
  EXPECT_NE(trip.seen.find("interrupted at step 3 of 10; checkpoint of step 3 in " + run.path + "/checkpoints"),
            std::string::npos)
      << trip.seen;
  auto ck = train::load_checkpoint(run.path + "/checkpoints");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ(ck->step, 3);
  t->reset();
  auto resumed = train(c, /*resume=*/true);
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().to_string();
  EXPECT_EQ(resumed->steps, 10);
}

// Fine-tuning a 257-token model on shards of a 1000-token vocabulary is refused before step 1.
TEST(Trainer, VocabularyMismatchIsRefusedInTheUsersTerms) {
  TempDir run("vocab");
  train::TrainConfig small = tiny_config(run.path + "/small");
  small.train.steps = 1;
  small.schedule.warmup_steps = 0;
  small.eval.interval = 0;
  ASSERT_TRUE(train(small).is_ok());  // a model of the corpus's 257 tokens
  train::TokenShardWriterOptions wo;
  wo.vocab_size = 1000, wo.eos_id = 999;
  auto w = train::TokenShardWriter::create(run.path + "/wide", wo);
  ASSERT_TRUE(w.is_ok());
  std::vector<io::TokenId> ids(4000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = io::TokenId(i % 1000);
  ASSERT_TRUE(w->add_document(ids).is_ok());
  ASSERT_TRUE(w->finish().is_ok());
  train::TrainConfig c = tiny_config(run.path + "/tune");
  c.model.from = run.path + "/small/model";
  c.data.train = run.path + "/wide";
  auto t = Trainer::create(c);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "data.train '" + run.path + "/wide': expected token ids the model knows (model.from " + run.path +
                "/small/model has a vocabulary of 257 tokens), found token shards of a 1000-token vocabulary "
                "(tokenized with another tokenizer) (hint: prepare the data with the model's own tokenizer: aspen "
                "prepare-data --tokenizer " + run.path + "/small/model --input FILE --output DIR)");
}

// Shards tokenized by another tokenizer than the one the model trains with are refused, naming both (they
// once trained without a word: BERT on GPT-2's BPE shards, GPT-2 on WordPiece shards).
TEST(Trainer, ShardsOfAnotherTokenizerAreRefused) {
  TempDir run("other_tokenizer");
  const std::string other = run.path + "/other_tok";
  ASSERT_TRUE(train::write_byte_tokenizer(other).is_ok());
  std::ofstream(other + "/merges.txt", std::ios::app) << "1 2\n";  // one merge more: another tokenizer
  train::TrainConfig c = tiny_config(run.path + "/run");
  c.data.tokenizer = other;
  auto t = Trainer::create(c);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  const std::string msg = t.status().message();
  EXPECT_NE(msg.find("expected token shards made with the model's tokenizer (" + other + ", fingerprint "),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("found shards made with " + corpus() + "/tok (fingerprint "), std::string::npos) << msg;
  EXPECT_NE(msg.find("aspen prepare-data --tokenizer " + other), std::string::npos) << msg;
}

// Dimensions beyond any real model, or beyond this machine's memory, are refused before a graph is built.
TEST(Trainer, ModelDimensionsAreBoundedBeforeBuilding) {
  TempDir run("dims");
  train::TrainConfig c = tiny_config(run.path);
  c.model.n_layer = 1000000000;
  EXPECT_EQ(Trainer::create(c).status().message(),
            "config: model: gpt2 config: n_layer: expected at most 4096 (larger than any real model), found 1000000000");
  c = tiny_config(run.path);
  c.model.n_positions = 1000000000;
  EXPECT_EQ(Trainer::create(c).status().subject(), "config: model: gpt2 config: n_positions");
  c = tiny_config(run.path);
  c.model.n_layer = 4000, c.model.d_model = 8192, c.model.n_head = 8;
  const Status big = Trainer::create(c).status();
  EXPECT_EQ(big.code(), Code::kInvalidArgument);
  EXPECT_EQ(big.subject(), "config: model");
  EXPECT_EQ(big.expected().rfind("a model that fits in this machine's ", 0), 0u) << big.to_string();
}

TEST(Trainer, BadConfigsNameTheKey) {
  TempDir run("bad");
  train::TrainConfig c = tiny_config(run.path);
  c.train.device_iterations = 3;  // 20 is not a multiple
  auto r = Trainer::create(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().subject(), "config: train.steps") << r.status().to_string();
  c = tiny_config(run.path);
  c.data.train = run.path + "/nothing";
  r = Trainer::create(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find(run.path + "/nothing"), std::string::npos) << r.status().to_string();
}

// Layouts that do not fit the model or each other are refused before any
// compute, naming the numbers.
TEST(Trainer, BadLayoutsNameTheNumbers) {
  TempDir run("bad_layout");
  train::TrainConfig c = tiny_config(run.path);  // 2 heads, d_model 32
  c.parallel.tensor_parallel = 3;
  auto r = Trainer::create(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("tensor_parallel 3: expected a divisor of n_head (2), found 3"),
            std::string::npos)
      << r.status().to_string();
  c = tiny_config(run.path);
  c.parallel.pipeline_stages = 100000;
  r = Trainer::create(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("pipeline: stages"), std::string::npos) << r.status().to_string();
  // A vocabulary split on demand that does not divide (the byte tokenizer's 257 classes).
  c = tiny_config(run.path);
  c.parallel.tensor_parallel = 2;
  c.parallel.vocab_parallel = "on";
  c.model.vocab = 259;
  r = Trainer::create(c);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("vocab_parallel over 2 shards: expected a vocabulary divisible by 2, found 259"),
            std::string::npos)
      << r.status().to_string();
}

// Two data-parallel replicas of micro-batch 2 take the micro-batches one
// device accumulating two of them takes, and add their gradients in the same
// order: the same bits. A checkpoint of one layout resumes under the other
// at the same place in the data (the position is kept in examples).
TEST(Trainer, DataParallelEqualsAccumulationAndResumesAcrossLayouts) {
  TempDir one("one"), two("two"), mixed("mixed");
  auto layout = [](const std::string& dir, int64_t replicas) {
    return layout_config(dir, replicas, 1, 1, /*micro=*/2, /*batch=*/4, false);
  };
  auto r1 = train(layout(one.path, 1));
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  auto r2 = train(layout(two.path, 2));
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  EXPECT_EQ(r1->last_loss, r2->last_loss);
  EXPECT_EQ(r1->last_val_loss, r2->last_val_loss);
  auto c1 = train::load_checkpoint(one.path + "/checkpoints");
  auto c2 = train::load_checkpoint(two.path + "/checkpoints");
  ASSERT_TRUE(c1.is_ok() && c2.is_ok());
  expect_same_bits(c1->weights, c2->weights, "weights");
  expect_same_bits(c1->optimizer, c2->optimizer, "optimizer state");
  // 10 steps on one device, then 10 more on two replicas.
  auto m1 = train(layout(mixed.path, 1), false, 10);
  ASSERT_TRUE(m1.is_ok()) << m1.status().to_string();
  auto m2 = train(layout(mixed.path, 2), /*resume=*/true);
  ASSERT_TRUE(m2.is_ok()) << m2.status().to_string();
  auto cm = train::load_checkpoint(mixed.path + "/checkpoints");
  ASSERT_TRUE(cm.is_ok());
  expect_same_bits(c1->weights, cm->weights, "weights after a layout change");
  // A layout that cannot express the position is refused, naming it.
  train::TrainConfig odd = layout(mixed.path, 1);
  odd.batch.micro = 3, odd.batch.accumulation = 1, odd.train.steps = 30;
  auto bad = Trainer::create(odd, {.resume = true});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("data position"), std::string::npos) << bad.status().to_string();
}

// A checkpoint moves between layouts: 8 steps as 2 pipeline stages, 6 more as
// 2 data-parallel replicas, the last 6 on one device, against 20 steps on one
// device. Pipeline stages recompute and add a tied weight's gradients in
// another order, so the weights agree to f32 rounding, not to the bit.
TEST(Trainer, CheckpointsMoveBetweenLayouts) {
  TempDir straight("relayout_straight"), moved("relayout_moved");
  auto layout = [](const std::string& dir, int64_t replicas, int64_t stages) {
    return layout_config(dir, replicas, stages, 1, /*micro=*/2, /*batch=*/4, true);
  };
  auto ra = train(layout(straight.path, 1, 1));
  ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
  auto r1 = train(layout(moved.path, 1, 2), false, 8);
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  auto r2 = train(layout(moved.path, 2, 1), true, 14);
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  auto r3 = train(layout(moved.path, 1, 1), true);
  ASSERT_TRUE(r3.is_ok()) << r3.status().to_string();
  EXPECT_EQ(r3->steps, 20);
  auto ca = train::load_checkpoint(straight.path + "/checkpoints");
  auto cb = train::load_checkpoint(moved.path + "/checkpoints");
  ASSERT_TRUE(ca.is_ok() && cb.is_ok());
  EXPECT_LT(max_weight_diff(*ca, *cb), 1e-5);
  EXPECT_NEAR(ra->last_loss, r3->last_loss, 1e-5 * ra->last_loss);
}

// Data parallel over tensor shards: 2 replicas of 2 shards (4 devices) against
// one device accumulating the same 2 micro-batches (SGD, 20 steps).
TEST(Trainer, ReplicasOfTensorShardsEqualOneDevice) {
  TempDir one("dptp_one"), grid("dptp_grid");
  auto layout = [](const std::string& dir, int64_t replicas, int64_t tp) {
    return layout_config(dir, replicas, 1, tp, /*micro=*/2, /*batch=*/4, true);
  };
  auto r1 = train(layout(one.path, 1, 1));
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  auto r4 = train(layout(grid.path, 2, 2));
  ASSERT_TRUE(r4.is_ok()) << r4.status().to_string();
  auto ca = train::load_checkpoint(one.path + "/checkpoints");
  auto cb = train::load_checkpoint(grid.path + "/checkpoints");
  ASSERT_TRUE(ca.is_ok() && cb.is_ok());
  EXPECT_LT(max_weight_diff(*ca, *cb), 1e-5);
  EXPECT_NEAR(r1->last_loss, r4->last_loss, 1e-5 * r1->last_loss);
}

// The re-layout chain: 2 replicas x 2 stages, then 2 tensor shards,
// then one device (SGD, 6 + 7 + 7 steps), against 20 steps on one device.
TEST(Trainer, CheckpointsMoveFromReplicasAndStagesToTensorShardsToOneDevice) {
  TempDir straight("tp_straight"), moved("tp_moved");
  auto layout = [](const std::string& dir, int64_t replicas, int64_t stages, int64_t tp) {
    return layout_config(dir, replicas, stages, tp, /*micro=*/1, /*batch=*/4, true);
  };
  auto ra = train(layout(straight.path, 1, 1, 1));
  ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
  auto r1 = train(layout(moved.path, 2, 2, 1), false, 6);
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  auto r2 = train(layout(moved.path, 1, 1, 2), true, 13);
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  auto r3 = train(layout(moved.path, 1, 1, 1), true);
  ASSERT_TRUE(r3.is_ok()) << r3.status().to_string();
  EXPECT_EQ(r3->steps, 20);
  auto ca = train::load_checkpoint(straight.path + "/checkpoints");
  auto cb = train::load_checkpoint(moved.path + "/checkpoints");
  ASSERT_TRUE(ca.is_ok() && cb.is_ok());
  EXPECT_LT(max_weight_diff(*ca, *cb), 1e-5);
  // The optimizer state crossed the layouts too (SGD's momentum buffers, whole).
  for (const auto& [name, t] : ca->optimizer) EXPECT_EQ(cb->optimizer.at(name).shape(), t.shape()) << name;
}

}  // namespace
}  // namespace aspen::api
