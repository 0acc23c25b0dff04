// Tests of models/weights.cc: checkpoint directories written here (a tiny
// GPT-2 and BERT), name mapping, dtype conversion, unused tensors, and every
// error worded exactly: missing tensor, wrong shape, bad dtype, truncated file.
#include "models/weights.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

// Every tensor of a safetensors file, by name.
std::map<std::string, Tensor> read_all(const std::string& path) {
  std::map<std::string, Tensor> out;
  auto f = io::SafetensorsFile::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (!f.is_ok()) return out;
  for (const std::string& name : f->names()) out.emplace(name, std::move(f->read(name)).value());
  return out;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void expect_same_tensors(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.dtype(), t.dtype()) << name;
    ASSERT_EQ(g.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(g.raw(), t.raw(), t.nbytes()), 0) << name;
  }
}

TEST_F(WeightsTest, ExportHfModelWritesWhatTransformersAndCheckpointOpenRead) {
  const std::string testdata = ASPEN_MODELS_TESTDATA;
  for (const std::string name : {"gpt2-tiny", "gptj-tiny", "llama-tiny", "mistral-tiny"}) {
    SCOPED_TRACE(name);
    const std::string src = testdata + "/" + name;
    auto cfg = load_config(src + "/config.json");
    ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
    std::map<std::string, Tensor> weights = read_all(src + "/model.safetensors");
    std::map<std::string, Tensor> want;
    for (const auto& [n, t] : weights) want.emplace(n, t.clone());
    if (name == "gpt2-tiny")  // a trainer's copy of the tied head is dropped again
      weights.emplace("lm_head.weight", weights.at("transformer.wte.weight").clone());
    if (name == "mistral-tiny")
      weights.emplace("lm_head.weight", weights.at("model.embed_tokens.weight").clone());
    const std::string out = dir() + "/" + name + "/export";  // created, parents too
    const bool tokenizer = !cfg->llama();  // the Llama family's tiny checkpoints have no tokenizer files
    ASSERT_TRUE(export_hf_model(out, *cfg, weights, tokenizer ? src : "").is_ok());

    auto back = load_config(out + "/config.json");
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_TRUE(back->unknown_keys.empty());
    EXPECT_EQ(back->model_type, cfg->model_type);
    EXPECT_EQ(back->eos_token_ids, cfg->eos_token_ids);
    if (cfg->gpt2()) {
      EXPECT_EQ(back->gpt2()->d_model, cfg->gpt2()->d_model);
      EXPECT_EQ(back->gpt2()->ff_dim(), cfg->gpt2()->ff_dim());
      EXPECT_TRUE(back->gpt2()->tie_word_embeddings);
    } else if (cfg->llama()) {
      EXPECT_EQ(back->llama()->kv_heads(), cfg->llama()->kv_heads());
      EXPECT_EQ(back->llama()->sliding_window, cfg->llama()->sliding_window);
      EXPECT_EQ(back->llama()->rope.scaling, cfg->llama()->rope.scaling);
    } else {
      EXPECT_EQ(back->gptj()->rotary_dim, cfg->gptj()->rotary_dim);
      EXPECT_EQ(back->gptj()->n_layer, cfg->gptj()->n_layer);
    }
    expect_same_tensors(read_all(out + "/model.safetensors"), want);
    auto st = io::SafetensorsFile::open(out + "/model.safetensors");
    ASSERT_TRUE(st.is_ok());
    EXPECT_EQ(st->metadata().at("format"), "pt");  // older transformers refuse a file without it
    for (const char* f : {"tokenizer.json", "vocab.json", "merges.txt"})
      if (tokenizer) {
        EXPECT_EQ(file_bytes(fs::path(out) / f), file_bytes(fs::path(src) / f)) << f;
      }
    EXPECT_FALSE(fs::exists(fs::path(out) / "vocab.txt"));
    auto opened = Checkpoint::open(out);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  }
}

// BERT exports as BertForMaskedLM: the encoder under "bert.", the head as it is, the tied decoder left out;
// the file HF wrote comes back bit for bit, and the config reads back with no unknown key.
TEST_F(WeightsTest, ExportHfModelWritesBertForMaskedLm) {
  const std::string src = std::string(ASPEN_MODELS_TESTDATA) + "/bert-mlm-tiny";
  auto ckpt = Checkpoint::open(src);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  graph::Graph g;
  graph::Builder b(g);
  ASSERT_TRUE(build_bert(b, *ckpt->config().bert(), {.batch = 1, .seq = 3, .mlm_head = true}).is_ok());
  auto weights = read_weights(g, *ckpt);  // the graph's names: no "bert."
  ASSERT_TRUE(weights.is_ok()) << weights.status().to_string();
  ASSERT_TRUE(weights->count("embeddings.word_embeddings.weight"));
  const std::string out = dir() + "/bert-export";
  ASSERT_TRUE(export_hf_model(out, ckpt->config(), *weights).is_ok());
  expect_same_tensors(read_all(out + "/model.safetensors"), read_all(src + "/model.safetensors"));
  auto back = load_config(out + "/config.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(back->unknown_keys.empty());
  const BertConfig& want = *ckpt->config().bert();
  const BertConfig& got = *back->bert();
  EXPECT_EQ(got.vocab, want.vocab);
  EXPECT_EQ(got.d_model, want.d_model);
  EXPECT_EQ(got.n_layer, want.n_layer);
  EXPECT_EQ(got.n_head, want.n_head);
  EXPECT_EQ(got.d_ff, want.d_ff);
  EXPECT_EQ(got.max_positions, want.max_positions);
  EXPECT_EQ(got.type_vocab, want.type_vocab);
  EXPECT_EQ(got.layer_norm_eps, want.layer_norm_eps);
  EXPECT_EQ(got.activation, want.activation);
  EXPECT_EQ(back->pad_token_id, ckpt->config().pad_token_id);
  EXPECT_NE(file_bytes(fs::path(out) / "config.json").find("\"BertForMaskedLM\""), std::string::npos);
}

// Dimensions the weights cannot hold (n_layer 2000 beside gpt2-tiny's 3 layers) or that no model has
// (vocab_size 2^62, n_embd 2^40) are refused when the directory opens, before any graph of that size is built.
TEST_F(WeightsTest, ConfigsBeyondTheWeightsOrAnyModelAreRefusedAtOpen) {
  fs::copy_file(fs::path(ASPEN_MODELS_TESTDATA) / "gpt2-tiny" / "model.safetensors", weights_path());
  auto config = [&](const std::string& extra) {
    std::ofstream(dir_ / "config.json") << R"({"model_type": "gpt2", "vocab_size": 1000, "n_positions": 64, )"
                                        << R"("n_embd": 48, "n_head": 3, )" << extra << "}";
    return Checkpoint::open(dir()).status();
  };
  EXPECT_TRUE(config(R"("n_layer": 3)").is_ok());
  const Status deep = config(R"("n_layer": 2000)");  // within the ceiling, far beyond the file
  EXPECT_EQ(deep.code(), Code::kInvalidArgument);
  EXPECT_EQ(deep.subject(), dir() + "/config.json");
  EXPECT_EQ(deep.expected().rfind("dimensions the weights in " + weights_path() + " can hold (", 0), 0u)
      << deep.to_string();
  EXPECT_EQ(deep.found().rfind("a config of at least ", 0), 0u) << deep.to_string();
  EXPECT_EQ(deep.hint(), "check n_layer, n_embd, vocab_size, n_positions and n_inner (config.json's names) against "
                         "the weights");
  {  // A Llama's hint names a Llama's keys (it once named GPT-2's).
    const fs::path llama = dir_ / "llama";
    fs::create_directories(llama);
    for (const auto& e : fs::directory_iterator(fs::path(ASPEN_MODELS_TESTDATA) / "llama-tiny"))
      fs::copy_file(e.path(), llama / e.path().filename());
    std::ifstream in(llama / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["num_hidden_layers"] = 500;
    std::ofstream(llama / "config.json", std::ios::trunc) << j.dump();
    const Status s = Checkpoint::open(llama.string()).status();
    EXPECT_EQ(s.hint(), "check num_hidden_layers, hidden_size, vocab_size, intermediate_size and num_key_value_heads "
                        "(config.json's names) against the weights") << s.to_string();
  }
  EXPECT_EQ(config(R"("n_layer": 1000000000)").message(),
            dir() + "/config.json: gpt2 config: n_layer: expected at most 4096 (larger than any real model), found "
                    "1000000000");
  std::ofstream(dir_ / "config.json") << R"({"model_type": "gpt2", "vocab_size": 4611686018427387904, "n_positions": 64,
    "n_embd": 48, "n_head": 3, "n_layer": 3})";
  EXPECT_EQ(Checkpoint::open(dir()).status().message(),
            dir() + "/config.json: gpt2 config: vocab: expected at most 2147483647 (larger than any real model), found "
                    "4611686018427387904");
  std::ofstream(dir_ / "config.json") << R"({"model_type": "gpt2", "vocab_size": 1000, "n_positions": 64,
    "n_embd": 1099511627776, "n_head": 2, "n_layer": 3})";
  EXPECT_EQ(Checkpoint::open(dir()).status().subject(), dir() + "/config.json: gpt2 config: d_model");
}

TEST_F(WeightsTest, ExportHfModelErrors) {
  const std::string testdata = ASPEN_MODELS_TESTDATA;
  auto gpt2 = load_config(testdata + "/gpt2-tiny/config.json");
  ASSERT_TRUE(gpt2.is_ok());
  std::map<std::string, Tensor> one;
  one.emplace("transformer.wte.weight", Tensor(DType::f32, Shape{2, 3}));
  const std::string out = dir() + "/out";
  EXPECT_EQ(export_hf_model(out, *gpt2, {}).message(), "export_hf_model " + out + ": expected the model's weights, found none");
  auto bert = load_config(testdata + "/bert-tiny/config.json");
  ASSERT_TRUE(bert.is_ok());
  Status s = export_hf_model(out, *bert, one);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "export_hf_model " + out +
                             ": expected a BERT with its masked-LM head (cls.predictions.*: BertForMaskedLM), found "
                             "the encoder alone");
  s = export_hf_model(out, *gpt2, one, dir());  // dir() holds no tokenizer files
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), dir() + ": expected tokenizer files (any of tokenizer.json, vocab.json, merges.txt, vocab.txt, "
                                 "tokenizer_config.json, special_tokens_map.json), found none");
  EXPECT_FALSE(fs::exists(out));  // nothing written before the inputs were checked
  std::ofstream(dir() + "/file") << "x";
  s = export_hf_model(dir() + "/file/sub", *gpt2, one);
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.message().rfind(dir() + "/file/sub: expected a directory that can be created, found ", 0), 0u)
      << s.message();
}

// NOTE [stored head]: a Llama-family config.json saying tie_word_embeddings beside a file that stores
// lm_head.weight is read as transformers 5 reads it: the stored head, untied (aspen tied it, and its logits
// differed from transformers' by 12).
// load_weights with a destination: weights stored as the parameters want them are copied straight into the
// destination (a 21 MB embedding over several 2 MiB parts), bit for bit; the others (a destination of
// another type, or none) reach the sink; and what the sink gets is the checkpoint's values too.
TEST_F(WeightsTest, LoadWeightsIntoDestinationsInPartsAndTheRestThroughTheSink) {
  write_config(R"({"model_type": "gpt2", "vocab_size": 5200, "n_positions": 6, "n_embd": 1024,
    "n_layer": 1, "n_head": 2, "n_inner": 5})");
  auto cfg = load_config(dir() + "/config.json");
  ASSERT_TRUE(cfg.is_ok());
  graph::Graph g;
  {
    graph::Builder b(g);
    ASSERT_TRUE(build_gpt2(b, *cfg->gpt2(), {.batch = 1, .seq = 3}).is_ok());
  }
  const std::map<std::string, Tensor> ckpt = random_checkpoint(g, [](const std::string& n) { return n; });
  write_weights(ckpt);
  auto c = Checkpoint::open(dir());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto plan = plan_weights(g, *c);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  std::map<std::string, Tensor> into, sunk;
  for (const auto& [name, t] : ckpt)
    if (name != "transformer.h.0.ln_1.weight") into.emplace(name, Tensor(t.dtype(), t.shape()));
  into.at("transformer.wpe.weight") = Tensor(DType::bf16, ckpt.at("transformer.wpe.weight").shape());  // another type
  ASSERT_GT(ckpt.at("transformer.wte.weight").nbytes(), size_t(20) << 20);
  const Status s = load_weights(
      *plan, [&](const std::string& name, const Tensor& t) { sunk.emplace(name, t.clone()); return Status(); },
      [&](const std::string& name) -> Tensor* {
        auto it = into.find(name);
        return it == into.end() ? nullptr : &it->second;
      });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(sunk.size(), 2u);
  ASSERT_TRUE(sunk.count("transformer.h.0.ln_1.weight") && sunk.count("transformer.wpe.weight"));
  for (const auto& [name, want] : ckpt) {
    SCOPED_TRACE(name);
    const Tensor& got = sunk.count(name) ? sunk.at(name) : into.at(name);
    ASSERT_EQ(got.shape(), want.shape());
    ASSERT_EQ(got.dtype(), DType::f32);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0);
  }
}

TEST_F(WeightsTest, AStoredHeadIsUsedWhateverTieWordEmbeddingsSays) {
  const fs::path src = fs::path(ASPEN_MODELS_TESTDATA) / "llama-tiny";
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dir_ / e.path().filename());
  std::ifstream in(src / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_FALSE(j.at("tie_word_embeddings").get<bool>());
  j["tie_word_embeddings"] = true;
  std::ofstream(dir_ / "config.json", std::ios::trunc) << j.dump();
  auto c = Checkpoint::open(dir());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  ASSERT_NE(c->config().llama(), nullptr);
  EXPECT_FALSE(c->config().llama()->tie_word_embeddings);
  ASSERT_NE(c->find("lm_head.weight").second, nullptr);
}

}  // namespace
}  // namespace aspen::models
