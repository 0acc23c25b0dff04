// train/data_test.cc: token shards (writer, index, reader) and the data loader.
#include "train/data.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "io/test_files.h"

namespace aspen::train {
namespace {

namespace fs = std::filesystem;
using io::test_files::read_bytes;
using io::test_files::TempDir;
using io::test_files::write_bytes;



std::unique_ptr<io::Tokenizer> bpe1k() {
  auto t = io::load_tokenizer(ASPEN_BPE1K_DIR);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

std::string shakespeare_path() {
  const char* env = std::getenv("ASPEN_SHARED_DIR");
  return env ? std::string(env) + "/data/tinyshakespeare.txt" : std::string(ASPEN_TINYSHAKESPEARE);
}

std::vector<int32_t> read_all(const TokenDataset& d) {
  std::vector<int32_t> all(static_cast<size_t>(d.size()));
  Status s = d.read(0, all);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return all;
}

// Writes `docs` (token ids) with vocabulary `vocab` and eos `eos` into `dir`.
TokenIndex write_docs(const std::string& dir, const std::vector<std::vector<io::TokenId>>& docs, int64_t vocab,
                      int32_t eos, int64_t shard_tokens) {
  TokenShardWriterOptions o;
  o.vocab_size = vocab;
  o.eos_id = eos;
  o.shard_tokens = shard_tokens;
  auto w = TokenShardWriter::create(dir, o);
  EXPECT_TRUE(w.is_ok()) << w.status().to_string();
  for (const auto& d : docs) EXPECT_TRUE(w->add_document(d).is_ok());
  auto idx = w->finish();
  EXPECT_TRUE(idx.is_ok()) << idx.status().to_string();
  return *idx;
}

// A stream of `n` tokens 0, 1, 2, ... (mod 60000) as one document, so that a
// token's value tells its position; eos is 60000 (the last token).
std::string counting_dataset(const TempDir& t, int64_t n, int64_t shard_tokens) {
  std::vector<io::TokenId> ids(static_cast<size_t>(n - 1));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 60000);
  write_docs(t.path(), {ids}, 60001, 60000, shard_tokens);
  return t.path();
}

TEST(TokenShards, SmallStringsRoundTrip) {
  auto tok = bpe1k();
  TempDir t;
  const std::vector<std::string> texts = {"Hello world.\n", "First Citizen:\nBefore we proceed any further",
                                          "", "ROMEO: o, she doth teach the torches to burn bright!"};
  PrepareOptions o;
  o.tokenizer_dir = ASPEN_BPE1K_DIR;
  o.output_dir = t / "out";
  for (size_t i = 0; i < texts.size(); ++i) {
    write_bytes(t / ("in" + std::to_string(i) + ".txt"), texts[i]);
    o.inputs.push_back(t / ("in" + std::to_string(i) + ".txt"));
  }
  auto stats = prepare_token_shards(*tok, o);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  const int32_t eos = *tok->special_ids().eos;
  std::vector<int32_t> want;
  for (const std::string& text : texts) {
    const auto ids = tok->encode(text, false);
    if (ids.empty()) continue;  // an empty document is skipped
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(eos);
  }
  EXPECT_EQ(stats->index.documents, 3);
  EXPECT_EQ(stats->index.total_tokens, int64_t(want.size()));
  EXPECT_EQ(stats->index.inputs.size(), texts.size());
  EXPECT_EQ(stats->index.inputs[0].bytes, int64_t(texts[0].size()));
  EXPECT_EQ(stats->index.inputs[0].hash, fnv1a64_hex(texts[0]));
  auto fp = tokenizer_fingerprint(ASPEN_BPE1K_DIR);
  ASSERT_TRUE(fp.is_ok());
  EXPECT_EQ(stats->index.tokenizer_hash, *fp);

  auto d = TokenDataset::open(o.output_dir);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(read_all(*d), want);
  EXPECT_EQ(d->index().dtype, TokenDType::u16);
  EXPECT_EQ(d->index().eos_id, eos);
  EXPECT_EQ(d->index().tokenizer_hash, *fp);
  // Decoding the stream between eos tokens gives the documents back.
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t id : read_all(*d)) {
    if (id == eos) {
      docs.push_back(tok->decode(cur));
      cur.clear();
    } else {
      cur.push_back(id);
    }
  }
  EXPECT_EQ(docs, (std::vector<std::string>{texts[0], texts[1], texts[3]}));

  // --split-lines: each non-empty line a document.
  o.output_dir = t / "lines";
  o.split_lines = true;
  stats = prepare_token_shards(*tok, o);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  EXPECT_EQ(stats->index.documents, 4);  // "Hello world.", "First Citizen:", "Before ...", "ROMEO: ..."
}

// A WordPiece tokenizer has no eos: each document is framed [CLS] ... [SEP] and [SEP] is the index's eos.
TEST(TokenShards, WordPieceDocumentsFramedByClsAndSep) {
  auto tok = io::load_tokenizer(ASPEN_WORDPIECE_TINY_DIR);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const io::SpecialTokenIds& special = (*tok)->special_ids();
  ASSERT_FALSE(special.eos.has_value());
  ASSERT_TRUE(special.cls && special.sep);
  TempDir t;
  const std::vector<std::string> texts = {"the quick brown fox jumps", "", "over the lazy dog!"};
  PrepareOptions o;
  o.tokenizer_dir = ASPEN_WORDPIECE_TINY_DIR;
  o.output_dir = t / "out";
  for (size_t i = 0; i < texts.size(); ++i) {
    write_bytes(t / ("in" + std::to_string(i) + ".txt"), texts[i]);
    o.inputs.push_back(t / ("in" + std::to_string(i) + ".txt"));
  }
  auto stats = prepare_token_shards(**tok, o);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  std::vector<int32_t> want;
  for (const std::string& text : texts) {
    if (text.empty()) continue;
    const auto ids = (*tok)->encode(text, true);  // the post-processor's [CLS] ... [SEP]
    ASSERT_EQ(ids.front(), *special.cls);
    ASSERT_EQ(ids.back(), *special.sep);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(stats->index.documents, 2);
  EXPECT_EQ(stats->index.eos_id, *special.sep);
  auto d = TokenDataset::open(o.output_dir);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(read_all(*d), want);
}

TEST(TokenShards, TinyShakespeareRoundTrip) {
  const std::string path = shakespeare_path();
  const std::string text = read_bytes(path);
  ASSERT_FALSE(text.empty()) << "cannot read " << path << " (set ASPEN_SHARED_DIR to the shared folder)";
  auto tok = bpe1k();
  TempDir t;
  PrepareOptions o;
  o.tokenizer_dir = ASPEN_BPE1K_DIR;
  o.inputs = {path};
  o.output_dir = t.path();
  o.shard_tokens = 100000;
  auto stats = prepare_token_shards(*tok, o);
  ASSERT_TRUE(stats.is_ok()) << stats.status().to_string();
  const auto ids = tok->encode(text, false);
  const int64_t n = int64_t(ids.size()) + 1;
  EXPECT_EQ(stats->index.total_tokens, n);
  EXPECT_EQ(stats->input_bytes, int64_t(text.size()));
  ASSERT_EQ(stats->index.shards.size(), size_t((n + 99999) / 100000));
  for (size_t i = 0; i + 1 < stats->index.shards.size(); ++i) EXPECT_EQ(stats->index.shards[i].tokens, 100000);
  auto d = TokenDataset::open(t.path());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  std::vector<int32_t> all = read_all(*d);
  ASSERT_EQ(all.size(), size_t(n));
  EXPECT_EQ(all.back(), *tok->special_ids().eos);
  all.pop_back();
  EXPECT_EQ(all, ids);
  EXPECT_EQ(tok->decode(all), text);  // byte-level BPE is lossless
  // Shard files are exactly header + tokens.
  EXPECT_EQ(fs::file_size(t / stats->index.shards[0].name), kTokenShardHeaderBytes + 100000 * 2);
}

TEST(TokenShards, DtypeFollowsVocabulary) {
  EXPECT_EQ(token_dtype_for_vocab(1000), TokenDType::u16);
  EXPECT_EQ(token_dtype_for_vocab(65536), TokenDType::u16);  // ids 0..65535 fit
  EXPECT_EQ(token_dtype_for_vocab(65537), TokenDType::u32);
  TempDir t;
  const std::vector<io::TokenId> doc = {0, 65535, 65536, 99999, 7};
  auto idx = write_docs(t.path(), {doc}, 100000, 1, 1 << 20);
  EXPECT_EQ(idx.dtype, TokenDType::u32);
  const std::string shard = read_bytes(t / idx.shards[0].name);
  ASSERT_EQ(shard.size(), kTokenShardHeaderBytes + 6 * 4);
  EXPECT_EQ(shard.substr(0, 8), "ASPNTOK1");
  EXPECT_EQ(shard[12], 4);  // width
  EXPECT_EQ(shard[16], 6);  // count
  // 65536 little-endian at token 2.
  EXPECT_EQ(shard.substr(kTokenShardHeaderBytes + 8, 4), std::string("\x00\x00\x01\x00", 4));
  auto d = TokenDataset::open(t.path());
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(read_all(*d), (std::vector<int32_t>{0, 65535, 65536, 99999, 7, 1}));
  EXPECT_NE(read_bytes(t / "index.json").find("\"dtype\": \"uint32\""), std::string::npos);

  TempDir t16;
  idx = write_docs(t16.path(), {{3, 65535}}, 65536, 0, 16);
  EXPECT_EQ(idx.dtype, TokenDType::u16);
  EXPECT_EQ(fs::file_size(t16 / idx.shards[0].name), kTokenShardHeaderBytes + 3 * 2);
}

TEST(TokenShards, WriterRejectsBadInput) {
  TempDir t;
  TokenShardWriterOptions o;
  o.vocab_size = 10;
  o.eos_id = 10;
  auto w = TokenShardWriter::create(t.path(), o);
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(w.status().message(), "eos id: expected in [0, vocab_size=10), found 10");
  o.eos_id = 9;
  w = TokenShardWriter::create(t.path(), o);
  ASSERT_TRUE(w.is_ok());
  const std::vector<io::TokenId> bad = {1, 2, 12};
  Status s = w->add_document(bad);
  EXPECT_EQ(s.message(), "document 0: token 2: expected an id in [0, 10), found 12");
  EXPECT_EQ(w->tokens(), 0);  // a rejected document leaves nothing behind
  ASSERT_TRUE(w->add_document(std::vector<io::TokenId>{1, 2}).is_ok());
  EXPECT_EQ(w->tokens(), 3);

  // A tokenizer with neither an end-of-text token nor [CLS] and [SEP] cannot separate documents.
  write_bytes(t / "vocab.txt", "[UNK]\nthe\nfox\n");
  auto wp = io::load_wordpiece_vocab(t / "vocab.txt");
  ASSERT_TRUE(wp.is_ok()) << wp.status().to_string();
  ASSERT_FALSE((*wp)->special_ids().eos.has_value() || (*wp)->special_ids().sep.has_value());
  PrepareOptions po;
  po.inputs = {t / "x.txt"};
  po.output_dir = t / "out";
  auto r = prepare_token_shards(**wp, po);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("expected an end-of-text (eos) token"), std::string::npos)
      << r.status().message();

  auto tok = bpe1k();
  po.inputs = {t / "missing.txt"};
  r = prepare_token_shards(*tok, po);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("missing.txt"), std::string::npos);
}

TEST(TokenShards, ReadsAcrossShardBoundaries) {
  TempDir t;
  const std::string dir = counting_dataset(t, 100, 7);  // 15 shards: 14 of 7 tokens, one of 2
  auto d = TokenDataset::open(dir);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  ASSERT_EQ(d->index().shards.size(), 15u);
  for (int64_t begin : {0, 5, 6, 7, 13, 40, 90}) {
    for (int64_t n : {1, 2, 8, 9, 10}) {
      if (begin + n > 100) continue;
      std::vector<int32_t> out(static_cast<size_t>(n));
      ASSERT_TRUE(d->read(begin, out).is_ok());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = begin + i;
        EXPECT_EQ(out[size_t(i)], pos == 99 ? 60000 : int32_t(pos)) << begin << "+" << i;
      }
    }
  }
  std::vector<int32_t> out(5);
  Status s = d->read(98, out);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("expected a range inside [0, 100)"), std::string::npos) << s.message();

  // An example of seq + 1 tokens spanning shards: targets are inputs shifted.
  DataLoaderOptions lo;
  lo.seq = 5;
  lo.micro_batch = 3;
  auto l = DataLoader::open(dir, lo);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_EQ(l->num_examples(), 19);  // (100 - 1) / 5
  const std::vector<int64_t> ex = {1, 2, 13};  // tokens [5,10], [10,15], [65,70]
  auto b = l->make_batch(ex);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->inputs.shape(), (Shape{3, 5}));
  EXPECT_EQ(b->inputs.dtype(), DType::i32);
  for (size_t e = 0; e < 3; ++e)
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(b->inputs.data<int32_t>()[e * 5 + size_t(i)], ex[e] * 5 + i);
      EXPECT_EQ(b->targets.data<int32_t>()[e * 5 + size_t(i)], ex[e] * 5 + i + 1);
    }
}

TEST(DataLoader, ValidationSplitIsDisjointTailAndStable) {
  TempDir t;
  const std::string dir = counting_dataset(t, 1001, 64);
  DataLoaderOptions o;
  o.seq = 10;
  o.micro_batch = 2;
  o.val_fraction = 0.1;
  auto l = DataLoader::open(dir, o);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  EXPECT_EQ(l->num_examples(), 100);
  EXPECT_EQ(l->val_examples(), 10);
  EXPECT_EQ(l->train_examples(), 89);  // one example of gap
  EXPECT_EQ(l->val_begin(), 90);
  // Training tokens end before the first validation input.
  EXPECT_LE((l->train_examples() - 1) * o.seq + o.seq, l->val_begin() * o.seq - 1);
  std::set<int64_t> train;
  for (int64_t s = 0; s < l->steps_per_epoch(); ++s)
    for (int64_t e : l->batch_examples(0, s)) train.insert(e);
  EXPECT_LT(*train.rbegin(), 89);
  ASSERT_EQ(l->val_steps(), 5);
  for (int64_t i = 0; i < l->val_steps(); ++i) {
    auto b = l->val_batch(i);
    ASSERT_TRUE(b.is_ok());
    const int64_t ex = 90 + 2 * i;
    EXPECT_EQ(b->inputs.data<int32_t>()[0], int32_t(ex * 10));
    EXPECT_FALSE(train.count(ex));
  }
  // Another seed: another training order, the same validation examples.
  o.seed = 1234;
  auto l2 = DataLoader::open(dir, o);
  ASSERT_TRUE(l2.is_ok());
  EXPECT_EQ(l2->val_begin(), l->val_begin());
  EXPECT_NE(l2->epoch_order(0), l->epoch_order(0));
  auto v1 = l->val_batch(3);
  auto v2 = l2->val_batch(3);
  EXPECT_TRUE(std::equal(v1->inputs.span<int32_t>().begin(), v1->inputs.span<int32_t>().end(),
                         v2->inputs.span<int32_t>().begin()));
  EXPECT_EQ(l->val_batch(5).status().code(), Code::kOutOfRange);
}

TEST(DataLoader, ShuffleIsADeterministicPermutation) {
  const auto p = philox_permutation(1000, 42, kDataShuffleStream);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(p, iota);
  EXPECT_EQ(philox_permutation(1000, 42, kDataShuffleStream), p);
  EXPECT_NE(philox_permutation(1000, 43, kDataShuffleStream), p);
  EXPECT_NE(philox_permutation(1000, 42, kDataShuffleStream + 1), p);
  // Pinned: the data order of a seed must not change between versions.
  EXPECT_EQ(philox_permutation(10, 0, kDataShuffleStream),
            (std::vector<int64_t>{2, 5, 7, 1, 8, 0, 9, 3, 6, 4}));
  EXPECT_TRUE(philox_permutation(0, 1, 2).empty());
  EXPECT_EQ(philox_permutation(1, 1, 2), std::vector<int64_t>{0});

  TempDir t;
  const std::string dir = counting_dataset(t, 2001, 300);
  DataLoaderOptions o;
  o.seq = 8;
  o.micro_batch = 4;
  o.seed = 7;
  auto a = DataLoader::open(dir, o);
  auto b = DataLoader::open(dir, o);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->epoch_order(3), b->epoch_order(3));
  const std::vector<int64_t> epoch0 = a->epoch_order(0);  // a copy: the reference is reused
  EXPECT_NE(epoch0, a->epoch_order(1));
  // One epoch draws every training example once (250 examples, 62 batches of 4: 248).
  std::multiset<int64_t> seen;
  ASSERT_EQ(a->steps_per_epoch(), 62);
  for (int64_t s = 0; s < a->steps_per_epoch(); ++s) {
    auto batch = a->next();
    ASSERT_TRUE(batch.is_ok());
    for (int64_t e = 0; e < 4; ++e) seen.insert(batch->inputs.data<int32_t>()[e * 8] / 8);
  }
  EXPECT_EQ(seen.size(), 248u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 248u);
  EXPECT_EQ(a->position(), (Position{0, 62}));
  ASSERT_TRUE(a->next().is_ok());
  EXPECT_EQ(a->position(), (Position{1, 1}));
}

TEST(DataLoader, ReplicasTakeDisjointSlicesCoveringTheGlobalBatch) {
  TempDir t;
  const std::string dir = counting_dataset(t, 4001, 512);
  DataLoaderOptions o;
  o.seq = 4;
  o.micro_batch = 3;
  o.accumulation = 2;
  o.replicas = 4;
  o.seed = 99;
  std::vector<DataLoader> loaders;
  for (int64_t r = 0; r < o.replicas; ++r) {
    o.replica = r;
    auto l = DataLoader::open(dir, o);
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    loaders.push_back(std::move(l).value());
  }
  const int64_t G = 3 * 2 * 4;
  EXPECT_EQ(loaders[0].global_batch(), G);
  EXPECT_EQ(loaders[0].steps_per_epoch(), (1000 / G) * 2);
  const std::vector<int64_t> order = loaders[0].epoch_order(1);
  for (int64_t g = 0; g < 3; ++g) {
    std::vector<int64_t> got;
    for (int64_t r = 0; r < o.replicas; ++r)
      for (int64_t a = 0; a < 2; ++a) {
        const auto ex = loaders[size_t(r)].batch_examples(1, g * 2 + a);
        // Replica r's slice is [r*micro*acc, (r+1)*micro*acc) of the global batch.
        EXPECT_EQ(ex, std::vector<int64_t>(order.begin() + g * G + r * 6 + a * 3,
                                           order.begin() + g * G + r * 6 + a * 3 + 3));
        got.insert(got.end(), ex.begin(), ex.end());
      }
    EXPECT_EQ(got, std::vector<int64_t>(order.begin() + g * G, order.begin() + (g + 1) * G));
    EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()).size(), size_t(G));
  }
  o.replica = 4;
  auto bad = DataLoader::open(dir, o);
  EXPECT_EQ(bad.status().message(), "replica: expected in [0, replicas=4), found 4");
  o.replica = 0;
  o.micro_batch = 1000;
  bad = DataLoader::open(dir, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("expected at least one global batch (8000 = micro 1000 x accumulation 2 x "
                                        "replicas 4), found 1000"),
            std::string::npos)
      << bad.status().message();
}

TEST(DataLoader, ResumeContinuesExactly) {
  TempDir t;
  const std::string dir = counting_dataset(t, 501, 64);
  DataLoaderOptions o;
  o.seq = 6;
  o.micro_batch = 2;
  o.accumulation = 2;
  o.replicas = 2;
  o.replica = 1;
  o.seed = 5;
  auto straight = DataLoader::open(dir, o);
  ASSERT_TRUE(straight.is_ok());
  ASSERT_EQ(straight->steps_per_epoch(), 20);  // 83 examples, 10 global batches of 8, 2 micro each
  // 50 batches cross two epoch boundaries; check resuming at several points.
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 50; ++i) {
    auto b = straight->next();
    ASSERT_TRUE(b.is_ok());
    std::vector<int32_t> v(b->inputs.span<int32_t>().begin(), b->inputs.span<int32_t>().end());
    v.insert(v.end(), b->targets.span<int32_t>().begin(), b->targets.span<int32_t>().end());
    want.push_back(v);
  }
  for (int stop : {5, 20, 21, 37}) {
    auto first = DataLoader::open(dir, o);
    ASSERT_TRUE(first.is_ok());
    for (int i = 0; i < stop; ++i) ASSERT_TRUE(first->next().is_ok());
    const Position saved = first->position();
    auto resumed = DataLoader::open(dir, o);
    ASSERT_TRUE(resumed.is_ok());
    ASSERT_TRUE(resumed->restore(saved).is_ok());
    for (int i = stop; i < std::min(stop + 10, 50); ++i) {
      auto b = resumed->next();
      ASSERT_TRUE(b.is_ok());
      std::vector<int32_t> v(b->inputs.span<int32_t>().begin(), b->inputs.span<int32_t>().end());
      v.insert(v.end(), b->targets.span<int32_t>().begin(), b->targets.span<int32_t>().end());
      EXPECT_EQ(v, want[size_t(i)]) << "resumed at " << stop << ", batch " << i;
    }
  }
  Status s = straight->restore({0, 21});
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.message(), "data position: expected epoch >= 0 and step_in_epoch in [0, 20], found epoch 0, "
                         "step_in_epoch 21");
}

// Corrupt files: each case edits a valid dataset and checks the error.
class CorruptData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = counting_dataset(t_, 30, 10);  // 3 shards of 10 tokens
    shard_ = t_ / "shard-00001.tok";
    index_ = read_bytes(t_ / "index.json");
  }
  std::string open_error() {
    auto d = TokenDataset::open(dir_);
    EXPECT_FALSE(d.is_ok());
    return d.is_ok() ? std::string("ok") : d.status().message();
  }
  void replace_in_index(const std::string& from, const std::string& to) {
    std::string s = index_;
    const size_t at = s.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    s.replace(at, from.size(), to);
    write_bytes(t_ / "index.json", s);
  }
  TempDir t_;
  std::string dir_, shard_, index_;
};

TEST_F(CorruptData, TruncatedShard) {
  fs::resize_file(shard_, 24 + 13);
  EXPECT_EQ(open_error(), shard_ + ": expected 44 bytes (a 24-byte header + 10 uint16 tokens, per index.json), "
                                   "found 37 bytes (truncated?)");
  fs::resize_file(shard_, 3);
  EXPECT_NE(open_error().find("found 3 bytes (truncated?)"), std::string::npos);
}

// Truncated after open() (while a run reads it): a Corrupt error naming the shard, not a SIGBUS.
TEST_F(CorruptData, TruncatedWhileOpen) {
  auto d = TokenDataset::open(dir_);
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  fs::resize_file(shard_, 24 + 6);
  std::vector<int32_t> out(10);
  const Status s = d->read(10, out);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.message(), shard_ + ": expected 20 bytes at offset 24 (the file had 44 bytes when opened), found 6 "
                                  "bytes (the file was truncated while in use)");
  EXPECT_TRUE(d->read(0, out).is_ok());  // the other shards still read
}

// A FIFO named as a shard is refused at once instead of blocking the open forever.
TEST_F(CorruptData, FifoShard) {
  fs::remove(shard_);
  ASSERT_EQ(::mkfifo(shard_.c_str(), 0600), 0);
  EXPECT_EQ(open_error(), shard_ + ": expected a regular file, found a FIFO (named pipe)");
}

TEST_F(CorruptData, ShardHeader) {
  std::string s = read_bytes(shard_);
  s[0] = 'X';
  write_bytes(shard_, s);
  EXPECT_EQ(open_error(), shard_ + ": expected magic \"ASPNTOK1\", found other bytes (not an aspen token shard)");
  s[0] = 'A';
  s[8] = 2;
  write_bytes(shard_, s);
  EXPECT_EQ(open_error(), shard_ + ": expected shard version 1, found version 2");
  s[8] = 1;
  s[12] = 4;
  write_bytes(shard_, s);
  EXPECT_EQ(open_error(), shard_ + ": expected token width 2 (uint16, per index.json), found width 4");
  s[12] = 2;
  s[16] = 9;
  write_bytes(shard_, s);
  EXPECT_EQ(open_error(), shard_ + ": expected 10 tokens in the header (per index.json), found 9");
}

TEST_F(CorruptData, TokenOutsideVocabulary) {
  std::string s = read_bytes(shard_);
  s[24 + 2 * 4] = '\xff';
  s[24 + 2 * 4 + 1] = '\xff';
  write_bytes(shard_, s);
  auto d = TokenDataset::open(dir_);
  ASSERT_TRUE(d.is_ok());  // tokens are checked as they are read
  std::vector<int32_t> out(30);
  Status st = d->read(0, out);
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_EQ(st.message(), shard_ + ": token 4: expected an id below vocab_size 60001, found 65535");
}

TEST_F(CorruptData, MissingShard) {
  fs::remove(shard_);
  const std::string e = open_error();
  EXPECT_NE(e.find(shard_ + ": expected a readable file, found No such file"), std::string::npos) << e;
}

TEST_F(CorruptData, Index) {
  const std::string path = t_ / "index.json";
  replace_in_index("\"total_tokens\": 30", "\"total_tokens\": 31");
  EXPECT_EQ(open_error(), path + ": 'total_tokens': expected 30 (the sum of the shards' tokens), found 31");
  replace_in_index("\"tokens\": 10", "\"tokens\": 11");
  EXPECT_EQ(open_error(), path + ": 'total_tokens': expected 31 (the sum of the shards' tokens), found 30");
  replace_in_index("\"dtype\": \"uint16\"", "\"dtype\": \"uint32\"");
  EXPECT_EQ(open_error(), path + ": 'dtype': expected \"uint16\" (vocab_size 60001), found \"uint32\"");
  replace_in_index("\"version\": 1", "\"version\": 2");
  EXPECT_EQ(open_error(), path + ": 'version': expected 1, found 2 (hint: written by a newer aspen?)");
  replace_in_index("\"eos_id\": 60000", "\"eos_id\": -1");
  EXPECT_EQ(open_error(), path + ": 'eos_id': expected a non-negative integer, found a JSON number");
  replace_in_index("\"eos_id\": 60000", "\"eos_id\": 60001");
  EXPECT_EQ(open_error(), path + ": 'eos_id': expected at most 60000, found 60001");
  replace_in_index("\"shard-00001.tok\"", "\"../shard-00001.tok\"");
  EXPECT_EQ(open_error(), path + ": shards[1].'name': expected a file name inside the dataset directory, found "
                                 "\"../shard-00001.tok\"");
  replace_in_index("\"documents\"", "\"docs\"");
  EXPECT_EQ(open_error(), path + ": 'documents': expected a non-negative integer, found no such key");
  write_bytes(path, index_.substr(0, index_.size() / 2));
  EXPECT_EQ(open_error(), path + ": expected valid JSON, found a parse error");
  fs::remove(path);
  auto d = TokenDataset::open(dir_);
  EXPECT_EQ(d.status().code(), Code::kNotFound);
}

// Every truncation and every single-byte flip of a shard or the index is
// either read correctly or reported; nothing crashes (run under ASan).
TEST_F(CorruptData, EveryTruncationAndFlipIsSafe) {
  const std::string shard = read_bytes(shard_);
  for (size_t cut = 0; cut < shard.size(); ++cut) {
    write_bytes(shard_, shard.substr(0, cut));
    EXPECT_FALSE(TokenDataset::open(dir_).is_ok()) << cut;
  }
  write_bytes(shard_, shard);
  for (size_t i = 0; i < index_.size(); ++i) {
    std::string s = index_;
    s[i] = char(s[i] ^ 0x5a);
    write_bytes(t_ / "index.json", s);
    auto d = TokenDataset::open(dir_);
    if (!d.is_ok()) continue;
    std::vector<int32_t> out(static_cast<size_t>(d->size()));
    (void)d->read(0, out);
  }
}

}  // namespace
}  // namespace aspen::train
