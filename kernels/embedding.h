// kernels/embedding.h: embedding lookup, forward and backward.
//
//   out[n, :] = table[ids[n], :]        n in [0, N)
//
// ids is int32 [N] (flatten [B, T] into N); table is [V, C]; out is [N, C].
// Every id must lie in [0, V): one that does not is a Status (code
// kOutOfRange) naming its position, its value and V, returned before any
// output is written.
//
// The forward is a row copy (memcpy), the same at every ISA. The backward
// scatter-adds dout rows into dtable in the order n = 0, 1, ..., N-1 for every
// element, so repeated ids sum in a fixed order and the result is bitwise the
// same for any thread count (and equal to the reference): threads split the
// C columns, never the ids, and no atomics are used.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

// out[n, :] = table[ids[n], :]. ids: [N]; table: [V, C]; out: [N, C].
[[nodiscard]] Status embedding_forward(std::span<const int32_t> ids, std::span<const float> table, std::span<float> out,
                                       int64_t N, int64_t V, int64_t C);

// Differentiates out[n, :] = table[ids[n], :]:
//   dtable[v, :] += sum over n with ids[n] == v of dout[n, :]   (n ascending)
// It ACCUMULATES into dtable: the caller zeros dtable first (or keeps earlier
// micro-batches' sums there). Rows of ids that never occur are untouched.
// ids: [N]; dout: [N, C]; dtable: [V, C]. Ids are checked as in the forward
// and dtable is untouched when one is out of range.
[[nodiscard]] Status embedding_backward(std::span<const int32_t> ids, std::span<const float> dout,
                                        std::span<float> dtable, int64_t N, int64_t V, int64_t C);

namespace ref {
// Plain loops, no checks, no threads. Instantiated for float and double.
template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, int64_t N, int64_t V, int64_t C);
template <class T>
void embedding_backward(const int32_t* ids, const T* dout, T* dtable, int64_t N, int64_t V, int64_t C);
}  // namespace ref

}  // namespace aspen::kernels
