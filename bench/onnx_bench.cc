#include "bench/onnx_bench.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "api/inference_model.h"
#include "api/run_profile.h"
#include "bench/common.h"
#include "compiler/cache.h"
#include "compiler/memory_profile.h"
#include "core/thread_team.h"
#include "io/onnx.h"
#include "models/onnx_import.h"
#include "runtime/run_facts.h"

namespace aspen::bench {

namespace {

using Clock = std::chrono::steady_clock;

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> case_dirs(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n[0] != '.' && exists(dir + "/" + n + "/model.onnx")) out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Row {
  std::string name, dtype;
  double ms = 0, compile_s = 0, ort_ms = 0;
  double peak_before = 0, peak_after = 0;  // NOTE [guarded rows]: the FMA peak around the case's rows
  int attempts = 1;
  bool disturbed = false;
  std::string profile = {};  // the per-op summary of the timed runs (--profile)
};

// aspen on one case: import, compile, warm up, best of reps.
Result<Row> run_case(const std::string& dir, const std::string& name, const std::string& dtype, int threads, int reps,
                     bool profile, const std::string& trace_dir, const std::string& profile_dir, std::ostream& said) {
  ASPEN_ASSIGN_OR_RETURN(io::OnnxModel m, io::read_onnx_model(dir + "/model.onnx"));
  std::map<std::string, Tensor> inputs;
  models::OnnxImportOptions o;
  for (size_t k = 0; k < m.graph.inputs.size(); ++k) {
    ASPEN_ASSIGN_OR_RETURN(io::OnnxTensor t, io::read_onnx_tensor(dir + "/input_" + std::to_string(k) + ".pb"));
    o.input_shapes[m.graph.inputs[k].name] = t.dims;
    ASPEN_ASSIGN_OR_RETURN(Tensor x, models::tensor_from_onnx(t, "bench onnx: input " + t.name));
    inputs.emplace(m.graph.inputs[k].name, std::move(x));
  }
  const auto t0 = Clock::now();
  ASPEN_ASSIGN_OR_RETURN(models::OnnxImport imp, models::import_onnx(m, o));
  api::Options opts;
  opts.threads(threads);
  if (dtype == "bf16") opts.precision(DType::bf16);
  const std::string trace = !trace_dir.empty() ? trace_dir + "/" + name + "_" + dtype + ".json"
                                               : "/tmp/aspen_bench_onnx_" + std::to_string(::getpid()) + ".json";
  profile::TraceRecorder recorder;  // --profile DIR: every instruction of the case's runs
  if (!profile_dir.empty()) {
    opts.trace_recorder(&recorder);
  } else if (profile || !trace_dir.empty()) {
    opts.profile(trace);
  }
  ASPEN_ASSIGN_OR_RETURN(auto model, api::InferenceModel::create(imp.graph, opts));
  Row r{.name = name, .dtype = dtype};
  r.compile_s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASPEN_RETURN_IF_ERROR(model->copy_weights_to_device(imp.weight_pointers()));
  std::map<std::string, const Tensor*> feed;
  for (const auto& [n, t] : inputs) feed[n] = &t;
  ASPEN_RETURN_IF_ERROR(model->run(feed).status());  // warm-up
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto s = Clock::now();
    ASPEN_RETURN_IF_ERROR(model->run(feed).status());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - s).count());
  }
  r.ms = best * 1e3;
  if (!profile_dir.empty()) {  // docs/profile.md: one directory per row
    if (profile) r.profile = profile::summary(recorder.events());
    if (!trace_dir.empty()) ASPEN_RETURN_IF_ERROR(profile::write_chrome_trace(recorder.events(), trace));
    profile::RunFacts run =
        runtime::run_facts("bench onnx", threads, {{"model", dir}, {"dtype", dtype}, {"reps", std::to_string(reps)}});
    run.programs.push_back(compiler::program_memory(model->executable(), "run", 0));
    runtime::add_planned_memory(run, model->session());
    ASPEN_RETURN_IF_ERROR(api::write_run_profile(profile_dir + "/" + name + "-" + dtype, recorder.events(), run, said));
  } else if (profile) {
    r.profile = model->profile_summary();
    if (trace_dir.empty()) std::remove(trace.c_str());
  }
  return r;
}

}  // namespace

Status run_onnx_bench(const OnnxBenchOptions& opt, std::ostream& out) {
  for (const std::string& d : opt.dtypes)
    if (d != "f32" && d != "bf16") return Status::invalid_argument("bench onnx: dtype", "f32 or bf16", d);
  if (opt.reps < 1) return Status::invalid_argument("bench onnx: reps", ">= 1", std::to_string(opt.reps));
  const int threads = opt.threads > 0 ? opt.threads : std::max(1, CoreBudget::global().available());
  const bool python = !opt.python.empty() && opt.python != "none";
  const std::string script = std::string(ASPEN_SOURCE_DIR) + "/bench/onnx_peer.py";
  std::string dir;
  std::vector<std::string> names;
  if (!opt.model.empty()) {
    if (!exists(opt.model + "/model.onnx"))
      return Status::error(Code::kNotFound, "bench onnx: --model " + opt.model, "a case directory with model.onnx",
                           "none there");
    const size_t slash = opt.model.find_last_of('/');
    dir = slash == std::string::npos ? "." : opt.model.substr(0, slash);
    names = {opt.model.substr(slash == std::string::npos ? 0 : slash + 1)};
  } else {
    dir =
        !opt.dir.empty() ? opt.dir : compiler::default_cache_dir() + (opt.quick ? "/bench_onnx_quick" : "/bench_onnx");
    if (!python)
      return Status::invalid_argument("bench onnx: --python", "an interpreter with torch to export the models",
                                      "none (--model DIR runs one case without it)");
    const std::string cmd = "mkdir -p '" + dir + "' && " + opt.python + " " + script + " --export '" + dir + "'" +
                            (opt.quick ? " --quick" : "") + " 1>&2";
    if (std::system(cmd.c_str()) != 0)
      return Status::error(
          Code::kFailedPrecondition, "bench onnx: exporting the models",
          "bench/onnx_peer.py --export to succeed (torch, transformers, onnx installed for " + opt.python + ")",
          "a failure (its message is above)");
    names = case_dirs(dir);
  }
  // Side by side: onnxruntime runs each case just before and just after aspen's rows of it, and its
  // best time of both is kept, so a busy spell of the shared host hits both peers alike.
  std::vector<Row> rows;
  std::string note;
  const bool peer = python && opt.model.empty();
  auto time_peer = [&](const std::string& name, double& best) {
    const bool ok =
        read_json_lines(opt.python + " " + script + " --time '" + dir + "' --case '" + name + "' --threads " +
                            std::to_string(threads) + " --reps " + std::to_string(opt.reps),
                        [&](const nlohmann::json& j) {
                          const double ms = j.value("ms", 0.0);
                          if (ms > 0 && (best <= 0 || ms < best)) best = ms;
                        });
    if (!ok) note = "onnxruntime peer: not run (bench/onnx_peer.py --time failed: pip install onnxruntime onnx)";
  };
  // NOTE [guarded rows]: the FMA peak is measured before and after each case's rows (the peer's and aspen's);
  // a case during which it moved by more than 5 % is measured again once, then flagged disturbed.
  for (const std::string& name : names) {
    const size_t first = rows.size();
    for (int attempt = 1;; ++attempt) {
      rows.resize(first);
      double ort_ms = 0;
      const double before = measure_f32_fma_peak(threads);
      if (peer) time_peer(name, ort_ms);
      for (const std::string& dtype : opt.dtypes) {
        ASPEN_ASSIGN_OR_RETURN(Row r,
                               run_case(dir + "/" + name, name, dtype, threads, opt.reps, opt.profile, opt.trace_dir,
                                        opt.profile_dir, opt.json ? std::cerr : out));
        rows.push_back(r);
      }
      if (peer) time_peer(name, ort_ms);
      const double after = measure_f32_fma_peak(threads);
      const bool moved = ceiling_moved(before, after);
      for (size_t k = first; k < rows.size(); ++k) {
        rows[k].ort_ms = ort_ms;
        rows[k].peak_before = before, rows[k].peak_after = after;
        rows[k].attempts = attempt;
        rows[k].disturbed = moved;
      }
      if (!moved || attempt >= 2) break;
    }
  }
  if (!opt.json)
    out << fmt::format("{:<10} {:>5} {:>10} {:>12} {:>8} {:>10}   {}\n", "case", "dtype", "aspen ms", "onnxrt ms",
                       "ratio", "compile s", "FMA peak GFLOP/s (before-after)");
  for (const Row& r : rows) {
    if (opt.json) {
      nlohmann::json j = {{"bench", "onnx"},  {"case", r.name},           {"dtype", r.dtype},
                          {"aspen_ms", r.ms}, {"compile_s", r.compile_s}, {"threads", threads}};
      if (r.ort_ms > 0) {
        j["onnxruntime_ms"] = r.ort_ms;
        j["ratio_vs_onnxruntime"] = r.ort_ms / r.ms;
      }
      j["peak_gflops_before"] = r.peak_before;
      j["peak_gflops_after"] = r.peak_after;
      j["attempts"] = r.attempts;
      if (r.disturbed) j["disturbed"] = true;
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:<10} {:>5} {:>10.2f} {:>12} {:>8} {:>10.2f}   {:.0f}-{:.0f}{}\n", r.name, r.dtype, r.ms,
                         r.ort_ms > 0 ? fmt::format("{:.2f}", r.ort_ms) : "-",
                         r.ort_ms > 0 ? fmt::format("{:.2f}", r.ort_ms / r.ms) : "-", r.compile_s,
                         std::min(r.peak_before, r.peak_after), std::max(r.peak_before, r.peak_after),
                         r.disturbed ? "  DISTURBED" : "");
    }
  }
  if (!note.empty() && !opt.json) out << "# " << note << "\n";
  if (opt.profile && !opt.json)
    for (const Row& r : rows) out << "\n# " << r.name << " " << r.dtype << ": where the time goes\n" << r.profile;
  return Status();
}

}  // namespace aspen::bench
