// bench/train_bench.h: `aspen bench train`.
//
// One training step of GPT-2 124M (12 layers, d_model 768, 12 heads, vocab
// 50257, lm_head tied to wte), micro-batch 4 x sequence 256, compiled as the
// trainer compiles it: models::build_gpt2 with the loss, graph::append_gradients
// for every parameter, train::append_adamw (weight decay 0.1, none on biases
// and LayerNorms), compiler::compile with matmuls in f32 or bf16 (f32 master
// weights, optimizer state and partials), a runtime::Session on `threads`
// threads. Weights random, N(0, 0.02) (LayerNorms 1 and 0); tokens and targets
// random. Per dtype:
//   tokens_per_s   batch * seq / the median step time over `steps` timed
//                  steps, after one warm-up step (tokens_per_s_best: the
//                  fastest step)
//   mfu            tokens_per_s * FLOPs per token / the peak the bench
//                  measures in the same process (f32: an FMA loop; bf16:
//                  VDPBF16PS or AMX; bench/common.h). FLOPs per token =
//                  6 * N_matmul (every matmul parameter, the tied lm_head
//                  included) + 12 * n_layer * seq * d_model (QK^T and AV,
//                  forward and backward, the causal mask counted in full, as
//                  PaLM's and nanoGPT's MFU do)
//   planned_peak_bytes  the memory plan's arena + parameters + optimizer
//                  state + constants
//   peak_rss_bytes the process's high-water RSS (VmHWM) at the end
// Each dtype runs in a forked child process (so f32 and bf16 never share a
// heap or an RSS high-water mark), which reports back through a pipe. The
// parent does nothing else before forking: call it from a process that has not
// yet started OpenMP or other threads (the `aspen` command line).
//
// The PyTorch peer (bench/torch_train.py: transformers' GPT2LMHeadModel,
// dropout 0, torch.optim.AdamW, 2 threads, the OpenMP wait policy aspen runs with; f32 eager
// and bf16 autocast, each in its own process; with `compile` also torch.compile'd, and the faster mode counts)
// runs only when `python` names an interpreter; it runs right after aspen's row of the same dtype, and the table
// prints aspen / PyTorch beside the goals of issue W1.4.
//
// --replicas R: one device (the fused step, `threads` threads) against R
// data-parallel replicas of one thread (micro-batch batch / R each, gradients
// reduced to their shard's replica, sharded AdamW), both api::TrainingModel,
// each in its own child process; tokens/s of the median step and their ratio;
// and the replicas again with the gradient exchange after the backward pass
// (DataParallelOptions::overlap off): the overlap's gain.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct TrainBenchOptions {
  bool json = false;
  int threads = 2;
  int64_t steps = 5;                                  // timed steps per dtype, after one warm-up step
  std::vector<std::string> dtypes = {"f32", "bf16"};  // matmul compute type
  std::string python;    // interpreter with torch and transformers; empty or "none": no peer
  bool compile = false;  // the peer also runs torch.compile'd; its faster mode counts (PyTorch's best)
  bool quick = false;    // a tiny GPT-2 (2 layers, d_model 64, vocab 512), batch 2 x 32, 1 timed step
  bool profile = false;  // print the per-op summary of the timed steps
  std::string profile_dir;  // and write each row's profile into profile_dir/<dtype>[-<layout>] (docs/profile.md)
  // A Hugging Face GPT-2 directory to fine-tune instead of the random 124M:
  // its shape and weights (the sequence is min(256, n_positions)); the
  // PyTorch peer loads the same directory.
  std::string model;
  // "gpt2" (GPT-2 124M), "bert" (below) or "llama": a Llama-shaped 124M (12 layers, d_model 768, 12 heads over 4 kv heads,
  // SwiGLU 2048, vocab 32000, untied head); the PyTorch peer runs transformers' LlamaForCausalLM.
  std::string family = "gpt2";
  // > 1: instead of the table above, data parallel: `replicas` replicas of
  // one thread each against one device of `threads` threads, on the same
  // global batch, both through api::TrainingModel as `aspen train` runs them
  // (issue W1.5's goal: tokens/s ratio >= 0.95).
  int replicas = 0;
  // Instead of the table above: packed against unpacked training of the same slots (issue W2.5's goal:
  // tokens/s ratio >= 0.95): rows of `seq` tokens holding `documents` documents each (segment ids, positions
  // restarting: the block-diagonal causal mask) against the same rows as one sequence, per dtype, each in its
  // own child process. 0: off.
  int64_t documents = 0;
  int64_t batch = 0, seq = 0;  // > 0: the micro-batch and sequence instead of 4 x 256 (bert: 1 x 4096)
  // family "bert": masked-LM training of all-MiniLM-L6-v2's shape (its positions grown to seq), the PyTorch peer
  // transformers' BertForMaskedLM (dense SDPA). `attention`: a sparse layout's kind (bigbird, bslongformer,
  // fixed, variable, local_sliding_window; "" or dense: none) in blocks of `block` (0: 64), measured beside the
  // same model with dense attention (speedup_vs_dense).
  std::string attention;
  int64_t block = 0;
  // bert: the MLM head's rows per example (aspen train's data.max_predictions); -1: 15 % of seq plus six
  // standard deviations, as aspen train's default; 0 (or seq): every position, as Hugging Face's head.
  int64_t predictions = -1;
};

Status run_train_bench(const TrainBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
