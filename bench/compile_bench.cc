#include "bench/compile_bench.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "compiler/cache.h"
#include "compiler/executable.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "models/gptj.h"
#include "train/optimizer.h"
#include "runtime/session.h"

namespace aspen::bench {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A directory that exists for the bench's lifetime: the caller's, kept, or a
// fresh temporary one, removed on exit.
class CacheDir {
 public:
  static Result<CacheDir> make(const std::string& requested) {
    CacheDir d;
    if (!requested.empty()) {
      d.path_ = requested;
      return d;
    }
    std::string templ = (std::filesystem::temp_directory_path() / "aspen_compile_bench_XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr)
      return Status::error(Code::kIoError, templ, "a new temporary directory", std::strerror(errno));
    d.path_ = templ;
    d.remove_ = true;
    return d;
  }
  CacheDir(CacheDir&& o) noexcept : path_(std::move(o.path_)), remove_(o.remove_) { o.remove_ = false; }
  CacheDir& operator=(CacheDir&&) = delete;
  ~CacheDir() {
    std::error_code ec;
    if (remove_) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  CacheDir() = default;
  std::string path_;
  bool remove_ = false;
};

struct Row {
  std::string graph;
  int64_t nodes = 0, instructions = 0;
  double build_s = 0, compile_s = 0, cache_hit_s = 0;
  int64_t planned_peak_bytes = 0, naive_bytes = 0, reference_instructions = 0;
  bool first_was_miss = false;
  std::map<std::string, int64_t> reference_ops;  // op name -> instructions on the reference kernel
};

// Records the graph; with training, the loss, every parameter's gradient and
// the AdamW step that consumes them (the updates of weights and state).
Status build(graph::Graph& g, const CompileBenchOptions& opt, bool training) {
  graph::Builder b(g);
  ASPEN_ASSIGN_OR_RETURN(models::GptjGraph m,
                         models::build_gptj(b, models::GptjConfig::gptj_6b(), opt.batch, opt.seq, training));
  if (!training) return Status();
  std::vector<graph::ValueId> wrt;
  for (int32_t i : g.parameter_nodes()) wrt.push_back(g.node(i).outputs[0]);
  ASPEN_ASSIGN_OR_RETURN(std::vector<graph::ValueId> grads, graph::append_gradients(g, m.loss, wrt));
  train::AdamWOptions adamw;
  adamw.no_decay = {"bias", "ln_"};
  return train::append_adamw(b, wrt, grads, adamw).status();
}

Result<Row> measure(const std::string& name, bool training, const CompileBenchOptions& opt,
                    const std::string& cache_dir) {
  Row r;
  r.graph = name;
  graph::Graph g;
  auto t0 = std::chrono::steady_clock::now();
  ASPEN_RETURN_IF_ERROR(Status(build(g, opt, training)).with_context(name));
  r.build_s = seconds_since(t0);
  r.nodes = int64_t(g.nodes().size());

  // The release pipeline: verifying after every pass is a test aid, off here
  // whatever the build type.
  compiler::CompileOptions copt;
  copt.opt_level = compiler::OptLevel::O2;
  copt.verify_each_pass = false;
  {
    t0 = std::chrono::steady_clock::now();
    ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<compiler::Executable> exe, compiler::compile(g, copt));
    r.compile_s = seconds_since(t0);
    r.planned_peak_bytes = exe->plan.arena_bytes;
    r.naive_bytes = exe->plan.naive_bytes;
    r.instructions = int64_t(exe->program.code.size());
    for (const compiler::Instruction& ins : exe->program.code)
      if (ins.reference) {
        ++r.reference_instructions;
        ++r.reference_ops[graph::op_name(exe->graph.node(ins.node).op)];
      }
  }
  compiler::ExecutableCache cache(cache_dir);
  bool hit = false;
  {
    ASPEN_ASSIGN_OR_RETURN(auto first, cache.compile(g, copt, &hit));  // in a fresh directory: a miss that stores
    r.first_was_miss = !hit;
  }
  t0 = std::chrono::steady_clock::now();
  ASPEN_ASSIGN_OR_RETURN(auto second, cache.compile(g, copt, &hit));
  r.cache_hit_s = seconds_since(t0);
  if (!hit)
    return Status::error(Code::kFailedPrecondition, "compile bench: " + name + ": executable cache " + cache_dir,
                         "a hit on the second compile", "a miss",
                         "the first compile did not store its entry; see the warnings above");
  return r;
}

std::string bytes_string(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30));
  return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
}

}  // namespace

// Executor overhead: a chain of 10,000 tiny elementwise ops (16 floats each),
// compiled at O0 and run on one thread; the best of several runs divided by
// the instruction count. The kernels themselves take a few nanoseconds, so
// this is the runtime's own cost per instruction.
Status measure_executor_overhead(bool json, std::ostream& out) {
  constexpr int kChain = 10000;
  graph::Graph g;
  graph::Builder b(g);
  graph::ValueId v = b.input("x", DType::f32, {16});
  for (int i = 0; i < kChain; ++i) v = b.scale(v, i % 2 ? 0.5 : 2.0);
  b.output("y", v);
  ASPEN_RETURN_IF_ERROR(b.status());
  compiler::CompileOptions copts;
  copts.opt_level = compiler::OptLevel::O0;
  copts.verify_each_pass = false;
  ASPEN_ASSIGN_OR_RETURN(auto exe, compiler::compile(g, copts));
  const size_t instructions = exe->program.code.size();
  runtime::SessionOptions sopts;
  sopts.threads = 1;
  ASPEN_ASSIGN_OR_RETURN(auto session, runtime::Session::create(std::move(exe), sopts));
  Tensor x(DType::f32, Shape{16});
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    ASPEN_ASSIGN_OR_RETURN(auto y, session->run({{"x", &x}}));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double us = best / double(instructions) * 1e6;
  if (json) {
    nlohmann::ordered_json row = {{"bench", "compile"}, {"graph", "chain10k"}, {"instructions", instructions},
                                  {"run_s", best}, {"us_per_instruction", us}};
    out << row.dump() << "\n";
  } else {
    out << fmt::format("executor: {} instructions of 16 floats in {:.3f} ms: {:.3f} us per instruction\n",
                       instructions, best * 1e3, us);
  }
  return Status();
}

Status run_compile_bench(const CompileBenchOptions& opt, std::ostream& out) {
  if (opt.batch < 1 || opt.seq < 1)
    return Status::invalid_argument("compile bench: batch and seq", "numbers > 0",
                                    std::to_string(opt.batch) + " and " + std::to_string(opt.seq));
  ASPEN_ASSIGN_OR_RETURN(CacheDir dir, CacheDir::make(opt.cache_dir));
  const models::GptjConfig c = models::GptjConfig::gptj_6b();
  if (!opt.json) {
    out << fmt::format(
        "# GPT-J-6B ({} layers, d_model {}, vocab {}, {}), batch {}, seq {}; compile at O2; no weights "
        "allocated\n",
        c.n_layer, c.d_model, c.vocab, dtype_name(c.dtype), opt.batch, opt.seq);
    out << "# training = forward + loss + every parameter's gradient + the AdamW step (weights and state updated in "
           "place)\n";
    out << "# compile and cache-hit times include preparing each instruction's kernel (oneDNN primitives)\n";
    out << fmt::format("{:<18} {:>6} {:>6} | {:>8} {:>9} {:>9} | {:>12} {:>11} | {:>9}\n", "graph", "nodes", "instrs",
                       "build_s", "compile_s", "cache_hit", "planned_peak", "naive", "reference");
    out.flush();
  }
  const std::pair<const char*, bool> graphs[] = {{"gptj6b_inference", false}, {"gptj6b_training", true}};
  for (const auto& [name, training] : graphs) {
    ASPEN_ASSIGN_OR_RETURN(Row r, measure(name, training, opt, dir.path()));
    if (opt.json) {
      nlohmann::ordered_json row = {{"bench", "compile"},
                                    {"graph", r.graph},
                                    {"nodes", r.nodes},
                                    {"build_s", r.build_s},
                                    {"compile_s", r.compile_s},
                                    {"cache_hit_s", r.cache_hit_s},
                                    {"planned_peak_bytes", r.planned_peak_bytes},
                                    {"naive_bytes", r.naive_bytes},
                                    {"reference_instructions", r.reference_instructions}};
      out << row.dump() << "\n";
    } else {
      out << fmt::format("{:<18} {:>6} {:>6} | {:>8.3f} {:>9.3f} {:>9.3f} | {:>12} {:>11} | {:>9}\n", r.graph, r.nodes,
                         r.instructions, r.build_s, r.compile_s, r.cache_hit_s, bytes_string(r.planned_peak_bytes),
                         bytes_string(r.naive_bytes), r.reference_instructions);
      if (!r.reference_ops.empty()) {
        std::string ops;
        for (const auto& [op, n] : r.reference_ops) ops += fmt::format("{}{} x{}", ops.empty() ? "" : ", ", op, n);
        out << "    on the reference kernel: " << ops << "\n";
      }
      if (!r.first_was_miss) out << "    (the cache already held this graph: its first compile was a hit too)\n";
    }
    out.flush();
  }
  return measure_executor_overhead(opt.json, out);
}

}  // namespace aspen::bench
