// Masked language modelling of a BERT from a Hugging Face directory (NOTE [bert fine-tuning] in trainer.cc):
// the feed's masking (shares, special tokens, reproducibility), training and resuming, a checkpoint without the
// head, position embeddings grown past the checkpoint's, a sparse bidirectional layout, the export as
// BertForMaskedLM, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/trainer.h"
#include "api/trainer_feed.h"
#include "graph/builder.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "io/tokenizer.h"
#include "models/bert.h"
#include "models/embedder.h"
#include "models/init.h"
#include "models/weights.h"
#include "train/checkpoint.h"
#include "train/data.h"

namespace aspen::api {
namespace {

namespace fs = std::filesystem;

// A fresh directory per use, removed after (io/test_files.h's, with the member this file's code reads).
struct TempDir {
  io::test_files::TempDir dir;
  std::string path;
  explicit TempDir(const std::string& name) : dir("aspen_trainer_bert_test_" + name), path(dir.path()) {}
};

// A tiny random BERT over io/testdata/wordpiece_tiny's 34 tokens (16 learned positions), exported with its
// MLM head to <dir>/bert and without it (BertModel's names) to <dir>/bert-encoder, and token shards of
// sentences in its vocabulary ([CLS] ... [SEP] per line) in <dir>/data.
const std::string& fixture() {
  static TempDir dir("fixture");
  static bool made = [] {
    models::ModelConfig mc;
    mc.model_type = "bert";
    mc.family = models::BertConfig{.vocab = 34, .max_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 2,
                                   .d_ff = 64};
    mc.pad_token_id = 0;
    graph::Graph g;
    graph::Builder b(g);
    EXPECT_TRUE(models::build_bert(b, *mc.bert(), {.batch = 1, .seq = 1, .mlm_head = true}).is_ok());
    auto w = models::init_weights(g, {.seed = 7});
    EXPECT_TRUE(w.is_ok());
    EXPECT_TRUE(models::export_hf_model(dir.path + "/bert", mc, *w, ASPEN_WORDPIECE_TINY_DIR).is_ok());
    fs::create_directories(dir.path + "/bert-encoder");
    std::vector<std::pair<std::string, const Tensor*>> encoder;
    for (const auto& [name, t] : *w)
      if (!name.starts_with("cls.")) encoder.emplace_back(name, &t);
    EXPECT_TRUE(io::write_safetensors(dir.path + "/bert-encoder/model.safetensors", encoder, {{"format", "pt"}}).is_ok());
    for (const char* f : {"config.json", "vocab.txt"})
      fs::copy_file(dir.path + "/bert/" + f, dir.path + "/bert-encoder/" + f);

    std::ofstream text(dir.path + "/text.txt");
    const char* lines[] = {"the quick brown fox jumps over the lazy dog.", "the lazy dog jumped over a brown fox!",
                           "hello world, the fox is quick.", "a quick dog jumps over the brown fox."};
    for (int i = 0; i < 400; ++i) text << lines[i % 4] << "\n";
    text.close();
    auto tok = io::load_tokenizer(ASPEN_WORDPIECE_TINY_DIR);
    EXPECT_TRUE(tok.is_ok());
    train::PrepareOptions o;
    o.tokenizer_dir = ASPEN_WORDPIECE_TINY_DIR;
    o.inputs = {dir.path + "/text.txt"};
    o.output_dir = dir.path + "/data";
    o.split_lines = true;
    EXPECT_TRUE(train::prepare_token_shards(**tok, o).is_ok());
    return true;
  }();
  (void)made;
  return dir.path;
}

train::TrainConfig bert_config(const std::string& run_dir) {
  train::TrainConfig c;
  c.name = "bert";
  c.model.from = fixture() + "/bert";
  c.data.train = fixture() + "/data";
  c.data.seq = 16;
  c.data.val_fraction = 0.05;
  c.data.mlm_probability = 0.25;
  c.optimizer.lr = 3e-3;
  c.schedule.name = "constant";
  c.schedule.warmup_steps = 0;
  c.batch.micro = 4;
  c.train.steps = 30;
  c.train.threads = 2;
  c.checkpoint.interval = 0;
  c.eval.interval = 10;
  c.eval.batches = 2;
  c.log.run_dir = run_dir;
  c.log.progress = "off";
  return c;
}

Result<TrainResult> train(const train::TrainConfig& c, std::ostringstream* log = nullptr, bool resume = false,
                          int64_t stop_at = 0) {
  std::ostringstream sink;
  ASPEN_ASSIGN_OR_RETURN(auto t, Trainer::create(c, {.resume = resume, .out = log ? log : &sink, .stop_at = stop_at}));
  return t->run();
}

std::map<std::string, Tensor> read_all(const std::string& path) {
  std::map<std::string, Tensor> out;
  auto f = io::SafetensorsFile::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (!f.is_ok()) return out;
  for (const std::string& name : f->names()) {
    auto t = f->read(name);
    EXPECT_TRUE(t.is_ok());
    if (t.is_ok()) out.emplace(name, std::move(t).value());
  }
  return out;
}

// Micro-batches of B rows of T tokens of the fixture's shards (5 % held out).
train::DataLoaderOptions loader(int64_t B, int64_t T) {
  train::DataLoaderOptions lo;
  lo.seq = T;
  lo.micro_batch = B;
  lo.val_fraction = 0.05;
  return lo;
}

// Masking with wordpiece_tiny's [MASK] and special tokens.
TrainFeed::MaskedLm tiny_mlm(double probability, uint64_t seed, int64_t predictions = 0) {
  auto tok = io::load_tokenizer(ASPEN_WORDPIECE_TINY_DIR);
  EXPECT_TRUE(tok.is_ok());
  const io::SpecialTokenIds& sp = (*tok)->special_ids();
  return {.probability = probability, .mask_id = *sp.mask, .vocab = 34,
          .special = {*sp.cls, *sp.sep, *sp.pad, *sp.mask, *sp.unk}, .seed = seed, .predictions = predictions};
}

// The feed's masking over 2,000 rows: the predicted share is mlm_probability within 5 sigma, special tokens
// are never predicted, a predicted token reads [MASK] 80 %, itself 10 % (+ a random draw of itself), a random
// id 10 %; the others read themselves with target -100. A second feed draws the same masks (nothing but the
// seed and the data decides them), another seed others.
TEST(TrainerBert, MaskingFollowsHuggingFacesCollator) {
  auto tok = io::load_tokenizer(ASPEN_WORDPIECE_TINY_DIR);
  ASSERT_TRUE(tok.is_ok());
  const io::SpecialTokenIds& sp = (*tok)->special_ids();
  const int64_t B = 8, T = 16;
  const train::DataLoaderOptions lo = loader(B, T);
  graph::Graph g;
  graph::Builder b(g);
  models::BertConfig bc{.vocab = 34, .max_positions = 16, .d_model = 8, .n_layer = 1, .n_head = 2, .d_ff = 8};
  ASSERT_TRUE(models::build_bert(b, bc, {.batch = B, .seq = T, .mlm_head = true, .with_loss = true}).is_ok());
  const std::map<std::string, std::string> columns = {
      {"input_ids", "tokens"}, {"token_type_ids", "token_types"}, {"attention_mask", "mask"}, {"targets", "targets"}};
  auto open = [&](uint64_t seed, bool mlm) {
    auto f = TrainFeed::open(fixture() + "/data", lo, {0}, false);
    EXPECT_TRUE(f.is_ok()) << f.status().to_string();
    if (mlm) {
      f->set_masked_lm(tiny_mlm(0.15, seed));
      EXPECT_TRUE(f->bind(g, columns, "test").is_ok());
    } else {
      graph::Graph h;
      graph::Builder hb(h);
      hb.output("t", hb.input("input_ids", DType::i32, Shape{B, T}));
      EXPECT_TRUE(f->bind(h, {{"input_ids", "tokens"}}, "test").is_ok());
    }
    return std::move(f).value();
  };
  TrainFeed masked = open(1, true), again = open(1, true), other = open(2, true), plain = open(1, false);
  int64_t predicted = 0, total = 0, as_mask = 0, as_self = 0, differ_other = 0;
  for (int step = 0; step < 250; ++step) {
    auto m = masked.next_call(1);
    auto a = again.next_call(1);
    auto o = other.next_call(1);
    auto p = plain.next_call(1);
    ASSERT_TRUE(m.is_ok() && a.is_ok() && o.is_ok() && p.is_ok()) << m.status().to_string();
    const int32_t* ids = (*m)->at("input_ids").data<int32_t>();
    const int32_t* tgt = (*m)->at("targets").data<int32_t>();
    const int32_t* raw = (*p)->at("input_ids").data<int32_t>();
    ASSERT_EQ(std::memcmp(ids, (*a)->at("input_ids").raw(), B * T * 4), 0);
    ASSERT_EQ(std::memcmp(tgt, (*a)->at("targets").raw(), B * T * 4), 0);
    differ_other += std::memcmp(tgt, (*o)->at("targets").raw(), B * T * 4) != 0;
    for (int64_t e = 0; e < B * T; ++e) {
      const bool special = raw[e] == *sp.cls || raw[e] == *sp.sep || raw[e] == *sp.unk;
      if (!special) ++total;
      if (tgt[e] == -100) {
        ASSERT_EQ(ids[e], raw[e]) << "an unpredicted token is changed at " << e;
        continue;
      }
      ASSERT_FALSE(special) << "special token " << raw[e] << " predicted";
      ASSERT_EQ(tgt[e], raw[e]);
      ASSERT_TRUE(ids[e] >= 0 && ids[e] < 34);
      ++predicted;
      as_mask += ids[e] == *sp.mask;
      as_self += ids[e] == raw[e];
    }
    for (int64_t e = 0; e < B * T; ++e) ASSERT_EQ((*m)->at("token_type_ids").data<int32_t>()[e], 0);
  }
  const double n = double(total), share = double(predicted) / n;
  EXPECT_NEAR(share, 0.15, 5 * std::sqrt(0.15 * 0.85 / n)) << predicted << " of " << total;
  const double k = double(predicted);
  EXPECT_NEAR(double(as_mask) / k, 0.8, 5 * std::sqrt(0.8 * 0.2 / k));
  const double self = 0.1 + 0.1 / 34;
  EXPECT_NEAR(double(as_self) / k, self, 5 * std::sqrt(self * (1 - self) / k));
  EXPECT_GT(differ_other, 240);
  EXPECT_EQ(masked.masked_stats().predicted, predicted);
}

// The head on the predicted rows only (data.max_predictions): the feed lists each row's predicted tokens in
// order, then -100 padding, with the same masks as the feed over every position (and counts what a too small
// K leaves out); training through it gives the loss of the head over every position (lr 0: the same weights).
TEST(TrainerBert, HeadOnThePredictedRowsOnly) {
  const int64_t B = 4, T = 16;
  const train::DataLoaderOptions lo = loader(B, T);
  for (const int64_t K : {int64_t(8), int64_t(2)}) {
    SCOPED_TRACE("K = " + std::to_string(K));
    auto feed = [&](int64_t k) {
      graph::Graph g;
      graph::Builder b(g);
      const models::BertConfig bc{.vocab = 34, .max_positions = 16, .d_model = 8, .n_layer = 1, .n_head = 2, .d_ff = 8};
      EXPECT_TRUE(
          models::build_bert(b, bc, {.batch = B, .seq = T, .mlm_head = true, .with_loss = true, .mlm_predictions = k})
              .is_ok());
      auto f = TrainFeed::open(fixture() + "/data", lo, {0}, false);
      EXPECT_TRUE(f.is_ok());
      f->set_masked_lm(tiny_mlm(0.25, 9, k));
      EXPECT_TRUE(f->bind(g, {{"input_ids", "tokens"}, {"token_type_ids", "token_types"}, {"attention_mask", "mask"}},
                          "test")
                      .is_ok());
      return std::move(f).value();
    };
    TrainFeed all = feed(0), some = feed(K);
    int64_t dropped = 0;
    for (int step = 0; step < 40; ++step) {
      auto a = all.next_call(1), s = some.next_call(1);
      ASSERT_TRUE(a.is_ok() && s.is_ok());
      ASSERT_EQ(std::memcmp((*a)->at("input_ids").raw(), (*s)->at("input_ids").raw(), B * T * 4), 0);
      const int32_t* ta = (*a)->at("targets").data<int32_t>();
      const int32_t* ts = (*s)->at("targets").data<int32_t>();
      const int32_t* ps = (*s)->at("mlm_positions").data<int32_t>();
      for (int64_t r = 0; r < B; ++r) {
        int64_t k = 0;
        for (int64_t t = 0; t < T; ++t) {
          if (ta[r * T + t] == -100) continue;
          if (k == K) {
            ++dropped;
            continue;
          }
          EXPECT_EQ(ps[r * K + k], r * T + t);
          EXPECT_EQ(ts[r * K + k++], ta[r * T + t]);
        }
        for (; k < K; ++k) {
          EXPECT_EQ(ts[r * K + k], -100);
          EXPECT_EQ(ps[r * K + k], r * T);
        }
      }
    }
    EXPECT_EQ(some.masked_stats().dropped, dropped);
    EXPECT_EQ(dropped > 0, K == 2);
  }
  TempDir a_run("every_position"), k_run("predicted_rows");
  train::TrainConfig a = bert_config(a_run.path), k = bert_config(k_run.path);
  for (train::TrainConfig* c : {&a, &k}) {
    c->model.max_positions = 64;
    c->data.seq = 64;
    c->batch.micro = 2;
    c->optimizer.lr = 0;
    c->train.steps = 3;
  }
  a.data.max_predictions = 64;  // every position
  auto ra = train(a), rk = train(k);
  ASSERT_TRUE(ra.is_ok() && rk.is_ok()) << ra.status().to_string() << rk.status().to_string();
  EXPECT_NEAR(ra->first_loss, rk->first_loss, 1e-5 * ra->first_loss);
  EXPECT_NEAR(ra->last_val_loss, rk->last_val_loss, 1e-5 * ra->last_val_loss);
}

// Training lowers the MLM loss; 10 steps straight equal 5 + resume + 5 bit for bit (the masks drawn after the
// resume are the uninterrupted run's); the export is a BertForMaskedLM directory aspen opens again.
TEST(TrainerBert, TrainsResumesAndExports) {
  TempDir run("train");
  train::TrainConfig c = bert_config(run.path);
  c.model.attention_dropout = 0.1;
  auto r = train(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LT(r->last_loss, r->first_loss);
  EXPECT_GT(r->last_val_loss, 0.0);
  EXPECT_LT(r->last_val_loss, std::log(34.0));
  auto m = models::Checkpoint::open(run.path + "/model");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_NE(m->config().bert(), nullptr);
  EXPECT_NE(m->find("cls.predictions.bias").second, nullptr);
  EXPECT_NE(m->find("bert.encoder.layer.1.output.dense.weight").second, nullptr);
  EXPECT_TRUE(fs::exists(run.path + "/model/vocab.txt"));

  TempDir straight("straight"), stopped("stopped");
  train::TrainConfig a = bert_config(straight.path), s = bert_config(stopped.path);
  a.train.steps = s.train.steps = 10;
  auto ra = train(a);
  ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
  ASSERT_TRUE(train(s, nullptr, false, 5).is_ok());
  auto rs = train(s, nullptr, /*resume=*/true);
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  EXPECT_EQ(ra->last_loss, rs->last_loss);
  auto wa = read_all(straight.path + "/model/model.safetensors"), ws = read_all(stopped.path + "/model/model.safetensors");
  ASSERT_EQ(wa.size(), ws.size());
  for (const auto& [name, t] : wa)
    EXPECT_EQ(std::memcmp(t.raw(), ws.at(name).raw(), t.nbytes()), 0) << name;
}

// A checkpoint without the head gets a fresh one (said by name); model.max_positions grows the learned
// positions by copying them (with lr 0 the export shows the copies); a sparse bidirectional layout trains.
TEST(TrainerBert, FreshHeadGrownPositionsAndSparseLayout) {
  {
    TempDir run("fresh");
    train::TrainConfig c = bert_config(run.path);
    c.model.from = fixture() + "/bert-encoder";
    c.train.steps = 10;
    std::ostringstream log;
    auto r = train(c, &log);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_NE(log.str().find("has no masked-LM head: initialized cls.predictions.bias, "), std::string::npos)
        << log.str();
    EXPECT_LT(r->last_loss, r->first_loss);
  }
  {
    TempDir run("grown");
    train::TrainConfig c = bert_config(run.path);
    c.model.max_positions = 64;
    c.data.seq = 64;
    c.batch.micro = 2;
    c.optimizer.lr = 0;
    c.train.steps = 2;
    std::ostringstream log;
    auto r = train(c, &log);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_NE(log.str().find("position embeddings grown from 16 to 64 rows"), std::string::npos) << log.str();
    auto m = models::Checkpoint::open(run.path + "/model");
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    EXPECT_EQ(m->config().bert()->max_positions, 64);
    const Tensor grown = std::move(read_all(run.path + "/model/model.safetensors")
                                       .at("bert.embeddings.position_embeddings.weight"));
    const Tensor learned = std::move(read_all(fixture() + "/bert/model.safetensors")
                                         .at("bert.embeddings.position_embeddings.weight"));
    ASSERT_EQ(grown.shape(), (Shape{64, 32}));
    for (int64_t i = 0; i < 64; ++i)
      ASSERT_EQ(std::memcmp(grown.data<float>() + i * 32, learned.data<float>() + (i % 16) * 32, 32 * 4), 0) << i;
  }
  {
    TempDir run("sparse");
    train::TrainConfig c = bert_config(run.path);
    c.model.max_positions = 64;
    c.data.seq = 64;
    c.batch.micro = 2;
    c.model.attention = {{"kind", "bigbird"}, {"block", "8"}};
    c.train.steps = 10;
    auto r = train(c);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_LT(r->last_loss, r->first_loss);
    // The export keeps the layout, and embeddings attend through it: whole blocks of 8; a text within the
    // first block embeds as the dense model does (its block attends itself), a longer one does not.
    const std::string dense_dir = run.path + "/dense";
    fs::copy(run.path + "/model", dense_dir);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dense_dir + "/config.json"));
    ASSERT_TRUE(cfg.contains("aspen_sparse_attention"));
    EXPECT_EQ(cfg["aspen_sparse_attention"]["kind"], "bigbird");
    EXPECT_EQ(cfg["aspen_sparse_attention"]["attention"], "bidirectional");
    cfg.erase("aspen_sparse_attention");
    std::ofstream(dense_dir + "/config.json") << cfg.dump(2);
    auto sparse_e = models::Embedder::open(run.path + "/model", {.max_batch = 2, .max_length = 64, .threads = 1});
    auto dense_e = models::Embedder::open(dense_dir, {.max_batch = 2, .max_length = 64, .threads = 1});
    ASSERT_TRUE(sparse_e.is_ok() && dense_e.is_ok()) << sparse_e.status().to_string() << dense_e.status().to_string();
    for (int64_t t : (*sparse_e)->compiled_lengths()) EXPECT_EQ(t % 8, 0) << t;
    std::string long_text;
    for (int i = 0; i < 8; ++i) long_text += "the quick brown fox jumps over the lazy dog. ";
    const std::vector<std::string> texts = {"the lazy fox", long_text};
    auto a = (*sparse_e)->embed(texts), d = (*dense_e)->embed(texts);
    ASSERT_TRUE(a.is_ok() && d.is_ok());
    double short_diff = 0, long_diff = 0;
    for (size_t i = 0; i < (*a)[0].size(); ++i) {
      short_diff = std::max(short_diff, double(std::abs((*a)[0][i] - (*d)[0][i])));
      long_diff = std::max(long_diff, double(std::abs((*a)[1][i] - (*d)[1][i])));
    }
    EXPECT_LT(short_diff, 1e-6);
    EXPECT_GT(long_diff, 1e-4);
  }
}

TEST(TrainerBert, RefusalsNameTheKey) {
  TempDir run("refused");
  auto message = [&](const std::function<void(train::TrainConfig&)>& change) {
    train::TrainConfig c = bert_config(run.path);
    change(c);
    auto r = train(c);
    return r.is_ok() ? std::string("trained") : r.status().message();
  };
  EXPECT_EQ(message([](auto& c) { c.data.seq = 32; }),
            "config: data.seq: expected at most the model's positions (model.from " + fixture() +
                "/bert: max_position_embeddings 16), found 32 (hint: model.max_positions: 32 grows them by copying the "
                "learned ones)");
  EXPECT_EQ(message([](auto& c) { c.model.max_positions = 8; }),
            "config: model.max_positions: expected 0 or at least the checkpoint's max_position_embeddings (16), "
            "found 8");
  // Once an abort (a failed allocation of the grown table): now refused by name.
  EXPECT_EQ(message([](auto& c) { c.model.max_positions = 1000000000; }),
            "config: model.max_positions: expected at most 16777216, found 1000000000");
  EXPECT_EQ(message([](auto& c) { c.parallel.tensor_parallel = 2; }),
            "config: parallel.tensor_parallel: expected 1 for a BERT (model.from " + fixture() +
                "/bert: its layers have no split yet), found 2");
  EXPECT_EQ(message([](auto& c) { c.parallel.pipeline_stages = 2; }),
            "config: parallel.pipeline_stages: expected 1 for a BERT (model.from " + fixture() +
                "/bert: its layers have no stages yet), found 2");
  EXPECT_EQ(message([](auto& c) { c.data.packing = true; }),
            "config: data.packing: expected false for a BERT (model.from " + fixture() +
                "/bert: masked rows are windows of the stream), found true");
  EXPECT_EQ(message([](auto& c) { c.sample.prompts = {"the"}; }),
            "config: sample.prompts: expected none for a BERT (model.from " + fixture() +
                "/bert: an encoder generates no text), found a list of 1");
  EXPECT_EQ(message([](auto& c) { c.model.attention = {{"kind", "bigbird"}, {"block", "8"}, {"attention", "unidirectional"}}; }),
            "model.attention.attention: expected bidirectional for an encoder (BERT attends both ways), found "
            "'unidirectional'");
}

}  // namespace
}  // namespace aspen::api
