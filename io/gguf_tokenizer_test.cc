// The tokenizer llama.cpp's converter writes into a GGUF file, rebuilt by load_gguf_tokenizer, against the
// Hugging Face files it was converted from (models/testdata/gpt2-tiny, llama-tiny, qwen2-tiny; the files come
// from scripts/golden/make_gguf_gpt2_testdata.py and make_gguf_llama_testdata.py): the same ids and text over hard cases and Shakespeare, the
// same special tokens; and the errors naming the key.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/test_files.h"
#include "io/tokenizer.h"

namespace aspen::io {
namespace {

const std::string kGguf = std::string(ASPEN_IO_TESTDATA) + "/gguf/gpt2-tiny-vocab.gguf";

std::vector<std::string> texts() {
  std::vector<std::string> out = {"",
                                  "Hello world",
                                  " leading space",
                                  "<|endoftext|>The end<|endoftext|>",
                                  "numbers 12345 and   spaces\n\nnew lines\t tabs",
                                  "naïve café — ünïcödé 🙂",
                                  "It's, don't; we'll: they're!"};
  std::ifstream hard(std::string(ASPEN_IO_TESTDATA) + "/tokenizer_hard_cases.txt");
  for (std::string line; std::getline(hard, line);) out.push_back(line);
  const std::string shakespeare =
      test_files::read_bytes(std::string(ASPEN_SHARED_DIR_DEFAULT) + "/data/tinyshakespeare.txt");
  for (size_t k = 0; k < 12 && (k + 1) * 90000 <= shakespeare.size(); ++k)
    out.push_back(shakespeare.substr(k * 90000, 3000));
  return out;
}

// GPT-2's split, and Llama 3's ("llama-bpe": its regex before the byte level, BOS first) and Qwen2's ("qwen2"),
// from scripts/golden/make_gguf_llama_testdata.py.
TEST(GgufTokenizer, IdsAreTheHuggingFaceOnes) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "qwen2-tiny"}) {
    SCOPED_TRACE(name);
    auto file = GgufFile::open(std::string(ASPEN_IO_TESTDATA) + "/gguf/" + name + "-vocab.gguf");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto tok = load_gguf_tokenizer(*file);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    auto hf = load_tokenizer(std::string(ASPEN_IO_TESTDATA) + "/../../models/testdata/" + name);
    ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
    EXPECT_EQ((*tok)->vocab_size(), (*hf)->vocab_size());
    EXPECT_EQ((*tok)->special_ids().eos, (*hf)->special_ids().eos);
    EXPECT_EQ((*tok)->special_ids().bos, (*hf)->special_ids().bos);
    size_t tokens = 0;
    for (const std::string& t : texts()) {
      const std::vector<TokenId> got = (*tok)->encode(t), want = (*hf)->encode(t);
      ASSERT_EQ(got, want) << "text: " << t.substr(0, 80);
      EXPECT_EQ((*tok)->decode(got), (*hf)->decode(want));
      EXPECT_EQ((*tok)->decode(got, /*skip_special_tokens=*/true), (*hf)->decode(want, true));
      tokens += got.size();
    }
    EXPECT_GT(tokens, 5000u);  // the texts were read
  }
}

// A SentencePiece file (model "llama": pieces and scores, no merges; the converter's output for the
// tokenizer.model behind io/testdata/spm_legacy, from scripts/golden/make_gguf_llama_testdata.py): the ids and
// text of that Hugging Face conversion (BOS first), and llama.cpp's own ids (llama-tokenize on the same file).
const std::string kSpmGguf = std::string(ASPEN_IO_TESTDATA) + "/gguf/spm-tiny-vocab.gguf";

TEST(GgufTokenizer, SentencePieceIdsAreHuggingFacesAndLlamaCpps) {
  auto file = GgufFile::open(kSpmGguf);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto tok = load_gguf_tokenizer(*file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto hf = load_tokenizer(std::string(ASPEN_IO_TESTDATA) + "/spm_legacy");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  EXPECT_EQ((*tok)->vocab_size(), (*hf)->vocab_size());
  EXPECT_EQ((*tok)->special_ids().bos, (*hf)->special_ids().bos);
  EXPECT_EQ((*tok)->special_ids().eos, (*hf)->special_ids().eos);
  EXPECT_EQ((*tok)->special_ids().unk, (*hf)->special_ids().unk);
  size_t tokens = 0, bytes = 0;
  for (const std::string& t : texts()) {
    const std::vector<TokenId> got = (*tok)->encode(t), want = (*hf)->encode(t);
    ASSERT_EQ(got, want) << "text: " << t.substr(0, 80);
    ASSERT_EQ((*tok)->encode(t, false), (*hf)->encode(t, false)) << "text: " << t.substr(0, 80);
    EXPECT_EQ((*tok)->decode(got), (*hf)->decode(want));
    EXPECT_EQ((*tok)->decode(got, /*skip_special_tokens=*/true), (*hf)->decode(want, true));
    tokens += got.size();
    for (TokenId id : got) bytes += (*tok)->id_to_token(id).value_or("").rfind("<0x", 0) == 0;
  }
  EXPECT_GT(tokens, 5000u);  // the texts were read
  EXPECT_GT(bytes, 10u);     // and some characters fell back to bytes

  const nlohmann::json cases =
      nlohmann::json::parse(test_files::read_bytes(std::string(ASPEN_IO_TESTDATA) + "/gguf/spm-tiny.llama-cpp.json"));
  ASSERT_GT(cases["cases"].size(), 20u);
  for (const auto& c : cases["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ((*tok)->encode(text), c["ids"].get<std::vector<TokenId>>()) << "text: " << text.substr(0, 80);
  }
}

TEST(GgufTokenizer, SentencePieceSettingsAndDamageAreNamed) {
  const std::string bytes = test_files::read_bytes(kSpmGguf);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string b = bytes;
    const size_t at = b.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    b.replace(at, from.size(), to);
    return GgufFile::from_bytes(std::as_bytes(std::span<const char>(b.data(), b.size())), "edited.gguf");
  };
  {
    auto file = edited("tokenizer.ggml.scores", "tokenizer.ggml.scorez");  // the scores gone
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(load_gguf_tokenizer(*file).status().to_string(),
              "NotFound: edited.gguf: tokenizer.ggml.scores: expected the tokenizer's list, found no such key");
  }
  {
    // No add_bos_token key: llama.cpp's default for SentencePiece adds BOS.
    auto file = edited("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_bos_tokex");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    auto tok = load_gguf_tokenizer(*file);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    EXPECT_EQ((*tok)->encode("Hi").front(), 1);
  }
}

// The file with the first `from` after `after` replaced in place (same length, so the file stays valid).
Result<GgufFile> with_value(const std::string& from, const std::string& to, const std::string& after = "") {
  std::string bytes = test_files::read_bytes(kGguf);
  const size_t at = bytes.find(from, after.empty() ? 0 : bytes.find(after));
  EXPECT_NE(at, std::string::npos) << from;
  bytes.replace(at, from.size(), to);
  return GgufFile::from_bytes(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), "edited.gguf");
}

TEST(GgufTokenizer, OtherTokenizersAndMissingKeysAreNamed) {
  {
    auto file = with_value("tokenizer.ggml.model", "tokenizer.ggml.modem");  // the key gone
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(load_gguf_tokenizer(*file).status().to_string(),
              "NotFound: edited.gguf: tokenizer.ggml.model: expected the tokenizer's kind, found no such key");
  }
  {
    auto file = with_value("gpt2", "bert", "tokenizer.ggml.model");  // the value after the key
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_NE(load_gguf_tokenizer(*file).status().to_string().find("tokenizer.ggml.model"), std::string::npos);
    EXPECT_NE(load_gguf_tokenizer(*file).status().to_string().find("'bert'"), std::string::npos)
        << load_gguf_tokenizer(*file).status().to_string();
  }
  {
    // add_bos_token set without a BOS id (the key renamed): named, not a tokenizer without its BOS.
    std::string bytes =
        test_files::read_bytes(std::string(ASPEN_IO_TESTDATA) + "/gguf/llama-tiny-vocab.gguf");
    const std::string key = "tokenizer.ggml.bos_token_id";
    bytes.replace(bytes.find(key), key.size(), "tokenizer.ggml.bos_token_ix");
    auto file = GgufFile::from_bytes(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), "edited.gguf");
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    EXPECT_EQ(load_gguf_tokenizer(*file).status().to_string(),
              "Corrupt: edited.gguf: tokenizer.ggml.bos_token_id: expected a token id below 1000 (add_bos_token is "
              "set), found none");
  }
  {
    auto file = with_value("gpt-2", "xyz-9", "tokenizer.ggml.pre");  // a split aspen does not have
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    const std::string e = load_gguf_tokenizer(*file).status().to_string();
    EXPECT_NE(e.find("tokenizer.ggml.pre"), std::string::npos) << e;
    EXPECT_NE(e.find("'xyz-9'"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace aspen::io
