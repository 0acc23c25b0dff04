// profile/profile_dir.h: profile.json's totals against hand-counted events, the directory's two files, the
// flag-or-environment choice, and an unwritable directory named.
#include "profile/profile_dir.h"
#include "profile/report.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace aspen::profile {
namespace {

TraceEvent event(std::string device, std::string name, int64_t start, int64_t end, int64_t bytes = 0) {
  TraceEvent e;
  e.device = std::move(device);
  e.name = std::move(name);
  e.category = category::kKernel;
  e.start_ns = start;
  e.end_ns = end;
  e.bytes = bytes;
  return e;
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// cpu:0 runs matmul twice (100 ns and 300 ns, 800 bytes over the second) and an add inside the first matmul
// (busy is the union: 400 ns); cpu:1 one add. Shares are of the device's busy time.
std::vector<TraceEvent> events() {
  return {event("cpu:0", "matmul", 0, 100), event("cpu:0", "add", 20, 60), event("cpu:0", "matmul", 200, 500, 800),
          event("cpu:1", "add", 50, 1050)};
}

TEST(ProfileDir, TotalsAreTheEventsCounted) {
  const nlohmann::json j =
      nlohmann::json::parse(profile_json(events(), RunFacts{"generate", {{"cpu", "test cpu"}, {"threads", "2"}}}));
  EXPECT_EQ(j["schema"], "aspen.profile/1");
  EXPECT_EQ(j["command"], "generate");
  EXPECT_EQ(j["facts"]["cpu"], "test cpu");
  EXPECT_EQ(j["facts"]["threads"], "2");
  EXPECT_EQ(j["wall_ns"], 1050);
  ASSERT_EQ(j["devices"].size(), 2u);
  const nlohmann::json& d0 = j["devices"][0];
  EXPECT_EQ(d0["device"], "cpu:0");
  EXPECT_EQ(d0["busy_ns"], 400);
  EXPECT_EQ(d0["span_ns"], 500);
  EXPECT_EQ(d0["events"], 3);
  ASSERT_EQ(d0["ops"].size(), 2u);
  const nlohmann::json& mm = d0["ops"][0];  // the costliest first
  EXPECT_EQ(mm["name"], "matmul");
  EXPECT_EQ(mm["category"], "kernel");
  EXPECT_EQ(mm["count"], 2);
  EXPECT_EQ(mm["total_ns"], 400);
  EXPECT_EQ(mm["mean_ns"], 200);
  EXPECT_DOUBLE_EQ(mm["share"].get<double>(), 1.0);
  EXPECT_EQ(mm["bytes"], 800);
  EXPECT_DOUBLE_EQ(mm["gb_per_s"].get<double>(), 800.0 / 300.0);  // over the event that reports bytes
  EXPECT_TRUE(d0["ops"][1]["gb_per_s"].is_null());
  EXPECT_DOUBLE_EQ(d0["ops"][1]["share"].get<double>(), 0.1);
  EXPECT_EQ(j["devices"][1]["busy_ns"], 1000);
  // No events: a valid profile with no devices.
  const nlohmann::json empty = nlohmann::json::parse(profile_json({}, RunFacts{"x", {}}));
  EXPECT_EQ(empty["devices"].size(), 0u);
  EXPECT_EQ(empty["wall_ns"], 0);
}

// FLOPs and layers: matmuls of 1000 and 3000 FLOPs over 100 and 300 ns in layer "h.0" (the second one
// backward), an add of layer "h.1", an event with no layer; peaks 5 GFLOP/s and 4 GB/s.
TEST(ProfileDir, FlopsLayersAndTheRoofline) {
  auto with = [](TraceEvent e, int64_t flops, std::string layer, bool backward) {
    e.flops = flops;
    if (!layer.empty()) e.args.emplace_back("layer", std::move(layer));
    if (backward) e.args.emplace_back("pass", "backward");
    return e;
  };
  const std::vector<TraceEvent> ev = {with(event("cpu:0", "matmul", 0, 100, 200), 1000, "h.0", false),
                                      with(event("cpu:0", "matmul", 200, 500), 3000, "h.0", true),
                                      with(event("cpu:0", "add", 500, 600, 40), 0, "h.1", false),
                                      event("cpu:0", "host_write x", 600, 1000)};
  RunFacts run{"train", {}};
  run.peaks = {.fma_gflops = 5.0, .bf16_gflops = 0.0, .read_gb_per_s = 4.0};
  const nlohmann::json j = nlohmann::json::parse(profile_json(ev, run));
  EXPECT_DOUBLE_EQ(j["peaks"]["fma_gflops"].get<double>(), 5.0);
  EXPECT_TRUE(j["peaks"]["bf16_gflops"].is_null());  // not measured (no bf16 products here)
  EXPECT_EQ(j["flops"], 4000);
  EXPECT_DOUBLE_EQ(j["gflops_per_s"].get<double>(), 4.0);  // 4000 FLOPs over the 1000 ns of wall time
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.8);
  nlohmann::json mm;
  for (const auto& op : j["devices"][0]["ops"])
    if (op["name"] == "matmul") mm = op;
  ASSERT_FALSE(mm.is_null());
  EXPECT_EQ(mm["flops"], 4000);
  EXPECT_DOUBLE_EQ(mm["gflops_per_s"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(mm["of_fma_peak"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(mm["of_read_peak"].get<double>(), 0.5);  // 200 bytes over the 100 ns that report them: 2 GB/s
  const nlohmann::json& layers = j["devices"][0]["layers"];
  ASSERT_EQ(layers.size(), 2u);  // in order of first appearance; the event with no layer is in none
  EXPECT_EQ(layers[0]["layer"], "h.0");
  EXPECT_EQ(layers[0]["count"], 2);
  EXPECT_EQ(layers[0]["forward_ns"], 100);
  EXPECT_EQ(layers[0]["backward_ns"], 300);
  EXPECT_EQ(layers[0]["flops"], 4000);
  EXPECT_EQ(layers[0]["bytes"], 200);
  EXPECT_EQ(layers[1]["layer"], "h.1");
  EXPECT_EQ(layers[1]["forward_ns"], 100);
  EXPECT_EQ(layers[1]["flops"], 0);
  // NOTE [planned and measured memory]: what is not planned is the peak less the start and the plan.
  RunFacts with_memory{"train", {}};
  with_memory.memory = {.peak_rss = 1000, .start_rss = 300, .parameters = 200, .replica_copies = 50, .arenas = 100,
                        .weight_only = 25};
  const nlohmann::json mem = nlohmann::json::parse(profile_json(ev, with_memory))["memory"];
  EXPECT_EQ(mem["planned_bytes"], 375);
  EXPECT_EQ(mem["unplanned_bytes"], 325);
  EXPECT_EQ(mem["arena_bytes"], 100);
  EXPECT_TRUE(j["memory"]["peak_rss_bytes"].is_null());  // not measured
  // Without peaks: no roofline, no MFU.
  const nlohmann::json bare = nlohmann::json::parse(profile_json(ev, RunFacts{"train", {}}));
  EXPECT_TRUE(bare["mfu"].is_null());
  for (const auto& op : bare["devices"][0]["ops"]) EXPECT_TRUE(op["of_fma_peak"].is_null());
  // The trace carries the FLOPs as an argument.
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json(ev));
  bool seen = false;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("args") && e["args"].contains("flops")) seen = seen || e["args"]["flops"] == 3000;
  EXPECT_TRUE(seen);
}

// NOTE [execution split]: each instant of the wall (0..1000 over both devices) goes to the innermost event on
// the device then: cpu:0 has a plan instruction 0..400 around a kernel 100..300 (in which a copy runs
// 150..200), a wait 500..700 and a collective 650..800 overlapping it (the later start owns 650..800), then
// nothing; cpu:1 a host write 900..1000.
TEST(ProfileDir, ExecutionSplitSumsToTheWall) {
  auto ev = [](std::string device, const char* cat, int64_t s, int64_t e) {
    TraceEvent x = event(std::move(device), cat, s, e);
    x.category = cat;
    return x;
  };
  const std::vector<TraceEvent> events = {
      ev("cpu:0", category::kPlan, 0, 400),    ev("cpu:0", category::kKernel, 100, 300),
      ev("cpu:0", category::kCopy, 150, 200),  ev("cpu:0", category::kKernel, 350, 350),  // no time: none owned
      ev("cpu:0", category::kWait, 500, 700),
      ev("cpu:0", category::kCollective, 650, 800), ev("cpu:1", category::kHost, 900, 1000)};
  const std::vector<DeviceTotals> d = device_totals(events);
  ASSERT_EQ(d.size(), 2u);
  const ExecutionSplit& a = d[0].split;
  EXPECT_EQ(a.runtime_ns, 200);     // 0..100 and 300..400
  EXPECT_EQ(a.compute_ns, 150);     // 100..150 and 200..300
  EXPECT_EQ(a.copy_ns, 50);
  EXPECT_EQ(a.wait_ns, 150);        // 500..650
  EXPECT_EQ(a.collective_ns, 150);  // 650..800: started last
  EXPECT_EQ(a.idle_ns, 100 + 200);  // 400..500 and 800..1000
  EXPECT_EQ(a.total(), 1000);
  const ExecutionSplit& b = d[1].split;
  EXPECT_EQ(b.host_ns, 100);
  EXPECT_EQ(b.idle_ns, 900);
  EXPECT_EQ(b.total(), 1000);
  const nlohmann::json j = nlohmann::json::parse(profile_json(events, RunFacts{"train", {}}));
  int64_t sum = 0;
  for (const auto& [k, v] : j["devices"][1]["split"].items()) sum += v.get<int64_t>();
  EXPECT_EQ(sum, j["wall_ns"].get<int64_t>());
}

TEST(ProfileDir, WritesTraceAndProfileAndNamesAnUnwritableDirectory) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "aspen_profile_dir_test" / "run";
  std::filesystem::remove_all(dir.parent_path());
  ASSERT_TRUE(write_profile_dir(dir.string(), events(), RunFacts{"generate", {}}).is_ok());
  const nlohmann::json trace = nlohmann::json::parse(read(dir / "trace.json"));
  int complete = 0;
  for (const auto& e : trace["traceEvents"]) complete += e["ph"] == "X";
  EXPECT_EQ(complete, 4);
  EXPECT_EQ(nlohmann::json::parse(read(dir / "profile.json"))["devices"].size(), 2u);
  // A file where the directory should be: named, not a crash.
  const std::filesystem::path file = dir / "trace.json";
  const Status s = write_profile_dir(file.string(), events(), RunFacts{"generate", {}});
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_NE(s.to_string().find(file.string()), std::string::npos) << s.to_string();
  std::filesystem::remove_all(dir.parent_path());
}

// report.html holds profile.json's text whole (a "</script>" in a name cannot end its element) and needs
// nothing from a network.
TEST(ProfileDir, ReportIsOnePageHoldingTheProfile) {
  std::vector<TraceEvent> ev = events();
  ev.push_back(event("cpu:0", "</script><b>x", 600, 700));
  const std::string json = profile_json(ev, RunFacts{"generate", {}});
  const std::string html = report_html(json);
  const size_t open = html.find("<script type=\"application/json\" id=\"profile-data\">");
  ASSERT_NE(open, std::string::npos);
  const size_t start = html.find('>', open) + 1, end = html.find("</script>", start);
  ASSERT_NE(end, std::string::npos);
  const nlohmann::json back = nlohmann::json::parse(html.substr(start, end - start));  // "<\/" is JSON's "</"
  EXPECT_EQ(back, nlohmann::json::parse(json));
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "aspen_profile_report_test";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(write_profile_dir(dir.string(), ev, RunFacts{"generate", {}}).is_ok());
  EXPECT_EQ(read(dir / "report.html"), html);
  std::filesystem::remove_all(dir);
}

TEST(ProfileDir, TheFlagWinsOverTheEnvironment) {
  unsetenv("ASPEN_PROFILE");
  EXPECT_EQ(profile_dir_choice(""), "");
  EXPECT_EQ(profile_dir_choice("a"), "a");
  setenv("ASPEN_PROFILE", "from-env", 1);
  EXPECT_EQ(profile_dir_choice(""), "from-env");
  EXPECT_EQ(profile_dir_choice("a"), "a");
  unsetenv("ASPEN_PROFILE");
}

}  // namespace
}  // namespace aspen::profile
