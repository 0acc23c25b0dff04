// models/tensor_parallel.h: the Megatron tensor-parallel layout of the GPT-2
// and GPT-J families' weights (CausalLmOptions::tensor_parallel builds the
// shard graph).
//
// With T shards, shard r holds:
//   attn.c_attn.weight [C, 3C/T], .bias [3C/T]   columns: its heads of q, of k, of v
//   attn.c_proj.weight [C/T, C]                  rows: the same heads (row parallel)
//   mlp.c_fc.weight [C, F/T], .bias [F/T]        columns: its slice of the hidden units
//   mlp.c_proj.weight [F/T, C]                   rows: the same units (row parallel)
// and every other weight whole (LayerNorms, the row-parallel biases, added
// once after the all-reduce, wpe, and wte unless the vocabulary is split).
//
// Vocab parallel (CausalLmOptions::vocab_parallel): shard r also holds rows
// [r·V/T, (r+1)·V/T) of the tied wte ([V/T, C]) and the int32 state
// kVocabOffsetName = r·V/T, which the runtime owner (TrainingModel,
// Generator) sets on each shard's device. The embedding is the shard's rows
// of the ids it holds (gather with an offset: zeros for the others),
// all-reduced; the logits are the shard's [.., V/T] columns, gathered over the
// group only when the graph outputs them; the loss is graph/ops_vocab.cc's
// vocab-parallel cross-entropy (the global row maxima by an all-gather, the
// exp-sums and target logits by all-reduces).
//
// GPT-J (torch.nn.Linear weights, [out, in]), shard r holds:
//   attn.q_proj / k_proj / v_proj.weight [C/T, C]   rows: its heads (column parallel)
//   attn.out_proj.weight [C, C/T]                   columns: the same heads (row parallel)
//   mlp.fc_in.weight [F/T, C], .bias [F/T]          its hidden units
//   mlp.fc_out.weight [C, F/T]                      columns (row parallel)
// and every other weight whole (LayerNorms, fc_out's bias, wte and lm_head
// unless the vocabulary is split: then wte's and lm_head's rows and
// lm_head's bias). Attention and MLP run side by side from one LayerNorm
// (GPT-J's parallel residual), so one all-reduce sums both row-parallel
// products, then fc_out's bias is added once. The shard graph sums the row-parallel
// products over group "tensor" (all_reduce), so every shard ends each block
// with the same activations. Checkpoints hold the full tensors: shard_weight
// cuts a full tensor for shard r and gather_weight puts the shards' back
// together, bit for bit.
//
// Thread-safety: pure functions.
#pragma once

#include <span>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "graph/builder.h"
#include "models/gpt2.h"

namespace aspen::models {

enum class ShardKind { replicated, columns, qkv_columns, rows };
// How the weight `name` (GPT-2 or GPT-J) is laid out across shards (wte, and
// GPT-J's lm_head: rows when the vocabulary is split).
ShardKind shard_kind(const std::string& name, bool vocab_parallel = false);

// Shard `rank` of `shards` of the full weight `name` (a copy; whole when replicated).
Result<Tensor> shard_weight(const std::string& name, const Tensor& full, int rank, int shards,
                            bool vocab_parallel = false);
// The full weight from every shard's part, in rank order.
Result<Tensor> gather_weight(const std::string& name, std::span<const Tensor* const> parts,
                             bool vocab_parallel = false);

// The layout options of a shard graph against the model's sizes: heads, MLP
// units (and with vocab_parallel the vocabulary) divisible by the shards; the
// error names `family` and the numbers.
Status check_tensor_parallel(const std::string& family, int64_t n_head, int64_t ff, int64_t vocab,
                             const CausalLmOptions& options);

// The state naming a vocab-parallel shard's first row of the vocabulary (i32[]).
inline constexpr const char* kVocabOffsetName = "state.tensor.vocab_offset";
// The families' embedding tables, whose rows a vocab-parallel shard splits
// (then lm_head.weight's rows too when it is not tied).
inline constexpr const char* kVocabTableNames[] = {"transformer.wte.weight", "model.embed_tokens.weight"};
// True when `g` is a vocab-parallel shard graph (it has that state).
bool is_vocab_parallel(const graph::Graph& g);

// The graph pieces (group "tensor" of `shards`): the embedding rows of `ids`
// from the shard `table` [V/T, C] (as `dtype`), summed over the shards; the
// mean cross-entropy of the shard logits [.., V/T] against targets [R]; the
// whole logits [B, S, V] from the shards' [B, S, V/T].
graph::ValueId vocab_parallel_embed(graph::Builder& b, graph::ValueId table, graph::ValueId ids, graph::ValueId offset,
                                    DType dtype, int64_t shards);
graph::ValueId vocab_parallel_loss(graph::Builder& b, graph::ValueId logits, graph::ValueId targets,
                                   graph::ValueId offset, int64_t shards);
graph::ValueId vocab_parallel_gather_logits(graph::Builder& b, graph::ValueId logits, int64_t shards);

}  // namespace aspen::models
