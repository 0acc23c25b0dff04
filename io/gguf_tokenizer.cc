// The tokenizer llama.cpp's converter writes into a GGUF file (tokenizer.ggml.*), rebuilt as the tok::Config of
// the Hugging Face tokenizer it came from.
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "io/gguf.h"
#include "io/tokenizer.h"
#include "io/tokenizer_pipeline.h"
#include "io/tokenizer_unicode.h"

namespace aspen::io {

namespace {

namespace uni = unicode;
using namespace tok;

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4;

// The metadata of one file, read with errors that name the key.
class Metadata {
 public:
  explicit Metadata(const GgufFile& file) : file_(file) {}
  const std::string& path() const { return file_.path(); }

  Result<const std::vector<GgufValue>*> list(const std::string& key, bool required) const {
    const GgufValue* v = file_.find_metadata(key);
    if (!v) {
      if (!required) return static_cast<const std::vector<GgufValue>*>(nullptr);
      return Status::error(Code::kNotFound, path() + ": " + key, "the tokenizer's list", "no such key");
    }
    if (v->kind != GgufValue::Kind::array) return corrupt(path() + ": " + key, "an array", "another value type");
    return &v->items;
  }
  Result<std::optional<std::string>> text(const std::string& key) const {
    const GgufValue* v = file_.find_metadata(key);
    if (!v) return std::optional<std::string>();
    if (v->kind != GgufValue::Kind::string) return corrupt(path() + ": " + key, "a string", "another value type");
    return std::optional<std::string>(v->s);
  }
  // A boolean key, `dflt` when absent.
  Result<bool> flag(const std::string& key, bool dflt) const {
    const GgufValue* v = file_.find_metadata(key);
    if (!v) return dflt;
    if (v->kind != GgufValue::Kind::boolean) return corrupt(path() + ": " + key, "a boolean", "another value type");
    return v->b;
  }
  // A token id below `count` from an integer key; nullopt when absent.
  Result<std::optional<TokenId>> token_id(const std::string& key, size_t count) const {
    const GgufValue* v = file_.find_metadata(key);
    if (!v) return std::optional<TokenId>();
    const int64_t id = integer(*v);
    if (id < 0 || size_t(id) >= count)
      return corrupt(path() + ": " + key, "a token id below " + std::to_string(count),
                     v->kind == GgufValue::Kind::string ? sq(v->s) : std::to_string(id));
    return std::optional<TokenId>(TokenId(id));
  }
  // A metadata integer, -1 for another value type (ids and token types are never negative).
  static int64_t integer(const GgufValue& v) {
    return v.kind == GgufValue::Kind::integer ? v.i : v.kind == GgufValue::Kind::unsigned_integer ? int64_t(v.u) : -1;
  }

 private:
  const GgufFile& file_;
};

// The lists every model has: the tokens (vocabulary, id = position) and, when present, their types.
struct TokenLists {
  const std::vector<GgufValue>* tokens = nullptr;
  std::vector<int64_t> types;  // kNormal for every token when the file has no types
};

Result<TokenLists> token_lists(const Metadata& md, Config* cfg) {
  TokenLists out;
  ASPEN_ASSIGN_OR_RETURN(out.tokens, md.list("tokenizer.ggml.tokens", true));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<GgufValue>* types, md.list("tokenizer.ggml.token_type", false));
  const size_t n = out.tokens->size();
  if (n > (size_t(1) << 30))
    return corrupt(md.path() + ": tokenizer.ggml.tokens", "at most 2^30 tokens", std::to_string(n));
  if (types && types->size() != n)
    return corrupt(md.path() + ": tokenizer.ggml.token_type", std::to_string(n) + " entries (one a token)",
                   std::to_string(types->size()));
  out.types.assign(n, kNormal);
  for (size_t i = 0; i < n; ++i) {
    if ((*out.tokens)[i].kind != GgufValue::Kind::string)
      return corrupt(md.path() + ": tokenizer.ggml.tokens[" + std::to_string(i) + "]", "a string",
                     "another value type");
    cfg->vocab[(*out.tokens)[i].s] = TokenId(i);
    if (!types) continue;
    out.types[i] = Metadata::integer((*types)[i]);
    if (out.types[i] < 0)
      return corrupt(md.path() + ": tokenizer.ggml.token_type[" + std::to_string(i) + "]", "an integer",
                     "another value type");
  }
  return out;
}

// Control and user-defined tokens (and, with `unknown`, the unknown one) are matched in the raw text before
// anything else, as Hugging Face's added tokens and llama.cpp's special-token partition are; control and
// unknown ones are special (skipped by decode's skip_special_tokens).
void add_special_tokens(const TokenLists& lists, bool unknown, Config* cfg) {
  for (size_t i = 0; i < lists.types.size(); ++i) {
    const int64_t type = lists.types[i];
    if (type != kControl && type != kUserDefined && !(unknown && type == kUnknown)) continue;
    AddedToken a;
    a.content = (*lists.tokens)[i].s;
    a.text = uni::decode_utf8_lossy(a.content);
    a.id = TokenId(i);
    a.special = type != kUserDefined;
    cfg->added.push_back(std::move(a));
  }
}

// BOS before and EOS after the text when the file says so; `bos_default` when it does not say.
Status add_bos_eos(const Metadata& md, size_t count, bool bos_default, Config* cfg) {
  ASPEN_ASSIGN_OR_RETURN(bool add_bos, md.flag("tokenizer.ggml.add_bos_token", bos_default));
  ASPEN_ASSIGN_OR_RETURN(bool add_eos, md.flag("tokenizer.ggml.add_eos_token", false));
  for (auto [add, key, where] :
       {std::tuple{add_bos, "bos", &cfg->post_prefix}, std::tuple{add_eos, "eos", &cfg->post_suffix}}) {
    if (!add) continue;
    const std::string id_key = std::string("tokenizer.ggml.") + key + "_token_id";
    ASPEN_ASSIGN_OR_RETURN(std::optional<TokenId> id, md.token_id(id_key, count));
    if (!id)
      return corrupt(md.path() + ": " + id_key,
                     "a token id below " + std::to_string(count) + " (add_" + key + "_token is set)", "none");
    *where = {*id};
  }
  return Status::ok();
}

// NOTE [GGUF tokenizers]: llama.cpp's converter writes a Hugging Face tokenizer into the GGUF file as lists:
// tokenizer.ggml.tokens (id = position), token_type (1 normal, 3 control, 4 user-defined, ...), merges ("a b",
// rank = position) and `pre`, the name of the pre-tokenizer's split that llama.cpp recognised. For GPT-2's
// (model "gpt2", pre "gpt-2") that is the whole of the tokenizer vocab.json + merges.txt describe, so it is
// rebuilt as load_bpe_files builds that one, control and user-defined tokens added (control ones special):
// the ids are Hugging Face's (tested against the directory the file was converted from). Llama 3's and Qwen2's
// splits ("llama-bpe", "qwen2") run their regex before the byte level, as their tokenizer.json Sequence does, and
// add_bos_token puts the BOS token first. Other splits are refused by name. SentencePiece's "llama" model:
// NOTE [GGUF SentencePiece].
Result<std::unique_ptr<Tokenizer>> byte_level_bpe(const Metadata& md) {
  const std::string& path = md.path();
  ASPEN_ASSIGN_OR_RETURN(std::optional<std::string> pre, md.text("tokenizer.ggml.pre"));
  // The splits llama.cpp names that aspen's pre-tokenizers have (io/tokenizer_pipeline.h's SplitRegex).
  std::optional<SplitRegex> split;
  if (pre && *pre == "llama-bpe")
    split = SplitRegex::kLlama3;
  else if (pre && *pre == "qwen2")
    split = SplitRegex::kQwen2;
  else if (pre && *pre != "gpt-2" && *pre != "default")
    return Status::unimplemented(path + ": tokenizer.ggml.pre",
                                 "a split aspen has (\"gpt-2\", \"llama-bpe\", \"qwen2\"); found " + sq(*pre));
  Config cfg;
  ASPEN_ASSIGN_OR_RETURN(TokenLists lists, token_lists(md, &cfg));
  ASPEN_ASSIGN_OR_RETURN(const std::vector<GgufValue>* merges, md.list("tokenizer.ggml.merges", true));
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string where = path + ": tokenizer.ggml.merges[" + std::to_string(i) + "]";
    const GgufValue& m = (*merges)[i];
    const size_t sp = m.kind == GgufValue::Kind::string ? m.s.find(' ') : std::string::npos;
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.s.size() || m.s.find(' ', sp + 1) != std::string::npos)
      return corrupt(where, "two tokens separated by one space",
                     m.kind == GgufValue::Kind::string ? sq(m.s) : "another value type");
    ASPEN_RETURN_IF_ERROR(add_merge(where, m.s.substr(0, sp), m.s.substr(sp + 1), int32_t(i), &cfg));
  }
  gpt2_byte_level(&cfg);
  if (split) {  // the named split first, then bytes to characters without GPT-2's regex (Hugging Face's Sequence)
    PreTokenizerStep regex;
    regex.kind = PreTokenizerStep::Kind::kSplit;
    regex.regex = *split;
    cfg.pre_tokenizers.front().use_regex = false;
    cfg.pre_tokenizers.insert(cfg.pre_tokenizers.begin(), regex);
  }
  // Qwen2's tokenizer.json composes its text (NFC) first; the file does not say so, its split's name does.
  // (llama.cpp's own tokenizer skips this: a decomposed accent tokenizes differently there, not here.)
  if (split == SplitRegex::kQwen2) {
    NormalizerStep nfc;
    nfc.kind = NormalizerStep::Kind::kNfc;
    cfg.normalizers = {nfc};
  }
  // llama.cpp adds the BOS token before the text when the file says so (Llama 3's template).
  ASPEN_RETURN_IF_ERROR(add_bos_eos(md, lists.types.size(), /*bos_default=*/false, &cfg));
  add_special_tokens(lists, /*unknown=*/false, &cfg);
  return finish(path, std::move(cfg));
}

// NOTE [GGUF SentencePiece]: a SentencePiece BPE model (Llama 2, Mistral, TinyLlama: tokenizer.ggml.model
// "llama") is written as its pieces, their scores and types (2 unknown, 3 control, 6 byte: "<0x0A>"), without
// merges. llama.cpp tokenizes it as SentencePiece does: each character a symbol, then the adjacent pair whose
// concatenation is a piece with the highest score merged, again and again; what is left without a piece becomes
// its bytes' pieces. transformers' converter (LlamaConverter) turns the same model into BPE merges ranked by the
// merged piece's score, highest first (generate_merges: every split of a piece into two pieces; ties by the
// left part's length, then the right's, longest first, then by piece id), which merges the same pairs in the same
// order; so the file is rebuilt as that tokenizer.json (legacy: Prepend "▁" when add_space_prefix, Replace " ";
// byte fallback, unk fused; decoders Replace, ByteFallback, Fuse, Strip one leading space) and the ids are Hugging
// Face's and llama.cpp's (tested against both on the file the converter wrote). llama.cpp adds the space before
// each stretch of text after a special token, as Hugging Face's per-stretch normalizer does, and BOS by default.
Result<std::unique_ptr<Tokenizer>> sentencepiece_bpe(const Metadata& md) {
  const std::string& path = md.path();
  Config cfg;
  ASPEN_ASSIGN_OR_RETURN(TokenLists lists, token_lists(md, &cfg));
  const size_t n = lists.types.size();
  ASPEN_ASSIGN_OR_RETURN(const std::vector<GgufValue>* scores, md.list("tokenizer.ggml.scores", true));
  if (scores->size() != n)
    return corrupt(path + ": tokenizer.ggml.scores", std::to_string(n) + " entries (one a token)",
                   std::to_string(scores->size()));
  std::vector<double> score(n);
  for (size_t i = 0; i < n; ++i) {
    const GgufValue& s = (*scores)[i];
    if (s.kind == GgufValue::Kind::real)
      score[i] = s.f;
    else if (s.kind == GgufValue::Kind::integer)
      score[i] = double(s.i);
    else if (s.kind == GgufValue::Kind::unsigned_integer)
      score[i] = double(s.u);
    else
      return corrupt(path + ": tokenizer.ggml.scores[" + std::to_string(i) + "]", "a number", "another value type");
  }
  // Every split of a piece into two pieces (of whole characters), ranked as generate_merges ranks them.
  struct Merge {
    TokenId merged, left, right;
    size_t left_chars, right_chars;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < n; ++i) {
    const std::u32string piece = uni::decode_utf8_lossy((*lists.tokens)[i].s);
    const size_t first = merges.size();
    for (size_t k = 1; k < piece.size(); ++k) {
      auto l = cfg.vocab.find(uni::to_utf8(piece.substr(0, k)));
      auto r = cfg.vocab.find(uni::to_utf8(piece.substr(k)));
      if (l != cfg.vocab.end() && r != cfg.vocab.end())
        merges.push_back({TokenId(i), l->second, r->second, k, piece.size() - k});
    }
    std::sort(merges.begin() + first, merges.end(),
              [](const Merge& a, const Merge& b) { return a.left != b.left ? a.left < b.left : a.right < b.right; });
  }
  std::stable_sort(merges.begin(), merges.end(), [&](const Merge& a, const Merge& b) {
    if (score[a.merged] != score[b.merged]) return score[a.merged] > score[b.merged];
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  for (size_t i = 0; i < merges.size(); ++i)
    cfg.merges.emplace(pair_key(merges[i].left, merges[i].right), std::pair{int32_t(i), merges[i].merged});

  ASPEN_ASSIGN_OR_RETURN(bool space_prefix, md.flag("tokenizer.ggml.add_space_prefix", true));
  cfg.model = ModelKind::kBpe;
  cfg.byte_fallback = true;
  cfg.fuse_unk = true;
  ASPEN_ASSIGN_OR_RETURN(std::optional<TokenId> unk, md.token_id("tokenizer.ggml.unknown_token_id", n));
  for (size_t i = 0; !unk && i < n; ++i)
    if (lists.types[i] == kUnknown) unk = TokenId(i);
  if (unk) cfg.bpe_unk = (*lists.tokens)[*unk].s;
  NormalizerStep prepend, replace;
  prepend.kind = NormalizerStep::Kind::kPrepend;
  prepend.to = U"\u2581";
  replace.kind = NormalizerStep::Kind::kReplace;
  replace.from = U" ";
  replace.to = U"\u2581";
  if (space_prefix) cfg.normalizers.push_back(prepend);
  cfg.normalizers.push_back(replace);
  DecoderStep to_space, bytes, fuse, strip;
  to_space.kind = DecoderStep::Kind::kReplace;
  to_space.from = "\u2581";
  to_space.to = " ";
  bytes.kind = DecoderStep::Kind::kByteFallback;
  fuse.kind = DecoderStep::Kind::kFuse;
  strip.kind = DecoderStep::Kind::kStrip;
  strip.start = 1;
  cfg.decoders = {to_space, bytes, fuse};
  if (space_prefix) cfg.decoders.push_back(strip);
  ASPEN_RETURN_IF_ERROR(add_bos_eos(md, n, /*bos_default=*/true, &cfg));
  add_special_tokens(lists, /*unknown=*/true, &cfg);
  return finish(path, std::move(cfg));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const GgufFile& file) {
  const Metadata md(file);
  ASPEN_ASSIGN_OR_RETURN(std::optional<std::string> model, md.text("tokenizer.ggml.model"));
  if (!model)
    return Status::error(Code::kNotFound, md.path() + ": tokenizer.ggml.model", "the tokenizer's kind", "no such key");
  if (*model == "gpt2") return byte_level_bpe(md);
  if (*model == "llama") return sentencepiece_bpe(md);
  return Status::unimplemented(md.path() + ": tokenizer.ggml.model",
                               "\"gpt2\" (byte-level BPE) or \"llama\" (SentencePiece BPE); found " + sq(*model));
}

}  // namespace aspen::io
