// train/report_test.cc: the progress bar and lines (with a fake clock), the
// duration and rate formats, the metrics log (append, resume) and the loss SVG.
#include "train/report.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "core/check.h"
#include "io/test_files.h"

namespace aspen::train {
namespace {

namespace fs = std::filesystem;
using io::test_files::read_bytes;
using io::test_files::TempDir;
using io::test_files::write_bytes;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();


TEST(ReportFormat, Duration) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(45.9), "45s");
  EXPECT_EQ(format_duration(60), "1m00s");
  EXPECT_EQ(format_duration(192), "3m12s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(3900), "1h05m");
  EXPECT_EQ(format_duration(96000), "26h40m");
  EXPECT_EQ(format_duration(-1), "--");
  EXPECT_EQ(format_duration(kNaN), "--");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "--");
}

TEST(ReportFormat, SiRates) {
  EXPECT_EQ(format_si(0), "0");
  EXPECT_EQ(format_si(0.1234), "0.123");
  EXPECT_EQ(format_si(12.34), "12.3");
  EXPECT_EQ(format_si(987.4), "987");
  EXPECT_EQ(format_si(999.7), "1.00k");
  EXPECT_EQ(format_si(1234.5), "1.23k");
  EXPECT_EQ(format_si(12345), "12.3k");
  EXPECT_EQ(format_si(123456), "123k");
  EXPECT_EQ(format_si(4.56e7), "45.6M");
  EXPECT_EQ(format_si(1e9), "1.00G");
  EXPECT_EQ(format_si(kNaN), "--");
}

TEST(ReportFormat, ProgressModeNames) {
  EXPECT_EQ(parse_progress_mode("bar").value(), ProgressMode::kBar);
  EXPECT_EQ(parse_progress_mode("off").value(), ProgressMode::kOff);
  auto r = parse_progress_mode("tqdm");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "progress mode: expected one of 'auto', 'bar', 'lines', 'off', found 'tqdm'");
}

// ---- Progress ---------------------------------------------------------------------------------

// 120 of 1000 steps in 12 s: 10 steps/s, 880 left, ETA 88 s.
// The bar is 30 wide (the widest) and 12% full.
const std::string kBar120 =
    "[" + std::string(3, '#') + std::string(27, '-') + "]  120/1000  loss 2.345  1.23k tok/s  ETA 1m28s";

TEST(Progress, BarRedrawsOneLine) {
  double now = 100;
  std::ostringstream out;
  {
    Progress p(1000, ProgressMode::kBar, out, [&] { return now; });
    EXPECT_EQ(p.mode(), ProgressMode::kBar);
    now = 112;
    p.update(120, 2.3451, 1234.5);
    EXPECT_EQ(out.str(), "\r" + kBar120);
    EXPECT_LE(kBar120.size(), 79u);

    // Within 0.1 s of the last draw: nothing drawn.
    now = 112.05;
    p.update(121, 2.3, 1234.5);
    EXPECT_EQ(out.str(), "\r" + kBar120);

    // A shorter line is padded over the longer one.
    now = 120;
    p.update(500, 2, 999.0);
    const std::string half = "[" + std::string(15, '#') + std::string(15, '-') + "]";
    const std::string bar500 = half + "  500/1000  loss 2.000  999 tok/s  ETA 20s";
    EXPECT_EQ(out.str(), "\r" + kBar120 + "\r" + bar500 + std::string(kBar120.size() - bar500.size(), ' '));

    // A message clears the bar, prints its line and draws the bar again.
    out.str("");
    p.message("saved checkpoint step 500");
    EXPECT_EQ(out.str(), "\r" + std::string(bar500.size(), ' ') + "\rsaved checkpoint step 500\n\r" + bar500);

    // finish() ends the line; an undrawn last state is drawn first.
    out.str("");
    now = 120.01;
    p.update(501, 2, 999.0);
    EXPECT_EQ(out.str(), "");
    p.finish();
    const std::string done = "\r" + half + "  501/1000  loss 2.000  999 tok/s  ETA 19s\n";
    EXPECT_EQ(out.str(), done);
    p.finish();  // idempotent
    EXPECT_EQ(out.str(), done);
  }
}

TEST(Progress, BarAlwaysDrawsTheLastStepAndFitsEightyColumns) {
  double now = 0;
  std::ostringstream out;
  Progress p(1000, ProgressMode::kBar, out, [&] { return now; });
  now = 10;
  p.update(1000, 1.5, 2000);
  EXPECT_EQ(out.str(), "\r[" + std::string(30, '#') + "] 1000/1000  loss 1.500  2.00k tok/s  ETA 0s");
  out.str("");
  now = 10.01;  // inside the redraw interval, but the last step
  p.update(1000, 1.25, 2000, std::string(100, 'x'));
  const std::string line = out.str().substr(1);
  EXPECT_EQ(line.size(), 79u);  // the bar shrinks to 10, then the extra is cut
  EXPECT_EQ(line.substr(0, 12), "[##########]");
}

// A bar that wraps is redrawn from its last row, adding rows at every redraw
// (a 60-column terminal once showed 42 lines): every line fits the width.
TEST(Progress, BarFitsNarrowTerminals) {
  double now = 0;
  std::ostringstream out;
  Progress p(100000, ProgressMode::kBar, out, [&] { return now; });
  for (size_t columns : {size_t(120), size_t(80), size_t(60), size_t(40), size_t(20), size_t(1)}) {
    p.set_columns(columns);
    const std::string line = p.format_line(5000, 3.25, 12345, "lr 3.00e-04");
    EXPECT_LE(line.size(), std::max<size_t>(columns, 2) - 1) << columns;
    EXPECT_EQ(line.find('\n'), std::string::npos);
  }
  p.set_columns(60);
  const std::string narrow = p.format_line(5000, 3.25, 12345, "lr 3.00e-04");
  EXPECT_EQ(narrow.substr(0, 12), "[----------]");  // the bar at its narrowest; the extra cut
  EXPECT_EQ(narrow.size(), 59u);
  p.set_columns(40);
  EXPECT_EQ(p.format_line(5000, 3.25, 12345, "lr 3.00e-04"), "  5000/100000  loss 3.250  12.3k tok/s ");  // no bar
  p.set_columns(120);
  EXPECT_EQ(p.format_line(5000, 3.25, 12345, "lr").substr(0, 33), "[#" + std::string(29, '-') + "] ");
}

TEST(Progress, LinesPrintEveryUpdate) {
  double now = 0;
  std::ostringstream out;
  Progress p(1000, ProgressMode::kLines, out, [&] { return now; });
  p.update(0, kNaN, -1);  // nothing done yet: no ETA; a NaN loss shows as nan
  now = 12;
  p.update(120, 2.3451, 1234.5, "lr 3.0e-04");
  p.update(120, 2.3451, 1234.5);  // no throttling: the caller decides how often
  p.message("eval: val_loss 2.400");
  p.finish();
  EXPECT_EQ(out.str(),
            "step    0/1000  loss nan  -- tok/s  ETA --\n"
            "step  120/1000  loss 2.345  1.23k tok/s  ETA 1m28s  lr 3.0e-04\n"
            "step  120/1000  loss 2.345  1.23k tok/s  ETA 1m28s\n"
            "eval: val_loss 2.400\n");
}

TEST(Progress, EtaCountsOnlyTheStepsOfThisRun) {
  double now = 0;
  std::ostringstream out;
  Progress p(
      1000, ProgressMode::kLines, out, [&] { return now; }, /*start_step=*/500);
  now = 10;
  p.update(600, 1, 100);  // 100 steps in 10 s, 400 left
  EXPECT_EQ(out.str(), "step  600/1000  loss 1.000  100 tok/s  ETA 40s\n");
  out.str("");
  now = 3610;
  p.update(510, 1, 100);  // 10 steps in 3610 s: 490 left
  EXPECT_EQ(out.str(), "step  510/1000  loss 1.000  100 tok/s  ETA 49h08m\n");
}

TEST(Progress, OffPrintsOnlyMessagesAndAutoPicksBarOrLines) {
  std::ostringstream out;
  {
    Progress p(10, ProgressMode::kOff, out, [] { return 0.0; });
    p.update(5, 1, 1);
    p.message("hello");
  }
  EXPECT_EQ(out.str(), "hello\n");
  Progress a(10, ProgressMode::kAuto, out);
  EXPECT_EQ(a.mode(), ::isatty(2) ? ProgressMode::kBar : ProgressMode::kLines);
}

// ---- MetricsLog -------------------------------------------------------------------------------

TEST(MetricsLog, AppendsOneFlushedObjectPerLine) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  write_bytes(path, "old run\n");
  auto log = MetricsLog::create(path);
  ASSERT_TRUE(log.is_ok()) << log.status().to_string();
  EXPECT_EQ(read_bytes(path), "");  // a new run starts a new file
  ASSERT_TRUE(log->append(10, {{"loss", 2.5}, {"lr", 0.0003}, {"tokens_per_s", 1234.5}}).is_ok());
  EXPECT_EQ(read_bytes(path), "{\"step\":10,\"loss\":2.5,\"lr\":0.0003,\"tokens_per_s\":1234.5}\n");  // flushed
  ASSERT_TRUE(log->append(20, {{"loss", kNaN}}, {{"sample", "To be \"or\"\n"}}).is_ok());
  EXPECT_EQ(read_bytes(path),
            "{\"step\":10,\"loss\":2.5,\"lr\":0.0003,\"tokens_per_s\":1234.5}\n"
            "{\"step\":20,\"loss\":null,\"sample\":\"To be \\\"or\\\"\\n\"}\n");

  Status s = log->append(30, {{"loss", 1}, {"loss", 2}});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "metrics line of step 30: expected distinct keys other than \"step\", found 'loss' again");
  EXPECT_EQ(log->append(30, {{"step", 1}}).code(), Code::kInvalidArgument);

  auto loss = read_metric(path, "loss");
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  EXPECT_EQ(loss.value(), (std::vector<std::pair<int64_t, double>>{{10, 2.5}}));  // null skipped
}

TEST(MetricsLog, ResumeDropsLaterStepsAndATornLine) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  write_bytes(path,
              "{\"step\":10,\"loss\":3}\n"
              "{\"step\":20,\"loss\":2.5}\n"
              "{\"step\":20,\"val_loss\":2.75}\n"
              "{\"step\":30,\"loss\":2}\n"
              "{\"step\":40,\"lo");  // the crash cut this one short
  {
    auto log = MetricsLog::resume(path, 20);
    ASSERT_TRUE(log.is_ok()) << log.status().to_string();
    EXPECT_EQ(read_bytes(path),
              "{\"step\":10,\"loss\":3}\n{\"step\":20,\"loss\":2.5}\n{\"step\":20,\"val_loss\":2.75}\n");
    ASSERT_TRUE(log->append(30, {{"loss", 2.25}}).is_ok());
  }
  EXPECT_EQ(read_bytes(path),
            "{\"step\":10,\"loss\":3}\n{\"step\":20,\"loss\":2.5}\n{\"step\":20,\"val_loss\":2.75}\n"
            "{\"step\":30,\"loss\":2.25}\n");
  auto val = read_metric(path, "val_loss");
  ASSERT_TRUE(val.is_ok());
  EXPECT_EQ(val.value(), (std::vector<std::pair<int64_t, double>>{{20, 2.75}}));

  // Nothing to drop: the file is kept as it is; a missing file starts empty.
  const std::string kept = read_bytes(path);
  ASSERT_TRUE(MetricsLog::resume(path, 100).is_ok());
  EXPECT_EQ(read_bytes(path), kept);
  ASSERT_TRUE(MetricsLog::resume(dir / "new.jsonl", 5).is_ok());
  EXPECT_TRUE(fs::exists(dir / "new.jsonl"));
}

TEST(MetricsLog, ACorruptLineIsAnError) {
  TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  const std::string text = "{\"step\":10}\nnot json\n{\"step\":20}\n";
  write_bytes(path, text);
  auto log = MetricsLog::resume(path, 15);
  ASSERT_FALSE(log.is_ok());
  EXPECT_EQ(log.status().code(), Code::kCorrupt);
  EXPECT_EQ(log.status().message(), path + ":2: expected a JSON object with an integer \"step\", found 'not json'");
  EXPECT_EQ(read_bytes(path), text);  // untouched
  write_bytes(path, "{\"step\":1.5}\n");
  EXPECT_EQ(read_metric(path, "loss").status().code(), Code::kCorrupt);
  EXPECT_EQ(read_metric(dir / "missing.jsonl", "loss").status().code(), Code::kNotFound);
}

// ---- the loss SVG -------------------------------------------------------------------------------

// The number of "x,y" points of the polyline of class `cls`; -1 when there is none.
int polyline_points(const std::string& svg, const std::string& cls) {
  const size_t at = svg.find("<polyline class=\"" + cls + "\"");
  if (at == std::string::npos) return -1;
  const size_t begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
  std::istringstream pts(svg.substr(begin, end - begin));
  int n = 0;
  for (std::string p; pts >> p; ++n) EXPECT_NE(p.find(','), std::string::npos) << p;
  return n;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(LossSvg, DrawsBothSeriesAndSkipsNonFinitePoints) {
  const std::vector<std::pair<int64_t, double>> train = {
      {0, 6.9}, {10, 5.1}, {20, kNaN}, {30, 3.2}, {40, std::numeric_limits<double>::infinity()}, {50, 2.4}};
  const std::vector<std::pair<int64_t, double>> val = {{25, 3.9}, {50, 2.9}};
  const std::string svg = loss_svg(train, val, "gpt2 <tiny> & co");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(polyline_points(svg, "train"), 4);
  EXPECT_EQ(polyline_points(svg, "val"), 2);
  EXPECT_EQ(count(svg, "<circle class=\"val\""), 2);
  EXPECT_NE(svg.find(">gpt2 &lt;tiny&gt; &amp; co</text>"), std::string::npos);
  EXPECT_NE(svg.find(">train</text>"), std::string::npos);
  EXPECT_NE(svg.find(">validation</text>"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  // Ticks: steps 0..50 every 10, loss 2..7 every 1.
  EXPECT_NE(svg.find(">50</text>"), std::string::npos);
  EXPECT_NE(svg.find(">7</text>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  EXPECT_EQ(count(svg, "<"), count(svg, ">"));  // no stray brackets from the title
}

TEST(LossSvg, EmptyAndSinglePointSeries) {
  std::string svg = loss_svg({}, {}, "nothing yet");
  EXPECT_EQ(polyline_points(svg, "train"), -1);
  EXPECT_NE(svg.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(svg.find("class=\"legend\""), std::string::npos);

  svg = loss_svg({{7, 2.0}}, {{7, kNaN}}, "one");
  EXPECT_EQ(polyline_points(svg, "train"), 1);
  EXPECT_EQ(polyline_points(svg, "val"), -1);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);

  TempDir dir;
  ASSERT_TRUE(write_loss_svg(dir / "loss.svg", {{1, 2.0}, {2, 1.5}}, {}, "t").is_ok());
  EXPECT_EQ(read_bytes(dir / "loss.svg"), loss_svg({{1, 2.0}, {2, 1.5}}, {}, "t"));
  Status s = write_loss_svg(dir / "no/such/dir/loss.svg", {}, {}, "t");
  EXPECT_EQ(s.code(), Code::kIoError);
}

}  // namespace
}  // namespace aspen::train
