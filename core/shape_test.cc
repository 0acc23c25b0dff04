#include "core/shape.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "core/tensor.h"

namespace aspen {
namespace {

TEST(Shape, Basics) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s.stride(0), 12);
  EXPECT_EQ(s.stride(2), 1);
  EXPECT_EQ(s.to_string(), "[2, 3, 4]");
  EXPECT_EQ(Shape().numel(), 1);
  EXPECT_EQ(Shape({0, 5}).numel(), 0);
  EXPECT_EQ(s, (Shape{2, 3, 4}));
  EXPECT_NE(s, (Shape{2, 3}));
}

TEST(Shape, MakeRejectsBadInput) {
  int64_t neg[] = {2, -1};
  Result<Shape> r = Shape::make(neg, 2);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "shape: expected non-negative extents, found extent -1 at dimension 1");
  int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 40};
  EXPECT_EQ(Shape::make(huge, 2).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Shape::make(neg, 9).status().message(), "shape: expected rank 0..8, found rank 9");
  int64_t zero_first[] = {0, int64_t(1) << 40, int64_t(1) << 40};  // no elements, but strides overflow
  EXPECT_EQ(Shape::make(zero_first, 3).status().message(),
            "shape: expected an element count that fits in 63 bits, found an overflow");
}

TEST(Tensor, AlignedZeroedTyped) {
  Tensor t(DType::f32, Shape{3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  EXPECT_EQ(t.nbytes(), 60u);
  for (float v : t.span<float>()) EXPECT_EQ(v, 0.0f);
  t.data<float>()[4] = 2.5f;
  Tensor c = t.clone();
  EXPECT_EQ(c.data<float>()[4], 2.5f);
  Tensor e(DType::bf16, Shape{0});
  EXPECT_EQ(e.nbytes(), 0u);
}

TEST(Tensor, ViewBorrowsWithoutCopyOrFree) {
  float owner[6] = {1, 2, 3, 4, 5, 6};
  {
    Tensor v = Tensor::view(DType::f32, Shape{2, 3}, owner);
    EXPECT_FALSE(v.owns_data());
    EXPECT_EQ(v.raw(), static_cast<void*>(owner));
    EXPECT_EQ(v.data<float>()[5], 6.0f);
    Tensor c = v.clone();
    EXPECT_TRUE(c.owns_data());
    EXPECT_NE(c.raw(), static_cast<void*>(owner));
    EXPECT_EQ(c.data<float>()[5], 6.0f);
    Tensor moved = std::move(v);
    EXPECT_FALSE(moved.owns_data());
  }  // destroying the views frees nothing (ASan would report freeing a stack array)
  EXPECT_EQ(owner[0], 1.0f);
}

// NOTE [tensor block cache]: a large tensor's block, freed, comes back for the next tensor of its size (not
// under a sanitizer), and make() zeroes it again; other sizes and small tensors go to malloc.
TEST(Tensor, LargeBlocksAreReusedAndMadeZeroAgain) {
  const Shape big{1 << 18};  // 1 MiB of f32
  void* first = nullptr;
  {
    Tensor t(DType::f32, big);
    first = t.raw();
    for (float& v : t.span<float>()) v = 7.0f;
  }
  Tensor again(DType::f32, big);
  for (float v : again.span<float>()) ASSERT_EQ(v, 0.0f);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_EQ(again.raw(), first);
#else
  (void)first;  // sanitizers: no cache, any block
#endif
  Tensor other(DType::f32, Shape{(1 << 18) + 16});  // another size: not that block
  EXPECT_NE(other.raw(), again.raw());
  auto raw = Tensor::make_uninitialized(DType::u8, Shape{int64_t(1) << 20});
  ASSERT_TRUE(raw.is_ok());
  EXPECT_NE(raw->raw(), nullptr);
}

TEST(Tensor, MakeReportsOverflow) {
  int64_t dims[] = {int64_t(1) << 31, int64_t(1) << 30};
  Result<Tensor> r = Tensor::make(DType::i64, *Shape::make(dims, 2));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "tensor [2147483648, 1073741824]: expected a size that fits in memory, found an overflow");
}

TEST(TensorDeathTest, WrongTypedAccessAborts) {
  Tensor t(DType::bf16, Shape{2});
  EXPECT_DEATH((void)t.data<float>(), "data<f32> of a bf16 tensor");
}

}  // namespace
}  // namespace aspen
