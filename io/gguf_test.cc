// io/gguf_test.cc: a GGUF file llama.cpp's own Python package wrote (io/testdata/gguf, from
// scripts/golden/make_gguf_testdata.py): its metadata, and every tensor's values equal to that package's
// dequantization, value for value (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K); damaged files refused by name.
#include "io/gguf.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/file.h"
#include "io/npz.h"

namespace aspen::io {
namespace {

const std::string kDir = std::string(ASPEN_IO_TESTDATA) + "/gguf";

std::string file_bytes() {
  auto r = read_regular_file(kDir + "/tiny.gguf", kMaxBinaryFileBytes);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::string();
}

Result<GgufFile> parse(const std::string& bytes) {
  return GgufFile::from_bytes(std::as_bytes(std::span(bytes.data(), bytes.size())), "t.gguf");
}

TEST(Gguf, MetadataAndTensorsOfLlamaCppsWriter) {
  auto f = GgufFile::open(kDir + "/tiny.gguf");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->find_metadata("general.architecture")->s, "llama");
  EXPECT_EQ(f->find_metadata("tiny.u32")->u, 7u);
  EXPECT_EQ(f->find_metadata("tiny.i32")->i, -3);
  EXPECT_EQ(f->find_metadata("tiny.f32")->f, 0.25);
  EXPECT_TRUE(f->find_metadata("tiny.bool")->b);
  EXPECT_EQ(f->find_metadata("tiny.string")->s, "h\xc3\xa9llo");
  const GgufValue* strings = f->find_metadata("tiny.strings");
  ASSERT_EQ(strings->items.size(), 3u);
  EXPECT_EQ(strings->items[1].s, "bc");
  EXPECT_EQ(strings->items[2].s, "");
  EXPECT_EQ(f->find_metadata("tiny.ints")->items[1].i, -2);
  EXPECT_EQ(f->find_metadata("tiny.u64")->u, uint64_t(1) << 40);
  EXPECT_EQ(f->find_metadata("tiny.f64")->f, -1.5);
  EXPECT_EQ(f->find_metadata("nope"), nullptr);
  ASSERT_EQ(f->tensors().size(), 8u);
  const GgufTensor* q4k = f->find("blocks.q4_k");
  ASSERT_NE(q4k, nullptr);
  EXPECT_EQ(q4k->type, uint32_t(GgmlType::q4_k));
  EXPECT_EQ(q4k->shape(), (Shape{2, 512}));
  EXPECT_EQ(q4k->bytes, 2u * 2u * 144u);
  EXPECT_EQ(ggml_type_name(q4k->type), "Q4_K");

  auto expected = read_npz(kDir + "/tiny.expected.npz");
  ASSERT_TRUE(expected.is_ok()) << expected.status().to_string();
  ASSERT_EQ(expected->size(), 8u);
  for (const auto& [name, want] : *expected) {
    SCOPED_TRACE(name);
    auto got = f->read_f32(name);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    ASSERT_EQ(got->shape(), want.shape());
    ASSERT_EQ(want.dtype(), DType::f32);
    int differ = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      differ += std::memcmp(&got->data<float>()[i], &want.data<float>()[i], 4) != 0;
    EXPECT_EQ(differ, 0) << "of " << want.numel();
  }
  auto missing = f->read_f32("blocks.q2_k");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
}

// Every prefix of the file is refused with an error (never a crash or a read past the end), and damaged
// headers name what is wrong.
TEST(Gguf, DamagedFilesAreRefusedByName) {
  const std::string good = file_bytes();
  ASSERT_FALSE(good.empty());
  ASSERT_TRUE(parse(good).is_ok());
  // The last tensor's data ends the file: shorter files cut it (or the header) off.
  for (size_t n = 0; n < good.size(); ++n) {
    auto r = parse(good.substr(0, n));
    ASSERT_FALSE(r.is_ok()) << n;
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << n << ": " << r.status().to_string();
  }
  auto expect = [&](std::string bytes, Code code, const std::string& part) {
    auto r = parse(bytes);
    ASSERT_FALSE(r.is_ok()) << part;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().to_string().find(part), std::string::npos) << r.status().to_string();
  };
  std::string bad = good;
  bad[0] = 'X';
  expect(bad, Code::kCorrupt, "a GGUF file");
  bad = good;
  bad[4] = 1;  // version 1
  expect(bad, Code::kUnimplemented, "GGUF version");
  // A tensor's type: find "blocks.q4_k"'s description (name, rank 2, two extents, then the type).
  const size_t at = good.find("blocks.q4_k");
  ASSERT_NE(at, std::string::npos);
  const size_t type_at = at + 11 + 4 + 16;
  bad = good;
  bad[type_at] = 99;
  expect(bad, Code::kCorrupt, "tensor 'blocks.q4_k'");
  bad = good;
  bad[type_at] = char(GgmlType::q8_0);  // 512-value rows of Q8_0 need more bytes than the file has
  expect(bad, Code::kCorrupt, "inside the data section");
  bad = good;
  bad[at + 11 + 4 + 1] = 0;  // an extent of 0 (512 is 0x200)
  expect(bad, Code::kCorrupt, "extents >= 1");
  bad = good;
  bad[at + 11 + 4] = 100;  // 100 values a row: not whole Q4_K blocks
  expect(bad, Code::kCorrupt, "rows of whole Q4_K blocks");
  // Offsets: the q4_k tensor's moved onto the q4_0 tensor's bytes.
  const size_t offset_at = type_at + 4;
  uint64_t offset = 0;
  std::memcpy(&offset, good.data() + offset_at, 8);
  bad = good;
  const uint64_t moved = offset - 128;
  std::memcpy(bad.data() + offset_at, &moved, 8);
  expect(bad, Code::kCorrupt, "overlap");
  const uint64_t unaligned = offset + 4;
  bad = good;
  std::memcpy(bad.data() + offset_at, &unaligned, 8);
  expect(bad, Code::kCorrupt, "aligned to 32");
}

TEST(Gguf, DequantizeChecksItsArguments) {
  std::vector<std::byte> block(34);
  std::vector<float> out(64);
  EXPECT_TRUE(dequantize_ggml(uint32_t(GgmlType::q8_0), block, 32, out.data()).is_ok());
  EXPECT_FALSE(dequantize_ggml(uint32_t(GgmlType::q8_0), block, 64, out.data()).is_ok());  // 2 blocks' values
  EXPECT_FALSE(dequantize_ggml(uint32_t(GgmlType::q8_0), block, 31, out.data()).is_ok());
  std::vector<float> big(256);
  auto r = dequantize_ggml(uint32_t(GgmlType::q3_k), std::vector<std::byte>(110), 256, big.data());
  EXPECT_EQ(r.code(), Code::kUnimplemented);
  EXPECT_NE(r.to_string().find("Q3_K"), std::string::npos);
}

}  // namespace
}  // namespace aspen::io
