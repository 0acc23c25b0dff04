#include "graph/op.h"

#include <array>

#include "core/check.h"
#include "graph/ops_registry.h"

namespace aspen::graph {

namespace {

std::array<OpInfo, kNumOps> build_table() {
  std::array<OpInfo, kNumOps> table;
  OpTable t(table.data());
  register_source_ops(t);
  register_elementwise_ops(t);
  register_logic_ops(t);
  register_shape_ops(t);
  register_reduce_ops(t);
  register_nn_ops(t);
  register_matmul_ops(t);
  register_attention_ops(t);
  register_collective_ops(t);
  register_fused_ops(t);
  register_optim_ops(t);
  register_state_ops(t);
  register_sampling_ops(t);
  register_vocab_ops(t);
  register_dropout_ops(t);
  register_conv_ops(t);
  register_batchnorm_ops(t);
  register_lstm_ops(t);
  register_pool_ops(t);
  register_quant_ops(t);
  // Every op of ASPEN_OPS must have an entry: a missing one is a bug found at start-up.
  for (int i = 0; i < kNumOps; ++i) {
    ASPEN_CHECK(table[i].name != nullptr && table[i].infer != nullptr && table[i].eval != nullptr)
        << "op #" << i << " (" << op_name(OpKind(i)) << ") has no complete table entry";
    ASPEN_CHECK(!(table[i].flags & kSource) || table[i].max_inputs == 0)
        << "op " << op_name(OpKind(i)) << " is marked a source and takes inputs";
    ASPEN_CHECK(!(table[i].flags & kElementwise) || table[i].max_inputs >= 1)
        << "op " << op_name(OpKind(i)) << " is marked elementwise and takes no input";
  }
  return table;
}

constexpr std::array<const char*, kNumOps> kNames = [] {
  std::array<const char*, kNumOps> names{};
#define ASPEN_OP_NAME(name, number) names[number] = #name;
  ASPEN_OPS(ASPEN_OP_NAME)
#undef ASPEN_OP_NAME
  return names;
}();

}  // namespace

void OpTable::define(OpKind op, OpInfo info) {
  OpInfo& slot = table_[int(op)];
  ASPEN_CHECK(slot.name == nullptr) << "op " << op_name(op) << " defined twice";
  info.name = op_name(op);
  slot = std::move(info);
}

const OpInfo& op_info(OpKind op) {
  static const std::array<OpInfo, kNumOps> table = build_table();
  return table.at(size_t(op));
}

const char* op_name(OpKind op) {
  ASPEN_CHECK(int(op) < kNumOps) << "op #" << int(op);
  return kNames[size_t(op)];
}

std::optional<OpKind> op_from_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (name == kNames[size_t(i)]) return OpKind(i);
  return std::nullopt;
}

}  // namespace aspen::graph
