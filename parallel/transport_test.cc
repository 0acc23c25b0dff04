#include "parallel/transport.h"

#include <gtest/gtest.h>

#include <thread>

namespace aspen::parallel {
namespace {

Tensor filled(float v) {
  Tensor t(DType::f32, Shape{3});
  for (float& x : t.span<float>()) x = v;
  return t;
}

// A message waits in the box until taken, by its key; puts never wait.
TEST(ThreadsTransport, TakesEachMessageByItsKey) {
  ThreadsTransport tr(std::chrono::seconds(5));
  ASSERT_TRUE(tr.put({.edge = 0, .micro = 1, .grad = false}, 1, filled(1.0f)).is_ok());
  ASSERT_TRUE(tr.put({.edge = 0, .micro = 1, .grad = true}, 0, filled(2.0f)).is_ok());
  EXPECT_EQ(tr.pending(), 2u);
  Result<Tensor> g = tr.take({.edge = 0, .micro = 1, .grad = true}, 1, DType::f32, Shape{3}, "stage 0");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->data<float>()[2], 2.0f);
  // A take from another thread waits for the put.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(tr.put({.edge = 1, .micro = 0, .grad = false}, 1, filled(3.0f)).is_ok());
  });
  Result<Tensor> a = tr.take({.edge = 1, .micro = 0, .grad = false}, 0, DType::f32, Shape{3}, "stage 1");
  later.join();
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->data<float>()[0], 3.0f);
  EXPECT_EQ(tr.pending(), 1u);  // micro-batch 1's activation was never taken
  EXPECT_TRUE(tr.flush().is_ok());
}

TEST(ThreadsTransport, ATimeoutNamesWhoWaitedAndFailsTheOthers) {
  ThreadsTransport tr(std::chrono::milliseconds(30));
  Result<Tensor> t = tr.take({.edge = 2, .micro = 0, .grad = false}, 0, DType::f32, Shape{3}, "stage 1, forward m0");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kDeadlineExceeded);
  EXPECT_NE(t.status().message().find("stage 1, forward m0"), std::string::npos) << t.status().to_string();
  // Later takes fail at once with the first failure's reason, even for a message that is there.
  ASSERT_TRUE(tr.put({.edge = 2, .micro = 1, .grad = false}, 1, filled(1.0f)).is_ok());
  Result<Tensor> u = tr.take({.edge = 2, .micro = 1, .grad = false}, 0, DType::f32, Shape{3}, "stage 1, forward m1");
  ASSERT_FALSE(u.is_ok());
  EXPECT_EQ(u.status().code(), Code::kAborted);
  EXPECT_NE(u.status().message().find("waited longer than 30 ms"), std::string::npos) << u.status().to_string();
}

TEST(ThreadsTransport, FailWakesAWaitingTake) {
  ThreadsTransport tr(std::chrono::seconds(30));
  std::thread failer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    tr.fail("device 2: out of memory");
  });
  const auto t0 = std::chrono::steady_clock::now();
  Result<Tensor> t = tr.take({.edge = 0, .micro = 0, .grad = true}, 1, DType::f32, Shape{3}, "stage 0");
  failer.join();
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kAborted);
  EXPECT_NE(t.status().message().find("device 2: out of memory"), std::string::npos) << t.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(ThreadsTransport, AWrongTypeIsAnError) {
  ThreadsTransport tr(std::chrono::seconds(5));
  ASSERT_TRUE(tr.put({.edge = 0, .micro = 0, .grad = false}, 1, filled(1.0f)).is_ok());
  Result<Tensor> t = tr.take({.edge = 0, .micro = 0, .grad = false}, 0, DType::f32, Shape{4}, "stage 1");
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("f32[4]"), std::string::npos) << t.status().to_string();
}

}  // namespace
}  // namespace aspen::parallel
