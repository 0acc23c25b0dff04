// fuzz/tokenizer_json_fuzz.cc: libFuzzer target for the tokenizer.json loader.
//
// Input: tokenizer.json text, then optionally a NUL byte and up to four
// NUL-separated texts (JSON text cannot contain a raw NUL, so the split loses
// nothing). The loader must give a Status for any bytes; when it loads, the
// texts (and a fixed one) are encoded, padded and decoded, and the ids the
// tokenizer gave plus arbitrary ids read from the texts are decoded, all of
// which must return without crashing.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "io/tokenizer.h"

namespace {

// Texts are capped: WordPiece's greedy match is quadratic in a word's length,
// as Hugging Face's is, so a long word would only measure that.
constexpr size_t kMaxText = 256;

void exercise(const aspen::io::Tokenizer& tok, std::string_view text) {
  using aspen::io::TokenId;
  for (bool special : {false, true}) {
    std::vector<TokenId> ids = tok.encode(text, special);
    for (TokenId id : ids) (void)tok.id_to_token(id);
    (void)tok.decode(ids, false);
    (void)tok.decode(ids, true);
    auto padded = tok.encode_padded(text, 8, special);
    if (padded.is_ok()) ASPEN_CHECK(padded->ids.size() >= 8 && padded->ids.size() == padded->attention_mask.size());
  }
  // Arbitrary ids, in and out of the vocabulary.
  std::vector<TokenId> raw(text.size() / sizeof(TokenId));
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * sizeof(TokenId));
  for (TokenId& id : raw) id %= TokenId(tok.vocab_size() + 4);
  (void)tok.decode(raw, false);
  (void)tok.decode(raw, true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  auto tok = aspen::io::load_tokenizer_json_from_string(in.substr(0, nul), "fuzz");
  if (!tok.is_ok()) {
    ASPEN_CHECK(!tok.status().message().empty());
    return 0;
  }
  const aspen::io::Tokenizer& t = **tok;
  (void)t.special_ids();
  (void)t.token_to_id("[UNK]");
  exercise(t, "Hello, world! It's 2024: caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd [CLS] <|endoftext|> ##ing  \t\n");
  std::string_view rest = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  for (int k = 0; k < 4 && !rest.empty(); ++k) {
    const size_t end = rest.find('\0');
    exercise(t, rest.substr(0, std::min(end, kMaxText)));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
  }
  return 0;
}
