// Tests of models/weights.cc: checkpoint directories written here (a tiny
// GPT-2 and BERT), name mapping, dtype conversion, unused tensors, and every
// error worded exactly: missing tensor, wrong shape, bad dtype, truncated file.
#include "models/weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/log.h"
#include "graph/builder.h"
#include "models/model_testing.h"

namespace aspen::models {
namespace {

namespace fs = std::filesystem;

constexpr char kGpt2Config[] = R"({"model_type": "gpt2", "vocab_size": 11, "n_positions": 6, "n_embd": 6,
  "n_layer": 1, "n_head": 2, "n_inner": 5})";
constexpr char kBertConfig[] = R"({"model_type": "bert", "vocab_size": 11, "hidden_size": 6, "num_hidden_layers": 1,
  "num_attention_heads": 2, "intermediate_size": 5, "max_position_embeddings": 6, "type_vocab_size": 2})";

// A fresh directory holding config.json; removed with the fixture.
class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("aspen_weights_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_config(const char* text) { std::ofstream(dir_ / "config.json") << text; }
  // model.safetensors from (checkpoint name, tensor).
  void write_weights(const std::map<std::string, Tensor>& tensors) {
    std::vector<std::pair<std::string, const Tensor*>> list;
    for (const auto& [name, t] : tensors) list.emplace_back(name, &t);
    ASSERT_TRUE(io::write_safetensors(weights_path(), list).is_ok());
  }
  std::string weights_path() const { return (dir_ / "model.safetensors").string(); }
  std::string dir() const { return dir_.string(); }

  fs::path dir_;
};

// The parameters of g, random, as tensors named by `rename(parameter name)`.
std::map<std::string, Tensor> random_checkpoint(const graph::Graph& g,
                                                const std::function<std::string(const std::string&)>& rename) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, a] : testing::model_feeds(g, 11, 1.0, 5))
    if (g.find_parameter(name)) out.emplace(rename(name), a.to_tensor());
  return out;
}

std::string strip_transformer(const std::string& n) {
  return n.rfind("transformer.", 0) == 0 ? n.substr(12) : n;
}

TEST_F(WeightsTest, Gpt2ModelNamesBuffersAndUnusedTensors) {
  write_config(kGpt2Config);
  auto probe = Checkpoint::open(dir());
  EXPECT_EQ(probe.status().message(), dir() + ": expected model.safetensors or model.safetensors.index.json, found neither");
  auto cfg = load_config(dir() + "/config.json");
  ASSERT_TRUE(cfg.is_ok());
  graph::Graph g;
  {
    graph::Builder b(g);
    ASSERT_TRUE(build_gpt2(b, *cfg->gpt2(), {.batch = 1, .seq = 3}).is_ok());
  }
  // A GPT2Model checkpoint: no "transformer." prefix, old attention buffers, a tied lm_head copy, one stray tensor.
  std::map<std::string, Tensor> ckpt = random_checkpoint(g, strip_transformer);
  ckpt.emplace("h.0.attn.bias", Tensor(DType::f32, Shape{1, 1, 6, 6}));
  ckpt.emplace("h.0.attn.masked_bias", Tensor(DType::f32, Shape{}));
  ckpt.emplace("lm_head.weight", Tensor(DType::f32, Shape{11, 6}));
  ckpt.emplace("score.weight", Tensor(DType::f32, Shape{2, 6}));
  write_weights(ckpt);
  auto c = Checkpoint::open(dir());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  std::vector<std::string> logged;
  LogSink old = set_log_sink([&](LogLevel, const std::string& m) { logged.push_back(m); });
  auto plan = plan_weights(g, *c);
  set_log_sink(old);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->unused, std::vector<std::string>{"score.weight"});
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("1 tensors not used by the gpt2 graph: score.weight"), std::string::npos) << logged[0];
  auto w = read_weights(g, *c);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->size(), g.parameter_nodes().size());
  const Tensor& wte = w->at("transformer.wte.weight");
  const Tensor& want = ckpt.at("wte.weight");
  ASSERT_EQ(wte.shape(), want.shape());
  for (int64_t i = 0; i < wte.numel(); ++i) ASSERT_EQ(wte.data<float>()[i], want.data<float>()[i]);
}

TEST_F(WeightsTest, Bf16AndF16AreConvertedAndBertPrefixIsMapped) {
  write_config(kBertConfig);
  auto cfg = load_config(dir() + "/config.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  graph::Graph g;
  {
    graph::Builder b(g);
    ASSERT_TRUE(build_bert(b, *cfg->bert(), {.batch = 1, .seq = 3}).is_ok());  // no pooler
  }
  // A BertForX checkpoint ("bert." prefix), an old LayerNorm naming, bf16 and f16 storage, a pooler and position_ids.
  std::map<std::string, Tensor> f32 = random_checkpoint(g, [](const std::string& n) { return "bert." + n; });
  std::map<std::string, Tensor> ckpt;
  int k = 0;
  for (auto& [name, t] : f32) {
    std::string n = name;
    if (n == "bert.embeddings.LayerNorm.weight") n = "bert.embeddings.LayerNorm.gamma";
    const DType to = k++ % 2 ? DType::bf16 : DType::f16;
    Tensor h(to, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (to == DType::bf16) h.data<bf16>()[i] = f32_to_bf16(t.data<float>()[i]);
      else h.data<f16>()[i] = f32_to_f16(t.data<float>()[i]);
    }
    ckpt.emplace(n, std::move(h));
  }
  ckpt.emplace("bert.pooler.dense.weight", Tensor(DType::f32, Shape{6, 6}));
  ckpt.emplace("bert.embeddings.position_ids", Tensor(DType::i64, Shape{1, 6}));
  write_weights(ckpt);
  auto c = Checkpoint::open(dir());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto plan = plan_weights(g, *c);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_TRUE(plan->unused.empty()) << plan->unused.front();
  for (const WeightBinding& b : plan->bindings) {
    auto t = read_weight(b);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    ASSERT_EQ(t->dtype(), DType::f32);
    const Tensor& stored = ckpt.at(b.tensor);
    for (int64_t i = 0; i < t->numel(); ++i) {
      const float want = stored.dtype() == DType::bf16 ? bf16_to_f32(stored.data<bf16>()[i])
                                                       : f16_to_f32(stored.data<f16>()[i]);
      ASSERT_EQ(t->data<float>()[i], want) << b.parameter;
    }
  }
  EXPECT_EQ(plan->bindings[0].type.dtype, DType::f32);
}

TEST_F(WeightsTest, MissingTensorWrongShapeBadDtypeAndTruncatedFileAreNamed) {
  write_config(kGpt2Config);
  auto cfg = load_config(dir() + "/config.json");
  ASSERT_TRUE(cfg.is_ok());
  graph::Graph g;
  {
    graph::Builder b(g);
    ASSERT_TRUE(build_gpt2(b, *cfg->gpt2(), {.batch = 1, .seq = 3}).is_ok());
  }
  const auto same = [](const std::string& n) { return n; };
  auto plan_error = [&](std::map<std::string, Tensor> ckpt) {
    write_weights(ckpt);
    auto c = Checkpoint::open(dir());
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? plan_weights(g, *c).status().message() : c.status().message();
  };
  const std::string file = weights_path();
  {
    auto ckpt = random_checkpoint(g, same);
    ckpt.erase("transformer.h.0.mlp.c_fc.bias");
    EXPECT_EQ(plan_error(std::move(ckpt)),
              file + ": tensor 'transformer.h.0.mlp.c_fc.bias': expected present (a parameter of the gpt2 graph, "
                     "f32[5]), found none (hint: also looked for 'h.0.mlp.c_fc.bias')");
  }
  {
    auto ckpt = random_checkpoint(g, same);
    ckpt.at("transformer.h.0.attn.c_attn.weight") = Tensor(DType::f32, Shape{18, 6});  // stored [out, in]
    EXPECT_EQ(plan_error(std::move(ckpt)),
              file + ": tensor 'transformer.h.0.attn.c_attn.weight': expected shape [6, 18] (the graph's parameter "
                     "'transformer.h.0.attn.c_attn.weight', from " + dir() + "/config.json), found [18, 6]");
  }
  {
    auto ckpt = random_checkpoint(g, same);
    ckpt.at("transformer.ln_f.bias") = Tensor(DType::i32, Shape{6});
    EXPECT_EQ(plan_error(std::move(ckpt)),
              file + ": tensor 'transformer.ln_f.bias': expected F32, BF16 or F16, found I32");
  }
  write_weights(random_checkpoint(g, same));
  fs::resize_file(file, fs::file_size(file) - 7);
  auto truncated = Checkpoint::open(dir());
  ASSERT_FALSE(truncated.is_ok());
  EXPECT_EQ(truncated.status().code(), Code::kCorrupt) << truncated.status().to_string();
  EXPECT_EQ(truncated.status().message().rfind(file, 0), 0u) << truncated.status().message();
}

}  // namespace
}  // namespace aspen::models
