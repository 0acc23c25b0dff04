// io/npy_test.cc: .npy round trips, numpy's own bytes, and malformed files, with their messages.
#include "io/npy.h"

#include <gtest/gtest.h>

namespace aspen::io {
namespace {

TEST(Npy, RoundTripsEveryDtype) {
  for (DType dt : {DType::f32, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    for (const Shape& s : {Shape{}, Shape{3}, Shape{2, 0, 5}, Shape{2, 3, 1}}) {
      Tensor t(dt, s);
      uint8_t* p = static_cast<uint8_t*>(t.raw());
      for (size_t i = 0; i < t.nbytes(); ++i) p[i] = dt == DType::boolean ? uint8_t(i % 2) : uint8_t(i * 7 + 1);
      const std::string b = npy_bytes(t);
      EXPECT_EQ((b.find('\n') + 1) % 64, 0u) << "numpy aligns the data to 64 bytes";
      auto r = parse_npy(b, "t.npy");
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->dtype(), dt);
      EXPECT_EQ(r->shape(), s);
      EXPECT_EQ(std::memcmp(r->raw(), t.raw(), t.nbytes()), 0);
    }
  }
}

// np.save of np.arange(6, dtype='<i8').reshape(2, 3), byte for byte.
TEST(Npy, ReadsNumpysBytes) {
  std::string b("\x93NUMPY\x01\x00\x76\x00", 10);
  const std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }";
  b += dict;
  b.append(0x76 - 1 - dict.size(), ' ');  // numpy pads the header to 128 bytes with the magic
  b += '\n';
  for (int64_t v = 0; v < 6; ++v) b.append(reinterpret_cast<const char*>(&v), 8);
  auto r = parse_npy(b, "a.npy");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->shape(), (Shape{2, 3}));
  EXPECT_EQ(r->span<int64_t>()[5], 5);
}

TEST(Npy, MalformedFilesAreNamedErrors) {
  Tensor t(DType::f32, Shape{2, 2});
  const std::string good = npy_bytes(t);
  auto with_header = [&](const std::string& dict) {
    std::string b("\x93NUMPY\x01\x00", 8);
    b += char(dict.size() + 1);
    b += char(0);
    return b + dict + "\n";
  };
  const std::pair<std::string, std::string> cases[] = {
      {"", "file: expected a .npy file"},
      {good.substr(0, good.size() - 3), "data: expected 16 bytes (shape (2, 2)), found 13 bytes"},
      {with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }") + "abcd",
       "dtype: expected one aspen reads"},
      {with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }") + "abcd",
       "fortran_order: expected False"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
       "shape: expected non-negative integer extents"},
      {with_header("{'descr': '<f4', 'fortran_order': False}"), "header: expected a 'shape' entry"},
      {with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }") + "\x01\x07", "data: expected bools"},
      {std::string("\x93NUMPY\x01\x00\xff\xff", 10), "header length: expected at most 0 bytes, found 65535"},
  };
  for (const auto& [bytes, message] : cases) {
    auto r = parse_npy(bytes, "bad.npy");
    ASSERT_FALSE(r.is_ok()) << message;
    EXPECT_NE(r.status().message().find("bad.npy: " + message), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace aspen::io
