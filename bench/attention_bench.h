// bench/attention_bench.h: `aspen bench attention`.
//
// Self-attention (B = 1, S = T) for each T, mask, dtype and pass: aspen's
// memory-efficient kernels (kernels/attention.h) against PyTorch's
// scaled_dot_product_attention on the same machine in the same run
// (bench/torch_attention.py, unless python is "none"). Masks:
//   causal     dense causal: PyTorch's is_causal flash kernel
//   local      a causal window of `window` keys
//   blockdiag  `documents` packed documents, causal within each (segment ids)
//   bigbird    DeepSpeed's BigBird layout of `block`-token blocks (1 random,
//              3 sliding, 1 global block; bidirectional), kernels/attention_layout.h
//   longformer DeepSpeed's BSLongformer layout (3 sliding blocks, global block 0)
// PyTorch takes the masked rows as a dense boolean attn_mask (its CPU kernel
// cannot skip the blocks a mask removes). Passes: fwd, and fwd_bwd (forward,
// then backward of the same call). Dtypes: f32, and bf16 (aspen's bf16 kernels, out and gradients f32;
// PyTorch's SDPA on bf16 tensors). aspen's rows and the peer's run in `rounds` interleaved rounds, the
// machine's FMA peak measured before and after each (NOTE [guarded rows]): a round whose peak moved by more
// than 5 % is left out (all kept and the rows flagged "disturbed" when every round moved). Reports the best
// time of each over the rounds used, with its spread, the peak
// scratch bytes aspen allocates, ratio_vs_pytorch (PyTorch's time / aspen's)
// and, on masked rows, speedup_vs_dense (aspen's causal time / this row's).
// Causal forward rows up to T = 2048 also time the naive definition
// (ref::attention_forward, materialized scores, one thread) as a check. The
// layout rows give PyTorch the layout expanded to a per-head boolean mask
// (written as .npy files for the peer) up to T = `peer_layout_max_t`: beyond,
// that mask alone is gigabytes.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct AttentionBenchOptions {
  std::vector<int64_t> t = {1024, 4096, 8192};
  std::vector<std::string> masks = {"causal", "local", "blockdiag", "bigbird", "longformer"};
  std::vector<std::string> passes = {"fwd", "fwd_bwd"};
  std::vector<std::string> dtypes = {"f32", "bf16"};
  int64_t heads = 4;
  int64_t d = 64;
  int64_t window = 256;   // local: keys per query
  int64_t documents = 8;  // blockdiag: equal documents per row
  int64_t block = 64;     // bigbird, longformer: tokens per layout block
  int64_t peer_layout_max_t = 8192;
  int threads = 2;
  bool json = false;
  int repeats = 3;
  int rounds = 3;  // NOTE [guarded rows]: aspen's rows then the peer's, between two FMA peaks, this many times
  std::string python = "python3";  // runs bench/torch_attention.py; "" or "none": no peer
  bool flex = false;  // the peer also times FlexAttention on the fwd rows (compiles per row: minutes)
};

// One line per (T, mask, dtype, pass) (a table, or with json one object per line:
// {"bench":"attention","mask":..,"T":..,"dtype":"f32"|"bf16","pass":"fwd"|"fwd_bwd","seconds":..,
//  "peak_bytes":..,"heads":..,"d":..,"threads":..[,"pytorch_seconds":..,"ratio_vs_pytorch":..]
//  [,"speedup_vs_dense":..][,"naive_seconds":..][,"flex_seconds":..,"ratio_vs_flex":..],
//  "seconds_spread":{"min","median","max"}[,"pytorch_seconds_spread":{..}],"rounds_used":..,"rounds":..,
//  "peak_gflops_min":..,"peak_gflops_max":..[,"disturbed":true]}).
Status run_attention_bench(const AttentionBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
