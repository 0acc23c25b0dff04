// train/config.cc: the config schema (one list of keys), the YAML reader, the
// overrides and the writer.
#include "train/config.h"
#include "core/file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

namespace aspen::train {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using StringMap = std::map<std::string, std::string>;

// What a key accepts beyond its type: an interval (numbers) or a set of
// choices (strings).
struct Rule {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  std::vector<std::string_view> choices = {};
};
Rule any() { return {}; }
Rule at_least(double lo) { return Rule{.lo = lo}; }
Rule above(double lo) { return Rule{.lo = lo, .lo_open = true}; }
Rule interval(double lo, double hi, bool lo_open, bool hi_open) {
  return Rule{.lo = lo, .hi = hi, .lo_open = lo_open, .hi_open = hi_open};
}
Rule one_of(std::initializer_list<std::string_view> choices) { return Rule{.choices = choices}; }

// NOTE [config schema]: the one list of keys, in file order. Parsing,
// overrides, to_yaml, validate()'s per-key checks and the "did you mean"
// suggestions all walk it, so a new key is one line here (plus its member in
// config.h and its row in docs/training.md). Section "" is the top level.
template <class Config, class Visit>
void for_each_key(Config& c, Visit&& v) {
  v("", "name", c.name, any());

  v("model", "from", c.model.from, any());
  v("model", "family", c.model.family, one_of({"gpt2", "gptj", "llama"}));
  v("model", "n_layer", c.model.n_layer, at_least(1));
  v("model", "n_head", c.model.n_head, at_least(1));
  v("model", "d_model", c.model.d_model, at_least(1));
  v("model", "n_positions", c.model.n_positions, at_least(1));
  v("model", "d_ff", c.model.d_ff, at_least(0));
  v("model", "rotary_dim", c.model.rotary_dim, at_least(0));
  v("model", "n_kv_head", c.model.n_kv_head, at_least(0));
  v("model", "vocab", c.model.vocab, at_least(0));
  v("model", "init_std", c.model.init_std, at_least(0));
  v("model", "loss", c.model.loss, one_of({"cross_entropy", "mse"}));
  v("model", "output", c.model.output, any());
  v("model", "targets", c.model.targets, any());
  v("model", "ignore_index", c.model.ignore_index, any());
  v("model", "inputs", c.model.inputs, any());
  v("model", "attention", c.model.attention, any());
  v("model", "attention_dropout", c.model.attention_dropout, interval(0, 1, false, true));
  v("model", "max_positions", c.model.max_positions, at_least(0));
  v("model", "frozen", c.model.frozen, any());
  v("model", "trainable", c.model.trainable, any());

  v("data", "train", c.data.train, any());
  v("data", "tokenizer", c.data.tokenizer, any());
  v("data", "seq", c.data.seq, at_least(1));
  v("data", "val_fraction", c.data.val_fraction, interval(0, 1, false, true));
  v("data", "packing", c.data.packing, any());
  v("data", "mlm_probability", c.data.mlm_probability, interval(0, 1, true, true));
  v("data", "max_predictions", c.data.max_predictions, at_least(0));

  v("optimizer", "name", c.optimizer.name, one_of({"adamw", "sgd", "lamb"}));
  v("optimizer", "lr", c.optimizer.lr, at_least(0));
  v("optimizer", "beta1", c.optimizer.beta1, interval(0, 1, false, true));
  v("optimizer", "beta2", c.optimizer.beta2, interval(0, 1, false, true));
  v("optimizer", "eps", c.optimizer.eps, above(0));
  v("optimizer", "weight_decay", c.optimizer.weight_decay, at_least(0));
  v("optimizer", "momentum", c.optimizer.momentum, interval(0, 1, false, true));
  v("optimizer", "nesterov", c.optimizer.nesterov, any());
  v("optimizer", "no_decay", c.optimizer.no_decay, any());
  v("optimizer", "clip_grad_norm", c.optimizer.clip_grad_norm, at_least(0));

  v("schedule", "name", c.schedule.name, one_of({"constant", "cosine", "linear"}));
  v("schedule", "warmup_steps", c.schedule.warmup_steps, at_least(0));
  v("schedule", "min_lr_ratio", c.schedule.min_lr_ratio, interval(0, 1, false, false));

  v("precision", "compute", c.precision.compute, one_of({"f32", "bf16", "f16"}));
  v("precision", "partials", c.precision.partials, one_of({"f32", "bf16", "f16"}));
  v("precision", "loss_scaling", c.precision.loss_scaling, one_of({"none", "static", "dynamic"}));
  v("precision", "loss_scale", c.precision.loss_scale, above(0));
  v("precision", "growth_factor", c.precision.growth_factor, at_least(1));
  v("precision", "backoff_factor", c.precision.backoff_factor, interval(0, 1, true, false));
  v("precision", "growth_interval", c.precision.growth_interval, at_least(1));
  v("precision", "hysteresis", c.precision.hysteresis, at_least(1));

  v("batch", "micro", c.batch.micro, at_least(1));
  v("batch", "accumulation", c.batch.accumulation, at_least(1));
  v("batch", "replicas", c.batch.replicas, at_least(1));
  v("batch", "global", c.batch.global, at_least(0));

  v("parallel", "reduction", c.parallel.reduction, one_of({"mean", "sum"}));
  v("parallel", "bucket_mb", c.parallel.bucket_mb, at_least(1));
  v("parallel", "compression", c.parallel.compression, one_of({"none", "bf16", "topk"}));
  v("parallel", "topk_ratio", c.parallel.topk_ratio, interval(0, 1, true, false));
  v("parallel", "timeout_s", c.parallel.timeout_s, at_least(1));
  v("parallel", "shard_optimizer_state", c.parallel.shard_optimizer_state, any());
  v("parallel", "overlap", c.parallel.overlap, any());
  v("parallel", "pipeline_stages", c.parallel.pipeline_stages, at_least(1));
  v("parallel", "schedule", c.parallel.schedule, one_of({"1f1b", "gpipe"}));
  v("parallel", "balance", c.parallel.balance, one_of({"estimated", "measured", "dynamic"}));
  v("parallel", "recompute", c.parallel.recompute, any());
  v("parallel", "vocab_parallel", c.parallel.vocab_parallel, one_of({"auto", "on", "off"}));
  v("parallel", "tensor_parallel", c.parallel.tensor_parallel, at_least(1));

  v("train", "steps", c.train.steps, at_least(1));
  v("train", "seed", c.train.seed, any());
  v("train", "threads", c.train.threads, at_least(0));
  v("train", "device_iterations", c.train.device_iterations, at_least(1));
  v("train", "executable_cache", c.train.executable_cache, any());

  v("checkpoint", "dir", c.checkpoint.dir, any());
  v("checkpoint", "interval", c.checkpoint.interval, at_least(0));
  v("checkpoint", "minutes", c.checkpoint.minutes, at_least(0));
  v("checkpoint", "keep", c.checkpoint.keep, at_least(1));

  v("eval", "interval", c.eval.interval, at_least(0));
  v("eval", "batches", c.eval.batches, at_least(1));

  v("log", "run_dir", c.log.run_dir, any());
  v("log", "interval", c.log.interval, at_least(1));
  v("log", "progress", c.log.progress, one_of({"auto", "bar", "lines", "off"}));

  v("sample", "prompts", c.sample.prompts, any());
  v("sample", "max_new_tokens", c.sample.max_new_tokens, at_least(1));
  v("sample", "temperature", c.sample.temperature, at_least(0));
  v("sample", "top_k", c.sample.top_k, at_least(0));
  v("sample", "top_p", c.sample.top_p, interval(0, 1, true, false));
}

std::string path_of(std::string_view section, std::string_view key) {
  return section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
}

// The known keys of `section` ("" : the top level, whose keys are `name` and
// the section names), in schema order.
std::vector<std::string> keys_of(std::string_view section) {
  std::vector<std::string> keys;
  TrainConfig c;
  for_each_key(c, [&](std::string_view s, std::string_view k, auto&, const Rule&) {
    std::string_view name = section.empty() && !s.empty() ? s : k;
    if ((section.empty() || s == section) && std::find(keys.begin(), keys.end(), name) == keys.end()) {
      keys.emplace_back(name);
    }
  });
  return keys;
}

bool is_section(std::string_view name) {
  if (name.empty()) return false;
  bool found = false;
  TrainConfig c;
  for_each_key(c, [&](std::string_view s, std::string_view, auto&, const Rule&) { found = found || s == name; });
  return found;
}

std::string join(const std::vector<std::string>& items, std::string_view sep, std::string_view quote = "") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += std::string(quote) + items[i] + std::string(quote);
  }
  return out;
}

// Optimal string alignment distance (Levenshtein plus adjacent swaps).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// "did you mean 'x'?" for the closest of `known` when it is close (at most
// one edit per three characters typed, and at least one), else "".
std::string did_you_mean(std::string_view typed, const std::vector<std::string>& known) {
  const size_t limit = std::max<size_t>(1, typed.size() / 3);
  size_t best = limit + 1;
  std::string best_key;
  for (const auto& k : known) {
    size_t d = edit_distance(typed, k);
    if (d < best) {
      best = d;
      best_key = k;
    }
  }
  return best_key.empty() ? "" : "did you mean '" + best_key + "'?";
}

// The hint for an unknown key: a close key of the same section, else the same
// key in other sections ("lr" at the top level: 'optimizer.lr').
std::string unknown_key_hint(std::string_view section, std::string_view typed) {
  std::string hint = did_you_mean(typed, keys_of(section));
  if (!hint.empty()) return hint;
  std::vector<std::string> elsewhere;
  TrainConfig c;
  for_each_key(c, [&](std::string_view s, std::string_view k, auto&, const Rule&) {
    if (k == typed && s != section) elsewhere.push_back(path_of(s, k));
  });
  if (elsewhere.empty()) return "";
  std::string out = "did you mean ";
  for (size_t i = 0; i < elsewhere.size(); ++i) {
    if (i) out += i + 1 == elsewhere.size() ? " or " : ", ";
    out += "'" + elsewhere[i] + "'";
  }
  return out + "?";
}

// ---- values as text ----------------------------------------------------------

// The shortest text that reads back as exactly `v`: plain decimals for
// moderate magnitudes ("0.0003", "65536"), else "1e-8".
std::string format_double(double v) {
  char buf[400];
  const double a = std::fabs(v);
  const bool fixed = a == 0 || (a >= 1e-4 && a < 1e15);
  auto r = std::to_chars(buf, buf + sizeof buf, v, fixed ? std::chars_format::fixed : std::chars_format::scientific);
  std::string s(buf, r.ptr);
  if (!fixed) {  // "1e-08" -> "1e-8"
    size_t e = s.find('e');
    size_t digits = e + 2;
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
    if (s[e + 1] == '+') s.erase(e + 1, 1);
  }
  return s;
}

std::string shorten(std::string_view s) {
  return s.size() <= 40 ? std::string(s) : std::string(s.substr(0, 37)) + "...";
}

template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return "'" + shorten(v) + "'";
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    return format_double(v);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return "a list of " + std::to_string(v.size());
  } else if constexpr (std::is_same_v<T, StringMap>) {
    return "a map of " + std::to_string(v.size());
  } else {
    return std::to_string(v);
  }
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, double>) return "a number";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "a list of strings";
  if constexpr (std::is_same_v<T, StringMap>) return "a map of strings";
  if constexpr (std::is_same_v<T, uint64_t>) return "an integer >= 0";
  return "an integer";
}

// What a key expects, type and rule together: "an integer >= 1",
// "a number in [0, 1)", "one of 'adamw', 'sgd', 'lamb'".
template <class T>
std::string expected_text(const Rule& r) {
  if (!r.choices.empty()) {
    std::vector<std::string> c(r.choices.begin(), r.choices.end());
    return "one of " + join(c, ", ", "'");
  }
  std::string t = type_name<T>();
  const bool has_lo = r.lo > -kInf, has_hi = r.hi < kInf;
  if (has_lo && has_hi) {
    return t + " in " + (r.lo_open ? "(" : "[") + format_double(r.lo) + ", " + format_double(r.hi) +
           (r.hi_open ? ")" : "]");
  }
  if (has_lo) return t + (r.lo_open ? " > " : " >= ") + format_double(r.lo);
  if (has_hi) return t + (r.hi_open ? " < " : " <= ") + format_double(r.hi);
  return t;
}

// A value against its rule; the error's subject is the key path.
template <class T>
Status check_rule(const std::string& path, const T& v, const Rule& r) {
  bool ok = true;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = r.choices.empty() || std::find(r.choices.begin(), r.choices.end(), v) != r.choices.end();
    if (!ok) {
      std::vector<std::string> c(r.choices.begin(), r.choices.end());
      return Status::invalid_argument(path, expected_text<T>(r), value_text(v), did_you_mean(v, c));
    }
  } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    const double x = static_cast<double>(v);
    ok = std::isfinite(x) && (r.lo_open ? x > r.lo : x >= r.lo) && (r.hi_open ? x < r.hi : x <= r.hi);
  }
  if (!ok) return Status::invalid_argument(path, expected_text<T>(r), value_text(v));
  return Status::ok();
}

// ---- reading YAML nodes --------------------------------------------------------

// Where the text came from: a file (errors carry "file:line") or an override
// (errors carry "override '...'").
struct Source {
  std::string origin;
  bool has_lines = true;
  std::map<std::string, int> lines = {};  // key path -> line of the key, for validate()'s errors

  std::string where(int line) const { return has_lines ? origin + ":" + std::to_string(line) : origin; }
};

int line_of(const YAML::Node& n) { return n.Mark().line + 1; }

bool is_quoted(const YAML::Node& n) { return n.Tag() == "!"; }

// How a node that does not fit reads in an error.
std::string describe(const YAML::Node& n) {
  if (n.IsNull()) return "no value";
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  if (is_quoted(n)) return "the quoted string '" + shorten(n.Scalar()) + "'";
  const std::string& s = n.Scalar();
  double d = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), d);
  if (!s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size()) return s;  // a number: as written
  return "'" + shorten(s) + "'";
}

// A plain (unquoted) scalar's text, or nullptr for anything else.
const std::string* plain_scalar(const YAML::Node& n) { return n.IsScalar() && !is_quoted(n) ? &n.Scalar() : nullptr; }

template <class Int>
bool parse_int(std::string_view s, Int& out) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty() || s[0] == '+') return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Reads `n` into `out` when it has the type T; otherwise an error naming the
// key path at `line` (a bad list element: at its own line), `out` unchanged.
template <class T>
Status read_value(const YAML::Node& n, T& out, const std::string& path, int line, const Source& src, const Rule& rule) {
  auto mismatch = [&] {
    return Status::invalid_argument(src.where(line) + ": " + path, expected_text<T>(rule), describe(n));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (n.IsNull()) {
      out.clear();
    } else if (n.IsScalar()) {
      out = n.Scalar();
    } else {
      return mismatch();
    }
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (n.IsNull()) {
      out.clear();
      return Status::ok();
    }
    if (!n.IsSequence()) return mismatch();
    std::vector<std::string> items;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node e = n[i];
      if (!e.IsScalar()) {
        return Status::invalid_argument(
            src.where(src.has_lines ? line_of(e) : line) + ": " + path + "[" + std::to_string(i) + "]", "a string",
            describe(e));
      }
      items.push_back(e.Scalar());
    }
    out = std::move(items);
  } else if constexpr (std::is_same_v<T, StringMap>) {
    if (n.IsNull()) {
      out.clear();
      return Status::ok();
    }
    if (!n.IsMap()) return mismatch();
    StringMap items;
    for (const auto& kv : n) {  // by value: yaml-cpp's it->first points into a temporary
      const YAML::Node& k = kv.first;
      const int at = src.has_lines ? line_of(k) : line;
      if (!k.IsScalar()) return Status::invalid_argument(src.where(at) + ": " + path, "a key name", describe(k));
      const std::string where = src.where(at) + ": " + path + "." + k.Scalar();
      std::string text;
      if (kv.second.IsScalar()) {
        text = kv.second.Scalar();
      } else if (kv.second.IsSequence() && path == "model.attention") {  // block lists, kept as "[a, b]"
        for (const auto& e : kv.second) {
          if (!e.IsScalar()) return Status::invalid_argument(where, "a list of numbers", describe(kv.second));
          text += (text.empty() ? "" : ", ") + e.Scalar();
        }
        text = "[" + text + "]";
      } else {
        return Status::invalid_argument(where, path == "model.attention" ? "a value or a list of numbers" : "a string",
                                        describe(kv.second));
      }
      if (!items.emplace(k.Scalar(), text).second)
        return Status::invalid_argument(where, "each key once", "it again");
    }
    out = std::move(items);
  } else if constexpr (std::is_same_v<T, bool>) {
    const std::string* s = plain_scalar(n);
    if (!s) return mismatch();
    if (*s == "true" || *s == "True" || *s == "TRUE") {
      out = true;
    } else if (*s == "false" || *s == "False" || *s == "FALSE") {
      out = false;
    } else {
      return mismatch();
    }
  } else if constexpr (std::is_same_v<T, double>) {
    const std::string* s = plain_scalar(n);
    if (!s) return mismatch();
    std::string_view t = *s;
    if (!t.empty() && t[0] == '+') t.remove_prefix(1);
    double d = 0;
    auto r = std::from_chars(t.data(), t.data() + t.size(), d);
    if (t.empty() || t[0] == '+' || r.ec != std::errc() || r.ptr != t.data() + t.size() || !std::isfinite(d)) {
      return mismatch();
    }
    out = d;
  } else if constexpr (std::is_same_v<T, int>) {
    const std::string* s = plain_scalar(n);
    int64_t v = 0;
    if (!s || !parse_int(*s, v) || v < INT_MIN || v > INT_MAX) return mismatch();
    out = static_cast<int>(v);
  } else {
    static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>);
    const std::string* s = plain_scalar(n);
    T v = 0;
    if (!s || !parse_int(*s, v)) return mismatch();
    out = v;
  }
  return Status::ok();
}

Status read_map(TrainConfig& c, std::string_view section, const YAML::Node& map, Source& src);

// One `key: value` of `section` ("" : the top level). `line` is the key's.
Status read_entry(TrainConfig& c, std::string_view section, const std::string& key, int line, const YAML::Node& value,
                  Source& src) {
  const std::string path = path_of(section, key);
  if (section.empty() && is_section(key)) {
    if (value.IsNull()) return Status::ok();  // "model:" with nothing under it: the defaults
    if (!value.IsMap()) {
      return Status::invalid_argument(src.where(line) + ": " + path,
                                      "a map of the keys of '" + key + "' (" + join(keys_of(key), ", ") + ")",
                                      describe(value));
    }
    return read_map(c, key, value, src);
  }
  bool known = false;
  Status status;
  for_each_key(c, [&](std::string_view s, std::string_view k, auto& field, const Rule& rule) {
    if (known || s != section || k != key) return;
    known = true;
    using T = std::decay_t<decltype(field)>;
    T v = field;
    status = read_value(value, v, path, line, src, rule);
    if (status.is_ok()) status = check_rule(path, v, rule);
    if (!status.is_ok() && status.subject() == path) status = std::move(status).with_context(src.where(line));
    if (status.is_ok()) field = std::move(v);
  });
  if (!known) {
    const std::string what = section.empty() ? "a top-level key" : "a key of '" + std::string(section) + "'";
    return Status::invalid_argument(src.where(line) + ": " + path, what + " (" + join(keys_of(section), ", ") + ")",
                                    "an unknown key", unknown_key_hint(section, key));
  }
  if (status.is_ok()) src.lines[path] = line;
  return status;
}

Status read_map(TrainConfig& c, std::string_view section, const YAML::Node& map, Source& src) {
  std::map<std::string, int> seen;  // key -> line, to refuse a key given twice
  for (const auto& kv : map) {      // by value: yaml-cpp's it->first points into a temporary
    const YAML::Node& k = kv.first;
    const int line = src.has_lines ? line_of(k) : 1;
    if (!k.IsScalar()) {
      return Status::invalid_argument(src.where(line) + (section.empty() ? "" : ": " + std::string(section)),
                                      "a key name", describe(k));
    }
    const std::string key = k.Scalar();
    auto [prev, fresh] = seen.emplace(key, line);
    if (!fresh) {
      return Status::invalid_argument(
          src.where(line) + ": " + path_of(section, key), "each key once",
          src.has_lines ? "it again (first on line " + std::to_string(prev->second) + ")" : "it again");
    }
    ASPEN_RETURN_IF_ERROR(read_entry(c, section, key, line, kv.second, src));
  }
  return Status::ok();
}

// validate(), with the error placed at the line of the key it names.
Status validate_at(const TrainConfig& c, const Source& src) {
  Status s = c.validate();
  if (s.is_ok()) return s;
  auto it = src.lines.find(s.subject());
  return std::move(s).with_context(it != src.lines.end() ? src.where(it->second) : src.origin);
}

// ---- writing -----------------------------------------------------------------------

// Strings that read back as themselves unquoted (in block and flow context);
// everything else is double-quoted.
bool plain_safe(std::string_view s) {
  if (s.empty() || s == "null" || s == "Null" || s == "NULL") return false;
  const auto ok_first = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '/';
  };
  if (!ok_first(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char ch) { return ok_first(ch) || ch == '.' || ch == '-' || ch == '+'; });
}

std::string yaml_string(std::string_view s) {
  if (plain_safe(s)) return std::string(s);
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

template <class T>
std::string yaml_value(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return yaml_string(v);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + yaml_string(v[i]);
    return out + "]";
  } else if constexpr (std::is_same_v<T, StringMap>) {
    std::string out = "{";
    for (const auto& [k, x] : v) out += (out.size() > 1 ? ", " : "") + yaml_string(k) + ": " + yaml_string(x);
    return out + "}";
  } else {
    return value_text(v);
  }
}

}  // namespace

bool ModelSection::is_onnx() const {
  return from.size() > 5 && (from.ends_with(".onnx") || from.ends_with(".ONNX"));
}

int64_t TrainConfig::global_batch() const { return batch.micro * batch.accumulation * batch.replicas; }

parallel::MeshShape mesh_shape(const TrainConfig& c) {
  return {.data = int(c.batch.replicas), .pipe = int(c.parallel.pipeline_stages), .tensor = int(c.parallel.tensor_parallel)};
}

Result<std::optional<kernels::SparsityConfig>> sparse_attention(const ModelSection& m, int64_t n_head,
                                                                 uint64_t seed, bool encoder) {
  if (m.attention.empty()) return std::optional<kernels::SparsityConfig>();
  auto bad = [](const std::string& key, const std::string& expected, const std::string& found,
                const std::string& hint = "") {
    return Status::invalid_argument("model.attention." + key, expected, found, hint);
  };
  const std::string kinds = "dense, fixed, variable, bigbird, bslongformer (or longformer) or local_sliding_window";
  const auto kind_it = m.attention.find("kind");
  if (kind_it == m.attention.end())
    return bad("kind", "a kind of layout (" + kinds + ")", "none", "e.g. model.attention: {kind: bigbird, block: 64}");
  const Result<kernels::SparsityConfig::Kind> kind =
      kernels::parse_sparsity_kind(kind_it->second == "longformer" ? "bslongformer" : kind_it->second);
  if (!kind.is_ok()) return bad("kind", "one of " + kinds, "'" + kind_it->second + "'");
  const std::string kind_name = kernels::sparsity_kind_name(*kind);
  kernels::SparsityConfig c = kernels::SparsityConfig::of(*kind, n_head);
  // A decoder attends earlier tokens only: its layouts are DeepSpeed's unidirectional ones unless asked.
  c.attention = encoder ? kernels::SparsityConfig::Attention::bidirectional
                        : kernels::SparsityConfig::Attention::unidirectional;
  c.seed = seed;
  auto integer = [&](const std::string& key, const std::string& text, int64_t min, int64_t* out) -> Status {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || v < min)
      return bad(key, "an integer >= " + std::to_string(min), "'" + text + "'");
    *out = v;
    return Status();
  };
  auto flag = [&](const std::string& key, const std::string& text, bool* out) -> Status {
    if (text != "true" && text != "false") return bad(key, "true or false", "'" + text + "'");
    *out = text == "true";
    return Status();
  };
  // A list of block indices as YAML writes it ("[0, 2]"; a map's list value is kept so) or "0, 2".
  auto list = [&](const std::string& key, std::string text, std::vector<int64_t>* out) -> Status {
    if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
    out->clear();
    size_t i = 0;
    while (i <= text.size()) {
      const size_t comma = std::min(text.find(',', i), text.size());
      std::string item = text.substr(i, comma - i);
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      if (!item.empty() || comma < text.size()) {
        int64_t v = 0;
        if (!integer(key, item, 0, &v).is_ok()) return bad(key, "a list of integers >= 0 (e.g. [0, 2])", "'" + text + "'");
        out->push_back(v);
      }
      i = comma + 1;
    }
    return Status();
  };
  for (const auto& [key, value] : m.attention) {
    if (key == "kind") continue;
    if (!kernels::sparsity_reads(*kind, key)) {
      std::string readers;
      for (const char* k : {"dense", "fixed", "variable", "bigbird", "bslongformer", "local_sliding_window"})
        if (kernels::sparsity_reads(*kernels::parse_sparsity_kind(k), key)) readers += (readers.empty() ? "" : ", ") + std::string(k);
      return bad(key, "a key of " + kind_name + " sparsity (kind, " + kernels::sparsity_keys(*kind) + ")",
                 "'" + value + "'",
                 readers.empty() ? "" : "only " + readers + " read " + key + " (DeepSpeed's sparsity configs)");
    }
    Status s;
    if (key == "block") {
      s = integer(key, value, 1, &c.block);
    } else if (key == "num_random_blocks") {
      s = integer(key, value, 0, &c.num_random_blocks);
    } else if (key == "num_sliding_window_blocks") {
      s = integer(key, value, 0, &c.num_sliding_window_blocks);
    } else if (key == "num_global_blocks") {
      s = integer(key, value, 0, &c.num_global_blocks);
    } else if (key == "num_local_blocks") {
      s = integer(key, value, 1, &c.num_local_blocks);
    } else if (key == "num_different_global_patterns") {
      s = integer(key, value, 1, &c.num_different_global_patterns);
    } else if (key == "horizontal_global_attention") {
      s = flag(key, value, &c.horizontal_global_attention);
    } else if (key == "different_layout_per_head") {
      s = flag(key, value, &c.different_layout_per_head);
    } else if (key == "local_window_blocks") {
      s = list(key, value, &c.local_window_blocks);
    } else if (key == "global_block_indices") {
      s = list(key, value, &c.global_block_indices);
    } else if (key == "global_block_end_indices") {
      s = list(key, value, &c.global_block_end_indices);
    } else if (key == "attention") {
      Result<kernels::SparsityConfig::Attention> a = kernels::parse_attention(value);
      if (!a.is_ok()) return bad(key, "unidirectional or bidirectional", "'" + value + "'");
      if (encoder && *a != kernels::SparsityConfig::Attention::bidirectional)
        return bad(key, "bidirectional for an encoder (BERT attends both ways)", "'" + value + "'");
      c.attention = *a;
    }
    ASPEN_RETURN_IF_ERROR(s);
  }
  ASPEN_RETURN_IF_ERROR(kernels::validate(c).with_context("model.attention"));
  return std::optional<kernels::SparsityConfig>(c);
}

Status TrainConfig::validate() const {
  Status first;
  for_each_key(*this, [&](std::string_view s, std::string_view k, const auto& v, const Rule& rule) {
    if (first.is_ok()) first = check_rule(path_of(s, k), v, rule);
  });
  ASPEN_RETURN_IF_ERROR(first);

  // `name` names the run directory runs/<name>.
  const bool name_ok =
      !name.empty() && name != "." && name != ".." && std::all_of(name.begin(), name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
      });
  if (!name_ok) {
    return Status::invalid_argument("name", "letters, digits, '.', '_' or '-' (it names the directory runs/<name>)",
                                    value_text(name));
  }

  int64_t product = 0;
  if (__builtin_mul_overflow(batch.micro, batch.accumulation, &product) ||
      __builtin_mul_overflow(product, batch.replicas, &product)) {
    return Status::invalid_argument("batch.micro", "micro * accumulation * replicas to fit in 64 bits",
                                    std::to_string(batch.micro) + " * " + std::to_string(batch.accumulation) + " * " +
                                        std::to_string(batch.replicas));
  }
  if (batch.global != 0 && batch.global != product) {
    return Status::invalid_argument("batch.global",
                                    "0 or micro * accumulation * replicas = " + std::to_string(batch.micro) + " * " +
                                        std::to_string(batch.accumulation) + " * " + std::to_string(batch.replicas) +
                                        " = " + std::to_string(product),
                                    std::to_string(batch.global));
  }

  if (precision.partials != "f32" && precision.partials != precision.compute) {
    return Status::invalid_argument("precision.partials", "'f32' or the compute type '" + precision.compute + "'",
                                    value_text(precision.partials));
  }

  if (schedule.warmup_steps > train.steps) {
    return Status::invalid_argument("schedule.warmup_steps", "at most train.steps = " + std::to_string(train.steps),
                                    std::to_string(schedule.warmup_steps));
  }

  if (optimizer.name == "sgd" && optimizer.nesterov && optimizer.momentum == 0) {
    return Status::invalid_argument("optimizer.nesterov", "false when optimizer.momentum is 0", "true",
                                    "Nesterov's method needs a momentum > 0");
  }

  if (model.is_onnx()) {  // the graph is the user's: what the built-in families alone have is refused
    if (parallel.tensor_parallel != 1)
      return Status::invalid_argument("parallel.tensor_parallel",
                                      "1 for an ONNX model (tensor shards split the built-in families' layers)",
                                      std::to_string(parallel.tensor_parallel));
    if (!sample.prompts.empty())
      return Status::invalid_argument("sample.prompts", "none for an ONNX model (samples come from the built-in families)",
                                      "a list of " + std::to_string(sample.prompts.size()));
    if (model.targets.empty()) return Status::invalid_argument("model.targets", "a data column's name", "''");
    if (data.packing)
      return Status::invalid_argument("data.packing", "false for an ONNX model (its attention takes no document ids)",
                                      "true");
    if (!model.attention.empty())
      return Status::invalid_argument("model.attention", "empty for an ONNX model (its attention is its own)",
                                      "a map of " + std::to_string(model.attention.size()));
    if (model.attention_dropout != 0)
      return Status::invalid_argument("model.attention_dropout", "0 for an ONNX model (its attention is its own)",
                                      value_text(model.attention_dropout));
    if (model.max_positions != 0)
      return Status::invalid_argument("model.max_positions", "0 for an ONNX model (a BERT from a Hugging Face directory)",
                                      std::to_string(model.max_positions));
  } else {
    const ModelSection defaults;
    const char* onnx_only = !model.inputs.empty()                  ? "model.inputs"
                            : !model.output.empty()                ? "model.output"
                            : model.loss != defaults.loss          ? "model.loss"
                            : model.targets != defaults.targets    ? "model.targets"
                            : model.ignore_index != defaults.ignore_index ? "model.ignore_index"
                            : !model.frozen.empty()                ? "model.frozen"
                            : !model.trainable.empty()             ? "model.trainable"
                                                                   : nullptr;
    if (onnx_only)
      return Status::invalid_argument(onnx_only, "its default unless model.from names an .onnx file",
                                      model.from.empty() ? std::string("a value for a model from scratch")
                                                         : "a value with model.from " + value_text(model.from),
                                      "the built-in families know their inputs and loss");
  }

  if (model.from.empty() && model.max_positions != 0)
    return Status::invalid_argument("model.max_positions", "0 for a model from scratch (it grows a BERT's from model.from)",
                                    std::to_string(model.max_positions), "from scratch, model.n_positions sets the context");
  if (model.from.empty()) {  // from scratch: the shape must make sense; a fine-tune takes it from config.json
    if (model.d_model % model.n_head != 0) {
      return Status::invalid_argument("model.n_head", "a divisor of model.d_model = " + std::to_string(model.d_model),
                                      std::to_string(model.n_head));
    }
    const int64_t head_dim = model.d_model / model.n_head;
    if (model.family != "gptj" && model.rotary_dim != 0) {
      return Status::invalid_argument("model.rotary_dim",
                                      "0 for family '" + model.family +
                                          "' (gpt2 has no rotary embeddings; llama rotates every channel)",
                                      std::to_string(model.rotary_dim));
    }
    if (model.family != "llama" && model.n_kv_head != 0) {
      return Status::invalid_argument("model.n_kv_head", "0 for family '" + model.family + "' (llama only)",
                                      std::to_string(model.n_kv_head));
    }
    if (model.family == "llama") {
      if (model.n_kv_head != 0 && model.n_head % model.n_kv_head != 0)
        return Status::invalid_argument("model.n_kv_head", "a divisor of model.n_head = " + std::to_string(model.n_head),
                                        std::to_string(model.n_kv_head));
      if (head_dim % 2 != 0)
        return Status::invalid_argument("model.n_head", "a head_dim (d_model / n_head) that is even (rotary pairs)",
                                        "head_dim = " + std::to_string(head_dim));
    }
    if (model.family == "gptj") {
      if (model.rotary_dim > head_dim) {
        return Status::invalid_argument("model.rotary_dim",
                                        "at most head_dim = d_model / n_head = " + std::to_string(head_dim),
                                        std::to_string(model.rotary_dim));
      }
      const int64_t rotary = model.rotary_dim == 0 ? head_dim : model.rotary_dim;
      if (rotary % 2 != 0) {
        return Status::invalid_argument(
            "model.rotary_dim", model.rotary_dim == 0 ? "an even head_dim (0 means head_dim)" : "an even number",
            model.rotary_dim == 0 ? "head_dim = " + std::to_string(head_dim) : std::to_string(model.rotary_dim));
      }
    }
    if (data.seq > model.n_positions) {
      return Status::invalid_argument("data.seq", "at most model.n_positions = " + std::to_string(model.n_positions),
                                      std::to_string(data.seq));
    }
  }
  return Status::ok();
}

Result<TrainConfig> parse_train_config(std::string_view yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(yaml_text));
    if (docs.size() > 1) {  // a second document ("---") would be ignored: surely a mistake
      return Status::invalid_argument(origin + ":" + std::to_string(line_of(docs[1])), "one YAML document",
                                      std::to_string(docs.size()) + " documents");
    }
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::ParserException& e) {
    return Status::invalid_argument(origin + ":" + std::to_string(e.mark.line + 1), "valid YAML", e.msg);
  } catch (const YAML::Exception& e) {
    return Status::invalid_argument(origin, "valid YAML", e.what());
  }
  TrainConfig c;
  Source src{.origin = origin};
  if (root.IsNull()) return c;  // an empty file (or only comments): the defaults
  if (!root.IsMap()) {
    return Status::invalid_argument(src.where(line_of(root)),
                                    "a map of top-level keys (" + join(keys_of(""), ", ") + ")", describe(root));
  }
  ASPEN_RETURN_IF_ERROR(read_map(c, "", root, src));
  ASPEN_RETURN_IF_ERROR(validate_at(c, src));
  return c;
}

Result<TrainConfig> load_train_config(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path));
  return parse_train_config(text, path);
}

Status apply_override(TrainConfig& c, std::string_view assignment) {
  const std::string subject = "override '" + std::string(assignment) + "'";
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return Status::invalid_argument(subject, "key.path=value (e.g. optimizer.lr=1e-3)",
                                    eq == 0 ? "no key before '='" : "no '='");
  }
  const std::string path(assignment.substr(0, eq));
  YAML::Node value;
  try {
    value = YAML::Load(std::string(assignment.substr(eq + 1)));
  } catch (const YAML::Exception& e) {
    return Status::invalid_argument(subject + ": " + path, "a YAML value", e.msg);
  }
  // "optimizer.lr": section "optimizer", key "lr"; "name" or "optimizer": a top-level key.
  const size_t dot = path.find('.');
  std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
  std::string key = dot == std::string::npos ? path : path.substr(dot + 1);
  Source src{.origin = subject, .has_lines = false};
  if (!section.empty() && !is_section(section)) {
    return Status::invalid_argument(subject + ": " + section, "a section (" + join(keys_of(""), ", ") + ")",
                                    "an unknown key", unknown_key_hint("", section));
  }
  // "model.attention.kind=bigbird": one entry of a map-valued key (model.attention, model.inputs); an
  // empty value removes the entry. The map so read passes the key's own checks.
  if (const size_t dot2 = key.find('.'); dot2 != std::string::npos) {
    const std::string map_key = key.substr(0, dot2), entry = key.substr(dot2 + 1);
    const StringMap* current = nullptr;
    for_each_key(c, [&](std::string_view s, std::string_view k, const auto& field, const Rule&) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, StringMap>)
        if (s == section && k == map_key) current = &field;
    });
    if (current != nullptr) {
      if (value.IsMap())
        return Status::invalid_argument(subject + ": " + path, "a single value for an entry of " + section + "." + map_key,
                                        describe(value));
      YAML::Node merged(YAML::NodeType::Map);
      for (const auto& [k, v] : *current)
        if (k != entry) merged[k] = v;
      if (!value.IsNull()) merged[entry] = value;
      TrainConfig updated = c;
      ASPEN_RETURN_IF_ERROR(read_entry(updated, section, map_key, 1, merged, src));
      c = std::move(updated);
      return Status::ok();
    }
  }
  TrainConfig updated = c;
  ASPEN_RETURN_IF_ERROR(read_entry(updated, section, key, 1, value, src));
  c = std::move(updated);
  return Status::ok();
}

std::vector<std::pair<std::string, std::string>> config_entries(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for_each_key(c, [&](std::string_view section, std::string_view key, const auto& v, const Rule&) {
    out.emplace_back((section.empty() ? std::string() : std::string(section) + ".") + std::string(key), yaml_value(v));
  });
  return out;
}

std::string to_yaml(const TrainConfig& c) {
  std::string out = "# aspen training config: every key (docs/training.md describes them)\n";
  std::string_view current;
  for_each_key(c, [&](std::string_view section, std::string_view key, const auto& v, const Rule&) {
    if (section != current) {
      out += "\n" + std::string(section) + ":\n";
      current = section;
    }
    out += (section.empty() ? "" : "  ") + std::string(key) + ": " + yaml_value(v) + "\n";
  });
  return out;
}

Result<TrainingOptions> training_options(const TrainConfig& c) {
  TrainingOptions to;
  ASPEN_ASSIGN_OR_RETURN(to.optimizer.kind, parse_optimizer_kind(c.optimizer.name));
  to.optimizer.beta1 = c.optimizer.beta1, to.optimizer.beta2 = c.optimizer.beta2, to.optimizer.eps = c.optimizer.eps;
  to.optimizer.weight_decay = c.optimizer.weight_decay;
  to.optimizer.momentum = c.optimizer.momentum, to.optimizer.nesterov = c.optimizer.nesterov;
  to.optimizer.no_decay = c.optimizer.no_decay;
  ASPEN_ASSIGN_OR_RETURN(to.schedule.kind, parse_schedule_kind(c.schedule.name));
  to.schedule.lr = c.optimizer.lr;
  to.schedule.warmup_steps = c.schedule.warmup_steps;
  to.schedule.total_steps = c.train.steps;
  to.schedule.min_lr_ratio = c.schedule.min_lr_ratio;
  to.clip_grad_norm = c.optimizer.clip_grad_norm;
  ASPEN_ASSIGN_OR_RETURN(to.loss_scaling.mode, parse_loss_scaling(c.precision.loss_scaling));
  to.loss_scaling.initial_scale = c.precision.loss_scale;
  to.loss_scaling.growth_factor = c.precision.growth_factor;
  to.loss_scaling.backoff_factor = c.precision.backoff_factor;
  to.loss_scaling.growth_interval = c.precision.growth_interval;
  to.loss_scaling.hysteresis = c.precision.hysteresis;
  to.reduction = c.parallel.reduction == "sum" ? Reduction::sum : Reduction::mean;
  to.data_parallel.bucket_bytes = c.parallel.bucket_mb << 20;
  to.data_parallel.compression = c.parallel.compression == "bf16"   ? parallel::Compression::bf16
                                 : c.parallel.compression == "topk" ? parallel::Compression::topk
                                                                    : parallel::Compression::none;
  to.data_parallel.topk_ratio = c.parallel.topk_ratio;
  to.data_parallel.comm.timeout = std::chrono::seconds(c.parallel.timeout_s);
  to.data_parallel.shard_optimizer_state = c.parallel.shard_optimizer_state;
  to.data_parallel.overlap = c.parallel.overlap;
  to.pipeline.stages = int(c.parallel.pipeline_stages);
  ASPEN_ASSIGN_OR_RETURN(to.pipeline.schedule, parse_pipeline_schedule(c.parallel.schedule));
  to.pipeline.balance = c.parallel.balance == "measured" ? TrainingOptions::Balance::measured
                        : c.parallel.balance == "dynamic" ? TrainingOptions::Balance::dynamic
                                                          : TrainingOptions::Balance::estimated;
  to.pipeline.recompute = c.parallel.recompute;
  return to;
}

}  // namespace aspen::train
