// bench/generate_bench.h: `aspen bench generate`.
//
// GPT-2-124M-shaped (12 layers, d_model 768, 12 heads, vocab 50257) with
// random weights, written as a model directory (config.json +
// model.safetensors, Hugging Face names) in a temporary folder so the PyTorch
// peer loads the very same weights. Rows:
//   decode  batch 1 and 8: tokens/s of single-token steps with the KV cache
//           (greedy, sampling in the program), prompt of 8 tokens not timed:
//           (batch * (N - 1)) / (time(N new tokens) - time(1 new token)).
//   prefill batch 1, T = 256: 256 / time of one prefill (cache filled, last
//           logits, one token drawn).
// Beside each decode row, the memory-bandwidth bound: the bytes a step must
// read (every weight a matmul streams, plus the KV cache the attention reads)
// divided by the machine's read bandwidth, measured in the same run as the
// best of several read-only sweeps (all threads, vector loads) over a buffer
// as large as the weights; fraction_of_bound = tokens_per_s / bound.
// With `model`, a user's own directory (GPT-2 or GPT-J) runs instead: the
// bound counts every matrix it holds except position tables, and its input
// embedding only when the head is tied to it (as a decode step streams them).
// The PyTorch peer (bench/torch_generate.py, same model directory) runs when
// `python3 -c "import torch"` works (or --python names an interpreter that
// has it): its rows and aspen ÷ PyTorch are printed. The llama.cpp peer
// (bench/llama_cpp.py: llama-bench built once per CPU from the PyPI sdist of
// llama-cpp-python, the same directory converted to GGUF in the weights'
// dtype) gives ppN and tgN beside the batch-1 rows: ratio_vs_llama_cpp.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct GenerateBenchOptions {
  bool json = false;
  int threads = 0;             // 0: the free cores
  int64_t new_tokens = 32;     // decode steps timed per row (+1 for the prefill)
  int64_t prefill_tokens = 256;
  std::vector<int64_t> batches = {1, 8};
  // The weights' type. q8_0, q4_0, q4_k: the model converted by llama.cpp's converter (and llama-quantize
  // --pure) into a GGUF file, which aspen runs on its blocks and llama.cpp's rows time too (needs python3 with
  // torch, and llama.cpp built once by bench/llama_cpp.py).
  std::vector<std::string> dtypes = {"f32", "bf16"};
  std::string python = "python3";  // runs bench/torch_generate.py; "" or "none": no peer
  bool llama_cpp = true;       // run bench/llama_cpp.py with `python` (builds llama-bench on first use)
  bool quick = false;          // a 2-layer model and few tokens (smoke tests)
  bool profile = false;        // print the per-op summary of the decode rows' instructions
  std::string profile_dir;     // and write each decode row's profile into profile_dir/decode-b<B>-<dtype>
  int rounds = 2;              // aspen's rows and each peer in turn, this many times; the best of each kept
  // A Hugging Face directory (config.json, safetensors) to run instead of the
  // random GPT-2-124M; its weights are used as they are, and the PyTorch peer
  // loads the same directory.
  std::string model;
  // Without `model`: "gpt2" (the random GPT-2-124M) or "llama" (a random Llama-shaped 124M: 12 heads over 4
  // kv heads, SwiGLU 2048, vocab 32000, untied head; written by models::export_hf_model, so both peers load it).
  std::string family = "gpt2";
};

Status run_generate_bench(const GenerateBenchOptions& options, std::ostream& out);

// A random GPT-2 of `layers` layers (GPT-2-124M's shape otherwise; vocab 50257) as a Hugging Face directory:
// what `bench generate` runs without --model. Returns its weights' bytes.
Result<int64_t> write_random_gpt2(const std::string& dir, int64_t layers, int64_t vocab);

}  // namespace aspen::bench
