#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/file.h"
#include "io/json_brief.h"

namespace aspen::io {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // 100 MiB, as Hugging Face's reader
constexpr const char* kMetadataKey = "__metadata__";

std::string sq(const std::string& s) { return "'" + s + "'"; }

Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) {
  return Status::error(Code::kCorrupt, subject, expected, found);
}

// Parses JSON without exceptions, rejecting duplicate keys in the top-level
// object (nlohmann would silently keep the last one).
Status parse_json(const char* begin, const char* end, const std::string& subject, json* out) {
  std::set<std::string> top_keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!top_keys.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  *out = json::parse(begin, end, cb, /*allow_exceptions=*/false);
  if (out->is_discarded()) return corrupt(subject, "well-formed UTF-8 JSON", "a parse error");
  if (!duplicate.empty()) return corrupt(subject, "unique keys", "key " + sq(duplicate) + " twice");
  return Status::ok();
}

// Names Hugging Face's safetensors defines that this build does not support.
bool is_known_unsupported_dtype(const std::string& s) {
  static const char* const kNames[] = {"F64", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2",
                                       "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
  for (const char* n : kNames)
    if (s == n) return true;
  return false;
}

std::string supported_dtypes() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (i) s += ", ";
    s += dtype_safetensors_name(DType(i));
  }
  return s;
}

// Validates one header entry into `info` (name already set).
Status parse_entry(const std::string& subject, const json& e, size_t data_size, TensorInfo* info) {
  if (!e.is_object()) return corrupt(subject, "an object", std::string("a JSON ") + e.type_name());
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      return corrupt(subject, "only the fields dtype, shape, data_offsets", "field " + sq(it.key()));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!e.contains(field)) return corrupt(subject, std::string("a field '") + field + "'", "none");

  const json& jd = e["dtype"];
  if (!jd.is_string()) return corrupt(subject + ": dtype", "a string", std::string("a JSON ") + jd.type_name());
  const std::string& dname = jd.get_ref<const std::string&>();
  std::optional<DType> dt = dtype_from_safetensors_name(dname);
  if (!dt) {
    if (is_known_unsupported_dtype(dname))
      return Status::error(Code::kUnimplemented, subject, "a dtype this build supports (" + supported_dtypes() + ")",
                           sq(dname));
    return corrupt(subject, "a safetensors dtype (" + supported_dtypes() + ")", sq(dname));
  }
  info->dtype = *dt;

  const json& js = e["shape"];
  if (!js.is_array()) return corrupt(subject + ": shape", "an array", std::string("a JSON ") + js.type_name());
  if (js.size() > size_t(Shape::kMaxRank))
    return corrupt(subject + ": shape", "rank at most " + std::to_string(Shape::kMaxRank),
                   "rank " + std::to_string(js.size()));
  int64_t dims[Shape::kMaxRank] = {};
  uint64_t bytes = uint64_t(dtype_size(*dt));
  bool overflow = false;
  for (size_t i = 0; i < js.size(); ++i) {
    const json& d = js[i];
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      return corrupt(subject + ": shape", "non-negative integer extents", json_brief(d) + " at dimension " + std::to_string(i));
    dims[i] = int64_t(d.get<uint64_t>());
    overflow = overflow || __builtin_mul_overflow(bytes, uint64_t(dims[i]), &bytes);
  }
  Result<Shape> shape = Shape::make(dims, int(js.size()));
  if (!shape.is_ok())
    return corrupt(subject + ": shape", shape.status().expected(), shape.status().found());
  info->shape = *shape;

  const json& jo = e["data_offsets"];
  if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
    return corrupt(subject + ": data_offsets", "two non-negative integers [begin, end]", json_brief(jo));
  uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
  if (begin > end)
    return corrupt(subject + ": data_offsets", "begin <= end",
                   "[" + std::to_string(begin) + ", " + std::to_string(end) + "]");
  const std::string desc = std::string(dtype_name(*dt)) + info->shape.to_string();
  if (overflow)
    return corrupt(subject, "a byte size that fits in 64 bits (" + desc + ")", "an overflow");
  if (bytes != end - begin)
    return corrupt(subject, std::to_string(bytes) + " bytes (" + desc + ")", std::to_string(end - begin));
  if (end > data_size)
    return corrupt(subject + ": data_offsets",
                   "an end within the data section (" + std::to_string(data_size) + " bytes)",
                   "[" + std::to_string(begin) + ", " + std::to_string(end) + "]");
  info->offset = size_t(begin);
  info->bytes = size_t(bytes);
  return Status::ok();
}

Result<Tensor> copy_tensor(const std::string& subject, const TensorInfo& info, std::span<const std::byte> bytes) {
  Result<Tensor> t = Tensor::make(info.dtype, info.shape);
  if (!t.is_ok()) return std::move(t).status().with_context(subject);
  if (!bytes.empty()) std::memcpy(t->raw(), bytes.data(), bytes.size());
  return t;
}

// Whether a relative path has a ".." component (it could name a file outside the model directory).
bool escapes_directory(const std::string& rel) {
  size_t begin = 0;
  while (begin <= rel.size()) {
    size_t end = rel.find('/', begin);
    if (end == std::string::npos) end = rel.size();
    if (rel.compare(begin, end - begin, "..") == 0) return true;
    begin = end + 1;
  }
  return false;
}

std::string dirname_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  return path.substr(0, slash + 1);
}

}  // namespace

// ---------------------------------------------------------------- SafetensorsFile

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  ASPEN_ASSIGN_OR_RETURN(f.file_, FileBytes::open(path, kMaxBinaryFileBytes));
  ASPEN_RETURN_IF_ERROR(f.parse());
  return f;
}

Result<SafetensorsFile> SafetensorsFile::from_bytes(std::span<const std::byte> bytes, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  f.file_ = FileBytes::copy(bytes);
  ASPEN_RETURN_IF_ERROR(f.parse());
  return f;
}

Status SafetensorsFile::parse() {
  const std::string& path = path_;
  const auto* base = reinterpret_cast<const unsigned char*>(file_.data());
  const uint64_t file_size = file_.size();
  if (file_size < 8)
    return corrupt(path, "at least 8 bytes (the header length)", std::to_string(file_size) + " bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n > kMaxHeaderBytes)
    return corrupt(path + ": header length", "at most " + std::to_string(kMaxHeaderBytes) + " bytes",
                   std::to_string(n));
  if (n > file_size - 8)
    return corrupt(path + ": header length",
                   "at most " + std::to_string(file_size - 8) + " bytes (file size " + std::to_string(file_size) +
                       " - 8)",
                   std::to_string(n));
  data_ = reinterpret_cast<const std::byte*>(base + 8 + n);
  data_size_ = size_t(file_size - 8 - n);

  json header;
  const char* hb = reinterpret_cast<const char*>(base + 8);
  ASPEN_RETURN_IF_ERROR(parse_json(hb, hb + n, path + ": header", &header));
  if (!header.is_object())
    return corrupt(path + ": header", "a JSON object", std::string("a JSON ") + header.type_name());

  std::vector<const TensorInfo*> by_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    if (key == kMetadataKey) {
      const json& md = it.value();
      if (!md.is_object())
        return corrupt(path + ": __metadata__", "an object", std::string("a JSON ") + md.type_name());
      for (auto m_it = md.begin(); m_it != md.end(); ++m_it) {
        if (!m_it.value().is_string())
          return corrupt(path + ": __metadata__ " + sq(m_it.key()), "a string value",
                         std::string("a JSON ") + m_it.value().type_name());
        metadata_[m_it.key()] = m_it.value().get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    info.name = key;
    ASPEN_RETURN_IF_ERROR(parse_entry(path + ": tensor " + sq(key), it.value(), data_size_, &info));
    auto [pos, inserted] = tensors_.emplace(key, std::move(info));
    (void)inserted;  // keys of a parsed object are unique (duplicates rejected above)
    by_offset.push_back(&pos->second);
  }

  // Ranges must not overlap. Empty tensors own no bytes and overlap nothing.
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->name < b->name;
  });
  const TensorInfo* last = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->bytes == 0) continue;
    if (last && t->offset < last->offset + last->bytes)
      return corrupt(path + ": tensor " + sq(t->name),
                     "a byte range not overlapping tensor " + sq(last->name) + " [" +
                         std::to_string(last->offset) + ", " + std::to_string(last->offset + last->bytes) + ")",
                     "[" + std::to_string(t->offset) + ", " + std::to_string(t->offset + t->bytes) + ")");
    // The format forbids holes: the data section is exactly the tensors, back to back.
    const size_t covered = last ? last->offset + last->bytes : 0;
    if (t->offset > covered)
      return corrupt(path + ": tensor " + sq(t->name),
                     "data starting at byte " + std::to_string(covered) + " (right after " +
                         (last ? "tensor " + sq(last->name) : std::string("the header")) +
                         "; the format allows no gaps)",
                     "data_offsets [" + std::to_string(t->offset) + ", " + std::to_string(t->offset + t->bytes) + ")");
    if (!last || t->offset + t->bytes > last->offset + last->bytes) last = t;
  }
  const size_t covered = last ? last->offset + last->bytes : 0;
  if (covered != data_size_)
    return corrupt(path + ": data section",
                   std::to_string(covered) + " bytes (the tensors' data; the format allows no unused bytes)",
                   std::to_string(data_size_) + " bytes");
  return Status::ok();
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::span<const std::byte> SafetensorsFile::data(const TensorInfo& info) const {
  ASPEN_CHECK(info.offset <= data_size_ && info.bytes <= data_size_ - info.offset)
      << path_ << ": tensor '" << info.name << "' outside the data section";
  return {data_ + info.offset, info.bytes};
}

Result<Tensor> SafetensorsFile::read(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info)
    return Status::error(Code::kNotFound, path_ + ": tensor " + sq(name), "a tensor of that name",
                         "none among " + std::to_string(tensors_.size()) + " tensors");
  Result<Tensor> t = copy_tensor(path_ + ": tensor " + sq(name), *info, data(*info));
  release(*info);
  return t;
}

// ---------------------------------------------------------------- SafetensorsIndex

Result<SafetensorsIndex> SafetensorsIndex::open(const std::string& index_path) {
  ASPEN_ASSIGN_OR_RETURN(const std::string text, read_regular_file(index_path, kMaxHeaderBytes));
  json j;
  ASPEN_RETURN_IF_ERROR(parse_json(text.data(), text.data() + text.size(), index_path, &j));
  if (!j.is_object()) return corrupt(index_path, "a JSON object", std::string("a JSON ") + j.type_name());
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    return corrupt(index_path + ": weight_map", "an object of tensor name -> shard file", "none or another type");

  SafetensorsIndex idx;
  idx.path_ = index_path;
  if (j.contains("metadata")) {
    const json& md = j["metadata"];
    if (!md.is_object())
      return corrupt(index_path + ": metadata", "an object", std::string("a JSON ") + md.type_name());
    for (auto it = md.begin(); it != md.end(); ++it)
      idx.metadata_[it.key()] = it.value().is_string() ? it.value().get<std::string>() : json_brief(it.value());
  }

  const std::string dir = dirname_of(index_path);
  std::map<std::string, size_t> shard_index;  // shard file name -> index into shards_
  const json& wm = j["weight_map"];
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    const std::string subject = index_path + ": tensor " + sq(it.key());
    if (!it.value().is_string())
      return corrupt(subject, "a shard file name", std::string("a JSON ") + it.value().type_name());
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (shard.empty() || shard[0] == '/' || escapes_directory(shard))
      return corrupt(subject, "a shard path inside the index's directory (no '/' first, no '..')", sq(shard));
    auto found = shard_index.find(shard);
    if (found == shard_index.end()) {
      Result<SafetensorsFile> f = SafetensorsFile::open(dir + shard);
      if (!f.is_ok()) return f.status().with_context(subject + ": shard " + sq(shard));
      idx.shards_.push_back(std::make_unique<SafetensorsFile>(std::move(f).value()));
      found = shard_index.emplace(shard, idx.shards_.size() - 1).first;
    }
    const SafetensorsFile& file = *idx.shards_[found->second];
    if (!file.find(it.key()))
      return Status::error(Code::kNotFound, subject, "to be in shard " + sq(file.path()),
                           "no tensor of that name in the shard");
    idx.shard_of_[it.key()] = found->second;
  }
  return idx;
}

std::vector<std::string> SafetensorsIndex::names() const {
  std::vector<std::string> out;
  out.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) out.push_back(name);
  return out;
}

std::pair<const SafetensorsFile*, const TensorInfo*> SafetensorsIndex::find(const std::string& name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) return {nullptr, nullptr};
  const SafetensorsFile* f = shards_[it->second].get();
  return {f, f->find(name)};
}

Result<Tensor> SafetensorsIndex::read(const std::string& name) const {
  auto [file, info] = find(name);
  if (!file)
    return Status::error(Code::kNotFound, path_ + ": tensor " + sq(name), "a tensor of that name",
                         "none among " + std::to_string(shard_of_.size()) + " tensors");
  return file->read(name);
}

// ---------------------------------------------------------------- writer

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                         const std::map<std::string, std::string>& metadata, FileDigest* digest) {
  std::vector<std::pair<std::string, const Tensor*>> sorted = tensors;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& name = sorted[i].first;
    if (i > 0 && sorted[i - 1].first == name)
      return Status::invalid_argument(path + ": tensor " + sq(name), "unique tensor names", "the name twice");
    if (name == kMetadataKey)
      return Status::invalid_argument(path + ": tensor " + sq(name), "a tensor name other than __metadata__",
                                      "the reserved name");
    if (!sorted[i].second)
      return Status::invalid_argument(path + ": tensor " + sq(name), "a tensor", "a null pointer");
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header[kMetadataKey] = std::move(md);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(dtype_safetensors_name(t->dtype()));
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int64_t d : t->shape()) shape.push_back(d);
    e["shape"] = std::move(shape);
    e["data_offsets"] = {offset, offset + t->nbytes()};
    offset += t->nbytes();
    header[name] = std::move(e);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument(path, "tensor names and metadata in valid UTF-8", e.what());
  }
  while (text.size() % 8 != 0) text.push_back(' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  std::vector<std::string_view> parts = {std::string_view(reinterpret_cast<const char*>(len), 8), text};
  for (const auto& [name, t] : sorted) parts.emplace_back(static_cast<const char*>(t->raw()), t->nbytes());
  if (digest) {
    *digest = {};
    for (std::string_view part : parts) {
      digest->crc32c = crc32c(part, digest->crc32c);
      digest->bytes += part.size();
    }
  }
  return write_file_atomic(path, parts);
}

}  // namespace aspen::io
