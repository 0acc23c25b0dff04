// train/report.cc: the progress bar, the metrics log and the loss SVG.
#include "train/report.h"

#include <sys/ioctl.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/file.h"

namespace aspen::train {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr size_t kDefaultColumns = 80;  // when the terminal does not say
constexpr size_t kMaxBar = 30, kMinBar = 10;
constexpr double kRedrawSeconds = 0.1;

__attribute__((format(printf, 2, 3))) void appendf(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  int n = std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  if (n > 0) out.append(buf, std::min(static_cast<size_t>(n), sizeof buf - 1));
}

std::string to_text(const char* fmt, double v) {
  std::string s;
  appendf(s, fmt, v);
  return s;
}

}  // namespace

// ---- the terminal ------------------------------------------------------------------------

Result<ProgressMode> parse_progress_mode(std::string_view name) {
  if (name == "auto") return ProgressMode::kAuto;
  if (name == "bar") return ProgressMode::kBar;
  if (name == "lines") return ProgressMode::kLines;
  if (name == "off") return ProgressMode::kOff;
  return Status::invalid_argument("progress mode", "one of 'auto', 'bar', 'lines', 'off'",
                                  "'" + std::string(name) + "'");
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  const auto s = static_cast<int64_t>(std::min(seconds, 1e15));
  std::string out;
  if (s < 60) {
    appendf(out, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    appendf(out, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    appendf(out, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  }
  return out;
}

std::string format_si(double value) {
  if (!std::isfinite(value)) return "--";
  static const char* const kSuffix[] = {"", "k", "M", "G", "T", "P"};
  double a = std::fabs(value);
  size_t i = 0;
  while (a >= 999.5 && i + 1 < std::size(kSuffix)) {  // 999.7 shows as "1.00k", not "1e+03"
    a /= 1000;
    ++i;
  }
  const double v = std::copysign(a, value);
  if (i == 0) return to_text("%.3g", v);
  const char* fmt = a >= 99.95 ? "%.0f%s" : a >= 9.995 ? "%.1f%s" : "%.2f%s";
  std::string out;
  appendf(out, fmt, v, kSuffix[i]);
  return out;
}

double Progress::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Progress::Progress(int64_t total_steps, ProgressMode mode, std::ostream& out, Clock clock, int64_t start_step)
    : total_(total_steps), start_step_(start_step), mode_(mode), out_(out), clock_(std::move(clock)) {
  if (mode_ == ProgressMode::kAuto) mode_ = ::isatty(2) ? ProgressMode::kBar : ProgressMode::kLines;
  columns_ = &out == &std::cerr ? terminal_columns() : kDefaultColumns;  // a stream of a test: 80
  t0_ = clock_();
}

size_t Progress::terminal_columns() {
  struct winsize ws {};
  if (::ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const long n = std::strtol(c, nullptr, 10);
    if (n > 0 && n < 100000) return size_t(n);
  }
  return kDefaultColumns;
}

Progress::~Progress() { finish(); }

std::string Progress::format_line(int64_t step, double loss, double tokens_per_s, std::string_view extra) const {
  const std::string total = std::to_string(total_);
  std::string step_text = std::to_string(step);
  if (step_text.size() < total.size()) step_text.insert(0, total.size() - step_text.size(), ' ');

  const double elapsed = clock_() - t0_;
  const int64_t done = step - start_step_;
  const double eta = step >= total_ ? 0
                     : done > 0 && elapsed > 0
                         ? static_cast<double>(total_ - step) * elapsed / static_cast<double>(done)
                         : -1;  // "--"
  std::string tail = step_text + "/" + total + "  loss " + to_text("%.3f", loss) + "  " +
                      (tokens_per_s >= 0 ? format_si(tokens_per_s) : "--") + " " + rate_unit_ + "  ETA " + format_duration(eta);
  const size_t base = tail.size();  // without `extra`, which is cut first
  if (!extra.empty()) tail += "  " + std::string(extra);

  // A bar line must stay shorter than the terminal: one that wraps is redrawn
  // from its last row, and every redraw then adds rows.
  const size_t max_line = std::max<size_t>(columns_, 2) - 1;
  std::string line;
  if (mode_ == ProgressMode::kBar) {
    const size_t room = max_line > tail.size() + 3 ? max_line - tail.size() - 3 : 0;  // "[" bar "] "
    if (max_line >= base + 3 + kMinBar) {
      const size_t width = std::clamp(room, kMinBar, kMaxBar);
      const double frac =
          total_ > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_), 0.0, 1.0) : 1.0;
      const auto filled = static_cast<size_t>(frac * static_cast<double>(width));
      line = "[" + std::string(filled, '#') + std::string(width - filled, '-') + "] " + tail;
    } else {
      line = tail;  // too narrow for a bar
    }
    if (line.size() > max_line) line.resize(max_line);
  } else {
    line = "step " + tail;  // lines may wrap: each is printed once
  }
  return line;
}

void Progress::draw() {
  const std::string line = format_line(step_, loss_, rate_, extra_);
  out_ << '\r' << line;
  if (line.size() < drawn_) out_ << std::string(drawn_ - line.size(), ' ');
  out_.flush();
  drawn_ = line.size();
  last_draw_ = clock_();
  dirty_ = false;
}

void Progress::update(int64_t step, double loss, double tokens_per_s, std::string_view extra) {
  step_ = step;
  loss_ = loss;
  rate_ = tokens_per_s;
  extra_ = std::string(extra);
  have_state_ = true;
  dirty_ = true;
  finished_ = false;
  switch (mode_) {
    case ProgressMode::kBar:
      if (clock_() - last_draw_ >= kRedrawSeconds || step >= total_) draw();
      break;
    case ProgressMode::kLines:
      out_ << format_line(step, loss, tokens_per_s, extra) << '\n';
      out_.flush();
      dirty_ = false;
      break;
    default:
      break;
  }
}

void Progress::message(std::string_view text) {
  if (mode_ == ProgressMode::kBar && drawn_ > 0) {
    out_ << '\r' << std::string(drawn_, ' ') << '\r' << text << '\n';
    drawn_ = 0;
    draw();
  } else {
    out_ << text << '\n';
    out_.flush();
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (mode_ != ProgressMode::kBar) return;
  if (have_state_ && dirty_) draw();
  if (drawn_ > 0) {
    out_ << '\n';
    out_.flush();
    drawn_ = 0;
  }
}

// ---- the metrics log ------------------------------------------------------------------------

namespace {

// One metrics line as read back, with the text it came from.
struct Line {
  ordered_json json;
  int64_t step = 0;
  std::string_view text;  // without its '\n'
};

// Splits a metrics log into its lines. A torn last line (no '\n', not a whole
// object) is left out; any other line that is not an object with an integer
// "step" is Corrupt. Empty lines are skipped.
Result<std::vector<Line>> parse_metrics(const std::string& path, std::string_view text) {
  std::vector<Line> lines;
  size_t pos = 0, number = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const bool torn = end == std::string_view::npos;
    std::string_view line = text.substr(pos, torn ? std::string_view::npos : end - pos);
    pos = torn ? text.size() : end + 1;
    ++number;
    if (line.empty()) continue;
    ordered_json j = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool ok = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    if (!ok) {
      if (torn) break;  // a write cut short by a crash
      return Status::error(Code::kCorrupt, path + ":" + std::to_string(number),
                           "a JSON object with an integer \"step\"",
                           "'" + std::string(line.substr(0, 60)) + (line.size() > 60 ? "...'" : "'"));
    }
    lines.push_back(Line{std::move(j), 0, line});
    lines.back().step = lines.back().json["step"].get<int64_t>();
  }
  return lines;
}

}  // namespace

MetricsLog::MetricsLog(std::string path, std::unique_ptr<std::FILE, Close> file)
    : path_(std::move(path)), file_(std::move(file)) {}

Result<MetricsLog> MetricsLog::open_append(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return Status::error(Code::kIoError, path, "a file that can be opened for appending", std::strerror(errno));
  return MetricsLog(path, std::unique_ptr<std::FILE, Close>(f));
}

Result<MetricsLog> MetricsLog::create(const std::string& path) {
  ASPEN_RETURN_IF_ERROR(write_file_atomic(path, std::string_view()));
  return open_append(path);
}

Result<MetricsLog> MetricsLog::resume(const std::string& path, int64_t resume_step) {
  auto text = read_regular_file(path, kMaxBinaryFileBytes);
  if (!text.is_ok()) return text.status().code() == Code::kNotFound ? create(path) : text.status();
  ASPEN_ASSIGN_OR_RETURN(std::vector<Line> lines, parse_metrics(path, *text));
  std::string kept;
  for (const Line& l : lines) {
    if (l.step > resume_step) continue;
    kept.append(l.text);
    kept += '\n';
  }
  if (kept != *text) ASPEN_RETURN_IF_ERROR(write_file_atomic(path, kept));
  return open_append(path);
}

Status MetricsLog::append(int64_t step, const std::vector<std::pair<std::string, double>>& numbers,
                          const std::vector<std::pair<std::string, std::string>>& strings) {
  ordered_json j;
  j["step"] = step;
  auto add = [&](const std::string& key, auto value) {
    if (j.contains(key)) {
      return Status::invalid_argument("metrics line of step " + std::to_string(step),
                                      "distinct keys other than \"step\"", "'" + key + "' again");
    }
    j[key] = std::move(value);
    return Status::ok();
  };
  for (const auto& [key, v] : numbers) {
    ASPEN_RETURN_IF_ERROR(std::isfinite(v) ? add(key, v) : add(key, nullptr));
  }
  for (const auto& [key, v] : strings) ASPEN_RETURN_IF_ERROR(add(key, v));
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() || std::fflush(file_.get()) != 0) {
    return Status::error(Code::kIoError, path_, "a metrics line appended", std::strerror(errno));
  }
  return Status::ok();
}

Result<std::vector<std::pair<int64_t, double>>> read_metric(const std::string& path, const std::string& key) {
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxBinaryFileBytes));
  ASPEN_ASSIGN_OR_RETURN(std::vector<Line> lines, parse_metrics(path, text));
  std::vector<std::pair<int64_t, double>> out;
  for (const Line& l : lines) {
    auto it = l.json.find(key);
    if (it != l.json.end() && it->is_number()) out.emplace_back(l.step, it->get<double>());
  }
  return out;
}

// ---- the loss curve --------------------------------------------------------------------------

namespace {

// A linear axis from lo to hi with ticks every `step` (1, 2 or 5 times a
// power of ten), covering the data.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

Axis nice_axis(double lo, double hi, bool integer) {
  if (!(hi > lo)) {  // one value: a band around it
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integer) step = std::max(1.0, std::round(step));
  return Axis{std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) return "0";
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  std::string out;
  appendf(out, "%.*f", decimals, v);
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::vector<std::pair<int64_t, double>> finite_points(const std::vector<std::pair<int64_t, double>>& series) {
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& p : series) {
    if (std::isfinite(p.second)) out.push_back(p);
  }
  return out;
}

}  // namespace

std::string loss_svg(const std::vector<std::pair<int64_t, double>>& train_in,
                     const std::vector<std::pair<int64_t, double>>& val_in, const std::string& title) {
  constexpr double W = 720, H = 432, left = 64, right = 24, top = 44, bottom = 52;
  constexpr double pw = W - left - right, ph = H - top - bottom;
  const char* const kTrainColor = "#1f77b4";
  const char* const kValColor = "#d62728";
  const auto train = finite_points(train_in), val = finite_points(val_in);

  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  bool any = false;
  for (const auto* series : {&train, &val}) {
    for (const auto& [s, v] : *series) {
      const auto x = static_cast<double>(s);
      x0 = any ? std::min(x0, x) : x;
      x1 = any ? std::max(x1, x) : x;
      y0 = any ? std::min(y0, v) : v;
      y1 = any ? std::max(y1, v) : v;
      any = true;
    }
  }
  const Axis ax = any ? nice_axis(x0, x1, true) : Axis{0, 1, 0.2};
  const Axis ay = any ? nice_axis(y0, y1, false) : Axis{0, 1, 0.2};
  auto px = [&](double x) { return left + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto py = [&](double y) { return top + (ay.hi - y) / (ay.hi - ay.lo) * ph; };

  std::string o;
  appendf(o,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
          "font-family=\"sans-serif\" font-size=\"12\">\n",
          W, H, W, H);
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  appendf(o, "<text x=\"%.1f\" y=\"26\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
  o += xml_escape(title) + "</text>\n";

  // Grid, ticks and their labels.
  o += "<g class=\"grid\" stroke=\"#e0e0e0\">\n";
  std::string labels;
  const int nx = static_cast<int>(std::lround((ax.hi - ax.lo) / ax.step));
  for (int i = 0; i <= nx; ++i) {
    const double v = ax.lo + i * ax.step, x = px(v);
    appendf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, top, x, top + ph);
    appendf(labels, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x, top + ph, x,
            top + ph + 5);
    appendf(labels, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x, top + ph + 18);
    labels += tick_label(v, ax.step) + "</text>\n";
  }
  const int ny = static_cast<int>(std::lround((ay.hi - ay.lo) / ay.step));
  for (int i = 0; i <= ny; ++i) {
    const double v = ay.lo + i * ay.step, y = py(v);
    appendf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", left, y, left + pw, y);
    appendf(labels, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left - 5, y, left, y);
    appendf(labels, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", left - 8, y + 4);
    labels += tick_label(v, ay.step) + "</text>\n";
  }
  o += "</g>\n<g class=\"axes\">\n" + labels;
  appendf(o, "<path d=\"M%.1f %.1f V%.1f H%.1f\" fill=\"none\" stroke=\"black\"/>\n", left, top, top + ph, left + pw);
  appendf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", left + pw / 2, H - 12);
  appendf(o, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">loss</text>\n", top + ph / 2);
  o += "</g>\n";

  // The curves.
  auto polyline = [&](const char* cls, const char* color, const std::vector<std::pair<int64_t, double>>& pts) {
    appendf(o, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", cls, color);
    for (size_t i = 0; i < pts.size(); ++i) {
      appendf(o, "%s%.1f,%.1f", i ? " " : "", px(static_cast<double>(pts[i].first)), py(pts[i].second));
    }
    o += "\"/>\n";
  };
  if (!train.empty()) polyline("train", kTrainColor, train);
  if (!val.empty()) {
    polyline("val", kValColor, val);
    for (const auto& [s, v] : val) {
      appendf(o, "<circle class=\"val\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(static_cast<double>(s)),
              py(v), kValColor);
    }
  }
  if (!any) {
    appendf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#808080\">no data</text>\n", left + pw / 2,
            top + ph / 2);
  }

  // The legend, top right, for the series that have points.
  double ly = top + 14;
  const double lx = left + pw - 110;
  auto legend = [&](const char* color, const char* name) {
    appendf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n", lx, ly,
            lx + 24, ly, color);
    appendf(o, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 30, ly + 4, name);
    ly += 18;
  };
  if (!train.empty() || !val.empty()) {
    o += "<g class=\"legend\">\n";
    if (!train.empty()) legend(kTrainColor, "train");
    if (!val.empty()) legend(kValColor, "validation");
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

Status write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& train,
                      const std::vector<std::pair<int64_t, double>>& val, const std::string& title) {
  return write_file_atomic(path, loss_svg(train, val, title));
}

}  // namespace aspen::train
