// core/weight_copies.h: the budget for copies of the weights kept for speed.
//
// Two things keep a second copy of a model's weights between runs: a session's
// weight-only values (the bf16 casts of f32 weights, compiler/memory_plan.h)
// and a matmul plan's packed weight (NOTE [fixed b] in kernels/matmul_aspen.cc).
// Both are worth it only while the model still fits: together they may take at
// most a quarter of the machine's physical memory. Past that, a session plans
// without the weight-only values and a plan packs its weight on every run, as
// before, so a model that ran still runs.
//
// Thread-safety: take and give may be called from any thread.
#pragma once

#include <cstdint>

namespace aspen {

// Reserves `bytes` of the budget; false (nothing reserved) when they do not fit.
bool take_weight_copy_bytes(int64_t bytes);
void give_weight_copy_bytes(int64_t bytes);
int64_t weight_copy_budget();  // a quarter of physical memory
int64_t weight_copy_bytes();   // reserved now

// The bytes kernels hold now in their own layouts of fixed weights (a matmul plan's packed b, a GEMV's or a
// quantized product's packed rows): resident memory beside the parameters that no memory plan holds (the
// profile names it, NOTE [planned and measured memory]). Each kernel adds what it allocates and takes it
// off when it frees it.
void count_kernel_copy_bytes(int64_t delta);
int64_t kernel_copy_bytes();

}  // namespace aspen
