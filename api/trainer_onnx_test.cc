// api/trainer_onnx_test.cc: `aspen train` on a user's own ONNX model (model.from: *.onnx). The exported
// block and GPT-2-tiny of models/testdata/onnx, trained by the Trainer from arrays (.npz), equal PyTorch's
// own 10 AdamW steps (models/testdata/onnx_train, scripts/golden/make_onnx_golden.py); the trained weights
// come back in a copy of the ONNX file; a run on token shards resumes bit for bit; a layout of replicas
// and pipeline stages trains it too; mistakes in the config are errors naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/trainer.h"
#include "io/npz.h"
#include "io/onnx.h"
#include "io/test_files.h"
#include "models/onnx_import.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/report.h"

namespace aspen::api {
namespace {

using io::test_files::TempDir;

const std::string kData = ASPEN_MODELS_TESTDATA;

Tensor read_pb(const std::string& path) {
  auto t = io::read_onnx_tensor(path);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  auto r = models::tensor_from_onnx(*t, path);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return std::move(r).value();
}

// The golden's batches [10, 2, ...] as 20 examples placed where the trainer's shuffle of epoch 0 (seed
// `seed`, micro-batches of 2, no validation) draws them: step k takes examples order[2k], order[2k + 1].
Tensor in_shuffle_order(const Tensor& stacked, uint64_t seed) {
  const int64_t n = stacked.shape()[0] * stacked.shape()[1];
  std::vector<int64_t> d(stacked.shape().begin() + 1, stacked.shape().end());
  d[0] = n;
  Tensor out(stacked.dtype(), *Shape::make(d.data(), int(d.size())));
  const size_t row = stacked.nbytes() / size_t(n);
  const std::vector<int64_t> order = train::philox_permutation(n, seed, train::kDataShuffleStream);
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(static_cast<char*>(out.raw()) + size_t(order[size_t(i)]) * row,
                static_cast<const char*>(stacked.raw()) + size_t(i) * row, row);
  return out;
}

train::TrainConfig onnx_config(const std::string& run_dir, const std::string& name, const std::string& data) {
  train::TrainConfig c;
  c.name = name;
  c.model.from = kData + "/onnx/" + name + "/model.onnx";
  c.data.train = data;
  c.data.val_fraction = 0;
  c.optimizer.lr = 1e-2;  // PyTorch's AdamW of the golden: every parameter decays
  c.optimizer.weight_decay = 0.01;
  c.optimizer.no_decay = {};
  c.batch.micro = 2;
  c.train.steps = 10;
  c.train.seed = 3;
  c.train.threads = 2;
  c.log.run_dir = run_dir;
  c.log.progress = "off";
  return c;
}

Result<TrainResult> train(const train::TrainConfig& c, bool resume = false, int64_t stop_at = 0) {
  std::ostringstream sink;
  ASPEN_ASSIGN_OR_RETURN(auto t, Trainer::create(c, {.resume = resume, .out = &sink, .stop_at = stop_at}));
  return t->run();
}

// The trainer's 10 steps on the golden's batches against PyTorch's losses; then the exported copy of the
// model holds the trained weights.
void expect_torch_parity(const std::string& name, const std::string& input, const std::string& loss) {
  TempDir t;
  const uint64_t seed = 3;
  std::map<std::string, Tensor> arrays;
  arrays.emplace(input, in_shuffle_order(read_pb(kData + "/onnx_train/" + name + "/inputs.pb"), seed));
  arrays.emplace("targets", in_shuffle_order(read_pb(kData + "/onnx_train/" + name + "/targets.pb"), seed));
  ASSERT_TRUE(io::write_npz(t / "train.npz", arrays).is_ok());
  train::TrainConfig c = onnx_config(t / "run", name, t / "train.npz");
  c.model.loss = loss;
  auto r = train(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::ifstream lf(kData + "/onnx_train/" + name + "/losses.txt");
  std::vector<double> want;
  for (double v; lf >> v;) want.push_back(v);
  ASSERT_EQ(want.size(), 10u);
  auto got = train::read_metric(t / "run/metrics.jsonl", "loss");
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 10u);
  for (size_t k = 0; k < 10; ++k) EXPECT_NEAR((*got)[k].second, want[k], 1e-4 * std::fabs(want[k])) << "step " << k + 1;
  EXPECT_TRUE(train::read_metric(t / "run/metrics.jsonl", "examples_per_s").is_ok());

  // model/model.onnx: the file with the trained initializers, which the checkpoint of step 10 holds.
  ASSERT_EQ(r->model_dir, t / "run/model");
  auto exported = io::read_onnx_model(t / "run/model/model.onnx");
  ASSERT_TRUE(exported.is_ok()) << exported.status().to_string();
  auto ck = train::load_checkpoint(t / "run/checkpoints");
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  int compared = 0;
  for (const io::OnnxTensor& init : exported->graph.initializers) {
    auto w = ck->weights.find(init.name);
    if (w == ck->weights.end()) continue;  // a constant (an integer, a scalar)
    auto v = models::tensor_from_onnx(init, init.name);
    ASSERT_TRUE(v.is_ok());
    ASSERT_EQ(v->nbytes(), w->second.nbytes()) << init.name;
    EXPECT_EQ(std::memcmp(v->raw(), w->second.raw(), v->nbytes()), 0) << init.name << " is not the trained value";
    ++compared;
  }
  EXPECT_EQ(compared, int(ck->weights.size()));
}

TEST(TrainerOnnx, ExportedBlockFromArraysMatchesPyTorch) { expect_torch_parity("block_dynamo", "x", "mse"); }

TEST(TrainerOnnx, ExportedGpt2FromArraysMatchesPyTorch) {
  expect_torch_parity("gpt2_unoptimized", "input_ids", "cross_entropy");
}

// GPT-2-tiny (fixed shape [2, 7]) on token shards: input_ids reads the tokens, targets the next tokens.
// It learns, and 15 steps + resume + 15 give the bits of 30 straight.
TEST(TrainerOnnx, TokenShardsTrainAndResumeBitwise) {
  TempDir data, straight, stopped;
  {  // counting documents in the model's 50-token vocabulary: each next token is learnable
    auto w = train::TokenShardWriter::create(
        data / "shards", {.vocab_size = 50, .eos_id = 0, .tokenizer_dir = "", .tokenizer_hash = ""});
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    for (int d = 0; d < 60; ++d) {
      std::vector<io::TokenId> doc;
      for (int k = 0; k < 12; ++k) doc.push_back(io::TokenId(1 + (d + 3 * k) % 49));
      ASSERT_TRUE(w->add_document(doc).is_ok());
    }
    ASSERT_TRUE(w->finish().is_ok());
  }
  auto config = [&](const std::string& dir) {
    train::TrainConfig c = onnx_config(dir, "gpt2_unoptimized", data / "shards");
    c.data.seq = 7;
    c.data.val_fraction = 0.05;
    c.eval.interval = 15;
    c.eval.batches = 2;
    c.train.steps = 30;
    return c;
  };
  auto a = train(config(straight.path()));
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_LT(a->last_loss, a->first_loss - 0.5) << "it learns";
  EXPECT_GT(a->last_val_loss, 0);
  auto b1 = train(config(stopped.path()), false, 15);
  ASSERT_TRUE(b1.is_ok()) << b1.status().to_string();
  auto b2 = train(config(stopped.path()), true);
  ASSERT_TRUE(b2.is_ok()) << b2.status().to_string();
  EXPECT_EQ(a->last_loss, b2->last_loss);
  EXPECT_EQ(a->last_val_loss, b2->last_val_loss);
  auto ca = train::load_checkpoint(straight / "checkpoints");
  auto cb = train::load_checkpoint(stopped / "checkpoints");
  ASSERT_TRUE(ca.is_ok() && cb.is_ok());
  for (const auto& [name, w] : ca->weights)
    EXPECT_EQ(std::memcmp(w.raw(), cb->weights.at(name).raw(), w.nbytes()), 0) << name;
  EXPECT_TRUE(std::filesystem::exists(stopped / "model/model.onnx"));
}

// Two replicas of two pipeline stages (four devices of one thread) on the block's arrays give the losses of
// one device with accumulation 4 on the same global batches, within f32 rounding.
TEST(TrainerOnnx, ReplicasAndStagesEqualOneDevice) {
  TempDir t;
  std::map<std::string, Tensor> arrays;
  arrays.emplace("x", read_pb(kData + "/onnx_train/block_dynamo/inputs.pb"));
  arrays.emplace("y", read_pb(kData + "/onnx_train/block_dynamo/targets.pb"));
  for (auto& [name, a] : arrays) {  // [10, 2, 7, 16] -> [20, 7, 16]
    Tensor flat(a.dtype(), Shape{20, 7, 16});
    std::memcpy(flat.raw(), a.raw(), a.nbytes());
    a = std::move(flat);
  }
  ASSERT_TRUE(io::write_npz(t / "train.npz", arrays).is_ok());
  auto config = [&](const std::string& dir, int64_t replicas, int64_t stages) {
    train::TrainConfig c = onnx_config(dir, "block_dynamo", t / "train.npz");
    c.model.loss = "mse";
    c.model.targets = "y";
    c.batch.micro = 1;
    c.batch.replicas = replicas;
    c.batch.accumulation = 4 / replicas;
    c.parallel.pipeline_stages = stages;
    c.train.steps = 5;
    c.train.threads = 1;
    return c;
  };
  auto one = train(config(t / "one", 1, 1));
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  auto spread = train(config(t / "spread", 2, 2));
  ASSERT_TRUE(spread.is_ok()) << spread.status().to_string();
  auto l1 = train::read_metric(t / "one/metrics.jsonl", "loss");
  auto l2 = train::read_metric(t / "spread/metrics.jsonl", "loss");
  ASSERT_TRUE(l1.is_ok() && l2.is_ok());
  ASSERT_EQ(l1->size(), 5u);
  ASSERT_EQ(l2->size(), 5u);
  for (size_t k = 0; k < 5; ++k)
    EXPECT_NEAR((*l1)[k].second, (*l2)[k].second, 1e-5 * std::fabs((*l1)[k].second)) << "step " << k + 1;
  EXPECT_LT(l1->back().second, l1->front().second);
}

void expect_refused(const train::TrainConfig& c, const std::string& part) {
  auto t = Trainer::create(c, {.out = nullptr});
  ASSERT_FALSE(t.is_ok()) << "expected an error containing: " << part;
  EXPECT_NE(t.status().to_string().find(part), std::string::npos) << t.status().to_string();
}

TEST(TrainerOnnx, MistakesNameTheKeyAndWhatIsThere) {
  TempDir t;
  std::map<std::string, Tensor> arrays;
  arrays.emplace("features", Tensor(DType::f32, Shape{8, 7, 16}));
  arrays.emplace("targets", Tensor(DType::f32, Shape{8, 7, 16}));
  arrays.emplace("labels", Tensor(DType::f32, Shape{8, 3}));
  ASSERT_TRUE(io::write_npz(t / "train.npz", arrays).is_ok());
  train::TrainConfig c = onnx_config(t / "run", "block_dynamo", t / "train.npz");
  c.model.loss = "mse";
  // The graph input x has no column of its name.
  expect_refused(c, "config: model.inputs: input 'x': expected a data column named 'x' (" + t / "train.npz" +
                        " has features f32[2, 7, 16], labels f32[2, 3], targets f32[2, 7, 16]), found none (hint: "
                        "name the column that feeds it: model.inputs: {x: COLUMN})");
  c.model.inputs = {{"x", "labels"}};
  expect_refused(c,
                 "input 'x' from column 'labels': expected a column of rank 3, whose micro-batch binds the input's "
                 "dimensions [batch, 7, 16], found f32[2, 3]");
  c.model.inputs = {{"x", "features"}, {"z", "labels"}};
  expect_refused(c, "config: model.inputs: 'z': expected an input of the model, found no input of that name");
  c.model.inputs = {{"x", "features"}};
  c.model.output = "logits";
  expect_refused(c, "expected an output of the model ('add_3'), found 'logits'");
  c.model.output = "";
  c.model.loss = "cross_entropy";
  expect_refused(c, "targets");
  // Arrays train ONNX models only.
  train::TrainConfig gpt = c;
  gpt.model = {};
  expect_refused(gpt,
                 "expected a token-shard directory (index.json) for a language model of the built-in families, "
                 "found a file");
}

// A bool column feeding a float input (numpy's masks) once aborted the trainer: its 0 and 1 train as floats.
TEST(TrainerOnnx, BoolColumnsFeedFloatInputs) {
  TempDir t;
  std::map<std::string, Tensor> arrays;
  Tensor x(DType::boolean, Shape{8, 7, 16});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<bool>()[i] = (i * 7919) % 3 == 0;
  arrays.emplace("x", std::move(x));
  arrays.emplace("targets", Tensor(DType::f32, Shape{8, 7, 16}));
  ASSERT_TRUE(io::write_npz(t / "train.npz", arrays).is_ok());
  train::TrainConfig c = onnx_config(t / "run", "block_dynamo", t / "train.npz");
  c.model.loss = "mse";
  c.train.steps = 2;
  auto r = train(c);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_GT(r->first_loss, 0.0);
}

}  // namespace
}  // namespace aspen::api
