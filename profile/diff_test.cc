// profile/diff.h: the diff names an instruction slowed by 5 % among noisy ones, on a host slower all along,
// and nothing else; trace.json read back as written; a file that is not a trace named.
#include "profile/diff.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace aspen::profile {
namespace {

// Uniform in [-0.5, 0.5): a fixed sequence per seed.
struct Uniform {
  uint64_t state;
  double operator()() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return double(state >> 11) / double(1ull << 53) - 0.5;
  }
};

// One instruction's event: program 1 (or `program`), node `node`, on cpu0.
TraceEvent instruction(int node, const char* op, int64_t start, int64_t dur, const char* program = "1") {
  TraceEvent e;
  e.device = "cpu0";
  e.name = op;
  e.category = category::kKernel;
  e.start_ns = start;
  e.end_ns = start + dur;
  e.args = {{"program", program}, {"node", std::to_string(node)}};
  return e;
}

// `runs` runs of 6 instructions (program 0, nodes 10..15; node 12 is 4x the others), each duration
// multiplied by `host` and by 1 ± 4 % of noise (a fixed sequence per seed); node `slowed` by (1 + extra) too.
std::vector<TraceEvent> run(int runs, double host, int slowed, double extra, uint64_t seed) {
  std::vector<TraceEvent> ev;
  int64_t t = 0;
  uint64_t state = seed;
  for (int r = 0; r < runs; ++r)
    for (int node = 10; node < 16; ++node) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double noise = 1.0 + 0.08 * (double(state >> 11) / double(1ull << 53) - 0.5);
      const double base = node == 12 ? 40000.0 : 10000.0;
      const int64_t dur = std::llround(base * host * noise * (node == slowed ? 1.0 + extra : 1.0));
      TraceEvent e;
      e.device = "cpu0";
      e.name = node == 12 ? "attention" : "matmul";
      e.category = category::kKernel;
      e.start_ns = t;
      e.end_ns = t + dur;
      e.args = {{"program", "0"}, {"node", std::to_string(node)}, {"layer", "h." + std::to_string(node % 3)}};
      ev.push_back(std::move(e));
      t += dur + 100;
    }
  return ev;
}

TEST(ProfileDiff, NamesTheSlowedInstructionOnAHostSlowerAllAlong) {
  const ProfileDiff d = diff_profiles(run(200, 1.0, -1, 0.0, 1), run(200, 1.1, 13, 0.05, 2));
  EXPECT_EQ(d.compared, 6);
  EXPECT_EQ(d.only_a + d.only_b, 0);
  EXPECT_NEAR(d.run_factor, 1.1, 0.01);
  ASSERT_EQ(d.slower.size(), 1u);
  EXPECT_EQ(d.slower[0].node, "13");
  EXPECT_EQ(d.slower[0].program, "0");
  EXPECT_EQ(d.slower[0].layer, "h.1");
  EXPECT_NEAR(d.slower[0].ratio, 1.05, 0.01);
  EXPECT_GT(d.slower[0].impact_ns, 0);
  EXPECT_TRUE(d.faster.empty());
  // The same runs, nothing slowed: nothing named.
  const ProfileDiff same = diff_profiles(run(200, 1.0, -1, 0.0, 1), run(200, 1.0, -1, 0.0, 3));
  EXPECT_TRUE(same.slower.empty());
  EXPECT_TRUE(same.faster.empty());
  // A faster instruction is named as such.
  const ProfileDiff faster = diff_profiles(run(200, 1.0, -1, 0.0, 1), run(200, 1.0, 12, -0.2, 4));
  ASSERT_EQ(faster.faster.size(), 1u);
  EXPECT_EQ(faster.faster[0].node, "12");
  // Instructions one profile lacks are counted, not compared.
  std::vector<TraceEvent> fewer = run(200, 1.0, -1, 0.0, 5);
  std::erase_if(fewer, [](const TraceEvent& e) { return e.args[1].second == "15"; });
  EXPECT_EQ(diff_profiles(run(200, 1.0, -1, 0.0, 1), fewer).only_a, 1);
}

// NOTE [run of a program]: a host whose speed changes from one run of the program to the next (±20 %, every
// instruction of a run alike) hides a 4 % slowdown in the runs' spread, unless each run is divided by its
// factor; then the one slowed instruction of 10 is named, and nothing else.
TEST(ProfileDiff, RunsOfAProgramAreTakenAtTheirOwnSpeed) {
  auto runs = [](int slowed, double extra, uint64_t seed) {
    std::vector<TraceEvent> ev;
    int64_t t = 0;
    Uniform uniform{seed};
    for (int r = 0; r < 100; ++r) {
      const double host = 1.0 + 0.4 * uniform();
      for (int node = 0; node < 10; ++node) {
        const double own = 1.0 + 0.02 * uniform();
        const int64_t dur = std::llround(20000.0 * (1 + node % 3) * host * own * (node == slowed ? 1.0 + extra : 1.0));
        ev.push_back(instruction(node, "matmul", t, dur));
        t += dur + 100;
      }
    }
    return ev;
  };
  const ProfileDiff d = diff_profiles(runs(-1, 0.0, 11), runs(7, 0.04, 12));
  EXPECT_EQ(d.compared, 10);
  EXPECT_LT(d.spread, 0.01);
  ASSERT_EQ(d.slower.size(), 1u);
  EXPECT_EQ(d.slower[0].node, "7");
  EXPECT_NEAR(d.slower[0].ratio, 1.04, 0.01);
  EXPECT_TRUE(d.faster.empty());
  const ProfileDiff same = diff_profiles(runs(-1, 0.0, 11), runs(-1, 0.0, 13));
  EXPECT_TRUE(same.slower.empty() && same.faster.empty());
}

// NOTE [spread by size]: 30 small instructions that vary by ±6 % from one profile to the next (each run alike:
// not noise of their own samples) and 30 large ones that vary by ±1 %: a 5 % change of a large one is named
// (its size's spread allows it), the same change of a small one is not (its size's spread is larger), and no
// other instruction is named.
TEST(ProfileDiff, EachInstructionIsJudgedByTheSpreadOfItsSize) {
  auto profile = [](uint64_t seed, int slowed) {  // `slowed` 5 % slower
    std::vector<TraceEvent> ev;
    int64_t t = 0;
    Uniform uniform{seed};
    std::vector<double> offset(60);  // this profile's own, per instruction
    for (int node = 0; node < 60; ++node) offset[size_t(node)] = 1.0 + (node < 30 ? 0.12 : 0.02) * uniform();
    for (int r = 0; r < 50; ++r)
      for (int node = 0; node < 60; ++node) {
        const double base = node < 30 ? 2000.0 : 300000.0;
        const int64_t dur = std::llround(base * offset[size_t(node)] * (1.0 + 0.002 * uniform()) *
                                         (node == slowed ? 1.05 : 1.0));
        ev.push_back(instruction(node, node < 30 ? "copy" : "matmul", t, dur));
        t += dur + 100;
      }
    return ev;
  };
  const DiffOptions all_costs{.threshold = 0.02, .spreads = 4.0, .min_z = 4.0, .min_share = 0.0};
  const ProfileDiff d = diff_profiles(profile(21, -1), profile(22, 45), all_costs);
  EXPECT_LT(d.detectable, 0.05);  // the large ones' (the time is theirs)
  ASSERT_EQ(d.slower.size(), 1u);
  EXPECT_EQ(d.slower[0].node, "45");
  EXPECT_LT(d.slower[0].detectable, 0.05);
  EXPECT_TRUE(d.faster.empty());
  const ProfileDiff small = diff_profiles(profile(21, -1), profile(22, 7), all_costs);
  EXPECT_TRUE(small.slower.empty() && small.faster.empty());
}

TEST(ProfileDiff, ReadsTraceJsonBackAndNamesAFileThatIsNot) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "aspen_diff_test";
  std::filesystem::create_directories(dir);
  std::vector<TraceEvent> ev = run(3, 1.0, -1, 0.0, 1);
  ev[0].bytes = 4096;
  ev[0].flops = 1234567;
  ASSERT_TRUE(write_chrome_trace(ev, (dir / "trace.json").string()).is_ok());
  auto back = read_chrome_trace((dir / "trace.json").string());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), ev.size());
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ((*back)[i].device, ev[i].device);
    EXPECT_EQ((*back)[i].name, ev[i].name);
    EXPECT_EQ((*back)[i].start_ns, ev[i].start_ns);
    EXPECT_EQ((*back)[i].end_ns, ev[i].end_ns);
    EXPECT_EQ((*back)[i].args, ev[i].args);
  }
  EXPECT_EQ((*back)[0].bytes, 4096);
  EXPECT_EQ((*back)[0].flops, 1234567);
  std::ofstream(dir / "bad.json") << "{\"traceEvents\": 3}";
  auto bad = read_chrome_trace((dir / "bad.json").string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kCorrupt);
  EXPECT_NE(bad.status().to_string().find("bad.json"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(read_chrome_trace((dir / "missing.json").string()).status().code(), Code::kIoError);
}

}  // namespace
}  // namespace aspen::profile
