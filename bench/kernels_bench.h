// bench/kernels_bench.h: `aspen bench kernels`.
//
// Bandwidth-bound kernels (LayerNorm, softmax, GELU, AdamW, and a few more)
// on tensors far larger than the caches, reported as bytes moved per second
// beside a STREAM-style copy measured in the same run on buffers of the same
// size. A kernel that moves its bytes at the copy's rate is as fast as memory
// allows.
#pragma once

#include <ostream>

#include "core/status.h"

namespace aspen::bench {

struct KernelsBenchOptions {
  int threads = 2;
  bool json = false;
  bool quick = false;  // small tensors, one repetition: a smoke test only
};

Status run_kernels_bench(const KernelsBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
