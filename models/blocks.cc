#include "models/blocks.h"

#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/attention_layout.h"
#include "kernels/quant.h"

namespace aspen::models {

using graph::Builder;
using graph::OpKind;
using graph::ValueId;

int64_t quantized_row_bytes(const std::string& format, int64_t in) {
  const kernels::QuantFormat* f = kernels::quant_format(format);
  return !f || in % f->block_values != 0 ? 0 : f->row_bytes(in);
}

ValueId linear(Builder& b, ValueId x, const std::string& name, int64_t in, int64_t out, bool bias, DType dtype,
               WeightLayout layout, const QuantizedWeights* quantized) {
  const auto scope = Builder::Scope::at(b, name);  // NOTE [name scopes]: the module's path
  if (const std::string* format = quantized ? quantized->find(name + ".weight") : nullptr) {
    // NOTE [quantized linears]: rows of blocks, [out, in] whatever the layout
    ValueId w = b.parameter(name + ".weight", DType::u8, Shape{out, quantized_row_bytes(*format, in)});
    std::vector<ValueId> args{x, w};
    if (bias) args.push_back(b.parameter(name + ".bias", b.type(x).dtype, Shape{out}));
    return b.op1(OpKind::matmul_q, std::move(args), {{"format", *format}, {"k", in}});
  }
  const bool out_in = layout == WeightLayout::out_in;
  ValueId w = b.parameter(name + ".weight", dtype, out_in ? Shape{out, in} : Shape{in, out});
  std::vector<ValueId> args{x, w};
  if (bias) args.push_back(b.parameter(name + ".bias", b.type(x).dtype, Shape{out}));
  graph::Attrs attrs;
  if (out_in) attrs.set("trans_b", int64_t(1));
  return b.op1(OpKind::matmul, std::move(args), std::move(attrs));
}

ValueId layer_norm(Builder& b, ValueId x, const std::string& name, int64_t C, double eps, DType dtype) {
  const auto scope = Builder::Scope::at(b, name);
  ValueId gamma = b.parameter(name + ".weight", dtype, Shape{C});
  ValueId beta = b.parameter(name + ".bias", dtype, Shape{C});
  std::vector<ValueId> outs = b.op(OpKind::layernorm, {x, gamma, beta}, {{"eps", eps}});
  return outs.empty() ? ValueId{} : outs[0];
}

Result<ValueId> t5_relative_bias(Builder& b, ValueId table, int64_t T, int64_t S, int64_t kv_offset,
                                 bool bidirectional, int64_t max_distance) {
  const Shape ts = b.type(table).shape;
  if (ts.rank() != 2)
    return Status::invalid_argument("t5_relative_bias: table", "[num_buckets, heads]", b.type(table).to_string());
  ASPEN_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         kernels::t5_relative_buckets(T, S, kv_offset, bidirectional, ts[0], max_distance));
  Tensor t(DType::i32, Shape{T, S});
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  const ValueId per_key = b.gather(table, b.constant(std::move(t)));  // [T, S, H]
  return b.reshape(b.transpose(per_key, {2, 0, 1}), {1, ts[1], T, S});
}

ValueId rms_norm(Builder& b, ValueId x, const std::string& name, int64_t C, double eps, DType dtype) {
  const auto scope = Builder::Scope::at(b, name);
  ValueId gamma = b.parameter(name + ".weight", dtype, Shape{C});
  std::vector<ValueId> outs = b.op(OpKind::rmsnorm, {x, gamma}, {{"eps", eps}});
  return outs.empty() ? ValueId{} : outs[0];
}

ValueId mlp(Builder& b, ValueId x, const MlpSpec& s) {
  if (!b.status().is_ok()) return ValueId{};
  const auto scope = Builder::Scope::at(b, graph::common_scope(s.fc_in, s.fc_out));  // "h.3.mlp"
  const DType dtype = s.weight_dtype.value_or(b.type(x).dtype);
  ValueId h = linear(b, x, s.fc_in, s.d_model, s.d_ff, s.bias, dtype, s.layout, s.quantized);
  h = b.gelu(h, /*tanh_form=*/s.activation == Activation::gelu_tanh);
  return linear(b, h, s.fc_out, s.d_ff, s.d_model, s.bias, dtype, s.layout, s.quantized);
}

ValueId attention_core(Builder& b, ValueId q, ValueId k, ValueId v, const AttentionSpec& s,
                       std::optional<ValueId> positions, std::optional<ValueId> key_valid, const KvCacheSpec* cache,
                       std::optional<ValueId> segments, std::optional<ValueId> layout,
                       std::optional<ValueId> dropout_seed, const DropoutShard* dropout_shard) {
  if (!b.status().is_ok()) return ValueId{};
  const Shape qs = b.type(q).shape;  // [B, T, H*D]
  const int64_t B = qs[0], T = qs[1], H = s.n_head, Hk = s.n_kv_head > 0 ? s.n_kv_head : s.n_head, D = s.head_dim;
  const std::vector<int64_t> to_bhtd{0, 2, 1, 3};
  const bool rotate = s.rotary_dim > 0;
  ASPEN_CHECK(!rotate || positions.has_value());  // a caller's bug, not input: rotary needs positions
  graph::Attrs rot{{"rotary_dim", s.rotary_dim}, {"layout", s.rotary_layout}, {"base", s.rope.theta}};
  if (s.rope.scaling != "none") {
    rot.set("scaling", s.rope.scaling);
    rot.set("factor", s.rope.factor);
    rot.set("low_freq_factor", s.rope.low_freq_factor);
    rot.set("high_freq_factor", s.rope.high_freq_factor);
    rot.set("original_max_positions", s.rope.original_max_positions);
  }
  auto heads = [&](ValueId x, int64_t n, bool rotated) {
    ValueId r = b.reshape(x, {B, T, n, D});
    if (rotated)  // [B, T, n, D] is the rotary op's layout: one position row serves every head
      r = b.op1(OpKind::rotary, {r, *positions}, rot);
    return b.transpose(r, to_bhtd);  // [B, n, T, D]
  };
  std::vector<ValueId> args{heads(q, H, rotate), heads(k, Hk, rotate), heads(v, Hk, false)};
  std::string mask = s.mask;
  if (s.window > 0 && mask == "causal") mask = "local";
  if (cache) {
    ASPEN_CHECK(key_valid.has_value());  // a caller's bug: a cache is read through key_valid
    const DType dt = b.type(q).dtype;
    for (size_t i : {size_t(1), size_t(2)}) {
      const ValueId state = b.parameter(i == 1 ? cache->key : cache->value, dt, Shape{B, Hk, cache->len, D});
      const ValueId written = b.op1(OpKind::write_slice, {state, args[i], cache->index}, {{"axis", int64_t(2)}});
      b.update(state, written);
      args[i] = written;
    }
    if (T == 1) mask = "none";  // key_valid alone says which cached positions exist
  }
  if (key_valid) args.push_back(*key_valid);
  ASPEN_CHECK(!(segments && cache));  // a caller's bug: check_kv_cache refuses packed generation
  if (segments) args.push_back(*segments);
  const bool by_position = layout && cache;  // the cache's slots are not positions: look the layout up by them
  ASPEN_CHECK(!by_position || (cache->query_positions && cache->key_positions));  // causal_lm_inputs gives them
  if (layout) args.push_back(*layout);
  if (by_position) {
    args.push_back(*cache->query_positions);
    args.push_back(*cache->key_positions);
  }
  ASPEN_CHECK((s.dropout > 0) == dropout_seed.has_value());  // a caller's bug: dropout reads the run-time seed
  if (dropout_seed) args.push_back(*dropout_seed);
  if (dropout_seed && dropout_shard) args.push_back(dropout_shard->index);
  graph::Attrs attrs{{"scale", 1.0 / std::sqrt(double(D))}, {"mask", mask}};
  if (mask == "local") attrs.set("window", s.window);
  if (layout) attrs.set("layout_block", by_position ? cache->layout_block : T / b.type(*layout).shape[1]);
  if (by_position) attrs.set("layout_positions", int64_t(1));
  if (s.dropout > 0) {
    attrs.set("dropout", s.dropout);
    attrs.set("dropout_stream", s.dropout_stream);
    if (dropout_shard) attrs.set("dropout_heads", dropout_shard->heads);
  }
  std::vector<ValueId> outs = b.op(OpKind::attention, std::move(args), std::move(attrs));
  if (outs.empty()) return ValueId{};
  return b.reshape(b.transpose(outs[0], to_bhtd), {B, T, H * D});  // merge heads: [B, T, H*D]
}

namespace {

Result<std::optional<ValueId>> layout_input(Builder& b, const std::string& family, const CausalLmOptions& o,
                                            int64_t n_head) {
  const kernels::BlockLayout* l = o.layout;
  if (!l) return std::optional<ValueId>();
  const std::string what = family + ": attention layout";
  if (l->heads != 1 && o.tensor_parallel > 1)
    return Status::unimplemented(what, "one layout for every head with tensor_parallel (a shard's graph is every "
                                       "shard's)");
  // With a KV cache the layout covers the cache's slots in whole blocks, looked up by positions (KvCacheSpec).
  const int64_t covered =
      o.kv_cache_len > 0 && l->block > 0 ? (o.kv_cache_len + l->block - 1) / l->block * l->block : o.seq;
  ASPEN_ASSIGN_OR_RETURN(const ValueId v, layout_constant(b, family, *l, covered, n_head));
  return std::optional<ValueId>(v);
}

}  // namespace

Result<ValueId> layout_constant(Builder& b, const std::string& family, const kernels::BlockLayout& l, int64_t seq,
                                int64_t n_head) {
  const std::string what = family + ": attention layout";
  if (l.block < 1 || l.blocks * l.block != seq)
    return Status::invalid_argument(what, "blocks of " + std::to_string(l.block) + " tokens covering seq = " +
                                              std::to_string(seq),
                                    std::to_string(l.blocks) + " blocks");
  if (l.heads != 1 && l.heads != n_head)
    return Status::invalid_argument(what + " heads", "1 or n_head = " + std::to_string(n_head),
                                    std::to_string(l.heads));
  Tensor t(DType::u8, Shape{l.heads, l.blocks, l.blocks});
  std::copy(l.bits.begin(), l.bits.end(), t.data<uint8_t>());
  return b.constant(std::move(t));
}

Result<ValueId> dropout_seed_input(Builder& b, const std::string& family, double p) {
  if (!(p > 0 && p < 1))
    return Status::invalid_argument(family + ": attention_dropout", "a probability in [0, 1)", std::to_string(p));
  return b.input("dropout_seed", DType::i64, Shape{1});
}

Result<CausalLmInputs> causal_lm_inputs(Builder& b, const std::string& family, const CausalLmOptions& o,
                                        int64_t n_head) {
  CausalLmInputs in;
  in.input_ids = b.input("input_ids", DType::i32, Shape{o.batch, o.seq});
  in.positions = b.input("positions", DType::i32, Shape{o.batch, o.seq});
  if (o.attention_mask) in.key_valid = in.attention_mask = b.input("attention_mask", DType::u8, Shape{o.batch, o.seq});
  if (o.with_loss) in.targets = b.input("targets", DType::i32, Shape{o.batch * o.seq});
  if (o.segments) in.segments = b.input("segments", DType::i32, Shape{o.batch, o.seq});
  ASPEN_ASSIGN_OR_RETURN(in.layout, layout_input(b, family, o, n_head));
  if (o.attention_dropout != 0) {
    if (o.kv_cache_len > 0)
      return Status::invalid_argument(family + ": attention_dropout", "0 with a KV cache (generation)",
                                      std::to_string(o.attention_dropout));
    ASPEN_ASSIGN_OR_RETURN(in.dropout_seed, dropout_seed_input(b, family, o.attention_dropout));
    if (o.tensor_parallel > 1)  // each shard its heads' part of the model's pattern
      in.dropout_shard = DropoutShard{.index = b.parameter(kTensorShardIndexName, DType::i32, Shape{}), .heads = n_head};
  }
  if (o.kv_cache_len > 0) {
    in.kv.index = b.input("cache_index", DType::i32, Shape{});
    in.key_valid = in.kv.key_valid = b.input("key_valid", DType::u8, Shape{o.batch, o.kv_cache_len});
    if (o.layout) {
      in.kv.query_positions = in.positions;
      in.kv.key_positions = b.input("key_positions", DType::i32, Shape{o.batch, o.kv_cache_len});
      in.kv.layout_block = o.layout->block;
    }
  }
  return in;
}

KvCacheSpec layer_cache(const KvCacheInputs& in, const CausalLmOptions& o, int64_t layer) {
  const std::string p = std::string(kStatePrefix) + "cache." + std::to_string(layer);
  return KvCacheSpec{.key = p + ".key",
                     .value = p + ".value",
                     .len = o.kv_cache_len,
                     .index = in.index,
                     .layout_block = in.layout_block,
                     .query_positions = in.query_positions,
                     .key_positions = in.key_positions};
}

ValueId embed(Builder& b, ValueId table, ValueId ids, DType dtype) {
  ValueId rows = b.gather(table, ids);
  if (!b.status().is_ok() || b.type(rows).dtype == dtype) return rows;
  return b.cast(rows, dtype);
}

ValueId logits_input(Builder& b, ValueId x, const CausalLmOptions& o) {
  if (!o.last_logits_only || !b.status().is_ok()) return x;
  const int64_t T = b.type(x).shape[1];
  return b.slice(x, 1, T - 1, T);
}

ValueId lm_loss(Builder& b, ValueId logits, ValueId targets) {
  if (!b.status().is_ok()) return ValueId{};
  const Shape s = b.type(logits).shape;  // [B, T, V]
  std::vector<ValueId> ce = b.op(OpKind::cross_entropy, {b.reshape(logits, {s[0] * s[1], s[2]}), targets});
  return ce.empty() ? ValueId{} : ce[0];  // the mean over rows; per-row losses and lse stay for the backward
}

Status check_batch_seq(const std::string& family, int64_t batch, int64_t seq, const std::string& positions_key,
                       int64_t max_positions) {
  if (batch < 1) return Status::invalid_argument(family + ": batch", "a number > 0", std::to_string(batch));
  if (seq < 1 || seq > max_positions)
    return Status::invalid_argument(family + ": seq",
                                    "a number in [1, " + positions_key + " = " + std::to_string(max_positions) + "]",
                                    std::to_string(seq));
  return Status();
}

Status check_kv_cache(const std::string& family, const CausalLmOptions& o, const std::string& positions_key,
                      int64_t max_positions) {
  if (o.kv_cache_len == 0) return Status();
  if (o.kv_cache_len < o.seq || o.kv_cache_len > max_positions)
    return Status::invalid_argument(family + ": kv_cache_len",
                                    "a number in [seq = " + std::to_string(o.seq) + ", " + positions_key + " = " +
                                        std::to_string(max_positions) + "]",
                                    std::to_string(o.kv_cache_len));
  if (o.attention_mask || o.with_loss || o.segments)
    return Status::invalid_argument(family + ": kv_cache_len", "0 with attention_mask, segments or with_loss "
                                    "(key_valid replaces the mask; a cache is for generation)",
                                    std::to_string(o.kv_cache_len));
  return Status();
}

Status check_dim_limits(const std::string& family, std::initializer_list<DimLimit> dims) {
  for (const DimLimit& d : dims)
    if (d.value > d.max)
      return config_key_error(family, d.key, "at most " + std::to_string(d.max) + " (larger than any real model)",
                              std::to_string(d.value));
  return Status();
}

Status config_key_error(const std::string& family, const std::string& key, const std::string& expected,
                        const std::string& found) {
  return Status::invalid_argument(family + " config: " + key, expected, found);
}

}  // namespace aspen::models
