// Reading tokenizer.json (and the legacy vocabulary files) into a tok::Config.
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "core/file.h"
#include "io/json_brief.h"
#include "io/tokenizer.h"
#include "io/tokenizer_pipeline.h"
#include "io/tokenizer_unicode.h"

namespace aspen::io {

namespace tok {

std::string sq(std::string_view s) { return "'" + std::string(s) + "'"; }

Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) {
  return Status::error(Code::kCorrupt, subject, expected, found);
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
  if (cfg.bpe_unk && !cfg.vocab.count(*cfg.bpe_unk))
    return corrupt(path + ": model.unk_token", "a token of the vocabulary", sq(*cfg.bpe_unk));
  return make_tokenizer(std::move(cfg));
}

void gpt2_byte_level(Config* cfg) {
  cfg->model = ModelKind::kBpe;
  PreTokenizerStep byte_level;
  byte_level.add_prefix_space = false;
  cfg->pre_tokenizers = {byte_level};
  cfg->decoders = {DecoderStep{}};
}

}  // namespace tok

namespace {

using json = nlohmann::json;
namespace uni = unicode;
using namespace tok;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

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
    a.normalized = normalized && has_normalizer;  // without a normalizer both kinds match the raw text
    if (a.normalized) a.norm_text = normalize(a.text, cfg->normalizers);
    cfg->added.push_back(std::move(a));
  }
  return Status::ok();
}

constexpr int kMaxNesting = 8;  // Sequence inside Sequence, as deep as any real file goes and then some

Status unsupported(const JsonAt& at, const std::string& key, const std::string& supported, const std::string& type) {
  return Status::error(Code::kUnimplemented, at.path + ": " + key + ".type", supported, sq(type));
}

Result<std::string> component_type(const JsonAt& at, const json& c, const std::string& key, int depth) {
  if (depth > kMaxNesting) return corrupt(at.path + ": " + key, "at most 8 nested Sequences", "more");
  if (!c.is_object() || !c.contains("type") || !c["type"].is_string()) return at.missing(key + ".type", "a string");
  return c["type"].get<std::string>();
}

// A string field holding one character (Metaspace's replacement, Strip's content).
Result<char32_t> one_char(const JsonAt& at, const json& c, const std::string& key, const char* field, char32_t dflt) {
  std::string d;
  uni::append_utf8(d, dflt);
  ASPEN_ASSIGN_OR_RETURN(std::string v, opt_string(at, c, key + ".", field, d));
  const std::u32string chars = uni::decode_utf8_lossy(v);
  if (chars.size() != 1) return corrupt(at.path + ": " + key + "." + field, "one character", sq(v));
  return chars[0];
}

// Replace's pattern: {"String": s} (a {"Regex": r} is not supported).
Result<std::string> string_pattern(const JsonAt& at, const json& c, const std::string& key) {
  if (!c.contains("pattern") || !c["pattern"].is_object()) return at.missing(key + ".pattern", "{\"String\": ...}");
  const json& p = c["pattern"];
  if (p.contains("String") && p["String"].is_string()) return p["String"].get<std::string>();
  if (p.contains("Regex")) return Status::unimplemented(at.path + ": " + key + ".pattern", "Replace with a regex pattern");
  return at.wrong(key + ".pattern", "{\"String\": ...}", p);
}

Result<PrependScheme> prepend_scheme(const JsonAt& at, const json& c, const std::string& key) {
  if (c.contains("prepend_scheme") && !c["prepend_scheme"].is_null()) {
    ASPEN_ASSIGN_OR_RETURN(std::string v, opt_string(at, c, key + ".", "prepend_scheme", "always"));
    if (v == "always") return PrependScheme::kAlways;
    if (v == "first") return PrependScheme::kFirst;
    if (v == "never") return PrependScheme::kNever;
    return corrupt(at.path + ": " + key + ".prepend_scheme", "always, first or never", sq(v));
  }
  ASPEN_ASSIGN_OR_RETURN(bool add, opt_bool(at, c, key + ".", "add_prefix_space", true));  // before prepend_scheme
  return add ? PrependScheme::kAlways : PrependScheme::kNever;
}

Status read_normalizer(const JsonAt& at, const json& n, const std::string& key, int depth,
                       std::vector<NormalizerStep>* steps) {
  ASPEN_ASSIGN_OR_RETURN(std::string type, component_type(at, n, key, depth));
  NormalizerStep s;
  using K = NormalizerStep::Kind;
  if (type == "Sequence") {
    if (!n.contains("normalizers") || !n["normalizers"].is_array()) return at.missing(key + ".normalizers", "an array");
    for (size_t i = 0; i < n["normalizers"].size(); ++i)
      ASPEN_RETURN_IF_ERROR(
          read_normalizer(at, n["normalizers"][i], key + ".normalizers[" + std::to_string(i) + "]", depth + 1, steps));
    return Status::ok();
  }
  if (type == "BertNormalizer") {
    s.kind = K::kBert;
    const std::string pre = key + ".";
    ASPEN_ASSIGN_OR_RETURN(s.bert.clean_text, opt_bool(at, n, pre, "clean_text", true));
    ASPEN_ASSIGN_OR_RETURN(s.bert.handle_chinese_chars, opt_bool(at, n, pre, "handle_chinese_chars", true));
    ASPEN_ASSIGN_OR_RETURN(s.bert.lowercase, opt_bool(at, n, pre, "lowercase", true));
    // strip_accents: null means "same as lowercase", as in Hugging Face.
    ASPEN_ASSIGN_OR_RETURN(s.bert.strip_accents, opt_bool(at, n, pre, "strip_accents", s.bert.lowercase));
  } else if (type == "Prepend") {
    s.kind = K::kPrepend;
    if (!n.contains("prepend") || !n["prepend"].is_string()) return at.missing(key + ".prepend", "a string");
    s.to = uni::decode_utf8_lossy(n["prepend"].get<std::string>());
  } else if (type == "Replace") {
    s.kind = K::kReplace;
    ASPEN_ASSIGN_OR_RETURN(std::string from, string_pattern(at, n, key));
    if (!n.contains("content") || !n["content"].is_string()) return at.missing(key + ".content", "a string");
    s.from = uni::decode_utf8_lossy(from);
    s.to = uni::decode_utf8_lossy(n["content"].get<std::string>());
  } else if (type == "NFC") {
    s.kind = K::kNfc;
  } else if (type == "Lowercase") {
    s.kind = K::kLowercase;
  } else {
    return unsupported(at, key, "BertNormalizer, NFC, Lowercase, Prepend, Replace, Sequence or null", type);
  }
  steps->push_back(s);
  return Status::ok();
}

// The split regexes aspen matches by hand (tokenizer_pipeline.cc), by their exact text.
constexpr std::pair<const char*, SplitRegex> kSplitRegexes[] = {
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", SplitRegex::kGpt2},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitRegex::kLlama3},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitRegex::kQwen2},
};

Status read_pre_tokenizer(const JsonAt& at, const json& p, const std::string& key, int depth,
                          std::vector<PreTokenizerStep>* steps) {
  ASPEN_ASSIGN_OR_RETURN(std::string type, component_type(at, p, key, depth));
  PreTokenizerStep s;
  using K = PreTokenizerStep::Kind;
  const std::string pre = key + ".";
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      return at.missing(key + ".pretokenizers", "an array");
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
      ASPEN_RETURN_IF_ERROR(read_pre_tokenizer(at, p["pretokenizers"][i],
                                               key + ".pretokenizers[" + std::to_string(i) + "]", depth + 1, steps));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    s.kind = K::kByteLevel;
    ASPEN_ASSIGN_OR_RETURN(s.add_prefix_space, opt_bool(at, p, pre, "add_prefix_space", true));
    ASPEN_ASSIGN_OR_RETURN(s.use_regex, opt_bool(at, p, pre, "use_regex", true));
  } else if (type == "Split") {
    s.kind = K::kSplit;
    if (!p.contains("pattern") || !p["pattern"].is_object()) return at.missing(key + ".pattern", "{\"Regex\": ...}");
    const json& pat = p["pattern"];
    if (!pat.contains("Regex") || !pat["Regex"].is_string())
      return Status::unimplemented(at.path + ": " + key + ".pattern", "Split on a string (only the known regexes)");
    const std::string re = pat["Regex"].get<std::string>();
    bool known = false;
    for (const auto& [text, regex] : kSplitRegexes)
      if (re == text) s.regex = regex, known = true;
    if (!known)
      return Status::error(Code::kUnimplemented, at.path + ": " + key + ".pattern.Regex",
                           "the GPT-2, Llama 3 or Qwen2 split regex", sq(re));
    ASPEN_ASSIGN_OR_RETURN(std::string behavior, opt_string(at, p, pre, "behavior", "Isolated"));
    ASPEN_ASSIGN_OR_RETURN(bool invert, opt_bool(at, p, pre, "invert", false));
    if (behavior != "Isolated" || invert)
      return Status::error(Code::kUnimplemented, at.path + ": " + key + ".behavior", "Isolated, not inverted",
                           sq(behavior) + (invert ? ", inverted" : ""));
  } else if (type == "Metaspace") {
    s.kind = K::kMetaspace;
    ASPEN_ASSIGN_OR_RETURN(s.replacement, one_char(at, p, key, "replacement", U'\u2581'));
    ASPEN_ASSIGN_OR_RETURN(s.prepend, prepend_scheme(at, p, key));
    ASPEN_ASSIGN_OR_RETURN(s.split, opt_bool(at, p, pre, "split", true));
  } else if (type == "BertPreTokenizer") {
    s.kind = K::kBert;
  } else {
    return unsupported(at, key, "ByteLevel, Split, Metaspace, BertPreTokenizer, Sequence or null", type);
  }
  steps->push_back(s);
  return Status::ok();
}

Status read_decoder(const JsonAt& at, const json& d, const std::string& key, int depth,
                    std::vector<DecoderStep>* steps) {
  ASPEN_ASSIGN_OR_RETURN(std::string type, component_type(at, d, key, depth));
  DecoderStep s;
  using K = DecoderStep::Kind;
  const std::string pre = key + ".";
  if (type == "Sequence") {
    if (!d.contains("decoders") || !d["decoders"].is_array()) return at.missing(key + ".decoders", "an array");
    for (size_t i = 0; i < d["decoders"].size(); ++i)
      ASPEN_RETURN_IF_ERROR(
          read_decoder(at, d["decoders"][i], key + ".decoders[" + std::to_string(i) + "]", depth + 1, steps));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    s.kind = K::kByteLevel;
  } else if (type == "WordPiece") {
    s.kind = K::kWordPiece;
    ASPEN_ASSIGN_OR_RETURN(s.prefix, opt_string(at, d, pre, "prefix", "##"));
    ASPEN_ASSIGN_OR_RETURN(s.cleanup, opt_bool(at, d, pre, "cleanup", true));
  } else if (type == "Metaspace") {
    s.kind = K::kMetaspace;
    ASPEN_ASSIGN_OR_RETURN(s.replacement, one_char(at, d, key, "replacement", U'\u2581'));
    ASPEN_ASSIGN_OR_RETURN(s.prepend, prepend_scheme(at, d, key));
  } else if (type == "Replace") {
    s.kind = K::kReplace;
    ASPEN_ASSIGN_OR_RETURN(s.from, string_pattern(at, d, key));
    if (!d.contains("content") || !d["content"].is_string()) return at.missing(key + ".content", "a string");
    s.to = d["content"].get<std::string>();
  } else if (type == "ByteFallback") {
    s.kind = K::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = K::kFuse;
  } else if (type == "Strip") {
    s.kind = K::kStrip;
    ASPEN_ASSIGN_OR_RETURN(s.strip, one_char(at, d, key, "content", U' '));
    for (const char* f : {"start", "stop"}) {
      if (!d.contains(f)) continue;
      if (!d[f].is_number_unsigned()) return at.wrong(pre + f, "a non-negative integer", d[f]);
      (std::string(f) == "start" ? s.start : s.stop) = d[f].get<size_t>();
    }
  } else {
    return unsupported(at, key, "ByteLevel, WordPiece, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence or null",
                       type);
  }
  steps->push_back(s);
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

Status read_processor(const JsonAt& at, const json& p, int depth, Config* cfg) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return at.missing("post_processor.type", "a string");
  const std::string type = p["type"].get<std::string>();
  if (type == "ByteLevel") return Status::ok();  // offsets only
  if (type == "Sequence") {
    if (!p.contains("processors") || !p["processors"].is_array())
      return at.missing("post_processor.processors", "an array");
    if (depth > kMaxNesting) return corrupt(at.path + ": post_processor", "at most 8 nested Sequences", "more");
    for (const json& q : p["processors"]) ASPEN_RETURN_IF_ERROR(read_processor(at, q, depth + 1, cfg));
    return Status::ok();
  }
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

Status read_post_processor(const JsonAt& at, const json& root, Config* cfg) {
  if (!root.contains("post_processor") || root["post_processor"].is_null()) return Status::ok();
  return read_processor(at, root["post_processor"], 0, cfg);
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
    ASPEN_ASSIGN_OR_RETURN(cfg.byte_fallback, opt_bool(at, model, "model.", "byte_fallback", false));
    ASPEN_ASSIGN_OR_RETURN(cfg.fuse_unk, opt_bool(at, model, "model.", "fuse_unk", false));
    ASPEN_ASSIGN_OR_RETURN(std::string unk, opt_string(at, model, "model.", "unk_token", ""));
    if (!unk.empty()) cfg.bpe_unk = unk;
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

  for (const char* key : {"normalizer", "pre_tokenizer", "decoder"}) {
    if (!root.contains(key) || root[key].is_null()) continue;
    const std::string k = key;
    if (k == "normalizer") ASPEN_RETURN_IF_ERROR(read_normalizer(at, root[key], k, 0, &cfg.normalizers));
    if (k == "pre_tokenizer") ASPEN_RETURN_IF_ERROR(read_pre_tokenizer(at, root[key], k, 0, &cfg.pre_tokenizers));
    if (k == "decoder") ASPEN_RETURN_IF_ERROR(read_decoder(at, root[key], k, 0, &cfg.decoders));
  }
  ASPEN_RETURN_IF_ERROR(read_added_tokens(at, root, !cfg.normalizers.empty(), &cfg));
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
  // GPT-2's setup; <|endoftext|> is special.
  gpt2_byte_level(&cfg);
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
  cfg.normalizers = {NormalizerStep{}};
  PreTokenizerStep bert;
  bert.kind = PreTokenizerStep::Kind::kBert;
  cfg.pre_tokenizers = {bert};
  DecoderStep wordpiece;
  wordpiece.kind = DecoderStep::Kind::kWordPiece;
  cfg.decoders = {wordpiece};
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
