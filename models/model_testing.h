// models/model_testing.h: helpers for the model tests (tests only).
//
// Naive: the blocks of a Transformer written as plain loops over f64 feeds,
// independently of the graph's ops, so each family's test can spell out the
// Hugging Face model in a few lines and compare the graph against it.
// expect_compiled_matches: the compiled program (fast kernels, fusion at O2)
// against the reference interpreter rounded to each dtype, for every output
// and, with a loss, every parameter gradient.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/interpreter.h"
#include "models/blocks.h"

namespace aspen::models::testing {

using Feeds = std::map<std::string, graph::HostArray>;
using Rows = std::vector<std::vector<double>>;  // [B*T][width]

struct Naive {
  const Feeds& f;

  const std::vector<double>& P(const std::string& name) const { return f.at(name).data; }
  // table[ids[r]] for each r: [rows][C].
  Rows embed(const std::string& table, const std::string& ids, int64_t C) const;
  // LayerNorm over each row with "<name>.weight" and "<name>.bias".
  Rows layer_norm(const Rows& x, const std::string& name, double eps) const;
  // y = x W (+ "<name>.bias"); W "<name>.weight" stored [out, in] (out_in) or [in, out] (in_out).
  Rows linear(const Rows& x, const std::string& name, int64_t in, int64_t out, bool bias,
              WeightLayout layout = WeightLayout::out_in) const;
  // softmax(q k^T / sqrt(D)) v per batch and head, over rows [B*T][H*D]; causal or not; key_valid (a feed name,
  // [B, T] of 0/1) masks padding keys when non-empty. A query with no allowed key gets zeros.
  Rows attention(const Rows& q, const Rows& k, const Rows& v, int64_t B, int64_t T, int64_t H, bool causal,
                 const std::string& key_valid = "") const;
};

void gelu(Rows& x, bool tanh_form);
Rows add(const Rows& a, const Rows& b);
std::vector<double> flatten(const Rows& x);

// Feeds drawn uniform in [-scale, scale) (ids in [0, vocab)), with "positions"
// (when the graph has it) 0..T-1 in every row and "attention_mask" (when it
// has it) all ones.
Feeds model_feeds(const graph::Graph& g, int64_t vocab, double scale, uint64_t seed);

// With a valid `loss`, appends the gradient of every parameter as outputs
// "grad:<name>" first. Compiles at O0 and O2 (verifying each pass), runs on a
// session fed `feeds`, and expects each output within NMSE 1e-10 of the
// interpreter's (rounded to dtype; outputs below RMS 1e-2 are measured against
// that floor), and no reference fallback.
void expect_compiled_matches(graph::Graph& g, const Feeds& feeds, graph::ValueId loss = {});

}  // namespace aspen::models::testing
