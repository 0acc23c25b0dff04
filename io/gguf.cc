#include "io/gguf.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/file.h"

namespace aspen::io {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxStringBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxItems = uint64_t(1) << 32;
constexpr int kMaxRank = 4;  // GGML_MAX_DIMS
constexpr int kMaxDepth = 8; // arrays of arrays

std::string sq(const std::string& s) { return "'" + s + "'"; }

Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) {
  return Status::error(Code::kCorrupt, subject, expected, found);
}

// Bounds-checked little-endian reads from the file's bytes.
struct Reader {
  const unsigned char* base;
  uint64_t size, at = 0;
  const std::string& path;

  Status need(uint64_t n, const std::string& what) const {
    if (n > size - at)
      return corrupt(path + ": " + what, std::to_string(n) + " more bytes at offset " + std::to_string(at),
                     "the end of the file (" + std::to_string(size) + " bytes)");
    return Status();
  }
  template <class T>
  Result<T> get(const std::string& what) {
    ASPEN_RETURN_IF_ERROR(need(sizeof(T), what));
    T v;
    std::memcpy(&v, base + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  Result<std::string> string(const std::string& what) {
    ASPEN_ASSIGN_OR_RETURN(const uint64_t n, get<uint64_t>(what + " (its length)"));
    if (n > kMaxStringBytes) return corrupt(path + ": " + what, "at most 2^30 bytes", std::to_string(n) + " bytes");
    ASPEN_RETURN_IF_ERROR(need(n, what));
    std::string s(reinterpret_cast<const char*>(base + at), size_t(n));
    at += n;
    return s;
  }
};

Result<GgufValue> read_value(Reader& r, uint32_t type, const std::string& what, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case 0: { ASPEN_ASSIGN_OR_RETURN(uint8_t x, r.get<uint8_t>(what)); v.kind = GgufValue::Kind::unsigned_integer, v.u = x; break; }
    case 1: { ASPEN_ASSIGN_OR_RETURN(int8_t x, r.get<int8_t>(what)); v.i = x; break; }
    case 2: { ASPEN_ASSIGN_OR_RETURN(uint16_t x, r.get<uint16_t>(what)); v.kind = GgufValue::Kind::unsigned_integer, v.u = x; break; }
    case 3: { ASPEN_ASSIGN_OR_RETURN(int16_t x, r.get<int16_t>(what)); v.i = x; break; }
    case 4: { ASPEN_ASSIGN_OR_RETURN(uint32_t x, r.get<uint32_t>(what)); v.kind = GgufValue::Kind::unsigned_integer, v.u = x; break; }
    case 5: { ASPEN_ASSIGN_OR_RETURN(int32_t x, r.get<int32_t>(what)); v.i = x; break; }
    case 6: { ASPEN_ASSIGN_OR_RETURN(float x, r.get<float>(what)); v.kind = GgufValue::Kind::real, v.f = x; break; }
    case 7: {
      ASPEN_ASSIGN_OR_RETURN(uint8_t x, r.get<uint8_t>(what));
      if (x > 1) return corrupt(r.path + ": " + what, "a bool (0 or 1)", std::to_string(x));
      v.kind = GgufValue::Kind::boolean, v.b = x != 0;
      break;
    }
    case 8: { ASPEN_ASSIGN_OR_RETURN(v.s, r.string(what)); v.kind = GgufValue::Kind::string; break; }
    case 9: {
      if (depth >= kMaxDepth) return corrupt(r.path + ": " + what, "arrays nested at most 8 deep", "deeper");
      ASPEN_ASSIGN_OR_RETURN(const uint32_t item_type, r.get<uint32_t>(what + " (its item type)"));
      ASPEN_ASSIGN_OR_RETURN(const uint64_t n, r.get<uint64_t>(what + " (its length)"));
      if (n > kMaxItems || n > r.size - r.at)  // every item takes at least a byte
        return corrupt(r.path + ": " + what, "an array the file can hold", std::to_string(n) + " items");
      v.kind = GgufValue::Kind::array;
      v.items.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) {
        ASPEN_ASSIGN_OR_RETURN(GgufValue item, read_value(r, item_type, what + "[" + std::to_string(k) + "]", depth + 1));
        v.items.push_back(std::move(item));
      }
      break;
    }
    case 10: { ASPEN_ASSIGN_OR_RETURN(uint64_t x, r.get<uint64_t>(what)); v.kind = GgufValue::Kind::unsigned_integer, v.u = x; break; }
    case 11: { ASPEN_ASSIGN_OR_RETURN(int64_t x, r.get<int64_t>(what)); v.i = x; break; }
    case 12: { ASPEN_ASSIGN_OR_RETURN(double x, r.get<double>(what)); v.kind = GgufValue::Kind::real, v.f = x; break; }
    default:
      return corrupt(r.path + ": " + what, "a GGUF value type (0 to 12)", "type " + std::to_string(type));
  }
  return v;
}

float f16_bits_to_f32(const std::byte* p) {
  f16 h;
  std::memcpy(&h.bits, p, 2);
  return f16_to_f32(h);
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min from Q4_K's 12 packed bytes.
void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::f32: return "F32";
    case GgmlType::f16: return "F16";
    case GgmlType::q4_0: return "Q4_0";
    case GgmlType::q4_1: return "Q4_1";
    case GgmlType::q5_0: return "Q5_0";
    case GgmlType::q5_1: return "Q5_1";
    case GgmlType::q8_0: return "Q8_0";
    case GgmlType::q8_1: return "Q8_1";
    case GgmlType::q2_k: return "Q2_K";
    case GgmlType::q3_k: return "Q3_K";
    case GgmlType::q4_k: return "Q4_K";
    case GgmlType::q5_k: return "Q5_K";
    case GgmlType::q6_k: return "Q6_K";
    case GgmlType::q8_k: return "Q8_K";
    case GgmlType::bf16: return "BF16";
  }
  return "type " + std::to_string(type);
}

std::pair<int64_t, int64_t> ggml_block_layout(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::f32: return {1, 4};
    case GgmlType::f16: return {1, 2};
    case GgmlType::bf16: return {1, 2};
    case GgmlType::q4_0: return {32, 18};
    case GgmlType::q4_1: return {32, 20};
    case GgmlType::q5_0: return {32, 22};
    case GgmlType::q5_1: return {32, 24};
    case GgmlType::q8_0: return {32, 34};
    case GgmlType::q8_1: return {32, 36};
    case GgmlType::q2_k: return {256, 84};
    case GgmlType::q3_k: return {256, 110};
    case GgmlType::q4_k: return {256, 144};
    case GgmlType::q5_k: return {256, 176};
    case GgmlType::q6_k: return {256, 210};
    case GgmlType::q8_k: return {256, 292};
  }
  return {0, 0};
}

Status dequantize_ggml(uint32_t type, std::span<const std::byte> blocks, int64_t n, float* out) {
  const auto [per, bytes] = ggml_block_layout(type);
  if (per == 0 || n < 0 || n % per != 0 || uint64_t(n / per) * uint64_t(bytes) != blocks.size())
    return Status::invalid_argument("dequantize_ggml (" + ggml_type_name(type) + ")",
                                    "whole blocks of a known type, " + std::to_string(bytes) + " bytes per " +
                                        std::to_string(per) + " values",
                                    std::to_string(n) + " values in " + std::to_string(blocks.size()) + " bytes");
  const std::byte* p = blocks.data();
  switch (GgmlType(type)) {
    case GgmlType::f32:
      std::memcpy(out, p, size_t(n) * 4);
      return Status();
    case GgmlType::f16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(p + 2 * i);
      return Status();
    case GgmlType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        bf16 h;
        std::memcpy(&h.bits, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return Status();
    case GgmlType::q8_0:
      for (int64_t b = 0; b < n / 32; ++b, p += 34, out += 32) {
        const float d = f16_bits_to_f32(p);
        const auto* q = reinterpret_cast<const int8_t*>(p + 2);
        for (int j = 0; j < 32; ++j) out[j] = float(q[j]) * d;
      }
      return Status();
    case GgmlType::q4_0:
      for (int64_t b = 0; b < n / 32; ++b, p += 18, out += 32) {
        const float d = f16_bits_to_f32(p);
        const auto* q = reinterpret_cast<const uint8_t*>(p + 2);
        for (int j = 0; j < 16; ++j) {
          out[j] = float(int(q[j] & 0xF) - 8) * d;
          out[j + 16] = float(int(q[j] >> 4) - 8) * d;
        }
      }
      return Status();
    case GgmlType::q4_k:
      for (int64_t b = 0; b < n / 256; ++b, p += 144) {
        const float d = f16_bits_to_f32(p), dmin = f16_bits_to_f32(p + 2);
        const auto* scales = reinterpret_cast<const uint8_t*>(p + 4);
        const auto* q = reinterpret_cast<const uint8_t*>(p + 16);
        for (int j = 0; j < 8; j += 2, q += 32) {
          uint8_t sc, m;
          scale_min_k4(j, scales, &sc, &m);
          const float d1 = d * float(sc), m1 = dmin * float(m);
          scale_min_k4(j + 1, scales, &sc, &m);
          const float d2 = d * float(sc), m2 = dmin * float(m);
          // Products and differences rounded one at a time, as ggml's reference: io/CMakeLists.txt compiles this
          // file with -ffp-contract=off, so no build fuses them into one multiply-add.
          for (int l = 0; l < 32; ++l) *out++ = d1 * float(q[l] & 0xF) - m1;
          for (int l = 0; l < 32; ++l) *out++ = d2 * float(q[l] >> 4) - m2;
        }
      }
      return Status();
    case GgmlType::q5_k:  // ggml's dequantize_row_q5_K: {d, dmin, scales[12], qh[32], qs[128]}
      for (int64_t b = 0; b < n / 256; ++b, p += 176) {
        const float d = f16_bits_to_f32(p), dmin = f16_bits_to_f32(p + 2);
        const auto* scales = reinterpret_cast<const uint8_t*>(p + 4);
        const auto* qh = reinterpret_cast<const uint8_t*>(p + 16);
        const auto* q = reinterpret_cast<const uint8_t*>(p + 48);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, q += 32, u1 = uint8_t(u1 << 2), u2 = uint8_t(u2 << 2)) {
          uint8_t sc, m;
          scale_min_k4(j, scales, &sc, &m);
          const float d1 = d * float(sc), m1 = dmin * float(m);
          scale_min_k4(j + 1, scales, &sc, &m);
          const float d2 = d * float(sc), m2 = dmin * float(m);
          for (int l = 0; l < 32; ++l) *out++ = d1 * float((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
          for (int l = 0; l < 32; ++l) *out++ = d2 * float((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
      }
      return Status();
    case GgmlType::q6_k:  // ggml's dequantize_row_q6_K: {ql[128], qh[64], scales[16] (int8), d}
      for (int64_t b = 0; b < n / 256; ++b, p += 210) {
        const float d = f16_bits_to_f32(p + 208);
        const auto* ql = reinterpret_cast<const uint8_t*>(p);
        const auto* qh = reinterpret_cast<const uint8_t*>(p + 128);
        const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
        for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, out += 128)
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0 & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2 & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
            out[l] = d * float(sc[is]) * float(q1);
            out[l + 32] = d * float(sc[is + 2]) * float(q2);
            out[l + 64] = d * float(sc[is + 4]) * float(q3);
            out[l + 96] = d * float(sc[is + 6]) * float(q4);
          }
      }
      return Status();
    default:
      return Status::error(Code::kUnimplemented, "dequantize_ggml", "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K or Q6_K",
                           ggml_type_name(type));
  }
}

Shape GgufTensor::shape() const {
  std::vector<int64_t> d(extents.rbegin(), extents.rend());
  return Shape::make(d.data(), int(d.size())).value();
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t e : extents) n *= e;
  return n;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  ASPEN_ASSIGN_OR_RETURN(f.file_, FileBytes::open(path, kMaxBinaryFileBytes));
  ASPEN_RETURN_IF_ERROR(f.parse());
  return f;
}

Result<GgufFile> GgufFile::from_bytes(std::span<const std::byte> bytes, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  f.file_ = FileBytes::copy(bytes);
  ASPEN_RETURN_IF_ERROR(f.parse());
  return f;
}

Status GgufFile::parse() {
  const auto* base = reinterpret_cast<const unsigned char*>(file_.data());
  const uint64_t size = file_.size();
  Reader r{base, size, 0, path_};
  ASPEN_ASSIGN_OR_RETURN(const uint32_t magic, r.get<uint32_t>("the magic"));
  if (magic != kMagic) {
    std::string found(reinterpret_cast<const char*>(base), 4);
    for (char& c : found) if (c < 32 || c > 126) c = '?';
    return corrupt(path_, "a GGUF file (its first bytes 'GGUF')", "'" + found + "'");
  }
  ASPEN_ASSIGN_OR_RETURN(version_, r.get<uint32_t>("the version"));
  if (version_ != 2 && version_ != 3)
    return Status::error(Code::kUnimplemented, path_ + ": GGUF version", "2 or 3", std::to_string(version_));
  ASPEN_ASSIGN_OR_RETURN(const uint64_t n_tensors, r.get<uint64_t>("the tensor count"));
  ASPEN_ASSIGN_OR_RETURN(const uint64_t n_kv, r.get<uint64_t>("the metadata count"));
  if (n_kv > size || n_tensors > size)  // each takes more than a byte
    return corrupt(path_, "counts the file can hold", std::to_string(n_tensors) + " tensors, " +
                                                          std::to_string(n_kv) + " metadata entries in " +
                                                          std::to_string(size) + " bytes");
  for (uint64_t k = 0; k < n_kv; ++k) {
    ASPEN_ASSIGN_OR_RETURN(std::string key, r.string("metadata entry " + std::to_string(k) + "'s key"));
    ASPEN_ASSIGN_OR_RETURN(const uint32_t type, r.get<uint32_t>("metadata " + sq(key) + "'s type"));
    ASPEN_ASSIGN_OR_RETURN(GgufValue v, read_value(r, type, "metadata " + sq(key), 0));
    if (!metadata_.emplace(key, std::move(v)).second)
      return corrupt(path_ + ": metadata " + sq(key), "unique keys", "the key twice");
  }
  uint64_t alignment = 32;
  if (const GgufValue* a = find_metadata("general.alignment")) {
    const uint64_t v = a->kind == GgufValue::Kind::unsigned_integer ? a->u
                       : a->kind == GgufValue::Kind::integer && a->i > 0 ? uint64_t(a->i) : 0;
    if (v == 0 || (v & (v - 1)) != 0 || v > 65536)
      return corrupt(path_ + ": metadata 'general.alignment'", "a power of two up to 65536", "another value");
    alignment = v;
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    ASPEN_ASSIGN_OR_RETURN(t.name, r.string("tensor " + std::to_string(k) + "'s name"));
    const std::string what = "tensor " + sq(t.name);
    ASPEN_ASSIGN_OR_RETURN(const uint32_t rank, r.get<uint32_t>(what + "'s rank"));
    if (rank < 1 || rank > kMaxRank)
      return corrupt(path_ + ": " + what, "1 to 4 extents", std::to_string(rank));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      ASPEN_ASSIGN_OR_RETURN(const uint64_t e, r.get<uint64_t>(what + "'s extents"));
      if (e < 1 || e > (uint64_t(1) << 40) || numel > (uint64_t(1) << 50) / e)
        return corrupt(path_ + ": " + what, "extents >= 1 with fewer than 2^50 values", "extent " + std::to_string(e));
      numel *= e;
      t.extents.push_back(int64_t(e));
    }
    ASPEN_ASSIGN_OR_RETURN(t.type, r.get<uint32_t>(what + "'s type"));
    ASPEN_ASSIGN_OR_RETURN(t.offset, r.get<uint64_t>(what + "'s offset"));
    const auto [per, bytes] = ggml_block_layout(t.type);
    if (per == 0) return corrupt(path_ + ": " + what, "a ggml type", ggml_type_name(t.type));
    if (uint64_t(t.extents[0]) % uint64_t(per) != 0)
      return corrupt(path_ + ": " + what, "rows of whole " + ggml_type_name(t.type) + " blocks (" +
                                              std::to_string(per) + " values)",
                     "rows of " + std::to_string(t.extents[0]));
    t.bytes = numel / uint64_t(per) * uint64_t(bytes);
    if (t.offset % alignment != 0)
      return corrupt(path_ + ": " + what, "an offset aligned to " + std::to_string(alignment),
                     std::to_string(t.offset));
    if (!index_.emplace(t.name, tensors_.size()).second)
      return corrupt(path_ + ": " + what, "unique tensor names", "the name twice");
    tensors_.push_back(std::move(t));
  }
  data_start_ = (r.at + alignment - 1) / alignment * alignment;
  if (data_start_ > size && !tensors_.empty())
    return corrupt(path_, "a data section after the tensor descriptions", "the end of the file");
  const uint64_t data_size = data_start_ <= size ? size - data_start_ : 0;
  std::vector<std::pair<uint64_t, size_t>> ranges;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const GgufTensor& t = tensors_[k];
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      return corrupt(path_ + ": tensor " + sq(t.name),
                     "its " + std::to_string(t.bytes) + " bytes inside the data section (" + std::to_string(data_size) +
                         " bytes)",
                     "offset " + std::to_string(t.offset));
    ranges.emplace_back(t.offset, k);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const GgufTensor& prev = tensors_[ranges[k - 1].second];
    if (prev.offset + prev.bytes > ranges[k].first)
      return corrupt(path_ + ": tensor " + sq(tensors_[ranges[k].second].name), "bytes of its own",
                     "bytes that overlap tensor " + sq(prev.name) + "'s");
  }
  return Status();
}

const GgufValue* GgufFile::find_metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> GgufFile::data(const GgufTensor& t) const {
  return file_.bytes().subspan(size_t(data_start_ + t.offset), size_t(t.bytes));
}

Result<Tensor> GgufFile::read_f32(const std::string& name) const {
  const GgufTensor* t = find(name);
  if (!t) return Status::error(Code::kNotFound, path_ + ": tensor " + sq(name), "a tensor of that name", "none");
  ASPEN_ASSIGN_OR_RETURN(Tensor out, Tensor::make(DType::f32, t->shape()));
  ASPEN_RETURN_IF_ERROR(Status(dequantize_ggml(t->type, data(*t), t->numel(), out.data<float>()))
                            .with_context(path_ + ": tensor " + sq(name)));
  return out;
}

}  // namespace aspen::io
