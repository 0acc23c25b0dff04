// tools/aspen.cc: the `aspen` command line.
//
//   aspen bench gemm [--json] [--threads 1,2] [--dtype f32|bf16|all] [--quick] [--case MxNxK[:ta|:tb|:tatb],...]
//   aspen bench decode [--json] [--threads 1,2] [--rows 1,8] [--dtype f32|bf16|all] [--quick]
//   aspen bench attention [--json] [--t 256,1024,4096]
//   aspen bench kernels [--json]
//   aspen bench conv [--json] [--threads N] [--quick]
//   aspen bench models [--json] [--threads N] [--rounds N] [--python PATH] [--quick] [--compile] [--batch-norm]
//   aspen bench compile [--json] [--cache-dir DIR] [--seq N] [--batch N]
//   aspen bench generate [--json] [--threads N] [--new-tokens N] [--python PATH] [--model DIR]
//   aspen bench pipeline [--json] [--stages 2,4] [--micro 4,8] [--width N] [--steps N] [--quick]
//                        [--no-balance] [--no-rebalance] [--slow F] [--rebalance-steps N] [--seq N]
//   aspen bench collectives [--json] [--devices 2,4] [--mib 1,16,64] [--no-mpi] [--mpirun PATH] [--quick]
//   aspen bench train [--json] [--threads N] [--steps N] [--dtype f32|bf16|both] [--python PATH] [--quick]
//                     [--model DIR]
//   aspen generate --model DIR --prompt TEXT [--max-new-tokens N --temperature T --top-k K --top-p P --seed S]
//   aspen prepare-data --tokenizer DIR --input FILE... --output DIR [--shard-tokens N] [--split-lines]
//   aspen inspect FILE
//   aspen embed --model DIR [--batch N] [--max-length L] [--threads T]   (stdin lines -> JSON lines)
//   aspen info
//   global: --isa scalar|avx2|avx512|avx512_bf16|amx, --reference-kernels, --kernel-choice measured|rule, -v
//
// The library never prints or exits; this file does both.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "bench/attention_bench.h"
#include "bench/collectives_bench.h"
#include "bench/compile_bench.h"
#include "bench/decode_bench.h"
#include "bench/profile_bench.h"
#include "bench/gemm_bench.h"
#include "bench/generate_bench.h"
#include "bench/conv_bench.h"
#include "bench/models_bench.h"
#include "bench/kernels_bench.h"
#include "bench/onnx_bench.h"
#include "bench/pipeline_bench.h"
#include "bench/train_bench.h"
#include "compiler/cache.h"
#include "core/file.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/matmul_choice.h"
#include "tools/commands.h"

namespace {

// The environment a library reads once, when it loads: (NOTE [openblas core]
// in kernels/matmul_choice.h) the OpenBLAS core for a CPU its detection does
// not know. Set when missing, then the process runs itself again so that it
// takes effect. ASPEN_NO_REEXEC guards against a loop. OpenMP's wait policy
// is left to libgomp's default (docs/threading.md, "Idle workers").
void ensure_library_environment(char** argv) {
  if (std::getenv("ASPEN_NO_REEXEC")) return;
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char* core = aspen::kernels::openblas_core_override()) {
      setenv("OPENBLAS_CORETYPE", core, 1);
      changed = true;
    }
  if (!changed) return;
  setenv("ASPEN_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // execv failed: carry on with the libraries' defaults.
}

using aspen::tools::report;

// Edit distance with adjacent transpositions (optimal string alignment).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The deepest subcommand the command line selected.
const CLI::App* selected(const CLI::App& app) {
  const CLI::App* at = &app;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* s : at->get_subcommands())
      if (s->parsed()) {
        at = s;
        deeper = true;
        break;
      }
  }
  return at;
}

// " (did you mean 'train'?)" for a word close to a subcommand or option of
// the selected command (its parents' options too: they fall through).
std::string suggestion(const CLI::App& app, const std::string& word) {
  if (word.empty()) return {};
  std::vector<std::string> names;
  const CLI::App* at = selected(app);
  if (word[0] == '-') {
    for (const CLI::App* a = at; a; a = a->get_parent())
      for (const CLI::Option* o : a->get_options()) {
        for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
        for (const std::string& n : o->get_snames()) names.push_back("-" + n);
      }
  } else {
    for (const CLI::App* s : at->get_subcommands({})) names.push_back(s->get_name());
  }
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& n : names)
    if (const size_t d = edit_distance(word, n); d < best_d) best = n, best_d = d;
  return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

// A parse failure: help and --version print and exit 0; anything else is a
// usage error, "aspen: error: ..." with a suggestion where one is close, exit 2.
int parse_failure(CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == 0) return app.exit(e);
  std::string message = e.what(), hint;
  // An argument nobody took is the likelier cause than what it left missing
  // (`--promt x` leaves --prompt "required"): name it, with a suggestion.
  const std::vector<std::string> extras = app.remaining(true);
  if (!extras.empty()) {
    message = "The following arguments were not expected:";
    for (const std::string& x : extras) message += " " + x;
    hint = suggestion(app, extras.front());
  }
  std::string path;
  for (const CLI::App* a = selected(app); a; a = a->get_parent()) path.insert(0, (a->get_parent() ? " " : "") + a->get_name());
  std::cerr << "aspen: error: " << aspen::escape_for_terminal(message) << hint << "\n"
            << "Run '" << path << " --help' for the options.\n";
  return aspen::tools::kExitUsage;
}

// A bench's `--profile [DIR]`: the per-op table printed; with DIR, each row's profile directory written too
// (DIR/<row>: trace.json, profile.json, report.html; docs/profile.md).
void add_bench_profile(CLI::App* cmd, bool& print, std::string& dir, const std::string& what, const std::string& rows) {
  cmd->add_option_function<std::string>(
         "--profile",
         [&print, &dir](const std::string& v) {
           print = true;
           if (v != "-") dir = v;
         },
         what + "; with DIR, also each row's profile in DIR/" + rows + " (report.html, trace.json, profile.json)")
      ->expected(0, 1)
      ->default_str("-")
      ->type_name("[DIR]");
}

}  // namespace

int main(int argc, char** argv) {
  ensure_library_environment(argv);
  CLI::App app{"aspen: compile Transformer models into static programs and run them", "aspen"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags (-v, --isa, ...) after the subcommand too; set before adding subcommands
  app.set_version_flag("--version", std::string("aspen ") + ASPEN_VERSION);
  bool verbose = false, reference = false;
  std::string isa_cap;
  app.add_flag("-v,--verbose", verbose, "log informational messages");
  app.add_flag("--reference-kernels", reference, "run every kernel's reference version (slow; for checking)");
  app.add_option("--isa", isa_cap, "highest instruction set kernels may use")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "avx512_bf16", "amx"}));
  std::string kernel_choice = "measured";
  app.add_option("--kernel-choice", kernel_choice,
                 "measured: time aspen's, oneDNN's and OpenBLAS's matrix products on this machine and keep the "
                 "fastest (remembered in the cache folder); rule: a fixed rule, the same on every machine")
      ->check(CLI::IsMember({"measured", "rule"}));
  app.footer("Example: aspen bench gemm --threads 2\n         aspen --isa avx2 bench kernels");

  CLI::App* info = app.add_subcommand("info", "show the CPU features and the kernel ISA in use");
  info->footer("Example: aspen --isa avx2 info");

  CLI::App* bench = app.add_subcommand("bench", "benchmarks that report ratios against peers measured in the same run");
  bench->require_subcommand(1);

  aspen::bench::GemmBenchOptions gemm;
  std::string gemm_dtype = "all";
  CLI::App* gemm_cmd = bench->add_subcommand("gemm", "matmul vs oneDNN called directly and OpenBLAS");
  gemm_cmd->footer("Example: aspen bench gemm --json --threads 2 --dtype bf16");
  gemm_cmd->add_flag("--json", gemm.json, "one JSON object per line");
  gemm_cmd->add_option("--threads", gemm.threads, "thread counts to run")->delimiter(',');
  gemm_cmd->add_option("--dtype", gemm_dtype, "f32, bf16 or all")->check(CLI::IsMember({"f32", "bf16", "all"}));
  gemm_cmd->add_flag("--quick", gemm.quick, "one repetition per measurement (a smoke test, not a measurement)");
  std::vector<std::string> gemm_cases;
  gemm_cmd->add_option("--case", gemm_cases, "MxNxK shapes instead of the standard list, e.g. --case 1x768x3072,768x3072x1024:ta "
                 "(:ta, :tb, :tatb: a or b stored transposed)")
      ->delimiter(',');

  aspen::bench::DecodeBenchOptions dec;
  std::string dec_dtype = "all";
  aspen::bench::ProfileBenchOptions profb;
  CLI::App* prof_cmd = bench->add_subcommand(
      "profile", "what tracing every instruction costs, and how often `aspen profile diff` finds a slowed one");
  prof_cmd->add_flag("--json", profb.json, "one JSON object per line");
  prof_cmd->add_option("--threads", profb.threads, "threads (0: the free cores)");
  prof_cmd->add_option("--layers", profb.layers, "GPT-2-124M's shape with this many layers (default 12)")
      ->check(CLI::Range(int64_t(1), int64_t(48)));
  prof_cmd->add_option("--new-tokens", profb.new_tokens, "decode steps per run (default 64)")
      ->check(CLI::Range(int64_t(4), int64_t(1000)));
  prof_cmd->add_option("--rounds", profb.rounds, "overhead: traced and untraced runs, alternated (default 7)")
      ->check(CLI::Range(1, 100));
  prof_cmd->add_option("--trials", profb.trials, "detection trials (default 20)")->check(CLI::Range(1, 1000));
  prof_cmd->add_option("--slowdown", profb.slowdown, "the injected slowdown (default 0.05)")->check(CLI::Range(0.001, 10.0));
  prof_cmd->add_option("--trace-events", profb.trace_events,
                       "trace size: a decode's events repeated to this many, written as trace.pftrace (default "
                       "10000000, about 5 GB of memory; 0: no trace-size row)")
      ->check(CLI::Range(int64_t(0), int64_t(100'000'000)));
  prof_cmd->add_flag("--quick", profb.quick,
                     "2 layers, few tokens, 3 rounds, 2 trials, 100000 events (a smoke test, not a measurement)");
  CLI::App* dec_cmd = bench->add_subcommand("decode", "decode GEMV (GPT-2 or Llama shapes): weight GB/s vs oneDNN and a read sweep");
  dec_cmd->footer("Example: aspen bench decode --threads 2 --rows 1");
  dec_cmd->add_flag("--json", dec.json, "one JSON object per line");
  dec_cmd->add_option("--threads", dec.threads, "thread counts to run")->delimiter(',');
  dec_cmd->add_option("--rows", dec.rows, "activation rows M to run")->delimiter(',')->check(CLI::Range(1, 64));
  dec_cmd->add_option("--dtype", dec_dtype, "weights: f32, bf16, q8_0, q4_0, q4_k or all")
      ->check(CLI::IsMember({"f32", "bf16", "q8_0", "q4_0", "q4_k", "all"}));
  dec_cmd->add_option("--family", dec.family, "layer shapes: gpt2 (GPT-2-124M) or llama (the Llama-shaped 124M of bench "
                      "generate --family llama, every matrix [N, K])")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  dec_cmd->add_option("--layers", dec.layers,
                      "layers of the family to run, e.g. lm_head,mlp.c_proj or q_proj,down_proj (default: all)")
      ->delimiter(',');
  dec_cmd->add_option("--pool-mib", dec.pool_mib, "MiB of weight replicas (default 1024, beyond the LLC; 8: in-cache speed)")
      ->check(CLI::Range(1, 16384));
  dec_cmd->add_flag("--quick", dec.quick, "a 256 MiB pool, one round (a smoke test, not a measurement)");

  aspen::bench::AttentionBenchOptions attn;
  CLI::App* attn_cmd =
      bench->add_subcommand("attention", "attention with every mask, forward and backward, vs PyTorch's SDPA");
  attn_cmd->footer("Example: aspen bench attention --json --t 1024,4096 --masks causal,blockdiag");
  attn_cmd->add_flag("--json", attn.json, "one JSON object per line");
  attn_cmd->add_option("--t", attn.t, "sequence lengths (default 1024,4096,8192)")->delimiter(',');
  attn_cmd->add_option("--masks", attn.masks,
                       "causal, local, blockdiag, bigbird, longformer, decode (one query row per head over T "
                       "cached keys; default all but decode)")
      ->delimiter(',')
      ->check(CLI::IsMember({"causal", "local", "blockdiag", "bigbird", "longformer", "decode"}));
  attn_cmd->add_option("--block", attn.block, "bigbird, longformer: tokens per layout block (default 64)");
  attn_cmd->add_option("--passes", attn.passes, "fwd, fwd_bwd (default both)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fwd", "fwd_bwd"}));
  attn_cmd->add_option("--dtypes", attn.dtypes, "f32, bf16 (q, k and v; default both)")
      ->delimiter(',')
      ->check(CLI::IsMember({"f32", "bf16"}));
  attn_cmd->add_option("--heads", attn.heads, "heads (default 4)");
  attn_cmd->add_option("--d", attn.d, "head dimension (default 64)");
  attn_cmd->add_option("--window", attn.window, "local: keys per query (default 256)");
  attn_cmd->add_option("--documents", attn.documents, "blockdiag: documents per row (default 8)");
  attn_cmd->add_option("--repeats", attn.repeats, "timed runs per row, the best counts (default 3)");
  attn_cmd->add_option("--rounds", attn.rounds,
                       "rounds of aspen's rows then the peer's, each between two FMA peaks (default 3)");
  attn_cmd->add_option("--threads", attn.threads, "threads");
  attn_cmd->add_option("--python", attn.python, "interpreter with torch for the PyTorch peer (\"none\": skip)");
  attn_cmd->add_flag("--flex", attn.flex,
                     "the peer also times FlexAttention (torch.compile) on the fwd rows: compiles per row, minutes");

  aspen::bench::KernelsBenchOptions kb;
  CLI::App* kern_cmd = bench->add_subcommand("kernels", "bandwidth-bound kernels vs a STREAM-style copy");
  kern_cmd->footer("Example: aspen bench kernels --json");
  kern_cmd->add_flag("--json", kb.json, "one JSON object per line");
  kern_cmd->add_option("--threads", kb.threads, "threads");
  kern_cmd->add_flag("--quick", kb.quick, "small sizes, one repetition (a smoke test)");

  aspen::bench::ConvBenchOptions cvb;
  CLI::App* conv_cmd = bench->add_subcommand("conv", "each resnet18 / MNIST CNN convolution pass vs oneDNN");
  conv_cmd->footer("Example: aspen bench conv --json");
  conv_cmd->add_flag("--json", cvb.json, "one JSON object per line");
  conv_cmd->add_option("--threads", cvb.threads, "threads");
  conv_cmd->add_flag("--quick", cvb.quick, "the MNIST layers, short timings (a smoke test)");

  aspen::bench::ModelsBenchOptions mb;
  CLI::App* models_cmd = bench->add_subcommand("models", "PyTorch models as users hold them vs eager / torch.compile");
  models_cmd->footer("Example: aspen bench models --compile --batch-norm");
  models_cmd->add_flag("--json", mb.json, "one JSON object per line");
  models_cmd->add_option("--threads", mb.threads, "threads (aspen and torch)");
  models_cmd->add_option("--rounds", mb.rounds, "interleaved rounds (the median counts)");
  models_cmd->add_option("--python", mb.python, "interpreter with torch, torchvision and transformers");
  models_cmd->add_flag("--quick", mb.quick, "one round of the MNIST CNN (a smoke test)");
  models_cmd->add_flag("--compile", mb.compile, "also torch.compile (first calls take minutes)");
  models_cmd->add_flag("--batch-norm", mb.batch_norm, "also resnet18 training its batch norms");

  aspen::bench::ModelsBenchOptions pb;
  pb.script = "poptorch.py";
  pb.rounds = 3;
  CLI::App* poptorch_cmd =
      bench->add_subcommand("poptorch", "PopTorch tutorials' loops via aspen.poptorch vs eager / torch.compile");
  poptorch_cmd->footer("Example: aspen bench poptorch --compile");
  poptorch_cmd->add_flag("--json", pb.json, "one JSON object per line");
  poptorch_cmd->add_option("--threads", pb.threads, "threads (aspen and torch)");
  poptorch_cmd->add_option("--rounds", pb.rounds, "interleaved rounds (the median counts)");
  poptorch_cmd->add_option("--python", pb.python, "interpreter with torch");
  poptorch_cmd->add_flag("--quick", pb.quick, "one short round (a smoke test)");
  poptorch_cmd->add_flag("--compile", pb.compile, "also torch.compile");

  aspen::bench::CompileBenchOptions cb;
  CLI::App* comp_cmd = bench->add_subcommand("compile", "build and compile GPT-J-6B-shaped graphs; cache hits");
  comp_cmd->footer("Example: aspen bench compile --json");
  comp_cmd->add_flag("--json", cb.json, "one JSON object per line");
  comp_cmd->add_option("--cache-dir", cb.cache_dir, "executable cache directory (default: a fresh temporary one)");
  comp_cmd->add_option("--seq", cb.seq, "sequence length");
  comp_cmd->add_option("--batch", cb.batch, "batch size");

  aspen::bench::GenerateBenchOptions gb;
  aspen::bench::OnnxBenchOptions ob;
  CLI::App* onnx_cmd = bench->add_subcommand("onnx", "imported ONNX models (GPT-2-124M, BERT-base) vs onnxruntime");
  onnx_cmd->footer("Example: aspen bench onnx --json\n         aspen bench onnx --model models/testdata/onnx/gpt2");
  onnx_cmd->add_flag("--json", ob.json, "one JSON object per line");
  onnx_cmd->add_option("--threads", ob.threads, "threads for aspen and onnxruntime (0: the free cores)");
  onnx_cmd->add_option("--reps", ob.reps, "timed runs per row, the best kept (default 5)");
  onnx_cmd->add_option("--dtype", ob.dtypes, "aspen's compute: f32, bf16 (default both)")->delimiter(',');
  onnx_cmd->add_option("--python", ob.python, "interpreter with torch and onnxruntime (\"none\": no export, no peer)");
  onnx_cmd->add_option("--dir", ob.dir, "where the exported cases live (default: the cache directory)");
  onnx_cmd->add_option("--model", ob.model, "one case directory (model.onnx, input_<k>.pb) to run, without the peer");
  onnx_cmd->add_flag("--quick", ob.quick, "2-layer models (a smoke test, not a measurement)");
  add_bench_profile(onnx_cmd, ob.profile, ob.profile_dir, "print where each row's time goes (per op)", "<case>-<dtype>");
  onnx_cmd->add_option("--trace", ob.trace_dir, "keep each row's Chrome trace in this directory (<case>_<dtype>.json)");

  CLI::App* gen_cmd = bench->add_subcommand(
      "generate", "GPT-2-124M decode and prefill tokens/s beside the memory-bandwidth bound and PyTorch");
  gen_cmd->footer("Example: aspen bench generate --json\n         aspen bench generate --python ~/venv/bin/python");
  gen_cmd->add_flag("--json", gb.json, "one JSON object per line");
  gen_cmd->add_option("--threads", gb.threads, "threads (0: the free cores)");
  gen_cmd->add_option("--new-tokens", gb.new_tokens, "decode steps per timed run (default 32)");
  gen_cmd->add_option("--python", gb.python,
                      "interpreter for the peers: PyTorch, and llama.cpp through bench/llama_cpp.py (\"none\": no peer)");
  gen_cmd
      ->add_option("--dtype", gb.dtypes,
                   "weights: f32, bf16 (default both); q8_0, q4_0, q4_k: GGUF files llama.cpp makes of the model")
      ->delimiter(',');
  gen_cmd->add_flag("--quick", gb.quick, "a 2-layer model, few tokens, no peer (a smoke test)");
  gen_cmd->add_option("--family", gb.family, "without --model: gpt2 (GPT-2-124M) or llama (a Llama-shaped 124M)")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  gen_cmd->add_option("--model", gb.model, "a Hugging Face directory (GPT-2, GPT-J) to run instead of the random 124M")
      ->check(CLI::ExistingDirectory);
  add_bench_profile(gen_cmd, gb.profile, gb.profile_dir, "print where decode time goes (per op)", "decode-b<batch>-<dtype>");
  gen_cmd
      ->add_option("--rounds", gb.rounds,
                   "aspen's rows and each peer in turn, this many times, the best of each kept (default 2)")
      ->check(CLI::Range(1, 10));
  gen_cmd->add_flag("!--no-llama-cpp", gb.llama_cpp,
                    "skip the llama.cpp peer (otherwise bench/llama_cpp.py builds llama-bench once per CPU)");

  aspen::bench::TrainBenchOptions tb;
  std::string train_dtype = "both";
  CLI::App* train_cmd = bench->add_subcommand(
      "train", "GPT-2-124M training steps (batch 4 x 256, AdamW): tokens/s, MFU and peak RSS beside PyTorch");
  train_cmd->footer(
      "Example: aspen bench train --json --dtype bf16\n         aspen bench train --python ~/venv/bin/python\n"
      "         aspen bench train --replicas 2");
  train_cmd->add_flag("--json", tb.json, "one JSON object per line");
  train_cmd->add_option("--threads", tb.threads, "threads (default 2)")->check(CLI::Range(1, 1024));
  train_cmd->add_option("--steps", tb.steps, "timed steps per dtype after one warm-up step (default 5)")
      ->check(CLI::Range(int64_t(1), int64_t(1000)));
  train_cmd->add_option("--dtype", train_dtype, "matmul compute type: f32, bf16 or both")
      ->check(CLI::IsMember({"f32", "bf16", "both"}));
  train_cmd->add_option("--python", tb.python, "interpreter with torch and transformers: runs the PyTorch peer");
  train_cmd->add_flag("--compile", tb.compile,
                      "the PyTorch peer also runs torch.compile'd (compiles first: minutes); its faster mode counts");
  train_cmd->add_flag("--quick", tb.quick, "a tiny model, one timed step (a smoke test, not a measurement)");
  train_cmd->add_option("--family", tb.family,
                        "gpt2 (GPT-2 124M), llama (a Llama-shaped 124M) or bert (MiniLM's shape, masked LM, seq 4096)")
      ->check(CLI::IsMember({"gpt2", "llama", "bert"}));
  train_cmd->add_option("--attention", tb.attention,
                        "bert: a sparse layout (bigbird, bslongformer, fixed, variable, local_sliding_window), "
                        "measured beside dense attention");
  train_cmd->add_option("--block", tb.block, "bert: the layout's block (default 64)")->check(CLI::Range(int64_t(1), int64_t(4096)));
  train_cmd->add_option("--predictions", tb.predictions,
                        "bert: the MLM head's rows per example (default: aspen train's; 0: every position)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  train_cmd->add_option("--documents", tb.documents,
                        "packed rows of this many documents against the same rows unpacked (tokens/s ratio)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  train_cmd->add_option("--batch", tb.batch, "micro-batch (default 4)")->check(CLI::Range(int64_t(1), int64_t(4096)));
  train_cmd->add_option("--seq", tb.seq, "sequence (default 256)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  add_bench_profile(train_cmd, tb.profile, tb.profile_dir, "print where the timed steps' time goes (per op)",
                    "<dtype>[-packed|-sparse]");
  train_cmd->add_option("--model", tb.model, "a Hugging Face GPT-2 directory to fine-tune instead of the random 124M")
      ->check(CLI::ExistingDirectory);
  train_cmd->add_option("--replicas", tb.replicas,
                        "data parallel: this many replicas of 1 thread against one device of --threads threads")
      ->check(CLI::Range(2, 64));

  aspen::bench::PipelineBenchOptions pbo;
  CLI::App* pipe_cmd = bench->add_subcommand(
      "pipeline", "the measured pipeline bubble beside (p-1)/(m+p-1), GPipe and 1F1B, on balanced stages");
  pipe_cmd->footer("Example: aspen bench pipeline --json\n         aspen bench pipeline --stages 2 --micro 4,8,16");
  pipe_cmd->add_flag("--json", pbo.json, "one JSON object per line");
  pipe_cmd->add_option("--stages", pbo.stages, "stage counts (default 2,4)")->delimiter(',')->check(CLI::Range(2, 64));
  pipe_cmd->add_option("--micro", pbo.micro, "micro-batches per step (default 4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  pipe_cmd->add_option("--width", pbo.width, "block width (default 1024)")->check(CLI::Range(int64_t(8), int64_t(8192)));
  pipe_cmd->add_option("--steps", pbo.steps, "timed steps after one warm-up (default 3)")
      ->check(CLI::Range(int64_t(1), int64_t(1000)));
  pipe_cmd->add_flag("--quick", pbo.quick, "tiny blocks, one step (a smoke test, not a measurement)");
  pipe_cmd->add_flag("!--no-balance", pbo.balance, "skip the estimated-against-measured cut");
  pipe_cmd->add_flag("!--no-rebalance", pbo.rebalance, "skip the rows of stages rebalanced while training");
  pipe_cmd->add_option("--slow", pbo.slow_stage, "the rebalance rows' slowdown of stage 1 (default 0.5: 50 %)")
      ->check(CLI::Range(0.0, 10.0));
  pipe_cmd->add_option("--rebalance-steps", pbo.rebalance_steps, "the rebalance rows' steps (default 50)")
      ->check(CLI::Range(int64_t(12), int64_t(100000)));
  pipe_cmd->add_option("--seq", pbo.seq, "the balance model's sequence length (default 1024)")
      ->check(CLI::Range(int64_t(8), int64_t(16384)));

  aspen::bench::CollectivesBenchOptions cbo;
  bool coll_no_mpi = false;
  CLI::App* coll_cmd = bench->add_subcommand(
      "collectives", "all-reduce algbw/busbw: threads and mpi backends beside MPI_Allreduce on the same buffers");
  coll_cmd->footer("Example: aspen bench collectives --json\n         mpirun -np 4 aspen bench collectives --mib 64\n"
                   "Outside mpirun the MPI figures come from re-launching this command under mpirun -np N.");
  coll_cmd->add_flag("--json", cbo.json, "one JSON object per line");
  coll_cmd->add_option("--devices", cbo.devices, "device counts (threads; MPI ranks when re-launching)")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  coll_cmd->add_option("--mib", cbo.mib, "message sizes in MiB")->delimiter(',')->check(CLI::Range(int64_t(1), int64_t(1024)));
  coll_cmd->add_flag("--no-mpi", coll_no_mpi, "threads backend only");
  coll_cmd->add_option("--mpirun", cbo.mpirun, "the launcher used to re-launch for MPI (default: mpirun)");
  coll_cmd->add_flag("--quick", cbo.quick, "1 MiB, 2 devices, few repetitions (a smoke test, not a measurement)");
  coll_cmd->add_flag("--mpi-child", cbo.mpi_child, "internal: one rank of the re-launched MPI job")->group("");

  std::string inspect_path;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "list the tensors of a safetensors file (name, dtype, shape, bytes)");
  inspect_cmd->footer("Example: aspen inspect model.safetensors");
  inspect_cmd->add_option("FILE", inspect_path, "a .safetensors file")->required();

  // Commands in their own files (tools/commands.h).
  std::vector<aspen::tools::Command> commands;
  commands.push_back(aspen::tools::add_generate_command(app));
  commands.push_back(aspen::tools::add_perplexity_command(app));
  commands.push_back(aspen::tools::add_embed_command(app));
  commands.push_back(aspen::tools::add_prepare_data_command(app));
  commands.push_back(aspen::tools::add_train_command(app));
  commands.push_back(aspen::tools::add_onnx_command(app));
  commands.push_back(aspen::tools::add_profile_command(app));
  commands.push_back(aspen::tools::add_monitor_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_failure(app, e);
  }
  if (verbose) aspen::set_log_level(aspen::LogLevel::info);
  aspen::kernels::set_reference_mode(reference);
  for (auto isa : {aspen::kernels::Isa::scalar, aspen::kernels::Isa::avx2, aspen::kernels::Isa::avx512,
                   aspen::kernels::Isa::avx512_bf16, aspen::kernels::Isa::amx})
    if (isa_cap == aspen::kernels::isa_name(isa)) aspen::kernels::set_isa_cap(isa);

  // NOTE [matmul choice] in kernels/matmul_choice.cc: the measured choices persist per machine.
  aspen::kernels::set_matmul_choice(kernel_choice == "rule" ? aspen::kernels::MatmulChoice::rule
                                                            : aspen::kernels::MatmulChoice::measured);
  const std::string choices_path = aspen::kernels::matmul_choices_path(aspen::compiler::default_cache_dir());
  if (aspen::Status st = aspen::kernels::use_matmul_choices_file(choices_path); !st.is_ok())
    ASPEN_LOG(warning) << aspen::escape_for_terminal(st.message());

  for (const aspen::tools::Command& c : commands)
    if (c.app->parsed()) return c.run();
  if (inspect_cmd->parsed()) {
    auto file = aspen::io::SafetensorsFile::open(inspect_path);
    if (!file.is_ok()) return report(file.status());
    int64_t total = 0;
    for (const std::string& name : file->names()) {
      const aspen::io::TensorInfo* t = file->find(name);
      std::cout << name << "\t" << aspen::dtype_name(t->dtype) << "\t" << t->shape.to_string() << "\t" << t->bytes
                << "\n";
      total += int64_t(t->bytes);
    }
    std::cout << file->names().size() << " tensors, " << total << " bytes\n";
    for (const auto& [k, v] : file->metadata()) std::cout << "metadata\t" << k << "\t" << v << "\n";
    return 0;
  }
  if (info->parsed()) {
    const auto& f = aspen::kernels::cpu_features();
    std::cout << "cpu: " << f.to_string() << "\nkernel isa: " << aspen::kernels::isa_name(aspen::kernels::active_isa())
              << (aspen::kernels::reference_mode() ? " (reference kernels forced)" : "") << "\n";
    std::cout << "cpu identity: " << aspen::kernels::cpu_identity() << "\ncaches: "
              << aspen::kernels::cpu_caches().to_string() << "\nopenblas: " << aspen::kernels::openblas_description()
              << "\n";
    if (const std::string w = aspen::kernels::library_kernels_warning(); !w.empty()) std::cout << "warning: " << w << "\n";
    std::cout << "onednn: " << aspen::kernels::onednn_description() << "\n";
    // NOTE [matmul choice] in kernels/matmul_choice.cc.
    std::cout << "matmul: " << aspen::kernels::matmul_choice_name(aspen::kernels::matmul_choice())
              << (aspen::kernels::matmul_choice() == aspen::kernels::MatmulChoice::measured
                      ? " (each product on the fastest of aspen, oneDNN and OpenBLAS, timed here)"
                      : " (a fixed rule: OpenBLAS for large f32 products, oneDNN otherwise)")
              << "; " << aspen::kernels::matmul_choices_count() << " choices remembered in " << choices_path << "\n"
              << "aspen gemm kernels: " << aspen::kernels::aspen_gemm_description() << "\n"
              << (aspen::kernels::bf16_matmul_widens()
                      ? "bf16: no bf16 instructions on this CPU (no AVX-512): products widen bf16 to f32\n"
                      : "");
    return 0;
  }
  if (gemm_cmd->parsed()) {
    for (const std::string& c : gemm_cases) {
      auto g = aspen::bench::parse_gemm_case(c);
      if (!g.is_ok()) {
        std::cerr << "aspen: error: " << aspen::escape_for_terminal(g.status().message()) << "\n";
        return aspen::tools::kExitUsage;
      }
      gemm.cases.push_back(*g);
    }
    gemm.f32 = gemm_dtype != "bf16";
    gemm.bf16 = gemm_dtype != "f32";
    return report(aspen::bench::run_gemm_bench(gemm, std::cout));
  }
  if (dec_cmd->parsed()) {
    dec.f32 = dec_dtype == "f32" || dec_dtype == "all";
    dec.bf16 = dec_dtype == "bf16" || dec_dtype == "all";
    dec.q8_0 = dec_dtype == "q8_0" || dec_dtype == "all";
    dec.q4_0 = dec_dtype == "q4_0" || dec_dtype == "all";
    dec.q4_k = dec_dtype == "q4_k" || dec_dtype == "all";
    return report(aspen::bench::run_decode_bench(dec, std::cout));
  }
  if (attn_cmd->parsed()) return report(aspen::bench::run_attention_bench(attn, std::cout));
  if (prof_cmd->parsed()) return report(aspen::bench::run_profile_bench(profb, std::cout));
  if (kern_cmd->parsed()) return report(aspen::bench::run_kernels_bench(kb, std::cout));
  if (conv_cmd->parsed()) return report(aspen::bench::run_conv_bench(cvb, std::cout));
  if (models_cmd->parsed()) return report(aspen::bench::run_models_bench(mb, std::cout));
  if (poptorch_cmd->parsed()) return report(aspen::bench::run_models_bench(pb, std::cout));
  if (comp_cmd->parsed()) return report(aspen::bench::run_compile_bench(cb, std::cout));
  if (gen_cmd->parsed()) return report(aspen::bench::run_generate_bench(gb, std::cout));
  if (onnx_cmd->parsed()) return report(aspen::bench::run_onnx_bench(ob, std::cout));
  if (pipe_cmd->parsed()) return report(aspen::bench::run_pipeline_bench(pbo, std::cout));
  if (coll_cmd->parsed()) {
    cbo.mpi = !coll_no_mpi;
    return report(aspen::bench::run_collectives_bench(cbo, std::cout));
  }
  if (train_cmd->parsed()) {
    if (train_dtype != "both") tb.dtypes = {train_dtype};
    return report(aspen::bench::run_train_bench(tb, std::cout));
  }
  return 0;
}
