#include "kernels/attention_layout.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "core/check.h"
#include "core/philox.h"

namespace aspen::kernels {

namespace {

using Kind = SparsityConfig::Kind;
using Attention = SparsityConfig::Attention;

// The kinds: aspen's name (messages, goldens) and which of the shared fields
// the kind reads. DeepSpeed's class of each is in the header.
struct KindInfo {
  Kind kind;
  const char* name;
  bool attention;  // reads attention
  bool per_head;   // reads different_layout_per_head
  bool random;     // reads num_random_blocks
};
constexpr KindInfo kKinds[] = {
    {Kind::dense, "dense", false, false, false},
    {Kind::fixed, "fixed", true, true, false},
    {Kind::variable, "variable", true, true, true},
    {Kind::bigbird, "bigbird", true, true, true},
    {Kind::bslongformer, "bslongformer", true, true, false},
    {Kind::local_sliding_window, "local_sliding_window", true, false, false},
};

const KindInfo* info_of(Kind kind) {
  for (const KindInfo& k : kKinds)
    if (k.kind == kind) return &k;
  return nullptr;
}

std::string str(int64_t v) { return std::to_string(v); }

// An error about `field` of config c: "<kind> sparsity: <field>: expected ..., found ...".
Status bad(const SparsityConfig& c, const std::string& field, std::string expected, std::string found) {
  return Status::invalid_argument(std::string(sparsity_kind_name(c.kind)) + " sparsity: " + field, std::move(expected),
                                  std::move(found));
}

Status at_least(const SparsityConfig& c, const std::string& field, int64_t value, int64_t min) {
  if (value >= min) return Status();
  return bad(c, field, ">= " + str(min), str(value));
}

// heads * blocks * blocks <= kMaxLayoutBlocks, without overflow; heads, blocks >= 1.
Status check_size(const std::string& who, int64_t heads, int64_t blocks) {
  if (blocks > kMaxLayoutBlocks / blocks || blocks * blocks > kMaxLayoutBlocks / heads)
    return Status::invalid_argument(who + ": layout",
                                    "at most " + str(kMaxLayoutBlocks) + " blocks (heads * blocks * blocks)",
                                    str(heads) + " * " + str(blocks) + " * " + str(blocks));
  return Status();
}

// a + b for a, b >= 0, saturating: window sizes and strides are the user's and may be huge.
int64_t sat_add(int64_t a, int64_t b) {
  return b > std::numeric_limits<int64_t>::max() - a ? std::numeric_limits<int64_t>::max() : a + b;
}

// Python's bound of a slice on an axis of n: a negative bound counts from the end.
int64_t py_bound(int64_t i, int64_t n) { return i < 0 ? std::max<int64_t>(i + n, 0) : std::min(i, n); }

bool unidirectional(const SparsityConfig& c) { return c.attention == Attention::unidirectional; }

bool per_head(const SparsityConfig& c) { return c.different_layout_per_head && info_of(c.kind)->per_head; }

// ---- validation ------------------------------------------------------------------------------

Status check_horizontal(const SparsityConfig& c) {
  if (c.horizontal_global_attention && unidirectional(c))
    return bad(c, "horizontal_global_attention", "false with unidirectional attention", "true");
  return Status();
}

// Variable's and BSLongformer's global blocks.
Status check_global_indices(const SparsityConfig& c) {
  const std::vector<int64_t>& starts = c.global_block_indices;
  const std::vector<int64_t>& ends = c.global_block_end_indices;
  for (size_t j = 0; j < starts.size(); ++j)
    ASPEN_RETURN_IF_ERROR(at_least(c, "global_block_indices[" + str(int64_t(j)) + "]", starts[j], 0));
  if (ends.empty()) return Status();
  if (ends.size() != starts.size())
    return bad(c, "global_block_end_indices",
               "as many entries as global_block_indices (" + str(int64_t(starts.size())) + ") or none",
               str(int64_t(ends.size())));
  for (size_t j = 0; j < ends.size(); ++j) {
    const std::string at = "[" + str(int64_t(j)) + "]";
    if (ends[j] <= starts[j])
      return bad(c, "global_block_end_indices" + at, "> global_block_indices" + at + " (" + str(starts[j]) + ")",
                 str(ends[j]));
  }
  return Status();
}

Status validate_fixed(const SparsityConfig& c) {
  const int64_t local = c.num_local_blocks, global = c.num_global_blocks, patterns = c.num_different_global_patterns;
  ASPEN_RETURN_IF_ERROR(at_least(c, "num_local_blocks", local, 1));
  ASPEN_RETURN_IF_ERROR(at_least(c, "num_global_blocks", global, 1));
  if (local % global != 0)
    return bad(c, "num_local_blocks", "a multiple of num_global_blocks (" + str(global) + ")", str(local));
  ASPEN_RETURN_IF_ERROR(check_horizontal(c));
  ASPEN_RETURN_IF_ERROR(at_least(c, "num_different_global_patterns", patterns, 1));
  if (patterns > 1 && !c.different_layout_per_head)
    return bad(c, "num_different_global_patterns", "1 when different_layout_per_head is false", str(patterns));
  if (patterns > local / global)
    return bad(c, "num_different_global_patterns",
               "<= num_local_blocks / num_global_blocks (" + str(local) + " / " + str(global) + " = " +
                   str(local / global) + ")",
               str(patterns));
  return Status();
}

Status validate_variable(const SparsityConfig& c) {
  ASPEN_RETURN_IF_ERROR(check_global_indices(c));
  ASPEN_RETURN_IF_ERROR(check_horizontal(c));
  ASPEN_RETURN_IF_ERROR(at_least(c, "num_random_blocks", c.num_random_blocks, 0));
  if (c.local_window_blocks.empty()) return bad(c, "local_window_blocks", "at least one window size", "none");
  for (size_t j = 0; j < c.local_window_blocks.size(); ++j)
    ASPEN_RETURN_IF_ERROR(at_least(c, "local_window_blocks[" + str(int64_t(j)) + "]", c.local_window_blocks[j], 1));
  return Status();
}

// The checks against the blocks of a row, in the order DeepSpeed's make_layout meets them.
Status check_fits(const SparsityConfig& c, int64_t seq_len, int64_t blocks) {
  const std::string row =
      "<= " + str(blocks) + " (the blocks in a row: seq_len " + str(seq_len) + " / block " + str(c.block) + ")";
  const bool has_random = info_of(c.kind)->random;
  if (has_random && c.num_random_blocks > blocks) return bad(c, "num_random_blocks", row, str(c.num_random_blocks));
  // NOTE [unidirectional bigbird random blocks]: DeepSpeed samples row q's
  // random blocks among key blocks 0..q, so row 0 has one candidate and
  // random.sample fails for num_random_blocks > 1 (ValueError: Sample larger
  // than population). aspen refuses the config the same way rather than
  // drawing fewer blocks in the first rows.
  if (c.kind == Kind::bigbird && unidirectional(c) && c.num_random_blocks > 1)
    return bad(c, "num_random_blocks", "<= 1 with unidirectional attention (query block 0 has one candidate)",
               str(c.num_random_blocks));
  const bool has_window =
      c.kind == Kind::bigbird || c.kind == Kind::bslongformer || c.kind == Kind::local_sliding_window;
  if (has_window && c.num_sliding_window_blocks > blocks)
    return bad(c, "num_sliding_window_blocks", row, str(c.num_sliding_window_blocks));
  if (c.kind == Kind::bigbird && c.num_global_blocks > blocks)
    return bad(c, "num_global_blocks", row, str(c.num_global_blocks));
  return Status();
}

// Every check of make_layout; the blocks of a row.
Result<int64_t> checked_blocks(const SparsityConfig& c, int64_t seq_len) {
  ASPEN_RETURN_IF_ERROR(validate(c));
  if (seq_len <= 0 || seq_len % c.block != 0)
    return bad(c, "seq_len", "a positive multiple of block (" + str(c.block) + ")", str(seq_len));
  const int64_t blocks = seq_len / c.block;
  ASPEN_RETURN_IF_ERROR(check_size(std::string(sparsity_kind_name(c.kind)) + " sparsity", c.num_heads, blocks));
  ASPEN_RETURN_IF_ERROR(check_fits(c, seq_len, blocks));
  return blocks;
}

// ---- the patterns ----------------------------------------------------------------------------

// One head's [n, n] bits.
struct Grid {
  uint8_t* bits;
  int64_t n;
  // Sets rows [r0, r1) x columns [c0, c1); an empty range sets nothing.
  void fill(int64_t r0, int64_t r1, int64_t c0, int64_t c1) const {
    ASPEN_CHECK(r0 >= 0 && c0 >= 0 && (r1 <= n || r0 >= r1) && (c1 <= n || c0 >= c1))
        << "rows [" << r0 << ", " << r1 << ") columns [" << c0 << ", " << c1 << ") of " << n;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = c0; k < c1; ++k) bits[r * n + k] = 1;
  }
  // torch.tril: clears the key blocks past each query block.
  void tril() const {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = r + 1; k < n; ++k) bits[r * n + k] = 0;
  }
};

// One window of rows and columns [lo, hi): every query block attends every key
// block of its window, or with unidirectional attention those up to itself.
void local_window(const Grid& g, int64_t lo, int64_t hi, bool causal) {
  for (int64_t r = lo; r < hi; ++r) g.fill(r, r + 1, lo, causal ? r + 1 : hi);
}

// NOTE [symmetric sliding window]: DeepSpeed's sliding windows reach
// w = num_sliding_window_blocks / 2 blocks to each side (Python's floor
// division), so a window of 4 covers 5 blocks and one of 0 or 1 the diagonal
// only. BigBird and BSLongformer always build the symmetric window and cut the
// upper triangle afterwards (torch.tril) when unidirectional; only
// LocalSlidingWindow stops at the diagonal itself (`causal`), leaving w + 1
// blocks per row.
void sliding_window(const Grid& g, int64_t window, bool causal) {
  const int64_t w = window / 2;
  for (int64_t r = 0; r < g.n; ++r)
    g.fill(r, r + 1, std::max<int64_t>(0, r - w), causal ? r + 1 : std::min(r + w + 1, g.n));
}

void fixed_layout(const Grid& g, const SparsityConfig& c, int64_t h) {
  const int64_t n = g.n, L = c.num_local_blocks, G = c.num_global_blocks;  // window and global group sizes
  const bool uni = unidirectional(c), horizontal = c.horizontal_global_attention;
  for (int64_t i = 0; i < n; i = sat_add(i, L)) local_window(g, i, std::min(sat_add(i, L), n), uni);

  // Global group of head h: the (1 + h % patterns)-th group of G blocks
  // counting back from the end of each window; validate() keeps it >= 0.
  // NOTE [fixed unidirectional global groups]: unidirectional rows start at
  // the group's first block (DeepSpeed's layout[h, i:, i:i + G]), so a group
  // of G > 1 blocks attends itself whole, past the diagonal.
  const int64_t first = L - (1 + h % c.num_different_global_patterns) * G;
  const int64_t full = n - n % L;  // the blocks in whole windows
  for (int64_t i = first; i < full; i += L) {
    g.fill(uni ? i : 0, n, i, i + G);
    if (horizontal) g.fill(i, i + G, 0, n);
  }
  if (full == n) return;
  // NOTE [fixed negative start]: the short last window's group sits at the
  // same offset, moved back to end at the last block. With fewer blocks than
  // G the start is negative and DeepSpeed's slices count it from the end
  // (layout[h, start:, start:start + G]): the bounds go through py_bound.
  const int64_t start = std::min(sat_add(full, first), n - G), stop = start + G;
  g.fill(py_bound(uni ? start : 0, n), n, py_bound(start, n), py_bound(stop, n));
  if (horizontal) g.fill(py_bound(start, n), py_bound(stop, n), 0, n);
}

// Variable's local windows: the sizes of local_window_blocks one after another,
// then the last size again to the end.
void variable_local(const Grid& g, const SparsityConfig& c) {
  const bool uni = unidirectional(c);
  int64_t start = 0;
  for (int64_t size : c.local_window_blocks) {
    local_window(g, start, std::min(sat_add(start, size), g.n), uni);
    start = sat_add(start, size);
  }
  const int64_t last = c.local_window_blocks.back();
  for (int64_t i = start; i < g.n; i = sat_add(i, last)) local_window(g, i, std::min(sat_add(i, last), g.n), uni);
}

// Variable's and BSLongformer's global ranges [lo, hi) within n blocks:
// global_block_indices[j] alone or up to global_block_end_indices[j] (cut at
// n); ranges that start past the last block are dropped, as DeepSpeed does.
std::vector<std::pair<int64_t, int64_t>> global_ranges(const SparsityConfig& c, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t j = 0; j < c.global_block_indices.size(); ++j) {
    const int64_t lo = c.global_block_indices[j];
    if (lo >= n) continue;
    out.emplace_back(lo, c.global_block_end_indices.empty() ? lo + 1 : std::min(c.global_block_end_indices[j], n));
  }
  return out;
}

// NOTE [variable global blocks]: the global columns start at row 0, or with
// unidirectional attention at the range's first block, so (as in Fixed) a
// range of several blocks attends itself whole; nothing cuts the upper
// triangle afterwards. Rows are global too only with horizontal_global_attention.
void variable_global(const Grid& g, const SparsityConfig& c) {
  for (const auto& [lo, hi] : global_ranges(c, g.n)) {
    if (c.horizontal_global_attention) g.fill(lo, hi, 0, g.n);
    g.fill(unidirectional(c) ? lo : 0, g.n, lo, hi);
  }
}

// BSLongformer's global blocks: whole rows and columns; unidirectional cuts
// the upper triangle after.
void bslongformer_global(const Grid& g, const SparsityConfig& c) {
  for (const auto& [lo, hi] : global_ranges(c, g.n)) {
    g.fill(lo, hi, 0, g.n);
    g.fill(0, g.n, lo, hi);
  }
}

// Philox stream (seed, head << 32 | row): the random draws of one query block
// of one layout head. blocks <= 2^16 (kMaxLayoutBlocks), so rows fit 32 bits.
class RowDraws {
 public:
  RowDraws(uint64_t seed, int64_t head, int64_t row) : seed_(seed), stream_((uint64_t(head) << 32) | uint64_t(row)) {}
  // Uniform on [0, bound), 1 <= bound: Lemire's multiply-shift, rejecting the
  // 2^32 mod bound low products that would bias it.
  uint32_t below(uint32_t bound) {
    uint64_t m = uint64_t(next()) * bound;
    if (uint32_t(m) < bound) {
      const uint32_t threshold = (0u - bound) % bound;
      while (uint32_t(m) < threshold) m = uint64_t(next()) * bound;
    }
    return uint32_t(m >> 32);
  }

 private:
  uint32_t next() { return philox_bits(seed_, stream_, n_++); }
  uint64_t seed_, stream_, n_ = 0;
};

// NOTE [random blocks]: DeepSpeed's rows take random.sample(candidates, r):
// r distinct key blocks, uniformly. aspen draws the same way, from Philox
// instead of Python's Mersenne Twister: a partial Fisher-Yates shuffle of the
// candidates 0..m-1, whose first r entries are the sample. Candidates
// (DeepSpeed's): every key block, except unidirectional BigBird's 0..row.
// NOTE [variable random blocks]: unidirectional Variable still samples the
// whole row (DeepSpeed's set_random_layout ignores attention) and nothing cuts
// the upper triangle after, so its random blocks may lie in the future.
int64_t random_candidates(const SparsityConfig& c, int64_t n, int64_t row) {
  return c.kind == Kind::bigbird && unidirectional(c) ? row + 1 : n;
}

// The random key blocks of query block `row` of layout head `head`, increasing, into picks.
void draw_row(const SparsityConfig& c, int64_t n, int64_t head, int64_t row, std::vector<int64_t>& pool,
              std::vector<int64_t>& picks) {
  const int64_t m = random_candidates(c, n, row), r = c.num_random_blocks;
  pool.resize(size_t(m));
  std::iota(pool.begin(), pool.end(), int64_t{0});
  RowDraws draws(c.seed, head, row);
  for (int64_t i = 0; i < r; ++i) {
    const int64_t j = i + int64_t(draws.below(uint32_t(m - i)));
    std::swap(pool[size_t(i)], pool[size_t(j)]);
  }
  picks.assign(pool.begin(), pool.begin() + r);
  std::sort(picks.begin(), picks.end());
}

void random_layout(const Grid& g, const SparsityConfig& c, int64_t head) {
  std::vector<int64_t> pool, picks;
  for (int64_t row = 0; row < g.n; ++row) {
    draw_row(c, g.n, head, row, pool, picks);
    for (int64_t k : picks) g.fill(row, row + 1, k, k + 1);
  }
}

// One layout head, in the order of DeepSpeed's make_layout (which matters only
// for tril, applied last).
void head_layout(const Grid& g, const SparsityConfig& c, int64_t h) {
  switch (c.kind) {
    case Kind::dense:
      g.fill(0, g.n, 0, g.n);
      return;
    case Kind::fixed:
      fixed_layout(g, c, h);
      return;
    case Kind::variable:
      random_layout(g, c, h);
      variable_local(g, c);
      variable_global(g, c);
      return;
    case Kind::bigbird:
      random_layout(g, c, h);
      sliding_window(g, c.num_sliding_window_blocks, false);
      g.fill(0, c.num_global_blocks, 0, g.n);
      g.fill(0, g.n, 0, c.num_global_blocks);
      if (unidirectional(c)) g.tril();
      return;
    case Kind::bslongformer:
      sliding_window(g, c.num_sliding_window_blocks, false);
      bslongformer_global(g, c);
      if (unidirectional(c)) g.tril();
      return;
    case Kind::local_sliding_window:
      sliding_window(g, c.num_sliding_window_blocks, unidirectional(c));
      return;
  }
  ASPEN_CHECK(false) << "unknown sparsity kind " << int(c.kind);
}

}  // namespace

// ---- BlockLayout ------------------------------------------------------------------------------

bool BlockLayout::at(int64_t h, int64_t q, int64_t k) const {
  ASPEN_CHECK(h >= 0 && h < heads && q >= 0 && q < blocks && k >= 0 && k < blocks)
      << "BlockLayout::at(" << h << ", " << q << ", " << k << ") of [" << heads << ", " << blocks << ", " << blocks
      << "]";
  return bits[size_t((h * blocks + q) * blocks + k)] != 0;
}

int64_t BlockLayout::count() const {
  return int64_t(std::count_if(bits.begin(), bits.end(), [](uint8_t b) { return b != 0; }));
}

double BlockLayout::density() const { return bits.empty() ? 0.0 : double(count()) / double(bits.size()); }

Result<BlockLayout> layout_prefix(const BlockLayout& master, int64_t blocks) {
  if (blocks < 1 || blocks > master.blocks)
    return Status::invalid_argument("layout_prefix: blocks", "in [1, " + str(master.blocks) + "] (the master layout's)",
                                    str(blocks));
  BlockLayout out{.heads = master.heads, .blocks = blocks, .block = master.block, .bits = {}};
  out.bits.reserve(size_t(master.heads * blocks * blocks));
  for (int64_t h = 0; h < master.heads; ++h)
    for (int64_t q = 0; q < blocks; ++q) {
      const auto row = master.bits.begin() + (h * master.blocks + q) * master.blocks;
      out.bits.insert(out.bits.end(), row, row + blocks);
    }
  return out;
}

Result<BlockLayout> layout_from_bits(int64_t heads, int64_t blocks, int64_t block, std::vector<uint8_t> bits) {
  const std::string who = "layout_from_bits";
  if (heads < 1) return Status::invalid_argument(who + ": heads", ">= 1", str(heads));
  if (blocks < 1) return Status::invalid_argument(who + ": blocks", ">= 1", str(blocks));
  if (block < 1) return Status::invalid_argument(who + ": block", ">= 1", str(block));
  ASPEN_RETURN_IF_ERROR(check_size(who, heads, blocks));
  const int64_t want = heads * blocks * blocks;
  if (int64_t(bits.size()) != want)
    return Status::invalid_argument(who + ": bits",
                                    str(want) + " values (heads * blocks * blocks = " + str(heads) + " * " +
                                        str(blocks) + " * " + str(blocks) + ")",
                                    str(int64_t(bits.size())));
  for (int64_t i = 0; i < want; ++i) {
    if (bits[size_t(i)] <= 1) continue;
    return Status::invalid_argument(who + ": bits[" + str(i) + "] (head " + str(i / (blocks * blocks)) +
                                        ", query block " + str(i / blocks % blocks) + ", key block " + str(i % blocks) +
                                        ")",
                                    "0 or 1", str(bits[size_t(i)]));
  }
  return BlockLayout{heads, blocks, block, std::move(bits)};
}

// ---- SparsityConfig ---------------------------------------------------------------------------

// The struct's defaults are DeepSpeed's for every field where the kinds agree;
// the factories set the kind and the two that differ.
SparsityConfig SparsityConfig::dense(int64_t heads) {
  SparsityConfig c;
  c.kind = Kind::dense;
  c.num_heads = heads;
  return c;
}

SparsityConfig SparsityConfig::fixed(int64_t heads) {
  SparsityConfig c = dense(heads);
  c.kind = Kind::fixed;
  return c;
}

SparsityConfig SparsityConfig::variable(int64_t heads) {
  SparsityConfig c = dense(heads);
  c.kind = Kind::variable;
  c.num_random_blocks = 0;
  return c;
}

SparsityConfig SparsityConfig::bigbird(int64_t heads) {
  SparsityConfig c = dense(heads);
  c.kind = Kind::bigbird;
  c.num_random_blocks = 1;
  return c;
}

SparsityConfig SparsityConfig::bslongformer(int64_t heads) {
  SparsityConfig c = dense(heads);
  c.kind = Kind::bslongformer;
  return c;
}

SparsityConfig SparsityConfig::local_sliding_window(int64_t heads) {
  SparsityConfig c = dense(heads);
  c.kind = Kind::local_sliding_window;
  c.attention = Attention::unidirectional;
  return c;
}

SparsityConfig SparsityConfig::of(Kind kind, int64_t heads) {
  switch (kind) {
    case Kind::dense: return dense(heads);
    case Kind::fixed: return fixed(heads);
    case Kind::variable: return variable(heads);
    case Kind::bigbird: return bigbird(heads);
    case Kind::bslongformer: return bslongformer(heads);
    case Kind::local_sliding_window: return local_sliding_window(heads);
  }
  return dense(heads);
}

Result<SparsityConfig::Kind> parse_sparsity_kind(const std::string& name) {
  std::string names;
  for (const KindInfo& k : kKinds) {
    if (name == k.name) return k.kind;
    names += (names.empty() ? "" : ", ") + std::string(k.name);
  }
  return Status::invalid_argument("kind", "one of " + names, "'" + name + "'");
}

namespace {
// DeepSpeed's constructors' arguments (sparsity_config.py, 0.14.4), num_heads left out.
constexpr std::pair<Kind, const char*> kKeysOfKind[] = {
    {Kind::dense, "block different_layout_per_head"},
    {Kind::fixed,
     "block different_layout_per_head num_local_blocks num_global_blocks attention horizontal_global_attention "
     "num_different_global_patterns"},
    {Kind::variable,
     "block different_layout_per_head num_random_blocks local_window_blocks global_block_indices "
     "global_block_end_indices attention horizontal_global_attention"},
    {Kind::bigbird,
     "block different_layout_per_head num_random_blocks num_sliding_window_blocks num_global_blocks attention"},
    {Kind::bslongformer,
     "block different_layout_per_head num_sliding_window_blocks global_block_indices global_block_end_indices "
     "attention"},
    {Kind::local_sliding_window, "block num_sliding_window_blocks attention"},
};

std::vector<std::string> words(const char* text) {
  std::vector<std::string> out;
  std::string w;
  for (const char* p = text;; ++p) {
    if (*p == ' ' || *p == '\0') {
      if (!w.empty()) out.push_back(w);
      w.clear();
      if (*p == '\0') break;
    } else {
      w += *p;
    }
  }
  return out;
}

std::vector<std::string> keys_of(Kind kind) {
  for (const auto& [k, text] : kKeysOfKind)
    if (k == kind) return words(text);
  return {};
}

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}
}  // namespace

std::string sparsity_keys(SparsityConfig::Kind kind) { return joined(keys_of(kind)); }

std::string sparsity_keys() {
  std::vector<std::string> all;
  for (const auto& [k, text] : kKeysOfKind)
    for (const std::string& w : words(text))
      if (std::find(all.begin(), all.end(), w) == all.end()) all.push_back(w);
  return joined(all);
}

bool sparsity_reads(SparsityConfig::Kind kind, const std::string& key) {
  const std::vector<std::string> keys = keys_of(kind);
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

const char* sparsity_kind_name(SparsityConfig::Kind kind) {
  const KindInfo* info = info_of(kind);
  return info ? info->name : "unknown";
}

Result<SparsityConfig::Attention> parse_attention(const std::string& s) {
  if (s == "bidirectional") return Attention::bidirectional;
  if (s == "unidirectional") return Attention::unidirectional;
  return Status::invalid_argument("attention", "'unidirectional' or 'bidirectional'", "'" + s + "'");
}

const char* attention_name(SparsityConfig::Attention a) {
  switch (a) {
    case Attention::bidirectional:
      return "bidirectional";
    case Attention::unidirectional:
      return "unidirectional";
  }
  return "unknown";
}

Status validate(const SparsityConfig& c) {
  const KindInfo* info = info_of(c.kind);
  if (info == nullptr)
    return Status::invalid_argument("sparsity config: kind",
                                    "one of dense, fixed, variable, bigbird, bslongformer, local_sliding_window",
                                    "Kind(" + str(int64_t(c.kind)) + ")");
  ASPEN_RETURN_IF_ERROR(at_least(c, "num_heads", c.num_heads, 1));
  ASPEN_RETURN_IF_ERROR(at_least(c, "block", c.block, 1));
  if (info->attention && c.attention != Attention::bidirectional && c.attention != Attention::unidirectional)
    return bad(c, "attention", "unidirectional or bidirectional", "Attention(" + str(int64_t(c.attention)) + ")");
  switch (c.kind) {
    case Kind::dense:
      return Status();
    case Kind::fixed:
      return validate_fixed(c);
    case Kind::variable:
      return validate_variable(c);
    case Kind::bigbird:
      ASPEN_RETURN_IF_ERROR(at_least(c, "num_random_blocks", c.num_random_blocks, 0));
      ASPEN_RETURN_IF_ERROR(at_least(c, "num_sliding_window_blocks", c.num_sliding_window_blocks, 0));
      return at_least(c, "num_global_blocks", c.num_global_blocks, 0);
    case Kind::bslongformer:
      ASPEN_RETURN_IF_ERROR(at_least(c, "num_sliding_window_blocks", c.num_sliding_window_blocks, 0));
      return check_global_indices(c);
    case Kind::local_sliding_window:
      return at_least(c, "num_sliding_window_blocks", c.num_sliding_window_blocks, 0);
  }
  return Status();
}

Result<BlockLayout> make_layout(const SparsityConfig& c, int64_t seq_len) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t n, checked_blocks(c, seq_len));
  BlockLayout out;
  out.heads = c.num_heads;
  out.blocks = n;
  out.block = c.block;
  out.bits.assign(size_t(c.num_heads * n * n), 0);
  const int64_t layout_heads = per_head(c) ? c.num_heads : 1;
  for (int64_t h = 0; h < layout_heads; ++h) head_layout(Grid{out.bits.data() + h * n * n, n}, c, h);
  // DeepSpeed's check_and_propagate_first_head_layout: one layout for all heads.
  for (int64_t h = layout_heads; h < c.num_heads; ++h)
    std::copy_n(out.bits.begin(), n * n, out.bits.begin() + h * n * n);
  return out;
}

Result<std::vector<int64_t>> random_blocks(const SparsityConfig& c, int64_t seq_len) {
  ASPEN_ASSIGN_OR_RETURN(const int64_t n, checked_blocks(c, seq_len));
  std::vector<int64_t> out;
  if (!info_of(c.kind)->random) return out;
  const int64_t r = c.num_random_blocks;
  out.reserve(size_t(c.num_heads * n * r));
  std::vector<int64_t> pool, picks;
  for (int64_t h = 0; h < c.num_heads; ++h)
    for (int64_t row = 0; row < n; ++row) {
      draw_row(c, n, per_head(c) ? h : 0, row, pool, picks);
      out.insert(out.end(), picks.begin(), picks.end());
    }
  return out;
}

Result<std::vector<int32_t>> t5_relative_buckets(int64_t T, int64_t S, int64_t kv_offset, bool bidirectional,
                                                 int64_t num_buckets, int64_t max_distance) {
  const std::string who = "t5_relative_buckets";
  if (T < 0 || S < 0 || kv_offset < 0 || T > (int64_t(1) << 24) || S > (int64_t(1) << 24) ||
      kv_offset > (int64_t(1) << 24))
    return Status::invalid_argument(who + ": T, S, kv_offset", "numbers in [0, 2^24]",
                                    std::to_string(T) + ", " + std::to_string(S) + ", " + std::to_string(kv_offset));
  const int64_t per_side = bidirectional ? num_buckets / 2 : num_buckets;
  if (num_buckets < (bidirectional ? 4 : 2) || num_buckets > (int64_t(1) << 20))
    return Status::invalid_argument(who + ": num_buckets",
                                    std::string(bidirectional ? "in [4, 2^20] (bidirectional)" : "in [2, 2^20]"),
                                    std::to_string(num_buckets));
  const int64_t max_exact = per_side / 2;
  if (max_distance <= max_exact || max_distance > (int64_t(1) << 24))
    return Status::invalid_argument(who + ": max_distance", "in (" + std::to_string(max_exact) + ", 2^24]",
                                    std::to_string(max_distance));
  // As transformers: f32 log of (distance / max_exact), over log(max_distance / max_exact) taken in f64 and
  // rounded to f32 (a Python float times a float tensor), times the large buckets, truncated.
  const float log_ratio = float(std::log(double(max_distance) / double(max_exact)));
  std::vector<int32_t> out(size_t(T * S));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < S; ++j) {
      int64_t rel = j - (kv_offset + i), bucket = 0;
      if (bidirectional) {
        if (rel > 0) bucket += per_side;
        rel = rel < 0 ? -rel : rel;
      } else {
        rel = rel < 0 ? -rel : 0;
      }
      if (rel < max_exact) {
        bucket += rel;
      } else {
        const float x = std::log(float(rel) / float(max_exact)) / log_ratio * float(per_side - max_exact);
        bucket += std::min<int64_t>(max_exact + int64_t(x), per_side - 1);
      }
      out[size_t(i * S + j)] = int32_t(bucket);
    }
  return out;
}

}  // namespace aspen::kernels
