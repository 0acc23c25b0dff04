// io/npz_test.cc: numpy's own .npz files (savez and savez_compressed, io/testdata/npz from
// scripts/golden/make_npz_testdata.py), round trips, and damaged archives with their messages.
#include "io/npz.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/file.h"

namespace aspen::io {
namespace {

const std::string kDir = std::string(ASPEN_IO_TESTDATA) + "/npz";

std::string bytes_of(const std::string& file) {
  auto r = read_regular_file(kDir + "/" + file, kMaxBinaryFileBytes);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::string();
}

void expect_numpys_arrays(const std::map<std::string, Tensor>& a) {
  ASSERT_EQ(a.size(), 3u);
  const Tensor& x = a.at("x");
  ASSERT_EQ(x.dtype(), DType::f32);
  ASSERT_EQ(x.shape(), (Shape{3, 4}));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(x.data<float>()[i], float(i) / 4) << i;
  const Tensor& ids = a.at("ids");
  ASSERT_EQ(ids.dtype(), DType::i64);
  EXPECT_EQ(ids.data<int64_t>()[0], 5);
  EXPECT_EQ(ids.data<int64_t>()[1], -1);
  EXPECT_EQ(ids.data<int64_t>()[2], 7);
  const Tensor& flag = a.at("flag");
  ASSERT_EQ(flag.dtype(), DType::boolean);
  EXPECT_EQ(std::string(static_cast<const char*>(flag.raw()), 3), std::string("\1\0\1", 3));
}

void expect_error(const std::string& bytes, Code code, const std::string& part) {
  auto r = parse_npz(bytes, "d.npz");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().to_string().find(part), std::string::npos) << r.status().to_string();
}

TEST(Npz, ReadsNumpysSavez) {
  auto r = read_npz(kDir + "/savez.npz");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_numpys_arrays(*r);
}

TEST(Npz, ReadsNumpysSavezCompressed) {
  auto r = read_npz(kDir + "/savez_compressed.npz");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_numpys_arrays(*r);
}

// numpy.savez through ZIP64 records (widened central-directory sizes, the ZIP64 end record and locator).
TEST(Npz, ReadsZip64Records) {
  auto r = read_npz(kDir + "/zip64.npz");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  expect_numpys_arrays(*r);
  // The counts of the end record all ones, as past 65,535 entries: the ZIP64 end record holds them.
  std::string b = bytes_of("zip64.npz");
  const size_t end = b.rfind(std::string("PK\5\6", 4));
  ASSERT_NE(end, std::string::npos);
  for (size_t i = 8; i < 12; ++i) b[end + i] = char(0xff);
  auto wide = parse_npz(b, "wide.npz");
  ASSERT_TRUE(wide.is_ok()) << wide.status().to_string();
  expect_numpys_arrays(*wide);
  // The ZIP64 end record's offset past the locator: refused, never read out of bounds.
  const size_t loc = b.rfind(std::string("PK\6\7", 4));
  ASSERT_NE(loc, std::string::npos);
  for (int i = 0; i < 8; ++i) b[loc + 8 + size_t(i)] = char(0xff);
  expect_error(b, Code::kCorrupt, "ZIP64 end record");
}

TEST(Npz, WriteThenReadGivesTheSameArrays) {
  std::map<std::string, Tensor> a;
  a.emplace("weights", Tensor(DType::f32, Shape{2, 3}));
  a.emplace("labels", Tensor(DType::i32, Shape{5}));
  a.emplace("empty", Tensor(DType::u8, Shape{0, 4}));
  for (int i = 0; i < 6; ++i) a.at("weights").data<float>()[i] = 0.5f * float(i) - 1;
  for (int i = 0; i < 5; ++i) a.at("labels").data<int32_t>()[i] = i * i;
  const std::string path = ::testing::TempDir() + "/npz_round_trip.npz";
  ASSERT_TRUE(write_npz(path, a).is_ok());
  auto r = read_npz(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 3u);
  for (const auto& [name, t] : a) {
    SCOPED_TRACE(name);
    const Tensor& u = r->at(name);
    EXPECT_EQ(u.dtype(), t.dtype());
    EXPECT_EQ(u.shape(), t.shape());
    EXPECT_EQ(std::memcmp(u.raw(), t.raw(), t.nbytes()), 0);
  }
}

TEST(Npz, DamagedArchivesAreErrorsNamingWhatIsWrong) {
  const std::string stored = bytes_of("savez.npz"), deflated = bytes_of("savez_compressed.npz");
  expect_error("", Code::kCorrupt, "d.npz: file: expected an .npz (ZIP) archive, found 0 bytes");
  expect_error(std::string(100, 'x'), Code::kCorrupt, "an end-of-central-directory record");
  expect_error(stored.substr(0, stored.size() - 30), Code::kCorrupt, "end-of-central-directory");
  {  // a byte of x's data flipped: its CRC-32 no longer matches
    std::string b = stored;
    b[b.find("\x93NUMPY") + 130] ^= 0x40;
    expect_error(b, Code::kCorrupt, "member 'x.npy': CRC-32");
  }
  {  // the deflate stream cut short: the central directory gives it 10 bytes fewer than it has
    std::string b = deflated;
    const size_t c = b.find(std::string("PK\1\2", 4));
    b[c + 20] = char(uint8_t(b[c + 20]) - 10);
    expect_error(b, Code::kCorrupt, "deflate stream: expected 176 bytes, then the stream's end");
  }
  {  // an unknown compression method (12: bzip2)
    std::string b = stored;
    const size_t c = b.find(std::string("PK\1\2", 4));
    b[c + 10] = 12;
    expect_error(b, Code::kUnimplemented, "compression method 0 (stored) or 8 (deflate), found method 12");
  }
  {  // encrypted
    std::string b = stored;
    const size_t c = b.find(std::string("PK\1\2", 4));
    b[c + 8] |= 1;
    expect_error(b, Code::kUnimplemented, "an unencrypted member, found an encrypted one");
  }
  {  // two entries sharing one member's bytes
    std::string b = stored;
    const size_t c1 = b.find(std::string("PK\1\2", 4)), c2 = b.find(std::string("PK\1\2", 4), c1 + 4);
    for (int i = 0; i < 4; ++i) b[c2 + 42 + size_t(i)] = b[c1 + 42 + size_t(i)];
    expect_error(b, Code::kCorrupt, "local header offset: expected one past the bytes of member");
  }
  {  // a member that claims other bytes than it stores, or far more than its deflate stream can hold
    std::string b = stored;
    const size_t c = b.find(std::string("PK\1\2", 4));
    b[c + 27] = 0x7f;  // uncompressed size's top byte
    expect_error(b, Code::kCorrupt, "member 'x.npy': size: expected 176 bytes (stored: its compressed size)");
    std::string d = deflated;
    const size_t e = d.find(std::string("PK\1\2", 4));
    d[e + 27] = 0x7f;
    expect_error(d, Code::kCorrupt, "member 'x.npy': size: expected at most");
  }
  {  // a local header offset past the end
    std::string b = stored;
    const size_t c = b.find(std::string("PK\1\2", 4));
    b[c + 45] = 0x7f;
    expect_error(b, Code::kCorrupt, "local header");
  }
  {  // more entries than the central directory can hold
    std::string b = stored;
    const size_t e = b.rfind(std::string("PK\5\6", 4));
    b[e + 10] = char(0xf0);
    b[e + 11] = 0x00;
    expect_error(b, Code::kCorrupt, "central directory: expected at most");
  }
}

// A 42 MB member that inflates to 40 GiB once ended in an uncaught std::bad_alloc: it is refused before
// anything is allocated, naming the member and both sizes.
TEST(Npz, MembersLargerThanMemoryAreRefusedBeforeInflating) {
  const double memory = 24.0 * (1 << 30);
  EXPECT_TRUE(npz_member_fits("a.npz: member 'x.npy'", uint64_t(1) << 30, 1 << 20, memory).is_ok());
  EXPECT_TRUE(npz_member_fits("a.npz: member 'x.npy'", uint64_t(40) << 30, 42000000, 0).is_ok());  // unknown
  const Status s = npz_member_fits("a.npz: member 'x.npy'", uint64_t(40) << 30, 42000000, memory);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "a.npz: member 'x.npy': expected an array that fits in half of this machine's memory (12884901888 "
            "bytes), found 42949672960 bytes once inflated (42000000 in the file)");
}

// Every truncation and many single-byte flips of both numpy archives: a Status or the arrays, never a crash.
TEST(Npz, TruncatedAndFlippedArchivesNeverCrash) {
  for (const char* f : {"savez.npz", "savez_compressed.npz"}) {
    const std::string b = bytes_of(f);
    for (size_t n = 0; n < b.size(); ++n) (void)parse_npz(b.substr(0, n), f).is_ok();
    for (size_t i = 0; i < b.size(); ++i)
      for (unsigned char bit : {0x01, 0x80, 0xff}) {
        std::string c = b;
        c[i] = char(uint8_t(c[i]) ^ bit);
        auto r = parse_npz(c, f);
        if (r.is_ok()) {  // a flip in a field nobody checks (a date, a version)
          EXPECT_EQ(r->size(), 3u);
        }
      }
  }
}

}  // namespace
}  // namespace aspen::io
