// A llama.cpp GGUF GPT-2 (Q8_0, written by llama.cpp's own converter: scripts/golden/make_gguf_gpt2_testdata.py)
// read as a Checkpoint (NOTE [GGUF models]): its tokenizer gives transformers' ids for the prompt, and its
// logits stay within Q8_0's error of transformers' logits with the original f32 weights (a name or a transpose
// read wrong is far outside it); greedy generation through the file runs; other architectures and damaged
// metadata are refused by name. The same for a Llama (scripts/golden/make_gguf_llama_testdata.py: grouped
// heads, the converter's Q/K row order put back, Llama 3's split and BOS in its tokenizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/executable.h"
#include "io/test_files.h"
#include "graph/builder.h"
#include "models/blocks.h"
#include "models/causal_lm.h"
#include "models/generate.h"
#include "models/perplexity.h"
#include "models/weights.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

const std::string kDir = std::string(ASPEN_MODELS_TESTDATA) + "/gguf";
const std::string kFile = kDir + "/gpt2-64-q8_0.gguf";

nlohmann::json golden() {
  std::ifstream in(kDir + "/gpt2-64.golden.json");
  return nlohmann::json::parse(in);
}

// The last position's logits of `ckpt` for `ids`, dequantized (f32 matrices) and on the blocks themselves
// (matmul_q: `products` of them, activations quantized to Q8_0 as llama.cpp quantizes them: a little more
// error), against transformers with the file's weights as ggml dequantizes them (the same numbers up to f32
// rounding) and with the original f32 weights (Q8_0's error: 3.4 % of the logits' scale at worst in these
// 2-layer models, whose weights were scaled up so the logits spread).
void expect_logits_of_golden(const Checkpoint& ckpt, const QuantizedWeights& quantized,
                             const std::vector<int32_t>& ids, const nlohmann::json& gold, int64_t products) {
  const ModelConfig& c = ckpt.config();
  const int64_t T = int64_t(ids.size());
  for (const bool on_blocks : {false, true}) {
    SCOPED_TRACE(on_blocks ? "matmul_q" : "dequantized");
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build_causal_lm(b, c, {.batch = 1, .seq = T, .quantized = on_blocks ? &quantized : nullptr}).is_ok());
    int64_t found = 0;
    for (const graph::Node& n : g.nodes()) found += n.op == graph::OpKind::matmul_q;
    EXPECT_EQ(found, on_blocks ? products : 0);
    auto exe = compiler::compile(g, {});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    auto session = runtime::Session::create(std::move(exe).value(), {.threads = 1});
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    auto plan = plan_weights(g, ckpt);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    EXPECT_TRUE(plan->unused.empty());
    ASSERT_TRUE(load_weights(*plan, [&](const std::string& name, const Tensor& t) {
                  return (*session)->set_parameter(name, t);
                }).is_ok());
    Tensor in(DType::i32, Shape{1, T}), pos(DType::i32, Shape{1, T});
    for (int64_t t = 0; t < T; ++t) in.data<int32_t>()[t] = ids[size_t(t)], pos.data<int32_t>()[t] = int32_t(t);
    auto res = (*session)->run({{"input_ids", &in}, {"positions", &pos}});
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    const float* got = res->at("logits").data<float>() + (T - 1) * c.vocab();
    for (const auto& [key, tolerance] :
         {std::pair{"dequantized_last_logits", on_blocks ? 0.03 : 1e-4}, std::pair{"last_logits", 0.05}}) {
      const std::vector<double> want = gold[key].get<std::vector<double>>();
      ASSERT_EQ(want.size(), size_t(c.vocab()));
      double worst = 0, scale = 0;
      for (size_t v = 0; v < want.size(); ++v) {
        worst = std::max(worst, std::abs(double(got[v]) - want[v]));
        scale = std::max(scale, std::abs(want[v]));
      }
      EXPECT_LT(worst, tolerance * scale) << key << ": worst " << worst << " of scale " << scale;
      EXPECT_GT(scale, 1.0);
      if (on_blocks) std::printf("matmul_q vs %s: worst %.4f of scale %.3f\n", key, worst, scale);
    }
  }
}

TEST(GgufModels, Gpt2LogitsWithinQ8_0OfTransformers) {
  const nlohmann::json gold = golden();
  auto tok = load_model_tokenizer(kFile);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::vector<int32_t> ids = (*tok)->encode(gold["prompt"].get<std::string>());
  ASSERT_EQ(ids, gold["input_ids"].get<std::vector<int32_t>>());

  auto ckpt = Checkpoint::open(kFile);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const ModelConfig& c = ckpt->config();
  ASSERT_NE(c.gpt2(), nullptr);
  EXPECT_EQ(c.gpt2()->d_model, 64);
  EXPECT_EQ(c.gpt2()->n_layer, 2);
  EXPECT_EQ(c.vocab(), 1000);
  EXPECT_TRUE(c.gpt2()->tie_word_embeddings);  // no output.weight in the file: the head is token_embd
  auto quantized = gguf_quantized_weights(*ckpt);
  ASSERT_TRUE(quantized.is_ok()) << quantized.status().to_string();
  EXPECT_EQ(quantized->format.size(), size_t(4 * 2 + 1));  // every layer's four matrices and the head
  for (const auto& [name, format] : quantized->format) EXPECT_EQ(format, "q8_0") << name;
  expect_logits_of_golden(*ckpt, *quantized, ids, gold, 9);
}

TEST(GgufModels, LlamaLogitsWithinQ8_0OfTransformers) {
  const std::string file = kDir + "/llama-64-q8_0.gguf";
  std::ifstream gin(kDir + "/llama-64.golden.json");
  const nlohmann::json gold = nlohmann::json::parse(gin);
  auto tok = load_model_tokenizer(file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::vector<int32_t> ids = (*tok)->encode(gold["prompt"].get<std::string>());
  ASSERT_EQ(ids, gold["input_ids"].get<std::vector<int32_t>>());  // Llama 3's split, BOS first

  auto ckpt = Checkpoint::open(file);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const ModelConfig& c = ckpt->config();
  ASSERT_NE(c.llama(), nullptr);
  EXPECT_EQ(c.llama()->d_model, 64);
  EXPECT_EQ(c.llama()->n_head, 4);
  EXPECT_EQ(c.llama()->kv_heads(), 2);
  EXPECT_EQ(c.llama()->head_size(), 16);
  EXPECT_FALSE(c.llama()->tie_word_embeddings);
  auto quantized = gguf_quantized_weights(*ckpt);
  ASSERT_TRUE(quantized.is_ok()) << quantized.status().to_string();
  EXPECT_EQ(quantized->format.size(), size_t(7 * 2 + 1));  // every layer's seven matrices and the head
  expect_logits_of_golden(*ckpt, *quantized, ids, gold, 15);
  // Generation through the file runs (tokenizer, config, blocks).
  auto gen = Generator::open(file, {.max_batch = 1, .max_length = 40, .max_prompt = 24, .threads = 1});
  ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  auto out = (*gen)->generate({ids}, {.max_new_tokens = 4, .temperature = 0.0f});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].size(), 4u);
}

TEST(GgufModels, GreedyGenerationThroughTheFile) {
  const nlohmann::json gold = golden();
  auto gen = Generator::open(kFile, {.max_batch = 1, .max_length = 40, .max_prompt = 24, .threads = 1});
  ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  auto out =
      (*gen)->generate({gold["input_ids"].get<std::vector<int32_t>>()}, {.max_new_tokens = 8, .temperature = 0.0f});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].size(), 8u);
  EXPECT_EQ((*out)[0][0], gold["greedy"][0].get<int32_t>());  // the first step: the logits above
}

// Llama 3's rope scaling, which the converter writes as one factor per frequency (rope_freqs), read back into
// transformers' parameters (scripts/golden/make_gguf_llama_testdata.py's: factor 8, low 1, high 8, original 256;
// the logits test above runs with them); factors of another rule are refused by name.
TEST(GgufModels, Llama3RopeScalingIsReadFromItsFactors) {
  const std::string path = kDir + "/llama-64-q8_0.gguf";
  auto ckpt = Checkpoint::open(path);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const LlamaConfig* l = ckpt->config().llama();
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->rope.scaling, "llama3");
  EXPECT_EQ(l->rope.theta, 100.0);
  EXPECT_EQ(l->rope.factor, 8.0);
  EXPECT_EQ(l->rope.low_freq_factor, 1.0);
  EXPECT_EQ(l->rope.high_freq_factor, 8.0);
  EXPECT_EQ(l->rope.original_max_positions, 256);

  std::string bytes = io::test_files::read_bytes(path);
  auto file = io::GgufFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const std::span<const std::byte> factors = file->data(*file->find("rope_freqs.weight"));
  ASSERT_EQ(factors.size(), 8 * sizeof(float));
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(factors.data()), factors.size()));
  ASSERT_NE(at, std::string::npos);
  const float bent = 2.5f;  // frequency 4's factor (between 1 and 8), off the rule
  std::memcpy(bytes.data() + at + 4 * sizeof(float), &bent, sizeof(float));
  const std::string edited = ::testing::TempDir() + "/edited-rope.gguf";
  io::test_files::write_bytes(edited, bytes);
  const std::string e = Checkpoint::open(edited).status().to_string();
  EXPECT_EQ(e.rfind("Unimplemented: " + edited + ": tensor 'rope_freqs.weight': expected ", 0), 0u) << e;
}

TEST(GgufModels, OtherArchitecturesAndDamagedMetadataAreNamed) {
  const std::string bytes = io::test_files::read_bytes(kFile);
  auto edited = [&](const std::string& from, const std::string& to, const std::string& after) {
    std::string b = bytes;
    const size_t at = b.find(from, b.find(after));
    b.replace(at, from.size(), to);
    const std::string path = ::testing::TempDir() + "/edited.gguf";
    io::test_files::write_bytes(path, b);
    return path;
  };
  EXPECT_EQ(Checkpoint::open(edited("gpt2", "bert", "general.architecture")).status().to_string(),
            "Unimplemented: " + ::testing::TempDir() +
                "/edited.gguf: general.architecture: expected gpt2 or llama (GGUF models of other families are not "
                "read yet), found 'bert'");
  EXPECT_EQ(Checkpoint::open(edited("gpt2.block_count", "gpt2.block_cound", "gpt2.block_count")).status().to_string(),
            "NotFound: " + ::testing::TempDir() +
                "/edited.gguf: gpt2.block_count: expected a number (the model's config), found no such key");
  {  // a Llama's metadata
    std::string b = io::test_files::read_bytes(kDir + "/llama-64-q8_0.gguf");
    const std::string key = "llama.attention.layer_norm_rms_epsilon";
    b.replace(b.find(key), key.size(), "llama.attention.layer_norm_rms_epsilom");
    const std::string path = ::testing::TempDir() + "/edited-llama.gguf";
    io::test_files::write_bytes(path, b);
    EXPECT_EQ(Checkpoint::open(path).status().to_string(),
              "NotFound: " + path + ": " + key + ": expected a number (the model's config), found no such key");
  }
  const std::string no_qkv = edited("blk.1.attn_qkv.weight", "blk.1.attn_qkv.weighz", "blk.1.attn_qkv.weight");
  auto ckpt = Checkpoint::open(no_qkv);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  graph::Graph g;
  graph::Builder b(g);
  ASSERT_TRUE(build_causal_lm(b, ckpt->config(), {.batch = 1, .seq = 4}).is_ok());
  EXPECT_EQ(plan_weights(g, *ckpt).status().to_string(),
            "NotFound: " + no_qkv +
                ": tensor 'blk.1.attn_qkv.weight': expected present (the graph's parameter "
                "'transformer.h.1.attn.c_attn.weight', f32[64, 192]), found none");
}

// Perplexity by llama.cpp's method on a text (models/perplexity.h): with the file's matrices dequantized it
// is transformers' on the same values (the golden script runs the same windows); on the blocks (activations
// quantized to Q8_0) within 1 % of it; bad windows and ids are named.
TEST(GgufModels, PerplexityAsTransformersComputesIt) {
  const nlohmann::json gold = golden()["perplexity"];
  auto tok = load_model_tokenizer(kFile);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::vector<io::TokenId> ids = (*tok)->encode(gold["text"].get<std::string>(), false);
  const std::vector<int32_t> tokens(ids.begin(), ids.end());
  const int64_t ctx = gold["ctx"].get<int64_t>();
  const double want = gold["dequantized"].get<double>();
  auto dequantized = perplexity(kFile, tokens, {.ctx = ctx, .threads = 1, .keep_blocks = false});
  ASSERT_TRUE(dequantized.is_ok()) << dequantized.status().to_string();
  EXPECT_EQ(dequantized->scored, gold["scored"].get<int64_t>());
  EXPECT_EQ(dequantized->windows, int64_t(tokens.size()) / ctx);
  EXPECT_NEAR(dequantized->perplexity(), want, 1e-4 * want);
  auto blocks = perplexity(kFile, tokens, {.ctx = ctx, .threads = 2});
  ASSERT_TRUE(blocks.is_ok()) << blocks.status().to_string();
  EXPECT_NEAR(blocks->perplexity(), want, 0.01 * want);
  EXPECT_NE(blocks->nll, dequantized->nll);  // the blocks' products did run

  auto short_text = perplexity(kFile, std::span<const int32_t>(tokens).first(size_t(ctx - 1)), {.ctx = ctx});
  ASSERT_FALSE(short_text.is_ok());
  EXPECT_NE(short_text.status().to_string().find("at least one window of 32"), std::string::npos);
  auto too_long = perplexity(kFile, tokens, {.ctx = 65});
  ASSERT_FALSE(too_long.is_ok());
  EXPECT_NE(too_long.status().to_string().find("n_positions = 64"), std::string::npos);
  std::vector<int32_t> bad = tokens;
  bad[3] = 1000;
  auto bad_id = perplexity(kFile, bad, {.ctx = ctx});
  ASSERT_FALSE(bad_id.is_ok());
  EXPECT_NE(bad_id.status().to_string().find("token 3"), std::string::npos);
}

}  // namespace
}  // namespace aspen::models
