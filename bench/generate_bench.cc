#include "bench/generate_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "api/run_profile.h"
#include "bench/common.h"
#include "compiler/memory_profile.h"
#include "core/philox.h"
#include "core/thread_team.h"
#include "core/tensor.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "graph/builder.h"
#include "models/causal_lm.h"
#include "models/config.h"
#include "models/generate.h"
#include "models/init.h"
#include "models/weights.h"
#include "runtime/run_facts.h"

namespace aspen::bench {

namespace {

struct Shape124M {
  int64_t vocab = 50257, n_positions = 1024, d = 768, layers = 12, heads = 12;
  int64_t kv_width = 768;  // what each layer caches per position and per k or v (Hk · head_dim)
};

// The Llama-shaped 124M (`--family llama`, as `aspen bench train` has it: 12 layers, d_model 768, 12 heads
// over 4 kv heads, SwiGLU 2048, vocab 32000, untied head), N(0, 0.02) weights and norms at 1, exported as a
// Hugging Face directory by models::export_hf_model.
Status write_llama_model(const std::string& dir, bool quick) {
  models::ModelConfig mc;
  mc.model_type = "llama";
  mc.family = models::LlamaConfig{.vocab = quick ? 2048 : 32000, .n_positions = 1024, .d_model = 768,
                                  .n_layer = quick ? 2 : 12, .n_head = 12, .n_kv_head = 4, .head_dim = 0,
                                  .d_ff = 2048};
  mc.bos_token_id = 1;
  mc.eos_token_ids = {2};
  graph::Graph g;
  graph::Builder b(g);
  ASPEN_RETURN_IF_ERROR(models::build_causal_lm(b, mc, {.batch = 1, .seq = 1}));
  ASPEN_ASSIGN_OR_RETURN(auto weights, models::init_weights(g, {.seed = 42, .std = 0.02}));
  return models::export_hf_model(dir, mc, weights);
}

// Writes config.json and model.safetensors (N(0, 0.02) weights, LayerNorm at
// 1 and 0) for a GPT-2 of shape `s` into `dir`; returns the weight bytes.
Result<int64_t> write_model(const std::string& dir, const Shape124M& s) {
  std::filesystem::create_directories(dir);
  std::map<std::string, Tensor> w;
  uint64_t stream = 0;
  auto add = [&](const std::string& name, Shape shape, float lo, float hi) {
    Tensor t(DType::f32, shape);
    philox_fill_uniform(t.span<float>(), 42, stream++, 0, lo, hi);
    w.emplace(name, std::move(t));
  };
  const int64_t C = s.d;
  add("transformer.wte.weight", Shape{s.vocab, C}, -0.035f, 0.035f);
  add("transformer.wpe.weight", Shape{s.n_positions, C}, -0.035f, 0.035f);
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    add(p + "ln_1.weight", Shape{C}, 0.9f, 1.1f);
    add(p + "ln_1.bias", Shape{C}, -0.01f, 0.01f);
    add(p + "attn.c_attn.weight", Shape{C, 3 * C}, -0.035f, 0.035f);
    add(p + "attn.c_attn.bias", Shape{3 * C}, -0.01f, 0.01f);
    add(p + "attn.c_proj.weight", Shape{C, C}, -0.035f, 0.035f);
    add(p + "attn.c_proj.bias", Shape{C}, -0.01f, 0.01f);
    add(p + "ln_2.weight", Shape{C}, 0.9f, 1.1f);
    add(p + "ln_2.bias", Shape{C}, -0.01f, 0.01f);
    add(p + "mlp.c_fc.weight", Shape{C, 4 * C}, -0.035f, 0.035f);
    add(p + "mlp.c_fc.bias", Shape{4 * C}, -0.01f, 0.01f);
    add(p + "mlp.c_proj.weight", Shape{4 * C, C}, -0.035f, 0.035f);
    add(p + "mlp.c_proj.bias", Shape{C}, -0.01f, 0.01f);
  }
  add("transformer.ln_f.weight", Shape{C}, 0.9f, 1.1f);
  add("transformer.ln_f.bias", Shape{C}, -0.01f, 0.01f);
  std::vector<std::pair<std::string, const Tensor*>> list;
  int64_t streamed = 0;  // what one decode step's matmuls read: every matrix, and wte as the tied head
  for (const auto& [name, t] : w) {
    list.emplace_back(name, &t);
    if (t.shape().rank() == 2 && name != "transformer.wpe.weight") streamed += int64_t(t.nbytes());
  }
  ASPEN_RETURN_IF_ERROR(io::write_safetensors(dir + "/model.safetensors", list, {{"format", "pt"}}));
  const nlohmann::ordered_json config = {
      {"model_type", "gpt2"},     {"architectures", {"GPT2LMHeadModel"}},
      {"vocab_size", s.vocab},    {"n_positions", s.n_positions},
      {"n_embd", C},              {"n_layer", s.layers},
      {"n_head", s.heads},        {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5}, {"bos_token_id", 50256},
      {"eos_token_id", 50256},    {"tie_word_embeddings", true}};
  std::ofstream(dir + "/config.json") << config.dump(2) << "\n";
  return streamed;
}

// A user's model directory: its shape, and the bytes (as f32) one decode
// step's matmuls stream (see generate_bench.h).
Result<int64_t> describe_model(const std::string& dir, Shape124M* s) {
  ASPEN_ASSIGN_OR_RETURN(models::Checkpoint ckpt, models::Checkpoint::open(dir));
  const models::ModelConfig& c = ckpt.config();
  if (const auto* g = c.gpt2()) {
    *s = {.vocab = g->vocab, .n_positions = g->n_positions, .d = g->d_model, .layers = g->n_layer, .heads = g->n_head,
          .kv_width = g->d_model};
  } else if (const auto* j = c.gptj()) {
    *s = {.vocab = j->vocab, .n_positions = j->n_positions, .d = j->d_model, .layers = j->n_layer, .heads = j->n_head,
          .kv_width = j->d_model};
  } else if (const auto* l = c.llama()) {
    *s = {.vocab = l->vocab, .n_positions = l->n_positions, .d = l->d_model, .layers = l->n_layer, .heads = l->n_head,
          .kv_width = l->kv_heads() * l->head_size()};
  } else {
    return Status::invalid_argument("bench generate --model " + dir,
                                    "a model that generates (gpt2, gptj, llama, mistral, qwen2)",
                                    "model_type " + c.model_type);
  }
  const std::vector<std::string> names = ckpt.tensor_names();
  const bool untied = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n == "lm_head.weight" || n.ends_with(".lm_head.weight");
  });
  int64_t elements = 0;
  for (const std::string& n : names) {
    const io::TensorInfo* t = ckpt.find(n).second;
    if (!t || t->shape.rank() != 2) continue;
    if (n.find("wpe") != std::string::npos || n.find("position") != std::string::npos) continue;
    if (untied && (n.find("wte") != std::string::npos || n.find("embed") != std::string::npos)) continue;
    elements += t->shape.numel();
  }
  return elements * 4;
}

// The bytes one decode step's products stream from a GGUF file, as stored (blocks or floats): every matrix
// but the position table, and the token embedding only when it is the (tied) head.
Result<int64_t> gguf_step_bytes(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(io::GgufFile f, io::GgufFile::open(path));
  const bool tied = f.find("output.weight") == nullptr;
  int64_t bytes = 0;
  for (const io::GgufTensor& t : f.tensors()) {
    if (t.extents.size() != 2 || t.name == "position_embd.weight") continue;
    if (t.name == "token_embd.weight" && !tied) continue;
    bytes += int64_t(f.data(t).size());
  }
  return bytes;
}

bool quantized_dtype(const std::string& d) { return d == "q8_0" || d == "q4_0" || d == "q4_k"; }

double seconds(const std::function<Status()>& fn, Status& status) {
  const auto t0 = std::chrono::steady_clock::now();
  status = fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
  std::string phase = {}, dtype = {};
  int64_t batch = 0;
  double tokens_per_s = 0, bound = 0;
  int64_t step_bytes = 0;  // decode: what one step must read (weights and KV cache)
  double peer = 0;  // PyTorch tokens/s, 0: none
  std::string peer_mode = {};
  double llama_cpp = 0;  // llama.cpp's tokens/s (llama-bench, llama-batched-bench), 0: none
  std::string llama_cpp_test = {};

  // NOTE [guarded rows]: the read sweeps taken beside the decode runs this figure came from (bytes/s); moved by
  // more than 5 % between them: the row was disturbed.
  double sweep_lo = 0, sweep_hi = 0;

  // Above its bound, the ceiling was measured in a slow moment: the fraction is not a measurement.
  bool measurement_fault() const { return bound > 0 && tokens_per_s > bound; }
  double sweep_drift() const { return ceiling_drift(sweep_lo, sweep_hi); }
  bool disturbed() const { return ceiling_moved(sweep_lo, sweep_hi); }
};

// The row a peer's JSON line is about (same phase, batch and dtype), or null.
Row* row_for(std::vector<Row>& rows, const nlohmann::json& j) {
  for (Row& r : rows)
    if (r.phase == j.value("phase", "") && r.batch == j.value("batch", int64_t(0)) && r.dtype == j.value("dtype", ""))
      return &r;
  return nullptr;
}

// Runs `cmd` and hands each JSON object it prints on stdout to `take`;
// false when the command failed (its stderr reaches the user's terminal).

}  // namespace

Result<int64_t> write_random_gpt2(const std::string& dir, int64_t layers, int64_t vocab) {
  Shape124M s;
  s.layers = layers;
  s.vocab = vocab;
  return write_model(dir, s);
}

Status run_generate_bench(const GenerateBenchOptions& opt, std::ostream& out) {
  for (const std::string& d : opt.dtypes)
    if (d != "f32" && d != "bf16" && !quantized_dtype(d))
      return Status::invalid_argument("bench generate: dtype", "f32, bf16, q8_0, q4_0 or q4_k (the weights' type)",
                                      d);
  Shape124M s;
  if (opt.quick) {
    s.layers = 2;
    s.vocab = 2048;
  }
  const int64_t new_tokens = opt.quick ? std::min<int64_t>(opt.new_tokens, 6) : opt.new_tokens;
  const int64_t prefill_T = opt.quick ? std::min<int64_t>(opt.prefill_tokens, 32) : opt.prefill_tokens;
  if (new_tokens < 2) return Status::invalid_argument("bench generate: new tokens", ">= 2", std::to_string(new_tokens));

  const bool own = !opt.model.empty();
  const std::string dir =
      own ? opt.model
          : (std::filesystem::temp_directory_path() / ("aspen_bench_generate_" + std::to_string(::getpid()))).string();
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      if (!d.empty()) std::filesystem::remove_all(d);
    }
  } cleanup{own ? std::string() : dir}, gguf_cleanup{own ? std::string() : dir + "_gguf"};
  int64_t weight_bytes = 0;
  if (opt.family != "gpt2" && opt.family != "llama")
    return Status::invalid_argument("bench generate: family", "gpt2 or llama", opt.family);
  if (own) {
    ASPEN_ASSIGN_OR_RETURN(weight_bytes, describe_model(dir, &s));
  } else if (opt.family == "llama") {
    ASPEN_RETURN_IF_ERROR(write_llama_model(dir, opt.quick));
    ASPEN_ASSIGN_OR_RETURN(weight_bytes, describe_model(dir, &s));
  } else {
    ASPEN_ASSIGN_OR_RETURN(weight_bytes, write_model(dir, s));
  }
  const int64_t prefill_T_max = std::min(prefill_T, s.n_positions - 1);
  if (8 + new_tokens > s.n_positions)
    return Status::invalid_argument("bench generate: new tokens", "8 + new tokens within the model's " +
                                    std::to_string(s.n_positions) + " positions", std::to_string(new_tokens));

  // The machine's read bandwidth, on the team the generator will use.
  const int threads = opt.threads > 0 ? opt.threads : std::max(1, CoreBudget::global().available());
  double read_bw = 0;
  {
    ScopedOmpThreads scope(threads);
    read_bw = measure_read_bandwidth(size_t(weight_bytes));
  }
  if (!opt.json)
    out << fmt::format("# {} ({} layers), {} threads; read-only sweep {:.1f} GB/s over "
                       "{:.0f} MB; decode: {} new tokens after an 8-token prompt\n",
                       own                      ? dir
                       : opt.family == "llama" ? "Llama-124M shape (12 heads over 4 kv heads), random weights"
                                               : "GPT-2-124M shape, random weights",
                       s.layers, threads, read_bw / 1e9,
                       double(weight_bytes) / 1e6, new_tokens);

  // The quantized rows run on GGUF files that bench/llama_cpp.py makes with llama.cpp's own converter and
  // llama-quantize from the same directory: the very files llama.cpp's rows are timed on.
  std::map<std::string, std::pair<std::string, int64_t>> gguf;  // dtype -> (file, bytes a step streams)
  std::string quantized;
  for (const std::string& d : opt.dtypes)
    if (quantized_dtype(d)) quantized += (quantized.empty() ? "" : ",") + d;
  if (!quantized.empty()) {
    const std::string cmd = (opt.python.empty() || opt.python == "none" ? std::string("python3") : opt.python) + " " +
                            std::string(ASPEN_SOURCE_DIR) + "/bench/llama_cpp.py --gguf-only --model " + dir +
                            " --dtypes " + quantized + (own ? std::string() : " --gguf-dir " + dir + "_gguf");
    const bool ok = read_json_lines(cmd, [&](const nlohmann::json& j) {
      gguf[j.value("dtype", "")] = {j.value("gguf", ""), 0};
    });
    for (const std::string& d : opt.dtypes) {
      if (!quantized_dtype(d)) continue;
      auto it = gguf.find(d);
      if (!ok || it == gguf.end() || it->second.first.empty())
        return Status::error(Code::kFailedPrecondition, "bench generate: dtype " + d,
                             "a GGUF file made by bench/llama_cpp.py --gguf-only (llama.cpp's converter and "
                             "llama-quantize)",
                             "none (its message is above)");
      ASPEN_ASSIGN_OR_RETURN(it->second.second, gguf_step_bytes(it->second.first));
    }
  }

  std::vector<Row> rows;
  // One round of aspen's rows; a later round keeps the better figure of each row.
  auto keep = [&rows](const Row& r) {
    for (Row& have : rows)
      if (have.phase == r.phase && have.batch == r.batch && have.dtype == r.dtype) {
        if (r.tokens_per_s > have.tokens_per_s) {
          have.tokens_per_s = r.tokens_per_s;
          have.sweep_lo = r.sweep_lo, have.sweep_hi = r.sweep_hi;
        }
        return;
      }
    rows.push_back(r);
  };
  auto run_aspen = [&]() -> Status {
    const std::vector<int32_t> prompt8 = {464, 2068, 7586, 21831, 18045, 625, 262, 16931};
    for (const std::string& dtype : opt.dtypes) {
      // A quantized row opens the GGUF file: its matrices multiply in their blocks, the rest in f32.
      const DType weights = dtype == "bf16" ? DType::bf16 : DType::f32;
      const bool q = quantized_dtype(dtype);
      const std::string model = q ? gguf.at(dtype).first : dir;
      const int64_t step_bytes = q ? gguf.at(dtype).second : weights == DType::bf16 ? weight_bytes / 2 : weight_bytes;
      for (int64_t B : opt.batches) {
        models::GeneratorOptions go{
            .max_batch = B, .max_length = 8 + new_tokens, .max_prompt = 8, .threads = threads, .weights = weights};
        profile::TraceRecorder trace;
        if (opt.profile || !opt.profile_dir.empty()) go.trace = &trace;
        ASPEN_ASSIGN_OR_RETURN(auto gen, models::Generator::open(model, go));
        std::vector<int32_t> prompt = prompt8;
        for (int32_t& id : prompt) id %= int32_t(s.vocab);
        const std::vector<std::vector<int32_t>> prompts(size_t(B), prompt);
        Status st;
        auto run = [&](int64_t n) {
          return [&, n] { return gen->generate(prompts, {.max_new_tokens = n, .temperature = 0.0f}).status(); };
        };
        seconds(run(2), st);  // warm-up
        ASPEN_RETURN_IF_ERROR(st);
        double t1 = 1e30, tn = 1e30, sweep_lo = 1e30, sweep_hi = 0;
        for (int rep = 0; rep < 3; ++rep) {
          t1 = std::min(t1, seconds(run(1), st));
          ASPEN_RETURN_IF_ERROR(st);
          tn = std::min(tn, seconds(run(new_tokens), st));
          ASPEN_RETURN_IF_ERROR(st);
          // The ceiling is measured again beside the work it bounds; the best counts (a shared host's
          // bandwidth drifts: one sweep taken in a slow moment made a row read 1.33 of its bound).
          ScopedOmpThreads scope(threads);
          const double bw = measure_read_bandwidth(size_t(weight_bytes));
          read_bw = std::max(read_bw, bw);
          sweep_lo = std::min(sweep_lo, bw), sweep_hi = std::max(sweep_hi, bw);
        }
        if (opt.profile && !opt.json)
          out << "# decode, batch " << B << ": every instruction of the runs above\n"
              << profile::summary(trace.events());
        if (!opt.profile_dir.empty()) {  // docs/profile.md: one directory per row
          profile::RunFacts facts = runtime::run_facts(
              "bench generate", threads,
              {{"model", model}, {"dtype", dtype}, {"batch", std::to_string(B)}, {"new_tokens", std::to_string(new_tokens)}});
          const runtime::Session& session = gen->session();
          for (int p = 0; p < session.programs(); ++p)
            facts.programs.push_back(compiler::program_memory(
                session.executable(p), session.programs() == 2 ? (p == 0 ? "prefill" : "decode") : "program " + std::to_string(p), p));
          runtime::add_planned_memory(facts, session);
          const std::string row_dir = opt.profile_dir + "/decode-b" + std::to_string(B) + "-" + dtype;
          ASPEN_RETURN_IF_ERROR(api::write_run_profile(row_dir, trace.events(), facts, opt.json ? std::cerr : out));
        }
        Row r{.phase = "decode", .dtype = dtype, .batch = B, .sweep_lo = sweep_lo, .sweep_hi = sweep_hi};
        r.tokens_per_s = double(B * (new_tokens - 1)) / std::max(tn - t1, 1e-9);
        // Bytes per step: the weights once, plus the cache the attention reads
        // (keys and values of every layer, all max_length positions: the
        // kernel reads the whole cache and masks).
        const int64_t kv = 2 * s.layers * B * (8 + new_tokens) * s.kv_width * 4;
        r.step_bytes = step_bytes + kv;
        keep(r);
      }
      {
        models::GeneratorOptions go{.max_batch = 1,
                                    .max_length = prefill_T_max + 1,
                                    .max_prompt = prefill_T_max,
                                    .threads = threads,
                                    .weights = weights};
        ASPEN_ASSIGN_OR_RETURN(auto gen, models::Generator::open(model, go));
        std::vector<int32_t> prompt(static_cast<size_t>(prefill_T_max));
        for (int64_t i = 0; i < prefill_T_max; ++i) prompt[size_t(i)] = int32_t((i * 7919) % s.vocab);
        Status st;
        auto once = [&] { return gen->generate({prompt}, {.max_new_tokens = 1, .temperature = 0.0f}).status(); };
        seconds(once, st);
        ASPEN_RETURN_IF_ERROR(st);
        double best = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
          best = std::min(best, seconds(once, st));
          ASPEN_RETURN_IF_ERROR(st);
        }
        keep(Row{.phase = "prefill", .dtype = dtype, .batch = 1, .tokens_per_s = double(prefill_T_max) / best});
      }
    }
    return Status();
  };

  // The PyTorch peer on the same directory.
  const bool peers = !opt.python.empty() && opt.python != "none" && !opt.quick;
  auto run_torch = [&] {
    const std::string script = std::string(ASPEN_SOURCE_DIR) + "/bench/torch_generate.py";
    const std::string cmd = opt.python + " -c 'import torch' 2>/dev/null && " + opt.python + " " + script +
                            " --json --model " + dir + " --threads " + std::to_string(threads) + " --new-tokens " +
                            std::to_string(new_tokens) + " 2>/dev/null";
    return read_json_lines(cmd, [&](const nlohmann::json& j) {
      if (Row* r = row_for(rows, j)) {
        const double v = j.value("tokens_per_s", 0.0);
        if (v > r->peer) r->peer = v, r->peer_mode = j.value("mode", "");
      }
    });
  };
  // The llama.cpp peer (bench/llama_cpp.py: builds llama.cpp's benches once per CPU,
  // converts the same directory to GGUF): ppN and tgN at batch 1, batched
  // decode at the larger batches.
  auto run_llama_cpp = [&] {
    std::string dtypes, batches;
    for (const std::string& d : opt.dtypes) dtypes += (dtypes.empty() ? "" : ",") + d;
    for (int64_t b : opt.batches) batches += (batches.empty() ? "" : ",") + std::to_string(b);
    const std::string cmd = opt.python + " " + std::string(ASPEN_SOURCE_DIR) + "/bench/llama_cpp.py --json --model " +
                            dir + " --threads " + std::to_string(threads) + " --new-tokens " +
                            std::to_string(new_tokens) + " --prefill " + std::to_string(prefill_T_max) + " --dtypes " +
                            dtypes + " --batches " + batches +
                            // The random model's GGUF dies with it (each run's model is new: cached, they piled up).
                            (own ? std::string() : " --gguf-dir " + dir + "_gguf");
    return read_json_lines(cmd, [&](const nlohmann::json& j) {
      if (Row* r = row_for(rows, j)) {
        const double v = j.value("tokens_per_s", 0.0);
        if (v > r->llama_cpp) r->llama_cpp = v, r->llama_cpp_test = j.value("test", "");
      }
    });
  };

  // Rounds: aspen, then each peer, in turn, the best of each row kept: a
  // shared host drifts by minutes, and one pass each moved the ratios by
  // +-20 % between runs.
  std::string peer_note, llama_note;
  bool torch_ok = peers, llama_ok = peers && opt.llama_cpp;
  const int rounds = opt.quick ? 1 : std::max(1, opt.rounds);
  for (int round = 0; round < rounds; ++round) {
    ASPEN_RETURN_IF_ERROR(run_aspen());
    if (torch_ok && !run_torch()) {
      torch_ok = false;
      peer_note = "PyTorch peer: not run (no torch for '" + opt.python + "'; --python PATH)";
    }
    if (llama_ok && !run_llama_cpp()) {
      llama_ok = false;
      llama_note = "llama.cpp peer: not run (bench/llama_cpp.py said why above; --no-llama-cpp skips it)";
    }
  }
  for (Row& r : rows)
    if (r.step_bytes > 0) r.bound = double(r.batch) * read_bw / double(r.step_bytes);
  if (!opt.json)
    out << fmt::format("# {} round(s); read-only sweep, best of those interleaved with the decode rows: {:.1f} GB/s\n",
                       rounds, read_bw / 1e9);

  if (!opt.json)
    out << fmt::format("{:<8} {:>5} {:>5} | {:>10} {:>10} {:>9} | {:>10} {:>8} | {:>10} {:>8}\n", "phase", "batch",
                       "dtype", "tokens/s", "bound", "fraction", "pytorch", "ratio", "llama.cpp", "ratio");
  for (const Row& r : rows) {
    if (opt.json) {
      nlohmann::ordered_json j = {{"bench", "generate"}, {"phase", r.phase}, {"batch", r.batch},
                                  {"dtype", r.dtype},    {"tokens_per_s", r.tokens_per_s}};
      if (r.bound > 0) {
        j["bound_tokens_per_s"] = r.bound;
        j["fraction_of_bound"] = r.tokens_per_s / r.bound;
        j["measurement_fault"] = r.measurement_fault();
      }
      if (r.sweep_hi > 0) {
        j["sweep_drift"] = r.sweep_drift();
        if (r.disturbed()) j["disturbed"] = true;
      }
      if (r.peer > 0) {
        j["pytorch_tokens_per_s"] = r.peer;
        j["ratio_vs_pytorch"] = r.tokens_per_s / r.peer;
      } else {
        j["pytorch_tokens_per_s"] = nullptr;
      }
      if (r.llama_cpp > 0) {
        j["llama_cpp_tokens_per_s"] = r.llama_cpp;
        j["llama_cpp_test"] = r.llama_cpp_test;
        j["ratio_vs_llama_cpp"] = r.tokens_per_s / r.llama_cpp;
      } else {
        j["llama_cpp_tokens_per_s"] = nullptr;
        j["ratio_vs_llama_cpp"] = nullptr;
      }
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:<8} {:>5} {:>5} | {:>10.1f} {:>10} {:>9} | {:>10} {:>8} | {:>10} {:>8}\n", r.phase,
                         r.batch, r.dtype, r.tokens_per_s, r.bound > 0 ? fmt::format("{:.1f}", r.bound) : "-",
                         r.bound > 0 ? fmt::format("{:.2f}{}{}", r.tokens_per_s / r.bound,
                                                   r.measurement_fault() ? "!" : "", r.disturbed() ? "~" : "")
                                     : "-",
                         r.peer > 0 ? fmt::format("{:.1f}", r.peer) : "-",
                         r.peer > 0 ? fmt::format("{:.2f}", r.tokens_per_s / r.peer) : "-",
                         r.llama_cpp > 0 ? fmt::format("{:.1f}", r.llama_cpp) : "-",
                         r.llama_cpp > 0 ? fmt::format("{:.2f}", r.tokens_per_s / r.llama_cpp) : "-");
    }
  }
  if (!opt.json && std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.measurement_fault(); }))
    out << "# !: above the bound: the read sweep was measured in a slow moment (a measurement fault, not a figure)\n";
  if (!opt.json && std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.disturbed(); }))
    out << "# ~: disturbed: the read sweeps beside the row's runs moved by more than 5 % (quote undisturbed rows)\n";
  if (!peer_note.empty() && !opt.json) out << "# " << peer_note << "\n";
  if (!llama_note.empty() && !opt.json) out << "# " << llama_note << "\n";
  return Status();
}

}  // namespace aspen::bench
