// Tests of models/gptj.cc: the graph's names and types, its values through the
// reference interpreter, gradients of the loss against finite differences,
// and config errors worded exactly.
#include "models/gptj.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compiler/executable.h"
#include "graph/autodiff.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "graph/verify.h"
#include "kernels/rotary.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

using graph::Graph;
using graph::HostArray;
using graph::TensorType;

TensorType f32(Shape s) { return TensorType{DType::f32, s}; }

// Random feeds: parameters uniform in [-scale, scale), ids in [0, vocab),
// positions 0..seq-1 in every row.
std::map<std::string, HostArray> feeds_for(const Graph& g, const GptjConfig& c, int64_t batch, int64_t seq,
                                           double scale, uint64_t seed) {
  auto feeds = graph::testing::random_feeds(g, seed, -scale, scale, /*int_hi=*/c.vocab);
  HostArray& pos = feeds.at("positions");
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) pos.data[size_t(b * seq + t)] = double(t);
  return feeds;
}

// GPT-J written out as loops over the feeds, independently of the graph's
// ops (Hugging Face's modeling_gptj, dropout off): logits [B, T, V].
std::vector<double> naive_gptj(const GptjConfig& c, int64_t B, int64_t T, const std::map<std::string, HostArray>& f) {
  const int64_t C = c.d_model, H = c.n_head, D = c.head_dim(), F = c.ff_dim(), V = c.vocab;
  auto P = [&](const std::string& name) -> const std::vector<double>& { return f.at(name).data; };
  using Rows = std::vector<std::vector<double>>;  // [B*T][width]
  auto layer_norm = [&](const Rows& x, const std::string& name) {
    Rows y = x;
    for (auto& r : y) {
      double mean = 0, var = 0;
      for (double v : r) mean += v / double(C);
      for (double v : r) var += (v - mean) * (v - mean) / double(C);
      for (int64_t i = 0; i < C; ++i)
        r[size_t(i)] = (r[size_t(i)] - mean) / std::sqrt(var + c.layer_norm_eps) * P(name + ".weight")[size_t(i)] +
                       P(name + ".bias")[size_t(i)];
    }
    return y;
  };
  // y = x W^T + bias, W [out, in].
  auto linear = [&](const Rows& x, const std::string& name, int64_t in, int64_t out, bool bias) {
    Rows y(x.size(), std::vector<double>(size_t(out)));
    for (size_t r = 0; r < x.size(); ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = bias ? P(name + ".bias")[size_t(o)] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += x[r][size_t(i)] * P(name + ".weight")[size_t(o * in + i)];
        y[r][size_t(o)] = acc;
      }
    return y;
  };
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
  Rows x(size_t(B * T), std::vector<double>(size_t(C)));
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t i = 0; i < C; ++i)
      x[size_t(r)][size_t(i)] = P("transformer.wte.weight")[size_t(int64_t(f.at("input_ids").data[size_t(r)]) * C + i)];
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    const Rows h = layer_norm(x, p + "ln_1");
    Rows q = linear(h, p + "attn.q_proj", C, C, false), k = linear(h, p + "attn.k_proj", C, C, false);
    const Rows v = linear(h, p + "attn.v_proj", C, C, false);
    rotary(q);
    rotary(k);
    Rows o(size_t(B * T), std::vector<double>(size_t(C)));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hd = 0; hd < H; ++hd)
        for (int64_t i = 0; i < T; ++i) {
          std::vector<double> s(size_t(i + 1));
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j <= i; ++j) {  // causal
            double dot = 0;
            for (int64_t d = 0; d < D; ++d)
              dot += q[size_t(b * T + i)][size_t(hd * D + d)] * k[size_t(b * T + j)][size_t(hd * D + d)];
            s[size_t(j)] = dot / std::sqrt(double(D));
            mx = std::max(mx, s[size_t(j)]);
          }
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t d = 0; d < D; ++d)
              o[size_t(b * T + i)][size_t(hd * D + d)] += s[size_t(j)] / sum * v[size_t(b * T + j)][size_t(hd * D + d)];
        }
    const Rows a = linear(o, p + "attn.out_proj", C, C, false);
    Rows m = linear(h, p + "mlp.fc_in", C, F, true);
    for (auto& r : m)
      for (double& e : r) e = 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
    const Rows mo = linear(m, p + "mlp.fc_out", F, C, true);
    for (size_t r = 0; r < x.size(); ++r)
      for (int64_t i = 0; i < C; ++i) x[r][size_t(i)] += a[r][size_t(i)] + mo[r][size_t(i)];
  }
  const Rows logits = linear(layer_norm(x, "transformer.ln_f"), "lm_head", C, V, true);
  std::vector<double> flat;
  for (const auto& r : logits) flat.insert(flat.end(), r.begin(), r.end());
  return flat;
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
  auto out = graph::interpret(g, feeds_for(g, c, batch, seq, 0.1, 7));
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
  auto feeds = feeds_for(g, c, batch, seq, 0.5, 3);
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
  EXPECT_TRUE(graph::testing::check_gradients(g, m->loss, feeds_for(g, c, batch, seq, 0.5, 11), 1e-7));
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
  const int64_t batch = 2, seq = 5;
  Graph g;
  graph::Builder b(g);
  auto m = build_gptj(b, c, batch, seq, /*with_loss=*/true);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  std::vector<graph::ValueId> params;
  std::vector<std::string> names;
  for (int32_t i : g.parameter_nodes()) {
    params.push_back(g.node(i).outputs[0]);
    names.push_back(g.node(i).name);
  }
  auto grads = graph::append_gradients(g, m->loss, params);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  for (size_t i = 0; i < params.size(); ++i) g.add_output("grad:" + names[i], (*grads)[i]);
  auto feeds = feeds_for(g, c, batch, seq, 0.3, 17);
  auto want = graph::interpret(g, feeds, {.round_to_dtype = true});
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  for (auto level : {compiler::OptLevel::O0, compiler::OptLevel::O2}) {
    auto exe = compiler::compile(g, {.opt_level = level, .verify_each_pass = true});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    for (const auto& ins : (*exe)->program.code) EXPECT_FALSE(ins.reference) << "a reference fallback in f32";
    auto session = runtime::Session::create(std::move(exe).value(), {.threads = 1});
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    std::map<std::string, Tensor> inputs;
    for (const auto& [name, a] : feeds) {
      if (g.find_parameter(name)) {
        ASSERT_TRUE((*session)->set_parameter(name, a.to_tensor()).is_ok()) << name;
      } else {
        inputs.emplace(name, a.to_tensor());
      }
    }
    std::map<std::string, const Tensor*> in;
    for (const auto& [name, t] : inputs) in[name] = &t;
    auto got = (*session)->run(in);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    for (const auto& [name, w] : *want) {
      const HostArray h = HostArray::from_tensor(got->at(name));
      double err = 0, ref = 0;
      for (size_t i = 0; i < w.data.size(); ++i) {
        err += (h.data[i] - w.data[i]) * (h.data[i] - w.data[i]);
        ref += w.data[i] * w.data[i];
      }
      EXPECT_LE(err, 1e-10 * std::max(ref, 1e-30)) << name << " at O" << int(level);
    }
  }
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
