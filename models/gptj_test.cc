// Tests of models/gptj.cc: the graph's names and types, its values through the
// reference interpreter, gradients of the loss against finite differences,
// and config errors worded exactly.
#include "models/gptj.h"

#include <gtest/gtest.h>

#include <cmath>

#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/verify.h"
#include "kernels/rotary.h"
#include "models/model_testing.h"

namespace aspen::models {
namespace {

using graph::Graph;
using graph::HostArray;
using graph::TensorType;
using namespace testing;

TensorType f32(Shape s) { return TensorType{DType::f32, s}; }

// Random feeds: parameters uniform in [-scale, scale), ids in [0, vocab),
// positions 0..seq-1 in every row.
Feeds feeds_for(const Graph& g, const GptjConfig& c, double scale, uint64_t seed) {
  return model_feeds(g, c.vocab, scale, seed);
}

// GPT-J written out as loops over the feeds, independently of the graph's
// ops (Hugging Face's modeling_gptj, dropout off): logits [B, T, V]. With
// `mask` (a feed name), padding keys are never attended.
std::vector<double> naive_gptj(const GptjConfig& c, int64_t B, int64_t T, const Feeds& f,
                               const std::string& mask = "") {
  const int64_t C = c.d_model, H = c.n_head, D = c.head_dim(), F = c.ff_dim(), V = c.vocab;
  const Naive n{f};
  // rotate_every_two on the first rotary_dim channels of each head.
  auto rotary = [&](Rows& x) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t p = 0; p < c.rotary_dim / 2; ++p) {
            const double angle =
                f.at("positions").data[size_t(b * T + t)] * double(kernels::rotary_inv_freq(p, c.rotary_dim, 10000.0f));
            double& xa = x[size_t(b * T + t)][size_t(h * D + 2 * p)];
            double& xb = x[size_t(b * T + t)][size_t(h * D + 2 * p + 1)];
            const double a = xa, bb = xb;
            xa = a * std::cos(angle) - bb * std::sin(angle);
            xb = bb * std::cos(angle) + a * std::sin(angle);
          }
  };
  Rows x = n.embed("transformer.wte.weight", "input_ids", C);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const Rows h = n.layer_norm(x, p + "ln_1", c.layer_norm_eps);
    Rows q = n.linear(h, p + "attn.q_proj", C, C, false), k = n.linear(h, p + "attn.k_proj", C, C, false);
    const Rows v = n.linear(h, p + "attn.v_proj", C, C, false);
    rotary(q);
    rotary(k);
    const Rows a = n.linear(n.attention(q, k, v, B, T, H, /*causal=*/true, mask), p + "attn.out_proj", C, C, false);
    Rows m = n.linear(h, p + "mlp.fc_in", C, F, true);
    gelu(m, /*tanh_form=*/true);
    x = add(x, add(a, n.linear(m, p + "mlp.fc_out", F, C, true)));
  }
  return flatten(n.linear(n.layer_norm(x, "transformer.ln_f", c.layer_norm_eps), "lm_head", C, V, true));
}

TEST(Gptj, TinyGraphHasHuggingFaceNamesAndTypes) {
  const GptjConfig c = GptjConfig::tiny();
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, c, /*batch=*/2, /*seq=*/5, /*with_loss=*/true);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(graph::verify(g).is_ok()) << graph::verify(g).to_string();

  EXPECT_EQ(g.type(m->input_ids), (TensorType{DType::i32, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->positions), (TensorType{DType::i32, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->targets), (TensorType{DType::i32, Shape{10}}));
  EXPECT_EQ(g.type(m->logits), f32({2, 5, 37}));
  EXPECT_EQ(g.type(m->loss), f32({}));
  EXPECT_EQ(g.find_output("logits"), m->logits);
  EXPECT_EQ(g.find_output("loss"), m->loss);

  const std::vector<std::pair<std::string, Shape>> want = {
      {"transformer.wte.weight", {37, 24}},
      {"transformer.h.1.ln_1.weight", {24}},
      {"transformer.h.1.ln_1.bias", {24}},
      {"transformer.h.1.attn.q_proj.weight", {24, 24}},
      {"transformer.h.1.attn.k_proj.weight", {24, 24}},
      {"transformer.h.1.attn.v_proj.weight", {24, 24}},
      {"transformer.h.1.attn.out_proj.weight", {24, 24}},
      {"transformer.h.1.mlp.fc_in.weight", {96, 24}},
      {"transformer.h.1.mlp.fc_in.bias", {96}},
      {"transformer.h.1.mlp.fc_out.weight", {24, 96}},
      {"transformer.h.1.mlp.fc_out.bias", {24}},
      {"transformer.ln_f.weight", {24}},
      {"transformer.ln_f.bias", {24}},
      {"lm_head.weight", {37, 24}},
      {"lm_head.bias", {37}},
  };
  for (const auto& [name, shape] : want) {
    auto p = g.find_parameter(name);
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_EQ(g.type(*p), f32(shape)) << name;
  }
  // GPT-J's attention projections have no biases: wte, 10 per layer, ln_f and lm_head (2 each).
  EXPECT_FALSE(g.find_parameter("transformer.h.0.attn.q_proj.bias").has_value());
  EXPECT_EQ(g.parameter_nodes().size(), 1u + 2u * 10u + 2u + 2u);
}

TEST(Gptj, LogitsAreFiniteAndLossIsNearLogVocabForSmallWeights) {
  const GptjConfig c = GptjConfig::tiny();
  const int64_t batch = 2, seq = 5;
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, c, batch, seq, true);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  auto out = graph::interpret(g, feeds_for(g, c, 0.1, 7));
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const HostArray& logits = out->at("logits");
  ASSERT_EQ(logits.numel(), batch * seq * c.vocab);
  for (double v : logits.data) ASSERT_TRUE(std::isfinite(v));
  // Small weights make the logits nearly equal: the loss is that of a uniform guess.
  EXPECT_NEAR(out->at("loss").data[0], std::log(double(c.vocab)), 0.05);
}

TEST(Gptj, LogitsMatchLoopsWrittenFromTheHuggingFaceModel) {
  const GptjConfig c = GptjConfig::tiny();
  const int64_t batch = 2, seq = 5;
  Graph g;
  graph::Builder b(g);
  ASSERT_TRUE(build_gptj(b, c, batch, seq, false).is_ok());
  auto feeds = feeds_for(g, c, 0.5, 3);
  for (int64_t t = 0; t < seq; ++t) feeds.at("positions").data[size_t(seq + t)] = double(3 + 2 * t);  // any positions
  auto out = graph::interpret(g, feeds);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const std::vector<double> want = naive_gptj(c, batch, seq, feeds);
  const std::vector<double>& got = out->at("logits").data;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << i;
}

TEST(Gptj, InferenceGraphHasNoLossOrTargets) {
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, GptjConfig::tiny(), 1, 3, false);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_FALSE(m->loss.valid());
  EXPECT_FALSE(m->targets.valid());
  EXPECT_FALSE(g.find_input("targets").has_value());
  EXPECT_FALSE(g.find_output("loss").has_value());
  EXPECT_EQ(g.type(m->logits), f32({1, 3, 37}));
}

TEST(Gptj, LossGradientsMatchFiniteDifferences) {
  // Small enough that probing every parameter twice stays quick.
  const GptjConfig c{.vocab = 7, .n_positions = 8, .d_model = 8, .n_layer = 1, .n_head = 2, .rotary_dim = 2, .d_ff = 6};
  const int64_t batch = 2, seq = 3;
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, c, batch, seq, true);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_TRUE(graph::testing::check_gradients(g, m->loss, feeds_for(g, c, 0.5, 11), 1e-7));
}

std::string config_error(GptjConfig c, int64_t batch = 1, int64_t seq = 4) {
  Graph g;
  graph::Builder b(g);
  return build_gptj(b, c, batch, seq, false).status().message();
}

// The compiled program (fast kernels, fusion at O2) computes what the graph
// means: logits, loss and every parameter gradient against the interpreter
// (with rounding to f32) at O0 and O2.
TEST(Gptj, CompiledTrainingGraphEqualsInterpreter) {
  const GptjConfig c = GptjConfig::tiny();
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, c, /*batch=*/2, /*seq=*/5, /*with_loss=*/true);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  expect_compiled_matches(g, feeds_for(g, c, 0.3, 17), m->loss);
}

// Left padding: row 0 starts with two pad tokens that no query attends, and its
// positions count real tokens only (as Hugging Face's generate does).
TEST(Gptj, AttentionMaskHidesPaddingKeys) {
  const GptjConfig c = GptjConfig::tiny();
  const int64_t batch = 2, seq = 5;
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, c, {.batch = batch, .seq = seq, .attention_mask = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(g.type(m->attention_mask), (TensorType{DType::u8, Shape{2, 5}}));
  Feeds feeds = feeds_for(g, c, 0.5, 5);
  const std::vector<double> mask{0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, pos{0, 0, 0, 1, 2, 0, 1, 2, 3, 4};
  feeds.at("attention_mask").data = mask;
  feeds.at("positions").data = pos;
  auto out = graph::interpret(g, feeds);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const std::vector<double> want = naive_gptj(c, batch, seq, feeds, "attention_mask");
  const std::vector<double>& got = out->at("logits").data;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << i;
  expect_compiled_matches(g, feeds);
}

TEST(Gptj, BadConfigsAreNamed) {
  GptjConfig c = GptjConfig::tiny();
  c.d_model = 25;
  EXPECT_EQ(config_error(c), "gptj config: d_model: expected a multiple of n_head (3), found 25");
  c = GptjConfig::tiny();
  c.rotary_dim = 10;
  EXPECT_EQ(config_error(c), "gptj config: rotary_dim: expected at most head_dim = d_model / n_head = 8, found 10");
  c.rotary_dim = 3;
  EXPECT_EQ(config_error(c), "gptj config: rotary_dim: expected an even number, found 3");
  c = GptjConfig::tiny();
  c.n_layer = 0;
  EXPECT_EQ(config_error(c), "gptj config: n_layer: expected a number > 0, found 0");
  EXPECT_EQ(config_error(GptjConfig::tiny(), 1, 17), "gptj: seq: expected a number in [1, n_positions = 16], found 17");
}

}  // namespace
}  // namespace aspen::models
