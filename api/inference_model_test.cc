#include "api/inference_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/builder.h"

namespace aspen::api {
namespace {

graph::Graph linear_graph() {
  graph::Graph g;
  graph::Builder b(g);
  auto x = b.input("x", DType::f32, {2, 3});
  auto w = b.parameter("fc.weight", DType::f32, {4, 3});
  auto bias = b.parameter("fc.bias", DType::f32, {4});
  b.output("y", b.op1(graph::OpKind::matmul, {x, w, bias}, {{"trans_b", int64_t(1)}}));
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return g;
}

// Options::profile with a path not ending in .json: a profile directory (report.html, trace.pftrace,
// trace.json, profile.json with the run's devices and its program's memory), rewritten after each call.
TEST(InferenceModel, ProfileDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / ("aspen_api_prof_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Options opts;
  opts.profile((dir / "prof").string()).threads(1);
  auto model = InferenceModel::create(linear_graph(), opts);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  Tensor w(DType::f32, Shape{4, 3}), bias(DType::f32, Shape{4}), x(DType::f32, Shape{2, 3});
  ASSERT_TRUE((*model)->copy_weights_to_device({{"fc.weight", &w}, {"fc.bias", &bias}}).is_ok());
  ASSERT_TRUE((*model)->run({{"x", &x}}).is_ok());
  for (const char* f : {"report.html", "trace.pftrace", "trace.json", "profile.json"})
    EXPECT_TRUE(std::filesystem::exists(dir / "prof" / f)) << f;
  std::ifstream in(dir / "prof" / "profile.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["command"], "InferenceModel");
  EXPECT_FALSE(j["devices"].empty());
  ASSERT_EQ(j["programs"].size(), 1u);
  EXPECT_GT(j["memory"]["planned_bytes"].get<int64_t>(), 0);
  // The facts every command's profile has (runtime/run_facts.h): the machine, the threads, the peaks measured
  // in this process, the process's memory with its parts named.
  const nlohmann::json facts = j["facts"];
  EXPECT_TRUE(facts.dump().find("\"threads\"") != std::string::npos) << facts.dump();
  EXPECT_GT(j["peaks"]["fma_gflops"].get<double>(), 0.0);
  EXPECT_GT(j["memory"]["peak_rss_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(j["memory"]["unplanned_bytes"].is_number());
  EXPECT_FALSE(j["memory"]["phases"].empty());
  std::filesystem::remove_all(dir);
}

TEST(InferenceModel, RunsWithIterationsCacheAndProfile) {
  const auto dir = std::filesystem::temp_directory_path() / ("aspen_api_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string trace_path = (dir / "trace.json").string();
  std::filesystem::create_directories(dir);
  Options opts;
  opts.device_iterations(3).output_mode(OutputMode::all).executable_cache((dir / "cache").string()).profile(trace_path)
      .threads(1);
  auto model = InferenceModel::create(linear_graph(), opts);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_FALSE((*model)->cache_hit());
  Tensor w(DType::f32, Shape{4, 3}), bias(DType::f32, Shape{4});
  for (int i = 0; i < 12; ++i) w.data<float>()[i] = i % 3 == i / 3 ? 1.0f : 0.0f;  // identity on the first 3
  bias.data<float>()[3] = 5.0f;
  ASSERT_TRUE((*model)->copy_weights_to_device({{"fc.weight", &w}, {"fc.bias", &bias}}).is_ok());
  Tensor x(DType::f32, Shape{3, 2, 3});
  for (int i = 0; i < 18; ++i) x.data<float>()[i] = float(i);
  auto out = (*model)->run({{"x", &x}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const Tensor& y = out->at("y");
  EXPECT_EQ(y.shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(y.data<float>()[4 * 5 + 0], 15.0f);  // step 2, row 1, column 0 = x[2][1][0]
  EXPECT_EQ(y.data<float>()[4 * 5 + 3], 5.0f);   // the bias column
  auto weights = (*model)->copy_weights_to_host();
  ASSERT_TRUE(weights.is_ok());
  EXPECT_EQ(weights->at("fc.bias").data<float>()[3], 5.0f);
  // The trace names the matmul and parses as JSON.
  std::ifstream f(trace_path);
  auto json = nlohmann::json::parse(f);
  EXPECT_FALSE(json["traceEvents"].empty());
  EXPECT_NE((*model)->profile_summary().find("matmul"), std::string::npos);
  // A second model with the same graph and options loads from the cache.
  auto again = InferenceModel::create(linear_graph(), opts);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE((*again)->cache_hit());
  std::filesystem::remove_all(dir);
}

TEST(InferenceModel, UnsupportedOptionsAreRejectedByName) {
  EXPECT_EQ(InferenceModel::create(linear_graph(), Options().gradient_accumulation(2)).status().message(),
            "options.gradient_accumulation = 2: expected a supported value for an inference model (1), found an "
            "unsupported one");
  EXPECT_EQ(InferenceModel::create(linear_graph(), Options().device_iterations(0)).status().message(),
            "options.device_iterations: expected >= 1, found 0");
  EXPECT_TRUE(InferenceModel::create(linear_graph(), Options().precision(DType::f16)).is_ok());
  EXPECT_TRUE(InferenceModel::create(linear_graph(), Options().precision(DType::bf16, DType::bf16)).is_ok());
  EXPECT_EQ(InferenceModel::create(linear_graph(), Options().precision(DType::f16, DType::bf16)).status().message(),
            "options.precision partials type: expected f32 or the compute type (f16), found bf16");
  EXPECT_EQ(InferenceModel::create(linear_graph(), Options().precision(DType::i32)).status().message(),
            "options.precision: expected f32, bf16 or f16, found i32");
}

}  // namespace
}  // namespace aspen::api
