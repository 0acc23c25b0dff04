#include "models/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "models/gpt2.h"

namespace aspen::models {
namespace {

void moments(const Tensor& t, double& mean, double& sd) {
  double s = 0, s2 = 0;
  for (float x : t.span<float>()) s += x, s2 += double(x) * x;
  mean = s / double(t.numel());
  sd = std::sqrt(s2 / double(t.numel()) - mean * mean);
}

TEST(InitWeights, FollowsHuggingFaceGpt2Rules) {
  graph::Graph g;
  graph::Builder b(g);
  const Gpt2Config c{.vocab = 300, .n_positions = 64, .d_model = 64, .n_layer = 2, .n_head = 4};
  ASSERT_TRUE(build_gpt2(b, c, {.batch = 1, .seq = 8, .with_loss = true}).is_ok());
  auto w = init_weights(g, {.seed = 7, .std = 0.02, .n_layer = 2, .scaled_residual = true});
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  for (const auto& [name, t] : *w) {
    if (name.ends_with(".bias")) {
      for (float x : t.span<float>()) ASSERT_EQ(x, 0.0f) << name;
    } else if (name.find("ln_") != std::string::npos) {
      for (float x : t.span<float>()) ASSERT_EQ(x, 1.0f) << name;
    }
  }
  double mean = 0, sd = 0;
  moments(w->at("transformer.wte.weight"), mean, sd);
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(sd, 0.02, 1e-3);
  moments(w->at("transformer.h.1.mlp.c_proj.weight"), mean, sd);
  EXPECT_NEAR(sd, 0.02 / 2.0, 1e-3);  // 1/sqrt(2 * n_layer)
  // Deterministic, and parameters draw from their own streams.
  auto again = init_weights(g, {.seed = 7, .std = 0.02, .n_layer = 2, .scaled_residual = true});
  const Tensor &a = w->at("transformer.wpe.weight"), &b2 = again->at("transformer.wpe.weight");
  EXPECT_EQ(std::memcmp(a.raw(), b2.raw(), a.nbytes()), 0);
  EXPECT_NE(w->at("transformer.h.0.attn.c_attn.weight").span<float>()[0],
            w->at("transformer.h.1.attn.c_attn.weight").span<float>()[0]);
  EXPECT_EQ(init_weights(g, {.std = -1}).status().subject(), "init_weights: std");
}

}  // namespace
}  // namespace aspen::models
