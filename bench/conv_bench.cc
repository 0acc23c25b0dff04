#include "bench/conv_bench.h"

#include <fmt/format.h>

#include <dnnl.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "bench/common.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "kernels/conv.h"

namespace aspen::bench {

namespace {

struct Layer {
  std::string model;
  int64_t N, C, M, H, W, K, stride, pad;
};

// The distinct convolutions of each model, in order.
std::vector<Layer> layers(bool quick) {
  std::vector<Layer> out = {{"mnist_cnn b16", 16, 1, 32, 28, 28, 3, 1, 0}, {"mnist_cnn b16", 16, 32, 64, 13, 13, 3, 1, 0}};
  if (quick) return out;
  for (auto [name, N, S] : {std::tuple<const char*, int64_t, int64_t>{"resnet18 64x64 b8", 8, 64},
                            std::tuple<const char*, int64_t, int64_t>{"resnet18 224x224 b1", 1, 224}}) {
    out.push_back({name, N, 3, 64, S, S, 7, 2, 3});
    int64_t h = S / 4, c = 64;
    for (int64_t m : {64, 128, 256, 512}) {
      if (m != c) {
        out.push_back({name, N, c, m, h, h, 3, 2, 1});  // the block's first, strided
        out.push_back({name, N, c, m, h, h, 1, 2, 0});  // its shortcut
        h /= 2;
      }
      out.push_back({name, N, m, m, h, h, 3, 1, 1});
      c = m;
    }
  }
  return out;
}

kernels::ConvShape shape_of(const Layer& l) {
  kernels::ConvShape s;
  s.N = l.N, s.C = l.C, s.M = l.M;
  s.D = {1, l.H, l.W}, s.K = {1, l.K, l.K}, s.S = {1, l.stride, l.stride};
  s.PadBegin = {0, l.pad, l.pad}, s.PadEnd = {0, l.pad, l.pad};
  s.set_outputs();
  return s;
}

// oneDNN driven directly: the primitive for the pass with every layout its choice, inputs already in those
// layouts (reordered once, outside the timing).
class DirectConv {
 public:
  DirectConv(const kernels::ConvShape& s, kernels::ConvPass pass, bool inference) : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc x({s.N, s.C, s.D[1], s.D[2]}, dt::f32, tag::any),
        w({s.M, s.C, s.K[1], s.K[2]}, dt::f32, tag::any), y({s.N, s.M, s.O[1], s.O[2]}, dt::f32, tag::any);
    const dnnl::memory::dims st = {s.S[1], s.S[2]}, dil = {0, 0}, pl = {s.PadBegin[1], s.PadBegin[2]},
                             pr = {s.PadEnd[1], s.PadEnd[2]};
    const auto alg = dnnl::algorithm::convolution_direct;
    const auto prop = inference ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training;
    dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(prop, alg, x, w, y, st, dil, pl, pr), eng_);
    std::vector<std::pair<int, dnnl::memory::desc>> mds;
    if (pass == kernels::ConvPass::forward) {
      prim_ = dnnl::convolution_forward(fwd);
      mds = {{DNNL_ARG_SRC, fwd.src_desc()}, {DNNL_ARG_WEIGHTS, fwd.weights_desc()}, {DNNL_ARG_DST, fwd.dst_desc()}};
    } else if (pass == kernels::ConvPass::backward_data) {
      dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(alg, x, w, y, st, dil, pl, pr), eng_, fwd);
      prim_ = dnnl::convolution_backward_data(pd);
      mds = {{DNNL_ARG_DIFF_DST, pd.diff_dst_desc()}, {DNNL_ARG_WEIGHTS, pd.weights_desc()},
             {DNNL_ARG_DIFF_SRC, pd.diff_src_desc()}};
    } else {
      dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(alg, x, w, y, st, dil, pl, pr), eng_, fwd);
      prim_ = dnnl::convolution_backward_weights(pd);
      mds = {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_DIFF_DST, pd.diff_dst_desc()},
             {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc()}};
    }
    uint64_t seed = 11;
    for (auto& [arg, md] : mds) {
      dnnl::memory m(md, eng_);
      const size_t n = md.get_size() / sizeof(float);
      philox_fill_uniform({static_cast<float*>(m.get_data_handle()), n}, seed++, 0, 0, -1.0f, 1.0f);
      args_.emplace(arg, m);
    }
  }
  void run() {
    prim_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::primitive prim_;
  std::unordered_map<int, dnnl::memory> args_;
};

}  // namespace

Status run_conv_bench(const ConvBenchOptions& opt, std::ostream& out) {
  ScopedOmpThreads team(opt.threads);
  const double min_s = opt.quick ? 0.02 : 0.2;
  const int rounds = opt.quick ? 1 : 5;
  if (!opt.json)
    out << fmt::format("# {} thread(s); aspen's ConvPlan (channels-first in and out) vs oneDNN on its own layouts\n",
                       opt.threads);
  std::set<std::string> seen;
  double sum_aspen = 0, sum_onednn = 0;
  for (const Layer& l : layers(opt.quick)) {
    const kernels::ConvShape s = shape_of(l);
    const std::string key = s.to_string();
    if (!seen.insert(l.model + key).second) continue;
    const double flops = 2.0 * double(s.y_numel()) * double(s.C) * double(s.K[1] * s.K[2]);
    struct Pass {
      const char* name;
      kernels::ConvPass pass;
      bool inference;
    };
    for (const Pass& p : {Pass{"forward", kernels::ConvPass::forward, false},
                          Pass{"backward_data", kernels::ConvPass::backward_data, false},
                          Pass{"backward_weights", kernels::ConvPass::backward_weights, false},
                          Pass{"inference", kernels::ConvPass::forward, true}}) {
      ASPEN_ASSIGN_OR_RETURN(kernels::ConvPlan plan, kernels::ConvPlan::make(s, p.pass, DType::f32, false, p.inference));
      const int64_t na = p.pass == kernels::ConvPass::backward_data ? s.y_numel() : s.x_numel();
      const int64_t nb = p.pass == kernels::ConvPass::backward_weights ? s.y_numel() : s.w_numel();
      const int64_t no = p.pass == kernels::ConvPass::forward         ? s.y_numel()
                         : p.pass == kernels::ConvPass::backward_data ? s.x_numel()
                                                                     : s.w_numel();
      std::vector<float> a(static_cast<size_t>(na)), b(static_cast<size_t>(nb)), o(static_cast<size_t>(no));
      philox_fill_uniform(std::span<float>(a), 1, 0, 0, -1.0f, 1.0f);
      philox_fill_uniform(std::span<float>(b), 2, 0, 0, -1.0f, 1.0f);
      DirectConv direct(s, p.pass, p.inference);
      Status st;
      // NOTE [guarded rows]: the FMA peak beside each row (not in --quick).
      std::function<double()> ceiling;
      if (!opt.quick) ceiling = [&] { return measure_f32_fma_peak(opt.threads); };
      const RowTimes times = guarded_rounds(
          {[&] {
             if (st.is_ok()) st = plan.run(a.data(), b.data(), nullptr, o.data());
           },
           [&] { direct.run(); }},
          ceiling, rounds, min_s);
      const std::vector<double>& t = times.min;
      ASPEN_RETURN_IF_ERROR(st);
      const double ratio = t[1] / t[0];
      sum_aspen += t[0];
      sum_onednn += t[1];
      const std::string shape = fmt::format("N{} C{} M{} {}x{} k{} s{}", l.N, l.C, l.M, l.H, l.W, l.K, l.stride);
      if (opt.json) {
        nlohmann::ordered_json row{{"bench", "conv"},          {"model", l.model},         {"shape", shape},
                                   {"pass", p.name},           {"threads", opt.threads},   {"aspen_ms", t[0] * 1e3},
                                   {"onednn_ms", t[1] * 1e3},  {"aspen_gflops", flops / t[0] * 1e-9},
                                   {"onednn_gflops", flops / t[1] * 1e-9}, {"ratio_vs_onednn", ratio}};
        row["aspen_s"] = spread_json(times, 0);
        row["onednn_s"] = spread_json(times, 1);
        add_guard_fields(row, times);
        out << row.dump() << "\n";
      } else {
        out << fmt::format("{:20s} {:28s} {:16s} aspen {:7.3f} ms {:6.1f} GFLOP/s, oneDNN {:7.3f} ms {:6.1f} GFLOP/s, "
                           "ratio_vs_onednn {:.2f}{}\n",
                           l.model, shape, p.name, t[0] * 1e3, flops / t[0] * 1e-9, t[1] * 1e3, flops / t[1] * 1e-9,
                           ratio, times.disturbed ? fmt::format("  (disturbed: the peak moved {:.0f}%)", 100 * times.drift())
                                                  : std::string());
      }
    }
  }
  if (opt.json)
    out << nlohmann::json{{"bench", "conv"}, {"summary", true}, {"ratio_vs_onednn", sum_onednn / sum_aspen}}.dump()
        << "\n";
  else
    out << fmt::format("# all rows: ratio_vs_onednn {:.2f} (sum of oneDNN's times / sum of aspen's)\n",
                       sum_onednn / sum_aspen);
  return Status();
}

}  // namespace aspen::bench
