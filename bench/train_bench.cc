#include "bench/train_bench.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>
#include <vector>

#include "api/run_profile.h"
#include "api/training_model.h"
#include "bench/common.h"
#include "compiler/executable.h"
#include "compiler/memory_profile.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "core/thread_team.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "kernels/attention_layout.h"
#include "models/config.h"
#include "models/causal_lm.h"
#include "models/weights.h"
#include "models/init.h"
#include "profile/trace.h"
#include "runtime/run_facts.h"
#include "runtime/session.h"
#include "train/optimizer.h"

namespace aspen::bench {

namespace {

struct TrainShape {
  models::ModelConfig model;  // gpt2, llama or bert
  int64_t batch = 4, seq = 256;
  std::string model_dir = {};  // --model: weights from this directory
  int64_t documents = 0;       // > 0: packed rows of this many documents (segment ids)
  // bert: model.sparse_attention, a bidirectional layout (DeepSpeed's defaults but the block, seed 1), is
  // what aspen train gives a model trained with model.attention.
  double density = 1.0;        // the share of (query, key) blocks the layout visits
  int64_t predictions = 0;     // bert: the MLM head's rows per example (models/bert.h; 0: every position)
  int64_t n_layer() const {
    return std::visit([](const auto& f) { return f.n_layer; }, model.family);
  }
  int64_t d_model() const {
    return std::visit([](const auto& f) { return f.d_model; }, model.family);
  }
  int64_t n_head() const { return model.n_head(); }
  int64_t vocab() const { return model.vocab(); }
  int64_t n_positions() const { return model.n_positions(); }
};

// GPT-2 124M, or (family llama) its Llama-shaped peer: 12 layers, d_model 768,
// 12 heads over 4 kv heads, SwiGLU width 2048, vocab 32000, untied head (124.7 M
// parameters, as GPT-2 small's 124.4 M).
TrainShape bench_shape(bool quick, const std::string& family) {
  TrainShape s;
  if (family == "bert") {  // all-MiniLM-L6-v2's shape, masked-LM training of long rows (its positions grown)
    s.model.model_type = "bert";
    s.model.family = quick ? models::BertConfig{.vocab = 512, .max_positions = 128, .d_model = 64, .n_layer = 2,
                                                .n_head = 2, .d_ff = 128}
                           : models::BertConfig::minilm_l6();
    s.batch = 1;
    s.seq = quick ? 128 : 4096;
    return s;
  }
  if (family == "llama") {
    s.model.model_type = "llama";
    s.model.family = quick ? models::LlamaConfig{.vocab = 512, .n_positions = 64, .d_model = 64, .n_layer = 2,
                                                 .n_head = 4, .n_kv_head = 2, .head_dim = 0, .d_ff = 176}
                           : models::LlamaConfig{.vocab = 32000, .n_positions = 1024, .d_model = 768, .n_layer = 12,
                                                 .n_head = 12, .n_kv_head = 4, .head_dim = 0, .d_ff = 2048};
  } else {
    s.model.model_type = "gpt2";
    models::Gpt2Config c = models::Gpt2Config::gpt2_small();
    if (quick) c = {.vocab = 512, .n_positions = 64, .d_model = 64, .n_layer = 2, .n_head = 2};
    s.model.family = c;
  }
  if (quick) {
    s.batch = 2;
    s.seq = 32;
  }
  return s;
}

// Every parameter a matmul multiplies by (the tied lm_head counted once, as
// the matmul it is), and the FLOPs one token costs to train on.
int64_t matmul_parameters(const TrainShape& s) {
  if (const models::BertConfig* b = s.model.bert()) {  // q, k, v, o, the MLP; the MLM head's transform and decoder
    const int64_t C = b->d_model, F = b->d_ff, head = C * C + b->vocab * C;
    return b->n_layer * (4 * C * C + 2 * C * F) + (s.predictions > 0 ? head * s.predictions / s.seq : head);
  }
  if (const models::LlamaConfig* l = s.model.llama()) {
    const int64_t C = l->d_model, Q = l->n_head * l->head_size(), KV = l->kv_heads() * l->head_size(), F = l->d_ff;
    return l->n_layer * (2 * C * Q + 2 * C * KV + 3 * C * F) + l->vocab * C;  // q, o, k, v, gate, up, down, head
  }
  const models::Gpt2Config& c = *s.model.gpt2();
  const int64_t C = c.d_model, F = c.ff_dim();
  const int64_t per_layer = C * 3 * C + C * C + C * F + F * C;  // c_attn, attn.c_proj, c_fc, mlp.c_proj
  return c.n_layer * per_layer + c.vocab * C;
}
// QK^T and AV, fwd + bwd, causal counted in full; a sparse layout's share of the blocks.
double attention_flops_per_token(const TrainShape& s) {
  const int64_t width = s.model.llama() ? s.model.llama()->n_head * s.model.llama()->head_size() : s.d_model();
  return 12.0 * double(s.n_layer() * s.seq * width) * s.density;
}
double flops_per_token(const TrainShape& s) {
  return 6.0 * double(matmul_parameters(s)) + attention_flops_per_token(s);
}

// One dtype's figures, as the child process sends them to the parent.
struct Row {
  std::string dtype = {};
  double step_s = 0, best_step_s = 0, tokens_per_s = 0, tokens_per_s_best = 0;
  double peak_gflops = 0;  // the machine's peak for this dtype, measured by the child
  std::string peak_kind = {};
  // NOTE [guarded rows]: that peak before and after the timed steps; moved by more than 5 %: disturbed
  double peak_before = 0, peak_after = 0;
  int attempts = 1;
  bool disturbed() const { return ceiling_moved(peak_before, peak_after); }
  double compile_s = 0, loss = 0;
  int64_t planned_peak_bytes = 0, arena_bytes = 0, state_bytes = 0, peak_rss_bytes = 0;
  int64_t instructions = 0, reference_instructions = 0;
  std::string profile = {};  // profile::summary of the timed steps, with --profile
  // The PyTorch peer (0: not run).
  double peer_tokens_per_s = 0;
  int64_t peer_peak_rss_bytes = 0;
  std::string peer_mode = {};
};

nlohmann::json to_json(const Row& r) {
  return {{"dtype", r.dtype},
          {"step_s", r.step_s},
          {"best_step_s", r.best_step_s},
          {"tokens_per_s", r.tokens_per_s},
          {"tokens_per_s_best", r.tokens_per_s_best},
          {"peak_gflops", r.peak_gflops},
          {"peak_kind", r.peak_kind},
          {"peak_before", r.peak_before},
          {"peak_after", r.peak_after},
          {"compile_s", r.compile_s},
          {"loss", r.loss},
          {"planned_peak_bytes", r.planned_peak_bytes},
          {"arena_bytes", r.arena_bytes},
          {"state_bytes", r.state_bytes},
          {"peak_rss_bytes", r.peak_rss_bytes},
          {"instructions", r.instructions},
          {"reference_instructions", r.reference_instructions},
          {"profile", r.profile}};
}

Row from_json(const nlohmann::json& j) {
  Row r;
  r.dtype = j.value("dtype", "");
  r.step_s = j.value("step_s", 0.0);
  r.best_step_s = j.value("best_step_s", 0.0);
  r.tokens_per_s = j.value("tokens_per_s", 0.0);
  r.tokens_per_s_best = j.value("tokens_per_s_best", 0.0);
  r.peak_gflops = j.value("peak_gflops", 0.0);
  r.peak_kind = j.value("peak_kind", "");
  r.peak_before = j.value("peak_before", 0.0);
  r.peak_after = j.value("peak_after", 0.0);
  r.compile_s = j.value("compile_s", 0.0);
  r.loss = j.value("loss", 0.0);
  r.planned_peak_bytes = j.value("planned_peak_bytes", int64_t(0));
  r.arena_bytes = j.value("arena_bytes", int64_t(0));
  r.state_bytes = j.value("state_bytes", int64_t(0));
  r.peak_rss_bytes = j.value("peak_rss_bytes", int64_t(0));
  r.instructions = j.value("instructions", int64_t(0));
  r.reference_instructions = j.value("reference_instructions", int64_t(0));
  r.profile = j.value("profile", "");
  return r;
}

// The high-water RSS of this process's address space (VmHWM): unlike
// getrusage's ru_maxrss it is not inherited across fork or exec.
int64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  123456 kB"
  return 0;
}

// The training step as the trainer records it: forward with the loss, every
// parameter's gradient, AdamW. Only the loss is an output (the host never
// reads the logits of a training step).
Status build_training_graph(graph::Graph& g, const TrainShape& s) {
  graph::Builder b(g);
  if (const models::BertConfig* bert = s.model.bert()) {
    ASPEN_ASSIGN_OR_RETURN(const std::optional<kernels::BlockLayout> layout,
                           models::model_layout(s.model, s.seq, "bench train"));
    ASPEN_RETURN_IF_ERROR(models::build_bert(b, *bert,
                                             {.batch = s.batch,
                                              .seq = s.seq,
                                              .mlm_head = true,
                                              .with_loss = true,
                                              .mlm_predictions = s.predictions,
                                              .layout = layout ? &*layout : nullptr})
                              .status());
    g.remove_output("last_hidden_state");
  } else {
    ASPEN_RETURN_IF_ERROR(models::build_causal_lm(
        b, s.model, {.batch = s.batch, .seq = s.seq, .with_loss = true, .segments = s.documents > 0}));
  }
  g.remove_output("logits");
  const graph::ValueId loss = *g.find_output("loss");
  std::vector<graph::ValueId> params;
  for (int32_t i : g.parameter_nodes()) params.push_back(g.node(i).outputs[0]);
  ASPEN_ASSIGN_OR_RETURN(std::vector<graph::ValueId> grads, graph::append_gradients(g, loss, params));
  return train::append_adamw(b, params, grads, {.weight_decay = 0.1, .no_decay = {"bias", "ln_", "norm", "LayerNorm"}})
      .status();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The matmul events of a trace grouped by their operands' types and
// attributes: count, time and GFLOP/s (2 * M * N * K per product), costliest
// first. The matmuls are most of a training step; this says which shapes.
std::string matmul_summary(const std::vector<profile::TraceEvent>& events, const runtime::Session& session) {
  const graph::Graph& g = session.executable().graph;
  struct Group {
    int64_t count = 0;
    double ms = 0, flops = 0;
  };
  std::map<std::string, Group> groups;
  for (const profile::TraceEvent& e : events) {
    if (e.name != "matmul") continue;
    int32_t node = -1;
    for (const auto& [k, v] : e.args)
      if (k == "node") node = std::stoi(v);
    if (node < 0) continue;
    const graph::Node& n = g.node(node);
    const graph::TensorType& a = g.type(n.inputs[0]);
    const graph::TensorType& w = g.type(n.inputs[1]);
    const int64_t k = n.attrs.i_or("trans_a", 0) ? a.shape[-2] : a.shape[-1];
    Group& grp = groups[a.to_string() + " x " + w.to_string() + " {" + n.attrs.to_string() + "}"];
    ++grp.count;
    grp.ms += double(e.duration_ns()) * 1e-6;
    grp.flops += 2.0 * double(g.type(n.outputs[0]).shape.numel()) * double(k);
  }
  std::vector<std::pair<std::string, Group>> sorted(groups.begin(), groups.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
  std::string s = "  matmul by operands                                          count    total ms   GFLOP/s\n";
  for (const auto& [key, grp] : sorted)
    s += fmt::format("  {:<60} {:>5} {:>11.1f} {:>9.1f}\n", key, grp.count, grp.ms, grp.flops / (grp.ms * 1e6));
  return s;
}

// Compiles and times one dtype; runs in the child process.
// A random batch of the shape's tokens and targets (the same for every run).
struct RandomBatch {
  Tensor ids, pos, targets, segments, token_types, mask, mlm_positions;
};
RandomBatch random_batch(const TrainShape& s) {
  const int64_t BT = s.batch * s.seq;
  RandomBatch b{Tensor(DType::i32, {s.batch, s.seq}), Tensor(DType::i32, {s.batch, s.seq}), Tensor(DType::i32, {BT}),
                Tensor(DType::i32, {s.batch, s.seq}), Tensor(), Tensor(), Tensor()};
  // Packed: documents of seq / documents tokens (the last takes the rest), positions restarting in each.
  const int64_t doc = s.documents > 0 ? std::max<int64_t>(1, s.seq / s.documents) : s.seq;
  for (int64_t i = 0; i < BT; ++i) {
    const int64_t t = i % s.seq, d = std::min(t / doc, std::max<int64_t>(s.documents, 1) - 1);
    b.ids.span<int32_t>()[size_t(i)] = int32_t(philox_bits(7, 0, uint64_t(i)) % uint32_t(s.vocab()));
    b.targets.span<int32_t>()[size_t(i)] = int32_t(philox_bits(7, 1, uint64_t(i)) % uint32_t(s.vocab()));
    b.pos.span<int32_t>()[size_t(i)] = int32_t(t - d * doc);
    b.segments.span<int32_t>()[size_t(i)] = int32_t(d);
  }
  if (s.model.bert()) {  // masked LM: 15 % of the tokens predicted (HF's labels: -100 elsewhere)
    b.token_types = Tensor(DType::i32, {s.batch, s.seq});
    b.mask = Tensor(DType::u8, {s.batch, s.seq});
    for (int64_t i = 0; i < BT; ++i) {
      b.mask.span<uint8_t>()[size_t(i)] = 1;
      if (bits_to_unit_float(philox_bits(7, 2, uint64_t(i))) >= 0.15f) b.targets.span<int32_t>()[size_t(i)] = -100;
    }
    if (const int64_t K = s.predictions; K > 0) {  // the predicted rows only, as aspen train's feed lists them
      Tensor pos(DType::i32, {s.batch * K}), kept(DType::i32, {s.batch * K});
      models::gather_mlm_predictions(b.targets.data<int32_t>(), s.batch, s.seq, K, pos.data<int32_t>(),
                                     kept.data<int32_t>());
      b.targets = std::move(kept);
      b.mlm_positions = std::move(pos);
    }
  }
  return b;
}

// Times `steps` calls of `step` (each returning its seconds) into r's
// median and best step and their tokens/s for `tokens` per step.
Status time_steps(int64_t steps, double tokens, const std::function<Result<double>()>& step, Row& r) {
  std::vector<double> times;
  for (int64_t i = 0; i < steps; ++i) {
    ASPEN_ASSIGN_OR_RETURN(double dt, step());
    times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  r.step_s = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  r.best_step_s = times.front();
  r.tokens_per_s = tokens / r.step_s;
  r.tokens_per_s_best = tokens / r.best_step_s;
  return Status();
}

Result<Row> measure(const TrainShape& s, const std::string& dtype, const TrainBenchOptions& opt) {
  Row r;
  r.dtype = dtype;
  const DType compute = dtype == "bf16" ? DType::bf16 : DType::f32;
  // The peak is measured before and after the timed steps and the higher kept: a shared host's speed
  // drifts, and a peak taken in a slow moment once put the MFU above 1 (flagged as a fault below).
  const auto measure_peak = [&] {
    ScopedOmpThreads team(opt.threads);
    double gflops = 0;
    if (compute == DType::bf16) {
      const BfPeak p = measure_bf16_peak(opt.threads);
      gflops = p.gflops;
      if (p.gflops >= r.peak_gflops) r.peak_kind = p.kind;
    } else {
      gflops = measure_f32_fma_peak(opt.threads);
      r.peak_kind = "f32_fma";
    }
    r.peak_gflops = std::max(r.peak_gflops, gflops);
    (r.peak_before == 0 ? r.peak_before : r.peak_after) = gflops;
  };
  measure_peak();

  graph::Graph g;
  ASPEN_RETURN_IF_ERROR(build_training_graph(g, s));
  compiler::CompileOptions copt;
  copt.compute = compute;
  copt.verify_each_pass = false;  // a test aid; off whatever the build type
  const auto t0 = std::chrono::steady_clock::now();
  ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<compiler::Executable> exe, compiler::compile(g, copt));
  r.compile_s = seconds_since(t0);
  r.arena_bytes = exe->plan.arena_bytes;
  for (const compiler::Binding& p : exe->parameters) r.state_bytes += p.type.bytes();
  for (const auto& c : exe->constants)
    if (c) r.state_bytes += int64_t(c->nbytes());
  r.planned_peak_bytes = r.arena_bytes + r.state_bytes;
  r.instructions = int64_t(exe->program.code.size());
  for (const compiler::Instruction& ins : exe->program.code) r.reference_instructions += ins.reference ? 1 : 0;

  profile::TraceRecorder trace(/*enabled=*/false);
  runtime::SessionOptions sopt;
  sopt.threads = opt.threads;
  if (opt.profile || !opt.profile_dir.empty()) sopt.trace = &trace;
  ASPEN_ASSIGN_OR_RETURN(auto session, runtime::Session::create(std::move(exe), sopt));

  // --model: the directory's weights; else N(0, 0.02), LayerNorms 1 and 0, biases 0. Optimizer state stays zero.
  if (!s.model_dir.empty()) {
    // The forward graph names exactly the model's parameters (the training graph adds the optimizer's).
    graph::Graph fg;
    graph::Builder fb(fg);
    ASPEN_RETURN_IF_ERROR(models::build_causal_lm(fb, s.model, {.batch = s.batch, .seq = s.seq, .with_loss = true}));
    ASPEN_ASSIGN_OR_RETURN(models::Checkpoint ckpt, models::Checkpoint::open(s.model_dir));
    ASPEN_ASSIGN_OR_RETURN(const models::WeightPlan plan, models::plan_weights(fg, ckpt));
    ASPEN_RETURN_IF_ERROR(models::load_weights(
        plan, [&](const std::string& name, const Tensor& t) { return session->set_parameter(name, t); }));
  }
  uint64_t stream = 0;
  for (const compiler::Binding& p : session->parameters()) {
    if (!s.model_dir.empty()) break;
    const std::string& name = p.name;
    auto ends_with = [&](const char* suffix) {
      const size_t n = std::strlen(suffix);
      return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
    };
    if (name.rfind("optimizer.", 0) == 0 || ends_with(".bias")) continue;
    Tensor t(p.type.dtype, p.type.shape);
    if (name.find("ln_") != std::string::npos || name.find("LayerNorm.weight") != std::string::npos)
      std::fill(t.span<float>().begin(), t.span<float>().end(), 1.0f);
    else
      philox_fill_normal(t.span<float>(), 1234, stream++, 0, 0.0f, 0.02f);
    ASPEN_RETURN_IF_ERROR(session->set_parameter(name, t));
  }

  const RandomBatch batch = random_batch(s);
  Tensor lr(DType::f32, Shape{});
  lr.span<float>()[0] = 1e-4f;
  std::map<std::string, const Tensor*> inputs = {
      {"input_ids", &batch.ids}, {"targets", &batch.targets}, {train::kLrName, &lr}};
  if (s.model.bert()) {
    inputs.emplace("token_type_ids", &batch.token_types);
    inputs.emplace("attention_mask", &batch.mask);
    if (s.predictions > 0) inputs.emplace("mlm_positions", &batch.mlm_positions);
  } else {
    inputs.emplace("positions", &batch.pos);
  }
  if (s.documents > 0) inputs.emplace("segments", &batch.segments);

  auto step = [&]() -> Result<double> {
    const auto start = std::chrono::steady_clock::now();
    ASPEN_ASSIGN_OR_RETURN(auto out, session->run(inputs));
    const double dt = seconds_since(start);
    r.loss = double(out.at("loss").span<float>()[0]);
    return dt;
  };
  ASPEN_RETURN_IF_ERROR(step().status());  // warm-up: first touch of the arena, oneDNN's caches
  trace.set_enabled(true);
  ASPEN_RETURN_IF_ERROR(time_steps(opt.steps, double(s.batch * s.seq), step, r));
  if (!std::isfinite(r.loss))
    return Status::error(Code::kInternal, "bench train: " + dtype + " loss", "a finite number", std::to_string(r.loss));
  if (opt.profile) r.profile = profile::summary(trace.events(), 15) + matmul_summary(trace.events(), *session);
  if (!opt.profile_dir.empty()) {  // docs/profile.md: the timed steps, one directory per row
    trace.set_enabled(false);
    profile::RunFacts run = runtime::run_facts("bench train", opt.threads,
                                           {{"family", s.model.bert() ? "bert" : s.model.llama() ? "llama" : "gpt2"},
                                            {"dtype", dtype},
                                            {"batch", std::to_string(s.batch)},
                                            {"seq", std::to_string(s.seq)},
                                            {"steps_recorded", std::to_string(opt.steps)},
                                            {"tokens_per_s", std::to_string(r.tokens_per_s)}});
    run.programs.push_back(compiler::program_memory(session->executable(), "train step", 0));
    runtime::add_planned_memory(run, *session);
    const std::string row = dtype + (s.documents > 0 ? "-packed" : "") + (s.density < 1.0 ? "-sparse" : "");
    ASPEN_RETURN_IF_ERROR(api::write_run_profile(opt.profile_dir + "/" + row, trace.events(), run, std::cerr));
  }
  r.peak_rss_bytes = peak_rss_bytes();
  measure_peak();
  return r;
}

// Runs fn() in a child process and returns what it sent.
Result<Row> in_child(const std::string& what, const std::function<Result<Row>()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0)
    return Status::error(Code::kIoError, "bench train: pipe", "a pipe to the child", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::error(Code::kIoError, "bench train: fork", "a child process", std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    nlohmann::json j;
    Result<Row> r = fn();
    if (r.is_ok()) {
      j = to_json(*r);
    } else {
      const Status& st = r.status();
      j = {{"error_code", int(st.code())},
           {"subject", st.subject()},
           {"expected", st.expected()},
           {"found", st.found()},
           {"hint", st.hint()}};
    }
    const std::string text = j.dump() + "\n";
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t w = ::write(fds[1], text.data() + done, text.size() - done);
      if (w <= 0) break;
      done += size_t(w);
    }
    ::_exit(r.is_ok() ? 0 : 1);  // no atexit handlers or destructors of the parent's copies
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    const std::string how = WIFSIGNALED(wstatus) ? "killed by signal " + std::to_string(WTERMSIG(wstatus))
                                                 : "exit status " + std::to_string(WEXITSTATUS(wstatus));
    return Status::error(Code::kInternal, "bench train: the child process of " + what, "a JSON report",
                         how + " without one");
  }
  if (j.contains("error_code"))
    return Status::error(Code(j.value("error_code", int(Code::kInternal))), j.value("subject", ""),
                         j.value("expected", ""), j.value("found", ""), j.value("hint", ""));
  return from_json(j);
}

// One step as `aspen train` runs it, through api::TrainingModel: one device
// of opt.threads threads (replicas 1: the fused step), or `replicas`
// data-parallel replicas of one thread, on the same global batch.
Result<Row> measure_model(const TrainShape& s, const std::string& dtype, const TrainBenchOptions& opt, int replicas,
                          bool overlap = true) {
  Row r;
  r.dtype = dtype;
  const int64_t micro = s.batch / replicas;
  graph::Graph g;
  {
    graph::Builder b(g);
    ASPEN_RETURN_IF_ERROR(models::build_causal_lm(b, s.model, {.batch = micro, .seq = s.seq, .with_loss = true}));
  }
  api::Options o;
  o.precision(dtype == "bf16" ? DType::bf16 : DType::f32).threads(replicas > 1 ? 1 : opt.threads);
  o.replication_factor(replicas);
  api::TrainingOptions t;
  t.optimizer.weight_decay = 0.1;
  t.optimizer.no_decay = {"bias", "ln_"};
  t.schedule.lr = 1e-4;
  t.data_parallel.overlap = overlap;
  const auto t0 = std::chrono::steady_clock::now();
  ASPEN_ASSIGN_OR_RETURN(auto model, api::TrainingModel::create(g, o, t));
  r.compile_s = seconds_since(t0);
  ASPEN_ASSIGN_OR_RETURN(auto weights,
                         models::init_weights(g, {.seed = 1234, .std = 0.02, .n_layer = s.n_layer(),
                                                  .scaled_residual = s.model.gpt2() != nullptr}));
  std::map<std::string, const Tensor*> w;
  for (const auto& [name, tensor] : weights) w.emplace(name, &tensor);
  ASPEN_RETURN_IF_ERROR(model->copy_weights_to_device(w));
  const RandomBatch batch = random_batch(s);
  const std::map<std::string, const Tensor*> inputs = {
      {"input_ids", &batch.ids}, {"positions", &batch.pos}, {"targets", &batch.targets}};
  auto step = [&]() -> Result<double> {
    const auto start = std::chrono::steady_clock::now();
    ASPEN_ASSIGN_OR_RETURN(auto out, model->run(inputs));
    const double dt = seconds_since(start);
    r.loss = double(out.at("loss").span<float>()[0]);
    return dt;
  };
  ASPEN_RETURN_IF_ERROR(step().status());  // warm-up
  ASPEN_RETURN_IF_ERROR(time_steps(opt.steps, double(s.batch * s.seq), step, r));
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

// bench/torch_train.py for one dtype; fills the peer fields of `r` (left 0
// when the peer cannot run). Returns a note when it did not run.
std::string run_peer(const TrainShape& s, const TrainBenchOptions& opt, Row& r) {
  const std::string script = std::string(ASPEN_SOURCE_DIR) + "/bench/torch_train.py";
  const std::string cmd =
      opt.python + " " + script + " --json --dtypes " + r.dtype + " --threads " + std::to_string(opt.threads) +
      " --steps " + std::to_string(opt.steps) +
      fmt::format(" --batch {} --seq {} --vocab {} --n-positions {} --d-model {} --layers {} --heads {}", s.batch,
                  s.seq, s.vocab(), s.n_positions(), s.d_model(), s.n_layer(), s.n_head()) +
      (s.model.llama() ? fmt::format(" --family llama --kv-heads {} --d-ff {}", s.model.llama()->kv_heads(),
                                     s.model.llama()->d_ff)
       : s.model.bert() ? fmt::format(" --family bert --d-ff {}", s.model.bert()->d_ff)
                        : std::string()) +
      (s.model_dir.empty() ? "" : " --model '" + s.model_dir + "'") + (opt.compile ? " --compile" : "") +
      " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "PyTorch peer: cannot start '" + opt.python + "'";
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("dtype", "") != r.dtype) continue;
    if (j.value("tokens_per_s", 0.0) <= r.peer_tokens_per_s) continue;  // --compile: the faster mode counts
    r.peer_tokens_per_s = j.value("tokens_per_s", 0.0);
    r.peer_peak_rss_bytes = j.value("peak_rss_bytes", int64_t(0));
    r.peer_mode = j.value("mode", "");
  }
  const int rc = ::pclose(p);
  if (r.peer_tokens_per_s > 0) return "";
  return fmt::format("PyTorch peer ({}): no result (exit status {}; run {} {} --dtypes {} to see why)", r.dtype,
                     WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, opt.python, script, r.dtype);
}

std::string gib(int64_t b) { return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30)); }

// --documents: packed rows against the same rows unpacked, per dtype, each in its own child.
Status run_packing_bench(const TrainShape& s, const TrainBenchOptions& o, std::ostream& out) {
  if (o.documents > s.seq)
    return Status::invalid_argument("bench train: documents", "at most seq = " + std::to_string(s.seq),
                                    std::to_string(o.documents));
  if (!o.json)
    out << fmt::format("# {} {}: batch {} x seq {}, {} documents per packed row; AdamW, {} threads; median of {} steps; "
                       "packed = segment ids (block-diagonal causal mask), positions restarting\n",
                       s.model.llama() ? "Llama" : "GPT-2", o.quick ? "tiny (--quick)" : "124M", s.batch, s.seq,
                       o.documents, o.threads, o.steps)
        << fmt::format("{:<5} | {:>10} {:>10} | {:>6} {:>6}\n", "dtype", "unpacked", "packed", "ratio", "goal");
  for (const std::string& dtype : o.dtypes) {
    TrainShape packed = s;
    packed.documents = o.documents;
    out.flush();
    ASPEN_ASSIGN_OR_RETURN(Row a, in_child(dtype, [&] { return measure(s, dtype, o); }));
    out.flush();
    ASPEN_ASSIGN_OR_RETURN(Row b, in_child(dtype, [&] { return measure(packed, dtype, o); }));
    const double ratio = a.tokens_per_s > 0 ? b.tokens_per_s / a.tokens_per_s : 0.0;
    if (o.json)
      out << nlohmann::ordered_json({{"bench", "train_packing"}, {"dtype", dtype}, {"documents", o.documents},
                             {"seq", s.seq}, {"batch", s.batch}, {"unpacked_tokens_per_s", a.tokens_per_s},
                             {"packed_tokens_per_s", b.tokens_per_s}, {"ratio", ratio}})
                 .dump()
          << "\n";
    else
      out << fmt::format("{:<5} | {:>10.1f} {:>10.1f} | {:>6.3f} {:>6}\n", dtype, a.tokens_per_s, b.tokens_per_s,
                         ratio, ">=0.95");
  }
  return Status();
}

// --replicas: one device against R replicas, per dtype, interleaved.
Status run_replicas_bench(const TrainShape& s, const TrainBenchOptions& o, std::ostream& out) {
  constexpr double kGoal = 0.95;  // issue W1.5
  if (s.batch % o.replicas != 0)
    return Status::invalid_argument("bench train: --replicas", "a divisor of the batch (" + std::to_string(s.batch) + ")",
                                    std::to_string(o.replicas));
  if (!o.json) {
    out << fmt::format(
        "# GPT-2 {}: batch {} x seq {}, AdamW, through api::TrainingModel; one device of {} threads (fused step) "
        "against {} replicas of 1 thread (micro-batch {} each); median of {} steps after 1 warm-up, each in its own "
        "process\n",
        o.quick ? "tiny (--quick)" : "124M", s.batch, s.seq, o.threads, o.replicas, s.batch / o.replicas, o.steps);
    out << fmt::format("{:<5} | {:>12} {:>12} | {:>6} {:>6} | {:>12} {:>8} | {:>10} {:>10}\n", "dtype", "one device",
                       "replicas", "ratio", "goal", "no overlap", "overlap", "RSS one", "RSS repl.");
    out.flush();
  }
  for (const std::string& dtype : o.dtypes) {
    out.flush();
    ASPEN_ASSIGN_OR_RETURN(Row one, in_child(dtype + " on one device", [&] { return measure_model(s, dtype, o, 1); }));
    ASPEN_ASSIGN_OR_RETURN(Row dp, in_child(dtype + " on " + std::to_string(o.replicas) + " replicas",
                                            [&] { return measure_model(s, dtype, o, o.replicas); }));
    // The same replicas with the gradient exchange after the backward pass (parallel.overlap: false).
    ASPEN_ASSIGN_OR_RETURN(Row after, in_child(dtype + " on " + std::to_string(o.replicas) + " replicas, no overlap",
                                               [&] { return measure_model(s, dtype, o, o.replicas, false); }));
    const double ratio = dp.tokens_per_s / one.tokens_per_s, gain = dp.tokens_per_s / after.tokens_per_s;
    if (o.json) {
      nlohmann::ordered_json j = {{"bench", "train_replicas"},
                                  {"dtype", dtype},
                                  {"replicas", o.replicas},
                                  {"threads_one_device", o.threads},
                                  {"tokens_per_s", dp.tokens_per_s},
                                  {"one_device_tokens_per_s", one.tokens_per_s},
                                  {"ratio", ratio},
                                  {"goal_ratio", kGoal},
                                  {"no_overlap_tokens_per_s", after.tokens_per_s},
                                  {"overlap_gain", gain},
                                  {"peak_rss_bytes", dp.peak_rss_bytes},
                                  {"one_device_peak_rss_bytes", one.peak_rss_bytes},
                                  {"loss", dp.loss},
                                  {"one_device_loss", one.loss}};
      out << j.dump() << "\n";
    } else {
      out << fmt::format("{:<5} | {:>12.1f} {:>12.1f} | {:>6.2f} {:>6} | {:>12.1f} {:>7.2f}x | {:>10} {:>10}\n", dtype,
                         one.tokens_per_s, dp.tokens_per_s, ratio, fmt::format(">={:.2f}", kGoal), after.tokens_per_s,
                         gain, gib(one.peak_rss_bytes), gib(dp.peak_rss_bytes));
    }
  }
  return Status();
}

}  // namespace

Status run_train_bench(const TrainBenchOptions& opt, std::ostream& out) {
  for (const std::string& d : opt.dtypes)
    if (d != "f32" && d != "bf16")
      return Status::invalid_argument("bench train: dtype", "f32 or bf16 (the matmuls' compute type)", d);
  if (opt.threads < 1) return Status::invalid_argument("bench train: threads", ">= 1", std::to_string(opt.threads));
  TrainBenchOptions o = opt;
  if (o.quick) o.steps = 1;
  if (o.steps < 1) return Status::invalid_argument("bench train: steps", ">= 1", std::to_string(o.steps));
  if (o.family != "gpt2" && o.family != "llama" && o.family != "bert")
    return Status::invalid_argument("bench train: family", "gpt2, llama or bert", o.family);
  const bool bert = o.family == "bert";
  if (!o.attention.empty() && !bert)
    return Status::invalid_argument("bench train: attention", "a layout for --family bert", o.attention);
  if (bert && (!o.model.empty() || o.replicas > 1 || o.documents > 0))
    return Status::invalid_argument("bench train --family bert", "one device, the MiniLM shape (no --model, "
                                    "--replicas or --documents)", "one of them");
  TrainShape s = bench_shape(o.quick, o.family);
  if (!o.attention.empty() && o.attention != "dense") {
    ASPEN_ASSIGN_OR_RETURN(const kernels::SparsityConfig::Kind kind, kernels::parse_sparsity_kind(o.attention));
    kernels::SparsityConfig c = kernels::SparsityConfig::of(kind, s.n_head());
    c.block = o.block > 0 ? o.block : o.quick ? 32 : 64;
    c.attention = kernels::SparsityConfig::Attention::bidirectional;
    c.seed = 1;
    s.model.sparse_attention = c;
  }
  const std::optional<kernels::SparsityConfig>& sparse = s.model.sparse_attention;
  const std::string layout_name = sparse ? kernels::sparsity_kind_name(sparse->kind) : "dense";
  if (!o.model.empty()) {
    ASPEN_ASSIGN_OR_RETURN(const models::ModelConfig c, models::load_config(o.model + "/config.json"));
    if (!c.gpt2() && !c.llama())
      return Status::invalid_argument("bench train --model " + o.model,
                                      "a GPT-2 or Llama-family directory (model_type gpt2, llama, mistral, qwen2)",
                                      "model_type " + c.model_type);
    s.model = c;
    s.seq = std::min<int64_t>(o.quick ? 32 : 256, s.n_positions());
    s.model_dir = o.model;
  }
  if (o.batch > 0) s.batch = o.batch;
  if (bert && o.seq > 0) s.seq = o.seq;
  if (models::BertConfig* b = std::get_if<models::BertConfig>(&s.model.family)) {
    b->max_positions = std::max(b->max_positions, s.seq);  // grown, as aspen train's model.max_positions
    // aspen train's data.max_predictions: 15 % of seq plus six standard deviations (--predictions N instead)
    s.predictions = o.predictions < 0 ? models::default_mlm_predictions(s.seq, 0.15)
                    : o.predictions >= s.seq ? 0
                                             : o.predictions;
  }
  if (o.seq > 0 && !bert) {
    if (o.seq > s.n_positions())
      return Status::invalid_argument("bench train: seq", "at most the model's " + std::to_string(s.n_positions()) +
                                                              " positions", std::to_string(o.seq));
    s.seq = o.seq;
  }
  if (o.replicas > 1) return run_replicas_bench(s, o, out);
  ASPEN_ASSIGN_OR_RETURN(const std::optional<kernels::BlockLayout> layout,
                         models::model_layout(s.model, s.seq, "bench train"));
  if (layout) s.density = layout->density();
  if (o.documents > 0) return run_packing_bench(s, o, out);
  const double fpt = flops_per_token(s);
  const bool peer = !o.python.empty() && o.python != "none";

  // Issue W1.4's goals: aspen / PyTorch.
  const std::map<std::string, double> speed_goal = {{"f32", 1.6}, {"bf16", 2.2}};
  constexpr double kRssGoal = 0.8;

  if (!o.json) {
    out << fmt::format(
        "# {} {}: {} layers, d_model {}, vocab {}; batch {} x seq {}, AdamW, {} threads; median of {} steps after "
        "1 warm-up, each dtype in its own process\n",
        bert ? "BERT masked LM" : s.model.llama() ? "Llama" : "GPT-2",
        !s.model_dir.empty() ? s.model_dir
        : o.quick            ? "tiny (--quick)"
        : bert ? "all-MiniLM-L6-v2's shape, " + (sparse ? fmt::format("{} layout (blocks of {})", layout_name,
                                                                               sparse->block)
                                                         : std::string("dense attention"))
               : "124M",
        s.n_layer(), s.d_model(), s.vocab(), s.batch, s.seq, o.threads, o.steps);
    out << fmt::format(
        "# FLOPs per token: {:.1f} M = 6 x {:.2f} M matmul parameters (tied lm_head included) + {:.1f} M attention "
        "(QK^T and AV, fwd + bwd, {})\n",
        fpt / 1e6, double(matmul_parameters(s)) / 1e6, attention_flops_per_token(s) / 1e6,
        bert ? fmt::format("bidirectional, the {:.1f} % of blocks the layout visits; the MLM head on {}", 100 * s.density,
                           s.predictions > 0 ? fmt::format("{} predicted rows per example", s.predictions)
                                             : std::string("every position"))
             : std::string("causal counted in full"));
    if (sparse)
      out << "# each dtype also runs aspen's dense attention (the same model), for the layout's speedup\n";
    if (bert && peer) out << "# PyTorch: transformers' BertForMaskedLM, dense SDPA (no sparse training path)\n";
    if (!peer) out << "# PyTorch peer: not run (--python PATH names an interpreter with torch and transformers)\n";
    out.flush();
  }

  std::vector<Row> rows;
  std::vector<std::string> notes;
  std::map<std::string, double> dense_tokens_per_s;  // bert with a layout: the same model dense, per dtype
  for (const std::string& dtype : o.dtypes) {
    out.flush();  // the child must not inherit unwritten output
    ASPEN_ASSIGN_OR_RETURN(Row r, in_child(dtype, [&] { return measure(s, dtype, o); }));
    if (r.disturbed()) {  // NOTE [guarded rows]: measured again once, then flagged
      out.flush();
      ASPEN_ASSIGN_OR_RETURN(r, in_child(dtype, [&] { return measure(s, dtype, o); }));
      r.attempts = 2;
    }
    if (sparse) {
      TrainShape dense = s;
      dense.model.sparse_attention.reset();
      dense.density = 1.0;
      out.flush();
      ASPEN_ASSIGN_OR_RETURN(Row d, in_child(dtype + " dense", [&] { return measure(dense, dtype, o); }));
      dense_tokens_per_s[dtype] = d.tokens_per_s;
    }
    if (peer) {
      std::string note = run_peer(s, o, r);
      if (!note.empty()) notes.push_back(std::move(note));
    }
    rows.push_back(std::move(r));
  }

  auto mfu = [&](double tokens_per_s, double peak_gflops) {
    return peak_gflops > 0 ? tokens_per_s * fpt / (peak_gflops * 1e9) : 0.0;
  };
  if (!o.json)
    out << fmt::format("{:<5} | {:>9} {:>6} {:>8} | {:>9} {:>6} | {:>6} {:>6} | {:>10} {:>10} {:>10} {:>6} {:>6}\n",
                       "dtype", "tokens/s", "MFU", "peak GF", "pytorch", "MFU", "ratio", "goal", "planned", "peak RSS",
                       "pytorch", "ratio", "goal");
  for (const Row& r : rows) {
    const double m = mfu(r.tokens_per_s, r.peak_gflops);
    const bool has_peer = r.peer_tokens_per_s > 0;
    const double speed_ratio = has_peer ? r.tokens_per_s / r.peer_tokens_per_s : 0;
    const double rss_ratio = r.peer_peak_rss_bytes > 0 ? double(r.peak_rss_bytes) / double(r.peer_peak_rss_bytes) : 0;
    if (o.json) {
      nlohmann::ordered_json j = {{"bench", "train"},
                                  {"dtype", r.dtype},
                                  {"tokens_per_s", r.tokens_per_s},
                                  {"mfu", m},
                                  {"peak_rss_bytes", r.peak_rss_bytes},
                                  {"planned_peak_bytes", r.planned_peak_bytes},
                                  {"tokens_per_s_best", r.tokens_per_s_best},
                                  {"step_s", r.step_s},
                                  {"peak_gflops", r.peak_gflops},
                                  {"peak_kind", r.peak_kind},
                                  {"flops_per_token", fpt},
                                  {"threads", o.threads},
                                  {"batch", s.batch},
                                  {"seq", s.seq},
                                  {"compile_s", r.compile_s},
                                  {"loss", r.loss},
                                  {"reference_instructions", r.reference_instructions},
                                  {"measurement_fault", m > 1.0}};
      if (bert) {
        j["family"] = "bert";
        j["attention"] = layout_name;
      }
      if (dense_tokens_per_s.count(r.dtype)) {
        j["dense_tokens_per_s"] = dense_tokens_per_s.at(r.dtype);
        j["speedup_vs_dense"] = r.tokens_per_s / dense_tokens_per_s.at(r.dtype);
      }
      if (has_peer) {
        j["pytorch_tokens_per_s"] = r.peer_tokens_per_s;
        j["pytorch_mfu"] = mfu(r.peer_tokens_per_s, r.peak_gflops);
        j["pytorch_mode"] = r.peer_mode;
        j["ratio_vs_pytorch"] = speed_ratio;
        // W2.2's row names for the same figures (the peer is PyTorch's faster mode).
        j["peer_tokens_per_s"] = r.peer_tokens_per_s;
        j["peer_mode"] = r.peer_mode;
        j["ratio"] = speed_ratio;
        if (!bert) j["goal_ratio_vs_pytorch"] = speed_goal.at(r.dtype);
      }
      if (rss_ratio > 0) {
        j["pytorch_peak_rss_bytes"] = r.peer_peak_rss_bytes;
        j["rss_ratio_vs_pytorch"] = rss_ratio;
        j["goal_rss_ratio_vs_pytorch"] = kRssGoal;
      }
      j["peak_gflops_before"] = r.peak_before;
      j["peak_gflops_after"] = r.peak_after;
      j["attempts"] = r.attempts;
      if (r.disturbed()) j["disturbed"] = true;
      out << j.dump() << "\n";
    } else {
      auto or_dash = [](bool has, const std::string& s_) { return has ? s_ : std::string("-"); };
      out << fmt::format(
          "{:<5} | {:>9.1f} {:>5.1f}% {:>8.0f} | {:>9} {:>6} | {:>6} {:>6} | {:>10} {:>10} {:>10} {:>6} {:>6}\n",
          r.dtype, r.tokens_per_s, 100 * m, r.peak_gflops,
          or_dash(has_peer, fmt::format("{:.1f}", r.peer_tokens_per_s)),
          or_dash(has_peer, fmt::format("{:.1f}%", 100 * mfu(r.peer_tokens_per_s, r.peak_gflops))),
          or_dash(has_peer, fmt::format("{:.2f}", speed_ratio)),
          bert ? std::string("-") : fmt::format(">={:.1f}", speed_goal.at(r.dtype)),
          gib(r.planned_peak_bytes), gib(r.peak_rss_bytes), or_dash(rss_ratio > 0, gib(r.peer_peak_rss_bytes)),
          or_dash(rss_ratio > 0, fmt::format("{:.2f}", rss_ratio)), fmt::format("<={:.1f}", kRssGoal));
      if (m > 1.0) out << "# " << r.dtype << ": MFU above 1: a measurement fault (the peak was measured slow)\n";
      if (r.disturbed())
        out << fmt::format("# {}: DISTURBED: the peak moved {:.0f} -> {:.0f} GFLOP/s during the steps (twice)\n",
                           r.dtype, r.peak_before, r.peak_after);
      if (dense_tokens_per_s.count(r.dtype))
        out << fmt::format("# {}: the {} layout trains {:.2f}x as many tokens/s as aspen's dense attention ({:.1f})\n",
                           r.dtype, layout_name, r.tokens_per_s / dense_tokens_per_s.at(r.dtype),
                           dense_tokens_per_s.at(r.dtype));
    }
  }
  if (!o.json) {
    for (const Row& r : rows) {
      out << fmt::format(
          "# {}: step {:.3f} s median, {:.3f} s best; compile {:.1f} s; loss {:.3f}; planned = arena {} + state {} "
          "(weights, AdamW moments); {} instructions, {} on reference kernels{}\n",
          r.dtype, r.step_s, r.best_step_s, r.compile_s, r.loss, gib(r.arena_bytes), gib(r.state_bytes), r.instructions,
          r.reference_instructions, r.peer_mode.empty() ? "" : "; PyTorch: " + r.peer_mode);
      if (!r.profile.empty()) out << "# " << r.dtype << ": every instruction of the timed steps\n" << r.profile;
    }
    for (const std::string& n : notes) out << "# " << n << "\n";
  }
  return Status();
}

}  // namespace aspen::bench
