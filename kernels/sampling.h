// kernels/sampling.h: drawing the next token of each row from its logits, on
// the device (inside the compiled program), with Hugging Face's warpers.
//
// Shapes: logits f32 [B, V], history i32 [B, L] (token ids already in the row:
// prompt and generated; entries < 0 are padding and ignored), per-row settings
// [B], ids i32 [B] out.
//
// Per row b, in this order (HF's LogitsProcessorList order in generate()):
//  1. repetition penalty p = repetition_penalty[b] (HF RepetitionPenaltyLogitsProcessor): for each
//     distinct id h in history[b]: z[h] = x[h] < 0 ? x[h] * p : x[h] / p; every other z[v] = x[v].
//     p = 1 is off.
//  2. temperature t = temperature[b]: t = 0 is greedy, ids[b] = argmax_v z[v] (the lowest index among
//     equal maxima, as torch.argmax), and steps 3-6 are skipped. Otherwise z = z / t.
//  3. top-k k = top_k[b] (HF TopKLogitsWarper; 0 or k >= V is off): keep every v with z[v] >= the
//     k-th largest z (counted with multiplicity), so ties at the cut are all kept.
//  4. top-p q = top_p[b] (HF TopPLogitsWarper; q = 1 is off): over the tokens step 3 kept, with
//     P(v) = softmax(z)[v], keep v iff the mass of the tokens strictly more likely than v is < q:
//         sum_{u kept, z[u] > z[v]} P(u) < q.
//     NOTE [top-p ties]: this is HF's rule (sort ascending, drop where cumsum <= 1 - q, always keep the
//     last) with tokens of equal logit kept or dropped together, as its tie group's last member would
//     be: HF's torch.sort is unstable, so which member of a tie straddling the cut it keeps is unspecified;
//     here the answer does not depend on an order. Without ties at the cut it is exactly HF's set, and the
//     most likely tokens are always kept (min_tokens_to_keep = 1).
//  5. the kept set is {v : z[v] >= c} for one cut c (steps 3 and 4 are both cuts on the value).
//  6. draw: u = uniform(seed, step, b) in [0, 1) (53 bits, below); w[v] = exp(z[v] - max z) for kept v;
//     ids[b] = the first kept v, in ascending index order, whose running sum of w (in f64) exceeds
//     u * sum w (the inverse CDF over the kept tokens in index order).
//
// RNG keying (pinned: the same seed reproduces a generation): the row's uniform is built from Philox
// elements 2b and 2b + 1 of stream `step` under `seed` (core/philox.h): u = (a >> 5) * 2^-27 + (b >> 6) *
// 2^-53. It depends only on (seed, step, b), b the row's slot in the batch, never on the thread count.
//
// Fast path cost per row (V = vocabulary): one pass to scale, one for the max; top-k: one scan against a
// size-k min-heap (16 lanes compared at once on AVX-512; O(V + k log k log V) expected); top-p without
// top-k: one exp pass, then candidates above a probability cut that is lowered until they hold the
// nucleus (typically one more pass), sorted alone; with neither, one exp pass and a blocked f64 inverse-CDF
// walk. A full sort of V happens only when the nucleus is most of the vocabulary.
// f32 vs f64: the reference in T computes z in T and every probability in f64; the fast path computes z
// exactly as ref::sample_tokens<float> and probabilities from an f32 exp, so it picks the same token
// except where a cumulative sum lands within ~1e-6 of u or of q (genuinely ambiguous cases).
//
// Errors (Status, before anything is written): temperature not a finite number >= 0, top_k < 0, top_p not
// in (0, 1], repetition_penalty not a finite number > 0, a history id >= V, a NaN or +inf logit, a
// sampled row (t > 0) whose logits are all -inf.
//
// Thread-safety: pure functions of their arguments; rows are spread over the calling thread's OpenMP team
// (at most one row per workspace slot at once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"

namespace aspen::kernels {

// The per-row settings: each span holds B values (see above for meanings).
struct SamplingParams {
  std::span<const float> temperature;
  std::span<const int32_t> top_k;
  std::span<const float> top_p;
  std::span<const float> repetition_penalty;
  uint64_t seed = 0;
  uint64_t step = 0;
};

// Bytes of workspace for `slots` rows sampled at once (one per thread).
int64_t sample_tokens_workspace_bytes(int64_t V, int64_t slots);

// ids[b] for each row (see above). `workspace`: sample_tokens_workspace_bytes(V, s) bytes give s slots
// (rows run on min(s, team size) threads); empty: the kernel allocates one slot per thread itself.
[[nodiscard]] Status sample_tokens(std::span<const float> logits, std::span<const int32_t> history,
                                   const SamplingParams& params, std::span<int32_t> ids, int64_t B, int64_t V,
                                   int64_t L, std::span<std::byte> workspace = {});

// The uniform in [0, 1) row b draws at (seed, step).
double sample_uniform(uint64_t seed, uint64_t step, int64_t b);

// The value checks sample_tokens makes, for callers holding the values in T (the graph's reference
// interpreter holds f64): `who` prefixes the messages.
template <class T>
[[nodiscard]] Status check_sampling_values(const char* who, const T* logits, const int32_t* history,
                                           const T* temperature, const int32_t* top_k, const T* top_p,
                                           const T* repetition_penalty, int64_t B, int64_t V, int64_t L);

// The reference: the definition, in plain loops (no checks, no threads). z is computed in T, probabilities
// and the draw in f64. Arguments as sample_tokens's, already checked.
namespace ref {
template <class T>
void sample_tokens(const T* logits, const int32_t* history, const T* temperature, const int32_t* top_k,
                   const T* top_p, const T* repetition_penalty, uint64_t seed, uint64_t step, int32_t* ids, int64_t B,
                   int64_t V, int64_t L);
}  // namespace ref

}  // namespace aspen::kernels
