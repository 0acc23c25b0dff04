#include "io/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "io/tokenizer_pipeline.h"
#include "io/tokenizer_unicode.h"

namespace aspen::io {
namespace {

namespace uni = unicode;
using namespace tok;

// ---------------------------------------------------------------------------
// The tokenizer: added-token split, normalizers, pre-tokenizers, model, post-processor.

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(Config cfg) : cfg_(std::move(cfg)) {
    TokenId max_id = -1;
    for (const auto& [tok, id] : cfg_.vocab) max_id = std::max(max_id, id);
    for (const auto& a : cfg_.added) max_id = std::max(max_id, a.id);
    id_to_token_.resize(size_t(max_id + 1));
    present_.resize(size_t(max_id + 1), false);
    for (const auto& [tok, id] : cfg_.vocab) {
      id_to_token_[size_t(id)] = tok, present_[size_t(id)] = true;
      const std::u32string chars = uni::decode_utf8_lossy(tok);
      if (chars.size() == 1 && uni::to_utf8(chars) == tok) char_id_[chars[0]] = id;
    }
    for (const auto& a : cfg_.added) {
      has_normalized_added_ |= a.normalized;
      // A normalized token's string is its normalized content (HF's id_to_token and decode: "▁fooBar");
      // token_to_id takes the content as written.
      id_to_token_[size_t(a.id)] = a.normalized ? uni::to_utf8(a.norm_text) : a.content;
      present_[size_t(a.id)] = true;
      if (a.special) special_set_.insert(a.id);
      added_by_content_[a.content] = a.id;
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = cfg_.vocab.find(name);
      fallback_id_[size_t(b)] = it == cfg_.vocab.end() ? -1 : it->second;
    }
    if (cfg_.bpe_unk) unk_id_ = cfg_.vocab.at(*cfg_.bpe_unk);  // checked by the loader
    auto find = [&](std::initializer_list<const char*> names) -> std::optional<TokenId> {
      for (const char* n : names)
        if (auto id = token_to_id(n)) return id;
      return std::nullopt;
    };
    special_.bos = find({"<|endoftext|>", "<s>", "<|begin_of_text|>"});
    special_.eos = find({"<|endoftext|>", "</s>", "<|end_of_text|>"});
    if (cfg_.model == ModelKind::kWordPiece) special_.unk = find({cfg_.unk_token.c_str()});
    if (cfg_.bpe_unk) special_.unk = unk_id_;
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
    // The raw text, split on the tokens that are not normalized; each stretch between them is normalized.
    split_on_added(t, /*normalized=*/false, ids, [&](std::u32string_view seg, bool at_start) {
      encode_segment(seg, at_start, ids);
    });
    if (add_special_tokens) ids.insert(ids.end(), cfg_.post_suffix.begin(), cfg_.post_suffix.end());
    return ids;
  }

  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    for (TokenId id : ids) {
      if (id < 0 || size_t(id) >= present_.size() || !present_[size_t(id)]) continue;
      if (skip_special_tokens && special_set_.count(id)) continue;
      tokens.push_back(id_to_token_[size_t(id)]);
    }
    return decode_tokens(std::move(tokens), cfg_.decoders);
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
  // Splits t on the added tokens of one kind (normalized or not), leftmost
  // and longest first, with their lstrip / rstrip: each token's id goes to
  // ids, each stretch between them to `stretch` (with whether it begins t).
  template <class F>
  void split_on_added(std::u32string_view t, bool normalized, std::vector<TokenId>& ids, F stretch) const {
    size_t seg = 0, i = 0;
    while (i < t.size()) {
      const AddedToken* best = nullptr;
      for (const AddedToken& a : cfg_.added) {
        if (a.normalized != normalized) continue;
        const std::u32string& text = normalized ? a.norm_text : a.text;
        if (text.empty() || (best && text.size() <= (normalized ? best->norm_text : best->text).size())) continue;
        if (t.compare(i, text.size(), text) == 0) best = &a;
      }
      if (!best) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + (normalized ? best->norm_text : best->text).size();
      if (best->lstrip)
        while (begin > seg && uni::is_bert_space(t[begin - 1])) --begin;
      if (best->rstrip)
        while (end < t.size() && uni::is_bert_space(t[end])) ++end;
      if (begin > seg) stretch(t.substr(seg, begin - seg), seg == 0);
      ids.push_back(best->id);
      seg = i = end;
    }
    if (seg < t.size()) stretch(t.substr(seg), seg == 0);
  }

  // Text between added tokens (`at_start`: it begins the input): normalize,
  // split on the normalized added tokens, pre-tokenize, run the model on each word.
  void encode_segment(std::u32string_view seg, bool at_start, std::vector<TokenId>& ids) const {
    if (seg.empty()) return;
    std::u32string norm;
    if (!cfg_.normalizers.empty()) {
      norm = normalize(seg, cfg_.normalizers);
      seg = norm;
    }
    const auto words = [&](std::u32string_view part, bool first) {
      for (const Piece& p : pre_tokenize(part, first, cfg_.pre_tokenizers)) {
        if (cfg_.model == ModelKind::kBpe) bpe_word(p.text, ids);
        else wordpiece_word(p.text, ids);
      }
    };
    if (!has_normalized_added_) return words(seg, at_start);
    split_on_added(seg, /*normalized=*/true, ids,
                   [&](std::u32string_view part, bool first) { words(part, at_start && first); });
  }

  template <class F>
  void cached(const std::string& key, std::vector<TokenId>& ids, F compute) const {
    if (key.size() > kMaxCachedWord) {  // a long word (a whole text without pre-tokenizer) is not kept
      const std::vector<TokenId> word = compute();
      ids.insert(ids.end(), word.begin(), word.end());
      return;
    }
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

  // The word's first symbols: a character's token, else (byte_fallback) its
  // bytes' <0xXX> tokens, else unk (consecutive ones fused with fuse_unk),
  // else nothing (HF drops a character without a token when there is no unk).
  std::vector<TokenId> initial_symbols(std::u32string_view word) const {
    std::vector<TokenId> w;
    bool pending_unk = false;
    auto flush_unk = [&] {
      if (pending_unk) w.push_back(unk_id_);
      pending_unk = false;
    };
    for (char32_t c : word) {
      if (auto it = char_id_.find(c); it != char_id_.end()) {
        flush_unk();
        w.push_back(it->second);
        continue;
      }
      if (cfg_.byte_fallback) {
        std::string bytes;
        uni::append_utf8(bytes, c);
        const bool all = std::all_of(bytes.begin(), bytes.end(),
                                     [&](char b) { return fallback_id_[uint8_t(b)] >= 0; });
        if (all) {
          flush_unk();
          for (char b : bytes) w.push_back(fallback_id_[uint8_t(b)]);
          continue;
        }
      }
      if (unk_id_ < 0) continue;
      if (pending_unk && !cfg_.fuse_unk) w.push_back(unk_id_);
      pending_unk = true;
    }
    flush_unk();
    return w;
  }

  // Merges the lowest-ranked adjacent pair (leftmost on ties) until none is
  // left: a heap of candidate merges over a linked list of symbols, stale
  // entries skipped, as HF's Word::merge_all (O(n log n): a Llama 2 text
  // without pre-tokenizer is one word).
  std::vector<TokenId> merge(std::vector<TokenId> ids) const {
    const int n = int(ids.size());
    if (n < 2) return ids;
    std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
    std::vector<bool> alive(size_t(n), true);
    for (int k = 0; k < n; ++k) prev[size_t(k)] = k - 1, next[size_t(k)] = k + 1 < n ? k + 1 : -1;
    struct Candidate {
      int32_t rank;
      int pos;
      TokenId merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](int left) {
      const int right = next[size_t(left)];
      if (right < 0) return;
      auto it = cfg_.merges.find(pair_key(ids[size_t(left)], ids[size_t(right)]));
      if (it != cfg_.merges.end()) heap.push(Candidate{it->second.first, left, it->second.second});
    };
    for (int k = 0; k + 1 < n; ++k) push(k);
    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      const int left = top.pos, right = alive[size_t(left)] ? next[size_t(left)] : -1;
      if (right < 0) continue;
      auto it = cfg_.merges.find(pair_key(ids[size_t(left)], ids[size_t(right)]));
      if (it == cfg_.merges.end() || it->second.second != top.merged) continue;  // stale
      ids[size_t(left)] = top.merged;
      alive[size_t(right)] = false;
      next[size_t(left)] = next[size_t(right)];
      if (next[size_t(left)] >= 0) prev[size_t(next[size_t(left)])] = left;
      if (prev[size_t(left)] >= 0) push(prev[size_t(left)]);
      push(left);
    }
    std::vector<TokenId> out;
    for (int k = 0; k >= 0; k = next[size_t(k)]) out.push_back(ids[size_t(k)]);
    return out;
  }

  void bpe_word(const std::u32string& word, std::vector<TokenId>& ids) const {
    const std::string key = uni::to_utf8(word);
    cached(key, ids, [&] {
      if (cfg_.ignore_merges)
        if (auto it = cfg_.vocab.find(key); it != cfg_.vocab.end()) return std::vector<TokenId>{it->second};
      return merge(initial_symbols(word));
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
  static constexpr size_t kMaxCachedWord = 256;  // bytes

  Config cfg_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> present_;
  std::unordered_set<TokenId> special_set_;
  std::unordered_map<std::string, TokenId> added_by_content_;
  std::unordered_map<char32_t, TokenId> char_id_;  // tokens of one character
  std::array<TokenId, 256> fallback_id_{};         // <0xXX> tokens, -1 where absent
  TokenId unk_id_ = -1;
  bool has_normalized_added_ = false;
  SpecialTokenIds special_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

}  // namespace

namespace tok {
std::unique_ptr<Tokenizer> make_tokenizer(Config cfg) { return std::make_unique<HfTokenizer>(std::move(cfg)); }
}  // namespace tok

}  // namespace aspen::io
