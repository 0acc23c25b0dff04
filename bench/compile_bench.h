// bench/compile_bench.h: `aspen bench compile`.
//
// How long aspen takes to turn GPT-J-6B into a program, for two graphs:
//   gptj6b_inference  the forward pass, output "logits"
//   gptj6b_training   forward + loss + the gradient of every parameter + the
//                     AdamW step (train/optimizer.h) that consumes them and
//                     updates weights and optimizer state in place
// Per graph: building it (build_s; for training, autodiff included), compile()
// at O2 (compile_s: verify, passes, memory plan, lowering), and a load from the
// executable cache (cache_hit_s: read, check and decode the entry, re-plan and
// re-lower). Lowering prepares each instruction's kernel (for example a oneDNN
// matmul primitive made for that shape), so that work is in both compile_s and
// cache_hit_s. No weights are allocated: compiling never touches parameters.
// Also reported: the memory plan's peak (planned_peak_bytes) against every
// transient in its own buffer (naive_bytes), the node count of the graph as
// built, and how many instructions fell back to the reference kernel (slow,
// correct; a number to drive to zero).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "core/status.h"

namespace aspen::bench {

struct CompileBenchOptions {
  bool json = false;
  std::string cache_dir;  // empty: a fresh temporary directory, removed after
  int64_t seq = 1024, batch = 1;
};

Status run_compile_bench(const CompileBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
