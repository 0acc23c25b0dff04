#include "bench/gemm_bench.h"

#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "bench/common.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/thread_team.h"
#include "kernels/matmul.h"
#include "kernels/matmul_choice.h"

namespace aspen::bench {

std::vector<GemmCase> standard_gemm_cases() {
  const bool ta = true, tb = true;
  return {
      {512, 512, 512},    {1024, 1024, 1024}, {2048, 2048, 2048},  // square
      // GPT-2 training, 1024 tokens: forward (attn.c_proj, c_attn, c_fc, mlp.c_proj, lm_head as stored
      // untransposed), then each layer's backward: dX = G W^T (b^T) and dW = X^T G (a^T).
      {1024, 768, 768},   {1024, 2304, 768},  {1024, 3072, 768},  {1024, 768, 3072}, {1024, 50257, 768},
      {1024, 768, 768, false, tb},  {768, 768, 1024, ta},     // attn.c_proj
      {1024, 768, 2304, false, tb}, {768, 2304, 1024, ta},    // c_attn
      {1024, 768, 3072, false, tb}, {768, 3072, 1024, ta},    // c_fc
      {1024, 3072, 768, false, tb}, {3072, 768, 1024, ta},    // mlp.c_proj
      {1024, 50257, 768, false, tb}, {1024, 768, 50257}, {50257, 768, 1024, ta},  // lm_head (tied): fwd, dX, dW
      {1, 3072, 768},     {1, 768, 3072},                      // decode, M = 1
  };
}

Result<GemmCase> parse_gemm_case(const std::string& text) {
  GemmCase g;
  char x1 = 0, x2 = 0;
  int used = 0;
  const std::string subject = "--case '" + text + "'";
  const char* expected = "MxNxK with positive extents, e.g. 1024x768x3072";
  const char* hint = "transposed operands: append :ta, :tb or :tatb";
  if (std::sscanf(text.c_str(), "%ld%c%ld%c%ld%n", &g.m, &x1, &g.n, &x2, &g.k, &used) != 5 || x1 != 'x' || x2 != 'x')
    return Status::invalid_argument(subject, expected, "no three extents", hint);
  if (g.m < 1 || g.n < 1 || g.k < 1) return Status::invalid_argument(subject, expected, "an extent below 1", hint);
  const std::string rest = text.substr(size_t(used));
  if (rest != "" && rest != ":ta" && rest != ":tb" && rest != ":tatb")
    return Status::invalid_argument(subject, expected, "the suffix '" + rest + "'", hint);
  g.trans_a = rest == ":ta" || rest == ":tatb";
  g.trans_b = rest == ":tb" || rest == ":tatb";
  return g;
}

namespace {

// oneDNN driven directly, as a user of the library would: one primitive and
// its memory objects made up front, then executed. Row-major op(A) [M, K]
// times op(B) [K, N] (a transposed operand is the format tag `ba`), the same
// layout aspen's plan gets.
class DirectOneDnn {
 public:
  DirectOneDnn(const GemmCase& c, bool bf16, void* a, void* b, float* out)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dt in = bf16 ? dt::bf16 : dt::f32;
    dnnl::memory::desc a_md({c.m, c.k}, in, c.trans_a ? tag::ba : tag::ab),
        b_md({c.k, c.n}, in, c.trans_b ? tag::ba : tag::ab), c_md({c.m, c.n}, dt::f32, tag::ab);
    prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng_));
    args_ = {{DNNL_ARG_SRC, dnnl::memory(a_md, eng_, a)},
             {DNNL_ARG_WEIGHTS, dnnl::memory(b_md, eng_, b)},
             {DNNL_ARG_DST, dnnl::memory(c_md, eng_, out)}};
  }
  void run() {
    prim_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::matmul prim_;
  std::unordered_map<int, dnnl::memory> args_;
};

// BLIS (Debian's libblis4, its zen3 / skx kernels picked at run time), a peer for the f32 rows: opened with
// dlopen, RTLD_LOCAL, because its BLAS symbols (sgemm_, cblas_sgemm) would otherwise interpose on OpenBLAS's.
// Called through its typed API with general strides (a transposed operand is its strides swapped), on its own
// OpenMP threading set to the row's thread count. Absent when the library is not installed (the rows say so).
class Blis {
 public:
  static const Blis* get() {
    static const Blis* blis = [] {
      auto* b = new Blis;
      b->handle_ = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
      if (!b->handle_) return static_cast<Blis*>(nullptr);
      b->sgemm_ = reinterpret_cast<Sgemm>(dlsym(b->handle_, "bli_sgemm"));
      b->threads_ = reinterpret_cast<SetThreads>(dlsym(b->handle_, "bli_thread_set_num_threads"));
      auto version = reinterpret_cast<const char* (*)()>(dlsym(b->handle_, "bli_info_get_version_str"));
      if (!b->sgemm_ || !b->threads_) return static_cast<Blis*>(nullptr);
      b->version_ = version ? version() : "?";
      return b;
    }();
    return blis;
  }
  const std::string& version() const { return version_; }
  // y [M, N] = op(a) op(b), row-major, as the case stores them.
  void sgemm(const GemmCase& c, int threads, const float* a, const float* b, float* y) const {
    threads_(threads);
    float one = 1.0f, zero = 0.0f;
    const int64_t rsa = c.trans_a ? 1 : c.k, csa = c.trans_a ? c.m : 1;
    const int64_t rsb = c.trans_b ? 1 : c.n, csb = c.trans_b ? c.k : 1;
    sgemm_(0, 0, c.m, c.n, c.k, &one, const_cast<float*>(a), rsa, csa, const_cast<float*>(b), rsb, csb, &zero, y,
           c.n, 1);
    omp_set_num_threads(threads);  // keep the team's size ours
  }

 private:
  // bli_sgemm(transa, transb, m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc); trans_t 0: none.
  using Sgemm = void (*)(int, int, int64_t, int64_t, int64_t, float*, float*, int64_t, int64_t, float*, int64_t,
                         int64_t, float*, float*, int64_t, int64_t);
  using SetThreads = void (*)(int64_t);
  void* handle_ = nullptr;
  Sgemm sgemm_ = nullptr;
  SetThreads threads_ = nullptr;
  std::string version_;
};

}  // namespace

Status run_gemm_bench(const GemmBenchOptions& opt, std::ostream& out) {
  const std::vector<GemmCase> cases = opt.cases.empty() ? standard_gemm_cases() : opt.cases;
  const int rounds = opt.quick ? 1 : 5;
  const double min_s = opt.quick ? 0.0 : 0.3;
  if (!opt.json)
    out << fmt::format("{:>5} {:>6} {:>5} {:>4} {:>5} {:>3} | {:>8} {:>8} | {:>8} {:>8} {:>11} | {:>7} {:>7} {:>6} {:>8}\n",
                       "M", "N", "K", "op", "dtype", "thr", "aspen", "backend", "kernels", "oneDNN", "OBLAS/BLIS",
                       "vs dnnl", "vs best", "peak", "bf16/f32")
        << fmt::format("# BLIS: {}\n", Blis::get() ? "libblis " + Blis::get()->version() + " (its column after OpenBLAS)"
                                                    : std::string("not installed (libblis4-openmp): no BLIS column"));
  const Blis* blis = Blis::get();
  for (int threads : opt.threads) {
    ScopedOmpThreads team(threads);
    // The ceilings drift with the host's load: each is measured again beside every case and the
    // best seen so far bounds the rows (a fraction above 1 is then a measurement fault, flagged).
    double f32_peak = measure_f32_fma_peak(threads);
    BfPeak bf_peak = measure_bf16_peak(threads);
    if (!opt.json)
      out << fmt::format("# {} thread(s): measured peak f32 FMA {:.1f} GFLOP/s, bf16 ({}) {:.1f} GFLOP/s\n",
                         threads, f32_peak, bf_peak.kind, bf_peak.gflops);
    for (const GemmCase& c : cases) {
      // Stored shapes; a transposed operand holds the same elements.
      Tensor a(DType::f32, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k});
      Tensor b(DType::f32, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n});
      Tensor y(DType::f32, Shape{c.m, c.n});
      philox_fill_uniform(a.span<float>(), 1, 0, 0, -1, 1);
      philox_fill_uniform(b.span<float>(), 2, 0, 0, -1, 1);
      const double flops = 2.0 * double(c.m) * double(c.n) * double(c.k);
      double f32_gflops = 0;  // aspen's f32 rate on this case, for the bf16 row's ratio
      for (DType dt : {DType::f32, DType::bf16}) {
        if ((dt == DType::f32 && !opt.f32) || (dt == DType::bf16 && !opt.bf16)) continue;
        const bool is_bf16 = dt == DType::bf16;
        Tensor ab(DType::bf16, a.shape()), bb(DType::bf16, b.shape());
        if (is_bf16) {
          for (int64_t i = 0; i < a.numel(); ++i) ab.data<bf16>()[i] = f32_to_bf16(a.data<float>()[i]);
          for (int64_t i = 0; i < b.numel(); ++i) bb.data<bf16>()[i] = f32_to_bf16(b.data<float>()[i]);
        }
        const void* ain = is_bf16 ? ab.raw() : a.raw();
        const void* bin = is_bf16 ? bb.raw() : b.raw();
        kernels::MatmulShape shape{.M = c.m, .N = c.n, .K = c.k, .trans_a = c.trans_a, .trans_b = c.trans_b, .input = dt};
        const bool widened = is_bf16 && kernels::bf16_matmul_widens();
        // The backend plans for this product take (NOTE [matmul choice]: measured here, or the rule).
        ASPEN_ASSIGN_OR_RETURN(const kernels::MatmulBackend chosen, kernels::choose_matmul_backend(shape, threads));
        const std::string backend = std::string(kernels::matmul_backend_name(chosen)) +
                                    (widened && chosen == kernels::MatmulBackend::onednn ? " (widened)" : "");
        Status st;
        std::vector<std::function<void()>> runs;
        runs.push_back([&] {
          st = is_bf16 ? kernels::matmul(ab.span<bf16>(), bb.span<bf16>(), {}, y.span<float>(), shape)
                       : kernels::matmul(a.span<float>(), b.span<float>(), {}, y.span<float>(), shape);
        });
        // aspen's own kernels, forced (whatever the rule picks for the first column).
        ASPEN_ASSIGN_OR_RETURN(kernels::MatmulPlan own, kernels::MatmulPlan::create(shape, kernels::MatmulBackend::aspen));
        runs.push_back([&] { own.run(ain, bin, nullptr, y.data<float>()); });
        // oneDNN has no bf16 kernels without AVX-512: that row has no oneDNN peer (null in the JSON).
        std::unique_ptr<DirectOneDnn> direct;
        if (!widened) {
          direct = std::make_unique<DirectOneDnn>(c, is_bf16, const_cast<void*>(ain), const_cast<void*>(bin),
                                                  y.data<float>());
          runs.push_back([&] { direct->run(); });
        }
        // Debian's OpenBLAS has no bf16 GEMM (sbgemm); the f32 one is the peer, called as a user
        // would: one call on OpenBLAS's own threading (its OpenMP build: this team's size). Aspen's
        // plans set its count back to 1 when they next run (NOTE [openblas tiles]).
        const size_t openblas_at = runs.size();
        if (!is_bf16)
          runs.push_back([&] {
            openblas_set_num_threads(threads);
            cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans, c.trans_b ? CblasTrans : CblasNoTrans,
                        int(c.m), int(c.n), int(c.k), 1.0f, a.data<float>(), int(c.trans_a ? c.m : c.k),
                        b.data<float>(), int(c.trans_b ? c.k : c.n), 0.0f, y.data<float>(), int(c.n));
            omp_set_num_threads(threads);  // OpenBLAS's OpenMP build set the team's size; keep it ours
          });
        const size_t blis_at = runs.size();
        if (!is_bf16 && blis)
          runs.push_back([&] { blis->sgemm(c, threads, a.data<float>(), b.data<float>(), y.data<float>()); });
        // NOTE [guarded rows]: the peak measured before and after the row (not in --quick).
        std::function<double()> ceiling;
        if (!opt.quick)
          ceiling = [&] { return is_bf16 ? measure_bf16_peak(threads).gflops : measure_f32_fma_peak(threads); };
        const RowTimes times = guarded_rounds(runs, ceiling, rounds, min_s);
        const std::vector<double>& t = times.min;
        ASPEN_RETURN_IF_ERROR(st);
        if (is_bf16) bf_peak.gflops = std::max(bf_peak.gflops, times.ceiling());
        else f32_peak = std::max(f32_peak, times.ceiling());
        const double g = flops / t[0] / 1e9, gk = flops / t[1] / 1e9;
        const double gd = direct ? flops / t[2] / 1e9 : 0;
        const double gb = !is_bf16 ? flops / t[openblas_at] / 1e9 : 0;
        const double gl = !is_bf16 && blis ? flops / t[blis_at] / 1e9 : 0;
        const double best_lib = std::max({gd, gb, gl});
        const auto or_null = [](double v) { return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
        const double peak = is_bf16 ? bf_peak.gflops : f32_peak;
        const double frac = peak > 0 ? g / peak : 0;
        const bool fault = frac > 1.0 || (peak > 0 && gk / peak > 1.0);
        if (!is_bf16) f32_gflops = g;
        const double vs_f32 = is_bf16 && f32_gflops > 0 ? g / f32_gflops : 0;
        if (opt.json) {
          nlohmann::ordered_json row = {{"bench", "gemm"}, {"m", c.m}, {"n", c.n}, {"k", c.k},
                                {"trans_a", c.trans_a}, {"trans_b", c.trans_b},
                                {"dtype", std::string(dtype_name(dt))}, {"threads", threads},
                                {"gflops", g}, {"backend", backend}, {"kernels_gflops", gk},
                                {"onednn_gflops", or_null(gd)}, {"openblas_gflops", or_null(gb)},
                                {"blis_gflops", or_null(gl)},
                                {"ratio_vs_onednn", or_null(gd > 0 ? g / gd : 0)},
                                {"ratio_vs_best_library", or_null(best_lib > 0 ? g / best_lib : 0)},
                                {"kernels_ratio_vs_best_library", or_null(best_lib > 0 ? gk / best_lib : 0)},
                                {"peak_fraction", or_null(frac)}, {"peak_gflops", or_null(peak)},
                                {"peak_kind", is_bf16 ? bf_peak.kind : "f32_fma"},
                                {"ratio_vs_f32", or_null(vs_f32)}, {"measurement_fault", fault}};
          row["aspen_s"] = spread_json(times, 0);
          row["kernels_s"] = spread_json(times, 1);
          if (direct) row["onednn_s"] = spread_json(times, 2);
          if (!is_bf16) row["openblas_s"] = spread_json(times, openblas_at);
          if (gl > 0) row["blis_s"] = spread_json(times, blis_at);
          add_guard_fields(row, times);
          out << row.dump() << "\n";
        } else {
          const char* op = c.trans_a && c.trans_b ? "aTbT" : c.trans_a ? "a^T" : c.trans_b ? "b^T" : "-";
          out << fmt::format("{:>5} {:>6} {:>5} {:>4} {:>5} {:>3} | {:>8.1f} {:>8} | {:>8.1f} {:>8} {:>11} | {:>7} {:>7} {:>5.0f}% {:>8}{}",
                             c.m, c.n, c.k, op, dtype_name(dt), threads, g, backend, gk,
                             gd > 0 ? fmt::format("{:.1f}", gd) : "-",
                             gb > 0 ? fmt::format("{:.1f}", gb) + (gl > 0 ? fmt::format("/{:.1f}", gl) : "") : "-",
                             gd > 0 ? fmt::format("{:.3f}x", g / gd) : "-",
                             best_lib > 0 ? fmt::format("{:.3f}x", g / best_lib) : "-", 100 * frac,
                             vs_f32 > 0 ? fmt::format("{:.2f}x", vs_f32) : "-",
                             fault ? "  (measurement fault: above the measured peak)" : "")
              << (times.disturbed ? fmt::format("  (disturbed: the peak moved {:.0f}% during the row)\n",
                                                100 * times.drift())
                                  : std::string("\n"));
        }
        out.flush();
      }
    }
  }
  return Status();
}

}  // namespace aspen::bench
