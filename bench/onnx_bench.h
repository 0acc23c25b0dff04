// bench/onnx_bench.h: `aspen bench onnx`, imported ONNX models against onnxruntime.
//
// The cases (bench/onnx_peer.py --export writes them once into `dir`, with torch.export): GPT-2-124M and
// BERT-base shapes with random weights at batch 1 and 8 of 128 tokens. Each is imported
// (models/onnx_import.h), compiled and run, best of `reps` after a warm-up, in f32 and in bf16 compute
// (Options::precision); then onnxruntime runs the same files at its best settings (bench/onnx_peer.py
// --time: all graph optimizations, `threads` intra-op threads) and each row prints aspen's time,
// onnxruntime's and ratio_vs_onnxruntime (its time / aspen's: > 1 is faster). With `model`, one case
// directory (model.onnx, input_<k>.pb: the layout of models/testdata/onnx/) runs instead.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct OnnxBenchOptions {
  bool json = false;
  int threads = 0;  // 0: the free cores
  int reps = 5;
  std::vector<std::string> dtypes = {"f32", "bf16"};  // aspen's compute precision
  std::string python = "python3";                     // runs bench/onnx_peer.py; "" or "none": no export, no peer
  std::string dir;                                    // the cases; default ~/.cache/aspen/bench_onnx[_quick]
  std::string model;                                  // one case directory instead
  bool quick = false;                                 // 2-layer models (a smoke test, not a measurement)
  bool profile = false;                               // print where each row's time goes (per op)
  std::string profile_dir;                            // and write each row's profile into profile_dir/<case>-<dtype>
  std::string trace_dir = {};  // when set, each row's Chrome trace is kept there as <case>_<dtype>.json
};

Status run_onnx_bench(const OnnxBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
