#include "models/tensor_parallel.h"

#include <cstring>

namespace aspen::models {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Shape with_dim(const Shape& s, int axis, int64_t v) {
  std::vector<int64_t> d(s.begin(), s.end());
  d[size_t(axis)] = v;
  return Shape::make(d.data(), int(d.size())).value();
}

// Copies columns [from, from + n) of every row of `src` ([rows, src_cols]) to
// columns [to, to + n) of `dst` ([rows, dst_cols]).
void copy_columns(const Tensor& src, int64_t src_cols, int64_t from, Tensor& dst, int64_t dst_cols, int64_t to,
                  int64_t n, int64_t rows) {
  const size_t e = dtype_size(src.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst.raw()) + (size_t(r * dst_cols + to)) * e,
                static_cast<const char*>(src.raw()) + (size_t(r * src_cols + from)) * e, size_t(n) * e);
}

}  // namespace

ShardKind shard_kind(const std::string& name, bool vocab_parallel) {
  if (vocab_parallel)
    for (const char* table : kVocabTableNames)
      if (ends_with(name, table)) return ShardKind::rows;
  // GPT-J (torch.nn.Linear: [out, in]): a column-parallel projection's output
  // channels are the weight's rows, a row-parallel one's input channels its columns.
  if (ends_with(name, "attn.q_proj.weight") || ends_with(name, "attn.k_proj.weight") ||
      ends_with(name, "attn.v_proj.weight") || ends_with(name, "mlp.fc_in.weight"))
    return ShardKind::rows;
  if (ends_with(name, "mlp.fc_in.bias") || ends_with(name, "attn.out_proj.weight") ||
      ends_with(name, "mlp.fc_out.weight"))
    return ShardKind::columns;
  // The Llama family (nn.Linear): q, k, v and the SwiGLU's gate and up are column parallel (k and v split
  // by kv heads), o_proj and down_proj row parallel; their biases (Qwen2's q, k, v) follow the outputs.
  if (ends_with(name, "mlp.gate_proj.weight") || ends_with(name, "mlp.up_proj.weight")) return ShardKind::rows;
  if (ends_with(name, "attn.q_proj.bias") || ends_with(name, "attn.k_proj.bias") ||
      ends_with(name, "attn.v_proj.bias") || ends_with(name, "mlp.gate_proj.bias") ||
      ends_with(name, "mlp.up_proj.bias") || ends_with(name, "attn.o_proj.weight") ||
      ends_with(name, "mlp.down_proj.weight"))
    return ShardKind::columns;
  if (vocab_parallel && ends_with(name, "lm_head.weight")) return ShardKind::rows;
  if (vocab_parallel && ends_with(name, "lm_head.bias")) return ShardKind::columns;
  // GPT-2 (Conv1D: [in, out]).
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) return ShardKind::qkv_columns;
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) return ShardKind::columns;
  if (ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight")) return ShardKind::rows;
  return ShardKind::replicated;
}

Result<Tensor> shard_weight(const std::string& name, const Tensor& full, int rank, int shards, bool vocab_parallel) {
  if (shards < 1 || rank < 0 || rank >= shards)
    return Status::invalid_argument("tensor parallel: rank of '" + name + "'", "in [0, " + std::to_string(shards) + ")",
                                    std::to_string(rank));
  const ShardKind kind = shard_kind(name, vocab_parallel);
  if (kind == ShardKind::replicated || shards == 1) return full.clone();
  const Shape& s = full.shape();
  const int64_t cols = s[-1], rows = full.numel() / cols;
  if (kind == ShardKind::rows) {
    if (s.rank() != 2 || s[0] % shards != 0)
      return Status::invalid_argument("tensor parallel: '" + name + "'", "rows divisible by " + std::to_string(shards),
                                      s.to_string());
    const int64_t n = s[0] / shards;
    Tensor out(full.dtype(), with_dim(s, 0, n));
    const size_t row = size_t(cols) * dtype_size(full.dtype());
    std::memcpy(out.raw(), static_cast<const char*>(full.raw()) + size_t(rank * n) * row, size_t(n) * row);
    return out;
  }
  const int64_t blocks = kind == ShardKind::qkv_columns ? 3 : 1;  // q | k | v each split
  if (cols % (blocks * shards) != 0)
    return Status::invalid_argument("tensor parallel: '" + name + "'",
                                    "a last dimension divisible by " + std::to_string(blocks * shards), s.to_string());
  const int64_t block = cols / blocks, n = block / shards;
  Tensor out(full.dtype(), with_dim(s, s.rank() - 1, blocks * n));
  for (int64_t k = 0; k < blocks; ++k) copy_columns(full, cols, k * block + rank * n, out, blocks * n, k * n, n, rows);
  return out;
}

Result<Tensor> gather_weight(const std::string& name, std::span<const Tensor* const> parts, bool vocab_parallel) {
  const int shards = int(parts.size());
  if (shards < 1) return Status::invalid_argument("tensor parallel: gather '" + name + "'", "at least one part", "none");
  const ShardKind kind = shard_kind(name, vocab_parallel);
  const Tensor& first = *parts[0];
  if (kind == ShardKind::replicated || shards == 1) return first.clone();
  const Shape& s = first.shape();
  const int64_t cols = s[-1], rows = first.numel() / cols;
  if (kind == ShardKind::rows) {
    Tensor out(first.dtype(), with_dim(s, 0, s[0] * shards));
    for (int r = 0; r < shards; ++r)
      std::memcpy(static_cast<char*>(out.raw()) + size_t(r) * first.nbytes(), parts[size_t(r)]->raw(), first.nbytes());
    return out;
  }
  const int64_t blocks = kind == ShardKind::qkv_columns ? 3 : 1, n = cols / blocks, block = n * shards;
  Tensor out(first.dtype(), with_dim(s, s.rank() - 1, cols * shards));
  for (int r = 0; r < shards; ++r)
    for (int64_t k = 0; k < blocks; ++k)
      copy_columns(*parts[size_t(r)], cols, k * n, out, cols * shards, k * block + r * n, n, rows);
  return out;
}

Status check_tensor_parallel(const std::string& family, int64_t n_head, int64_t ff, int64_t vocab,
                             const CausalLmOptions& o) {
  const int64_t T = o.tensor_parallel;
  const std::string tp = family + ": tensor_parallel " + std::to_string(T);
  if (T < 1) return Status::invalid_argument(family + ": tensor_parallel", ">= 1", std::to_string(T));
  if (n_head % T != 0)
    return Status::invalid_argument(tp, "a divisor of n_head (" + std::to_string(n_head) + ")", std::to_string(T));
  if (ff % T != 0)
    return Status::invalid_argument(tp, "a divisor of the MLP width (" + std::to_string(ff) + ")", std::to_string(T));
  if (o.vocab_parallel && T == 1)
    return Status::invalid_argument(family + ": vocab_parallel",
                                    "tensor_parallel > 1 (it splits the vocabulary over the tensor shards)",
                                    "tensor_parallel 1");
  if (o.vocab_parallel && vocab % T != 0)
    return Status::invalid_argument(family + ": vocab_parallel over " + std::to_string(T) + " shards",
                                    "a vocabulary divisible by " + std::to_string(T), std::to_string(vocab),
                                    "pad the vocabulary (model.vocab) or keep it whole on every shard");
  return Status();
}

bool is_vocab_parallel(const graph::Graph& g) { return g.find_parameter(kVocabOffsetName).has_value(); }

namespace {
graph::Attrs group_attrs(int64_t shards) { return {{"group", std::string("tensor")}, {"group_size", shards}}; }
graph::Attrs sum_attrs(int64_t shards) {
  graph::Attrs a = group_attrs(shards);
  a.set("reduce", std::string("sum"));
  return a;
}
}  // namespace

graph::ValueId vocab_parallel_embed(graph::Builder& b, graph::ValueId table, graph::ValueId ids, graph::ValueId offset,
                                    DType dtype, int64_t shards) {
  const int64_t vocab = b.status().is_ok() ? b.type(table).shape[0] * shards : 0;  // an id outside it is an error
  graph::ValueId rows = b.op1(graph::OpKind::gather, {table, ids, offset}, {{"vocab", vocab}});
  if (b.status().is_ok() && b.type(rows).dtype != dtype) rows = b.cast(rows, dtype);
  return b.op1(graph::OpKind::all_reduce, {rows}, sum_attrs(shards));
}

graph::ValueId vocab_parallel_loss(graph::Builder& b, graph::ValueId logits, graph::ValueId targets,
                                   graph::ValueId offset, int64_t shards) {
  if (!b.status().is_ok()) return graph::ValueId{};
  const Shape s = b.type(logits).shape;  // [.., V/T]
  const int64_t Vl = s[-1], R = s.numel() / Vl;
  const graph::ValueId z = b.reshape(logits, {R, Vl});
  // The global row maxima: every shard's, gathered, then their maximum.
  const graph::ValueId m = b.op1(graph::OpKind::reduce_max, {z}, {{"axes", std::vector<int64_t>{1}}});
  const graph::ValueId all = b.op1(graph::OpKind::all_gather, {m}, group_attrs(shards));  // [T·R]
  const graph::ValueId M = b.op1(graph::OpKind::reduce_max, {b.reshape(all, {shards, R})},
                                 {{"axes", std::vector<int64_t>{0}}});
  const graph::Attrs a = {{"group_size", shards}};
  const std::vector<graph::ValueId> st = b.op(graph::OpKind::vocab_ce_stats, {z, targets, offset, M}, a);
  if (st.size() != 2) return graph::ValueId{};
  // One all-reduce for both sums: [2, R].
  const graph::ValueId both = b.op1(graph::OpKind::all_reduce,
                                    {b.concat({b.reshape(st[0], {1, R}), b.reshape(st[1], {1, R})}, 0)},
                                    sum_attrs(shards));
  const graph::ValueId S = b.reshape(b.slice(both, 0, 0, 1), {R}), Zt = b.reshape(b.slice(both, 0, 1, 2), {R});
  return b.op1(graph::OpKind::vocab_ce_loss, {z, targets, offset, M, S, Zt}, a);
}

graph::ValueId vocab_parallel_gather_logits(graph::Builder& b, graph::ValueId logits, int64_t shards) {
  if (!b.status().is_ok()) return graph::ValueId{};
  const Shape s = b.type(logits).shape;  // [B, S, V/T]
  const graph::ValueId all = b.op1(graph::OpKind::all_gather, {logits}, group_attrs(shards));  // [T·B, S, V/T]
  const graph::ValueId parts = b.transpose(b.reshape(all, {shards, s[0], s[1], s[2]}), {1, 2, 0, 3});
  return b.reshape(parts, {s[0], s[1], shards * s[2]});
}

}  // namespace aspen::models
