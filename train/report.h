// train/report.h: what a training run shows and writes: the progress bar (or
// progress lines) on the terminal, the metrics log (one JSON object per line)
// and the loss curve (a self-contained SVG). docs/training.md ("What a run
// writes") describes the files.
//
//   * Progress draws `[#####---------------]  120/1000  loss 2.345  1.23k tok/s  ETA 3m12s`
//     redrawn in place with '\r' (bar mode, at most every 0.1 s of its clock),
//     or prints one such line per update (lines mode; the caller decides how
//     often). The ETA is the remaining steps at the mean rate since the
//     Progress was made. Lines fit in 79 columns (the bar shrinks, then a long
//     `extra` is cut).
//   * MetricsLog appends `{"step":10,"loss":2.31,"lr":0.0003,...}` lines and
//     flushes each one, so `tail -f` and a crash both see whole lines. A
//     resumed run drops the lines of steps after its checkpoint (they are
//     about to be redone), rewriting the file atomically.
//   * write_loss_svg draws train and validation loss against the step.
//
// Thread-safety: a Progress or a MetricsLog is used by one thread at a time;
// the free functions are pure (write_loss_svg writes atomically).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace aspen::train {

// Pinned: the files of a run directory (log.run_dir, by default runs/<name>)
// that docs/training.md ("What a run writes") describes.
inline constexpr char kRunConfigFile[] = "config.yaml";  // to_yaml() of the config as run (overrides applied)
inline constexpr char kMetricsFile[] = "metrics.jsonl";  // the MetricsLog
inline constexpr char kLossSvgFile[] = "loss.svg";       // write_loss_svg() of "loss" and "val_loss"

// ---- the terminal ---------------------------------------------------------------------

enum class ProgressMode { kAuto, kBar, kLines, kOff };
// "auto" | "bar" | "lines" | "off" (the config's log.progress).
Result<ProgressMode> parse_progress_mode(std::string_view name);

// "45s", "3m12s", "1h05m" (seconds are rounded down); "--" when negative or not finite.
std::string format_duration(double seconds);
// Three significant digits and an SI suffix: "0.123", "12.3", "987", "1.23k", "45.6M", "1.00G".
std::string format_si(double value);

class Progress {
 public:
  using Clock = std::function<double()>;  // seconds on a monotonic clock
  static double steady_seconds();         // the default clock: std::chrono::steady_clock

  // `total_steps` is the last step; `start_step` the step the run starts from
  // (a resumed run: its checkpoint's), so that the ETA counts only the steps
  // done here. kAuto becomes kBar when stderr is a terminal (isatty(2)), else
  // kLines; `out` is usually std::cerr.
  Progress(int64_t total_steps, ProgressMode mode, std::ostream& out, Clock clock = steady_seconds,
           int64_t start_step = 0);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // finish()

  ProgressMode mode() const { return mode_; }  // never kAuto
  // The terminal's width (stderr's, else $COLUMNS, else 80); a bar line is
  // kept one shorter so that it never wraps. set_columns: tests, resizes.
  static size_t terminal_columns();
  void set_columns(size_t columns) { columns_ = columns; }

  // `step` steps are done; `loss` and `tokens_per_s` are the latest ones
  // (NaN, or a negative rate, is shown as "--"); `extra` ("lr 3.0e-04") goes
  // at the end of the line.
  void update(int64_t step, double loss, double tokens_per_s, std::string_view extra = {});
  // What the rate counts: "tok/s" (the default), or "ex/s" for a model trained on arrays of examples.
  void set_rate_unit(std::string unit) { rate_unit_ = std::move(unit); }
  // A line of text ("saved checkpoint step 500") that does not break the bar:
  // the bar is cleared, the text printed, the bar drawn again. Printed in
  // every mode, off included.
  void message(std::string_view text);
  // Draws the last state (bar mode) and ends the line. Idempotent.
  void finish();

  // The line for a state, without '\r' or '\n' (bar mode's with the bar).
  std::string format_line(int64_t step, double loss, double tokens_per_s, std::string_view extra) const;

 private:
  void draw();

  int64_t total_, start_step_;
  ProgressMode mode_;
  std::ostream& out_;
  Clock clock_;
  double t0_, last_draw_ = -1e300;
  size_t columns_ = 80;
  std::string rate_unit_ = "tok/s";
  size_t drawn_ = 0;  // characters of the bar now on the terminal's line; 0: none
  bool have_state_ = false, dirty_ = false, finished_ = false;  // dirty_: the state has not been drawn
  int64_t step_ = 0;
  double loss_ = 0, rate_ = 0;
  std::string extra_;
};

// ---- files ---------------------------------------------------------------------------------

class MetricsLog {
 public:
  // A new run: `path` is replaced by an empty file (created if missing).
  static Result<MetricsLog> create(const std::string& path);
  // A run resumed from the checkpoint of step `resume_step`: the lines of
  // later steps are dropped, as is a torn last line (one without its '\n'
  // that is not a whole object); new lines are appended. A missing file
  // starts empty; a line that is not a JSON object with an integer "step"
  // (other than a torn last one) is Corrupt, naming path:line.
  static Result<MetricsLog> resume(const std::string& path, int64_t resume_step);

  // Appends {"step":step, numbers..., strings...} in that order as one line
  // and flushes it. Non-finite numbers are written as null (JSON has no NaN).
  // InvalidArgument when a key repeats or is "step".
  [[nodiscard]] Status append(int64_t step, const std::vector<std::pair<std::string, double>>& numbers,
                              const std::vector<std::pair<std::string, std::string>>& strings = {});

  const std::string& path() const { return path_; }

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  MetricsLog(std::string path, std::unique_ptr<std::FILE, Close> file);
  static Result<MetricsLog> open_append(const std::string& path);

  std::string path_;
  std::unique_ptr<std::FILE, Close> file_;
};

// The (step, value) pairs of the lines of a metrics log that have `key` as a
// number, in file order (null values and a torn last line are skipped).
Result<std::vector<std::pair<int64_t, double>>> read_metric(const std::string& path, const std::string& key);

// A self-contained SVG of the loss curves: axes with ticks and labels, the
// train loss as a line, the validation loss as a line with points, a legend
// and `title`. Linear axes over the finite points (non-finite ones are
// skipped); empty series are fine. Written with write_file_atomic.
[[nodiscard]] Status write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& train,
                                    const std::vector<std::pair<int64_t, double>>& val, const std::string& title);
// The SVG text itself.
std::string loss_svg(const std::vector<std::pair<int64_t, double>>& train,
                     const std::vector<std::pair<int64_t, double>>& val, const std::string& title);

}  // namespace aspen::train
