// bench/conv_bench.h: `aspen bench conv`.
//
// Every convolution layer of torchvision's resnet18 (64x64 batch 8 and 224x224 batch 1) and of the MNIST
// tutorial's CNN, each pass (forward, backward data, backward weights, and the inference forward with its
// weights kept), timed as aspen runs it (kernels::ConvPlan on the IR's channels-first tensors, reorders
// included) beside oneDNN called directly on the same shape with its inputs already in the layouts the
// primitive chose (no reorders timed: the ceiling a framework keeping blocked layouts would reach),
// interleaved in one run. Reports GFLOP/s of each and ratio_vs_onednn = oneDNN's time / aspen's (W3.2's
// goal: >= 0.95 per layer).
#pragma once

#include <ostream>

#include "core/status.h"

namespace aspen::bench {

struct ConvBenchOptions {
  int threads = 2;
  bool json = false;
  bool quick = false;  // the MNIST rows only, short timings: a smoke test
};

Status run_conv_bench(const ConvBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
