#include "kernels/attention_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kernels/attention.h"

namespace aspen::kernels {
namespace {

using Kind = SparsityConfig::Kind;
using Attention = SparsityConfig::Attention;

// Made by scripts/golden/make_sparsity_golden.py from DeepSpeed 0.14.4's
// sparsity_config.py; the format is in the script's docstring.
const std::string kGoldens = std::string(ASPEN_KERNELS_TESTDATA) + "/sparsity_layouts.txt";

// One record: `layout`, `random` or `error`, its name, the FIELD=VALUE pairs
// (DeepSpeed's constructor arguments, kind and seq_len) and the bits.
struct Golden {
  std::string record, name;
  std::vector<std::pair<std::string, std::string>> fields;
  std::string bits;
  // The value of `key`, "" when absent.
  std::string get(const std::string& key) const {
    for (const auto& [k, v] : fields)
      if (k == key) return v;
    return "";
  }
};

const std::vector<Golden>& goldens() {
  static const std::vector<Golden> all = [] {
    std::vector<Golden> out;
    std::ifstream in(kGoldens);
    EXPECT_TRUE(in.good()) << kGoldens << ": cannot open (scripts/golden/make_sparsity_golden.py makes it)";
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream words(line);
      Golden g;
      words >> g.record >> g.name;
      std::string word;
      while (words >> word) {
        const size_t eq = word.find('=');
        EXPECT_NE(eq, std::string::npos) << g.name << ": '" << word << "' is not FIELD=VALUE";
        if (eq == std::string::npos) continue;
        std::string key = word.substr(0, eq), value = word.substr(eq + 1);
        if (key == "bits") {
          g.bits = std::move(value);
        } else {
          g.fields.emplace_back(std::move(key), std::move(value));
        }
      }
      out.push_back(std::move(g));
    }
    return out;
  }();
  return all;
}

std::vector<const Golden*> records(const std::string& record) {
  std::vector<const Golden*> out;
  for (const Golden& g : goldens())
    if (g.record == record) out.push_back(&g);
  return out;
}

int64_t to_int(const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  EXPECT_TRUE(ec == std::errc() && end == s.data() + s.size()) << "not an integer: '" << s << "'";
  return v;
}

bool to_bool(const std::string& s) {
  EXPECT_TRUE(s == "true" || s == "false") << "not a bool: '" << s << "'";
  return s == "true";
}

// "[1,2,3]" or "[]".
std::vector<int64_t> to_list(const std::string& s) {
  std::vector<int64_t> out;
  EXPECT_TRUE(s.size() >= 2 && s.front() == '[' && s.back() == ']') << "not a list: '" << s << "'";
  if (s.size() < 2) return out;
  std::istringstream items(s.substr(1, s.size() - 2));
  std::string item;
  while (std::getline(items, item, ',')) out.push_back(to_int(item));
  return out;
}

// aspen's factory for the record's kind (DeepSpeed's defaults), then the
// record's arguments: the goldens check the defaults too.
Result<SparsityConfig> config_of(const Golden& g) {
  const std::string kind = g.get("kind");
  const int64_t heads = to_int(g.get("num_heads"));
  SparsityConfig c;
  if (kind == "dense") {
    c = SparsityConfig::dense(heads);
  } else if (kind == "fixed") {
    c = SparsityConfig::fixed(heads);
  } else if (kind == "variable") {
    c = SparsityConfig::variable(heads);
  } else if (kind == "bigbird") {
    c = SparsityConfig::bigbird(heads);
  } else if (kind == "bslongformer") {
    c = SparsityConfig::bslongformer(heads);
  } else if (kind == "local_sliding_window") {
    c = SparsityConfig::local_sliding_window(heads);
  } else {
    ADD_FAILURE() << g.name << ": unknown kind '" << kind << "'";
  }
  EXPECT_EQ(sparsity_kind_name(c.kind), kind);
  for (const auto& [key, value] : g.fields) {
    if (key == "kind" || key == "seq_len" || key == "num_heads" || key == "candidates") continue;
    if (key == "block") {
      c.block = to_int(value);
    } else if (key == "different_layout_per_head") {
      c.different_layout_per_head = to_bool(value);
    } else if (key == "num_local_blocks") {
      c.num_local_blocks = to_int(value);
    } else if (key == "num_global_blocks") {
      c.num_global_blocks = to_int(value);
    } else if (key == "attention") {
      ASPEN_ASSIGN_OR_RETURN(c.attention, parse_attention(value));
    } else if (key == "horizontal_global_attention") {
      c.horizontal_global_attention = to_bool(value);
    } else if (key == "num_different_global_patterns") {
      c.num_different_global_patterns = to_int(value);
    } else if (key == "num_random_blocks") {
      c.num_random_blocks = to_int(value);
    } else if (key == "local_window_blocks") {
      c.local_window_blocks = to_list(value);
    } else if (key == "global_block_indices") {
      c.global_block_indices = to_list(value);
    } else if (key == "global_block_end_indices") {
      c.global_block_end_indices = to_list(value);
    } else if (key == "num_sliding_window_blocks") {
      c.num_sliding_window_blocks = to_int(value);
    } else {
      ADD_FAILURE() << g.name << ": unknown field '" << key << "'";
    }
  }
  return c;
}

Result<BlockLayout> layout_of(const Golden& g) {
  ASPEN_ASSIGN_OR_RETURN(SparsityConfig c, config_of(g));
  return make_layout(c, to_int(g.get("seq_len")));
}

std::string text_of(const std::vector<uint8_t>& bits) {
  std::string s(bits.size(), '0');
  for (size_t i = 0; i < bits.size(); ++i)
    if (bits[i] != 0) s[i] = '1';
  return s;
}

// "" when l's bits are `want` (one '0' or '1' per block), else where they first differ.
std::string first_difference(const BlockLayout& l, const std::string& want) {
  if (l.bits.size() != want.size())
    return std::to_string(l.bits.size()) + " blocks, expected " + std::to_string(want.size());
  const int64_t n = l.blocks;
  for (size_t i = 0; i < want.size(); ++i) {
    const int64_t at = int64_t(i);
    if ((l.bits[i] != 0) != (want[i] == '1'))
      return "head " + std::to_string(at / (n * n)) + ", query block " + std::to_string(at / n % n) + ", key block " +
             std::to_string(at % n) + ": " + std::to_string(int(l.bits[i])) + ", expected " + want[i];
  }
  return "";
}

// Rows of '0'/'1', one string per query block, heads one after another.
std::string rows(std::initializer_list<const char*> r) {
  std::string s;
  for (const char* row : r) s += row;
  return s;
}

template <class T>
std::string error_of(const Result<T>& r) {
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  return r.status().message();
}

TEST(SparsityLayout, GoldenFileHasEveryRecord) {
  EXPECT_EQ(records("layout").size(), 32u);
  EXPECT_EQ(records("random").size(), 7u);
  EXPECT_EQ(records("error").size(), 30u);
  EXPECT_EQ(goldens().size(), 69u) << "a record of an unknown kind";
}

// dense, fixed, variable, bslongformer, local_sliding_window and bigbird
// without random blocks: DeepSpeed's layout bit for bit.
TEST(SparsityLayout, DeterministicConfigsMatchDeepSpeed) {
  for (const Golden* g : records("layout")) {
    SCOPED_TRACE(g->name);
    const Result<BlockLayout> l = layout_of(*g);
    ASSERT_TRUE(l.is_ok()) << l.status().message();
    EXPECT_EQ(l->heads, to_int(g->get("num_heads")));
    EXPECT_EQ(l->blocks * l->block, to_int(g->get("seq_len")));
    EXPECT_EQ(first_difference(*l, g->bits), "");
    const Result<SparsityConfig> c = config_of(*g);
    const Result<std::vector<int64_t>> picks = random_blocks(*c, to_int(g->get("seq_len")));
    ASSERT_TRUE(picks.is_ok()) << picks.status().message();
    EXPECT_TRUE(picks->empty());
  }
}

// bigbird and variable with random blocks: DeepSpeed's layout without them
// plus, in every row, num_random_blocks distinct candidates (NOTE [random
// blocks] in attention_layout.cc); one draw for every head unless
// different_layout_per_head; the same for the same seed, another for another.
TEST(SparsityLayout, RandomConfigsMatchDeepSpeedOutsideTheRandomBlocks) {
  for (const Golden* g : records("random")) {
    SCOPED_TRACE(g->name);
    Result<SparsityConfig> cr = config_of(*g);
    ASSERT_TRUE(cr.is_ok()) << cr.status().message();
    SparsityConfig c = *cr;
    const int64_t seq_len = to_int(g->get("seq_len")), r = c.num_random_blocks;
    const bool causal = g->get("candidates") == "causal";
    ASSERT_TRUE(causal || g->get("candidates") == "all") << g->get("candidates");
    ASSERT_GT(r, 0);
    std::vector<std::string> seen;  // the layouts of each seed
    for (uint64_t seed : {7u, 8u, 9u}) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      c.seed = seed;
      const Result<BlockLayout> l = make_layout(c, seq_len);
      const Result<std::vector<int64_t>> picks = random_blocks(c, seq_len);
      ASSERT_TRUE(l.is_ok()) << l.status().message();
      ASSERT_TRUE(picks.is_ok()) << picks.status().message();
      const int64_t heads = l->heads, n = l->blocks;
      ASSERT_EQ(int64_t(picks->size()), heads * n * r);
      std::string want = g->bits;
      bool past_diagonal = false;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t row = 0; row < n; ++row) {
          const int64_t* p = picks->data() + (h * n + row) * r;
          for (int64_t i = 0; i < r; ++i) {
            ASSERT_GE(p[i], 0);
            ASSERT_LE(p[i], causal ? row : n - 1) << "head " << h << " row " << row;
            if (i > 0) {
              ASSERT_LT(p[i - 1], p[i]) << "head " << h << " row " << row;
            }
            past_diagonal = past_diagonal || p[i] > row;
            want[size_t((h * n + row) * n + p[i])] = '1';
          }
        }
        const bool same_as_head0 =
            std::equal(picks->begin() + h * n * r, picks->begin() + (h + 1) * n * r, picks->begin());
        if (!c.different_layout_per_head) {
          EXPECT_TRUE(same_as_head0) << "head " << h;
        } else if (h > 0 && r < n) {
          EXPECT_FALSE(same_as_head0) << "head " << h;
        }
      }
      EXPECT_EQ(first_difference(*l, want), "");
      // Candidates past the diagonal get drawn: bidirectional ones, and
      // unidirectional Variable's (NOTE [variable random blocks]).
      if (!causal && r < n) {
        EXPECT_TRUE(past_diagonal);
      }
      const Result<BlockLayout> again = make_layout(c, seq_len);
      ASSERT_TRUE(again.is_ok());
      EXPECT_EQ(again->bits, l->bits);
      seen.push_back(text_of(l->bits));
    }
    if (r < to_int(g->get("seq_len")) / c.block) {
      EXPECT_NE(seen[0], seen[1]);
      EXPECT_NE(seen[1], seen[2]);
    }
  }
}

// Every config DeepSpeed rejects (the golden `error` records; the file quotes
// DeepSpeed's exception above each) is a Status, worded:
// A prefix is the master's top-left corner, head by head; a fixed pattern's prefix is the layout of the
// shorter sequence itself.
TEST(SparsityLayout, PrefixIsTheMastersTopLeftCorner) {
  SparsityConfig c = SparsityConfig::bigbird(3);
  c.different_layout_per_head = true;
  c.num_random_blocks = 2;
  c.seed = 5;
  auto master = make_layout(c, 16 * 10);
  ASSERT_TRUE(master.is_ok()) << master.status().to_string();
  auto p = layout_prefix(*master, 4);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->heads, 3);
  EXPECT_EQ(p->blocks, 4);
  EXPECT_EQ(p->block, 16);
  ASSERT_EQ(p->bits.size(), size_t(3 * 4 * 4));
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t q = 0; q < 4; ++q)
      for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(p->at(h, q, k), master->at(h, q, k)) << h << " " << q << " " << k;
  auto whole = layout_prefix(*master, 10);
  ASSERT_TRUE(whole.is_ok());
  EXPECT_EQ(whole->bits, master->bits);
  SparsityConfig w = SparsityConfig::local_sliding_window(2);
  w.block = 8;
  auto long_one = make_layout(w, 8 * 12), short_one = make_layout(w, 8 * 5);
  ASSERT_TRUE(long_one.is_ok() && short_one.is_ok());
  EXPECT_EQ(layout_prefix(*long_one, 5)->bits, short_one->bits);
  EXPECT_EQ(layout_prefix(*master, 0).status().message(),
            "layout_prefix: blocks: expected in [1, 10] (the master layout's), found 0");
  EXPECT_EQ(layout_prefix(*master, 11).status().code(), Code::kInvalidArgument);
}

TEST(SparsityLayout, DeepSpeedsRejectionsAreStatuses) {
  const std::string row8 = "(the blocks in a row: seq_len 128 / block 16)";
  const std::map<std::string, std::string> want = {
      {"seq_len_not_multiple", "fixed sparsity: seq_len: expected a positive multiple of block (16), found 100"},
      {"seq_len_negative", "dense sparsity: seq_len: expected a positive multiple of block (16), found -32"},
      {"block_zero", "dense sparsity: block: expected >= 1, found 0"},
      {"fixed_heads_zero", "fixed sparsity: num_heads: expected >= 1, found 0"},
      {"fixed_local_not_multiple",
       "fixed sparsity: num_local_blocks: expected a multiple of num_global_blocks (3), found 4"},
      {"fixed_local_zero", "fixed sparsity: num_local_blocks: expected >= 1, found 0"},
      {"fixed_global_zero", "fixed sparsity: num_global_blocks: expected >= 1, found 0"},
      {"fixed_bad_attention", "attention: expected 'unidirectional' or 'bidirectional', found 'causal'"},
      {"fixed_horizontal_uni",
       "fixed sparsity: horizontal_global_attention: expected false with unidirectional attention, found true"},
      {"fixed_patterns_single_layout",
       "fixed sparsity: num_different_global_patterns: expected 1 when different_layout_per_head is false, found 2"},
      {"fixed_patterns_too_many",
       "fixed sparsity: num_different_global_patterns: expected <= num_local_blocks / num_global_blocks "
       "(4 / 2 = 2), found 3"},
      {"fixed_patterns_zero", "fixed sparsity: num_different_global_patterns: expected >= 1, found 0"},
      {"variable_bad_attention", "attention: expected 'unidirectional' or 'bidirectional', found 'Bidirectional'"},
      {"variable_horizontal_uni",
       "variable sparsity: horizontal_global_attention: expected false with unidirectional attention, found true"},
      {"variable_end_indices_length",
       "variable sparsity: global_block_end_indices: expected as many entries as global_block_indices (2) or none, "
       "found 1"},
      {"variable_end_index_not_after_start",
       "variable sparsity: global_block_end_indices[1]: expected > global_block_indices[1] (4), found 4"},
      {"variable_random_more_than_blocks",
       "variable sparsity: num_random_blocks: expected <= 16 (the blocks in a row: seq_len 256 / block 16), "
       "found 17"},
      {"variable_random_negative", "variable sparsity: num_random_blocks: expected >= 0, found -1"},
      {"variable_no_windows", "variable sparsity: local_window_blocks: expected at least one window size, found none"},
      {"variable_last_window_zero", "variable sparsity: local_window_blocks[1]: expected >= 1, found 0"},
      {"bigbird_bad_attention", "attention: expected 'unidirectional' or 'bidirectional', found 'causal'"},
      {"bigbird_random_more_than_blocks", "bigbird sparsity: num_random_blocks: expected <= 8 " + row8 + ", found 9"},
      {"bigbird_random_negative", "bigbird sparsity: num_random_blocks: expected >= 0, found -1"},
      {"bigbird_uni_random2",
       "bigbird sparsity: num_random_blocks: expected <= 1 with unidirectional attention (query block 0 has one "
       "candidate), found 2"},
      {"bigbird_window_more_than_blocks",
       "bigbird sparsity: num_sliding_window_blocks: expected <= 8 " + row8 + ", found 9"},
      {"bigbird_global_more_than_blocks", "bigbird sparsity: num_global_blocks: expected <= 8 " + row8 + ", found 9"},
      {"bslongformer_end_indices_length",
       "bslongformer sparsity: global_block_end_indices: expected as many entries as global_block_indices (1) or "
       "none, found 2"},
      {"bslongformer_end_index_not_after_start",
       "bslongformer sparsity: global_block_end_indices[0]: expected > global_block_indices[0] (5), found 3"},
      {"bslongformer_window_more_than_blocks",
       "bslongformer sparsity: num_sliding_window_blocks: expected <= 8 " + row8 + ", found 9"},
      {"local_window_more_than_blocks",
       "local_sliding_window sparsity: num_sliding_window_blocks: expected <= 8 " + row8 + ", found 9"},
  };
  size_t checked = 0;
  for (const Golden* g : records("error")) {
    SCOPED_TRACE(g->name);
    const auto it = want.find(g->name);
    ASSERT_TRUE(it != want.end()) << "no expected message for this DeepSpeed rejection";
    EXPECT_EQ(error_of(layout_of(*g)), it->second);
    ++checked;
  }
  EXPECT_EQ(checked, want.size());
}

// Configs DeepSpeed runs only by accident of Python (a negative index counts
// from the end, a negative window or zero-sized local window silently sets
// nothing, an empty layout of seq_len 0) and values out of the enums.
TEST(SparsityLayout, ConfigsDeepSpeedAcceptsByAccidentAreRefused) {
  SparsityConfig c = SparsityConfig::variable(2);
  c.global_block_indices = {0, -2};
  EXPECT_EQ(error_of(make_layout(c, 256)), "variable sparsity: global_block_indices[1]: expected >= 0, found -2");
  c = SparsityConfig::variable(2);
  c.global_block_indices = {};
  c.global_block_end_indices = {3};
  EXPECT_EQ(error_of(make_layout(c, 256)),
            "variable sparsity: global_block_end_indices: expected as many entries as global_block_indices (0) or "
            "none, found 1");
  c = SparsityConfig::variable(2);
  c.local_window_blocks = {2, 0, 3};
  EXPECT_EQ(error_of(make_layout(c, 256)), "variable sparsity: local_window_blocks[1]: expected >= 1, found 0");
  c.local_window_blocks = {-1};
  EXPECT_EQ(error_of(make_layout(c, 256)), "variable sparsity: local_window_blocks[0]: expected >= 1, found -1");

  c = SparsityConfig::bslongformer(2);
  c.global_block_indices = {-1};
  EXPECT_EQ(error_of(make_layout(c, 256)), "bslongformer sparsity: global_block_indices[0]: expected >= 0, found -1");
  c = SparsityConfig::bslongformer(2);
  c.num_sliding_window_blocks = -1;
  EXPECT_EQ(error_of(make_layout(c, 256)), "bslongformer sparsity: num_sliding_window_blocks: expected >= 0, found -1");

  c = SparsityConfig::bigbird(2);
  c.num_global_blocks = -1;
  EXPECT_EQ(error_of(make_layout(c, 256)), "bigbird sparsity: num_global_blocks: expected >= 0, found -1");
  c = SparsityConfig::bigbird(2);
  c.num_sliding_window_blocks = -3;
  EXPECT_EQ(error_of(make_layout(c, 256)), "bigbird sparsity: num_sliding_window_blocks: expected >= 0, found -3");

  c = SparsityConfig::local_sliding_window(2);
  c.num_sliding_window_blocks = -2;
  EXPECT_EQ(error_of(make_layout(c, 256)),
            "local_sliding_window sparsity: num_sliding_window_blocks: expected >= 0, found -2");

  EXPECT_EQ(error_of(make_layout(SparsityConfig::dense(2), 0)),
            "dense sparsity: seq_len: expected a positive multiple of block (16), found 0");
  EXPECT_EQ(error_of(make_layout(SparsityConfig::dense(0), 128)), "dense sparsity: num_heads: expected >= 1, found 0");

  c = SparsityConfig::dense(2);
  c.kind = static_cast<Kind>(17);
  EXPECT_EQ(error_of(make_layout(c, 128)),
            "sparsity config: kind: expected one of dense, fixed, variable, bigbird, bslongformer, "
            "local_sliding_window, found Kind(17)");
  c = SparsityConfig::fixed(2);
  c.attention = static_cast<Attention>(5);
  EXPECT_EQ(error_of(make_layout(c, 128)),
            "fixed sparsity: attention: expected unidirectional or bidirectional, found Attention(5)");
  c = SparsityConfig::dense(2);
  c.attention = static_cast<Attention>(5);  // dense reads no attention
  EXPECT_TRUE(make_layout(c, 128).is_ok());

  // Too many blocks to hold: rows of 2^17 blocks, or 2^40 heads.
  c = SparsityConfig::dense(1);
  c.block = 1;
  EXPECT_EQ(error_of(make_layout(c, int64_t(1) << 17)),
            "dense sparsity: layout: expected at most 4294967296 blocks (heads * blocks * blocks), found 1 * 131072 * "
            "131072");
  EXPECT_EQ(error_of(make_layout(SparsityConfig::dense(int64_t(1) << 40), 16)),
            "dense sparsity: layout: expected at most 4294967296 blocks (heads * blocks * blocks), found "
            "1099511627776 * 1 * 1");

  EXPECT_EQ(error_of(parse_attention("")), "attention: expected 'unidirectional' or 'bidirectional', found ''");
  // random_blocks checks what make_layout checks.
  EXPECT_EQ(error_of(random_blocks(SparsityConfig::bigbird(2), 100)),
            "bigbird sparsity: seq_len: expected a positive multiple of block (16), found 100");
}

// validate() is the constructor's half: what does not depend on seq_len.
TEST(SparsityLayout, ValidateChecksWhatDoesNotNeedSeqLen) {
  SparsityConfig c = SparsityConfig::bigbird(2);
  c.num_random_blocks = 100;  // more than any short sequence has: make_layout's check
  EXPECT_TRUE(validate(c).is_ok());
  EXPECT_EQ(error_of(make_layout(c, 256)),
            "bigbird sparsity: num_random_blocks: expected <= 16 (the blocks in a row: seq_len 256 / block 16), found "
            "100");
  c = SparsityConfig::fixed(2);
  c.num_global_blocks = 3;
  const Status s = validate(c);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "fixed sparsity: num_local_blocks: expected a multiple of num_global_blocks (3), found 4");
}

// The arguments of DeepSpeed's constructors, defaults and all.
TEST(SparsityLayout, FactoriesCarryDeepSpeedsDefaults) {
  for (const SparsityConfig& c :
       {SparsityConfig::dense(3), SparsityConfig::fixed(3), SparsityConfig::variable(3), SparsityConfig::bigbird(3),
        SparsityConfig::bslongformer(3), SparsityConfig::local_sliding_window(3)}) {
    SCOPED_TRACE(sparsity_kind_name(c.kind));
    EXPECT_EQ(c.num_heads, 3);
    EXPECT_EQ(c.block, 16);
    EXPECT_FALSE(c.different_layout_per_head);
    EXPECT_EQ(c.seed, 0u);
  }
  const SparsityConfig f = SparsityConfig::fixed(3);
  EXPECT_EQ(f.kind, Kind::fixed);
  EXPECT_EQ(f.num_local_blocks, 4);
  EXPECT_EQ(f.num_global_blocks, 1);
  EXPECT_EQ(f.attention, Attention::bidirectional);
  EXPECT_FALSE(f.horizontal_global_attention);
  EXPECT_EQ(f.num_different_global_patterns, 1);

  const SparsityConfig v = SparsityConfig::variable(3);
  EXPECT_EQ(v.kind, Kind::variable);
  EXPECT_EQ(v.num_random_blocks, 0);
  EXPECT_EQ(v.local_window_blocks, std::vector<int64_t>{4});
  EXPECT_EQ(v.global_block_indices, std::vector<int64_t>{0});
  EXPECT_TRUE(v.global_block_end_indices.empty());
  EXPECT_EQ(v.attention, Attention::bidirectional);
  EXPECT_FALSE(v.horizontal_global_attention);

  const SparsityConfig b = SparsityConfig::bigbird(3);
  EXPECT_EQ(b.kind, Kind::bigbird);
  EXPECT_EQ(b.num_random_blocks, 1);
  EXPECT_EQ(b.num_sliding_window_blocks, 3);
  EXPECT_EQ(b.num_global_blocks, 1);
  EXPECT_EQ(b.attention, Attention::bidirectional);

  const SparsityConfig l = SparsityConfig::bslongformer(3);
  EXPECT_EQ(l.kind, Kind::bslongformer);
  EXPECT_EQ(l.num_sliding_window_blocks, 3);
  EXPECT_EQ(l.global_block_indices, std::vector<int64_t>{0});
  EXPECT_TRUE(l.global_block_end_indices.empty());
  EXPECT_EQ(l.attention, Attention::bidirectional);

  const SparsityConfig w = SparsityConfig::local_sliding_window(3);
  EXPECT_EQ(w.kind, Kind::local_sliding_window);
  EXPECT_EQ(w.num_sliding_window_blocks, 3);
  EXPECT_EQ(w.attention, Attention::unidirectional);

  EXPECT_EQ(SparsityConfig::dense(3).kind, Kind::dense);
}

// A few layouts small enough to read, DeepSpeed's quirks among them.
TEST(SparsityLayout, SmallLayoutsByHand) {
  // The default local window: 3 blocks, unidirectional, so w = 1 block back.
  Result<BlockLayout> l = make_layout(SparsityConfig::local_sliding_window(1), 80);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(first_difference(*l, rows({"10000", "11000", "01100", "00110", "00011"})), "");

  // NOTE [symmetric sliding window]: a window of 4 reaches 2 blocks each side.
  SparsityConfig c = SparsityConfig::local_sliding_window(1);
  c.num_sliding_window_blocks = 4;
  c.attention = Attention::bidirectional;
  l = make_layout(c, 96);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(first_difference(*l, rows({"111000", "111100", "111110", "011111", "001111", "000111"})), "");

  // NOTE [fixed unidirectional global groups]: rows 2, 6 and 8 attend the
  // next block, the rest of their global group.
  c = SparsityConfig::fixed(1);
  c.num_global_blocks = 2;
  c.attention = Attention::unidirectional;
  l = make_layout(c, 160);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(first_difference(*l, rows({"1000000000", "1100000000", "1111000000", "1111000000", "0011100000",
                                       "0011110000", "0011111100", "0011111100", "0011001111", "0011001111"})),
            "");

  // NOTE [fixed negative start]: 5 blocks, a global group of 8: the start
  // 5 - 8 = -3 is block 2 to Python.
  c = SparsityConfig::fixed(1);
  c.num_local_blocks = 8;
  c.num_global_blocks = 8;
  c.attention = Attention::unidirectional;
  l = make_layout(c, 80);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(first_difference(*l, rows({"10000", "11000", "11111", "11111", "11111"})), "");

  // NOTE [variable global blocks]: windows 1, 2, then 2 again; the global
  // range [3, 5) lets row 3 attend block 4.
  c = SparsityConfig::variable(1);
  c.local_window_blocks = {1, 2};
  c.global_block_indices = {3};
  c.global_block_end_indices = {5};
  c.attention = Attention::unidirectional;
  l = make_layout(c, 96);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(first_difference(*l, rows({"100000", "010000", "011000", "000110", "000110", "000111"})), "");
}

// The draws are pinned: a seed gives these blocks on every machine.
TEST(SparsityLayout, RandomDrawsArePinned) {
  // Variable with only the diagonal as local window and no global block: the
  // random blocks stand out.
  SparsityConfig c = SparsityConfig::variable(1);
  c.local_window_blocks = {1};
  c.global_block_indices = {};
  c.num_random_blocks = 2;
  c.seed = 5;
  Result<std::vector<int64_t>> picks = random_blocks(c, 96);
  ASSERT_TRUE(picks.is_ok()) << picks.status().message();
  EXPECT_EQ(*picks, (std::vector<int64_t>{1, 4, 0, 2, 2, 4, 1, 2, 2, 5, 2, 4}));
  const Result<BlockLayout> l = make_layout(c, 96);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(first_difference(*l, rows({"110010", "111000", "001010", "011100", "001011", "001011"})), "");

  // Unidirectional BigBird, a layout per head: one block among 0..row.
  c = SparsityConfig::bigbird(2);
  c.attention = Attention::unidirectional;
  c.different_layout_per_head = true;
  c.seed = 99;
  picks = random_blocks(c, 96);
  ASSERT_TRUE(picks.is_ok()) << picks.status().message();
  EXPECT_EQ(*picks, (std::vector<int64_t>{0, 1, 0, 3, 3, 4, 0, 0, 1, 1, 4, 3}));
}

// Each candidate is about equally likely: 4000 seeds of 3 blocks among 8 put
// each block in each row about 1500 times (the pinned draws give 1436..1573).
TEST(SparsityLayout, RandomDrawsAreUniform) {
  SparsityConfig c = SparsityConfig::bigbird(1);
  c.num_random_blocks = 3;
  std::vector<int64_t> count(64, 0);  // [row, key block]
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    c.seed = seed;
    const Result<std::vector<int64_t>> picks = random_blocks(c, 128);
    ASSERT_TRUE(picks.is_ok()) << picks.status().message();
    for (size_t i = 0; i < picks->size(); ++i) ++count[i / 3 * 8 + size_t((*picks)[i])];
  }
  for (size_t i = 0; i < count.size(); ++i) {
    EXPECT_GE(count[i], 1350) << "row " << i / 8 << " block " << i % 8;
    EXPECT_LE(count[i], 1650) << "row " << i / 8 << " block " << i % 8;
  }
}

TEST(SparsityLayout, Names) {
  EXPECT_STREQ(sparsity_kind_name(Kind::local_sliding_window), "local_sliding_window");
  EXPECT_STREQ(sparsity_kind_name(Kind::bslongformer), "bslongformer");
  EXPECT_STREQ(sparsity_kind_name(static_cast<Kind>(17)), "unknown");
  for (Attention a : {Attention::bidirectional, Attention::unidirectional}) {
    const Result<Attention> parsed = parse_attention(attention_name(a));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_EQ(error_of(parse_attention("Unidirectional")),
            "attention: expected 'unidirectional' or 'bidirectional', found 'Unidirectional'");
  for (Kind k : {Kind::dense, Kind::fixed, Kind::variable, Kind::bigbird, Kind::bslongformer,
                 Kind::local_sliding_window}) {
    const Result<Kind> parsed = parse_sparsity_kind(sparsity_kind_name(k));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, k);
    EXPECT_EQ(SparsityConfig::of(k, 3).kind, k);
    EXPECT_EQ(SparsityConfig::of(k, 3).num_heads, 3);
  }
  EXPECT_EQ(SparsityConfig::of(Kind::bigbird, 2).num_random_blocks, SparsityConfig::bigbird(2).num_random_blocks);
  EXPECT_EQ(error_of(parse_sparsity_kind("BigBird")),
            "kind: expected one of dense, fixed, variable, bigbird, bslongformer, local_sliding_window, found "
            "'BigBird'");
}

// The header's example: a layout is an AttentionMask's layout as it is.
TEST(SparsityLayout, PlugsIntoAttention) {
  SparsityConfig c = SparsityConfig::bigbird(2);
  c.different_layout_per_head = true;
  c.seed = 3;
  const Result<BlockLayout> l = make_layout(c, 64);
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  const int64_t B = 1, H = 2, T = 64, D = 8;
  std::vector<float> q(size_t(B * H * T * D)), out(q.size()), lse(size_t(B * H * T));
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.1f * float(i));
  const AttentionMask mask{.layout = l->bits, .layout_block = l->block, .layout_heads = l->heads};
  ASSERT_TRUE(attention_forward(q, q, q, out, lse, B, H, H, T, T, D, 0.35f, mask).is_ok());
  for (float o : out) ASSERT_TRUE(std::isfinite(o));
}

TEST(BlockLayout, FromBitsAndAccessors) {
  // Two heads of 2 x 2 blocks: head 0 causal, head 1 dense.
  const Result<BlockLayout> l = layout_from_bits(2, 2, 32, {1, 0, 1, 1, 1, 1, 1, 1});
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(l->heads, 2);
  EXPECT_EQ(l->blocks, 2);
  EXPECT_EQ(l->block, 32);
  EXPECT_TRUE(l->at(0, 0, 0));
  EXPECT_FALSE(l->at(0, 0, 1));
  EXPECT_TRUE(l->at(0, 1, 0));
  EXPECT_TRUE(l->at(1, 0, 1));
  EXPECT_EQ(l->count(), 7);
  EXPECT_DOUBLE_EQ(l->density(), 7.0 / 8.0);
  EXPECT_EQ(BlockLayout{}.count(), 0);
  EXPECT_EQ(BlockLayout{}.density(), 0.0);

  const Result<BlockLayout> dense = make_layout(SparsityConfig::dense(2), 128);
  ASSERT_TRUE(dense.is_ok());
  EXPECT_EQ(dense->count(), 128);
  EXPECT_DOUBLE_EQ(dense->density(), 1.0);
}

TEST(BlockLayout, FromBitsErrors) {
  EXPECT_EQ(error_of(layout_from_bits(0, 2, 16, {})), "layout_from_bits: heads: expected >= 1, found 0");
  EXPECT_EQ(error_of(layout_from_bits(1, 0, 16, {})), "layout_from_bits: blocks: expected >= 1, found 0");
  EXPECT_EQ(error_of(layout_from_bits(1, 2, 0, {1, 1, 1, 1})), "layout_from_bits: block: expected >= 1, found 0");
  EXPECT_EQ(error_of(layout_from_bits(2, 3, 16, std::vector<uint8_t>(17, 1))),
            "layout_from_bits: bits: expected 18 values (heads * blocks * blocks = 2 * 3 * 3), found 17");
  std::vector<uint8_t> bits(18, 1);
  bits[13] = 2;
  EXPECT_EQ(error_of(layout_from_bits(2, 3, 16, bits)),
            "layout_from_bits: bits[13] (head 1, query block 1, key block 1): expected 0 or 1, found 2");
  EXPECT_EQ(error_of(layout_from_bits(1, int64_t(1) << 17, 16, {})),
            "layout_from_bits: layout: expected at most 4294967296 blocks (heads * blocks * blocks), found 1 * 131072 "
            "* 131072");
}

}  // namespace
}  // namespace aspen::kernels

namespace aspen::kernels {
namespace {

// Made by scripts/golden/make_t5_bucket_golden.py from transformers' T5Attention; the format is in its docstring.
TEST(T5RelativeBuckets, MatchTransformers) {
  const std::string path = std::string(ASPEN_KERNELS_TESTDATA) + "/t5_buckets.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << ": cannot open (scripts/golden/make_t5_bucket_golden.py makes it)";
  int64_t range = 0;
  in >> range;
  ASSERT_GT(range, 0);
  int cases = 0;
  int bidirectional = 0;
  int64_t num_buckets = 0, max_distance = 0;
  while (in >> bidirectional >> num_buckets >> max_distance) {
    SCOPED_TRACE("bidirectional " + std::to_string(bidirectional) + " num_buckets " + std::to_string(num_buckets) +
                 " max_distance " + std::to_string(max_distance));
    std::vector<int32_t> want(size_t(2 * range + 1));
    for (int32_t& w : want) in >> w;
    ASSERT_TRUE(in.good());
    // One query at position `range` against keys 0 .. 2 range: relative positions -range .. range.
    auto got = t5_relative_buckets(1, 2 * range + 1, range, bidirectional != 0, num_buckets, max_distance);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(*got, want);
    ++cases;
  }
  EXPECT_EQ(cases, 6);
  // [T, S] with an offset: row i, key j is relative position j - (offset + i).
  auto grid = t5_relative_buckets(3, 5, 2, true, 8, 16);
  ASSERT_TRUE(grid.is_ok());
  auto line = t5_relative_buckets(1, 11, 5, true, 8, 16);  // relative -5 .. 5
  ASSERT_TRUE(line.is_ok());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ((*grid)[size_t(i * 5 + j)], (*line)[size_t(j - (2 + i) + 5)]);
}

TEST(T5RelativeBuckets, BadArgumentsAreNamed) {
  auto r = t5_relative_buckets(2, 2, 0, true, 3, 128);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "t5_relative_buckets: num_buckets: expected in [4, 2^20] (bidirectional), found 3");
  r = t5_relative_buckets(2, 2, 0, false, 32, 16);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "t5_relative_buckets: max_distance: expected in (16, 2^24], found 16");
  r = t5_relative_buckets(-1, 2, 0, false, 32, 128);
  EXPECT_FALSE(r.is_ok());
}

}  // namespace
}  // namespace aspen::kernels
