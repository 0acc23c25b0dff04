#include "train/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/checksum.h"
#include "core/file.h"
#include "core/philox.h"

namespace aspen::train {

namespace {

using json = nlohmann::ordered_json;

std::string sq(const std::string& s) { return "'" + s + "'"; }

Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) {
  return Status::error(Code::kCorrupt, subject, expected, found);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

template <class T>
void put_le(unsigned char* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(uint64_t(v) >> (8 * i));
}
template <class T>
T get_le(const unsigned char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(p[i]) << (8 * i);
  return static_cast<T>(v);
}

// An input corpus is read whole into memory; beyond this, split it into several files.
constexpr uint64_t kMaxInputBytes = uint64_t(16) << 30;

uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t h) { return hex_digits(h, 16); }

const char* kIndexName = "index.json";

std::string shard_name(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05zu.tok", i);
  return buf;
}

}  // namespace

const char* token_dtype_name(TokenDType t) { return t == TokenDType::u16 ? "uint16" : "uint32"; }

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDType::u16 : TokenDType::u32;
}

std::string fnv1a64_hex(std::string_view bytes) { return hex64(fnv1a64(bytes)); }

Result<std::string> tokenizer_fingerprint(const std::string& dir) {
  uint64_t h = fnv1a64("aspen-tokenizer-fingerprint-1");
  bool any = false;
  for (const char* name : {"tokenizer.json", "vocab.json", "merges.txt", "vocab.txt"}) {
    const std::string path = join_path(dir, name);
    if (!std::filesystem::is_regular_file(path)) continue;
    ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path));
    const uint64_t size = text.size();
    h = fnv1a64(name, h);
    h = fnv1a64(std::string_view(reinterpret_cast<const char*>(&size), sizeof(size)), h);
    h = fnv1a64(text, h);
    any = true;
  }
  if (!any)
    return Status::error(Code::kNotFound, dir, "tokenizer.json, vocab.json + merges.txt or vocab.txt", "none of them");
  return hex64(h);
}

// ---------------------------------------------------------------- writer

Result<TokenShardWriter> TokenShardWriter::create(const std::string& dir, TokenShardWriterOptions options) {
  if (options.vocab_size <= 0 || options.vocab_size > (int64_t(1) << 31))
    return Status::invalid_argument("vocab_size", "in [1, 2^31]", std::to_string(options.vocab_size));
  if (options.eos_id < 0 || options.eos_id >= options.vocab_size)
    return Status::invalid_argument("eos id", "in [0, vocab_size=" + std::to_string(options.vocab_size) + ")",
                                    std::to_string(options.eos_id));
  if (options.shard_tokens <= 0)
    return Status::invalid_argument("shard_tokens", "a positive token count", std::to_string(options.shard_tokens));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(Code::kIoError, dir, "a directory that can be created", ec.message());
  TokenShardWriter w;
  w.dir_ = dir;
  w.shard_tokens_ = options.shard_tokens;
  w.index_.dtype = token_dtype_for_vocab(options.vocab_size);
  w.index_.vocab_size = options.vocab_size;
  w.index_.eos_id = options.eos_id;
  w.index_.tokenizer_dir = std::move(options.tokenizer_dir);
  w.index_.tokenizer_hash = std::move(options.tokenizer_hash);
  return w;
}

Status TokenShardWriter::add_document(std::span<const io::TokenId> ids) {
  // Checked first, so a rejected document leaves the writer as it was.
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || int64_t(ids[i]) >= index_.vocab_size)
      return Status::invalid_argument("document " + std::to_string(index_.documents) + ": token " + std::to_string(i),
                                      "an id in [0, " + std::to_string(index_.vocab_size) + ")",
                                      std::to_string(ids[i]));
  const size_t width = size_t(index_.dtype);
  for (size_t i = 0; i <= ids.size(); ++i) {
    const uint32_t id = uint32_t(i < ids.size() ? ids[i] : index_.eos_id);
    if (buffer_.empty()) buffer_.reserve(size_t(std::min<int64_t>(shard_tokens_, int64_t(1) << 20)) * width);
    const size_t at = buffer_.size();
    buffer_.resize(at + width);
    if (width == 2)
      put_le<uint16_t>(buffer_.data() + at, uint16_t(id));
    else
      put_le<uint32_t>(buffer_.data() + at, id);
    ++buffered_;
    ++index_.total_tokens;
    if (buffered_ == shard_tokens_) ASPEN_RETURN_IF_ERROR(flush());
  }
  ++index_.documents;
  return Status::ok();
}

Status TokenShardWriter::flush() {
  if (buffered_ == 0) return Status::ok();
  unsigned char header[kTokenShardHeaderBytes];
  std::memcpy(header, kTokenShardMagic, 8);
  put_le<uint32_t>(header + 8, kTokenShardVersion);
  put_le<uint32_t>(header + 12, uint32_t(index_.dtype));
  put_le<uint64_t>(header + 16, uint64_t(buffered_));
  const std::string name = shard_name(index_.shards.size());
  const std::string_view parts[] = {std::string_view(reinterpret_cast<const char*>(header), sizeof header),
                                    std::string_view(reinterpret_cast<const char*>(buffer_.data()), buffer_.size())};
  ASPEN_RETURN_IF_ERROR(write_file_atomic(join_path(dir_, name), parts));
  index_.shards.push_back({name, buffered_});
  buffer_.clear();
  buffered_ = 0;
  return Status::ok();
}

Result<TokenIndex> TokenShardWriter::finish() {
  ASPEN_RETURN_IF_ERROR(flush());
  json j = json::object();
  j["format"] = "aspen-token-shards";
  j["version"] = index_.version;
  j["dtype"] = token_dtype_name(index_.dtype);
  j["vocab_size"] = index_.vocab_size;
  j["eos_id"] = index_.eos_id;
  j["tokenizer"] = {{"dir", index_.tokenizer_dir}, {"hash", index_.tokenizer_hash}};
  json shards = json::array();
  for (const ShardInfo& s : index_.shards) shards.push_back({{"name", s.name}, {"tokens", s.tokens}});
  j["shards"] = std::move(shards);
  j["total_tokens"] = index_.total_tokens;
  j["documents"] = index_.documents;
  json inputs = json::array();
  for (const InputInfo& in : index_.inputs)
    inputs.push_back({{"path", in.path}, {"bytes", in.bytes}, {"hash", in.hash}});
  j["inputs"] = std::move(inputs);
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument(join_path(dir_, kIndexName), "paths in valid UTF-8", e.what());
  }
  ASPEN_RETURN_IF_ERROR(write_file_atomic(join_path(dir_, kIndexName), text));
  return index_;
}

Result<PrepareStats> prepare_token_shards(const io::Tokenizer& tokenizer, const PrepareOptions& options) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const io::SpecialTokenIds& special = tokenizer.special_ids();
  std::optional<io::TokenId> eos = special.eos, first;
  if (!eos && special.cls && special.sep) eos = special.sep, first = special.cls;  // WordPiece: [CLS] doc [SEP]
  if (!eos)
    return Status::error(Code::kFailedPrecondition, "tokenizer " + sq(options.tokenizer_dir),
                         "an end-of-text (eos) token, or [CLS] and [SEP], to separate documents", "none",
                         "byte-level BPE tokenizers name it <|endoftext|>");
  if (options.inputs.empty()) return Status::invalid_argument("inputs", "at least one input file", "none");
  TokenShardWriterOptions wo;
  wo.vocab_size = int64_t(tokenizer.vocab_size());
  wo.eos_id = *eos;
  wo.shard_tokens = options.shard_tokens;
  wo.tokenizer_dir = options.tokenizer_dir;
  if (!options.tokenizer_dir.empty()) {
    ASPEN_ASSIGN_OR_RETURN(wo.tokenizer_hash, tokenizer_fingerprint(options.tokenizer_dir));
  }
  ASPEN_ASSIGN_OR_RETURN(TokenShardWriter writer, TokenShardWriter::create(options.output_dir, std::move(wo)));
  PrepareStats stats;
  double tokenize = 0;
  auto add = [&](std::string_view doc) -> Status {
    const auto a = clock::now();
    std::vector<io::TokenId> ids = tokenizer.encode(doc, /*add_special_tokens=*/false);
    tokenize += std::chrono::duration<double>(clock::now() - a).count();
    if (ids.empty()) return Status::ok();
    if (first) ids.insert(ids.begin(), *first);
    return writer.add_document(ids);
  };
  for (const std::string& path : options.inputs) {
    ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxInputBytes));
    writer.add_input({path, int64_t(text.size()), fnv1a64_hex(text)});
    stats.input_bytes += int64_t(text.size());
    if (!options.split_lines) {
      ASPEN_RETURN_IF_ERROR(add(text).with_context(path));
      continue;
    }
    std::string_view rest = text;
    size_t line = 1;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      std::string_view l = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      if (!l.empty()) ASPEN_RETURN_IF_ERROR(add(l).with_context(path + ":" + std::to_string(line)));
      ++line;
    }
  }
  ASPEN_ASSIGN_OR_RETURN(stats.index, writer.finish());
  stats.tokenize_seconds = tokenize;
  stats.total_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return stats;
}

// ---------------------------------------------------------------- index

Result<TokenIndex> read_token_index(const std::string& dir) {
  const std::string path = join_path(dir, kIndexName);
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(path, "valid JSON", "a parse error");
  if (!j.is_object()) return corrupt(path, "a JSON object", std::string("a JSON ") + j.type_name());
  auto field = [&](const nlohmann::json& obj, const char* key, nlohmann::json::value_t type,
                   const std::string& where) -> Result<const nlohmann::json*> {
    auto it = obj.find(key);
    const std::string subject = path + ": " + where + sq(key);
    const char* want = type == nlohmann::json::value_t::string ? "a string"
                       : type == nlohmann::json::value_t::array ? "an array"
                       : type == nlohmann::json::value_t::object ? "an object"
                                                                 : "a non-negative integer";
    if (it == obj.end()) return corrupt(subject, want, "no such key");
    const bool ok = type == nlohmann::json::value_t::number_unsigned ? it->is_number_unsigned() : it->type() == type;
    if (!ok) return corrupt(subject, want, std::string("a JSON ") + it->type_name());
    return &*it;
  };
  using vt = nlohmann::json::value_t;
  auto uint_field = [&](const nlohmann::json& obj, const char* key, const std::string& where,
                        uint64_t max) -> Result<int64_t> {
    ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* v, field(obj, key, vt::number_unsigned, where));
    const uint64_t u = v->get<uint64_t>();
    if (u > max) return corrupt(path + ": " + where + sq(key), "at most " + std::to_string(max), std::to_string(u));
    return int64_t(u);
  };
  const uint64_t kMaxCount = uint64_t(1) << 62;
  TokenIndex idx;
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* format, field(j, "format", vt::string, ""));
  if (format->get<std::string>() != "aspen-token-shards")
    return corrupt(path + ": 'format'", "\"aspen-token-shards\"", format->dump());
  ASPEN_ASSIGN_OR_RETURN(int64_t version, uint_field(j, "version", "", 1000));
  if (version != kTokenIndexVersion)
    return Status::error(Code::kCorrupt, path + ": 'version'", std::to_string(kTokenIndexVersion),
                         std::to_string(version), "written by a newer aspen?");
  ASPEN_ASSIGN_OR_RETURN(idx.vocab_size, uint_field(j, "vocab_size", "", uint64_t(1) << 31));
  if (idx.vocab_size == 0) return corrupt(path + ": 'vocab_size'", "a positive count", "0");
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* dtype, field(j, "dtype", vt::string, ""));
  const std::string want_dtype = token_dtype_name(token_dtype_for_vocab(idx.vocab_size));
  if (dtype->get<std::string>() != want_dtype)
    return corrupt(path + ": 'dtype'", "\"" + want_dtype + "\" (vocab_size " + std::to_string(idx.vocab_size) + ")",
                   dtype->dump());
  idx.dtype = token_dtype_for_vocab(idx.vocab_size);
  ASPEN_ASSIGN_OR_RETURN(int64_t eos, uint_field(j, "eos_id", "", uint64_t(idx.vocab_size - 1)));
  idx.eos_id = int32_t(eos);
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* tok, field(j, "tokenizer", vt::object, ""));
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* tdir, field(*tok, "dir", vt::string, "tokenizer."));
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* thash, field(*tok, "hash", vt::string, "tokenizer."));
  idx.tokenizer_dir = tdir->get<std::string>();
  idx.tokenizer_hash = thash->get<std::string>();
  ASPEN_ASSIGN_OR_RETURN(idx.total_tokens, uint_field(j, "total_tokens", "", kMaxCount));
  ASPEN_ASSIGN_OR_RETURN(idx.documents, uint_field(j, "documents", "", kMaxCount));
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* shards, field(j, "shards", vt::array, ""));
  int64_t sum = 0;
  for (size_t i = 0; i < shards->size(); ++i) {
    const nlohmann::json& s = (*shards)[i];
    const std::string where = "shards[" + std::to_string(i) + "].";
    if (!s.is_object()) return corrupt(path + ": " + where.substr(0, where.size() - 1), "an object", s.type_name());
    ShardInfo info;
    ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* name, field(s, "name", vt::string, where));
    info.name = name->get<std::string>();
    if (info.name.empty() || info.name.find('/') != std::string::npos || info.name == "." || info.name == "..")
      return corrupt(path + ": " + where + "'name'", "a file name inside the dataset directory", name->dump());
    ASPEN_ASSIGN_OR_RETURN(info.tokens, uint_field(s, "tokens", where, kMaxCount));
    sum += info.tokens;
    if (uint64_t(sum) > kMaxCount) return corrupt(path + ": 'shards'", "token counts summing to at most 2^62", "more");
    idx.shards.push_back(std::move(info));
  }
  if (sum != idx.total_tokens)
    return corrupt(path + ": 'total_tokens'", std::to_string(sum) + " (the sum of the shards' tokens)",
                   std::to_string(idx.total_tokens));
  ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* inputs, field(j, "inputs", vt::array, ""));
  for (size_t i = 0; i < inputs->size(); ++i) {
    const nlohmann::json& in = (*inputs)[i];
    const std::string where = "inputs[" + std::to_string(i) + "].";
    if (!in.is_object()) return corrupt(path + ": " + where.substr(0, where.size() - 1), "an object", in.type_name());
    InputInfo info;
    ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* p, field(in, "path", vt::string, where));
    ASPEN_ASSIGN_OR_RETURN(info.bytes, uint_field(in, "bytes", where, kMaxCount));
    ASPEN_ASSIGN_OR_RETURN(const nlohmann::json* h, field(in, "hash", vt::string, where));
    info.path = p->get<std::string>();
    info.hash = h->get<std::string>();
    idx.inputs.push_back(std::move(info));
  }
  return idx;
}

// ---------------------------------------------------------------- dataset

// NOTE [token shards are read, not mapped]: a mapped shard that is truncated
// while training (another job rewriting the dataset, a full disk) kills the
// process with SIGBUS at the next access, with no message and no checkpoint.
// Shards are read with pread into each batch instead: a short read is a Corrupt
// error naming the shard, and the trainer saves the last finished step. A
// batch is a few thousand tokens; the copy costs nothing beside a step.

TokenDataset::TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

Result<TokenDataset> TokenDataset::open(const std::string& dir) {
  TokenDataset d;
  d.dir_ = dir;
  ASPEN_ASSIGN_OR_RETURN(d.index_, read_token_index(dir));
  const size_t width = size_t(d.index_.dtype);
  int64_t start = 0;
  for (const ShardInfo& s : d.index_.shards) {
    const std::string path = join_path(dir, s.name);
    ASPEN_ASSIGN_OR_RETURN(InputFile file, InputFile::open(path, kMaxBinaryFileBytes));
    const uint64_t size = file.size();
    const uint64_t want = kTokenShardHeaderBytes + uint64_t(s.tokens) * width;
    if (size != want) {
      return corrupt(path,
                     std::to_string(want) + " bytes (a " + std::to_string(kTokenShardHeaderBytes) + "-byte header + " +
                         std::to_string(s.tokens) + " " + token_dtype_name(d.index_.dtype) + " tokens, per index.json)",
                     std::to_string(size) + " bytes" + (size < want ? " (truncated?)" : ""));
    }
    unsigned char b[kTokenShardHeaderBytes];
    ASPEN_RETURN_IF_ERROR(file.pread_exact(0, b, kTokenShardHeaderBytes));
    if (std::memcmp(b, kTokenShardMagic, 8) != 0)
      return corrupt(path, "magic \"ASPNTOK1\"", "other bytes (not an aspen token shard)");
    if (uint32_t v = get_le<uint32_t>(b + 8); v != kTokenShardVersion)
      return corrupt(path, "shard version " + std::to_string(kTokenShardVersion), "version " + std::to_string(v));
    if (uint32_t t = get_le<uint32_t>(b + 12); t != uint32_t(d.index_.dtype))
      return corrupt(path,
                     "token width " + std::to_string(width) + " (" + token_dtype_name(d.index_.dtype) + ", per index.json)",
                     "width " + std::to_string(t));
    if (uint64_t c = get_le<uint64_t>(b + 16); c != uint64_t(s.tokens))
      return corrupt(path, std::to_string(s.tokens) + " tokens in the header (per index.json)", std::to_string(c));
    d.starts_.push_back(start);
    start += s.tokens;
    d.shards_.push_back(std::move(file));
  }
  d.starts_.push_back(start);
  return d;
}

Status TokenDataset::read(int64_t begin, std::span<int32_t> out) const {
  const int64_t n = int64_t(out.size());
  if (begin < 0 || n > size() || begin > size() - n)
    return Status::error(Code::kOutOfRange, dir_ + ": tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) + ")",
                         "a range inside [0, " + std::to_string(size()) + ")", "one outside it");
  if (n == 0) return Status::ok();
  // The shard holding `begin`: the last start <= begin among non-empty shards.
  size_t s = size_t(std::upper_bound(starts_.begin(), starts_.end() - 1, begin) - starts_.begin()) - 1;
  const bool wide = index_.dtype == TokenDType::u32;
  const size_t width = wide ? 4 : 2;
  thread_local std::vector<unsigned char> bytes;
  int64_t done = 0;
  while (done < n) {
    while (starts_[s + 1] <= begin + done) ++s;  // skip exhausted and empty shards
    const InputFile& shard = shards_[s];
    const int64_t off = begin + done - starts_[s];
    const int64_t take = std::min(n - done, starts_[s + 1] - starts_[s] - off);
    bytes.resize(size_t(take) * width);
    ASPEN_RETURN_IF_ERROR(
        shard.pread_exact(kTokenShardHeaderBytes + uint64_t(off) * width, bytes.data(), uint64_t(bytes.size())));
    for (int64_t i = 0; i < take; ++i) {
      const unsigned char* p = bytes.data() + size_t(i) * width;
      const uint32_t id = wide ? get_le<uint32_t>(p) : uint32_t(get_le<uint16_t>(p));
      if (id >= uint64_t(index_.vocab_size))
        return corrupt(shard.path() + ": token " + std::to_string(off + i),
                       "an id below vocab_size " + std::to_string(index_.vocab_size), std::to_string(id));
      out[size_t(done + i)] = int32_t(id);
    }
    done += take;
  }
  return Status::ok();
}

// ---------------------------------------------------------------- loader

std::vector<int64_t> philox_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  for (int64_t i = n - 1, k = 0; i > 0; --i, ++k) {
    const uint64_t u = uint64_t(philox_bits(seed, stream, 2 * uint64_t(k))) |
                       uint64_t(philox_bits(seed, stream, 2 * uint64_t(k) + 1)) << 32;
    const auto j = int64_t((static_cast<unsigned __int128>(u) * uint64_t(i + 1)) >> 64);
    std::swap(p[size_t(i)], p[size_t(j)]);
  }
  return p;
}

Status ExampleOrder::check(const DataLoaderOptions& o) {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v > 0) return Status::ok();
    return Status::invalid_argument(name, "a positive count", std::to_string(v));
  };
  ASPEN_RETURN_IF_ERROR(positive("micro_batch", o.micro_batch));
  ASPEN_RETURN_IF_ERROR(positive("accumulation", o.accumulation));
  ASPEN_RETURN_IF_ERROR(positive("replicas", o.replicas));
  if (o.replica < 0 || o.replica >= o.replicas)
    return Status::invalid_argument("replica", "in [0, replicas=" + std::to_string(o.replicas) + ")",
                                    std::to_string(o.replica));
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    return Status::invalid_argument("val_fraction", "in [0, 1)", std::to_string(o.val_fraction));
  return Status::ok();
}

Result<ExampleOrder> ExampleOrder::make(int64_t num_examples, int64_t val_gap, const DataLoaderOptions& o,
                                        const std::string& what, const std::string& detail) {
  ASPEN_RETURN_IF_ERROR(check(o));
  ExampleOrder l;
  l.options_ = o;
  l.num_examples_ = num_examples;
  if (o.val_fraction > 0) {
    l.val_examples_ = std::max<int64_t>(1, int64_t(double(num_examples) * o.val_fraction));
    l.train_examples_ = std::max<int64_t>(0, num_examples - l.val_examples_ - val_gap);
  } else {
    l.train_examples_ = num_examples;
  }
  const int64_t global = l.global_batch();
  if (l.train_examples_ < global)
    return Status::invalid_argument(
        what + ": training examples",
        "at least one global batch (" + std::to_string(global) + " = micro " + std::to_string(o.micro_batch) +
            " x accumulation " + std::to_string(o.accumulation) + " x replicas " + std::to_string(o.replicas) + ")",
        std::to_string(l.train_examples_) + " (" + detail + ", val_fraction " + std::to_string(o.val_fraction) + ")");
  l.steps_per_epoch_ = (l.train_examples_ / global) * o.accumulation;
  return l;
}

int64_t ExampleOrder::global_batch() const { return options_.micro_batch * options_.accumulation * options_.replicas; }

const std::vector<int64_t>& ExampleOrder::epoch_order(int64_t epoch) {
  if (order_epoch_ != epoch) {
    order_ = philox_permutation(train_examples_, options_.seed, kDataShuffleStream + uint64_t(epoch));
    order_epoch_ = epoch;
  }
  return order_;
}

std::vector<int64_t> ExampleOrder::batch_examples(int64_t epoch, int64_t step) {
  ASPEN_CHECK(step >= 0 && step < steps_per_epoch_) << "step " << step << " of " << steps_per_epoch_;
  const std::vector<int64_t>& order = epoch_order(epoch);
  const int64_t g = step / options_.accumulation, a = step % options_.accumulation;
  const int64_t first = g * global_batch() + options_.replica * options_.micro_batch * options_.accumulation +
                        a * options_.micro_batch;
  return {order.begin() + first, order.begin() + first + options_.micro_batch};
}

std::vector<int64_t> ExampleOrder::next() {
  if (position_.step_in_epoch >= steps_per_epoch_) position_ = {position_.epoch + 1, 0};
  std::vector<int64_t> examples = batch_examples(position_.epoch, position_.step_in_epoch);
  ++position_.step_in_epoch;
  last_ = examples;
  last_epoch_ = position_.epoch;
  return examples;
}

Status ExampleOrder::restore(const Position& p) {
  if (p.epoch < 0 || p.step_in_epoch < 0 || p.step_in_epoch > steps_per_epoch_)
    return Status::error(Code::kOutOfRange, "data position",
                         "epoch >= 0 and step_in_epoch in [0, " + std::to_string(steps_per_epoch_) + "]",
                         "epoch " + std::to_string(p.epoch) + ", step_in_epoch " + std::to_string(p.step_in_epoch));
  position_ = p;
  return Status::ok();
}

int64_t ExampleOrder::val_steps() const { return val_examples_ / (options_.micro_batch * options_.replicas); }

Result<std::vector<int64_t>> ExampleOrder::val_batch(int64_t i) const {
  if (i < 0 || i >= val_steps())
    return Status::error(Code::kOutOfRange, "validation batch", "in [0, " + std::to_string(val_steps()) + ")",
                         std::to_string(i));
  std::vector<int64_t> examples(static_cast<size_t>(options_.micro_batch));
  const int64_t first = val_begin() + (i * options_.replicas + options_.replica) * options_.micro_batch;
  for (size_t b = 0; b < examples.size(); ++b) examples[b] = first + int64_t(b);
  return examples;
}

Result<DataLoader> DataLoader::open(const std::string& dir, const DataLoaderOptions& o) {
  if (o.seq <= 0) return Status::invalid_argument("seq", "a positive count", std::to_string(o.seq));
  ASPEN_RETURN_IF_ERROR(ExampleOrder::check(o));
  ASPEN_ASSIGN_OR_RETURN(TokenDataset ds, TokenDataset::open(dir));
  DataLoader l(std::move(ds));
  const int64_t tokens = l.dataset_.size();
  // NOTE [validation gap]: example i's last target is example i+1's first
  // input, so one example is left out between the splits.
  ASPEN_ASSIGN_OR_RETURN(l.order_, ExampleOrder::make(tokens > 0 ? (tokens - 1) / o.seq : 0, 1, o, dir,
                                                      std::to_string(tokens) + " tokens, seq " + std::to_string(o.seq)));
  return l;
}

Result<Batch> DataLoader::next() {
  const Position at = order_.position();
  Result<Batch> b = make_batch(order_.next());
  if (!b.is_ok()) ASPEN_CHECK(order_.restore(at).is_ok());
  return b;
}

Result<Batch> DataLoader::val_batch(int64_t i) const {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> examples, order_.val_batch(i));
  return make_batch(examples);
}

Result<Batch> DataLoader::make_batch(std::span<const int64_t> examples) const {
  const int64_t B = int64_t(examples.size()), T = options().seq;
  Batch b{Tensor(DType::i32, Shape{B, T}), Tensor(DType::i32, Shape{B, T})};
  std::vector<int32_t> row(static_cast<size_t>(T + 1));
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  for (int64_t e = 0; e < B; ++e) {
    ASPEN_RETURN_IF_ERROR(dataset_.read(examples[size_t(e)] * T, row));
    std::copy(row.begin(), row.end() - 1, in + e * T);
    std::copy(row.begin() + 1, row.end(), tg + e * T);
  }
  return b;
}

}  // namespace aspen::train
