// Tests of models/bert.cc: Hugging Face names and types, values against loops
// written from modeling_bert and sentence-transformers' pooling, the compiled
// program against the interpreter, gradients against finite differences,
// config errors.
#include "models/bert.h"

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
using graph::ValueId;
using namespace testing;

TensorType f32(Shape s) { return TensorType{DType::f32, s}; }

struct NaiveBert {
  std::vector<double> last_hidden_state, pooler_output, sentence_embedding;
};

// BertModel (dropout off), its pooler and mean pooling + L2 normalization as loops over the feeds.
NaiveBert naive_bert(const BertConfig& c, int64_t B, int64_t T, const Feeds& f) {
  const int64_t C = c.d_model, F = c.d_ff;
  const Naive n{f};
  Rows x = add(n.embed("embeddings.word_embeddings.weight", "input_ids", C),
               n.embed("embeddings.token_type_embeddings.weight", "token_type_ids", C));
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t i = 0; i < C; ++i)
      x[size_t(r)][size_t(i)] += n.P("embeddings.position_embeddings.weight")[size_t((r % T) * C + i)];
  x = n.layer_norm(x, "embeddings.LayerNorm", c.layer_norm_eps);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    const Rows q = n.linear(x, p + "attention.self.query", C, C, true);
    const Rows k = n.linear(x, p + "attention.self.key", C, C, true);
    const Rows v = n.linear(x, p + "attention.self.value", C, C, true);
    const Rows a = n.linear(n.attention(q, k, v, B, T, c.n_head, /*causal=*/false, "attention_mask"),
                            p + "attention.output.dense", C, C, true);
    x = n.layer_norm(add(a, x), p + "attention.output.LayerNorm", c.layer_norm_eps);
    Rows h = n.linear(x, p + "intermediate.dense", C, F, true);
    gelu(h, c.activation == Activation::gelu_tanh);
    x = n.layer_norm(add(n.linear(h, p + "output.dense", F, C, true), x), p + "output.LayerNorm", c.layer_norm_eps);
  }
  NaiveBert out;
  out.last_hidden_state = flatten(x);
  Rows cls;
  for (int64_t b = 0; b < B; ++b) cls.push_back(x[size_t(b * T)]);
  Rows pooled = n.linear(cls, "pooler.dense", C, C, true);
  for (auto& r : pooled)
    for (double& e : r) e = std::tanh(e);
  out.pooler_output = flatten(pooled);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> mean(static_cast<size_t>(C));
    double count = 0, norm = 0;
    for (int64_t t = 0; t < T; ++t) {
      const double keep = n.P("attention_mask")[size_t(b * T + t)];
      count += keep;
      for (int64_t i = 0; i < C; ++i) mean[size_t(i)] += keep * x[size_t(b * T + t)][size_t(i)];
    }
    for (double& e : mean) {
      e /= count;
      norm += e * e;
    }
    for (double e : mean) out.sentence_embedding.push_back(e / std::sqrt(norm));
  }
  return out;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-9 * (1 + std::abs(want[i]))) << what << i;
}

// Row 1 is right-padded (BERT tokenizers pad on the right): its last two tokens are padding.
Feeds padded_feeds(const Graph& g, const BertConfig& c, uint64_t seed) {
  Feeds feeds = model_feeds(g, c.vocab, 0.5, seed);
  for (double& t : feeds.at("token_type_ids").data) t = double(int64_t(t) % c.type_vocab);
  std::vector<double>& mask = feeds.at("attention_mask").data;
  const int64_t T = feeds.at("attention_mask").type.shape[1];
  mask[size_t(2 * T - 1)] = mask[size_t(2 * T - 2)] = 0;
  return feeds;
}

TEST(Bert, TinyGraphHasHuggingFaceNamesAndTypes) {
  const BertConfig c = BertConfig::tiny();
  Graph g;
  graph::Builder b(g);
  auto m = build_bert(b, c, {.batch = 2, .seq = 5, .pooler = true, .sentence_embedding = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(graph::verify(g).is_ok()) << graph::verify(g).to_string();
  EXPECT_EQ(g.type(m->input_ids), (TensorType{DType::i32, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->token_type_ids), (TensorType{DType::i32, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->attention_mask), (TensorType{DType::u8, Shape{2, 5}}));
  EXPECT_EQ(g.type(m->last_hidden_state), f32({2, 5, 20}));
  EXPECT_EQ(g.type(m->pooler_output), f32({2, 20}));
  EXPECT_EQ(g.type(m->sentence_embedding), f32({2, 20}));
  EXPECT_EQ(g.find_output("last_hidden_state"), m->last_hidden_state);
  EXPECT_EQ(g.find_output("pooler_output"), m->pooler_output);
  EXPECT_EQ(g.find_output("sentence_embedding"), m->sentence_embedding);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"embeddings.word_embeddings.weight", {29, 20}},
      {"embeddings.position_embeddings.weight", {13, 20}},
      {"embeddings.token_type_embeddings.weight", {3, 20}},
      {"embeddings.LayerNorm.weight", {20}},
      {"embeddings.LayerNorm.bias", {20}},
      {"encoder.layer.1.attention.self.query.weight", {20, 20}},
      {"encoder.layer.1.attention.self.query.bias", {20}},
      {"encoder.layer.1.attention.self.key.weight", {20, 20}},
      {"encoder.layer.1.attention.self.value.bias", {20}},
      {"encoder.layer.1.attention.output.dense.weight", {20, 20}},
      {"encoder.layer.1.attention.output.LayerNorm.bias", {20}},
      {"encoder.layer.1.intermediate.dense.weight", {26, 20}},
      {"encoder.layer.1.intermediate.dense.bias", {26}},
      {"encoder.layer.1.output.dense.weight", {20, 26}},
      {"encoder.layer.1.output.dense.bias", {20}},
      {"encoder.layer.1.output.LayerNorm.weight", {20}},
      {"pooler.dense.weight", {20, 20}},
      {"pooler.dense.bias", {20}},
  };
  for (const auto& [name, shape] : want) {
    auto p = g.find_parameter(name);
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_EQ(g.type(*p), f32(shape)) << name;
  }
  // 3 tables + LayerNorm (2), 16 per layer, pooler (2).
  EXPECT_EQ(g.parameter_nodes().size(), 5u + 2u * 16u + 2u);
}

TEST(Bert, WithoutHeadsThereIsNoPoolerParameter) {
  Graph g;
  graph::Builder b(g);
  auto m = build_bert(b, BertConfig::tiny(), {.batch = 1, .seq = 3});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_FALSE(m->pooler_output.valid());
  EXPECT_FALSE(m->sentence_embedding.valid());
  EXPECT_FALSE(g.find_parameter("pooler.dense.weight").has_value());
  EXPECT_FALSE(g.find_output("sentence_embedding").has_value());
}

TEST(Bert, OutputsMatchLoopsWrittenFromTheHuggingFaceModel) {
  for (Activation act : {Activation::gelu_erf, Activation::gelu_tanh}) {
    BertConfig c = BertConfig::tiny();
    c.activation = act;
    const int64_t batch = 2, seq = 5;
    Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build_bert(b, c, {.batch = batch, .seq = seq, .pooler = true, .sentence_embedding = true}).is_ok());
    const Feeds feeds = padded_feeds(g, c, 3);
    auto out = graph::interpret(g, feeds);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const NaiveBert want = naive_bert(c, batch, seq, feeds);
    expect_near(out->at("last_hidden_state").data, want.last_hidden_state, "last_hidden_state");
    expect_near(out->at("pooler_output").data, want.pooler_output, "pooler_output");
    expect_near(out->at("sentence_embedding").data, want.sentence_embedding, "sentence_embedding");
  }
}

ValueId all_outputs_loss(graph::Builder& b, const BertGraph& m) {
  return b.add(b.add(graph::testing::weighted_loss(b, m.last_hidden_state, 1),
                     graph::testing::weighted_loss(b, m.pooler_output, 2)),
               graph::testing::weighted_loss(b, m.sentence_embedding, 3));
}

TEST(Bert, CompiledGraphEqualsInterpreterWithGradients) {
  const BertConfig c = BertConfig::tiny();
  Graph g;
  graph::Builder b(g);
  auto m = build_bert(b, c, {.batch = 2, .seq = 5, .pooler = true, .sentence_embedding = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const ValueId loss = all_outputs_loss(b, *m);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  expect_compiled_matches(g, padded_feeds(g, c, 17), loss);
}

TEST(Bert, GradientsMatchFiniteDifferences) {
  const BertConfig c{.vocab = 7, .type_vocab = 2, .max_positions = 4, .d_model = 6, .n_layer = 1, .n_head = 2,
                     .d_ff = 5};
  Graph g;
  graph::Builder b(g);
  auto m = build_bert(b, c, {.batch = 2, .seq = 3, .pooler = true, .sentence_embedding = true});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const ValueId loss = all_outputs_loss(b, *m);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  EXPECT_TRUE(graph::testing::check_gradients(g, loss, padded_feeds(g, c, 11), 1e-7));
}

// The masked-LM head in training: "loss" is the mean cross-entropy of "logits" over the targets that are not
// -100 (HF's ignored labels); with a bidirectional sparse layout and attention dropout (a fixed seed), the
// gradients match central differences and the compiled program matches the interpreter.
TEST(Bert, MaskedLmLossWithSparseAttentionAndDropout) {
  const BertConfig c{.vocab = 7, .type_vocab = 2, .max_positions = 4, .d_model = 6, .n_layer = 2, .n_head = 2,
                     .d_ff = 5};
  kernels::BlockLayout layout;
  layout.block = 2;
  layout.blocks = 2;
  layout.heads = 2;
  layout.bits = {1, 0, 1, 1, /*head 1:*/ 1, 1, 0, 1};
  Graph g;
  graph::Builder b(g);
  auto m = build_bert(b, c, {.batch = 2, .seq = 4, .mlm_head = true, .with_loss = true, .layout = &layout,
                             .attention_dropout = 0.3});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  Feeds feeds = padded_feeds(g, c, 13);
  feeds.at("targets").data = {3, -100, 1, -100, 6, 0, -100, 2};
  feeds.at("dropout_seed").data = {41};
  auto out = graph::interpret(g, feeds);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const std::vector<double>& logits = out->at("logits").data;
  double sum = 0;
  int n = 0;
  for (int64_t r = 0; r < 8; ++r) {
    const double t = feeds.at("targets").data[size_t(r)];
    if (t == -100) continue;
    double mx = -1e300, z = 0;
    for (int64_t v = 0; v < c.vocab; ++v) mx = std::max(mx, logits[size_t(r * c.vocab + v)]);
    for (int64_t v = 0; v < c.vocab; ++v) z += std::exp(logits[size_t(r * c.vocab + v)] - mx);
    sum += mx + std::log(z) - logits[size_t(r * c.vocab + int64_t(t))];
    ++n;
  }
  EXPECT_NEAR(out->at("loss").data[0], sum / n, 1e-12);
  EXPECT_TRUE(graph::testing::check_gradients(g, m->loss, feeds, 1e-7));
  expect_compiled_matches(g, feeds, m->loss);
  Graph g2;
  graph::Builder b2(g2);
  EXPECT_EQ(build_bert(b2, c, {.batch = 1, .seq = 4, .with_loss = true}).status().message(),
            "bert: with_loss: expected the MLM head (mlm_head) to train, found no head");
}

// The head on the predicted rows only (mlm_predictions): the same loss as the head on every position, to
// rounding; gradients by central differences; the compiled program against the interpreter.
TEST(Bert, MlmHeadOnThePredictedRowsOnly) {
  const BertConfig c = BertConfig::tiny();
  const std::vector<double> full_targets = {3, -100, 1, -100, -100, 6, 0, -100};  // [2, 4]
  Graph full, gathered;
  graph::Builder bf(full), bg(gathered);
  auto mf = build_bert(bf, c, {.batch = 2, .seq = 4, .mlm_head = true, .with_loss = true});
  auto mg = build_bert(bg, c, {.batch = 2, .seq = 4, .mlm_head = true, .with_loss = true, .mlm_predictions = 3});
  ASSERT_TRUE(mf.is_ok() && mg.is_ok()) << mf.status().to_string() << mg.status().to_string();
  Feeds ff = padded_feeds(full, c, 17);
  ff.at("targets").data = full_targets;
  Feeds fg = ff;  // the same weights and tokens
  fg.emplace("mlm_positions", ff.at("targets"));
  fg.at("targets").data = {3, 1, -100, 6, 0, -100};  // row 0: tokens 0, 2 and a pad; row 1: tokens 5, 6 (b*T+t)
  fg.at("mlm_positions").data = {0, 2, 0, 5, 6, 4};
  fg.at("targets").type.shape = fg.at("mlm_positions").type.shape = Shape{6};
  auto a = graph::interpret(full, ff), g = graph::interpret(gathered, fg);
  ASSERT_TRUE(a.is_ok() && g.is_ok()) << a.status().to_string() << g.status().to_string();
  EXPECT_NEAR(a->at("loss").data[0], g->at("loss").data[0], 1e-12);
  EXPECT_EQ(g->at("logits").type.shape, (Shape{2, 3, c.vocab}));
  EXPECT_TRUE(graph::testing::check_gradients(gathered, mg->loss, fg, 1e-7));
  expect_compiled_matches(gathered, fg, mg->loss);
  Graph bad;
  graph::Builder bb(bad);
  EXPECT_EQ(build_bert(bb, c, {.batch = 1, .seq = 4, .mlm_head = true, .with_loss = true, .mlm_predictions = 5})
                .status()
                .message(),
            "bert: mlm_predictions: expected 0, or 1 to seq = 4 with with_loss, found 5");
}

std::string config_error(const BertConfig& c, int64_t batch = 1, int64_t seq = 4) {
  Graph g;
  graph::Builder b(g);
  return build_bert(b, c, {.batch = batch, .seq = seq}).status().message();
}

TEST(Bert, BadConfigsAreNamed) {
  BertConfig c = BertConfig::tiny();
  c.d_model = 22;
  EXPECT_EQ(config_error(c), "bert config: d_model: expected a multiple of n_head (4), found 22");
  c = BertConfig::tiny();
  c.type_vocab = 0;
  EXPECT_EQ(config_error(c), "bert config: type_vocab: expected a number > 0, found 0");
  EXPECT_EQ(config_error(BertConfig::tiny(), 1, 14), "bert: seq: expected a number in [1, max_positions = 13], found 14");
}

}  // namespace
}  // namespace aspen::models
