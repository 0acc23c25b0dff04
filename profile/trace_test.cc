#include "profile/trace.h"
#include "profile/trace_testing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace aspen::profile {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 20;  // sanitizers make every lock and copy dearer
#else
constexpr double kSlowdown = 1;
#endif

TraceEvent make_event(std::string device, std::string name, int64_t start, int64_t end, int64_t bytes = 0,
                      std::string cat = category::kKernel) {
  return test_event(std::move(device), std::move(name), start, end, bytes, std::move(cat));
}

// A fresh directory under the test temp dir, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "aspen_trace_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TraceRecorder, RecordsFromTwoThreadsConcurrently) {
  TraceRecorder rec;
  constexpr int kPerThread = 2000;
  auto work = [&rec](const std::string& device) {
    for (int i = 0; i < kPerThread; ++i) {
      TraceEvent e;
      e.device = device;
      e.name = "op";
      e.category = category::kKernel;
      e.start_ns = rec.now_ns();
      e.end_ns = rec.now_ns();
      e.args.emplace_back("i", std::to_string(i));
      rec.record(e);
    }
  };
  std::thread a(work, "cpu:0");
  std::thread b(work, "cpu:1");
  a.join();
  b.join();

  EXPECT_EQ(rec.size(), 2u * kPerThread);
  const std::vector<TraceEvent> events = rec.events();
  ASSERT_EQ(events.size(), 2u * kPerThread);
  EXPECT_TRUE(std::is_sorted(events.begin(), events.end(),
                             [](const TraceEvent& x, const TraceEvent& y) { return x.start_ns < y.start_ns; }));
  // Each device's events keep the order its thread recorded them in.
  std::map<std::string, int> next;
  for (const TraceEvent& e : events) {
    ASSERT_EQ(e.args.size(), 1u);
    EXPECT_EQ(e.args[0].second, std::to_string(next[e.device]++)) << e.device;
    EXPECT_LE(e.start_ns, e.end_ns);
  }
  EXPECT_EQ(next.size(), 2u);
  EXPECT_EQ(next["cpu:0"], kPerThread);
  EXPECT_EQ(next["cpu:1"], kPerThread);

  rec.clear();
  EXPECT_EQ(rec.size(), 0u);
  EXPECT_TRUE(rec.events().empty());
}

TEST(TraceRecorder, EventsAreSortedByStartThenLongerFirst) {
  TraceRecorder rec;
  rec.record(make_event("d", "late", 300, 400));
  rec.record(make_event("d", "inner", 100, 150));
  rec.record(make_event("d", "outer", 100, 250));
  const auto events = rec.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].name, "outer");
  EXPECT_EQ(events[1].name, "inner");
  EXPECT_EQ(events[2].name, "late");
}

TEST(TraceRecorder, RecordingIsCheap) {
  TraceRecorder rec;
  constexpr int kN = 50000;
  const TraceEvent e = make_event("cpu:0", "matmul", 1, 2, 64);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) rec.record(e);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rec.size(), static_cast<size_t>(kN));
  EXPECT_LT(ns / kN, 1000 * kSlowdown) << "mean ns per record()";
}

TEST(TraceScope, TimesItsLifetime) {
  TraceRecorder rec;
  const int64_t before = rec.now_ns();
  {
    TraceScope s(&rec, "cpu:0", "sleep", category::kHost, 128);
    EXPECT_TRUE(s.active());
    s.add_arg("node", "7");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int64_t after = rec.now_ns();
  const auto events = rec.events();
  ASSERT_EQ(events.size(), 1u);
  const TraceEvent& e = events[0];
  EXPECT_EQ(e.device, "cpu:0");
  EXPECT_EQ(e.name, "sleep");
  EXPECT_EQ(e.category, "host");
  EXPECT_EQ(e.bytes, 128);
  ASSERT_EQ(e.args.size(), 1u);
  EXPECT_EQ(e.args[0], (std::pair<std::string, std::string>("node", "7")));
  EXPECT_GE(e.start_ns, before);
  EXPECT_LE(e.end_ns, after);
  EXPECT_GE(e.duration_ns(), 5'000'000);
  EXPECT_LT(e.duration_ns(), 250'000'000);  // generous: the machine may be busy
}

TEST(TraceScope, NullOrDisabledRecorderRecordsNothingAndIsCheap) {
  constexpr int kN = 200000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) {
    TraceScope s(nullptr, "cpu:0", "matmul", category::kKernel, 1 << 20);
    s.set_bytes(i);
    if (s.active()) s.add_arg("i", std::to_string(i));
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ns / kN, 50 * kSlowdown) << "mean ns per null TraceScope";

  TraceRecorder rec(/*enabled=*/false);
  EXPECT_FALSE(rec.enabled());
  {
    TraceScope s(&rec, "cpu:0", "matmul");
    EXPECT_FALSE(s.active());
    s.add_arg("ignored", "yes");
  }
  EXPECT_EQ(rec.size(), 0u);
  rec.set_enabled(true);
  { TraceScope s(&rec, "cpu:0", "matmul"); }
  EXPECT_EQ(rec.size(), 1u);
}

TEST(ChromeTrace, WritesParsableJsonWithDevicesAndArgs) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string tricky = "say \"hi\" \\ back\nslash\t\x01";
  std::vector<TraceEvent> events;
  events.push_back(make_event("cpu:0", "matmul", 1500, 4000, 4096));
  events.back().args = {{"node", "3"}, {"shape", "[2, 3]"}};
  events.push_back(make_event("cpu:1", tricky, 2000, 2001, 0, category::kCollective));
  events.back().args = {{"k\"ey", tricky}};
  events.push_back(make_event("cpu:0", "copy", 5000, 7250, 0, category::kCopy));
  events.push_back(make_event("cpu:0", "dup", 8000, 9000, 10));
  events.back().args = {{"x", "1"}, {"x", "2"}};
  events.push_back(make_event("cpu:1", "bad utf8 \xff\xfe", 9000, 9100));

  const std::string path = dir.path() + "/trace.json";
  ASSERT_TRUE(write_chrome_trace(events, path).is_ok());
  // Only the trace is left in the directory: the temporary file was renamed.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "trace.json");
  }
  EXPECT_EQ(files, 1);

  const nlohmann::json doc = nlohmann::json::parse(read_file(path));
  ASSERT_TRUE(doc.contains("traceEvents"));
  const auto& list = doc["traceEvents"];
  ASSERT_TRUE(list.is_array());

  std::map<int, std::string> thread_names;
  std::vector<nlohmann::json> complete;
  for (const auto& ev : list) {
    ASSERT_EQ(ev["pid"], 1);
    if (ev["ph"] == "M" && ev["name"] == "thread_name") {
      thread_names[ev["tid"].get<int>()] = ev["args"]["name"].get<std::string>();
    } else if (ev["ph"] == "X") {
      complete.push_back(ev);
    }
  }
  ASSERT_EQ(complete.size(), events.size());
  ASSERT_EQ(thread_names.size(), 2u);

  const auto& mm = complete[0];
  EXPECT_EQ(mm["name"], "matmul");
  EXPECT_EQ(mm["cat"], "kernel");
  EXPECT_DOUBLE_EQ(mm["ts"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(mm["dur"].get<double>(), 2.5);
  EXPECT_EQ(thread_names[mm["tid"].get<int>()], "cpu:0");
  EXPECT_EQ(mm["args"]["bytes"], 4096);
  EXPECT_EQ(mm["args"]["node"], "3");
  EXPECT_EQ(mm["args"]["shape"], "[2, 3]");

  const auto& odd = complete[1];
  EXPECT_EQ(odd["name"].get<std::string>(), tricky);  // escaping round-trips
  EXPECT_EQ(odd["args"]["k\"ey"].get<std::string>(), tricky);
  EXPECT_EQ(odd["cat"], "collective");
  EXPECT_DOUBLE_EQ(odd["ts"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(odd["dur"].get<double>(), 0.001);
  EXPECT_FALSE(odd["args"].contains("bytes"));  // unknown bytes are left out
  EXPECT_EQ(thread_names[odd["tid"].get<int>()], "cpu:1");
  EXPECT_NE(odd["tid"], mm["tid"]);

  EXPECT_EQ(complete[2]["tid"], mm["tid"]);
  EXPECT_DOUBLE_EQ(complete[2]["dur"].get<double>(), 2.25);
  EXPECT_FALSE(complete[2].contains("args"));
  EXPECT_EQ(complete[3]["args"]["x"], "2");   // the later duplicate wins
  EXPECT_EQ(complete[3]["args"].size(), 2u);  // bytes and x
  EXPECT_EQ(complete[4]["name"].get<std::string>(), "bad utf8 \xEF\xBF\xBD\xEF\xBF\xBD");

  // Writing again replaces the file.
  ASSERT_TRUE(write_chrome_trace({}, path).is_ok());
  const nlohmann::json empty = nlohmann::json::parse(read_file(path));
  for (const auto& ev : empty["traceEvents"]) EXPECT_NE(ev["ph"], "X");
}

TEST(ChromeTrace, RecorderEventsRoundTrip) {
  TraceRecorder rec;
  { TraceScope s(&rec, "cpu:0", "a", category::kKernel, 100); }
  { TraceScope s(&rec, "cpu:1", "b", category::kCopy); }
  const nlohmann::json doc = nlohmann::json::parse(chrome_trace_json(rec.events()));
  int complete = 0;
  for (const auto& ev : doc["traceEvents"]) complete += ev["ph"] == "X";
  EXPECT_EQ(complete, 2);
}

TEST(ChromeTrace, UnwritablePathNamesPathAndOsError) {
  const std::string path = "/nonexistent-aspen-dir/sub/trace.json";
  const Status s = write_chrome_trace({make_event("cpu:0", "x", 0, 1)}, path);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s.message();

  // A directory in the way of the rename: no temporary file is left behind.
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string blocked = dir.path() + "/is_a_dir";
  std::filesystem::create_directory(blocked);
  std::filesystem::create_directory(blocked + "/child");
  const Status r = write_chrome_trace({make_event("cpu:0", "x", 0, 1)}, blocked);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find(blocked), std::string::npos) << r.message();
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(Summary, ListsDevicesAndTopOps) {
  std::vector<TraceEvent> events;
  // cpu:0: matmul 2 x 3 ms with 6 MB each (2 GB/s), softmax 1 x 1 ms, and a
  // host scope enclosing all of them (busy time counts the overlap once).
  events.push_back(make_event("cpu:0", "step", 0, 10'000'000, 0, category::kHost));
  events.push_back(make_event("cpu:0", "matmul", 0, 3'000'000, 6'000'000));
  events.push_back(make_event("cpu:0", "matmul", 4'000'000, 7'000'000, 6'000'000));
  events.push_back(make_event("cpu:0", "softmax", 8'000'000, 9'000'000));
  events.push_back(make_event("gpu\n1", "all_reduce", 0, 2'000'000, 0, category::kCollective));
  for (int i = 0; i < 5; ++i) {
    events.push_back(make_event("cpu:0", "tiny" + std::to_string(i), 9'500'000, 9'500'100));
  }

  const std::string text = summary(events, 3);
  EXPECT_NE(text.find("device cpu:0"), std::string::npos) << text;
  EXPECT_NE(text.find("device gpu 1"), std::string::npos) << text;  // newline made printable
  EXPECT_NE(text.find("busy 10.000 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce"), std::string::npos) << text;
  // Ops by total time: step (10 ms), matmul (6 ms), softmax (1 ms); the tiny
  // ones are folded into one line.
  const size_t step = text.find("step"), matmul = text.find("matmul"), softmax = text.find("softmax");
  ASSERT_NE(matmul, std::string::npos) << text;
  EXPECT_LT(step, matmul);
  EXPECT_LT(matmul, softmax);
  EXPECT_EQ(text.find("tiny0"), std::string::npos) << text;
  EXPECT_NE(text.find("5 more ops"), std::string::npos) << text;
  const size_t line_end = text.find('\n', matmul);
  const std::string matmul_line = text.substr(matmul, line_end - matmul);
  EXPECT_NE(matmul_line.find("6.000"), std::string::npos) << matmul_line;   // total ms
  EXPECT_NE(matmul_line.find("3000.0"), std::string::npos) << matmul_line;  // mean us
  EXPECT_NE(matmul_line.find("60.0%"), std::string::npos) << matmul_line;   // of 10 ms busy
  EXPECT_NE(matmul_line.find("2.00"), std::string::npos) << matmul_line;    // GB/s

  EXPECT_EQ(summary({}), "no trace events\n");
  EXPECT_EQ(summary(events, 0).find("more ops"), std::string::npos);
}

}  // namespace
}  // namespace aspen::profile
