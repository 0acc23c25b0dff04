#include "models/model_testing.h"

#include <algorithm>
#include <cmath>

#include "compiler/executable.h"
#include "graph/autodiff.h"
#include "graph/grad_check.h"
#include "runtime/session.h"

namespace aspen::models::testing {

using graph::HostArray;

Rows Naive::embed(const std::string& table, const std::string& ids, int64_t C) const {
  const std::vector<double>& id = P(ids);
  Rows x(id.size(), std::vector<double>(size_t(C)));
  for (size_t r = 0; r < id.size(); ++r)
    for (int64_t i = 0; i < C; ++i) x[r][size_t(i)] = P(table)[size_t(int64_t(id[r]) * C + i)];
  return x;
}

Rows Naive::layer_norm(const Rows& x, const std::string& name, double eps) const {
  Rows y = x;
  for (auto& r : y) {
    const double C = double(r.size());
    double mean = 0, var = 0;
    for (double v : r) mean += v / C;
    for (double v : r) var += (v - mean) * (v - mean) / C;
    for (size_t i = 0; i < r.size(); ++i)
      r[i] = (r[i] - mean) / std::sqrt(var + eps) * P(name + ".weight")[i] + P(name + ".bias")[i];
  }
  return y;
}

Rows Naive::linear(const Rows& x, const std::string& name, int64_t in, int64_t out, bool bias,
                   WeightLayout layout) const {
  const std::vector<double>& w = P(name + ".weight");
  Rows y(x.size(), std::vector<double>(size_t(out)));
  for (size_t r = 0; r < x.size(); ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias ? P(name + ".bias")[size_t(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        acc += x[r][size_t(i)] * w[size_t(layout == WeightLayout::out_in ? o * in + i : i * out + o)];
      y[r][size_t(o)] = acc;
    }
  return y;
}

Rows Naive::attention(const Rows& q, const Rows& k, const Rows& v, int64_t B, int64_t T, int64_t H, bool causal,
                      const std::string& key_valid) const {
  const int64_t D = int64_t(q[0].size()) / H;
  Rows o(size_t(B * T), std::vector<double>(size_t(H * D)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(T));
        std::vector<bool> allowed(static_cast<size_t>(T));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          allowed[size_t(j)] = (!causal || j <= i) && (key_valid.empty() || P(key_valid)[size_t(b * T + j)] != 0);
          if (!allowed[size_t(j)]) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[size_t(b * T + i)][size_t(h * D + d)] * k[size_t(b * T + j)][size_t(h * D + d)];
          s[size_t(j)] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        for (int64_t j = 0; j < T; ++j)
          if (allowed[size_t(j)]) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
        for (int64_t j = 0; j < T; ++j)
          if (allowed[size_t(j)])
            for (int64_t d = 0; d < D; ++d)
              o[size_t(b * T + i)][size_t(h * D + d)] += s[size_t(j)] / sum * v[size_t(b * T + j)][size_t(h * D + d)];
      }
  return o;
}

void gelu(Rows& x, bool tanh_form) {
  for (auto& r : x)
    for (double& e : r)
      e = tanh_form ? 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)))
                    : 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
}

Rows add(const Rows& a, const Rows& b) {
  Rows y = a;
  for (size_t r = 0; r < y.size(); ++r)
    for (size_t i = 0; i < y[r].size(); ++i) y[r][i] += b[r][i];
  return y;
}

std::vector<double> flatten(const Rows& x) {
  std::vector<double> flat;
  for (const auto& r : x) flat.insert(flat.end(), r.begin(), r.end());
  return flat;
}

Feeds model_feeds(const graph::Graph& g, int64_t vocab, double scale, uint64_t seed) {
  Feeds feeds = graph::testing::random_feeds(g, seed, -scale, scale, /*int_hi=*/vocab);
  if (auto it = feeds.find("positions"); it != feeds.end()) {
    const int64_t T = it->second.type.shape[1];
    for (size_t i = 0; i < it->second.data.size(); ++i) it->second.data[i] = double(int64_t(i) % T);
  }
  if (auto it = feeds.find("attention_mask"); it != feeds.end())
    std::fill(it->second.data.begin(), it->second.data.end(), 1.0);
  return feeds;
}

void expect_compiled_matches(graph::Graph& g, const Feeds& feeds, graph::ValueId loss) {
  if (loss.valid()) {
    std::vector<graph::ValueId> params;
    std::vector<std::string> names;
    for (int32_t i : g.parameter_nodes()) {
      params.push_back(g.node(i).outputs[0]);
      names.push_back(g.node(i).name);
    }
    auto grads = graph::append_gradients(g, loss, params);
    ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
    for (size_t i = 0; i < params.size(); ++i) g.add_output("grad:" + names[i], (*grads)[i]);
  }
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
      // An RMS floor of 1e-2 for gradients that are zero in exact arithmetic (a key bias: softmax ignores a
      // shift shared by all keys), where f32 leaves only rounding noise.
      EXPECT_LE(err, 1e-10 * std::max(ref, 1e-4 * double(w.data.size()))) << name << " at O" << int(level);
    }
  }
}

}  // namespace aspen::models::testing
