// models/gguf_checkpoint.h: the GGUF side of models/weights.h (NOTE [GGUF models] in gguf_checkpoint.cc),
// for weights.cc.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "models/weights.h"

namespace aspen::models {

// `w` (its parameter and type set) bound to the GGUF tensor llama.cpp names for it; NotFound / InvalidArgument
// naming the file, the tensor and the parameter.
Result<WeightBinding> gguf_binding(const Checkpoint& ckpt, WeightBinding w);
// f32 values into `out` (f32, bf16 or f16; rounded to nearest even), as read_weight converts a checkpoint's.
Status narrow_into(std::span<const float> values, Tensor& out);
// The bound GGUF tensor's values (dequantized, transposed when bound so), in the parameter's dtype.
Result<Tensor> read_gguf_weight(const WeightBinding& w);

}  // namespace aspen::models
