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

// Headers numpy itself reads (np.load: the dict through ast.literal_eval, the dtype through np.dtype)
// are read as numpy reads them: either quote, spaces around ':', dtype aliases, big-endian bytes and
// Fortran order.
TEST(Npy, ReadsEveryHeaderNumpyReads) {
  auto file = [](const std::string& dict, const std::string& data) {
    std::string b("\x93NUMPY\x01\x00", 8);
    b += char(dict.size() + 1);
    b += char(0);
    return b + dict + "\n" + data;
  };
  std::string little, big, fortran;
  for (int i = 0; i < 6; ++i) {
    const float v = float(i);
    std::string bytes(reinterpret_cast<const char*>(&v), 4);
    little += bytes;
    big += std::string(bytes.rbegin(), bytes.rend());
  }
  for (int i : {0, 3, 1, 4, 2, 5}) fortran += little.substr(size_t(i) * 4, 4);  // columns of [[0 1 2] [3 4 5]]
  const std::pair<std::string, std::string> cases[] = {
      {R"({"descr": "<f4", "fortran_order": False, "shape": (2, 3)})", little},
      {"{'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }", little},
      {"{'shape': (2, 3), 'fortran_order': False, 'descr': 'f4'}", little},
      {"{'descr': 'float32', 'fortran_order': False, 'shape': (+2, 0x3)}", little},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3)}", big},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", fortran},
  };
  for (const auto& [dict, data] : cases) {
    SCOPED_TRACE(dict);
    auto r = parse_npy(file(dict, data), "n.npy");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(r->dtype(), DType::f32);
    ASSERT_EQ(r->shape(), (Shape{2, 3}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(r->span<float>()[size_t(i)], float(i));
  }
  auto b = parse_npy(file("{'descr': '?', 'fortran_order': True, 'shape': (3,)}", std::string("\x01\x00\x01", 3)),
                     "b.npy");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->dtype(), DType::boolean);
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
      {with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }") + "abcdefgh",
       "dtype: expected one aspen reads (float32, float16, int32, int64, uint8 or bool, as '<f4', '<f2', '<i4', "
       "'<i8', '|u1', '|b1'), found '<c8'"},
      {with_header("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (1,), }") + "abcdefgh",
       "dtype: expected one aspen reads (float32, float16, int32, int64, uint8 or bool, as '<f4', '<f2', '<i4', "
       "'<i8', '|u1', '|b1'), found a structured dtype [('a', '<f4'), ('b', '<i4')]"},
      {with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }") + "abcdefgh",
       "dtype: expected one aspen reads (float32, float16, int32, int64, uint8 or bool, as '<f4', '<f2', '<i4', "
       "'<i8', '|u1', '|b1'), found '<f8' (hint: aspen has no float64: save the array as float32"},
      {with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }") + "abcd",
       "fortran_order: expected True or False, found 0"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
       "header: expected a non-negative integer extent at byte 51, found '-1,), }'"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': [2], }"),
       "shape: expected a tuple, found [2]"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"),
       "header: expected the keys 'descr', 'fortran_order' and 'shape' (numpy's), found 'x'"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': None}"),
       "header: expected a string, True, False or a tuple at byte 61, found 'None}'"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 'y'}") + "abcd",
       "header: expected the keys 'descr', 'fortran_order' and 'shape' (numpy's), found 'x'"},
      {with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,) 'x'}"),
       "header: expected ',' or '}' at byte"},
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
