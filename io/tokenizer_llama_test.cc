// Llama-family tokenizers (Llama 2 / Mistral SentencePiece conversions, Llama 3
// and Qwen2 byte-level BPE): ids and decodes identical to Hugging Face
// tokenizers on the golden data of scripts/golden/make_llama_tokenizer_golden.py.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "io/test_files.h"
#include "io/tokenizer.h"
#include "io/tokenizer_test_util.h"
#include "io/tokenizer_unicode.h"

namespace aspen::io {
namespace {

using json = nlohmann::json;
using test_files::read_bytes;
using tokenizer_test::fnv1a;
using tokenizer_test::split_lines;

const std::string kTestdata = ASPEN_IO_TESTDATA;
const char* const kNames[] = {"spm_legacy", "spm_metaspace", "spm_metaspace_split", "llama3_bpe", "qwen2_bpe",
                              "spm_added", "qwen2_added"};

const json& golden() {
  static const json j = json::parse(read_bytes(kTestdata + "/tokenizer_llama_golden.json"));
  return j;
}

std::unique_ptr<Tokenizer> load_ok(const std::string& name) {
  auto r = load_tokenizer(kTestdata + "/" + name);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

std::vector<TokenId> ids_of(const json& j) { return j.get<std::vector<TokenId>>(); }

void check_cases(const Tokenizer& tok, const std::vector<std::string>& texts, const json& g) {
  ASSERT_EQ(texts.size(), g.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const json& c = g[i];
    SCOPED_TRACE("case " + std::to_string(i) + ": " + texts[i]);
    EXPECT_EQ(tok.encode(texts[i], false), ids_of(c["ids"]));
    EXPECT_EQ(tok.encode(texts[i], true), ids_of(c["ids_special"]));
    EXPECT_EQ(tok.decode(ids_of(c["ids"]), false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids_of(c["ids_special"]), true), c["decoded_skip"].get<std::string>());
  }
}

TEST(LlamaTokenizers, HardCasesMatchHuggingFace) {
  const auto hard = split_lines(read_bytes(kTestdata + "/tokenizer_hard_cases.txt"));
  const auto llama = golden()["cases"].get<std::vector<std::string>>();
  const auto added = golden()["added_cases"].get<std::vector<std::string>>();
  for (const char* name : kNames) {
    SCOPED_TRACE(name);
    auto tok = load_ok(name);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->vocab_size(), golden()[name]["vocab_size"].get<size_t>());
    check_cases(*tok, hard, golden()[name]["hard_cases"]);
    check_cases(*tok, llama, golden()[name]["llama_cases"]);
    check_cases(*tok, added, golden()[name]["added_cases"]);  // tokens a user added, normalized and not
  }
}

TEST(LlamaTokenizers, TinyShakespeareMatchesHuggingFace) {
  const std::string path = std::string(ASPEN_SHARED_DIR_DEFAULT) + "/data/tinyshakespeare.txt";
  auto lines = split_lines(read_bytes(path));
  ASSERT_GT(lines.size(), 1u) << "cannot read " << path;
  if (lines.back().empty()) lines.pop_back();
  for (const char* name : kNames) {
    SCOPED_TRACE(name);
    auto tok = load_ok(name);
    ASSERT_TRUE(tok);
    const json& g = golden()[name]["tinyshakespeare"];
    ASSERT_EQ(lines.size(), g["lines"].get<size_t>());
    const auto t0 = std::chrono::steady_clock::now();
    size_t total = 0;
    uint64_t h = tokenizer_test::kFnvBasis;
    std::vector<std::string> hashes;
    for (size_t i = 0; i < lines.size(); ++i) {
      const auto ids = tok->encode(lines[i], true);
      total += ids.size();
      h = fnv1a(h, ids);
      if (i % 1000 == 999 || i + 1 == lines.size()) {
        char buf[17];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
        hashes.push_back(buf);
        h = tokenizer_test::kFnvBasis;
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ tokenizer ] %s: %zu lines, %zu tokens, %.3f s\n", name, lines.size(), total, s);
    EXPECT_EQ(total, g["total_tokens"].get<size_t>());
    EXPECT_EQ(hashes, g["block_hashes"].get<std::vector<std::string>>());
  }
}

TEST(LlamaTokenizers, SpecialIds) {
  auto spm = load_ok("spm_legacy");
  auto llama3 = load_ok("llama3_bpe");
  auto qwen2 = load_ok("qwen2_bpe");
  ASSERT_TRUE(spm && llama3 && qwen2);
  EXPECT_EQ(spm->special_ids().bos, 1);
  EXPECT_EQ(spm->special_ids().eos, 2);
  EXPECT_EQ(spm->special_ids().unk, 0);
  EXPECT_EQ(llama3->special_ids().bos, llama3->token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama3->special_ids().eos, llama3->token_to_id("<|end_of_text|>"));
  EXPECT_EQ(qwen2->special_ids().eos, qwen2->token_to_id("<|endoftext|>"));
  // add_special_tokens: Llama 2 and 3 put their BOS first, Qwen2 adds nothing.
  EXPECT_EQ(spm->encode("x", true).front(), 1);
  EXPECT_EQ(llama3->encode("x", true).front(), *llama3->token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(qwen2->encode("x", true), qwen2->encode("x", false));
}

// A Llama 2 text without added tokens is one word for the BPE model (no
// pre-tokenizer): merging must stay O(n log n), not quadratic.
TEST(LlamaTokenizers, LongWordWithoutPreTokenizerIsFast) {
  auto tok = load_ok("spm_legacy");
  ASSERT_TRUE(tok);
  std::string text = read_bytes(std::string(ASPEN_SHARED_DIR_DEFAULT) + "/data/tinyshakespeare.txt").substr(0, 200000);
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 30000u);
  EXPECT_LT(s, 5.0) << "200 kB in one word took " << s << " s";
  // The same text line by line (each line its own word) decodes to the same text.
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(TokenizerUnicode, NfcComposesAsHuggingFace) {
  using unicode::nfc;
  using unicode::decode_utf8_lossy;
  // e + acute -> é; A + ring -> Å; Hangul L V T -> one syllable; a singleton
  // (U+212B ANGSTROM SIGN) -> U+00C5; marks reordered by class then composed
  // (q + dot below + dot above stays decomposed: no precomposed q with dots);
  // a composition exclusion (U+0958) stays decomposed.
  EXPECT_EQ(nfc(U"e\u0301"), U"\u00e9");
  EXPECT_EQ(nfc(U"A\u030a"), U"\u00c5");
  EXPECT_EQ(nfc(U"\u1100\u1161\u11a8"), U"\uac01");
  EXPECT_EQ(nfc(U"\uac00\u11a8"), U"\uac01");
  EXPECT_EQ(nfc(U"\u212b"), U"\u00c5");
  EXPECT_EQ(nfc(U"\u1e9b\u0323"), U"\u1e9b\u0323");
  EXPECT_EQ(nfc(U"s\u0307\u0323"), U"\u1e69");  // dot above, dot below -> reordered -> s with both
  EXPECT_EQ(nfc(U"q\u0307\u0323"), U"q\u0323\u0307");
  EXPECT_EQ(nfc(U"\u0958"), U"\u0915\u093c");
  EXPECT_EQ(nfc(U"a\u0301\u0301"), U"\u00e1\u0301");  // the second acute is blocked by the first
  EXPECT_EQ(nfc(decode_utf8_lossy("caf\xc3\xa9")), decode_utf8_lossy("caf\xc3\xa9"));
}

}  // namespace
}  // namespace aspen::io
