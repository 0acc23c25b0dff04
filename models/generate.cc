#include "models/generate.h"

#include <algorithm>
#include <cstring>

#include "compiler/executable.h"
#include "graph/builder.h"
#include "kernels/matmul.h"
#include "models/causal_lm.h"
#include "models/tensor_parallel.h"
#include "models/weights.h"

namespace aspen::models {

using graph::Builder;
using graph::OpKind;
using graph::ValueId;

namespace {

// The family's causal-LM graph for [batch, seq] with the cache, then the
// sampler on its last logits: output "next" i32 [batch].
// (Generator::open has checked that the config is a causal LM.)
Status build_step(graph::Graph& g, const ModelConfig& config, const CausalLmOptions& o) {
  Builder b(g);
  ASPEN_RETURN_IF_ERROR(build_causal_lm(b, config, o));
  const ValueId logits = *g.find_output("logits");
  const Shape ls = g.type(logits).shape;  // [B, 1, V]
  const ValueId flat = b.reshape(logits, {ls[0], ls[2]});
  const int64_t B = o.batch;
  ValueId next = b.op1(OpKind::sample,
                       {flat, b.input("temperature", DType::f32, Shape{B}), b.input("top_k", DType::i32, Shape{B}),
                        b.input("top_p", DType::f32, Shape{B}), b.input("repetition_penalty", DType::f32, Shape{B}),
                        b.input("seed", DType::i64, Shape{}), b.input("step", DType::i64, Shape{}),
                        b.input("history", DType::i32, Shape{B, o.kv_cache_len})});
  b.output("next", next);
  g.remove_output("logits");  // the host reads the drawn ids only
  return b.status();
}

template <class T>
Tensor filled(DType dtype, Shape s, T value) {
  Tensor t(dtype, s);
  std::fill_n(static_cast<T*>(t.raw()), s.numel(), value);
  return t;
}

}  // namespace

double inference_bytes_per_parameter(DType weights) {
  // bf16 weights widen to an f32 copy where the CPU has no bf16 kernels, and the programs keep packed copies of
  // their fixed matrices (NOTE [packed gemv] in kernels/gemv.cc, NOTE [fixed b] in kernels/matmul_aspen.cc).
  if (weights != DType::bf16) return 4.0;
  return kernels::bf16_matmul_widens() ? 8.0 : 4.0;
}

Result<std::unique_ptr<Generator>> Generator::open(const std::string& dir, const GeneratorOptions& options) {
  ASPEN_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  ASPEN_RETURN_IF_ERROR(check_fits_memory(ckpt.config().path, min_parameter_count(ckpt.config()),
                                          inference_bytes_per_parameter(options.weights), "its weights"));
  std::unique_ptr<Generator> gen(new Generator());
  gen->config_ = ckpt.config();
  if (!gen->config_.causal_lm())
    return Status::invalid_argument(gen->config_.path + ": model_type",
                                    "a causal language model (gpt2, gptj, llama, mistral, qwen2)",
                                    "'" + gen->config_.model_type + "'");
  gen->vocab_ = gen->config_.vocab();
  gen->n_positions_ = gen->config_.n_positions();
  if (const LlamaConfig* l = gen->config_.llama()) gen->window_ = l->sliding_window;
  GeneratorOptions o = options;
  if (o.max_length == 0) o.max_length = gen->n_positions_;
  if (o.max_prompt == 0) o.max_prompt = std::max<int64_t>(1, o.max_length / 2);
  if (o.max_batch < 1)
    return Status::invalid_argument("generator: max_batch", "a number > 0", std::to_string(o.max_batch));
  if (o.max_length < 2 || o.max_length > gen->n_positions_)
    return Status::invalid_argument("generator: max_length",
                                    "a number in [2, n_positions = " + std::to_string(gen->n_positions_) + "]",
                                    std::to_string(o.max_length));
  if (o.max_prompt < 1 || o.max_prompt >= o.max_length)
    return Status::invalid_argument("generator: max_prompt",
                                    "a number in [1, max_length - 1 = " + std::to_string(o.max_length - 1) + "]",
                                    std::to_string(o.max_prompt));
  gen->options_ = o;

  const int T = int(o.tensor_parallel);
  if (T < 1) return Status::invalid_argument("generator: tensor_parallel", ">= 1", std::to_string(T));
  // NOTE [model layouts]: a model trained with a sparse layout generates through it: the layout covering the
  // cache, looked up by each row's positions (a left-padded row's cache slot is not its position).
  std::optional<kernels::BlockLayout> layout;
  if (const auto& sparse = gen->config_.sparse_attention) {
    const int64_t covered = (o.max_length + sparse->block - 1) / sparse->block * sparse->block;
    ASPEN_ASSIGN_OR_RETURN(layout, model_layout(gen->config_, covered, "generator"));
  }
  // NOTE [quantized linears]: a GGUF file's Q8_0 / Q4_0 / Q4_K matrices stay in their blocks.
  ASPEN_ASSIGN_OR_RETURN(const QuantizedWeights quantized, gguf_quantized_weights(ckpt));
  if (!quantized.format.empty() && T > 1)
    return Status::unimplemented("generator: tensor_parallel " + std::to_string(T),
                                 "tensor shards of quantized (GGUF) weights");
  std::vector<std::unique_ptr<compiler::Executable>> programs;
  graph::Graph prefill;
  for (int64_t seq : {o.max_prompt, int64_t(1)}) {
    graph::Graph g;
    CausalLmOptions lm{.batch = o.max_batch, .seq = seq, .layout = layout ? &*layout : nullptr,
                       .kv_cache_len = o.max_length, .last_logits_only = true,
                       .tensor_parallel = T, .vocab_parallel = o.vocab_parallel};
    if (o.weights != DType::f32) lm.weight_dtype = o.weights;
    if (!quantized.format.empty()) lm.quantized = &quantized;
    ASPEN_RETURN_IF_ERROR(build_step(g, gen->config_, lm));
    compiler::CompileOptions co = o.compile;
    co.hoist_weights = true;  // weights change only through the session: their casts are made once
    ASPEN_ASSIGN_OR_RETURN(auto exe, compiler::compile(g, co));
    programs.push_back(std::move(exe));
    if (seq == o.max_prompt && programs.size() == 1 && T == 1) prefill = std::move(g);
  }
  if (T > 1) {  // the whole model's prefill plans the (whole) checkpoint tensors
    CausalLmOptions lm{.batch = o.max_batch, .seq = o.max_prompt, .layout = layout ? &*layout : nullptr,
                       .kv_cache_len = o.max_length, .last_logits_only = true};
    if (o.weights != DType::f32) lm.weight_dtype = o.weights;
    ASPEN_RETURN_IF_ERROR(build_step(prefill, gen->config_, lm));
  }
  runtime::SessionOptions so;
  so.threads = o.threads;
  so.trace = o.trace;
  so.replicas = T;
  if (T > 1) so.replica_local = {""};  // each shard its own weights and KV cache
  ASPEN_ASSIGN_OR_RETURN(gen->session_, runtime::Session::create(std::move(programs), so));
  runtime::Session& s = *gen->session_;
  if (T > 1) {
    ASPEN_ASSIGN_OR_RETURN(gen->tensor_comms_, parallel::make_threads_group(T, {.name = "tensor"}));
    for (int r = 0; r < T; ++r) ASPEN_RETURN_IF_ERROR(s.set_communicator(r, "tensor", gen->tensor_comms_[size_t(r)].get()));
  }
  ASPEN_ASSIGN_OR_RETURN(WeightPlan plan, plan_weights(prefill, ckpt));
  const bool vp = T > 1 && o.vocab_parallel;
  ASPEN_RETURN_IF_ERROR(load_weights(plan, [&s, T, vp](const std::string& name, const Tensor& t) -> Status {
    if (T == 1) return s.set_parameter(name, t);
    for (int r = 0; r < T; ++r) {  // shard r's part of the whole tensor
      ASPEN_ASSIGN_OR_RETURN(Tensor part, shard_weight(name, t, r, T, vp));
      Tensor* dst = s.parameter_of(r, name);
      if (!dst) return Status::error(Code::kNotFound, "parameter '" + name + "'", "a parameter of the program", "none");
      if (dst->shape() != part.shape() || dst->dtype() != part.dtype())
        return Status::invalid_argument("parameter '" + name + "' (shard " + std::to_string(r) + ")",
                                        dst->shape().to_string(), part.shape().to_string());
      if (part.nbytes()) std::memcpy(dst->raw(), part.raw(), part.nbytes());
    }
    return Status();
  }, [&s, T](const std::string& name) { return T == 1 ? s.parameter_of(0, name) : nullptr; }));
  if (vp)  // each shard's first row of the vocabulary
    for (int r = 0; r < T; ++r) {
      Tensor* off = s.parameter_of(r, kVocabOffsetName);
      const Tensor* wte = nullptr;
      for (const char* table : kVocabTableNames)
        if (!wte) wte = s.parameter_of(r, table);
      if (!off || !wte)
        return Status::error(Code::kInternal, "generator: vocab-parallel shard " + std::to_string(r),
                             "its offset and embedding table", "a program without them");
      off->data<int32_t>()[0] = int32_t(r * wte->shape()[0]);
    }
  return gen;
}

Result<std::map<std::string, Tensor>> Generator::run_shards(const std::map<std::string, const Tensor*>& in,
                                                            int program) {
  const int T = session_->replicas();
  if (T == 1) return session_->run(in, {}, program);
  // Every shard takes the same inputs ([T, ...]); they agree on the outputs (the
  // hidden states are all-reduced, the LM head whole): shard 0's come back.
  std::map<std::string, Tensor> stacked;
  std::map<std::string, const Tensor*> feeds;
  for (const auto& [name, t] : in) {
    std::vector<int64_t> d = {T};
    d.insert(d.end(), t->shape().begin(), t->shape().end());
    ASPEN_ASSIGN_OR_RETURN(Tensor st, Tensor::make(t->dtype(), Shape::make(d.data(), int(d.size())).value()));
    for (int r = 0; r < T; ++r)
      if (t->nbytes()) std::memcpy(static_cast<char*>(st.raw()) + size_t(r) * t->nbytes(), t->raw(), t->nbytes());
    feeds.emplace(name, &stacked.emplace(name, std::move(st)).first->second);
  }
  ASPEN_ASSIGN_OR_RETURN(auto out, session_->run(feeds, {}, program));
  std::map<std::string, Tensor> first;
  for (auto& [name, t] : out) {
    const Shape& s = t.shape();
    ASPEN_ASSIGN_OR_RETURN(Tensor one, Tensor::make(t.dtype(), Shape::make(s.begin() + 1, s.rank() - 1).value()));
    if (one.nbytes()) std::memcpy(one.raw(), t.raw(), one.nbytes());
    first.emplace(name, std::move(one));
  }
  return first;
}

Result<std::vector<std::vector<int32_t>>> Generator::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                              const SamplingOptions& sp) {
  const int64_t B = options_.max_batch, P = options_.max_prompt, L = options_.max_length;
  const int64_t n = int64_t(prompts.size());
  if (n < 1 || n > B)
    return Status::invalid_argument("generate: prompts", "1 to max_batch = " + std::to_string(B), std::to_string(n));
  for (int64_t r = 0; r < n; ++r) {
    const auto& p = prompts[size_t(r)];
    const std::string what = "generate: prompt " + std::to_string(r);
    if (p.empty()) return Status::invalid_argument(what, "at least one token", "none");
    if (int64_t(p.size()) > P)
      return Status::invalid_argument(what, "at most max_prompt = " + std::to_string(P) + " tokens",
                                      std::to_string(p.size()) + " tokens");
    for (int32_t id : p)
      if (id < 0 || id >= vocab_)
        return Status::invalid_argument(what, "ids in [0, " + std::to_string(vocab_) + ")", std::to_string(id));
  }
  if (sp.max_new_tokens < 1 || sp.max_new_tokens > L - P + 1)
    return Status::invalid_argument("generate: max_new_tokens",
                                    "a number in [1, max_length - max_prompt + 1 = " + std::to_string(L - P + 1) + "]",
                                    std::to_string(sp.max_new_tokens));
  if (!(sp.temperature >= 0.0f))
    return Status::invalid_argument("generate: temperature", ">= 0 (0: greedy)", std::to_string(sp.temperature));
  if (sp.top_k < 0) return Status::invalid_argument("generate: top_k", ">= 0 (0: off)", std::to_string(sp.top_k));
  if (!(sp.top_p > 0.0f && sp.top_p <= 1.0f))
    return Status::invalid_argument("generate: top_p", "in (0, 1] (1: off)", std::to_string(sp.top_p));
  if (!(sp.repetition_penalty > 0.0f))
    return Status::invalid_argument("generate: repetition_penalty", "> 0 (1: off)",
                                    std::to_string(sp.repetition_penalty));

  // Left padding to P; rows past the prompts carry one token (never returned).
  Tensor ids = filled<int32_t>(DType::i32, Shape{B, P}, 0);
  Tensor positions = filled<int32_t>(DType::i32, Shape{B, P}, 0);
  Tensor key_valid = filled<uint8_t>(DType::u8, Shape{B, L}, 0);
  Tensor history = filled<int32_t>(DType::i32, Shape{B, L}, -1);
  Tensor key_positions(DType::i32, Shape{B, L});  // a sparse layout's lookup: slot j of row r is position j - pad
  std::vector<int32_t> next_position(static_cast<size_t>(B)), history_len(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r) {
    static const std::vector<int32_t> kFiller = {0};
    const auto& p = r < n ? prompts[size_t(r)] : kFiller;
    const int64_t len = int64_t(p.size()), pad = P - len;
    for (int64_t t = 0; t < len; ++t) {
      ids.data<int32_t>()[r * P + pad + t] = p[size_t(t)];
      positions.data<int32_t>()[r * P + pad + t] = int32_t(t);
      key_valid.data<uint8_t>()[r * L + pad + t] = 1;
      history.data<int32_t>()[r * L + t] = p[size_t(t)];
    }
    next_position[size_t(r)] = int32_t(len);
    history_len[size_t(r)] = int32_t(len);
    for (int64_t j = 0; j < L; ++j) key_positions.data<int32_t>()[r * L + j] = int32_t(j - pad);
  }
  Tensor temperature = filled<float>(DType::f32, Shape{B}, sp.temperature);
  Tensor top_k = filled<int32_t>(DType::i32, Shape{B}, sp.top_k);
  Tensor top_p = filled<float>(DType::f32, Shape{B}, sp.top_p);
  Tensor penalty = filled<float>(DType::f32, Shape{B}, sp.repetition_penalty);
  Tensor seed = filled<int64_t>(DType::i64, Shape{}, int64_t(sp.seed));
  Tensor step = filled<int64_t>(DType::i64, Shape{}, 0);
  Tensor index = filled<int32_t>(DType::i32, Shape{}, 0);
  std::map<std::string, const Tensor*> in = {
      {"input_ids", &ids},     {"positions", &positions}, {"cache_index", &index},
      {"key_valid", &key_valid}, {"history", &history},   {"temperature", &temperature},
      {"top_k", &top_k},       {"top_p", &top_p},         {"repetition_penalty", &penalty},
      {"seed", &seed},         {"step", &step}};
  if (config_.sparse_attention) in.emplace("key_positions", &key_positions);  // the programs read it
  ASPEN_ASSIGN_OR_RETURN(auto out, run_shards(in, /*program=*/0));

  int64_t forgotten = 0;  // cache slots below this fell out of the sliding window
  std::vector<std::vector<int32_t>> result(static_cast<size_t>(n));
  std::vector<char> done(static_cast<size_t>(n), 0);
  Tensor ids1(DType::i32, Shape{B, 1}), positions1(DType::i32, Shape{B, 1});
  in["input_ids"] = &ids1;
  in["positions"] = &positions1;
  for (int64_t t = 0;; ++t) {
    const int32_t* next = out.at("next").data<int32_t>();
    bool keep_going = true, all_done = true;
    for (int64_t r = 0; r < n; ++r) {
      if (done[size_t(r)]) continue;
      const int32_t token = next[r];
      result[size_t(r)].push_back(token);
      if (sp.on_token && !sp.on_token(r, token)) keep_going = false;
      const bool stop = std::find(sp.stop_tokens.begin(), sp.stop_tokens.end(), token) != sp.stop_tokens.end();
      if (stop || int64_t(result[size_t(r)].size()) >= sp.max_new_tokens) done[size_t(r)] = 1;
      all_done = all_done && done[size_t(r)];
    }
    if (all_done || !keep_going) break;
    // The drawn tokens go in at cache index P + t, one position past each row's last.
    for (int64_t r = 0; r < B; ++r) {
      ids1.data<int32_t>()[r] = next[r];
      positions1.data<int32_t>()[r] = next_position[size_t(r)]++;
      key_valid.data<uint8_t>()[r * L + P + t] = 1;
      history.data<int32_t>()[r * L + history_len[size_t(r)]++] = next[r];
    }
    // A sliding window (Mistral): the decoding query at slot P + t sees slots (P + t - window, P + t]
    // only; the prefill's local mask did the same for the prompt.
    for (; window_ > 0 && forgotten <= P + t - window_; ++forgotten)
      for (int64_t r = 0; r < B; ++r) key_valid.data<uint8_t>()[r * L + forgotten] = 0;
    index.data<int32_t>()[0] = int32_t(P + t);
    step.data<int64_t>()[0] = t + 1;
    ASPEN_ASSIGN_OR_RETURN(out, run_shards(in, /*program=*/1));
  }
  return result;
}

}  // namespace aspen::models
