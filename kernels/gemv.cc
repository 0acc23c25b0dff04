// kernels/gemv.cc: checks, the reference, the portable kernels, the dispatch to the ISA's kernels
// (gemv_avx512.cc, gemv_avx2.cc) and the team's split, for both weight layouts. See gemv.h for the
// contract and docs/kernels.md ("GEMV") for the design and measurements.
#include "kernels/gemv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "kernels/check_args.h"
#include "kernels/cpu.h"
#include "kernels/gemv_internal.h"

namespace aspen::kernels {

std::string GemvShape::to_string() const {
  std::string s = "gemv " + std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
  s.append(" w:").append(dtype_name(weight)).append(trans_b ? " [N,K]" : " [K,N]");
  if (has_bias) s += " +bias";
  if (x_bf16) s += " x:bf16";
  return s;
}

Status gemv_validate(const GemvShape& s) {
  const char* k = "gemv";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "M", s.M, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", s.N, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "K", s.K, 1));
  if (s.weight != DType::f32 && s.weight != DType::bf16)
    return Status::error(Code::kUnimplemented, "gemv: weight dtype", "f32 or bf16", std::string(dtype_name(s.weight)));
  return Status();
}

namespace {

using gemv_detail::Job;
using gemv_detail::RangeFn;
using gemv_detail::widen;

// ---- portable ------------------------------------------------------------------------------------

template <class W>
void nk_portable(const Job& j, int64_t n0, int64_t n1) {
  const W* w = static_cast<const W*>(j.w);
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < j.M; ++m) {
      float acc = 0;
      const float* x = j.x + m * j.K;
      const W* wr = w + n * j.K;
      for (int64_t k = 0; k < j.K; ++k) acc += x[k] * widen(wr[k]);
      j.y[m * j.N + n] = acc + (j.bias ? j.bias[n] : 0.0f);
    }
}

template <class W>
void kn_portable(const Job& j, int64_t n0, int64_t n1) {
  const W* w = static_cast<const W*>(j.w);
  for (int64_t m = 0; m < j.M; ++m)
    for (int64_t n = n0; n < n1; ++n) j.y[m * j.N + n] = j.bias ? j.bias[n] : 0.0f;
  for (int64_t k = 0; k < j.K; ++k) {
    const W* wr = w + k * j.N;
    for (int64_t m = 0; m < j.M; ++m) {
      const float xv = j.x[m * j.ldx + k];
      float* y = j.y + m * j.N;
      for (int64_t n = n0; n < n1; ++n) y[n] += xv * widen(wr[n]);
    }
  }
}

// ---- dispatch ------------------------------------------------------------------------------------

// NOTE [gemv bf16 dot]: the VDPBF16PS kernels take bf16 weights against more than one row of bf16 values.
bool bf16_dot(const GemvShape& s) {
  return s.weight == DType::bf16 && s.x_bf16 && s.M > 1 && active_isa() >= Isa::avx512_bf16;
}

RangeFn pick(const GemvShape& s) {
  namespace d = gemv_detail;
  const Isa isa = active_isa();
  const bool b16 = s.weight == DType::bf16;
  if (bf16_dot(s)) return s.trans_b ? d::nk_bf16_dot : d::kn_bf16_dot;
  if (isa >= Isa::avx512) {
    if (s.trans_b) return b16 ? d::nk_bf16_avx512 : d::nk_f32_avx512;
    return b16 ? d::kn_bf16_avx512 : d::kn_f32_avx512;
  }
  if (isa == Isa::avx2) {
    if (s.trans_b) return b16 ? d::nk_bf16_avx2 : d::nk_f32_avx2;
    return b16 ? d::kn_bf16_avx2 : d::kn_f32_avx2;
  }
  if (s.trans_b) return b16 ? nk_portable<bf16> : nk_portable<float>;
  return b16 ? kn_portable<bf16> : kn_portable<float>;
}

// Below this many weight bytes a fork/join costs more than a second stream saves.
inline constexpr int64_t kParallelMinBytes = 256 << 10;

// NOTE [gemv split]: N is cut into contiguous pieces, aligned to 4 rows
// ([N, K]) or 16 columns, a 64-byte line of f32 ([K, N]); [K, N] weights
// above kParallelMinBytes are also cut along K into kKnSlices slices of whole
// rows (NOTE [gemv slices]). The slices depend on the shape alone and an
// output's arithmetic does not depend on where the N cuts fall, so results are
// the same for any team size.
//
// NOTE [gemv slices]: a thread's share of a [K, N] row is a short run (N /
// threads columns); split by K instead, a thread streams one contiguous block
// of whole rows. Slice 0 accumulates onto the bias in y, slice i > 0 into
// `partial` from zero, and y += partial[i] in slice order at the end.
inline constexpr int64_t kKnSlices = 2;

void run_split(const GemvShape& s, const Job& job) {
  const RangeFn fn = pick(s);
  const bool big = s.weight_bytes() >= kParallelMinBytes;
  const int64_t slices = !s.trans_b && big && s.K >= 2 * 8 ? kKnSlices : 1;
  const int64_t align = job.packed ? (s.trans_b ? 8 : 32) : s.trans_b ? 4 : 16;  // packed: whole groups, chunks
  const int64_t pieces = (s.N + align - 1) / align;
  const int64_t threads = big ? std::min<int64_t>(omp_get_max_threads(), slices * pieces) : 1;
  thread_local std::vector<float> partial;  // per calling thread, grown once
  Job jobs[kKnSlices];
  jobs[0] = job;
  if (slices > 1) {
    partial.resize(static_cast<size_t>((slices - 1) * s.M * s.N));
    const int64_t rows = s.K / slices / 8 * 8;  // whole 8-row blocks in all but the last slice
    const size_t row_bytes = size_t(s.N) * size_t(dtype_size(s.weight));
    for (int64_t i = 0; i < slices; ++i) {
      const int64_t k0 = i * rows, k1 = i == slices - 1 ? s.K : k0 + rows;
      Job& j = jobs[i];
      j = job;
      j.x = job.x + k0;
      j.w = static_cast<const char*>(job.w) + size_t(k0) * row_bytes;
      j.K = k1 - k0;
      if (j.xd) j.xd = job.xd + k0 / 2;  // k0: a multiple of 8
      if (i > 0) {
        j.bias = nullptr;
        j.y = partial.data() + (i - 1) * s.M * s.N;
      }
    }
  }
  const int64_t cuts = (threads + slices - 1) / slices;  // N pieces per slice
  const int64_t per = (pieces + cuts - 1) / cuts * align;
  const int64_t tasks = slices * cuts;
#pragma omp parallel for schedule(static) num_threads(int(threads)) if (threads > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n0 = std::min(s.N, t % cuts * per), n1 = std::min(s.N, n0 + per);
    if (n0 < n1) fn(jobs[t / cuts], n0, n1);
  }
  for (int64_t i = 1; i < slices; ++i) {
    const float* p = partial.data() + (i - 1) * s.M * s.N;
    for (int64_t e = 0; e < s.M * s.N; ++e) job.y[e] += p[e];
  }
}

template <class Wt>
Status checked_gemv(std::span<const float> x, std::span<const Wt> w, std::span<const float> bias, std::span<float> y,
                    const GemvShape& s) {
  ASPEN_RETURN_IF_ERROR(gemv_validate(s));
  if (s.weight != dtype_of<Wt>())
    return Status::invalid_argument("gemv: shape.weight", std::string(dtype_name(dtype_of<Wt>())) + " (w's type)",
                                    std::string(dtype_name(s.weight)));
  ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "x", x, s.x_elements()));
  ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "w", w, s.w_elements()));
  ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "y", y, s.y_elements()));
  if (s.has_bias) ASPEN_RETURN_IF_ERROR(check_buffer("gemv", "bias", bias, s.N));
  const float* b = s.has_bias ? bias.data() : nullptr;
  if (reference_mode()) {
    ref::gemv<float, Wt>(x.data(), w.data(), b, y.data(), s);
    return Status();
  }
  gemv_run(s, x.data(), w.data(), b, y.data());
  return Status();
}

}  // namespace

namespace {
// The job of one product, x converted for its kernel where that kernel reads x in another form (into buffers of
// the calling thread: valid until its next product).
Job make_job(const GemvShape& s, const float* x, const void* w, const float* bias, float* y, bool packed) {
  Job job{x, w, s.has_bias ? bias : nullptr, y, s.M, s.N, s.K, s.K};
  job.packed = packed;
  if (bf16_dot(s)) {  // NOTE [gemv bf16 dot]: x as pairs of bf16. Per calling thread, grown once.
    thread_local std::vector<uint32_t> xd;
    thread_local std::vector<bf16> xs;
    auto b = [x, &s](int64_t m, int64_t k) { return uint32_t(k < s.K ? f32_to_bf16(x[m * s.K + k]).bits : 0); };
    if (s.trans_b) {
      job.Kp = (s.K + 31) / 32 * 32;
      xs.resize(size_t(s.M * job.Kp));
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t k = 0; k < job.Kp; ++k) xs[size_t(m * job.Kp + k)].bits = uint16_t(b(m, k));
      job.xs = xs.data();
    } else {
      job.ldxd = (s.K + 1) / 2;
      xd.resize(size_t(s.M * job.ldxd));
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t p = 0; p < job.ldxd; ++p) xd[size_t(m * job.ldxd + p)] = b(m, 2 * p + 1) | b(m, 2 * p) << 16;
      job.xd = xd.data();
    }
  } else if (s.trans_b && s.weight == DType::bf16 && active_isa() >= Isa::avx2) {
    // NOTE [bf16 pairs]: chunks of two vectors. Per calling thread, grown once: steady state allocates nothing.
    thread_local std::vector<float> xp;
    const int64_t chunk = active_isa() >= Isa::avx512 ? 32 : 16;
    job.Kp = (s.K + chunk - 1) / chunk * chunk;
    xp.assign(static_cast<size_t>(s.M * job.Kp), 0.0f);
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t k = 0; k < s.K; ++k) {
        const int64_t c = k / chunk * chunk, i = k % chunk;
        xp[size_t(m * job.Kp + c + (i % 2) * (chunk / 2) + i / 2)] = x[m * s.K + k];
      }
    job.xp = xp.data();
  }
  return job;
}

void run(const GemvShape& s, const float* x, const void* w, const float* bias, float* y, bool packed) {
  run_split(s, make_job(s, x, w, bias, y, packed));
}
}  // namespace

// NOTE [gemv groups]: the products of one x by several [N, K] weights in one parallel region. Their rows are
// one list of pieces (4 rows, or 8 where packed: whole groups), cut into one contiguous run of pieces per
// thread; a thread calls each product's kernel on the rows of its run that belong to it. A row's arithmetic
// does not depend on which rows share its call (NOTE [gemv split]), so each output has gemv_run's bits.
void gemv_run_group(const float* x, std::span<const GemvCall> calls) {
  if (calls.empty()) return;
  const GemvShape& s0 = calls[0].shape;
  for (const GemvCall& c : calls)
    ASPEN_CHECK(c.shape.trans_b && c.shape.M == s0.M && c.shape.K == s0.K && c.shape.weight == s0.weight &&
                c.shape.x_bf16 == s0.x_bf16)
        << "gemv_run_group: products of one x by [N, K] weights of one type; got " << c.shape.to_string() << " beside "
        << s0.to_string();
  // The packed kernels need AVX2 (NOTE [packed gemv]); the reference mode runs each product on its own.
  if (reference_mode() || active_isa() < Isa::avx2) {
    for (const GemvCall& c : calls)
      (c.packed ? gemv_run_packed : gemv_run)(c.shape, x, c.w, c.shape.has_bias ? c.bias : nullptr, c.y);
    return;
  }
  constexpr size_t kMaxCalls = 16;
  ASPEN_CHECK(calls.size() <= kMaxCalls) << "gemv_run_group: at most " << kMaxCalls << " products";
  Job jobs[kMaxCalls];
  RangeFn fns[kMaxCalls];
  int64_t align[kMaxCalls], first[kMaxCalls + 1];  // first[c]: the index of product c's first piece
  const Job base = make_job(s0, x, calls[0].w, calls[0].bias, calls[0].y, calls[0].packed);  // x's forms, once
  int64_t bytes = 0;
  first[0] = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    const GemvShape& s = calls[c].shape;
    jobs[c] = base;
    jobs[c].w = calls[c].w;
    jobs[c].bias = s.has_bias ? calls[c].bias : nullptr;
    jobs[c].y = calls[c].y;
    jobs[c].N = s.N;
    jobs[c].packed = calls[c].packed;
    fns[c] = pick(s);
    align[c] = calls[c].packed ? 8 : 4;
    first[c + 1] = first[c] + (s.N + align[c] - 1) / align[c];
    bytes += s.weight_bytes();
  }
  const int64_t pieces = first[calls.size()];
  const int64_t threads = bytes >= kParallelMinBytes ? std::min<int64_t>(omp_get_max_threads(), pieces) : 1;
  const int64_t n_calls = int64_t(calls.size());
#pragma omp parallel for schedule(static) num_threads(int(threads)) if (threads > 1)
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t p0 = pieces * t / threads, p1 = pieces * (t + 1) / threads;
    for (int64_t c = 0; c < n_calls; ++c) {
      const int64_t q0 = std::max(p0, first[c]), q1 = std::min(p1, first[c + 1]);
      if (q0 >= q1) continue;
      const int64_t N = jobs[c].N;
      fns[c](jobs[c], std::min(N, (q0 - first[c]) * align[c]), std::min(N, (q1 - first[c]) * align[c]));
    }
  }
}

void gemv_run(const GemvShape& s, const float* x, const void* w, const float* bias, float* y) {
  run(s, x, w, bias, y, false);
}

bool gemv_packable(const GemvShape& s) {
  if (s.weight != DType::bf16) return false;
  return s.trans_b ? s.N >= 8 : s.M == 1 && s.K >= 8 && active_isa() >= Isa::avx512;
}

namespace {
// gemv_pack's regrouping (`to_packed`) or its inverse. Both layouts are groups of 8 rows (of w as stored: N
// rows of K for [N, K], K rows of N for [K, N]) whose chunks of 32 along the row hold the 8 rows' values in turn.
void regroup(const GemvShape& s, const bf16* from, bf16* to, bool to_packed) {
  const int64_t rows = s.trans_b ? s.N : s.K, L = s.trans_b ? s.K : s.N, whole = rows / 8 * 8;
  for (int64_t n = 0; n < whole; n += 8)
    for (int64_t c = 0; c < L; c += 32) {
      const int64_t cw = std::min<int64_t>(32, L - c);
      for (int r = 0; r < 8; ++r) {
        const int64_t plain = (n + r) * L + c, packed = n * L + c * 8 + r * cw;
        std::memcpy(to + (to_packed ? packed : plain), from + (to_packed ? plain : packed), size_t(cw) * sizeof(bf16));
      }
    }
  std::memcpy(to + whole * L, from + whole * L, size_t((rows - whole) * L) * sizeof(bf16));
}
}  // namespace

void gemv_pack(const GemvShape& s, const void* w, void* out) {
  regroup(s, static_cast<const bf16*>(w), static_cast<bf16*>(out), /*to_packed=*/true);
}

void gemv_run_packed(const GemvShape& s, const float* x, const void* packed, const float* bias, float* y) {
  const bool fast = active_isa() >= (s.trans_b ? Isa::avx2 : Isa::avx512) && !reference_mode();
  if (fast) return run(s, x, packed, bias, y, true);
  // Elsewhere the rows as stored: unpacked into this thread's buffer (the portable kernels read rows).
  thread_local std::vector<bf16> rows;
  rows.resize(size_t(s.N * s.K));
  regroup(s, static_cast<const bf16*>(packed), rows.data(), /*to_packed=*/false);
  if (reference_mode())
    ref::gemv<float, bf16>(x, rows.data(), s.has_bias ? bias : nullptr, y, s);
  else
    run(s, x, rows.data(), bias, y, false);
}

Status gemv(std::span<const float> x, std::span<const float> w, std::span<const float> bias, std::span<float> y,
            const GemvShape& shape) {
  return checked_gemv<float>(x, w, bias, y, shape);
}

Status gemv(std::span<const float> x, std::span<const bf16> w, std::span<const float> bias, std::span<float> y,
            const GemvShape& shape) {
  return checked_gemv<bf16>(x, w, bias, y, shape);
}

namespace ref {

template <class T, class Wt>
void gemv(const T* x, const Wt* w, const T* bias, T* y, const GemvShape& s) {
  const int64_t M = s.M, N = s.N, K = s.K;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * T(widen(s.trans_b ? w[n * K + k] : w[k * N + n]));
      y[m * N + n] = acc + (bias ? bias[n] : T(0));
    }
}

template void gemv<float, float>(const float*, const float*, const float*, float*, const GemvShape&);
template void gemv<double, double>(const double*, const double*, const double*, double*, const GemvShape&);
template void gemv<float, bf16>(const float*, const bf16*, const float*, float*, const GemvShape&);
template void gemv<double, bf16>(const double*, const bf16*, const double*, double*, const GemvShape&);

}  // namespace ref

}  // namespace aspen::kernels
