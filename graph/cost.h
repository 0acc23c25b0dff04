// graph/cost.h: what a node costs in arithmetic, for profiles and cost models.
#pragma once

#include "graph/graph.h"

namespace aspen::graph {

// NOTE [node FLOPs]: the floating-point operations of a node's products, two per multiply-add, counted as
// model FLOPs are (what MFU divides by the peak): matmul, matmul_q and matmul_group 2·M·N·K; attention
// 2·B·H·T·S·(D + Dv) with every mask counted in full (the kernels skip masked blocks: their achieved rate
// reads high on causal masks, as PyTorch's FLOP counter's does), attention_grad twice the forward; conv and
// its two gradients 2·(output or dy elements)·(weight elements per output channel); lstm and lstm_grad the
// recurrence's 2·T·B·H·4H. Every other op counts 0: its cost is bytes, not products. The sum over one
// training step's instructions is 6·(parameters multiplied)·tokens plus attention's share: the figure the
// train bench's MFU uses.
double node_flops(const Graph& g, const Node& n);

}  // namespace aspen::graph
