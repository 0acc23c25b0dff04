// kernels/matmul_aspen.cc: aspen's own matrix product, the "aspen" backend of
// MatmulPlan: f32 and bf16 inputs (bf16 widened while packing), f32
// accumulation and output, every layout (a^T, b^T), batches, bias and beta.
//
// Why our own: the products are 80 % of a training step, and the libraries'
// speed depends on whether they recognise the CPU (Debian's OpenBLAS runs SSE3
// kernels on a Xeon it does not know; oneDNN 2.6 is slow on large f32
// products). A kernel written here runs the code this CPU can run, and the
// choice between it and the libraries is made by measuring (matmul.cc).
//
// The structure is BLIS's (Van Zee and van de Geijn, "BLIS: A Framework for
// Rapidly Instantiating BLAS Functionality", 2015): five loops around a
// register-blocked micro-kernel, with op(A) and op(B) packed into contiguous
// panels sized for the caches.
//
// NOTE [gemm micro-kernel]: C's tile of MR rows by NR = NV vectors stays in
// registers for a whole block of kc steps; each step loads NV vectors of the
// packed B panel and broadcasts MR values of the packed A panel, MR * NV FMAs.
// The tile is as large as the registers allow with NV + 1 left for B and the
// broadcast: AVX2 (16 ymm) 4 x 24 = 12 accumulators (3-8 % ahead of 6 x 16 on
// Zen 3), AVX-512 (32 zmm) 12 x 32 = 24. Per step that is 12 (24) FMAs
// against 3 + 4 (2 + 12) loads, inside the two-loads-per-FMA-pair budget of
// every x86 core these kernels target.
//
// NOTE [gemm packing]: a block of op(A) (mc x kc) is packed into panels of MR
// rows, each panel k-major (MR values per step); a block of op(B) (kc x nc)
// into panels of NR columns, each k-major (NR values per step). Packing reads
// A and B in either layout (trans_a, trans_b) and widens bf16 to f32 on the
// way, so no transposed or widened copy of a whole operand is ever made; the
// ragged last panel is zero padded, so the micro-kernel always runs full. Both
// operands go through one routine (`pack` in matmul_aspen_isa.inc): a panel's
// lanes are adjacent in memory (a^T rows, B columns) or each runs along K (A
// rows, b^T columns: AVX2 8x8 and 4x8 transposes).
//
// NOTE [gemm blocking]: the loops, outermost first, over one thread's slab of C:
//   jc over columns by nc: op(B)'s block kc x nc packed stays in L3;
//   pc over K by kc:       pack op(B)[pc.., jc..] once, reused by every row block;
//   ic over rows by mc:    pack op(A)[ic.., pc..]: mc x kc stays in L2;
//   jr over NR panels:     one B panel (kc x NR) stays in L1 across the ir loop;
//   ir over MR panels:     the micro-kernel, A panels streaming from L2.
// kc is chosen so a B panel fills about three quarters of L1d, mc so the A
// block fills half of L2, nc so the B block fills at most a quarter of L3
// (per thread), all from cpu_caches() on the machine that runs; a product
// whose C outgrows L2 takes all of a moderate K in one block instead (NOTE
// [whole k] at gemm_blocking). (GotoBLAS's order, with B's block in L2
// streaming past an A panel in L1, measured 0.83-0.96 of this one on Zen 3
// and was dropped.)
//
// NOTE [gemm threads]: each batch entry's C is cut into slabs, a grid of tm
// row slabs by tn column slabs (tm * tn = the team size, the factorization
// whose largest slab is smallest, and among equals the one that packs least),
// unless the batch alone gives every thread equal work. Each thread runs the
// five loops on its own slabs with its own packed blocks: no barrier, no
// shared buffer. Every element of C is the same sequence of FMAs whatever the
// slab it falls in (kc blocks in order, then k within each), so the bits do
// not depend on the team size or the run.
//
// Accumulation: every kc block sums from zero in registers; the first adds the
// bias and, with beta = 1, the C it finds; each later block adds the C the
// last one left.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/weight_copies.h"
#include "kernels/cpu.h"
#include "kernels/matmul_backend.h"
#include "kernels/matmul_choice.h"

// GCC 12 reports -Wmaybe-uninitialized inside AVX-512 intrinsics built on
// _mm512_undefined_*() (GCC bug 105593; see kernels/convert.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace aspen::kernels {

namespace {

// ---- the variants ------------------------------------------------------------------------------------
// Each includes matmul_aspen_isa.inc with its vector type and tile. The
// portable one (plain floats, a 4 x 8 tile the compiler may vectorize at the
// baseline) runs where AVX2 is missing and is the variant --isa scalar tests.

namespace isa_portable {
using V = float;
constexpr int W = 1, MR = 4, NV = 8;
constexpr Isa ISA = Isa::scalar;
inline V vzero() { return 0.0f; }
inline V vload(const float* p) { return *p; }
inline void vstore(float* p, V v) { *p = v; }
inline V vset1(float x) { return x; }
inline V vadd(V a, V b) { return a + b; }
inline V vfma(V a, V b, V c) { return a * b + c; }
constexpr bool kTransposes = false;
inline void transpose_8x8(const float*, int64_t, float*, int64_t) {}
inline void transpose_4x8(const float*, int64_t, float*, int64_t) {}
#include "kernels/matmul_aspen_isa.inc"
}  // namespace isa_portable

// Transposes for packing the strided operands (op(A) rows, op(B) columns
// along K): 8 (or 4) rows of 8 floats, row stride ld, into 8 rows of 8 (or 4),
// row stride out_ld: out[t * out_ld + l] = src[l * ld + t]. AVX2; the AVX-512
// variant calls them too.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_transpose {
inline void transpose_8x8(const float* src, int64_t ld, float* out, int64_t out_ld) {
  __m256 r[8];
  for (int l = 0; l < 8; ++l) r[l] = _mm256_loadu_ps(src + l * ld);
  __m256 t[8];
  for (int l = 0; l < 8; l += 2) {
    t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]);
    t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
  }
  __m256 u[8];
  for (int l = 0; l < 8; l += 4) {
    u[l] = _mm256_shuffle_ps(t[l], t[l + 2], 0x44);
    u[l + 1] = _mm256_shuffle_ps(t[l], t[l + 2], 0xEE);
    u[l + 2] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0x44);
    u[l + 3] = _mm256_shuffle_ps(t[l + 1], t[l + 3], 0xEE);
  }
  // u[0..3]: rows 0-3, columns {0,4}, {1,5}, {2,6}, {3,7} by 128-bit lane; u[4..7]: rows 4-7.
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(out + c * out_ld, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
    _mm256_storeu_ps(out + (c + 4) * out_ld, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
  }
}
inline void transpose_4x8(const float* src, int64_t ld, float* out, int64_t out_ld) {
  const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ld), r2 = _mm256_loadu_ps(src + 2 * ld),
               r3 = _mm256_loadu_ps(src + 3 * ld);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  // u0: columns 0 (low lane) and 4 (high lane) of rows 0-3; u1: 1 and 5; u2: 2 and 6; u3: 3 and 7.
  const __m256 u[4] = {u0, u1, u2, u3};
  for (int c = 0; c < 4; ++c) {
    _mm_storeu_ps(out + c * out_ld, _mm256_castps256_ps128(u[c]));
    _mm_storeu_ps(out + (c + 4) * out_ld, _mm256_extractf128_ps(u[c], 1));
  }
}
}  // namespace isa_transpose
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace isa_avx2 {
using V = __m256;
constexpr int W = 8, MR = 4, NV = 3;
constexpr Isa ISA = Isa::avx2;
inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vset1(float x) { return _mm256_set1_ps(x); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
constexpr bool kTransposes = true;
using isa_transpose::transpose_4x8;
using isa_transpose::transpose_8x8;
#include "kernels/matmul_aspen_isa.inc"
}  // namespace isa_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
namespace isa_avx512 {
using V = __m512;
constexpr int W = 16, MR = 12, NV = 2;
constexpr Isa ISA = Isa::avx512;
inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vset1(float x) { return _mm512_set1_ps(x); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
constexpr bool kTransposes = true;
using isa_transpose::transpose_4x8;
using isa_transpose::transpose_8x8;
#include "kernels/matmul_aspen_isa.inc"
}  // namespace isa_avx512
#pragma GCC pop_options

const GemmIsa& gemm_isa(Isa isa, DType input) {
  if (isa >= Isa::amx && input == DType::bf16) return amx_gemm_isa();
  if (isa >= Isa::avx512) return isa_avx512::kGemm;
  if (isa >= Isa::avx2) return isa_avx2::kGemm;
  return isa_portable::kGemm;
}

int64_t round_down(int64_t v, int64_t m) { return std::max(m, v / m * m); }
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Scratch for packed blocks, one per thread, grown as needed and shared by
// every plan the thread runs (a plan never runs on two threads at once, and
// each thread runs one slab at a time).
char* thread_scratch(size_t bytes) {
  struct Scratch {
    char* p = nullptr;
    size_t n = 0;
    ~Scratch() { std::free(p); }
  };
  thread_local Scratch s;
  if (s.n < bytes) {
    std::free(s.p);
    s.n = size_t(round_up(int64_t(bytes), 4096));
    s.p = static_cast<char*>(std::aligned_alloc(64, s.n));
    ASPEN_CHECK(s.p != nullptr) << "matmul: out of memory for " << s.n << " bytes of packed panels";
  }
  return s.p;
}

class AspenPlan final : public MatmulPlan::Impl {
 public:
  AspenPlan(const MatmulShape& s, const GemmBlocking& blk, int team)
      : s_(s), blk_(blk), isa_(gemm_isa(blk.isa, s.input)), team_(team) {
    // A shared b folds the batch into rows: a [batch, M, K] is one [batch * M, K] (not with a^T).
    const bool fold = s.broadcast_b && !s.trans_a;
    entries_ = fold ? 1 : s.batch;
    rows_ = fold ? s.batch * s.M : s.M;
    // NOTE [gemm threads]: the batch gives every thread equal work, or each entry is cut.
    if (entries_ % team == 0 || entries_ >= 4 * team) {
      tm_ = tn_ = 1;
    } else {
      // The smallest largest slab; among slabs as large (within 1 %), the one
      // that packs the fewest elements: each thread packs its columns of B
      // once per K block and its rows of A once per column block, so with few
      // rows (M = 128 against N = 3072) cutting the columns halves the B each
      // thread packs, where cutting the rows packs all of B on every thread.
      double best = 0, best_packed = 0;
      for (int tn = 1; tn <= team; ++tn) {
        if (team % tn) continue;
        const int tm = team / tn;
        const double rows = double(round_up((rows_ + tm - 1) / tm, blk.mr));
        const double cols = double(round_up((s.N + tn - 1) / tn, blk.nr));
        const double slab = rows * cols, packed = cols + rows * std::ceil(cols / double(blk.nc));
        if (best == 0 || slab < best * 0.99 || (slab <= best * 1.01 && packed < best_packed))
          best = slab, best_packed = packed, tm_ = tm, tn_ = tn;
      }
    }
  }

  ~AspenPlan() override {
    std::free(packed_);
    give_weight_copy_bytes(int64_t(packed_bytes_));
    count_kernel_copy_bytes(-int64_t(packed_bytes_));
  }

  void b_changed() override { packed_from_ = nullptr; }

  void run(const void* a, const void* b, const float* bias, float* c) override {
    const int64_t slabs = int64_t(tm_) * tn_, units = entries_ * slabs;
    const size_t in_size = s_.input == DType::bf16 ? 2 : 4;
    const int64_t a_stride = rows_ * s_.K, b_stride = s_.broadcast_b ? 0 : s_.K * s_.N, c_stride = rows_ * s_.N;
    bool prepacked = s_.b_fixed && b_stride * (entries_ - 1) == 0;  // one B
    if (prepacked && b != packed_from_) prepacked = pack_all_of_b(b);
#pragma omp parallel for schedule(static) num_threads(team_)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t slab = u / entries_, e = u % entries_;
      const int64_t ti = slab / tn_, tj = slab % tn_;
      const auto [m0, m1] = share(rows_, blk_.mr, tm_, ti);
      const auto [n0, n1] = share(s_.N, blk_.nr, tn_, tj);
      if (m0 >= m1 || n0 >= n1) continue;
      run_slab(static_cast<const char*>(a) + size_t(e * a_stride) * in_size,
               static_cast<const char*>(b) + size_t(e * b_stride) * in_size, bias, c + e * c_stride, m0, m1, n0, n1,
               prepacked ? packed_ + block_offset_[size_t(tj)] : nullptr);
    }
  }

 private:
  // Slab `index` of `count` over `extent`, cut at multiples of `unit`.
  static std::pair<int64_t, int64_t> share(int64_t extent, int64_t unit, int64_t count, int64_t index) {
    const int64_t panels = (extent + unit - 1) / unit;
    const int64_t p0 = index * panels / count, p1 = (index + 1) * panels / count;
    return {std::min(extent, p0 * unit), std::min(extent, p1 * unit)};
  }

  // Bytes of a packed block of B: nc columns in panels of nr, kc steps padded to the variant's unit.
  int64_t packed_b_bytes(int64_t nc, int64_t kc) const {
    return round_up(nc, isa_.nr) * round_up(kc, isa_.k_align) * isa_.packed_bytes;
  }

  // NOTE [fixed b]: with shape.b_fixed, all of B is packed once, as each
  // column slab's threads would pack it block by block ((jc, pc) in their
  // loop order), into one buffer the plan keeps; runs then read the blocks
  // from there, until b_changed() or another B pointer. The bits are those of
  // packing on every run (the same panels, the same order of FMAs).
  // False (nothing packed: the run packs as usual) when the copy does not fit
  // the weight-copy budget (core/weight_copies.h).
  bool pack_all_of_b(const void* b) {
    const int dt = s_.input == DType::bf16 ? 1 : 0;
    const int64_t K = s_.K, ldb = s_.trans_b ? K : s_.N;
    struct Block {
      int64_t jc, nc, pc, kc;
      size_t offset;
    };
    std::vector<Block> blocks;
    block_offset_.assign(size_t(tn_), 0);
    size_t bytes = 0;
    for (int tj = 0; tj < tn_; ++tj) {
      block_offset_[size_t(tj)] = bytes;
      const auto [n0, n1] = share(s_.N, blk_.nr, tn_, tj);
      for (int64_t jc = n0; jc < n1; jc += blk_.nc)
        for (int64_t pc = 0; pc < K; pc += blk_.kc) {
          const int64_t nc = std::min(blk_.nc, n1 - jc), kc = std::min(blk_.kc, K - pc);
          blocks.push_back({jc, nc, pc, kc, bytes});
          bytes += size_t(packed_b_bytes(nc, kc));
        }
    }
    if (bytes > packed_bytes_) {
      const size_t want = size_t(round_up(int64_t(bytes), 4096));
      if (!take_weight_copy_bytes(int64_t(want))) return false;
      std::free(packed_);
      give_weight_copy_bytes(int64_t(packed_bytes_));
      count_kernel_copy_bytes(int64_t(want) - int64_t(packed_bytes_));
      packed_bytes_ = want;
      packed_ = static_cast<char*>(std::aligned_alloc(64, packed_bytes_));
      ASPEN_CHECK(packed_ != nullptr) << "matmul: out of memory for " << packed_bytes_ << " bytes of packed b";
    }
#pragma omp parallel for schedule(dynamic) num_threads(team_)
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Block& k = blocks[i];
      isa_.pack_b[dt](b, ldb, !s_.trans_b, k.jc, k.nc, k.pc, k.kc, packed_ + k.offset);
    }
    packed_from_ = b;
    return true;
  }

  // One thread's slab; `packed_b`: its column slab's blocks packed by
  // pack_all_of_b, or null to pack them here.
  void run_slab(const void* a, const void* b, const float* bias, float* c, int64_t m0, int64_t m1, int64_t n0,
                int64_t n1, const char* packed_b) const {
    const int mr = isa_.mr, nr = isa_.nr;
    const int64_t K = s_.K, N = s_.N;
    const int64_t lda = s_.trans_a ? rows_ : K, ldb = s_.trans_b ? K : N;
    const int dt = s_.input == DType::bf16 ? 1 : 0;
    const int64_t kc_max = std::min(blk_.kc, K), mc_max = std::min(blk_.mc, round_up(m1 - m0, mr)),
                  nc_max = std::min(blk_.nc, round_up(n1 - n0, nr));
    // Packed panels hold kcp steps each (kc rounded up to the variant's unit).
    const int64_t kcp_max = round_up(kc_max, isa_.k_align), esz = isa_.packed_bytes;
    const size_t a_bytes = size_t(round_up(mc_max, mr) * kcp_max * esz),
                 b_bytes = size_t(round_up(nc_max, nr) * kcp_max * esz);
    char* pa = thread_scratch(a_bytes + b_bytes + size_t(2 * mr * nr) * sizeof(float));
    char* pb = pa + a_bytes;
    float* tile = reinterpret_cast<float*>(pb + b_bytes);  // a ragged tile of C, and the bias padded to NR
    float* bias_tile = tile + mr * nr;
    if (isa_.begin) isa_.begin();
    for (int64_t jc = n0; jc < n1; jc += blk_.nc) {
      const int64_t nc = std::min(blk_.nc, n1 - jc);
      for (int64_t pc = 0; pc < K; pc += blk_.kc) {
        const int64_t kc = std::min(blk_.kc, K - pc), kcp = round_up(kc, isa_.k_align);
        const bool first = pc == 0;
        const bool load_c = !first || s_.beta != 0.0f;
        const char* b_block = pb;
        if (packed_b) {  // blocks in this loop's order
          b_block = packed_b;
          packed_b += packed_b_bytes(nc, kc);
        } else {
          isa_.pack_b[dt](b, ldb, !s_.trans_b, jc, nc, pc, kc, pb);
        }
        for (int64_t ic = m0; ic < m1; ic += blk_.mc) {
          const int64_t mc = std::min(blk_.mc, m1 - ic);
          isa_.pack_a[dt](a, lda, s_.trans_a, ic, mc, pc, kc, pa);
          for (int64_t jr = 0; jr < nc; jr += nr) {
            const int cols = int(std::min<int64_t>(nr, nc - jr));
            const char* bp = b_block + jr * kcp * esz;
            // NOTE [b panel prefetch]: a B packed once (NOTE [fixed b]) is read from memory, not from the
            // L2 this loop just packed it into: each panel's first micro-kernel call waited for it (in
            // GPT-2's products at M = 128, 170 against 270 GFLOP/s with B in cache). So while the ir loop
            // runs on this panel, the next panel in loop order (this block's next, else the next block's
            // first) is fetched into L2, a share of its lines per call.
            const char* next_panel = !packed_b              ? nullptr
                                     : jr + nr < nc         ? bp + nr * kcp * esz
                                     : pc + blk_.kc < K || jc + blk_.nc < n1 ? packed_b
                                                                             : nullptr;
            const int64_t panel_lines = nr * kcp * esz / 64, calls = (mc + mr - 1) / mr;
            int64_t prefetched = 0;
            const float* brow = first && bias ? bias + jc + jr : nullptr;
            if (brow && cols < nr) {
              std::fill(bias_tile, bias_tile + nr, 0.0f);
              std::copy(brow, brow + cols, bias_tile);
              brow = bias_tile;
            }
            for (int64_t ir = 0; ir < mc; ir += mr) {
              const int rows = int(std::min<int64_t>(mr, mc - ir));
              float* ct = c + (ic + ir) * N + jc + jr;
              if (next_panel) {
                const int64_t upto = panel_lines * (ir / mr + 1) / calls;
                for (; prefetched < upto; ++prefetched) __builtin_prefetch(next_panel + prefetched * 64, 0, 2);
              }
              const char* ap = pa + ir * kcp * esz;
              if (rows == mr && cols == nr) {
                isa_.ukernel(kcp, ap, bp, ct, N, load_c, brow);
                continue;
              }
              // Ragged edge: the full tile runs on a copy, and its valid part goes back.
              std::fill(tile, tile + mr * nr, 0.0f);
              if (load_c)
                for (int i = 0; i < rows; ++i) std::copy(ct + i * N, ct + i * N + cols, tile + i * nr);
              isa_.ukernel(kcp, ap, bp, tile, nr, load_c, brow);
              for (int i = 0; i < rows; ++i) std::copy(tile + i * nr, tile + i * nr + cols, ct + i * N);
            }
          }
        }
      }
    }
    if (isa_.end) isa_.end();
  }

  MatmulShape s_;
  GemmBlocking blk_;
  const GemmIsa& isa_;
  int team_;
  int64_t entries_ = 1, rows_ = 0;
  int tm_ = 1, tn_ = 1;
  // NOTE [fixed b]: the packed B, where each column slab's blocks start, and the B it was packed from.
  char* packed_ = nullptr;
  size_t packed_bytes_ = 0;
  std::vector<size_t> block_offset_;
  const void* packed_from_ = nullptr;
};

// mc and nc for the blocking's kc (NOTE [gemm blocking]).
void size_blocks(GemmBlocking& b, const GemmIsa& k) {
  const CpuCaches& caches = cpu_caches();
  const int64_t esz = k.packed_bytes;
  b.mc = round_down(std::clamp<int64_t>(caches.l2 / 2 / (b.kc * esz), k.mr, 1024), k.mr);
  b.nc = round_down(std::clamp<int64_t>(caches.l3 / 4 / (b.kc * esz), k.nr, 8192), k.nr);
}
}  // namespace

GemmBlocking gemm_blocking(Isa isa, DType input) {
  const GemmIsa& k = gemm_isa(isa, input);
  GemmBlocking b;
  b.isa = k.isa;
  b.mr = k.mr;
  b.nr = k.nr;
  // NOTE [gemm blocking].
  const int64_t esz = k.packed_bytes, unit = std::max(16, k.k_align);
  b.kc = round_down(std::clamp<int64_t>(cpu_caches().l1d * 3 / 4 / (k.nr * esz), 64, 512), unit);
  size_blocks(b, k);
  return b;
}

GemmBlocking gemm_blocking(const MatmulShape& s, int team) {
  GemmBlocking b = gemm_blocking(active_isa(), s.input);
  // NOTE [whole k]: each K block reads and writes the C tile it adds to, so C moves ceil(K / kc) times.
  // Where a thread's share of C outgrows its L2 those passes go to memory: GPT-2's LM head at batch 8
  // (C 1024 x 50257, 206 MB) spent a third of its time there. Then, for K up to 1024, one K block
  // covers K: C moves once, and the B panel (past L1) streams from L2 in order, which the product
  // measured no slower (265 against 231 GFLOP/s there, 1024 x 3072 x 768 products 280 -> 300).
  const GemmIsa& k = gemm_isa(b.isa, s.input);
  const int64_t rows = s.broadcast_b && !s.trans_a ? s.batch * s.M : s.M;
  const double c_share = double(rows) * double(s.N) * sizeof(float) / double(std::max(team, 1));
  if (c_share > double(cpu_caches().l2) && s.K > b.kc && s.K <= 1024) {
    b.kc = round_up(s.K, std::max(16, k.k_align));
    size_blocks(b, k);
  }
  return b;
}

Result<std::unique_ptr<MatmulPlan::Impl>> make_aspen_plan(const MatmulShape& s, const GemmBlocking& blocking) {
  const std::string subject = "matmul " + s.to_string() + " on aspen's kernels";
  const GemmIsa& k = gemm_isa(blocking.isa, s.input);
  if (blocking.mr != k.mr || blocking.nr != k.nr || blocking.kc < 1 || blocking.mc < k.mr || blocking.nc < k.nr ||
      blocking.mc % k.mr || blocking.nc % k.nr)
    return Status::invalid_argument(subject + ": blocking",
                                    "mr " + std::to_string(k.mr) + ", nr " + std::to_string(k.nr) +
                                        ", kc >= 1, mc and nc positive multiples of them",
                                    blocking.to_string());
  if (blocking.isa > active_isa())
    return Status::error(Code::kUnimplemented, subject, std::string("an ISA this CPU runs (up to ") +
                                                            isa_name(active_isa()) + ")",
                         isa_name(blocking.isa));
  return std::unique_ptr<MatmulPlan::Impl>(std::make_unique<AspenPlan>(s, blocking, omp_get_max_threads()));
}

Result<std::unique_ptr<MatmulPlan::Impl>> make_aspen_plan(const MatmulShape& s) {
  return make_aspen_plan(s, gemm_blocking(s, omp_get_max_threads()));
}

std::string aspen_gemm_description() {
  const GemmBlocking f = gemm_blocking(active_isa(), DType::f32), h = gemm_blocking(active_isa(), DType::bf16);
  return "f32 " + f.to_string() + "; bf16 " + h.to_string();
}

std::string GemmBlocking::to_string() const {
  return std::string(isa_name(isa)) + " mr " + std::to_string(mr) + " nr " + std::to_string(nr) + " kc " +
         std::to_string(kc) + " mc " + std::to_string(mc) + " nc " + std::to_string(nc);
}

}  // namespace aspen::kernels
