#include "io/tokenizer_pipeline.h"

#include <algorithm>

#include "io/tokenizer_unicode.h"

namespace aspen::io::tok {
namespace {

namespace uni = unicode;

// ---------------------------------------------------------------------------
// Normalizers.

std::u32string bert_normalize(std::u32string_view in, const BertNormalizer& n) {
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

// Every occurrence of `from` (left to right, not overlapping) becomes `to`.
template <class Str>
void replace_all(Str& s, std::basic_string_view<typename Str::value_type> from,
                 std::basic_string_view<typename Str::value_type> to) {
  if (from.empty()) return;
  Str out;
  size_t last = 0;
  for (size_t p = s.find(from); p != Str::npos; p = s.find(from, last)) {
    out.append(s, last, p - last);
    out.append(to);
    last = p + from.size();
  }
  out.append(s, last, Str::npos);
  s.swap(out);
}

// ---------------------------------------------------------------------------
// Split regexes, matched by hand. Each returns the end of the match that
// Oniguruma (HF's regex engine) finds at i: alternatives in order, each
// greedy, with its backtracking spelled out.

enum Class { kLetter, kNumber, kSpace, kOther };

Class class_of(char32_t c) {
  if (uni::is_regex_letter(c)) return kLetter;
  if (uni::is_regex_number(c)) return kNumber;
  if (uni::is_regex_space(c)) return kSpace;
  return kOther;
}

// \s+(?!\S)|\s+ at i (t[i] is a space): a run of spaces, less its last one
// when a non-space follows and the run is longer than one.
size_t space_run_end(std::u32string_view t, size_t i) {
  size_t end = i + 1;
  while (end < t.size() && class_of(t[end]) == kSpace) ++end;
  if (end == t.size() || end - i == 1) return end;
  return end - 1;
}

// 's|'t|'re|'ve|'m|'ll|'d at i; `fold` also takes upper case (and U+017F, which
// folds to s) as (?i:...) does. Returns i when none matches.
size_t contraction_end(std::u32string_view t, size_t i, bool fold) {
  const size_t n = t.size();
  if (t[i] != U'\'' || i + 1 >= n) return i;
  auto is = [&](char32_t c, char32_t lower) {
    return c == lower || (fold && (c == lower - 32 || (lower == U's' && c == 0x017F)));
  };
  const char32_t a = t[i + 1];
  if (is(a, U's') || is(a, U't') || is(a, U'm') || is(a, U'd')) return i + 2;
  if (i + 2 < n) {
    const char32_t b = t[i + 2];
    if ((is(a, U'r') && is(b, U'e')) || (is(a, U'v') && is(b, U'e')) || (is(a, U'l') && is(b, U'l'))) return i + 3;
  }
  return i;
}

//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_split_end(std::u32string_view t, size_t i) {
  const size_t n = t.size();
  if (size_t e = contraction_end(t, i, false); e != i) return e;
  size_t start = i;
  if (t[i] == U' ' && i + 1 < n && class_of(t[i + 1]) != kSpace) start = i + 1;
  const Class c = class_of(t[start]);
  if (c != kSpace) {
    size_t end = start + 1;
    while (end < n && class_of(t[end]) == c) ++end;
    return end;
  }
  return space_run_end(t, i);
}

bool is_newline(char32_t c) { return c == U'\r' || c == U'\n'; }

// Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Every character starts some alternative, so the matches tile the text.
size_t llama3_split_end(std::u32string_view t, size_t i, size_t max_digits) {
  const size_t n = t.size();
  if (size_t e = contraction_end(t, i, true); e != i) return e;
  const Class c = class_of(t[i]);
  auto letters_from = [&](size_t k) {
    while (k < n && class_of(t[k]) == kLetter) ++k;
    return k;
  };
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c == kLetter) return letters_from(i + 1);
  if (!is_newline(t[i]) && c != kNumber && i + 1 < n && class_of(t[i + 1]) == kLetter) return letters_from(i + 2);
  // \p{N}{1,max_digits}
  if (c == kNumber) {
    size_t end = i + 1;
    while (end < n && end - i < max_digits && class_of(t[end]) == kNumber) ++end;
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = i;
  if (t[i] == U' ' && i + 1 < n && class_of(t[i + 1]) == kOther) start = i + 1;
  if (class_of(t[start]) == kOther) {
    size_t end = start + 1;
    while (end < n && class_of(t[end]) == kOther) ++end;
    while (end < n && is_newline(t[end])) ++end;
    return end;
  }
  // \s*[\r\n]+: the space run up to its last newline
  size_t run = i;
  while (run < n && class_of(t[run]) == kSpace) ++run;
  for (size_t k = run; k > i; --k)
    if (is_newline(t[k - 1])) return k;
  return space_run_end(t, i);
}

size_t split_end(SplitRegex regex, std::u32string_view t, size_t i) {
  switch (regex) {
    case SplitRegex::kGpt2: return gpt2_split_end(t, i);
    case SplitRegex::kLlama3: return llama3_split_end(t, i, 3);
    case SplitRegex::kQwen2: return llama3_split_end(t, i, 1);
  }
  return t.size();
}

// Splits each piece where the regex matches (behavior Isolated: matches and
// the text between them are pieces; these regexes leave nothing between).
void split_pieces(std::vector<Piece>& pieces, SplitRegex regex) {
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    const std::u32string_view t = p.text;
    for (size_t i = 0; i < t.size();) {
      const size_t end = split_end(regex, t, i);
      out.push_back(Piece{std::u32string(t.substr(i, end - i)), p.at_start && i == 0});
      i = end;
    }
  }
  pieces.swap(out);
}

void byte_level(std::vector<Piece>& pieces, const PreTokenizerStep& s) {
  for (Piece& p : pieces)
    if (s.add_prefix_space && (p.text.empty() || p.text[0] != U' ')) p.text.insert(p.text.begin(), U' ');
  if (s.use_regex) split_pieces(pieces, SplitRegex::kGpt2);
  for (Piece& p : pieces) {  // bytes of the UTF-8 -> printable code points
    std::u32string mapped;
    for (unsigned char b : uni::to_utf8(p.text)) mapped.push_back(byte_to_char()[b]);
    p.text.swap(mapped);
  }
}

void metaspace(std::vector<Piece>& pieces, const PreTokenizerStep& s) {
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    std::u32string t = p.text;
    std::replace(t.begin(), t.end(), U' ', s.replacement);
    const bool prepend = s.prepend == PrependScheme::kAlways || (s.prepend == PrependScheme::kFirst && p.at_start);
    if (prepend && !t.empty() && t[0] != s.replacement) t.insert(t.begin(), s.replacement);
    if (!s.split) {
      out.push_back(Piece{std::move(t), p.at_start});
      continue;
    }
    // Each replacement character begins a piece (behavior MergedWithNext).
    size_t begin = 0;
    for (size_t k = 1; k <= t.size(); ++k)
      if (k == t.size() || t[k] == s.replacement) {
        out.push_back(Piece{t.substr(begin, k - begin), p.at_start && begin == 0});
        begin = k;
      }
  }
  pieces.swap(out);
}

// Whitespace ends a word; punctuation is a word of its own.
void bert_split(std::vector<Piece>& pieces) {
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    const std::u32string_view t = p.text;
    size_t start = 0;
    for (size_t i = 0; i <= t.size(); ++i) {
      const bool at_end = i == t.size();
      const bool space = !at_end && uni::is_bert_space(t[i]);
      const bool punct = !at_end && !space && uni::is_bert_punct(t[i]);
      if (!at_end && !space && !punct) continue;
      if (i > start) out.push_back(Piece{std::u32string(t.substr(start, i - start)), p.at_start && start == 0});
      if (punct) out.push_back(Piece{std::u32string(t.substr(i, 1)), p.at_start && i == 0});
      start = i + 1;
    }
  }
  pieces.swap(out);
}

// ---------------------------------------------------------------------------
// Decoders.

void wordpiece_cleanup(std::string& s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},   {" ,", ","},        {" ' ", "'"},  {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules)
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

// "<0xAB>" (hex digits of either case) -> 0xAB.
std::optional<uint8_t> fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return uint8_t(hi * 16 + lo);
}

bool valid_utf8(const std::string& bytes) {
  const std::u32string chars = uni::decode_utf8_lossy(bytes);
  return uni::to_utf8(chars) == bytes;  // lossy decoding changed nothing
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string pending;  // bytes of consecutive <0xXX> tokens
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (valid_utf8(pending)) {
      out.push_back(pending);
    } else {
      for (size_t k = 0; k < count; ++k) out.push_back("\xEF\xBF\xBD");  // one U+FFFD per byte token
    }
    pending.clear();
    count = 0;
  };
  for (std::string& t : tokens) {
    if (auto b = fallback_byte(t)) {
      pending.push_back(char(*b));
      ++count;
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  return out;
}

std::vector<std::string> byte_level_decode(const std::vector<std::string>& tokens) {
  // Each token's characters map back to bytes; a token with a character
  // outside the byte alphabet contributes its UTF-8 as is. The bytes are then
  // read as UTF-8 lossily (Rust String::from_utf8_lossy).
  static const std::unordered_map<char32_t, uint8_t> char_to_byte = [] {
    std::unordered_map<char32_t, uint8_t> m;
    for (int b = 0; b < 256; ++b) m[byte_to_char()[size_t(b)]] = uint8_t(b);
    return m;
  }();
  std::string bytes;
  for (const std::string& tok : tokens) {
    std::string mapped;
    bool all = true;
    for (char32_t c : uni::decode_utf8_lossy(tok)) {
      auto it = char_to_byte.find(c);
      if (it == char_to_byte.end()) {
        all = false;
        break;
      }
      mapped.push_back(char(it->second));
    }
    bytes += all ? mapped : tok;
  }
  return {uni::to_utf8(uni::decode_utf8_lossy(bytes))};
}

std::vector<std::string> apply(const DecoderStep& d, std::vector<std::string> tokens) {
  using K = DecoderStep::Kind;
  switch (d.kind) {
    case K::kByteLevel: return byte_level_decode(tokens);
    case K::kByteFallback: return byte_fallback(std::move(tokens));
    case K::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      return {all};
    }
    case K::kWordPiece:
      // A continuation loses its prefix, any other token after the first gets
      // a leading space; cleanup then runs on that one token.
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::string& tok = tokens[k];
        if (k != 0) {
          if (tok.rfind(d.prefix, 0) == 0) tok.erase(0, d.prefix.size());
          else tok.insert(0, " ");
        }
        if (d.cleanup) wordpiece_cleanup(tok);
      }
      return tokens;
    case K::kReplace:
      for (std::string& t : tokens) replace_all<std::string>(t, d.from, d.to);
      return tokens;
    case K::kMetaspace:
      // The replacement becomes a space, except in the first token, where it
      // is dropped (unless the scheme never prepends).
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::u32string out;
        for (char32_t c : uni::decode_utf8_lossy(tokens[k])) {
          if (c != d.replacement) out.push_back(c);
          else if (k != 0 || d.prepend == PrependScheme::kNever) out.push_back(U' ');
        }
        tokens[k] = uni::to_utf8(out);
      }
      return tokens;
    case K::kStrip:
      for (std::string& t : tokens) {
        std::u32string c = uni::decode_utf8_lossy(t);
        size_t a = 0, e = c.size();
        while (a < e && a < d.start && c[a] == d.strip) ++a;
        while (e > a && c.size() - e < d.stop && c[e - 1] == d.strip) --e;
        t = uni::to_utf8(std::u32string_view(c).substr(a, e - a));
      }
      return tokens;
  }
  return tokens;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

std::u32string normalize(std::u32string_view text, const std::vector<NormalizerStep>& steps) {
  std::u32string t(text);
  using K = NormalizerStep::Kind;
  for (const NormalizerStep& s : steps) {
    switch (s.kind) {
      case K::kBert: t = bert_normalize(t, s.bert); break;
      case K::kPrepend:
        if (!t.empty()) t.insert(0, s.to);
        break;
      case K::kReplace: replace_all<std::u32string>(t, s.from, s.to); break;
      case K::kNfc: t = uni::nfc(t); break;
      case K::kLowercase: {
        std::u32string b;
        b.reserve(t.size());
        for (char32_t c : t) uni::append_lowercase(c, b);
        t.swap(b);
        break;
      }
    }
  }
  return t;
}

std::vector<Piece> pre_tokenize(std::u32string_view text, bool at_start, const std::vector<PreTokenizerStep>& steps) {
  std::vector<Piece> pieces;
  if (!text.empty()) pieces.push_back(Piece{std::u32string(text), at_start});
  using K = PreTokenizerStep::Kind;
  for (const PreTokenizerStep& s : steps) {
    switch (s.kind) {
      case K::kByteLevel: byte_level(pieces, s); break;
      case K::kSplit: split_pieces(pieces, s.regex); break;
      case K::kMetaspace: metaspace(pieces, s); break;
      case K::kBert: bert_split(pieces); break;
    }
  }
  return pieces;
}

std::string decode_tokens(std::vector<std::string> tokens, const std::vector<DecoderStep>& steps) {
  std::string out;
  if (steps.empty()) {  // no decoder: the tokens joined by spaces
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  for (const DecoderStep& d : steps) tokens = apply(d, std::move(tokens));
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace aspen::io::tok
