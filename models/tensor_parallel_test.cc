// Tensor parallel: a GPT-2 cut over 2 shards (two devices of one session, a
// threads group "tensor") computes the logits and loss of the whole model;
// shard and gather are inverse; sizes that do not divide are refused.
#include "models/tensor_parallel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "compiler/executable.h"
#include "core/philox.h"
#include "graph/builder.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/weights.h"
#include "parallel/threads/threads_communicator.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

Gpt2Config config() {
  return Gpt2Config{.vocab = 37, .n_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 4, .d_ff = 40};
}

graph::Graph gpt2(const Gpt2Config& c, int64_t tp, bool vocab_parallel = false) {
  graph::Graph g;
  graph::Builder b(g);
  auto m = build_gpt2(b, c, {.batch = 2, .seq = 5, .with_loss = true, .tensor_parallel = tp,
                             .vocab_parallel = vocab_parallel});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return g;
}

// A 4-head model of either family with `vocab` classes (GPT-J: rotary over half of each head).
ModelConfig model(const std::string& family, int64_t vocab) {
  ModelConfig mc;
  mc.model_type = family;
  if (family == "gpt2") {
    Gpt2Config c = config();
    c.vocab = vocab;
    mc.family = c;
  } else if (family == "llama") {  // grouped-query attention, every bias (split with its projection or added once)
    mc.family = LlamaConfig{.vocab = vocab, .n_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 4,
                            .n_kv_head = 2, .head_dim = 0, .d_ff = 40, .qkv_bias = true, .o_bias = true,
                            .mlp_bias = true};
  } else {
    mc.family = GptjConfig{.vocab = vocab, .n_positions = 16, .d_model = 32, .n_layer = 2, .n_head = 4,
                           .rotary_dim = 4, .d_ff = 40};
  }
  return mc;
}

graph::Graph causal_lm(const ModelConfig& mc, int64_t tp, bool vocab_parallel) {
  graph::Graph g;
  graph::Builder b(g);
  const CausalLmOptions o{.batch = 2, .seq = 5, .with_loss = true, .tensor_parallel = tp, .vocab_parallel = vocab_parallel};
  const Status s = build_causal_lm(b, mc, o);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return g;
}

// Every parameter of `g`, normal(0, stddev) (biases and norms too, so misplaced ones show).
std::map<std::string, Tensor> random_weights(const graph::Graph& g, uint64_t seed, float stddev) {
  std::map<std::string, Tensor> w;
  uint64_t stream = 0;
  for (int32_t i : g.parameter_nodes()) {
    const graph::Node& n = g.node(i);
    Tensor t(DType::f32, g.type(n.outputs[0]).shape);
    philox_fill_normal(t.span<float>(), seed, stream++, 0, 0.0f, stddev);
    w.emplace(n.name, std::move(t));
  }
  return w;
}

// GPT-2 and GPT-J; also with the vocabulary split (38 = 2 x 19 classes): the
// loss from the shards' partial sums, the logits gathered.
TEST(TensorParallel, TwoShardsComputeTheWholeModel) {
  for (const char* family : {"gpt2", "gptj", "llama"})
  for (bool vp : {false, true}) {
  SCOPED_TRACE(std::string(family) + (vp ? ", vocab parallel" : ", vocabulary whole on each shard"));
  const ModelConfig mc = model(family, vp ? 38 : 37);
  const int64_t vocab = vp ? 38 : 37;
  const graph::Graph whole = causal_lm(mc, 1, false), shard = causal_lm(mc, 2, vp);
  EXPECT_EQ(is_vocab_parallel(shard), vp);
  const std::map<std::string, Tensor> w = random_weights(whole, 5, 0.2f);
  Tensor ids(DType::i32, {2, 5}), pos(DType::i32, {2, 5}), tgt(DType::i32, {10});
  for (int i = 0; i < 10; ++i) {
    ids.data<int32_t>()[i] = int32_t((7 * i + 3) % vocab);
    pos.data<int32_t>()[i] = i % 5;
    tgt.data<int32_t>()[i] = int32_t((5 * i + 1) % vocab);
  }
  std::map<std::string, Tensor> want;
  {
    auto s = runtime::Session::create(compiler::compile(whole).value(), {.threads = 1});
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    for (const auto& [name, t] : w) ASSERT_TRUE((*s)->set_parameter(name, t).is_ok()) << name;
    auto out = (*s)->run({{"input_ids", &ids}, {"positions", &pos}, {"targets", &tgt}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    want = std::move(out).value();
  }
  auto exe = compiler::compile(shard);
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto s = runtime::Session::create(std::move(exe).value(), {.threads = 1, .replicas = 2, .replica_local = {""}});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto comms = parallel::make_threads_group(2).value();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE((*s)->set_communicator(r, "tensor", comms[size_t(r)].get()).is_ok());
    for (const compiler::Binding& p : (*s)->parameters()) {
      if (p.name == kVocabOffsetName) {  // the shard's first class
        (*s)->parameter_of(r, p.name)->data<int32_t>()[0] = int32_t(r * vocab / 2);
        continue;
      }
      auto part = shard_weight(p.name, w.at(p.name), r, 2, vp);
      ASSERT_TRUE(part.is_ok()) << part.status().to_string();
      Tensor* dst = (*s)->parameter_of(r, p.name);
      ASSERT_EQ(dst->shape(), part->shape()) << p.name;
      std::memcpy(dst->raw(), part->raw(), part->nbytes());
    }
  }
  auto stack = [](const Tensor& t) {  // the same input for both shards: [2, ...]
    std::vector<int64_t> d = {2};
    d.insert(d.end(), t.shape().begin(), t.shape().end());
    Tensor out(t.dtype(), Shape::make(d.data(), int(d.size())).value());
    std::memcpy(out.raw(), t.raw(), t.nbytes());
    std::memcpy(static_cast<char*>(out.raw()) + t.nbytes(), t.raw(), t.nbytes());
    return out;
  };
  const Tensor ids2 = stack(ids), pos2 = stack(pos), tgt2 = stack(tgt);
  auto got = (*s)->run({{"input_ids", &ids2}, {"positions", &pos2}, {"targets", &tgt2}});
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const Tensor& logits = got->at("logits");
  const int64_t n = want.at("logits").numel();
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float a = logits.data<float>()[r * n + i], e = want.at("logits").data<float>()[i];
      ASSERT_NEAR(a, e, 1e-5f * (1.0f + std::abs(e))) << "shard " << r << " logit " << i;
    }
    EXPECT_NEAR(got->at("loss").data<float>()[r], want.at("loss").data<float>()[0], 1e-5f) << "shard " << r;
  }
  }
}

TEST(TensorParallel, ShardThenGatherIsTheIdentity) {
  const Gpt2Config c = config();
  const graph::Graph whole = gpt2(c, 1);
  uint64_t stream = 0;
  int sharded = 0;
  for (int32_t i : whole.parameter_nodes()) {
    const graph::Node& n = whole.node(i);
    Tensor t(DType::f32, whole.type(n.outputs[0]).shape);
    philox_fill_normal(t.span<float>(), 9, stream++, 0, 0.0f, 1.0f);
    for (int shards : {2, 4}) {
      std::vector<Tensor> parts;
      for (int r = 0; r < shards; ++r) parts.push_back(shard_weight(n.name, t, r, shards).value());
      std::vector<const Tensor*> ptrs;
      for (const Tensor& p : parts) ptrs.push_back(&p);
      auto back = gather_weight(n.name, ptrs);
      ASSERT_TRUE(back.is_ok()) << back.status().to_string();
      ASSERT_EQ(back->shape(), t.shape()) << n.name;
      EXPECT_EQ(0, std::memcmp(back->raw(), t.raw(), t.nbytes())) << n.name;
      if (shard_kind(n.name) != ShardKind::replicated) {
        EXPECT_EQ(parts[0].numel() * shards, t.numel()) << n.name;
        sharded += shards == 2;
      }
    }
  }
  EXPECT_EQ(sharded, 2 * 6);  // per layer: c_attn weight and bias, c_proj weight, c_fc weight and bias, mlp c_proj weight
  // GPT-J: q, k, v and out_proj, fc_in's weight and bias, fc_out's weight are cut, and come back whole.
  const graph::Graph j = causal_lm(model("gptj", 37), 1, false);
  int cut = 0;
  for (int32_t i : j.parameter_nodes()) {
    const graph::Node& n = j.node(i);
    Tensor t(DType::f32, j.type(n.outputs[0]).shape);
    philox_fill_normal(t.span<float>(), 10, uint64_t(i), 0, 0.0f, 1.0f);
    std::vector<Tensor> parts;
    for (int r = 0; r < 2; ++r) parts.push_back(shard_weight(n.name, t, r, 2).value());
    const std::vector<const Tensor*> ptrs = {&parts[0], &parts[1]};
    auto back = gather_weight(n.name, ptrs);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(0, std::memcmp(back->raw(), t.raw(), t.nbytes())) << n.name;
    cut += shard_kind(n.name) != ShardKind::replicated;
  }
  EXPECT_EQ(cut, 2 * 7);
  // Vocab parallel: wte's rows, shard r the classes [r·V/T, (r+1)·V/T); a vocabulary that does not divide is refused.
  Tensor wte(DType::f32, {6, 2});
  for (int i = 0; i < 12; ++i) wte.data<float>()[i] = float(i);
  auto rows = shard_weight("transformer.wte.weight", wte, 1, 3, /*vocab_parallel=*/true);
  ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
  EXPECT_EQ(std::vector<float>(rows->data<float>(), rows->data<float>() + 4), (std::vector<float>{4, 5, 6, 7}));
  EXPECT_FALSE(shard_weight("transformer.wte.weight", wte, 1, 4, true).is_ok());
  EXPECT_EQ(shard_kind("optimizer.exp_avg.transformer.wte.weight", true), ShardKind::rows);
  EXPECT_EQ(shard_kind("transformer.wte.weight"), ShardKind::replicated);
  // q | k | v keep their own heads: shard 1 of 2 of c_attn.bias [3C] is q[C/2:C], k[3C/2:2C], v[5C/2:3C].
  Tensor bias(DType::f32, {12});
  for (int i = 0; i < 12; ++i) bias.data<float>()[i] = float(i);
  auto part = shard_weight("transformer.h.0.attn.c_attn.bias", bias, 1, 2).value();
  const std::vector<float> expect = {2, 3, 6, 7, 10, 11};
  EXPECT_EQ(std::vector<float>(part.data<float>(), part.data<float>() + 6), expect);
}

// Generation on 2 shards (each with its heads' KV cache) draws the same tokens
// as one device: greedy and sampled, from a random 4-head GPT-2 written as a
// Hugging Face directory.
TEST(TensorParallel, GenerationOnTwoShardsDrawsTheSameTokens) {
  for (const char* family : {"gpt2", "gptj", "llama"}) {
  SCOPED_TRACE(family);
  const ModelConfig mc = model(family, 38);  // the vocab-parallel runs split it in two
  const graph::Graph whole = causal_lm(mc, 1, false);
  const std::map<std::string, Tensor> w = random_weights(whole, 11, 0.3f);
  const std::string dir = ::testing::TempDir() + "aspen_tp_generate_" + family + std::to_string(getpid());
  ASSERT_TRUE(export_hf_model(dir, mc, w).is_ok());
  const std::vector<std::vector<int32_t>> prompts = {{3, 1, 4, 1, 5}, {9, 2}};
  std::vector<std::vector<int32_t>> got[3];  // one device, 2 shards, 2 shards with the vocabulary split
  {  // a prefill of one position (its program is the decode's shape) opens too
    GeneratorOptions o;
    o.max_length = 3;
    o.max_prompt = 1;
    o.threads = 1;
    o.tensor_parallel = 2;
    auto gen = Generator::open(dir, o);
    ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  }
  for (int run = 0; run < 3; ++run)
    for (float temperature : {0.0f, 0.8f}) {
      GeneratorOptions o;
      o.max_batch = 2;
      o.max_length = 16;
      o.max_prompt = 5;
      o.threads = 1;
      o.tensor_parallel = run == 0 ? 1 : 2;
      o.vocab_parallel = run == 2;
      auto gen = Generator::open(dir, o);
      ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
      SamplingOptions so;
      so.max_new_tokens = 10;
      so.temperature = temperature;
      so.seed = 7;
      auto out = (*gen)->generate(prompts, so);
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      for (const auto& row : *out) got[run].push_back(row);
    }
  ASSERT_EQ(got[0].size(), 4u);  // 2 prompts, greedy and sampled
  for (const auto& row : got[0]) EXPECT_EQ(row.size(), 10u);
  EXPECT_NE(got[0][0], got[0][2]);  // sampling drew other tokens than greedy
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
  std::filesystem::remove_all(dir);
  }
}

TEST(TensorParallel, ShardsThatDoNotDivideAreRefused) {
  graph::Graph g;
  graph::Builder b(g);
  const Gpt2Config c = Gpt2Config::tiny();  // 3 heads, d_ff 22
  auto m = build_gpt2(b, c, {.batch = 1, .seq = 4, .tensor_parallel = 2});
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().message(), "gpt2: tensor_parallel 2: expected a divisor of n_head (3), found 2");
  graph::Graph h;
  graph::Builder hb(h);
  auto v = build_gpt2(hb, config(), {.batch = 1, .seq = 4, .tensor_parallel = 2, .vocab_parallel = true});
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().message(),
            "gpt2: vocab_parallel over 2 shards: expected a vocabulary divisible by 2, found 37 (hint: pad the "
            "vocabulary (model.vocab) or keep it whole on every shard)");
  graph::Graph j;
  graph::Builder jb(j);
  auto gj = build_gptj(jb, GptjConfig::tiny(), {.batch = 1, .seq = 4, .tensor_parallel = 2});  // 3 heads
  ASSERT_FALSE(gj.is_ok());
  EXPECT_EQ(gj.status().message(), "gptj: tensor_parallel 2: expected a divisor of n_head (3), found 2");
  graph::Graph l;
  graph::Builder lb(l);
  auto ll = build_llama(lb, LlamaConfig::tiny(), {.batch = 1, .seq = 4, .tensor_parallel = 4});  // 4 heads, 2 kv
  ASSERT_FALSE(ll.is_ok());
  EXPECT_EQ(ll.status().message(),
            "llama: tensor_parallel: expected a divisor of n_kv_head = 2 (kv heads split), found 4");
}

}  // namespace
}  // namespace aspen::models
