#include "io/safetensors.h"
#include "io/test_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <filesystem>
#include <sstream>

namespace aspen::io {
namespace {

// The tests' scratch directory, removed when the binary exits.
struct TestDir {
  std::string path = ::testing::TempDir() + "aspen_io_test_" + std::to_string(::getpid()) + "/";
  TestDir() { ::mkdir(path.c_str(), 0755); }
  ~TestDir() { std::filesystem::remove_all(path); }
};

std::string test_dir() {
  static const TestDir dir;
  return dir.path;
}

using test_files::read_bytes;
using test_files::write_bytes;


uint64_t header_len(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return n;
}

// A file made of an 8-byte length, `header` verbatim, and `data_bytes` zero bytes.
std::string make_file(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char(uint64_t(header.size()) >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

template <class T>
Tensor filled(Shape shape, T first) {
  Tensor t(dtype_of<T>(), shape);
  auto s = t.span<T>();
  for (size_t i = 0; i < s.size(); ++i) {
    if constexpr (std::is_same_v<T, bool>) s[i] = (i % 3) == 0;
    else if constexpr (std::is_same_v<T, bf16>) s[i] = f32_to_bf16(float(i) * 0.5f - 3.0f);
    else s[i] = T(first + T(i * 7));
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// A small valid file: three tensors, one metadata entry.
std::string small_file() {
  const std::string path = test_dir() + "small.safetensors";
  Tensor a = filled<float>({2, 3}, 1.0f);
  Tensor b = filled<int32_t>({4}, -5);
  Tensor c = filled<uint8_t>({3}, 2);
  Status s = write_safetensors(path, {{"b", &b}, {"a", &a}, {"c", &c}}, {{"format", "pt"}});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return read_bytes(path);
}

TEST(Safetensors, RoundTrip) {
  const std::string path = test_dir() + "round.safetensors";
  Tensor f = filled<float>({3, 5}, -1.25f);
  f.data<float>()[0] = -0.0f;
  Tensor h = filled<bf16>({2, 2, 2}, bf16{});
  Tensor i32 = filled<int32_t>({7}, -100);
  Tensor i64 = filled<int64_t>({2, 3}, int64_t(1) << 40);
  Tensor u8 = filled<uint8_t>({5, 1}, 250);
  Tensor bl = filled<bool>({4}, false);
  Tensor scalar = filled<float>({}, 42.5f);
  Tensor empty = Tensor(DType::f32, {0, 4});
  std::vector<std::pair<std::string, const Tensor*>> in = {
      {"w.f32", &f}, {"w.bf16", &h}, {"w.i32", &i32}, {"w.i64", &i64},
      {"w.u8", &u8}, {"w.bool", &bl}, {"scalar", &scalar}, {"empty", &empty}};
  std::map<std::string, std::string> md = {{"format", "pt"}, {"note", "héllo \"quoted\""}};
  ASSERT_TRUE(write_safetensors(path, in, md).is_ok());

  Result<SafetensorsFile> file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->names(), (std::vector<std::string>{"empty", "scalar", "w.bf16", "w.bool", "w.f32", "w.i32",
                                                     "w.i64", "w.u8"}));
  EXPECT_EQ(file->metadata(), md);
  for (const auto& [name, t] : in) {
    Result<Tensor> r = file->read(name);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(same_bytes(*r, *t)) << name;
    const TensorInfo* info = file->find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->bytes, t->nbytes());
    EXPECT_EQ(file->data(*info).size(), t->nbytes());
  }
  EXPECT_EQ(file->find("scalar")->shape.rank(), 0);
  EXPECT_EQ(file->find("nope"), nullptr);

  // Moving keeps the mapping alive.
  SafetensorsFile moved = std::move(file).value();
  Result<Tensor> again = moved.read("w.i64");
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(same_bytes(*again, i64));
}

TEST(Safetensors, HuggingFaceLayout) {
  const std::string bytes = small_file();
  const uint64_t n = header_len(bytes);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  // Padding is spaces, after the closing brace.
  std::string header = bytes.substr(8, n);
  size_t close = header.find_last_of('}');
  for (size_t i = close + 1; i < header.size(); ++i) EXPECT_EQ(header[i], ' ');
  EXPECT_EQ(header.substr(0, close + 1),
            R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
            R"("b":{"dtype":"I32","shape":[4],"data_offsets":[24,40]},)"
            R"("c":{"dtype":"U8","shape":[3],"data_offsets":[40,43]}})");
  EXPECT_EQ(bytes.size(), 8 + n + 43);
}

TEST(Safetensors, EveryTruncationIsACleanError) {
  const std::string bytes = small_file();
  const std::string path = test_dir() + "trunc.safetensors";
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(path, bytes.substr(0, len));
    Result<SafetensorsFile> f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.is_ok()) << "length " << len;
    EXPECT_TRUE(f.status().code() == Code::kCorrupt || f.status().code() == Code::kInvalidArgument)
        << "length " << len << ": " << f.status().to_string();
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().to_string();
  }
}

TEST(Safetensors, FlippedHeaderBytesGiveAValidFileOrACleanError) {
  const std::string bytes = small_file();
  const uint64_t n = header_len(bytes);
  const std::string path = test_dir() + "flip.safetensors";
  int ok = 0, failed = 0;
  for (size_t i = 0; i < 8 + n; ++i) {
    for (unsigned char mask : {0xFFu, 0x01u, 0x20u}) {
      std::string b = bytes;
      b[i] = char(static_cast<unsigned char>(b[i]) ^ mask);
      write_bytes(path, b);
      Result<SafetensorsFile> f = SafetensorsFile::open(path);
      if (!f.is_ok()) {
        ++failed;
        EXPECT_NE(f.status().code(), Code::kOk);
        EXPECT_NE(f.status().code(), Code::kInternal) << f.status().to_string();
        continue;
      }
      ++ok;
      const uint64_t data_size = b.size() - 8 - header_len(b);
      for (const std::string& name : f->names()) {
        const TensorInfo* info = f->find(name);
        ASSERT_LE(info->offset + info->bytes, data_size) << name;
        Result<Tensor> t = f->read(name);
        EXPECT_TRUE(t.is_ok()) << t.status().to_string();
      }
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(ok, 0);  // e.g. a flipped metadata value or a padding space
}

std::string expect_error(const std::string& name, const std::string& header, size_t data_bytes, Code code) {
  const std::string path = test_dir() + name;
  write_bytes(path, make_file(header, data_bytes));
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.is_ok()) << header;
  EXPECT_EQ(f.status().code(), code) << f.status().to_string();
  return f.status().message();
}

TEST(Safetensors, SpecificMessages) {
  const std::string d = test_dir();
  {
    std::string file = make_file("{}", 0);
    file[0] = char(200);
    write_bytes(d + "long.safetensors", file);
    Result<SafetensorsFile> f = SafetensorsFile::open(d + "long.safetensors");
    ASSERT_FALSE(f.is_ok());
    EXPECT_EQ(f.status().code(), Code::kCorrupt);
    EXPECT_EQ(f.status().message(),
              d + "long.safetensors: header length: expected at most 2 bytes (file size 10 - 8), found 200");
  }
  EXPECT_EQ(expect_error("f64.safetensors", R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16,
                         Code::kUnimplemented),
            d + "f64.safetensors: tensor 'x': expected a dtype this build supports "
                "(F32, BF16, F16, I32, I64, U8, BOOL), found 'F64'");
  EXPECT_EQ(expect_error("junk.safetensors", R"({"x":{"dtype":"Q7","shape":[2],"data_offsets":[0,16]}})", 16,
                         Code::kCorrupt),
            d + "junk.safetensors: tensor 'x': expected a safetensors dtype "
                "(F32, BF16, F16, I32, I64, U8, BOOL), found 'Q7'");
  EXPECT_EQ(expect_error("size.safetensors",
                         R"({"h.0.attn.q_proj.weight":{"dtype":"F32","shape":[64,64],"data_offsets":[0,8192]}})",
                         8192, Code::kCorrupt),
            d + "size.safetensors: tensor 'h.0.attn.q_proj.weight': expected 16384 bytes (f32[64, 64]), found 8192");
  EXPECT_EQ(expect_error("overlap.safetensors",
                         R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                         16, Code::kCorrupt),
            d + "overlap.safetensors: tensor 'b': expected a byte range not overlapping tensor 'a' [0, 16), "
                "found [8, 16)");
  EXPECT_EQ(expect_error("past.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[10,14]}})", 12,
                         Code::kCorrupt),
            d + "past.safetensors: tensor 'a': data_offsets: expected an end within the data section (12 bytes), "
                "found [10, 14]");
  expect_error("neg.safetensors", R"({"a":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", 4, Code::kCorrupt);
  expect_error("extra.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}})", 4,
               Code::kCorrupt);
  expect_error("dup.safetensors",
               R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
               4, Code::kCorrupt);
  expect_error("mdnum.safetensors", R"({"__metadata__":{"n":1}})", 0, Code::kCorrupt);
  expect_error("ovf.safetensors",
               R"({"a":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0, Code::kCorrupt);
  expect_error("notobj.safetensors", "[1,2]", 0, Code::kCorrupt);
  // The format forbids holes between tensors and unused bytes after them.
  EXPECT_EQ(expect_error("gap.safetensors",
                         R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                         12, Code::kCorrupt),
            d + "gap.safetensors: tensor 'b': expected data starting at byte 4 (right after tensor 'a'; the format "
                "allows no gaps), found data_offsets [8, 12)");
  EXPECT_EQ(expect_error("lead.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8,
                         Code::kCorrupt),
            d + "lead.safetensors: tensor 'a': expected data starting at byte 0 (right after the header; the format "
                "allows no gaps), found data_offsets [4, 8)");
  EXPECT_EQ(expect_error("tail.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 9,
                         Code::kCorrupt),
            d + "tail.safetensors: data section: expected 4 bytes (the tensors' data; the format allows no unused "
                "bytes), found 9 bytes");
  EXPECT_EQ(expect_error("mdobj.safetensors", R"({"__metadata__":{"n":{"k":"v"}}})", 0, Code::kCorrupt),
            d + "mdobj.safetensors: __metadata__ 'n': expected a string value, found a JSON object");

  // Empty tensors overlap nothing, even inside another tensor's range.
  const std::string path = d + "emptyin.safetensors";
  write_bytes(path, make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                              R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                              16));
  EXPECT_TRUE(SafetensorsFile::open(path).is_ok());
}

TEST(Safetensors, ReadMissingTensor) {
  small_file();
  const std::string path = test_dir() + "small.safetensors";
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok());
  Result<Tensor> t = f->read("zz");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kNotFound);
  EXPECT_EQ(t.status().message(), path + ": tensor 'zz': expected a tensor of that name, found none among 3 tensors");
}

TEST(Safetensors, MissingFileIsNotFound) {
  Result<SafetensorsFile> f = SafetensorsFile::open(test_dir() + "absent.safetensors");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), Code::kNotFound);
  EXPECT_EQ(f.status().message(),
            test_dir() + "absent.safetensors: expected a readable file, found No such file or directory");
}

TEST(Safetensors, WriterErrors) {
  Tensor a = filled<float>({2}, 1.0f);
  Status dup = write_safetensors(test_dir() + "dup_w.safetensors", {{"a", &a}, {"a", &a}});
  EXPECT_EQ(dup.code(), Code::kInvalidArgument);
  EXPECT_EQ(dup.message(), test_dir() + "dup_w.safetensors: tensor 'a': expected unique tensor names, found the name twice");
  Status io = write_safetensors(test_dir() + "no/such/dir/x.safetensors", {{"a", &a}});
  EXPECT_EQ(io.code(), Code::kIoError);
  EXPECT_NE(io.message().find("no/such/dir/x.safetensors"), std::string::npos);
  EXPECT_NE(io.message().find("No such file or directory"), std::string::npos);
  // A failed write leaves no temp file behind and does not clobber an existing file.
  const std::string keep = test_dir() + "keep.safetensors";
  ASSERT_TRUE(write_safetensors(keep, {{"a", &a}}).is_ok());
  EXPECT_FALSE(write_safetensors(keep, {{"a", &a}, {"a", &a}}).is_ok());
  EXPECT_TRUE(SafetensorsFile::open(keep).is_ok());
  EXPECT_NE(::access((keep + ".tmp." + std::to_string(::getpid())).c_str(), F_OK), 0);
}

TEST(Safetensors, ShardedIndex) {
  const std::string d = test_dir() + "sharded/";
  ::mkdir(d.c_str(), 0755);
  Tensor a = filled<float>({2, 2}, 1.0f), b = filled<int64_t>({3}, 9), c = filled<bf16>({5}, bf16{});
  ASSERT_TRUE(write_safetensors(d + "model-00001-of-00002.safetensors", {{"a", &a}, {"b", &b}}).is_ok());
  ASSERT_TRUE(write_safetensors(d + "model-00002-of-00002.safetensors", {{"c", &c}}).is_ok());
  write_bytes(d + "model.safetensors.index.json", R"({
    "metadata": {"total_size": 82},
    "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  Result<SafetensorsIndex> idx = SafetensorsIndex::open(d + "model.safetensors.index.json");
  ASSERT_TRUE(idx.is_ok()) << idx.status().to_string();
  EXPECT_EQ(idx->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(idx->num_shards(), 2u);
  EXPECT_EQ(idx->metadata().at("total_size"), "82");
  for (auto [name, t] : std::vector<std::pair<std::string, const Tensor*>>{{"a", &a}, {"b", &b}, {"c", &c}}) {
    Result<Tensor> r = idx->read(name);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_TRUE(same_bytes(*r, *t)) << name;
  }
  auto [file, info] = idx->find("c");
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->path(), d + "model-00002-of-00002.safetensors");
  EXPECT_EQ(info->dtype, DType::bf16);
  EXPECT_EQ(idx->find("zz").first, nullptr);
  EXPECT_EQ(idx->read("zz").status().code(), Code::kNotFound);

  // A shard file that does not exist.
  write_bytes(d + "missing.index.json", R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                           "z": "gone.safetensors"}})");
  Result<SafetensorsIndex> missing = SafetensorsIndex::open(d + "missing.index.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().message(), d + "missing.index.json: tensor 'z': shard 'gone.safetensors': " + d +
                                            "gone.safetensors: expected a readable file, found No such file or directory");

  // A shard path that leaves the model directory is refused before anything is opened.
  for (const char* bad : {"../../../x/model.safetensors", "sub/../../model.safetensors", ".."}) {
    write_bytes(d + "escape.index.json", std::string(R"({"weight_map": {"a": ")") + bad + R"("}})");
    Result<SafetensorsIndex> escape = SafetensorsIndex::open(d + "escape.index.json");
    ASSERT_FALSE(escape.is_ok()) << bad;
    EXPECT_EQ(escape.status().code(), Code::kCorrupt);
    EXPECT_EQ(escape.status().message(), d + "escape.index.json: tensor 'a': expected a shard path inside the index's "
                                             "directory (no '/' first, no '..'), found '" + bad + "'");
  }
  // A FIFO named as a shard is refused at once (opening it for reading would block forever).
  ASSERT_EQ(::mkfifo((d + "fifo.safetensors").c_str(), 0600), 0);
  write_bytes(d + "fifo.index.json", R"({"weight_map": {"a": "fifo.safetensors"}})");
  Result<SafetensorsIndex> fifo = SafetensorsIndex::open(d + "fifo.index.json");
  ASSERT_FALSE(fifo.is_ok());
  EXPECT_EQ(fifo.status().message(), d + "fifo.index.json: tensor 'a': shard 'fifo.safetensors': " + d +
                                         "fifo.safetensors: expected a regular file, found a FIFO (named pipe)");
  ::unlink((d + "fifo.safetensors").c_str());

  // A tensor the index maps to a shard that lacks it.
  write_bytes(d + "absent.index.json", R"({"weight_map": {"c": "model-00001-of-00002.safetensors"}})");
  Result<SafetensorsIndex> absent = SafetensorsIndex::open(d + "absent.index.json");
  ASSERT_FALSE(absent.is_ok());
  EXPECT_EQ(absent.status().code(), Code::kNotFound);
  EXPECT_EQ(absent.status().message(), d + "absent.index.json: tensor 'c': expected to be in shard '" + d +
                                           "model-00001-of-00002.safetensors', found no tensor of that name in the shard");
}

}  // namespace
}  // namespace aspen::io
