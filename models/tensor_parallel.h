// models/tensor_parallel.h: the Megatron tensor-parallel layout of the GPT-2
// family's weights (CausalLmOptions::tensor_parallel builds the shard graph).
//
// With T shards, shard r holds:
//   attn.c_attn.weight [C, 3C/T], .bias [3C/T]   columns: its heads of q, of k, of v
//   attn.c_proj.weight [C/T, C]                  rows: the same heads (row parallel)
//   mlp.c_fc.weight [C, F/T], .bias [F/T]        columns: its slice of the hidden units
//   mlp.c_proj.weight [F/T, C]                   rows: the same units (row parallel)
// and every other weight whole (LayerNorms, the row-parallel biases, added
// once after the all-reduce, wte, wpe). The shard graph sums the row-parallel
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
#include "models/gpt2.h"

namespace aspen::models {

enum class ShardKind { replicated, columns, qkv_columns, rows };
// How the GPT-2 weight `name` is laid out across shards.
ShardKind gpt2_shard_kind(const std::string& name);

// Shard `rank` of `shards` of the full weight `name` (a copy; whole when replicated).
Result<Tensor> shard_weight(const std::string& name, const Tensor& full, int rank, int shards);
// The full weight from every shard's part, in rank order.
Result<Tensor> gather_weight(const std::string& name, std::span<const Tensor* const> parts);

}  // namespace aspen::models
