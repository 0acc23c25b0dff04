// graph/ops_registry.h: how the ops_<group>.cc files fill the op table
// (private to graph/).
#pragma once

#include "graph/op.h"

namespace aspen::graph {

class OpTable {
 public:
  explicit OpTable(OpInfo* table) : table_(table) {}
  // Sets the entry for `op`; its name comes from ASPEN_OPS.
  void define(OpKind op, OpInfo info);

 private:
  OpInfo* table_;
};

void register_source_ops(OpTable& t);
void register_elementwise_ops(OpTable& t);
void register_logic_ops(OpTable& t);
void register_shape_ops(OpTable& t);
void register_reduce_ops(OpTable& t);
void register_nn_ops(OpTable& t);
void register_matmul_ops(OpTable& t);
void register_attention_ops(OpTable& t);
void register_collective_ops(OpTable& t);
void register_fused_ops(OpTable& t);
void register_optim_ops(OpTable& t);
void register_state_ops(OpTable& t);
void register_sampling_ops(OpTable& t);
void register_vocab_ops(OpTable& t);
void register_dropout_ops(OpTable& t);
void register_conv_ops(OpTable& t);
void register_batchnorm_ops(OpTable& t);
void register_lstm_ops(OpTable& t);
void register_pool_ops(OpTable& t);
void register_quant_ops(OpTable& t);

}  // namespace aspen::graph
