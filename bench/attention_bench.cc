#include "bench/attention_bench.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "bench/common.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "io/npy.h"
#include "kernels/attention.h"
#include "kernels/attention_layout.h"
#include "kernels/convert.h"

namespace aspen::bench {

namespace {

using Kind = kernels::AttentionMask::Kind;

Status check_option(const char* name, int64_t value) {
  if (value < 1)
    return Status::invalid_argument(std::string("attention bench: ") + name, ">= 1", std::to_string(value));
  return Status();
}

bool is_layout(const std::string& kind) { return kind == "bigbird" || kind == "longformer"; }

// DeepSpeed's layout of a layout row, one per head (seed 1).
Result<kernels::BlockLayout> layout_of(const std::string& kind, const AttentionBenchOptions& o, int64_t T) {
  kernels::SparsityConfig c =
      kind == "bigbird" ? kernels::SparsityConfig::bigbird(o.heads) : kernels::SparsityConfig::bslongformer(o.heads);
  c.block = o.block;
  c.different_layout_per_head = true;
  c.seed = 1;
  return kernels::make_layout(c, T);
}

// The row's mask over [1, S] keys; `segments` receives blockdiag's document ids; layout rows read `layout`.
kernels::AttentionMask mask_of(const std::string& kind, const AttentionBenchOptions& o, int64_t T,
                               std::vector<int32_t>& segments, const kernels::BlockLayout* layout) {
  kernels::AttentionMask m;
  // decode: one query row (the last position) sees every cached key.
  m.kind = kind == "local" ? Kind::local : is_layout(kind) || kind == "decode" ? Kind::none : Kind::causal;
  if (layout) {
    m.layout = layout->bits;
    m.layout_block = layout->block;
    m.layout_heads = layout->heads;
  }
  if (kind == "local") m.window = o.window;
  if (kind == "blockdiag") {
    const int64_t size = std::max<int64_t>(1, T / o.documents);
    segments.resize(size_t(T));
    for (int64_t j = 0; j < T; ++j) segments[size_t(j)] = int32_t(j / size);
    m.segments = segments;
  }
  return m;
}

using Key = std::tuple<std::string, int64_t, std::string, std::string>;  // mask, T, dtype, pass

// bench/torch_attention.py over every row: seconds by (mask, T, pass); a note when it did not run.
std::string run_peer(const AttentionBenchOptions& o, const std::string& layouts, std::map<Key, double>& seconds,
                     std::map<Key, double>& flex) {
  auto join = [](const auto& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + fmt::format("{}", x);
    return s;
  };
  const std::string script = std::string(ASPEN_SOURCE_DIR) + "/bench/torch_attention.py";
  const std::string cmd =
      fmt::format("{} {} --json --t {} --masks {} --passes {} --dtypes {} --heads {} --d {} --window {} "
                  "--documents {} --threads {} --repeats {} --layouts '{}' --layout-max-t {}{} 2>/dev/null",
                  o.python, script, join(o.t), join(o.masks), join(o.passes), join(o.dtypes), o.heads, o.d, o.window,
                  o.documents, o.threads, o.repeats, layouts, o.peer_layout_max_t, o.flex ? " --flex" : "");
  const bool ran = read_json_lines(cmd, [&](const nlohmann::json& j) {
    const std::string bench = j.value("bench", "");
    if (bench != "attention_torch" && bench != "attention_flex") return;
    (bench == "attention_flex" ? flex : seconds)[{j.value("mask", ""), j.value("T", int64_t(0)),
                                                  j.value("dtype", "f32"), j.value("pass", "")}] =
        j.value("seconds", 0.0);
  });
  if (ran && !seconds.empty()) return "";
  return "PyTorch peer: no result (run " + o.python + " " + script + " to see why)";
}

}  // namespace

Status run_attention_bench(const AttentionBenchOptions& opt, std::ostream& out) {
  for (int64_t t : opt.t) ASPEN_RETURN_IF_ERROR(check_option("--t", t));
  ASPEN_RETURN_IF_ERROR(check_option("--heads", opt.heads));
  ASPEN_RETURN_IF_ERROR(check_option("--d", opt.d));
  ASPEN_RETURN_IF_ERROR(check_option("--threads", opt.threads));
  ASPEN_RETURN_IF_ERROR(check_option("--repeats", opt.repeats));
  ASPEN_RETURN_IF_ERROR(check_option("--rounds", opt.rounds));
  ASPEN_RETURN_IF_ERROR(check_option("--window", opt.window));
  ASPEN_RETURN_IF_ERROR(check_option("--documents", opt.documents));
  for (const std::string& m : opt.masks)
    if (m != "causal" && m != "local" && m != "blockdiag" && m != "decode" && !is_layout(m))
      return Status::invalid_argument("attention bench: --masks",
                                      "causal, local, blockdiag, bigbird, longformer or decode", m);
  ASPEN_RETURN_IF_ERROR(check_option("--block", opt.block));
  // The peer's layouts: {mask}_{T}.npy, u8 [heads, blocks, blocks], in a directory removed at the end.
  const std::string layouts =
      (std::filesystem::temp_directory_path() / ("aspen_bench_attention_" + std::to_string(::getpid()))).string();
  struct Cleanup {
    std::string d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{layouts};
  std::filesystem::create_directories(layouts);
  for (const std::string& p : opt.passes)
    if (p != "fwd" && p != "fwd_bwd")
      return Status::invalid_argument("attention bench: --passes", "fwd or fwd_bwd", p);
  for (const std::string& d : opt.dtypes)
    if (d != "f32" && d != "bf16") return Status::invalid_argument("attention bench: --dtypes", "f32 or bf16", d);

  const int64_t B = 1, H = opt.heads, D = opt.d;
  const float scale = 1.0f / std::sqrt(float(D));
  struct Row {
    std::string mask, dtype, pass;
    int64_t T;
    double seconds, naive = 0;
    int64_t peak;
    double density = 0;  // layout rows: the share of blocks on
  };
  std::vector<Row> rows;
  // Every row of aspen's, timed once more: `mine` gets the times; the first round also records the rows.
  const auto measure_aspen = [&](std::map<Key, double>& mine, bool first) -> Status {
    ScopedOmpThreads team(opt.threads);
    for (const int64_t T : opt.t) {
      const size_t n = size_t(B * H * T * D);
      std::vector<float> q(n), k(n), v(n), o(n), lse(size_t(B * H * T)), g(n), dq(n), dk(n), dv(n);
      philox_fill_uniform(q, /*seed=*/1, /*stream=*/1, 0, -1.0f, 1.0f);
      philox_fill_uniform(k, 1, 2, 0, -1.0f, 1.0f);
      philox_fill_uniform(v, 1, 3, 0, -1.0f, 1.0f);
      philox_fill_uniform(g, 1, 4, 0, -1.0f, 1.0f);
      std::vector<bf16> qb(n), kb(n), vb(n);  // the same values rounded, for the bf16 rows
      ASPEN_RETURN_IF_ERROR(kernels::convert_f32_to_bf16(q, qb, int64_t(n)));
      ASPEN_RETURN_IF_ERROR(kernels::convert_f32_to_bf16(k, kb, int64_t(n)));
      ASPEN_RETURN_IF_ERROR(kernels::convert_f32_to_bf16(v, vb, int64_t(n)));
      for (const std::string& kind : opt.masks) {
        std::vector<int32_t> segments;
        std::optional<kernels::BlockLayout> layout;
        int64_t layout_bytes = 0;
        if (is_layout(kind)) {
          ASPEN_ASSIGN_OR_RETURN(layout, layout_of(kind, opt, T));
          // The kernel's tile states (one byte per head and 64 x 64 tile) and the layout itself.
          layout_bytes = int64_t(layout->bits.size()) + H * ((T + 63) / 64) * ((T + 63) / 64);
          if (first && T <= opt.peer_layout_max_t) {
            Tensor t(DType::u8, Shape{layout->heads, layout->blocks, layout->blocks});
            std::copy(layout->bits.begin(), layout->bits.end(), t.data<uint8_t>());
            ASPEN_RETURN_IF_ERROR(io::write_npy(fmt::format("{}/{}_{}.npy", layouts, kind, T), t));
          }
        }
        const kernels::AttentionMask mask = mask_of(kind, opt, T, segments, layout ? &*layout : nullptr);
        const int64_t seg_bytes = (segments.empty() ? 0 : 8 * B * T) + layout_bytes;
        // decode: one query row per head (the last position) over T cached keys, forward only
        // (NOTE [attention split-KV decoding] in kernels/attention.cc).
        const bool decode = kind == "decode";
        const int64_t Tq = decode ? 1 : T;
        for (const std::string& dtype : opt.dtypes)
        for (const std::string& pass : opt.passes) {
          if (decode && pass != "fwd") continue;
          Status status;
          const bool bwd = pass == "fwd_bwd", half = dtype == "bf16";
          const DType dt = half ? DType::bf16 : DType::f32;
          // q, k and v in the row's dtype (the first query row alone for decode); out, lse, gradients f32
          const auto run = [&](const auto& qx, const auto& kx, const auto& vx) {
            using E = typename std::decay_t<decltype(qx)>::value_type;
            if (status.is_ok() && decode)
              status = kernels::attention_forward(std::span<const E>(qx).first(size_t(B * H * D)), kx, vx,
                                                  std::span<float>(o).first(size_t(B * H * D)),
                                                  std::span<float>(lse).first(size_t(B * H)), B, H, H, 1, T, D,
                                                  scale, mask);
            else if (status.is_ok())
              status = kernels::attention_forward(std::span<const E>(qx), kx, vx, o, lse, B, H, H, T, T, D, scale,
                                                  mask);
            if (status.is_ok() && bwd)
              status = kernels::attention_backward(std::span<const E>(qx), kx, vx, o, lse, g, dq, dk, dv, B, H, H, T,
                                                   T, D, scale, mask);
          };
          const double s = best_seconds([&] { half ? run(qb, kb, vb) : run(q, k, v); }, opt.repeats, 0.0);
          ASPEN_RETURN_IF_ERROR(status);
          Row r{kind, dtype, pass, T, s, 0.0,
                std::max(kernels::attention_forward_scratch_bytes(B, H, H, Tq, T, D, opt.threads, dt),
                         bwd ? kernels::attention_backward_scratch_bytes(B, H, H, T, T, D, opt.threads, dt) : 0) +
                    seg_bytes,
                layout ? layout->density() : 0.0};
          if (first && kind == "causal" && !bwd && !half && T <= 2048) {  // the definition, as a check of the fast path's output
            std::vector<float> ro(n), rl(size_t(B * H * T));
            r.naive = best_seconds(
                [&] {
                  kernels::ref::attention_forward<float>(q.data(), k.data(), v.data(), ro.data(), rl.data(), B, H, H,
                                                         T, T, D, scale, mask);
                },
                1, 0.0, /*warm_up=*/false);
            double worst = 0;
            for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(ro[i] - o[i])));
            if (!(worst < 1e-4))
              return Status::error(Code::kInternal, "attention bench, T=" + std::to_string(T),
                                   "the fast and naive outputs to agree within 1e-4",
                                   "a max difference of " + std::to_string(worst));
          }
          mine[{kind, T, dtype, pass}] = s;
          if (first) rows.push_back(r);
        }
      }
    }
    return Status();
  };

  // NOTE [guarded rows], with the peer in its own process (torch): whole rounds interleave, each aspen's rows
  // then the peer's, between two measurements of the FMA peak. A round whose peak moved by more than 5 % was
  // disturbed; a row's figures come from the undisturbed rounds (all rounds, flagged, when none was).
  struct Round {
    std::map<Key, double> mine, peer, flex;
    double before = 0, after = 0;
    bool disturbed() const { return ceiling_moved(before, after); }
  };
  const bool run_peer_too = !opt.python.empty() && opt.python != "none";
  std::vector<Round> rounds(size_t(opt.rounds));
  std::string note = run_peer_too ? "" : "PyTorch peer: not run (--python none)";
  for (size_t i = 0; i < rounds.size(); ++i) {
    Round& r = rounds[i];
    r.before = measure_f32_fma_peak(opt.threads);
    ASPEN_RETURN_IF_ERROR(measure_aspen(r.mine, i == 0));
    if (run_peer_too) {
      const std::string why = run_peer(opt, layouts, r.peer, r.flex);
      if (!why.empty()) note = why;
    }
    r.after = measure_f32_fma_peak(opt.threads);
  }
  std::vector<const Round*> clean;
  for (const Round& r : rounds)
    if (!r.disturbed()) clean.push_back(&r);
  const bool disturbed = clean.empty();
  if (disturbed)
    for (const Round& r : rounds) clean.push_back(&r);
  // The spread of one figure over the rounds used (all 0 when no round has it).
  const auto spread = [&](std::map<Key, double> Round::*which, const Key& key) {
    std::vector<double> v;
    for (const Round* r : clean)
      if (const auto it = (r->*which).find(key); it != (r->*which).end() && it->second > 0) v.push_back(it->second);
    return spread_of(std::move(v));
  };
  std::map<Key, double> mine, peer, flex;  // the best of the rounds used
  for (const Row& r : rows) {
    const Key key{r.mask, r.T, r.dtype, r.pass};
    if (const Spread s = spread(&Round::mine, key); s.min > 0) mine[key] = s.min;
    if (const Spread s = spread(&Round::peer, key); s.min > 0) peer[key] = s.min;
    if (const Spread s = spread(&Round::flex, key); s.min > 0) flex[key] = s.min;
  }
  double peak_lo = 1e30, peak_hi = 0;
  for (const Round& r : rounds)
    peak_lo = std::min({peak_lo, r.before, r.after}), peak_hi = std::max({peak_hi, r.before, r.after});

  if (!opt.json)
    out << fmt::format("# self-attention, B=1 H={} D={}, {} thread(s); torch = scaled_dot_product_attention "
                       "(is_causal for causal, a dense boolean mask for the others)\n"
                       "# ratio = torch / aspen; vs dense = aspen causal / this row; peak = aspen's scratch bytes\n"
                       "{:>10} {:>6} {:>5} {:>8} | {:>10} {:>10} {:>7} | {:>8} | {:>10}{}\n",
                       H, D, opt.threads, "mask", "T", "dtype", "pass", "aspen ms", "torch ms", "ratio", "vs dense",
                       "peak", opt.flex ? fmt::format(" | {:>10} {:>8}", "flex ms", "vs flex") : "");
  if (!opt.json)
    out << fmt::format("# best of {} of {} rounds (aspen's rows, then the peer's); FMA peak {:.0f}-{:.0f} GFLOP/s{}\n",
                       clean.size(), rounds.size(), peak_lo, peak_hi,
                       disturbed ? ": DISTURBED, every round's peak moved by more than 5 %" : "");
  for (Row r : rows) {
    const Key key{r.mask, r.T, r.dtype, r.pass};
    r.seconds = mine.at(key);  // the best of the rounds used
    const auto p = peer.find(key);
    const auto dense = mine.find({"causal", r.T, r.dtype, r.pass});
    const double ratio = p != peer.end() && p->second > 0 ? p->second / r.seconds : 0.0;
    // decode is another problem (one row per head), not a sparser causal one: no speedup over dense
    const double vs_dense =
        r.mask != "causal" && r.mask != "decode" && dense != mine.end() ? dense->second / r.seconds : 0.0;
    const auto f = flex.find({r.mask, r.T, r.dtype, r.pass});
    const double fx = f != flex.end() ? f->second : 0.0;  // FlexAttention's time (--flex), 0 when none
    if (opt.json) {
      nlohmann::ordered_json j = {{"bench", "attention"}, {"mask", r.mask},       {"T", r.T},
                                  {"dtype", r.dtype},       {"pass", r.pass},       {"seconds", r.seconds},
                                  {"peak_bytes", r.peak}, {"heads", H},           {"d", D},
                                  {"threads", opt.threads}};
      if (ratio > 0) {
        j["pytorch_seconds"] = p->second;
        j["ratio_vs_pytorch"] = ratio;
      }
      if (vs_dense > 0) j["speedup_vs_dense"] = vs_dense;
      if (r.naive > 0) j["naive_seconds"] = r.naive;
      if (fx > 0) {
        j["flex_seconds"] = fx;
        j["ratio_vs_flex"] = fx / r.seconds;
      }
      if (r.density > 0) j["block_density"] = r.density;
      j["seconds_spread"] = spread_json(spread(&Round::mine, key));
      if (ratio > 0) j["pytorch_seconds_spread"] = spread_json(spread(&Round::peer, key));
      j["rounds_used"] = clean.size();
      j["rounds"] = rounds.size();
      j["peak_gflops_min"] = peak_lo;
      j["peak_gflops_max"] = peak_hi;
      if (disturbed) j["disturbed"] = true;
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:>10} {:>6} {:>5} {:>8} | {:>10.3f} {:>10} {:>7} | {:>8} | {:>6.1f} KiB{}\n", r.mask,
                         r.T, r.dtype, r.pass, r.seconds * 1e3,
                         ratio > 0 ? fmt::format("{:.3f}", p->second * 1e3) : "-",
                         ratio > 0 ? fmt::format("{:.2f}x", ratio) : "-",
                         vs_dense > 0 ? fmt::format("{:.2f}x", vs_dense) : "-", double(r.peak) / 1024.0,
                         !opt.flex ? ""
                         : fx > 0  ? fmt::format(" | {:>10.3f} {:>7.2f}x", fx * 1e3, fx / r.seconds)
                                   : fmt::format(" | {:>10} {:>8}", "-", "-"));
    }
  }
  if (!note.empty()) {
    if (opt.json)
      out << nlohmann::ordered_json({{"bench", "attention"}, {"note", note}}).dump() << "\n";
    else
      out << "# " << note << "\n";
  }
  return Status();
}

}  // namespace aspen::bench
