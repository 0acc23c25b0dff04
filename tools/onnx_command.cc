// tools/onnx_command.cc: `aspen onnx inspect` and `aspen onnx run`, a user's own ONNX model.
//
//   aspen onnx inspect model.onnx
//   aspen onnx run model.onnx --input x=x.npy [--input ...] [--dim batch=2] [--output-dir out] [--dtype bf16]
//
// inspect prints the model's producer, IR version and opsets, its inputs and outputs with their
// (symbolic) shapes, its weights, and its ops with how many nodes each and whether aspen converts it;
// it ends with whether the model imports. run binds every symbolic dimension from the inputs' .npy
// shapes (and --dim), compiles (through the executable cache with --cache DIR), runs once, writes
// DIR/<output>.npy for every output (a name's '/' and ':' written as '_') and prints each output's
// name, shape and dtype, then the compile time and whether the cache hit (--graph FILE also writes the
// imported and compiled graphs, the program and its memory plan there, for the curious). Exit 0 on success, 1 with a
// message naming the node on a model aspen does not import (or another failure), 2 on a usage error.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/inference_model.h"
#include "api/run_profile.h"
#include "compiler/memory_profile.h"
#include "core/atomic_file.h"
#include "io/npy.h"
#include "io/onnx.h"
#include "models/onnx_import.h"
#include "profile/profile_dir.h"
#include "runtime/run_facts.h"
#include "tools/commands.h"

namespace aspen::tools {
namespace {

int run_inspect(const std::string& path) {
  auto m = io::read_onnx_model(path);
  if (!m.is_ok()) return report(m.status());
  std::cout << "model: " << escape_for_terminal(path) << "\nproducer: " << escape_for_terminal(m->producer_name) << " "
            << escape_for_terminal(m->producer_version) << "\nir version: " << m->ir_version << "\nopsets:";
  for (const auto& [domain, v] : m->opsets)
    std::cout << " " << (domain.empty() ? "ai.onnx" : escape_for_terminal(domain)) << " " << v;
  std::cout << "\ninputs:\n";
  for (const auto& v : m->graph.inputs)
    std::cout << "  " << escape_for_terminal(v.name) << ": " << io::onnx_type_name(v.type) << " " << v.dims_text()
              << "\n";
  std::cout << "outputs:\n";
  for (const auto& v : m->graph.outputs)
    std::cout << "  " << escape_for_terminal(v.name) << ": " << io::onnx_type_name(v.type) << " " << v.dims_text()
              << "\n";
  int64_t weights = 0, bytes = 0;
  for (const auto& t : m->graph.initializers) {
    weights += t.numel();
    bytes += int64_t(t.bytes.size());
  }
  std::cout << "initializers: " << m->graph.initializers.size() << " (" << weights << " values, " << bytes
            << " bytes)\n";
  const std::vector<std::string> supported = models::onnx_supported_ops();
  std::map<std::string, int> counts;
  for (const auto& n : m->graph.nodes) counts[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type]++;
  std::cout << "ops (" << m->graph.nodes.size() << " nodes):\n";
  int unsupported = 0;
  const int64_t opset = m->opset();
  for (const auto& [op, n] : counts) {
    const bool known = std::find(supported.begin(), supported.end(), op) != supported.end();
    const int since = op.find('.') == std::string::npos ? models::onnx_op_since(op) : 0;  // default domain
    const bool too_old = known && since > opset;
    unsupported += !known || too_old;
    std::cout << "  " << escape_for_terminal(op) << " " << n
              << (!known    ? "  (not supported)"
                  : too_old ? "  (converted from opset " + std::to_string(since) + " on)"
                            : "")
              << "\n";
  }
  const bool opset_ok = opset >= 1 && opset <= 21;
  std::cout << "imports: "
            << (unsupported == 0 && opset_ok ? "yes"
                : !opset_ok                  ? "no (opset " + std::to_string(opset) + "; aspen reads 1 to 21)"
                                             : "no (" + std::to_string(unsupported) + " op type(s) not supported)")
            << "\n";
  return 0;
}

struct RunArgs {
  std::string model, output_dir = ".", dtype = "f32", cache, graph_file, profile;
  std::vector<std::string> inputs, dims;
  int threads = 0;
};

std::string file_name_of(const std::string& output) {
  std::string s = output;
  for (char& ch : s)
    if (ch == '/' || ch == ':' || ch == '\\') ch = '_';
  return s;
}

int run_run(const RunArgs& a) {
  auto usage = [](const std::string& what, const std::string& expected, const std::string& found) {
    std::cerr << "aspen: error: " << escape_for_terminal(Status::invalid_argument(what, expected, found).message())
              << "\n";
    return kExitUsage;
  };
  auto m = io::read_onnx_model(a.model);
  if (!m.is_ok()) return report(m.status());
  models::OnnxImportOptions opts;
  std::map<std::string, Tensor> inputs;
  for (const std::string& spec : a.inputs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      return usage("--input '" + spec + "'", "NAME=FILE.npy", "no '=' between a name and a file");
    const std::string name = spec.substr(0, eq);
    if (!m->graph.find_input(name)) {
      std::string names;
      for (const auto& v : m->graph.inputs) names += (names.empty() ? "" : ", ") + v.name;
      return usage("--input '" + spec + "'", "the name of a graph input (" + names + ")", "'" + name + "'");
    }
    auto t = io::read_npy(spec.substr(eq + 1));
    if (!t.is_ok()) return report(t.status());
    opts.input_shapes[name] = std::vector<int64_t>(t->shape().begin(), t->shape().end());
    inputs.emplace(name, std::move(*t));
  }
  for (const auto& v : m->graph.inputs)
    if (!inputs.count(v.name)) return usage("graph input '" + v.name + "'", "--input " + v.name + "=FILE.npy", "none");
  for (const std::string& spec : a.dims) {
    const size_t eq = spec.find('=');
    int64_t n = -1;
    if (eq != std::string::npos && eq > 0) n = std::atoll(spec.c_str() + eq + 1);
    if (eq == std::string::npos || eq == 0 || n < 0 ||
        spec.find_first_not_of("0123456789", eq + 1) != std::string::npos)
      return usage("--dim '" + spec + "'", "NAME=EXTENT (a non-negative integer)", "'" + spec + "'");
    const std::string name = spec.substr(0, eq);
    if (auto it = opts.dims.find(name); it != opts.dims.end() && it->second != n)
      return usage("--dim " + name, "one extent", std::to_string(it->second) + " and " + std::to_string(n));
    opts.dims[name] = n;
  }
  if (a.dtype != "f32" && a.dtype != "bf16") return usage("--dtype", "f32 or bf16", "'" + a.dtype + "'");
  const auto t0 = std::chrono::steady_clock::now();
  auto imp = models::import_onnx(*m, opts);
  // A value the importer needs at compile time (a shape, axes, pads an exporter left as an input) is bound
  // from the given array, as Poplar binds static shapes: the integer inputs become constants of this
  // compile (another value compiles again), and the run feeds the rest.
  std::vector<std::string> bound;
  if (!imp.is_ok() && imp.status().message().find("known when the model is imported") != std::string::npos) {
    for (const auto& [name, t] : inputs)
      if (t.dtype() == DType::i64 || t.dtype() == DType::i32 || t.dtype() == DType::u8 || t.dtype() == DType::boolean) {
        opts.constants[name] = &t;
        opts.input_shapes.erase(name);
        bound.push_back(name);
      }
    if (!bound.empty()) imp = models::import_onnx(*m, opts);
  }
  if (!imp.is_ok()) return report(imp.status());
  for (const std::string& name : bound) {
    std::cout << "input '" << escape_for_terminal(name) << "' bound at compile time (its values are part of the program)\n";
    inputs.erase(name);
  }
  const std::string profile_dir = profile::profile_dir_choice(a.profile);
  if (!profile_dir.empty())
    if (Status s = profile::make_profile_dir(profile_dir); !s.is_ok()) return report(s);
  api::Options options;
  options.threads(a.threads);
  profile::TraceRecorder trace;
  if (!profile_dir.empty()) options.trace_recorder(&trace);
  if (a.dtype == "bf16") options.precision(DType::bf16);
  if (!a.cache.empty()) options.executable_cache(a.cache);
  auto model = api::InferenceModel::create(imp->graph, options);
  if (!model.is_ok()) return report(model.status());
  const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.graph_file.empty()) {
    const compiler::Executable& exe = (*model)->executable();
    const std::string text = "# imported\n" + imp->graph.to_string() + "\n# compiled\n" + exe.graph.to_string() +
                             "\n# program\n" + exe.listing() + "\n" + exe.plan.report(exe.graph) + "\n";
    if (Status s = write_file_atomic(a.graph_file, text); !s.is_ok()) return report(s);
  }
  if (Status s = (*model)->copy_weights_to_device(imp->weight_pointers()); !s.is_ok()) return report(s);
  std::map<std::string, const Tensor*> feed;
  for (const auto& [name, t] : inputs) feed[name] = &t;
  auto out = (*model)->run(feed);
  if (!out.is_ok()) return report(out.status());
  if (Status s = check_writable_directory(a.output_dir, "--output-dir"); !s.is_ok()) return report(s);
  for (const std::string& name : imp->outputs) {
    const Tensor& t = out->at(name);
    const std::string path = a.output_dir + "/" + file_name_of(name) + ".npy";
    if (Status s = io::write_npy(path, t); !s.is_ok()) return report(s);
    std::cout << escape_for_terminal(name) << " " << dtype_name(t.dtype()) << t.shape().to_string() << " -> "
              << escape_for_terminal(path) << "\n";
  }
  if (!profile_dir.empty()) {
    profile::RunFacts run = runtime::run_facts("onnx run", a.threads, {{"model", a.model}, {"dtype", a.dtype}});
    run.programs.push_back(compiler::program_memory((*model)->executable(), "run", 0));
    runtime::add_planned_memory(run, (*model)->session());
    if (Status s = api::write_run_profile(profile_dir, trace.events(), run, std::cout); !s.is_ok()) return report(s);
  }
  std::cout << "compile: " << compile_s << " s (executable cache: "
            << (a.cache.empty()         ? "off"
                : (*model)->cache_hit()    ? "hit"
                : (*model)->cache_stored() ? "miss, stored"
                                           : "miss, not stored: see the warning above")
            << ")\n";
  return 0;
}

}  // namespace

Command add_onnx_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("onnx", "a user's own ONNX model: inspect it, or run it");
  cmd->require_subcommand(1);
  auto inspect_path = std::make_shared<std::string>();
  CLI::App* inspect =
      cmd->add_subcommand("inspect", "opset, inputs and outputs, op counts, and which ops aspen converts");
  inspect->add_option("MODEL", *inspect_path, "an .onnx file")->required();
  inspect->footer("Example: aspen onnx inspect model.onnx");
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = cmd->add_subcommand("run", "import, compile and run a model once on .npy inputs");
  run->add_option("MODEL", args->model, "an .onnx file")->required();
  run->add_option("--input", args->inputs, "NAME=FILE.npy, one per graph input")->take_all();
  run->add_option("--dim", args->dims, "NAME=EXTENT for a symbolic dimension no input's shape gives")->take_all();
  run->add_option("--output-dir", args->output_dir, "where <output>.npy files go (default: .)");
  run->add_option("--dtype", args->dtype, "compute precision: f32 (default) or bf16");
  run->add_option("--cache", args->cache, "executable cache directory (default: off)");
  run->add_option("--threads", args->threads, "threads (default: the free cores)")->check(at_least(0));
  run->add_option("--profile", args->profile, api::kProfileHelp);
  run->add_option("--graph", args->graph_file,
                  "write the imported graph, the compiled graph, the program and its memory plan to this file");
  run->footer("Example: aspen onnx run model.onnx --input input_ids=ids.npy --output-dir out");
  return Command{cmd, [inspect, inspect_path, run, args] {
                   if (inspect->parsed()) return run_inspect(*inspect_path);
                   return run_run(*args);
                 }};
}

}  // namespace aspen::tools
