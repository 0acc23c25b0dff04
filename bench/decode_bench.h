// bench/decode_bench.h: `aspen bench decode`.
//
// A decode step multiplies a few activation rows by every weight matrix, so it
// runs at the rate the weights stream from memory. For GPT-2-124M's decode
// shapes (M = 1 and 8 rows; the Conv1D layers, W [K, N], and the tied LM head,
// W [N, K]) in f32 and bf16 weights, this times aspen's GEMV (kernels/gemv.h),
// oneDNN's matmul called directly at the same shape, and a read-only sweep of
// the same bytes, interleaved round by round, and reports each as GB/s of
// weights with the ratios aspen/sweep and aspen/oneDNN.
//
// The weights are replicas spread over a pool larger than the last-level
// cache (1 GiB; --quick: 256 MiB, one replica of each layer at least); each
// timed pass visits every replica once, so every byte comes from memory, as
// in a real decode over 12 layers.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct DecodeBenchOptions {
  std::vector<int> threads = {1, 2};
  std::vector<int64_t> rows = {1, 8};  // M
  std::vector<std::string> layers;     // names to run (empty: all)
  std::string family = "gpt2";         // the layers: GPT-2-124M's, or "llama": the Llama-shaped 124M's ([N, K])
  bool f32 = true, bf16 = true;
  // Q8_0 weights (llama.cpp's 8-bit blocks, [N, K] whatever the layer's layout: GGUF stores them so), with
  // aspen's bf16 product on the same layer beside them ("ratio_vs_bf16": W3.4's goal is 1.9x).
  bool q8_0 = true;
  bool q4_0 = true;  // Q4_0 weights likewise (goal: 3x bf16)
  bool q4_k = true;  // Q4_K weights likewise (goal: 3x bf16)
  bool json = false;
  bool quick = false;  // small pool, one round (a smoke test)
  int64_t pool_mib = 1024;  // replicas' pool; a small one (e.g. 8) measures in-cache speed instead
};

Status run_decode_bench(const DecodeBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
