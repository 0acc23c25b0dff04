#include "io/tokenizer_unicode.h"

#include <algorithm>
#include <cstdint>
#include <span>

namespace aspen::io::unicode {
namespace {

struct CodeRange {
  char32_t lo = 0, hi = 0;
};
// Maps lo, lo + stride, ..., hi to c + delta.
struct MapRun {
  char32_t lo = 0, hi = 0;
  int32_t delta = 0;
  uint8_t stride = 1;
};
struct MultiMap {
  char32_t cp = 0;
  uint8_t len = 0;
  char32_t to[4] = {};
};

struct ClassRange {
  char32_t lo = 0, hi = 0;
  uint8_t cls = 0;
};
struct Composition {
  char32_t first = 0, second = 0, composite = 0;
};

#include "io/unicode_tables.inc"

bool in_ranges(std::span<const CodeRange> table, char32_t c) {
  auto it = std::upper_bound(table.begin(), table.end(), c,
                             [](char32_t v, const CodeRange& r) { return v < r.lo; });
  return it != table.begin() && c <= std::prev(it)->hi;
}

// Appends the mapping of c; returns false when c maps to itself.
bool append_mapped(std::span<const MapRun> runs, std::span<const MultiMap> multi, char32_t c,
                   std::u32string& out) {
  auto it = std::upper_bound(runs.begin(), runs.end(), c,
                             [](char32_t v, const MapRun& r) { return v < r.lo; });
  if (it != runs.begin()) {
    const MapRun& r = *std::prev(it);
    if (c <= r.hi && (c - r.lo) % r.stride == 0) {
      out.push_back(char32_t(int64_t(c) + r.delta));
      return true;
    }
  }
  auto m = std::lower_bound(multi.begin(), multi.end(), c,
                            [](const MultiMap& e, char32_t v) { return e.cp < v; });
  if (m != multi.end() && m->cp == c) {
    out.append(m->to, m->len);
    return true;
  }
  return false;
}

constexpr char32_t kReplacement = 0xFFFD;

// Hangul syllables decompose and compose by formula (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = 11172;

}  // namespace

std::u32string decode_utf8_lossy(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (Unicode Table 3-7).
    int len = 0;
    unsigned char lo2 = 0x80, hi2 = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b == 0xE0) len = 3, lo2 = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) len = 3;
    else if (b == 0xED) len = 3, hi2 = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) len = 3;
    else if (b == 0xF0) len = 4, lo2 = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) len = 4;
    else if (b == 0xF4) len = 4, hi2 = 0x8F;
    if (len == 0) {  // a byte that never starts a sequence
      out.push_back(kReplacement);
      ++i;
      continue;
    }
    char32_t c = b & (0xFF >> (len + 1));
    size_t j = i + 1;
    bool ok = true;
    for (int k = 1; k < len; ++k, ++j) {
      const unsigned char lo = k == 1 ? lo2 : 0x80, hi = k == 1 ? hi2 : 0xBF;
      if (j >= n || s[j] < lo || s[j] > hi) {
        ok = false;
        break;
      }
      c = (c << 6) | (s[j] & 0x3F);
    }
    // A truncated or broken sequence is one U+FFFD for its valid prefix.
    out.push_back(ok ? c : kReplacement);
    i = j;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

bool is_regex_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return in_ranges(kRegexLetter, c);
}
bool is_regex_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(kRegexNumber, c);
}
bool is_regex_space(char32_t c) { return in_ranges(kRegexSpace, c); }
bool is_bert_control(char32_t c) { return in_ranges(kBertControl, c); }
bool is_bert_space(char32_t c) { return in_ranges(kBertSpace, c); }
bool is_bert_punct(char32_t c) { return in_ranges(kBertPunct, c); }
bool is_bert_chinese(char32_t c) { return in_ranges(kBertChinese, c); }

void append_strip_accents(char32_t c, std::u32string& out) {
  // Hangul syllables decompose algorithmically (Unicode 3.12); jamo are not marks.
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (in_ranges(kStripRemoved, c)) return;
  if (!append_mapped(kStripRuns, kStripMulti, c, out)) out.push_back(c);
}

namespace {

uint8_t combining_class(char32_t c) {
  auto it = std::upper_bound(std::begin(kCombiningClass), std::end(kCombiningClass), c,
                             [](char32_t v, const ClassRange& r) { return v < r.lo; });
  if (it == std::begin(kCombiningClass)) return 0;
  --it;
  return c <= it->hi ? it->cls : 0;
}

// The primary composite of a + b, or 0 (Hangul syllables by their formula).
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kCompose), std::end(kCompose), std::pair{a, b},
                             [](const Composition& e, std::pair<char32_t, char32_t> v) {
                               return e.first < v.first || (e.first == v.first && e.second < v.second);
                             });
  return it != std::end(kCompose) && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

// NFC (Unicode Annex #15): full canonical decomposition, marks reordered by
// combining class (stable), then canonical composition left to right: a
// character joins the last starter when nothing between them blocks it (a
// mark of the same or a higher class, or another starter).
std::u32string nfc(std::u32string_view text) {
  std::u32string d;
  d.reserve(text.size());
  for (char32_t c : text) {
    if (c >= kSBase && c < kSBase + kSCount) {
      const char32_t s = c - kSBase;
      d.push_back(kLBase + s / (kVCount * kTCount));
      d.push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
      if (s % kTCount) d.push_back(kTBase + s % kTCount);
    } else if (!append_mapped(kNfdRuns, kNfdMulti, c, d)) {
      d.push_back(c);
    }
  }
  for (size_t i = 0; i < d.size();) {  // each run of marks, sorted by class
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < d.size() && combining_class(d[e]) != 0) ++e;
    std::stable_sort(d.begin() + std::ptrdiff_t(i), d.begin() + std::ptrdiff_t(e),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = e;
  }
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;  // index in out of the last starter
  int last_class = -1;                    // class of the last character kept after it (-1: none)
  for (char32_t c : d) {
    const int cls = combining_class(c);
    if (starter != std::u32string::npos && (last_class == -1 || (last_class != 0 && last_class < cls))) {
      if (char32_t comp = compose(out[starter], c)) {
        out[starter] = comp;
        continue;
      }
    }
    if (cls == 0) {
      starter = out.size();
      last_class = -1;
    } else {
      last_class = cls;
    }
    out.push_back(c);
  }
  return out;
}

void append_lowercase(char32_t c, std::u32string& out) {
  if (c < 0x80) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (!append_mapped(kLowerRuns, kLowerMulti, c, out)) out.push_back(c);
}

}  // namespace aspen::io::unicode
