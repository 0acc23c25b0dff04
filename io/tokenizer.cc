#include "io/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/file.h"
#include "io/json_brief.h"
#include "io/tokenizer_unicode.h"

namespace aspen::io {
namespace {

using json = nlohmann::json;
namespace uni = unicode;

std::string sq(std::string_view s) { return "'" + std::string(s) + "'"; }

Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) {
  return Status::error(Code::kCorrupt, subject, expected, found);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// ---------------------------------------------------------------------------
// Configuration: what a tokenizer.json (or the legacy files) describes.

struct AddedToken {
  std::string content;
  std::u32string text;  // content decoded, for matching
  TokenId id = -1;
  bool special = false, lstrip = false, rstrip = false;
};

struct BertNormalizer {
  bool clean_text = true, handle_chinese_chars = true, strip_accents = true, lowercase = true;
};

enum class ModelKind { kBpe, kWordPiece };
enum class DecoderKind { kNone, kByteLevel, kWordPiece };

struct Config {
  ModelKind model = ModelKind::kBpe;
  std::unordered_map<std::string, TokenId> vocab;
  std::vector<AddedToken> added;
  std::optional<BertNormalizer> normalizer;
  bool add_prefix_space = false;  // ByteLevel pre-tokenizer
  DecoderKind decoder = DecoderKind::kNone;
  std::string decoder_prefix = "##";
  bool decoder_cleanup = true;
  std::vector<TokenId> post_prefix, post_suffix;  // around the sequence when add_special_tokens
  std::optional<std::string> pad_token;
  // BPE: (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges;
  bool ignore_merges = false;
  // WordPiece.
  std::string unk_token = "[UNK]";
  std::string continuing_prefix = "##";
  size_t max_input_chars_per_word = 100;
};

uint64_t pair_key(TokenId a, TokenId b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// GPT-2's reversible byte -> printable code point map.
const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[b] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

// ---------------------------------------------------------------------------
// The tokenizer: added-token split, normalizer, pre-tokenizer, model, post-processor.

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(Config cfg) : cfg_(std::move(cfg)) {
    TokenId max_id = -1;
    for (const auto& [tok, id] : cfg_.vocab) max_id = std::max(max_id, id);
    for (const auto& a : cfg_.added) max_id = std::max(max_id, a.id);
    id_to_token_.resize(size_t(max_id + 1));
    present_.resize(size_t(max_id + 1), false);
    for (const auto& [tok, id] : cfg_.vocab) id_to_token_[size_t(id)] = tok, present_[size_t(id)] = true;
    for (const auto& a : cfg_.added) {
      id_to_token_[size_t(a.id)] = a.content;
      present_[size_t(a.id)] = true;
      if (a.special) special_set_.insert(a.id);
      added_by_content_[a.content] = a.id;
    }
    for (int b = 0; b < 256; ++b) {
      std::string s;
      uni::append_utf8(s, byte_to_char()[size_t(b)]);
      auto it = cfg_.vocab.find(s);
      byte_id_[size_t(b)] = it == cfg_.vocab.end() ? -1 : it->second;
      char_to_byte_[byte_to_char()[size_t(b)]] = uint8_t(b);
    }
    auto find = [&](std::initializer_list<const char*> names) -> std::optional<TokenId> {
      for (const char* n : names)
        if (auto id = token_to_id(n)) return id;
      return std::nullopt;
    };
    special_.bos = find({"<|endoftext|>", "<s>"});
    special_.eos = find({"<|endoftext|>", "</s>"});
    if (cfg_.model == ModelKind::kWordPiece) special_.unk = find({cfg_.unk_token.c_str()});
    if (cfg_.pad_token) special_.pad = find({cfg_.pad_token->c_str()});
    if (!special_.pad) special_.pad = find({"[PAD]", "<pad>"});
    special_.cls = find({"[CLS]"});
    special_.sep = find({"[SEP]"});
    special_.mask = find({"[MASK]"});
  }

  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const override {
    const std::u32string t = uni::decode_utf8_lossy(text);
    std::vector<TokenId> ids;
    if (add_special_tokens) ids = cfg_.post_prefix;
    size_t seg = 0, i = 0;
    while (i < t.size()) {
      const AddedToken* best = nullptr;
      for (const AddedToken& a : cfg_.added) {
        if (a.text.empty() || (best && a.text.size() <= best->text.size())) continue;
        if (t.compare(i, a.text.size(), a.text) == 0) best = &a;
      }
      if (!best) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + best->text.size();
      if (best->lstrip)
        while (begin > seg && uni::is_bert_space(t[begin - 1])) --begin;
      if (best->rstrip)
        while (end < t.size() && uni::is_bert_space(t[end])) ++end;
      encode_segment(std::u32string_view(t).substr(seg, begin - seg), ids);
      ids.push_back(best->id);
      seg = i = end;
    }
    encode_segment(std::u32string_view(t).substr(seg), ids);
    if (add_special_tokens) ids.insert(ids.end(), cfg_.post_suffix.begin(), cfg_.post_suffix.end());
    return ids;
  }

  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens) const override {
    std::vector<const std::string*> tokens;
    for (TokenId id : ids) {
      if (id < 0 || size_t(id) >= present_.size() || !present_[size_t(id)]) continue;
      if (skip_special_tokens && special_set_.count(id)) continue;
      tokens.push_back(&id_to_token_[size_t(id)]);
    }
    std::string out;
    switch (cfg_.decoder) {
      case DecoderKind::kByteLevel: {
        // Each token's characters map back to bytes; a token with a character
        // outside the byte alphabet contributes its UTF-8 as is. The bytes are
        // then read as UTF-8 lossily (Rust String::from_utf8_lossy).
        std::string bytes;
        for (const std::string* tok : tokens) {
          const std::u32string chars = uni::decode_utf8_lossy(*tok);
          std::string mapped;
          bool all = true;
          for (char32_t c : chars) {
            auto it = char_to_byte_.find(c);
            if (it == char_to_byte_.end()) {
              all = false;
              break;
            }
            mapped.push_back(char(it->second));
          }
          bytes += all ? mapped : *tok;
        }
        out = uni::to_utf8(uni::decode_utf8_lossy(bytes));
        break;
      }
      case DecoderKind::kWordPiece:
        // Per token: a continuation loses its prefix, any other token after the
        // first gets a leading space; cleanup then runs on that one token.
        for (size_t k = 0; k < tokens.size(); ++k) {
          std::string tok = *tokens[k];
          if (k != 0) {
            if (tok.rfind(cfg_.decoder_prefix, 0) == 0) tok.erase(0, cfg_.decoder_prefix.size());
            else tok.insert(0, " ");
          }
          if (cfg_.decoder_cleanup) cleanup(tok);
          out += tok;
        }
        break;
      case DecoderKind::kNone:
        for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + *tokens[k];
        break;
    }
    return out;
  }

  Result<PaddedEncoding> encode_padded(std::string_view text, size_t length,
                                       bool add_special_tokens) const override {
    if (!special_.pad)
      return Status::error(Code::kFailedPrecondition, "encode_padded", "a tokenizer with a pad token",
                           "none ([PAD], <pad> or tokenizer.json padding.pad_token)");
    PaddedEncoding enc;
    enc.ids = encode(text, false);
    const size_t extra = add_special_tokens ? cfg_.post_prefix.size() + cfg_.post_suffix.size() : 0;
    enc.ids.resize(std::min(enc.ids.size(), length > extra ? length - extra : 0));
    if (add_special_tokens) {
      enc.ids.insert(enc.ids.begin(), cfg_.post_prefix.begin(), cfg_.post_prefix.end());
      enc.ids.insert(enc.ids.end(), cfg_.post_suffix.begin(), cfg_.post_suffix.end());
    }
    enc.attention_mask.assign(enc.ids.size(), 1);
    if (enc.ids.size() < length) {
      enc.ids.resize(length, *special_.pad);
      enc.attention_mask.resize(length, 0);
    }
    return enc;
  }

  std::optional<std::string> id_to_token(TokenId id) const override {
    if (id < 0 || size_t(id) >= present_.size() || !present_[size_t(id)]) return std::nullopt;
    return id_to_token_[size_t(id)];
  }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    const std::string key(token);
    if (auto it = added_by_content_.find(key); it != added_by_content_.end()) return it->second;
    if (auto it = cfg_.vocab.find(key); it != cfg_.vocab.end()) return it->second;
    return std::nullopt;
  }
  size_t vocab_size() const override { return present_.size(); }
  const SpecialTokenIds& special_ids() const override { return special_; }

 private:
  static void replace_all(std::string& s, std::string_view from, std::string_view to) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
      s.replace(p, from.size(), to);
  }
  static void cleanup(std::string& s) {
    static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},     {" ?", "?"},     {" !", "!"},          {" ,", ","},
        {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"},        {" do not", " don't"},
        {" 's", "'s"},   {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules) replace_all(s, from, to);
  }

  // Text between added tokens: normalize, pre-tokenize, run the model.
  void encode_segment(std::u32string_view seg, std::vector<TokenId>& ids) const {
    if (seg.empty()) return;
    std::u32string norm;
    if (cfg_.normalizer) {
      norm = normalize(seg, *cfg_.normalizer);
      seg = norm;
    }
    if (cfg_.model == ModelKind::kBpe) {
      std::u32string prefixed;
      if (cfg_.add_prefix_space && seg[0] != U' ') {
        prefixed = U" " + std::u32string(seg);
        seg = prefixed;
      }
      for (size_t i = 0; i < seg.size();) {
        const size_t end = gpt2_split_end(seg, i);
        bpe_word(uni::to_utf8(seg.substr(i, end - i)), ids);
        i = end;
      }
    } else {
      size_t start = 0;
      for (size_t i = 0; i <= seg.size(); ++i) {
        const bool at_end = i == seg.size();
        const bool space = !at_end && uni::is_bert_space(seg[i]);
        const bool punct = !at_end && !space && uni::is_bert_punct(seg[i]);
        if (!at_end && !space && !punct) continue;
        if (i > start) wordpiece_word(seg.substr(start, i - start), ids);
        if (punct) wordpiece_word(seg.substr(i, 1), ids);
        start = i + 1;
      }
    }
  }

  static std::u32string normalize(std::u32string_view in, const BertNormalizer& n) {
    std::u32string a;
    a.reserve(in.size());
    for (char32_t c : in) {
      if (n.clean_text) {
        if (c == 0 || c == 0xFFFD || uni::is_bert_control(c)) continue;
        if (uni::is_bert_space(c)) c = U' ';
      }
      if (n.handle_chinese_chars && uni::is_bert_chinese(c)) {
        a += U' ';
        a += c;
        a += U' ';
      } else {
        a += c;
      }
    }
    if (n.strip_accents) {
      std::u32string b;
      b.reserve(a.size());
      for (char32_t c : a) uni::append_strip_accents(c, b);
      a.swap(b);
    }
    if (n.lowercase) {
      std::u32string b;
      b.reserve(a.size());
      for (char32_t c : a) uni::append_lowercase(c, b);
      a.swap(b);
    }
    return a;
  }

  // End of the GPT-2 regex match starting at i:
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // Alternatives are tried in order, as Oniguruma does.
  static size_t gpt2_split_end(std::u32string_view t, size_t i) {
    enum Class { kLetter, kNumber, kSpace, kOther };
    auto cls = [&](size_t k) {
      const char32_t c = t[k];
      if (uni::is_regex_letter(c)) return kLetter;
      if (uni::is_regex_number(c)) return kNumber;
      if (uni::is_regex_space(c)) return kSpace;
      return kOther;
    };
    const size_t n = t.size();
    if (t[i] == U'\'' && i + 1 < n) {
      const char32_t a = t[i + 1];
      if (a == U's' || a == U't' || a == U'm' || a == U'd') return i + 2;
      if (i + 2 < n) {
        const char32_t b = t[i + 2];
        if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return i + 3;
      }
    }
    size_t start = i;
    if (t[i] == U' ' && i + 1 < n && cls(i + 1) != kSpace) start = i + 1;
    const Class c = cls(start);
    if (c != kSpace) {
      size_t end = start + 1;
      while (end < n && cls(end) == c) ++end;
      return end;
    }
    size_t end = i + 1;
    while (end < n && cls(end) == kSpace) ++end;
    if (end == n || end - i == 1) return end;  // \s+ to the end, or a single \s
    return end - 1;                             // \s+(?!\S): leave one for the next word
  }

  template <class F>
  void cached(const std::string& key, std::vector<TokenId>& ids, F compute) const {
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (auto it = cache_.find(key); it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<TokenId> word = compute();
    ids.insert(ids.end(), word.begin(), word.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCache) cache_.clear();
    cache_.emplace(key, std::move(word));
  }

  void bpe_word(const std::string& bytes, std::vector<TokenId>& ids) const {
    cached(bytes, ids, [&] {
      std::vector<TokenId> w;
      if (cfg_.ignore_merges) {
        std::string mapped;
        for (unsigned char b : bytes) uni::append_utf8(mapped, byte_to_char()[b]);
        if (auto it = cfg_.vocab.find(mapped); it != cfg_.vocab.end()) return std::vector<TokenId>{it->second};
      }
      for (unsigned char b : bytes)
        if (byte_id_[b] >= 0) w.push_back(byte_id_[b]);  // HF drops symbols without an id
      // Merge the lowest-ranked adjacent pair (leftmost on ties) until none is left.
      while (w.size() > 1) {
        int32_t best_rank = INT32_MAX;
        size_t best = 0;
        TokenId merged = -1;
        for (size_t k = 0; k + 1 < w.size(); ++k) {
          auto it = cfg_.merges.find(pair_key(w[k], w[k + 1]));
          if (it != cfg_.merges.end() && it->second.first < best_rank)
            best_rank = it->second.first, best = k, merged = it->second.second;
        }
        if (merged < 0) break;
        w[best] = merged;
        w.erase(w.begin() + std::ptrdiff_t(best) + 1);
      }
      return w;
    });
  }

  void wordpiece_word(std::u32string_view word, std::vector<TokenId>& ids) const {
    cached(uni::to_utf8(word), ids, [&] {
      std::vector<TokenId> w;
      const auto unk = cfg_.vocab.find(cfg_.unk_token);
      auto unknown = [&] {
        return unk == cfg_.vocab.end() ? std::vector<TokenId>{} : std::vector<TokenId>{unk->second};
      };
      if (word.size() > cfg_.max_input_chars_per_word) return unknown();
      // Greedy longest match from the left; one miss makes the whole word unknown.
      for (size_t start = 0; start < word.size();) {
        size_t end = word.size();
        TokenId found = -1;
        for (; end > start; --end) {
          std::string piece = start > 0 ? cfg_.continuing_prefix : std::string();
          piece += uni::to_utf8(word.substr(start, end - start));
          if (auto it = cfg_.vocab.find(piece); it != cfg_.vocab.end()) {
            found = it->second;
            break;
          }
        }
        if (found < 0) return unknown();
        w.push_back(found);
        start = end;
      }
      return w;
    });
  }

  static constexpr size_t kMaxCache = size_t(1) << 16;

  Config cfg_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> present_;
  std::unordered_set<TokenId> special_set_;
  std::unordered_map<std::string, TokenId> added_by_content_;
  std::array<TokenId, 256> byte_id_{};
  std::unordered_map<char32_t, uint8_t> char_to_byte_;
  SpecialTokenIds special_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

// ---------------------------------------------------------------------------
// Loading.

// Reads JSON with exceptions contained here; the message names the file and byte.
Status parse_json(const std::string& path, std::string_view text, json* out) {
  try {
    *out = json::parse(text);
  } catch (const json::parse_error& e) {
    return corrupt(path, "well-formed JSON", "a parse error at byte " + std::to_string(e.byte));
  } catch (const json::exception& e) {  // e.g. a number too large for any JSON number type (found by fuzzing)
    return corrupt(path, "well-formed JSON with representable numbers", e.what());
  }
  return Status::ok();
}

// Field access that names the file and key on failure.
struct JsonAt {
  const std::string& path;
  Status missing(const std::string& key, const std::string& expected) const {
    return corrupt(path + ": " + key, expected, "none");
  }
  Status wrong(const std::string& key, const std::string& expected, const json& v) const {
    return corrupt(path + ": " + key, expected, std::string("a JSON ") + v.type_name());
  }
};

Result<bool> opt_bool(const JsonAt& at, const json& obj, const std::string& prefix, const char* key, bool dflt) {
  if (!obj.contains(key) || obj[key].is_null()) return dflt;
  if (!obj[key].is_boolean()) return at.wrong(prefix + key, "true or false", obj[key]);
  return obj[key].get<bool>();
}

Result<std::string> opt_string(const JsonAt& at, const json& obj, const std::string& prefix, const char* key,
                               std::string dflt) {
  if (!obj.contains(key) || obj[key].is_null()) return dflt;
  if (!obj[key].is_string()) return at.wrong(prefix + key, "a string", obj[key]);
  return obj[key].get<std::string>();
}

Status read_vocab(const JsonAt& at, const json& v, const std::string& key, Config* cfg) {
  if (!v.is_object()) return at.wrong(key, "an object of token -> id", v);
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > int64_t(1) << 30)
      return corrupt(at.path + ": " + key + "." + it.key(), "an id in [0, 2^30]", json_brief(it.value()));
    cfg->vocab[it.key()] = TokenId(it.value().get<int64_t>());
  }
  return Status::ok();
}

// One merge "left right" (rank = its position) into cfg->merges.
Status add_merge(const std::string& where, const std::string& left, const std::string& right, int32_t rank,
                 Config* cfg) {
  auto l = cfg->vocab.find(left), r = cfg->vocab.find(right), m = cfg->vocab.find(left + right);
  for (auto [it, tok] : {std::pair{l, &left}, std::pair{r, &right}})
    if (it == cfg->vocab.end())
      return corrupt(where, "a merge of two vocabulary tokens", "token " + sq(*tok) + " not in the vocabulary");
  if (m == cfg->vocab.end())
    return corrupt(where, "the merged token in the vocabulary", "token " + sq(left + right) + " not in it");
  cfg->merges.emplace(pair_key(l->second, r->second), std::pair{rank, m->second});
  return Status::ok();
}

Status read_merges(const JsonAt& at, const json& merges, Config* cfg) {
  if (!merges.is_array()) return at.wrong("model.merges", "an array", merges);
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string where = at.path + ": model.merges[" + std::to_string(i) + "]";
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return corrupt(where, "two tokens separated by one space", sq(s));
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      return corrupt(where, "\"left right\" or [left, right]", json_brief(m));
    }
    ASPEN_RETURN_IF_ERROR(add_merge(where, left, right, int32_t(i), cfg));
  }
  return Status::ok();
}

Status read_added_tokens(const JsonAt& at, const json& root, bool has_normalizer, Config* cfg) {
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return Status::ok();
  const json& list = root["added_tokens"];
  if (!list.is_array()) return at.wrong("added_tokens", "an array", list);
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object()) return at.wrong(key, "an object", e);
    if (!e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
        e["id"].get<int64_t>() > int64_t(1) << 30)
      return corrupt(at.path + ": " + key + ".id", "an id in [0, 2^30]", e.contains("id") ? json_brief(e["id"]) : "none");
    if (!e.contains("content") || !e["content"].is_string()) return at.missing(key + ".content", "a string");
    AddedToken a;
    a.id = TokenId(e["id"].get<int64_t>());
    a.content = e["content"].get<std::string>();
    a.text = uni::decode_utf8_lossy(a.content);
    ASPEN_ASSIGN_OR_RETURN(a.special, opt_bool(at, e, key + ".", "special", false));
    ASPEN_ASSIGN_OR_RETURN(a.lstrip, opt_bool(at, e, key + ".", "lstrip", false));
    ASPEN_ASSIGN_OR_RETURN(a.rstrip, opt_bool(at, e, key + ".", "rstrip", false));
    ASPEN_ASSIGN_OR_RETURN(bool single_word, opt_bool(at, e, key + ".", "single_word", false));
    ASPEN_ASSIGN_OR_RETURN(bool normalized, opt_bool(at, e, key + ".", "normalized", !a.special));
    if (single_word) return Status::unimplemented(at.path + ": " + key, "single_word added tokens");
    if (normalized && has_normalizer)
      return Status::unimplemented(at.path + ": " + key, "normalized added tokens with a normalizer");
    cfg->added.push_back(std::move(a));
  }
  return Status::ok();
}

// Looks up a special token named in a post-processor.
Result<TokenId> special_id(const JsonAt& at, const std::string& key, const std::string& token, const Config& cfg) {
  for (const AddedToken& a : cfg.added)
    if (a.content == token) return a.id;
  if (auto it = cfg.vocab.find(token); it != cfg.vocab.end()) return it->second;
  return corrupt(at.path + ": " + key, "a token of the vocabulary", sq(token));
}

// A post-processor id (an integer); finish() checks it names a token.
Result<TokenId> post_processor_id(const JsonAt& at, const json& v) {
  const int64_t id = v.get<int64_t>();  // a u64 above INT64_MAX wraps negative
  if (id < 0 || id > INT32_MAX)
    return corrupt(at.path + ": post_processor", "ids of vocabulary tokens", "id " + v.dump());
  return TokenId(id);
}

Status read_post_processor(const JsonAt& at, const json& root, Config* cfg) {
  if (!root.contains("post_processor") || root["post_processor"].is_null()) return Status::ok();
  const json& p = root["post_processor"];
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return at.missing("post_processor.type", "a string");
  const std::string type = p["type"].get<std::string>();
  if (type == "ByteLevel") return Status::ok();  // offsets only
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* k : {"cls", "sep"}) {
      const std::string key = std::string("post_processor.") + k;
      if (!p.contains(k) || !p[k].is_array() || p[k].size() != 2 || !p[k][1].is_number_integer())
        return at.missing(key, "[token, id]");
      ASPEN_ASSIGN_OR_RETURN(TokenId id, post_processor_id(at, p[k][1]));
      (std::string(k) == "cls" ? cfg->post_prefix : cfg->post_suffix).push_back(id);
    }
    return Status::ok();
  }
  if (type != "TemplateProcessing")
    return Status::unimplemented(at.path + ": post_processor.type", sq(type));
  if (!p.contains("single") || !p["single"].is_array()) return at.missing("post_processor.single", "an array");
  bool seen_sequence = false;
  for (const json& item : p["single"]) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
               item["SpecialToken"]["id"].is_string()) {
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      // The ids come from the processor's special_tokens table (a token may expand to several).
      std::vector<TokenId> tids;
      if (p.contains("special_tokens") && p["special_tokens"].contains(name) &&
          p["special_tokens"][name].contains("ids") && p["special_tokens"][name]["ids"].is_array()) {
        for (const json& id : p["special_tokens"][name]["ids"]) {
          if (!id.is_number_integer()) return at.wrong("post_processor.special_tokens." + name, "integer ids", id);
          ASPEN_ASSIGN_OR_RETURN(TokenId tid, post_processor_id(at, id));
          tids.push_back(tid);
        }
      } else {
        ASPEN_ASSIGN_OR_RETURN(TokenId id, special_id(at, "post_processor.single", name, *cfg));
        tids.push_back(id);
      }
      auto& dst = seen_sequence ? cfg->post_suffix : cfg->post_prefix;
      dst.insert(dst.end(), tids.begin(), tids.end());
    } else {
      return corrupt(at.path + ": post_processor.single", "Sequence or SpecialToken items", json_brief(item));
    }
  }
  return Status::ok();
}

// Ids index a table, so a huge id in a small vocabulary would allocate without bound.
Result<std::unique_ptr<Tokenizer>> finish(const std::string& path, Config cfg) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : cfg.vocab) max_id = std::max<int64_t>(max_id, id);
  for (const AddedToken& a : cfg.added) max_id = std::max<int64_t>(max_id, a.id);
  const int64_t count = int64_t(cfg.vocab.size() + cfg.added.size());
  if (max_id >= 2 * count + 1024)
    return corrupt(path, "token ids below 2 * (number of tokens) + 1024 = " + std::to_string(2 * count + 1024),
                   "id " + std::to_string(max_id));
  // encode() emits the post-processor's ids as they are; one outside the
  // vocabulary would index past a model's embedding table.
  std::unordered_set<int64_t> known;
  for (const auto& [tok, id] : cfg.vocab) known.insert(id);
  for (const AddedToken& a : cfg.added) known.insert(a.id);
  for (const auto* ids : {&cfg.post_prefix, &cfg.post_suffix})
    for (int64_t id : *ids)
      if (!known.count(id))
        return corrupt(path + ": post_processor", "ids of vocabulary tokens", "id " + std::to_string(id));
  return std::unique_ptr<Tokenizer>(new HfTokenizer(std::move(cfg)));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path));
  return load_tokenizer_json_from_string(text, path);
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer_json_from_string(std::string_view text, const std::string& path) {
  json root;
  ASPEN_RETURN_IF_ERROR(parse_json(path, text, &root));
  const JsonAt at{path};
  if (!root.is_object()) return at.wrong("(root)", "an object", root);
  if (!root.contains("model") || !root["model"].is_object()) return at.missing("model", "an object");
  const json& model = root["model"];
  Config cfg;

  std::string type;
  ASPEN_ASSIGN_OR_RETURN(type, opt_string(at, model, "model.", "type", ""));
  if (type.empty()) type = model.contains("merges") ? "BPE" : model.contains("continuing_subword_prefix") ? "WordPiece" : "";
  if (!model.contains("vocab")) return at.missing("model.vocab", "an object of token -> id");
  if (type == "BPE") {
    cfg.model = ModelKind::kBpe;
    ASPEN_RETURN_IF_ERROR(read_vocab(at, model["vocab"], "model.vocab", &cfg));
    if (!model.contains("merges")) return at.missing("model.merges", "an array");
    ASPEN_RETURN_IF_ERROR(read_merges(at, model["merges"], &cfg));
    ASPEN_ASSIGN_OR_RETURN(cfg.ignore_merges, opt_bool(at, model, "model.", "ignore_merges", false));
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      ASPEN_ASSIGN_OR_RETURN(std::string v, opt_string(at, model, "model.", k, ""));
      if (!v.empty()) return Status::unimplemented(path + ": model." + k, "BPE with " + sq(v));
    }
    for (const char* k : {"byte_fallback", "fuse_unk"}) {
      ASPEN_ASSIGN_OR_RETURN(bool v, opt_bool(at, model, "model.", k, false));
      if (v) return Status::unimplemented(path + ": model." + k, "BPE with " + std::string(k));
    }
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0)
      return Status::unimplemented(path + ": model.dropout", "BPE dropout (random merges)");
  } else if (type == "WordPiece") {
    cfg.model = ModelKind::kWordPiece;
    ASPEN_RETURN_IF_ERROR(read_vocab(at, model["vocab"], "model.vocab", &cfg));
    ASPEN_ASSIGN_OR_RETURN(cfg.unk_token, opt_string(at, model, "model.", "unk_token", "[UNK]"));
    ASPEN_ASSIGN_OR_RETURN(cfg.continuing_prefix, opt_string(at, model, "model.", "continuing_subword_prefix", "##"));
    if (model.contains("max_input_chars_per_word")) {
      if (!model["max_input_chars_per_word"].is_number_unsigned())
        return at.wrong("model.max_input_chars_per_word", "a non-negative integer", model["max_input_chars_per_word"]);
      cfg.max_input_chars_per_word = model["max_input_chars_per_word"].get<size_t>();
    }
  } else {
    return Status::error(Code::kUnimplemented, path + ": model.type", "BPE or WordPiece",
                         type.empty() ? "none" : sq(type));
  }

  // Normalizer: none, or BertNormalizer.
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& n = root["normalizer"];
    ASPEN_ASSIGN_OR_RETURN(std::string ntype, opt_string(at, n, "normalizer.", "type", ""));
    if (ntype != "BertNormalizer")
      return Status::error(Code::kUnimplemented, path + ": normalizer.type", "BertNormalizer or null", sq(ntype));
    BertNormalizer bn;
    ASPEN_ASSIGN_OR_RETURN(bn.clean_text, opt_bool(at, n, "normalizer.", "clean_text", true));
    ASPEN_ASSIGN_OR_RETURN(bn.handle_chinese_chars, opt_bool(at, n, "normalizer.", "handle_chinese_chars", true));
    ASPEN_ASSIGN_OR_RETURN(bn.lowercase, opt_bool(at, n, "normalizer.", "lowercase", true));
    // strip_accents: null means "same as lowercase", as in Hugging Face.
    ASPEN_ASSIGN_OR_RETURN(bn.strip_accents, opt_bool(at, n, "normalizer.", "strip_accents", bn.lowercase));
    cfg.normalizer = bn;
  }

  // Pre-tokenizer: ByteLevel (GPT-2 regex) for BPE, BertPreTokenizer for WordPiece.
  const std::string want_pre = cfg.model == ModelKind::kBpe ? "ByteLevel" : "BertPreTokenizer";
  std::string pre_type;
  if (root.contains("pre_tokenizer") && root["pre_tokenizer"].is_object()) {
    ASPEN_ASSIGN_OR_RETURN(pre_type, opt_string(at, root["pre_tokenizer"], "pre_tokenizer.", "type", ""));
  }
  if (pre_type != want_pre)
    return Status::error(Code::kUnimplemented, path + ": pre_tokenizer.type", sq(want_pre) + " for model " + sq(type),
                         pre_type.empty() ? "none" : sq(pre_type));
  if (cfg.model == ModelKind::kBpe) {
    const json& p = root["pre_tokenizer"];
    ASPEN_ASSIGN_OR_RETURN(cfg.add_prefix_space, opt_bool(at, p, "pre_tokenizer.", "add_prefix_space", true));
    ASPEN_ASSIGN_OR_RETURN(bool use_regex, opt_bool(at, p, "pre_tokenizer.", "use_regex", true));
    if (!use_regex) return Status::unimplemented(path + ": pre_tokenizer.use_regex", "ByteLevel without the regex");
  }

  // Decoder.
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    const json& d = root["decoder"];
    ASPEN_ASSIGN_OR_RETURN(std::string dtype, opt_string(at, d, "decoder.", "type", ""));
    if (dtype == "ByteLevel") {
      cfg.decoder = DecoderKind::kByteLevel;
    } else if (dtype == "WordPiece") {
      cfg.decoder = DecoderKind::kWordPiece;
      ASPEN_ASSIGN_OR_RETURN(cfg.decoder_prefix, opt_string(at, d, "decoder.", "prefix", "##"));
      ASPEN_ASSIGN_OR_RETURN(cfg.decoder_cleanup, opt_bool(at, d, "decoder.", "cleanup", true));
    } else {
      return Status::error(Code::kUnimplemented, path + ": decoder.type", "ByteLevel, WordPiece or null", sq(dtype));
    }
  }

  ASPEN_RETURN_IF_ERROR(read_added_tokens(at, root, cfg.normalizer.has_value(), &cfg));
  ASPEN_RETURN_IF_ERROR(read_post_processor(at, root, &cfg));
  if (root.contains("padding") && root["padding"].is_object()) {
    ASPEN_ASSIGN_OR_RETURN(cfg.pad_token, opt_string(at, root["padding"], "padding.", "pad_token", "[PAD]"));
  }
  return finish(path, std::move(cfg));
}

Result<std::unique_ptr<Tokenizer>> load_bpe_files(const std::string& vocab_json_path,
                                                  const std::string& merges_txt_path) {
  ASPEN_ASSIGN_OR_RETURN(std::string vtext, read_regular_file(vocab_json_path));
  json vocab;
  ASPEN_RETURN_IF_ERROR(parse_json(vocab_json_path, vtext, &vocab));
  Config cfg;
  const JsonAt at{vocab_json_path};
  ASPEN_RETURN_IF_ERROR(read_vocab(at, vocab, "(root)", &cfg));

  ASPEN_ASSIGN_OR_RETURN(std::string mtext, read_regular_file(merges_txt_path));
  std::istringstream lines(mtext);
  std::string line;
  int32_t rank = 0;
  for (size_t lineno = 1; std::getline(lines, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::string where = merges_txt_path + " line " + std::to_string(lineno);
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || line.find(' ', sp + 1) != std::string::npos || sp + 1 == line.size())
      return corrupt(where, "two tokens separated by one space", sq(line));
    ASPEN_RETURN_IF_ERROR(add_merge(where, line.substr(0, sp), line.substr(sp + 1), rank++, &cfg));
  }
  // GPT-2's setup: ByteLevel without a prefix space; <|endoftext|> is special.
  cfg.model = ModelKind::kBpe;
  cfg.add_prefix_space = false;
  cfg.decoder = DecoderKind::kByteLevel;
  if (auto it = cfg.vocab.find("<|endoftext|>"); it != cfg.vocab.end()) {
    AddedToken a;
    a.content = it->first;
    a.text = uni::decode_utf8_lossy(a.content);
    a.id = it->second;
    a.special = true;
    cfg.added.push_back(std::move(a));
  }
  return finish(vocab_json_path, std::move(cfg));
}

Result<std::unique_ptr<Tokenizer>> load_wordpiece_vocab(const std::string& vocab_txt_path) {
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(vocab_txt_path));
  Config cfg;
  cfg.model = ModelKind::kWordPiece;
  std::istringstream lines(text);
  std::string line;
  for (TokenId id = 0; std::getline(lines, line); ++id) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    cfg.vocab[line] = id;  // a repeated token keeps its last id, as Hugging Face does
  }
  if (!cfg.vocab.count(cfg.unk_token))
    return corrupt(vocab_txt_path, "the unknown token " + sq(cfg.unk_token), "none");
  // Uncased BERT defaults (BertWordPieceTokenizer): every normalizer step on.
  cfg.normalizer = BertNormalizer{};
  cfg.decoder = DecoderKind::kWordPiece;
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    auto it = cfg.vocab.find(s);
    if (it == cfg.vocab.end()) continue;
    AddedToken a;
    a.content = s;
    a.text = uni::decode_utf8_lossy(a.content);
    a.id = it->second;
    a.special = true;
    cfg.added.push_back(std::move(a));
  }
  if (cfg.vocab.count("[CLS]") && cfg.vocab.count("[SEP]")) {
    cfg.post_prefix = {cfg.vocab["[CLS]"]};
    cfg.post_suffix = {cfg.vocab["[SEP]"]};
  }
  return finish(vocab_txt_path, std::move(cfg));
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& model_dir) {
  const std::string dir = model_dir.empty() || model_dir.back() == '/' ? model_dir : model_dir + "/";
  if (file_exists(dir + "tokenizer.json")) return load_tokenizer_json(dir + "tokenizer.json");
  if (file_exists(dir + "vocab.json") && file_exists(dir + "merges.txt"))
    return load_bpe_files(dir + "vocab.json", dir + "merges.txt");
  if (file_exists(dir + "vocab.txt")) return load_wordpiece_vocab(dir + "vocab.txt");
  return Status::error(Code::kNotFound, model_dir, "tokenizer.json, vocab.json + merges.txt, or vocab.txt",
                       "none of them", "a Hugging Face model directory has one of these");
}

}  // namespace aspen::io
