// Tests of models/gpt2.cc: Hugging Face names and types, values against loops
// written from modeling_gpt2, padding, the compiled program against the
// interpreter, gradients against finite differences, config errors.
#include "models/gpt2.h"

#include <gtest/gtest.h>

#include <cmath>

#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/verify.h"
#include "models/model_testing.h"

namespace aspen::models {
namespace {

using graph::Graph;
using graph::TensorType;
using namespace testing;

TensorType f32(Shape s) { return TensorType{DType::f32, s}; }

// GPT2LMHeadModel as loops over the feeds (dropout off): logits [B, T, V].
std::vector<double> naive_gpt2(const Gpt2Config& c, int64_t B, int64_t T, const Feeds& f,
                               const std::string& mask = "") {
  const int64_t C = c.d_model, F = c.ff_dim(), V = c.vocab;
  const WeightLayout conv1d = WeightLayout::in_out;
  const Naive n{f};
  Rows x = add(n.embed("transformer.wte.weight", "input_ids", C), n.embed("transformer.wpe.weight", "positions", C));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const Rows qkv = n.linear(n.layer_norm(x, p + "ln_1", c.layer_norm_eps), p + "attn.c_attn", C, 3 * C, true, conv1d);
    Rows q(qkv.size()), k(qkv.size()), v(qkv.size());
    for (size_t r = 0; r < qkv.size(); ++r) {
      q[r].assign(qkv[r].begin(), qkv[r].begin() + C);
      k[r].assign(qkv[r].begin() + C, qkv[r].begin() + 2 * C);
      v[r].assign(qkv[r].begin() + 2 * C, qkv[r].end());
    }
    x = add(x, n.linear(n.attention(q, k, v, B, T, c.n_head, /*causal=*/true, mask), p + "attn.c_proj", C, C, true,
                        conv1d));
    Rows m = n.linear(n.layer_norm(x, p + "ln_2", c.layer_norm_eps), p + "mlp.c_fc", C, F, true, conv1d);
    gelu(m, /*tanh_form=*/true);
    x = add(x, n.linear(m, p + "mlp.c_proj", F, C, true, conv1d));
  }
  x = n.layer_norm(x, "transformer.ln_f", c.layer_norm_eps);
  // Tied: logits = x wte^T, i.e. a linear with wte as an [out, in] weight.
  return flatten(c.tie_word_embeddings ? n.linear(x, "transformer.wte", C, V, false) : n.linear(x, "lm_head", C, V, false));
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << i;
}

TEST(Gpt2, TinyGraphHasHuggingFaceNamesAndTypes) {
  const Gpt2Config c = Gpt2Config::tiny();
  Graph g;
  graph::Builder b(g);
  auto m = build_gpt2(b, c, {.batch = 2, .seq = 5, .with_loss = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(graph::verify(g).is_ok()) << graph::verify(g).to_string();
  EXPECT_EQ(g.type(m->input_ids), (TensorType{DType::i32, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->positions), (TensorType{DType::i32, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->targets), (TensorType{DType::i32, Shape{10}}));
  EXPECT_EQ(g.type(m->logits), f32({2, 5, 41}));
  EXPECT_EQ(g.type(m->loss), f32({}));
  EXPECT_FALSE(m->attention_mask.valid());
  const std::vector<std::pair<std::string, Shape>> want = {
      {"transformer.wte.weight", {41, 18}},
      {"transformer.wpe.weight", {11, 18}},
      {"transformer.h.1.ln_1.weight", {18}},
      {"transformer.h.1.ln_1.bias", {18}},
      {"transformer.h.1.attn.c_attn.weight", {18, 54}},
      {"transformer.h.1.attn.c_attn.bias", {54}},
      {"transformer.h.1.attn.c_proj.weight", {18, 18}},
      {"transformer.h.1.attn.c_proj.bias", {18}},
      {"transformer.h.1.ln_2.weight", {18}},
      {"transformer.h.1.ln_2.bias", {18}},
      {"transformer.h.1.mlp.c_fc.weight", {18, 22}},
      {"transformer.h.1.mlp.c_fc.bias", {22}},
      {"transformer.h.1.mlp.c_proj.weight", {22, 18}},
      {"transformer.h.1.mlp.c_proj.bias", {18}},
      {"transformer.ln_f.weight", {18}},
      {"transformer.ln_f.bias", {18}},
  };
  for (const auto& [name, shape] : want) {
    auto p = g.find_parameter(name);
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_EQ(g.type(*p), f32(shape)) << name;
  }
  // Tied: no lm_head parameter. wte, wpe, 12 per layer, ln_f (2).
  EXPECT_FALSE(g.find_parameter("lm_head.weight").has_value());
  EXPECT_EQ(g.parameter_nodes().size(), 2u + 2u * 12u + 2u);
}

TEST(Gpt2, LogitsMatchLoopsWrittenFromTheHuggingFaceModel) {
  for (bool tied : {true, false}) {
    Gpt2Config c = Gpt2Config::tiny();
    c.tie_word_embeddings = tied;
    const int64_t batch = 2, seq = 5;
    Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build_gpt2(b, c, {.batch = batch, .seq = seq}).is_ok());
    EXPECT_EQ(g.find_parameter("lm_head.weight").has_value(), !tied);
    Feeds feeds = model_feeds(g, c.vocab, 0.5, 3);
    for (int64_t t = 0; t < seq; ++t) feeds.at("positions").data[size_t(seq + t)] = double(2 + t);  // any positions
    auto out = graph::interpret(g, feeds);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    expect_near(out->at("logits").data, naive_gpt2(c, batch, seq, feeds));
  }
}

// Left padding: row 1 starts with three pads; its positions count real tokens only.
TEST(Gpt2, AttentionMaskHidesPaddingKeys) {
  const Gpt2Config c = Gpt2Config::tiny();
  const int64_t batch = 2, seq = 5;
  Graph g;
  graph::Builder b(g);
  auto m = build_gpt2(b, c, {.batch = batch, .seq = seq, .attention_mask = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(g.type(m->attention_mask), (TensorType{DType::u8, Shape{2, 5}}));
  Feeds feeds = model_feeds(g, c.vocab, 0.5, 9);
  feeds.at("attention_mask").data = {1, 1, 1, 1, 1, 0, 0, 0, 1, 1};
  feeds.at("positions").data = {0, 1, 2, 3, 4, 1, 1, 1, 0, 1};
  auto out = graph::interpret(g, feeds);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  expect_near(out->at("logits").data, naive_gpt2(c, batch, seq, feeds, "attention_mask"));
  expect_compiled_matches(g, feeds);
}

TEST(Gpt2, CompiledTrainingGraphEqualsInterpreter) {
  const Gpt2Config c = Gpt2Config::tiny();
  Graph g;
  graph::Builder b(g);
  auto m = build_gpt2(b, c, {.batch = 2, .seq = 5, .with_loss = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  expect_compiled_matches(g, model_feeds(g, c.vocab, 0.3, 17), m->loss);
}

TEST(Gpt2, LossGradientsMatchFiniteDifferences) {
  const Gpt2Config c{.vocab = 7, .n_positions = 4, .d_model = 6, .n_layer = 1, .n_head = 2, .d_ff = 5};
  Graph g;
  graph::Builder b(g);
  auto m = build_gpt2(b, c, {.batch = 2, .seq = 3, .with_loss = true, .attention_mask = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  Feeds feeds = model_feeds(g, c.vocab, 0.5, 11);
  feeds.at("attention_mask").data = {1, 1, 1, 0, 1, 1};
  EXPECT_TRUE(graph::testing::check_gradients(g, m->loss, feeds, 1e-7));
}

std::string config_error(const Gpt2Config& c, int64_t batch = 1, int64_t seq = 4) {
  Graph g;
  graph::Builder b(g);
  return build_gpt2(b, c, {.batch = batch, .seq = seq}).status().message();
}

TEST(Gpt2, BadConfigsAreNamed) {
  Gpt2Config c = Gpt2Config::tiny();
  c.d_model = 19;
  EXPECT_EQ(config_error(c), "gpt2 config: d_model: expected a multiple of n_head (3), found 19");
  c = Gpt2Config::tiny();
  c.n_head = 0;
  EXPECT_EQ(config_error(c), "gpt2 config: n_head: expected a number > 0, found 0");
  c = Gpt2Config::tiny();
  c.layer_norm_eps = -1;
  EXPECT_EQ(config_error(c), "gpt2 config: layer_norm_eps: expected a finite number >= 0, found -1.000000");
  EXPECT_EQ(config_error(Gpt2Config::tiny(), 0, 4), "gpt2: batch: expected a number > 0, found 0");
  EXPECT_EQ(config_error(Gpt2Config::tiny(), 1, 12), "gpt2: seq: expected a number in [1, n_positions = 11], found 12");
}

}  // namespace
}  // namespace aspen::models
