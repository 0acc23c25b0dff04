#include "bench/decode_bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <span>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "bench/common.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "kernels/gemv.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"

namespace aspen::bench {

namespace {

struct Layer {
  const char* name;
  int64_t k, n;
  bool trans_b;  // W [N, K] (the tied LM head) rather than [K, N] (Conv1D)
};

// GPT-2-124M, d_model 768, vocab 50257.
const Layer kGpt2Layers[] = {
    {"attn.c_attn", 768, 2304, false}, {"attn.c_proj", 768, 768, false}, {"mlp.c_fc", 768, 3072, false},
    {"mlp.c_proj", 3072, 768, false},  {"lm_head", 768, 50257, true},
};
// The Llama-shaped 124M of `bench generate --family llama` (12 heads over 4 kv heads, SwiGLU 2048, vocab 32000):
// every matrix [N, K], as nn.Linear stores it.
const Layer kLlamaLayers[] = {
    {"q_proj", 768, 768, true},    {"k_proj", 768, 256, true}, {"v_proj", 768, 256, true},
    {"o_proj", 768, 768, true},    {"gate_proj", 768, 2048, true}, {"up_proj", 768, 2048, true},
    {"down_proj", 2048, 768, true}, {"lm_head", 768, 32000, true},
};
std::span<const Layer> layers_of(const DecodeBenchOptions& opt) {
  if (opt.family == "llama") return kLlamaLayers;
  return kGpt2Layers;
}

struct PoolDeleter {
  void operator()(char* p) const { ::operator delete(p, std::align_val_t(4096)); }
};

// oneDNN's matmul at the same shape, weights rebound per call (the primitive
// is made once): src [M, K] f32 or bf16, weights [K, N] (strided when trans_b).
class OneDnnPeer {
 public:
  OneDnnPeer(int64_t M, const Layer& l, bool bf16, const void* x, float* y)
      : eng_(dnnl::engine::kind::cpu, 0), stream_(eng_) {
    using dt = dnnl::memory::data_type;
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc a_md({M, l.k}, in, dnnl::memory::dims{l.k, 1});
    const dnnl::memory::desc b_md({l.k, l.n}, in, l.trans_b ? dnnl::memory::dims{1, l.k} : dnnl::memory::dims{l.n, 1});
    const dnnl::memory::desc c_md({M, l.n}, dt::f32, dnnl::memory::dims{l.n, 1});
    prim_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng_));
    w_ = dnnl::memory(b_md, eng_, DNNL_MEMORY_NONE);
    args_ = {{DNNL_ARG_SRC, dnnl::memory(a_md, eng_, const_cast<void*>(x))},
             {DNNL_ARG_WEIGHTS, w_},
             {DNNL_ARG_DST, dnnl::memory(c_md, eng_, y)}};
  }
  void run(const void* w) {
    w_.set_data_handle(const_cast<void*>(w));
    prim_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::matmul prim_;
  dnnl::memory w_;
  std::unordered_map<int, dnnl::memory> args_;
};

// NOTE [guarded rows]: a row's ceiling, the read sweep of the replicas' whole region, one stream per thread and
// 8 interleaved (the better), in GB/s.
std::function<double()> region_sweep(const char* pool, int64_t bytes) {
  return [pool, bytes] {
    return double(bytes) / 1e9 / std::min(read_sweep_seconds(pool, size_t(bytes), false),
                                          read_sweep_seconds(pool, size_t(bytes), true));
  };
}

// Quantized rows (Q8_0, Q4_0, Q4_K): aspen's product over replicas of the layer's blocks ([N, K], packed 8 rows
// a stream as a loader packs them: the pool's bytes are blocks in any order), interleaved with a read sweep of
// the same bytes and aspen's bf16 [N, K] product over bf16 replicas of the layer (the figure to beat), guarded
// by the region's sweep. The pool's bytes read as blocks whose scales are normal f16 (0x3Fxx).
template <class Block>
Status run_quantized_rows(const DecodeBenchOptions& opt, int threads, const char* pool, size_t pool_bytes,
                          int rounds, std::ostream& out) {
  constexpr bool q4 = std::is_same_v<Block, kernels::BlockQ4_0>, q4k = std::is_same_v<Block, kernels::BlockQ4_K>;
  const char* kind = q4k ? "q4_k" : q4 ? "q4_0" : "q8_0";
  constexpr int64_t per = q4k ? 256 : 32;  // values per block
  for (int64_t M : opt.rows)
    for (const Layer& l : layers_of(opt)) {
      if (!opt.layers.empty() && std::find(opt.layers.begin(), opt.layers.end(), l.name) == opt.layers.end())
        continue;
      const int64_t bytes = l.n * l.k / per * int64_t(sizeof(Block));
      const kernels::GemvShape bf{.M = M, .N = l.n, .K = l.k, .trans_b = true, .weight = DType::bf16, .x_bf16 = true};
      const int64_t stride = (std::max(bytes, bf.weight_bytes()) + 4095) / 4096 * 4096;
      const int64_t slots = std::max<int64_t>(1, int64_t(pool_bytes) / stride);
      if (stride > int64_t(pool_bytes)) continue;
      std::vector<float> x(static_cast<size_t>(M * l.k)), y(static_cast<size_t>(M * l.n));
      philox_fill_uniform(x, 1, 0, 0, -1, 1);
      for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));  // as the bf16 product's x is (NOTE [mixed matmul])
      auto slot = [&](int64_t s) { return pool + s * stride; };
      Status st;
      auto pass_quantized = [&] {
        for (int64_t s = 0; s < slots && st.is_ok(); ++s) {
          const std::span<const Block> blocks(reinterpret_cast<const Block*>(slot(s)), size_t(l.n * l.k / per));
          if constexpr (q4k) st = kernels::gemv_q4_k_rows8(x, blocks, y, M, l.n, l.k);
          else if constexpr (q4) st = kernels::gemv_q4_0_rows8(x, blocks, y, M, l.n, l.k);
          else st = kernels::gemv_q8_0_rows8(x, blocks, y, M, l.n, l.k);
        }
      };
      auto pass_bf16 = [&] {
        // packed, as a loaded bf16 weight is (NOTE [packed gemv]); the replicas' bytes read in that layout
        for (int64_t s = 0; s < slots; ++s)
          if (kernels::gemv_packable(bf)) kernels::gemv_run_packed(bf, x.data(), slot(s), nullptr, y.data());
          else kernels::gemv_run(bf, x.data(), slot(s), nullptr, y.data());
      };
      auto pass_sweep = [&] {
        for (int64_t s = 0; s < slots; ++s) read_sweep_seconds(slot(s), size_t(bytes), false);
      };
      const RowTimes times = guarded_rounds({pass_sweep, pass_quantized, pass_bf16},
                                            region_sweep(pool, slots * stride), rounds, 0.0);
      ASPEN_RETURN_IF_ERROR(st);
      const double* best = times.min.data();
      const double total = double(slots) * double(bytes) / 1e9;
      const double sweep = total / best[0], aspen = total / best[1], vs_bf16 = best[2] / best[1];
      if (opt.json) {
        nlohmann::ordered_json row{{"bench", "decode"}, {"layer", l.name}, {"m", M}, {"n", l.n}, {"k", l.k},
                                      {"layout", "NK"}, {"weight", kind}, {"threads", threads},
                                      {"weight_bytes", bytes}, {"replicas", slots}, {"sweep_gbs", sweep},
                                      {"aspen_gbs", aspen}, {"ratio_vs_sweep", aspen / sweep},
                                      {"bf16_s", best[2] / double(slots)}, {"quantized_s", best[1] / double(slots)},
                                      {"ratio_vs_bf16", vs_bf16}};
        row["aspen_s"] = spread_json(times, 1);
        add_guard_fields(row, times);
        out << row.dump() << "\n";
      } else {
        out << fmt::format("{:<12} {:>2} {:>6} {:>5} {:>5} {:>5} {:>3} | {:>7.1f} {:>7} {:>7.1f} {:>7} | {:>6.0f}%  "
                           "{} vs aspen's bf16 {:.2f}x{}\n",
                           l.name, M, l.n, l.k, "[N,K]", kind, threads, sweep, "-", aspen, "-", 100 * aspen / sweep,
                           kind, vs_bf16,
                           times.disturbed ? fmt::format("  (disturbed: the sweep moved {:.0f}%)", 100 * times.drift())
                                           : std::string());
      }
      out.flush();
    }
  return Status();
}

}  // namespace

Status run_decode_bench(const DecodeBenchOptions& opt, std::ostream& out) {
  if (opt.family != "gpt2" && opt.family != "llama")
    return Status::invalid_argument("bench decode: family", "gpt2 or llama", opt.family);
  for (const std::string& name : opt.layers)
    if (std::none_of(layers_of(opt).begin(), layers_of(opt).end(), [&](const Layer& l) { return l.name == name; }))
      return Status::invalid_argument("bench decode: --layers", "a layer of the " + opt.family + " family",
                                      name);
  const size_t pool_bytes = size_t(opt.quick ? 256 : std::max<int64_t>(1, opt.pool_mib)) << 20;
  const int rounds = opt.quick ? 1 : 8;
  // Every 16-bit half is a normal bf16 (0x3Fxx: 0.5..1), so the pool reads as
  // normal f32 and normal bf16 alike (no denormal or NaN slow paths).
  std::unique_ptr<char, PoolDeleter> pool(static_cast<char*>(::operator new(pool_bytes, std::align_val_t(4096))));
  {
    uint16_t* h = reinterpret_cast<uint16_t*>(pool.get());
    uint32_t state = 12345;
    for (size_t i = 0; i < pool_bytes / 2; ++i) {
      state = state * 1664525u + 1013904223u;
      h[i] = uint16_t(0x3F00u | (state >> 24));
    }
  }
  if (!opt.json)
    out << fmt::format("{:<12} {:>2} {:>6} {:>5} {:>5} {:>5} {:>3} | {:>7} {:>7} {:>7} {:>7} | {:>7} {:>7}  (GB/s of weights)\n",
                       "layer", "M", "N", "K", "W", "dtype", "thr", "sweep", "sw/mat", "aspen", "oneDNN", "a/sweep",
                       "a/dnnl");
  for (int threads : opt.threads) {
    ScopedOmpThreads team(threads);
    for (int64_t M : opt.rows)
      for (DType wt : {DType::f32, DType::bf16}) {
        if ((wt == DType::f32 && !opt.f32) || (wt == DType::bf16 && !opt.bf16)) continue;
        const bool b16 = wt == DType::bf16;
        for (const Layer& l : layers_of(opt)) {
          if (!opt.layers.empty() && std::find(opt.layers.begin(), opt.layers.end(), l.name) == opt.layers.end())
            continue;
          // bf16 weights: x as the decode step gives it, rounded to bf16 (NOTE [mixed matmul]).
          const kernels::GemvShape shape{.M = M, .N = l.n, .K = l.k, .trans_b = l.trans_b, .weight = wt, .x_bf16 = b16};
          const int64_t bytes = shape.weight_bytes();
          const int64_t stride = (bytes + 4095) / 4096 * 4096;
          const int64_t slots = std::max<int64_t>(1, int64_t(pool_bytes) / stride);
          if (stride > int64_t(pool_bytes)) continue;  // the pool holds no replica of this layer
          std::vector<float> x(static_cast<size_t>(M * l.k)), y(static_cast<size_t>(M * l.n));
          philox_fill_uniform(x, 1, 0, 0, -1, 1);
          std::vector<bf16> xb(x.size());
          for (size_t i = 0; i < x.size(); ++i) {
            xb[i] = f32_to_bf16(x[i]);
            if (b16) x[i] = bf16_to_f32(xb[i]);
          }
          // oneDNN has no bf16 kernels without AVX-512: that row has no peer (null in the JSON).
          std::unique_ptr<OneDnnPeer> dnnl_peer;
          if (!b16 || !kernels::bf16_matmul_widens())
            dnnl_peer = std::make_unique<OneDnnPeer>(M, l, b16, b16 ? static_cast<const void*>(xb.data()) : x.data(),
                                                     y.data());
          auto slot = [&](int64_t s) { return static_cast<const void*>(pool.get() + s * stride); };
          auto pass_aspen = [&] {
            for (int64_t s = 0; s < slots; ++s) kernels::gemv_run(shape, x.data(), slot(s), nullptr, y.data());
          };
          // A fixed bf16 weight is packed when loaded (NOTE [packed gemv]): the decode step runs that kernel. The
          // replicas' bytes read as packed groups (any order of normal bf16 values: the same reads and products).
          const bool packable = kernels::gemv_packable(shape);
          auto pass_packed = [&] {
            if (packable)
              for (int64_t s = 0; s < slots; ++s) kernels::gemv_run_packed(shape, x.data(), slot(s), nullptr, y.data());
          };
          auto pass_dnnl = [&] {
            if (dnnl_peer)
              for (int64_t s = 0; s < slots; ++s) dnnl_peer->run(slot(s));
          };
          // The sweep reads the same replicas' bytes, one parallel region per replica as the kernels do.
          auto pass_sweep = [&](bool interleaved) {
            for (int64_t s = 0; s < slots; ++s) read_sweep_seconds(slot(s), size_t(bytes), interleaved);
          };
          // NOTE [guarded rows]: per round (after a warm-up of each: first touches, oneDNN's lazy setup), the
          // replicas swept (one stream per thread, then 8 interleaved), aspen and oneDNN.
          const RowTimes times = guarded_rounds({[&] { pass_sweep(false); }, [&] { pass_sweep(true); }, pass_aspen,
                                                 pass_dnnl, pass_packed},
                                                region_sweep(pool.get(), slots * stride), rounds, 0.0);
          const double best[3] = {std::min(times.min[0], times.min[1]), times.min[2], times.min[3]};
          const double total = double(slots) * double(bytes) / 1e9;
          // The ceiling is the better of the two sweeps: on a loaded host one long parallel region
          // suffers more from a descheduled thread than many short ones do.
          const double sweep_whole = times.ceiling(), sweep_each = total / best[0];
          const double sweep = std::max(sweep_whole, sweep_each);
          const double unpacked = total / best[1], dnnl = dnnl_peer ? total / best[2] : 0.0;
          const double aspen = packable ? total / times.min[4] : unpacked;
          const auto or_null = [](double v) { return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
          if (opt.json) {
            nlohmann::ordered_json row = {{"bench", "decode"},        {"layer", l.name},
                                          {"m", M},                   {"n", l.n},
                                          {"k", l.k},                 {"layout", l.trans_b ? "NK" : "KN"},
                                          {"weight", dtype_name(wt)}, {"threads", threads},
                                          {"weight_bytes", bytes},    {"replicas", slots},
                                          {"sweep_gbs", sweep},       {"sweep_whole_gbs", sweep_whole},
                                          {"sweep_per_matrix_gbs", sweep_each},
                                          {"aspen_gbs", aspen},
                                          {"packed", packable},
                                          {"aspen_unpacked_gbs", unpacked},
                                          {"onednn_gbs", or_null(dnnl)}, {"ratio_vs_sweep", aspen / sweep},
                                          {"ratio_vs_onednn", or_null(dnnl > 0 ? aspen / dnnl : 0)},
                                          {"onednn_vs_sweep", or_null(dnnl / sweep)},
                                          {"ratio_vs_sweep_per_matrix", aspen / sweep_each}};
            row["aspen_s"] = spread_json(times, packable ? 4 : 2);
            if (dnnl_peer) row["onednn_s"] = spread_json(times, 3);
            add_guard_fields(row, times);
            out << row.dump() << "\n";
          } else {
            out << fmt::format("{:<12} {:>2} {:>6} {:>5} {:>5} {:>5} {:>3} | {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} | {:>6.0f}% {:>6.2f}x{}{}\n",
                               l.name, M, l.n, l.k, l.trans_b ? "[N,K]" : "[K,N]", dtype_name(wt), threads, sweep_whole,
                               sweep_each, aspen, dnnl, 100 * aspen / sweep, dnnl > 0 ? aspen / dnnl : 0.0,
                               packable ? fmt::format("  packed (unpacked {:.1f})", unpacked) : std::string(),
                               times.disturbed ? fmt::format("  (disturbed: the sweep moved {:.0f}%)", 100 * times.drift())
                                               : std::string());
          }
          out.flush();
        }
      }
    if (opt.q8_0)
      ASPEN_RETURN_IF_ERROR(run_quantized_rows<kernels::BlockQ8_0>(opt, threads, pool.get(), pool_bytes, rounds, out));
    if (opt.q4_0)
      ASPEN_RETURN_IF_ERROR(run_quantized_rows<kernels::BlockQ4_0>(opt, threads, pool.get(), pool_bytes, rounds, out));
    if (opt.q4_k)
      ASPEN_RETURN_IF_ERROR(run_quantized_rows<kernels::BlockQ4_K>(opt, threads, pool.get(), pool_bytes, rounds, out));
  }
  return Status();
}

}  // namespace aspen::bench
