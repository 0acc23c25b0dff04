#include "core/status.h"

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/log.h"

namespace aspen {
namespace {

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.message(), "ok");
}

TEST(Status, MessageNamesSubjectExpectedFound) {
  Status s = Status::invalid_argument("matmul: argument 'a'", "at least 12 elements", "6", "check K");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "matmul: argument 'a': expected at least 12 elements, found 6 (hint: check K)");
  EXPECT_EQ(s.to_string(), "InvalidArgument: " + s.message());
  Status c = Status(s).with_context("layer 3");
  EXPECT_EQ(c.subject(), "layer 3: matmul: argument 'a'");
  EXPECT_EQ(c.code(), Code::kInvalidArgument);
}

Result<int> parse_positive(int x) {
  if (x <= 0) return Status::invalid_argument("x", "> 0", std::to_string(x));
  return x;
}

Status twice(int x, int* out) {
  ASPEN_ASSIGN_OR_RETURN(int v, parse_positive(x));
  *out = 2 * v;
  return Status();
}

TEST(Result, ValueOrError) {
  int out = 0;
  EXPECT_TRUE(twice(4, &out).is_ok());
  EXPECT_EQ(out, 8);
  Status s = twice(-1, &out);
  EXPECT_EQ(s.message(), "x: expected > 0, found -1");
}

TEST(Result, OkStatusIsNotAValue) {
  Result<int> r{Status()};
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r = parse_positive(0);
  EXPECT_DEATH((void)r.value(), "x: expected > 0, found 0");
}

TEST(CheckDeathTest, AbortsWithContext) {
  EXPECT_DEATH(ASPEN_CHECK(1 + 1 == 3) << "arith " << 42, "check failed: 1 \\+ 1 == 3 arith 42");
}

TEST(Log, LevelFiltersAndSinkReceives) {
  std::vector<std::string> got;
  LogSink old = set_log_sink([&](LogLevel, const std::string& m) { got.push_back(m); });
  LogLevel saved = log_level();
  set_log_level(LogLevel::warning);
  ASPEN_LOG(info) << "hidden";
  ASPEN_LOG(warning) << "shown " << 7;
  set_log_level(saved);
  set_log_sink(std::move(old));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "shown 7");
}

}  // namespace
}  // namespace aspen
