// io/tokenizer_pipeline.h: the steps of a Hugging Face tokenizer (private to io/).
//
// tokenizer.json describes a pipeline: added tokens are matched first, each
// stretch of text between them is normalized, pre-tokenized into words, and
// each word goes through the model (BPE or WordPiece); a post-processor adds
// special tokens, and a decoder turns tokens back into text. Config holds the
// steps tokenizer.json names (tokenizer_load.cc reads them); the functions
// below run the normalizer, pre-tokenizer and decoder steps exactly as the
// `tokenizers` crate does (docs/tokenizers.md says how each was checked).
//
// Thread-safety: pure functions over a Config that is not modified after load.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/tokenizer.h"

namespace aspen::io::tok {

// An added token. Tokens with normalized = false are matched in the raw text
// before anything else; with normalized = true (and a normalizer), in each
// normalized stretch between those, as their content normalized
// (`norm_text`: Prepend makes "foo" "▁foo"), as HF's AddedVocabulary does.
struct AddedToken {
  std::string content;
  std::u32string text;       // content decoded, for matching
  std::u32string norm_text;  // normalized: the content through the normalizers
  TokenId id = -1;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

struct BertNormalizer {
  bool clean_text = true, handle_chinese_chars = true, strip_accents = true, lowercase = true;
};

// One normalizer (a Sequence is a list of them).
struct NormalizerStep {
  enum class Kind { kBert, kPrepend, kReplace, kNfc, kLowercase };
  Kind kind = Kind::kBert;
  BertNormalizer bert;
  std::u32string from, to;  // Replace: from -> to (a string, not a regex); Prepend: to
};

// The split regexes aspen matches by hand (Oniguruma's semantics): GPT-2's
// (also ByteLevel's own), Llama 3's and Qwen2's (Llama 3's with single digits).
enum class SplitRegex { kGpt2, kLlama3, kQwen2 };

enum class PrependScheme { kAlways, kFirst, kNever };

// One pre-tokenizer (a Sequence is a list of them).
struct PreTokenizerStep {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kBert };
  Kind kind = Kind::kByteLevel;
  bool add_prefix_space = false;         // ByteLevel
  bool use_regex = true;                 // ByteLevel: split on the GPT-2 regex first
  SplitRegex regex = SplitRegex::kGpt2;  // Split (behavior Isolated, not inverted)
  char32_t replacement = U'\u2581';      // Metaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;  // Metaspace: split before each replacement character
};

// One decoder (a Sequence is a list of them).
struct DecoderStep {
  enum class Kind { kByteLevel, kWordPiece, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  Kind kind = Kind::kByteLevel;
  std::string prefix = "##";  // WordPiece
  bool cleanup = true;        // WordPiece
  std::string from, to;       // Replace
  char32_t replacement = U'\u2581';  // Metaspace
  PrependScheme prepend = PrependScheme::kAlways;
  char32_t strip = U' ';  // Strip: up to `start` leading and `stop` trailing copies of this character
  size_t start = 0, stop = 0;
};

enum class ModelKind { kBpe, kWordPiece };

struct Config {
  ModelKind model = ModelKind::kBpe;
  std::unordered_map<std::string, TokenId> vocab;
  std::vector<AddedToken> added;
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  std::vector<DecoderStep> decoders;  // empty: tokens joined by spaces
  std::vector<TokenId> post_prefix, post_suffix;  // around the sequence when add_special_tokens
  std::optional<std::string> pad_token;
  // BPE: (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges;
  bool ignore_merges = false;
  bool byte_fallback = false;  // a character without a token becomes its bytes' <0xXX> tokens
  bool fuse_unk = false;       // consecutive unknown characters become one unk
  std::optional<std::string> bpe_unk;  // BPE's unk_token (must be in the vocabulary)
  // WordPiece.
  std::string unk_token = "[UNK]";
  std::string continuing_prefix = "##";
  size_t max_input_chars_per_word = 100;
};

inline uint64_t pair_key(TokenId a, TokenId b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// GPT-2's reversible byte -> printable code point map.
const std::array<char32_t, 256>& byte_to_char();

// The normalizers, in order.
std::u32string normalize(std::u32string_view text, const std::vector<NormalizerStep>& steps);

// A word of the pre-tokenizer; `at_start`: it begins where the input text
// begins (Metaspace's prepend_scheme "first").
struct Piece {
  std::u32string text;
  bool at_start = false;
};

// The pre-tokenizers, in order, over one stretch of text between added tokens.
std::vector<Piece> pre_tokenize(std::u32string_view text, bool at_start, const std::vector<PreTokenizerStep>& steps);

// The decoders, in order, over the tokens' strings; the result is their concatenation.
std::string decode_tokens(std::vector<std::string> tokens, const std::vector<DecoderStep>& steps);

// The tokenizer that runs `cfg` (io/tokenizer.cc); the loaders (tokenizer_load.cc) check cfg first.
std::unique_ptr<Tokenizer> make_tokenizer(Config cfg);

// What the loaders share (tokenizer_load.cc; gguf_tokenizer.cc reads GGUF files with them).
std::string sq(std::string_view s);  // 's', quoted for an error
Status corrupt(const std::string& subject, const std::string& expected, const std::string& found);
// One merge "left right" with `rank` into cfg->merges; the three tokens must be in cfg->vocab.
Status add_merge(const std::string& where, const std::string& left, const std::string& right, int32_t rank,
                 Config* cfg);
// GPT-2's byte-level BPE around cfg's vocabulary and merges: ByteLevel without a prefix space, its decoder.
void gpt2_byte_level(Config* cfg);
// cfg checked (ids bounded, the post-processor's and unk tokens in the vocabulary), then make_tokenizer.
Result<std::unique_ptr<Tokenizer>> finish(const std::string& path, Config cfg);

}  // namespace aspen::io::tok
