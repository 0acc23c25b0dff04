// kernels/attention_layout.h: block-sparse attention layouts, DeepSpeed's
// "sparsity configs" (deepspeed/ops/sparse_attention/sparsity_config.py,
// DeepSpeed 0.14.4; later versions removed it) as pure layout generators.
//
// A layout splits a sequence of seq_len tokens into blocks = seq_len / block
// blocks and says, per head, which key blocks each query block attends:
// bits [heads, blocks, blocks], 1 = attend. It plugs into attention_forward
// and attention_backward through AttentionMask (kernels/attention.h):
//
//   SparsityConfig c = SparsityConfig::bigbird(/*num_heads=*/8);
//   c.block = 64;
//   c.seed = 1234;  // which random blocks (see below)
//   ASPEN_ASSIGN_OR_RETURN(BlockLayout l, make_layout(c, /*seq_len=*/4096));
//   AttentionMask mask{.layout = l.bits, .layout_block = l.block, .layout_heads = l.heads};
//
// make_layout gives the layout DeepSpeed's make_layout(seq_len) gives, bit for
// bit (kernels/attention_layout_test.cc checks it against goldens made by
// scripts/golden/make_sparsity_golden.py from DeepSpeed itself), except for the
// random blocks of Variable and BigBird: DeepSpeed draws them with Python's
// random.sample, aspen with Philox (core/philox.h) from (seed, layout head,
// query block). The count per row and the candidates are DeepSpeed's; only
// which candidates are drawn differs, and the same seed gives the same layout
// on every machine.
//
// DeepSpeed's quirks are reproduced on purpose (NOTEs in attention_layout.cc):
// sliding windows reach num_sliding_window_blocks / 2 blocks to each side (an
// even window acts as the next odd one; a unidirectional window of 3 keeps 2
// blocks), Fixed's and Variable's
// unidirectional global groups attend themselves whole (past the diagonal),
// unidirectional Variable still draws random blocks from the whole row, and
// Fixed with fewer blocks than num_global_blocks follows Python's negative
// slicing.
//
// Every input DeepSpeed rejects is an InvalidArgument Status here (never an
// abort), and so are a few DeepSpeed accepts by accident of Python (negative
// indices or counts, which Python would count from the end or ignore; no local
// window or one of size <= 0; seq_len <= 0). Messages name the kind, the field,
// what was expected and what was found:
//   "fixed sparsity: num_local_blocks: expected a multiple of num_global_blocks (3), found 4"
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::kernels {

// A block-sparse layout: bits[(h * blocks + q) * blocks + k] is 1 when query
// block q of head h attends key block k, else 0. block is the tokens per block.
struct BlockLayout {
  int64_t heads = 0, blocks = 0, block = 0;
  std::vector<uint8_t> bits;  // [heads, blocks, blocks]

  // bits at (h, q, k); indices out of range are a bug (ASPEN_CHECK).
  bool at(int64_t h, int64_t q, int64_t k) const;
  // The nonzero blocks, over all heads.
  int64_t count() const;
  // count() / (heads * blocks * blocks); 0 for an empty layout.
  double density() const;
};

// The most blocks a layout may hold (heads * blocks * blocks): 4 GiB of bits.
inline constexpr int64_t kMaxLayoutBlocks = int64_t(1) << 32;

// The first `blocks` query and key blocks of each head of `master` (DeepSpeed's
// SparseSelfAttention slices its master layout so for a shorter sequence): a
// model keeps one layout for its longest context, and every shorter length
// attends as the start of it. InvalidArgument unless 1 <= blocks <=
// master.blocks.
Result<BlockLayout> layout_prefix(const BlockLayout& master, int64_t blocks);

// A user-given layout: heads, blocks and block >= 1, bits.size() ==
// heads * blocks * blocks (at most kMaxLayoutBlocks), every value 0 or 1.
Result<BlockLayout> layout_from_bits(int64_t heads, int64_t blocks, int64_t block, std::vector<uint8_t> bits);

// One of DeepSpeed's sparsity configs. The fields carry DeepSpeed's names and
// meanings; each kind reads only its own (marked by the initials of the kinds
// below) and ignores the rest. The factories set DeepSpeed's defaults for the
// kind; change fields after:
//
//   dense (D): every block (DenseSparsityConfig).
//   fixed (F): FixedSparsityConfig, Sparse Transformers' "fixed" pattern: local
//     windows of num_local_blocks blocks; in each window a group of
//     num_global_blocks blocks, the last ones (with different_layout_per_head,
//     head h takes group h % num_different_global_patterns counting back from
//     the last), is attended by every query block (unidirectional: every one
//     from the group on), and attends every key block with
//     horizontal_global_attention.
//   variable (V): VariableSparsityConfig: local windows of the sizes in
//     local_window_blocks (the last size repeats to the end), global blocks at
//     global_block_indices (or the ranges [global_block_indices[i],
//     global_block_end_indices[i])), num_random_blocks random blocks per row.
//   bigbird (B): BigBirdSparsityConfig: num_random_blocks random blocks per
//     row, a sliding window of num_sliding_window_blocks, and the first
//     num_global_blocks blocks global (rows and columns).
//   bslongformer (L): BSLongformerSparsityConfig: a sliding window and the
//     global blocks of global_block_indices (and global_block_end_indices, as
//     Variable reads them), global as rows and as columns.
//   local_sliding_window (W): LocalSlidingWindowSparsityConfig: the sliding
//     window only, by default unidirectional.
//
// unidirectional attention keeps key blocks <= the query block, except where
// DeepSpeed does not (see the file comment). different_layout_per_head gives
// each head its own layout (F: its own global pattern; V, B: its own random
// blocks); otherwise head 0's layout is copied to every head. D and W have no
// per-head layouts and ignore it.
struct SparsityConfig {
  enum class Kind { dense, fixed, variable, bigbird, bslongformer, local_sliding_window };
  enum class Attention { bidirectional, unidirectional };

  Kind kind = Kind::dense;
  int64_t num_heads = 1;                               // >= 1
  int64_t block = 16;                                  // tokens per block, >= 1
  bool different_layout_per_head = false;              // F V B L
  int64_t num_local_blocks = 4;                        // F: >= 1, a multiple of num_global_blocks
  int64_t num_global_blocks = 1;                       // F: >= 1; B: >= 0 (<= the blocks of a row)
  Attention attention = Attention::bidirectional;      // F V B L W (W's default: unidirectional)
  bool horizontal_global_attention = false;            // F V: bidirectional only
  int64_t num_different_global_patterns = 1;           // F: >= 1, <= num_local_blocks / num_global_blocks;
                                                       //    > 1 needs different_layout_per_head
  int64_t num_random_blocks = 0;                       // V B (B's default: 1): >= 0, <= the blocks of a row;
                                                       //   unidirectional B: <= 1 (row 0 has one candidate)
  std::vector<int64_t> local_window_blocks = {4};      // V: at least one, each >= 1
  std::vector<int64_t> global_block_indices = {0};     // V L: each >= 0; past the last block: ignored
  std::vector<int64_t> global_block_end_indices = {};  // V L: empty (DeepSpeed's None) or one per
                                                       //   index, each > its start index
  int64_t num_sliding_window_blocks = 3;               // B L W: >= 0, <= the blocks of a row
  uint64_t seed = 0;                                   // V B: the Philox key of the random blocks

  // DeepSpeed's defaults for each kind.
  static SparsityConfig dense(int64_t heads);
  static SparsityConfig fixed(int64_t heads);
  static SparsityConfig variable(int64_t heads);
  static SparsityConfig bigbird(int64_t heads);
  static SparsityConfig bslongformer(int64_t heads);
  static SparsityConfig local_sliding_window(int64_t heads);
  // The factory of `kind`.
  static SparsityConfig of(Kind kind, int64_t heads);
};

// "dense", "fixed", "variable", "bigbird", "bslongformer", "local_sliding_window".
const char* sparsity_kind_name(SparsityConfig::Kind kind);
// The kind of one of those names; InvalidArgument naming "kind" and the names otherwise.
Result<SparsityConfig::Kind> parse_sparsity_kind(const std::string& name);
// DeepSpeed's attention strings: "unidirectional" or "bidirectional", exactly
// (DeepSpeed's Fixed, Variable and BigBird reject any other string).
Result<SparsityConfig::Attention> parse_attention(const std::string& s);
const char* attention_name(SparsityConfig::Attention a);

// The keys DeepSpeed's constructor of `kind` takes besides num_heads, in its order, joined by ", "
// (bigbird: "block, different_layout_per_head, num_random_blocks, num_sliding_window_blocks,
// num_global_blocks, attention"); without a kind, every field's key once.
std::string sparsity_keys(SparsityConfig::Kind kind);
std::string sparsity_keys();
// Whether DeepSpeed's constructor of `kind` takes `key` (a key of sparsity_keys()).
bool sparsity_reads(SparsityConfig::Kind kind, const std::string& key);

// The checks that do not depend on seq_len (DeepSpeed's constructors).
[[nodiscard]] Status validate(const SparsityConfig& c);

// DeepSpeed's make_layout(seq_len): heads = num_heads, blocks = seq_len /
// block, block = block. seq_len is a positive multiple of block; the config is
// valid (validate) and fits seq_len's blocks (num_random_blocks,
// num_sliding_window_blocks, B's num_global_blocks at most the blocks of a
// row); the layout has at most kMaxLayoutBlocks blocks.
Result<BlockLayout> make_layout(const SparsityConfig& c, int64_t seq_len);

// The random blocks make_layout adds: [num_heads, blocks, r] key block
// indices, each row's r distinct and increasing, with r = num_random_blocks
// for variable and bigbird and 0 for the other kinds. Candidates: every key
// block, except unidirectional bigbird: key blocks <= the query block. Drawn
// from Philox stream (layout head << 32 | query block) under seed, where the
// layout head is h with different_layout_per_head and 0 without. Same checks
// as make_layout.
Result<std::vector<int64_t>> random_blocks(const SparsityConfig& c, int64_t seq_len);

// T5's relative position buckets (transformers' T5Attention._relative_position_bucket):
// [T, S] bucket ids in [0, num_buckets) for query i at position kv_offset + i
// and key j, from the relative position j - (kv_offset + i): exact buckets
// for the first num_buckets / 2 distances (per direction when bidirectional,
// which halves the buckets and gives keys ahead the upper half), then
// logarithmic ones up to max_distance, the last bucket beyond. The logarithm
// is computed in f32 as PyTorch computes it, so the ids are transformers'
// (kernels/attention_layout_test.cc checks them against its goldens). A
// trainable bias gathers a [num_buckets, H] table with these ids
// (models/blocks.h t5_relative_bias); attention's bias gradient reaches it.
// InvalidArgument unless num_buckets >= 2 (>= 4 when bidirectional),
// max_distance > num_buckets / 2 (per direction), and T, S, kv_offset >= 0.
Result<std::vector<int32_t>> t5_relative_buckets(int64_t T, int64_t S, int64_t kv_offset, bool bidirectional,
                                                 int64_t num_buckets, int64_t max_distance);

}  // namespace aspen::kernels
