// train/data.h: token shards for language-model training, and the loader
// that cuts them into resumable, shuffled, per-replica batches.
//
// Writing (`aspen prepare-data`): prepare_token_shards() tokenizes input
// files, appends the tokenizer's end-of-text token after each document, and
// writes shards of at most `shard_tokens` tokens (uint16, or uint32 when the
// vocabulary has more than 65536 ids) plus `index.json`. TokenShardWriter is
// the same writer fed token ids directly. Every file is written atomically
// (temporary file in the same directory, fsync, rename); the index is written
// last, so a directory with an index has all its shards. The byte format is in
// docs/formats.md ("Token shards").
//
// Reading: TokenDataset opens the shards named by an index and checks each
// against it (header, dtype, count, file size) before open() returns; it
// reads them with pread, not a mapping, so a shard truncated while training
// is a Corrupt error naming it, not a SIGBUS (NOTE in data.cc).
// DataLoader treats the concatenated shards as one token stream and cuts
// examples of seq + 1 tokens at stride seq (example i covers tokens
// [i*seq, i*seq + seq]; inputs are the first seq, targets the last seq), with
// documents separated by the eos token inside the stream, as GPT-2 trains.
//
//   * Validation split: the last val_fraction of the examples (a contiguous
//     tail, so validation text is not interleaved with training text), after a
//     one-example gap so that no token is both a training target and a
//     validation input. Never shuffled; the same for every seed.
//   * Shuffle: each epoch visits the training examples in a permutation drawn
//     by Fisher-Yates from Philox(seed, stream kDataShuffleStream + epoch):
//     the same seed gives the same order on any machine.
//   * Replicas: a global batch is micro × accumulation × replicas examples
//     (DeepSpeed's train_batch_size). Replica r takes the contiguous slice
//     [r*micro*acc, (r+1)*micro*acc) of each global batch, as `acc`
//     micro-batches of `micro` examples. The last incomplete global batch of
//     an epoch is dropped.
//   * Position {epoch, step_in_epoch}: step_in_epoch counts the micro-batches
//     this replica has drawn in the epoch. All replicas advance in lockstep,
//     so they share one Position; restoring it into a loader with the same
//     options continues exactly where the saved one stopped.
//
// Thread-safety: a TokenDataset is immutable after open(); its const methods
// may be called from many threads. A DataLoader has mutable position: one
// thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/tokenizer.h"

namespace aspen::train {

// Pinned (reach disk): shard header and index format.
inline constexpr char kTokenShardMagic[9] = "ASPNTOK1";
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderBytes = 24;  // magic 8, version 4, dtype 4, count 8
inline constexpr int kTokenIndexVersion = 1;
inline constexpr int64_t kDefaultShardTokens = int64_t(64) << 20;
// Pinned: the Philox stream of epoch e's shuffle is kDataShuffleStream + e
// (so the data order does not share numbers with other users of the seed).
inline constexpr uint64_t kDataShuffleStream = 0x4441544100000000ull;  // "DATA" << 32

// The token width on disk. The value is the bytes per token and is what the
// shard header stores (pinned).
enum class TokenDType : uint32_t { u16 = 2, u32 = 4 };
const char* token_dtype_name(TokenDType t);  // "uint16", "uint32"
// u16 when every id of a vocabulary of `vocab_size` fits, else u32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

// FNV-1a 64 of bytes, as 16 lowercase hex digits (input and tokenizer
// fingerprints in index.json; a change detector, not a cryptographic hash).
std::string fnv1a64_hex(std::string_view bytes);
// Fingerprint of a tokenizer directory: FNV-1a 64 over the names and contents
// of the tokenizer files present (tokenizer.json, vocab.json, merges.txt,
// vocab.txt). NotFound when none is there.
Result<std::string> tokenizer_fingerprint(const std::string& dir);

struct ShardInfo {
  std::string name;  // file name inside the dataset directory
  int64_t tokens = 0;
};
struct InputInfo {
  std::string path;
  int64_t bytes = 0;
  std::string hash;  // fnv1a64_hex of the contents
};
// The contents of index.json.
struct TokenIndex {
  int version = kTokenIndexVersion;
  TokenDType dtype = TokenDType::u16;
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
  std::string tokenizer_dir, tokenizer_hash;
  std::vector<ShardInfo> shards;
  int64_t total_tokens = 0;
  int64_t documents = 0;
  std::vector<InputInfo> inputs;
};

struct TokenShardWriterOptions {
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
  int64_t shard_tokens = kDefaultShardTokens;  // at most this many tokens per shard
  std::string tokenizer_dir, tokenizer_hash;   // recorded in the index
};

// Writes shards of token ids into a directory (created if missing).
class TokenShardWriter {
 public:
  // InvalidArgument for a non-positive vocab_size or shard_tokens or an eos
  // outside the vocabulary; IoError when the directory cannot be made.
  static Result<TokenShardWriter> create(const std::string& dir, TokenShardWriterOptions options);

  // Appends one document's ids, then eos; full shards are written as they
  // fill. InvalidArgument naming the document and the id for an id outside
  // [0, vocab_size) (nothing of the document is written). After an IoError
  // the writer is unusable.
  Status add_document(std::span<const io::TokenId> ids);
  // Records an input file in the index.
  void add_input(InputInfo input) { index_.inputs.push_back(std::move(input)); }
  // Writes the last partial shard and index.json; returns the index.
  Result<TokenIndex> finish();

  const TokenIndex& index() const { return index_; }
  int64_t tokens() const { return index_.total_tokens; }

 private:
  TokenShardWriter() = default;
  Status flush();

  std::string dir_;
  int64_t shard_tokens_ = 0;
  TokenIndex index_ = {};
  std::vector<unsigned char> buffer_;  // the current shard's tokens, encoded
  int64_t buffered_ = 0;
};

struct PrepareOptions {
  std::string tokenizer_dir;  // recorded and fingerprinted
  std::vector<std::string> inputs;
  std::string output_dir;
  int64_t shard_tokens = kDefaultShardTokens;
  bool split_lines = false;  // each non-empty line is a document (else: each file)
};
struct PrepareStats {
  TokenIndex index;
  int64_t input_bytes = 0;
  double tokenize_seconds = 0;  // encode() only
  double total_seconds = 0;     // reading, tokenizing and writing
};

// Tokenizes options.inputs with `tokenizer` (no post-processor tokens) into
// options.output_dir, each document followed by the eos token. A WordPiece
// (BERT) tokenizer has no eos: each document is framed [CLS] ... [SEP] as
// its post-processor frames a sequence, [SEP] recorded as the index's eos_id
// (the stream Hugging Face's run_mlm.py concatenates before cutting blocks).
// A document that encodes to no tokens is skipped. FailedPrecondition when
// the tokenizer has neither eos nor [CLS] and [SEP]; NotFound naming an
// unreadable input; errors of TokenShardWriter.
// NOTE: text that spells an added token (e.g. "<|endoftext|>") encodes to that
// token, as the tokenizer always matches added tokens first.
Result<PrepareStats> prepare_token_shards(const io::Tokenizer& tokenizer, const PrepareOptions& options);

// Reads and validates `dir`/index.json (Corrupt naming the file and the key).
Result<TokenIndex> read_token_index(const std::string& dir);

// The shards of a dataset directory, as one token stream.
class TokenDataset {
 public:
  // Reads the index and maps every shard; a shard whose header, dtype, count
  // or size disagrees with the index is Corrupt naming the file, what was
  // expected and what was found.
  static Result<TokenDataset> open(const std::string& dir);

  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  ~TokenDataset();

  const TokenIndex& index() const { return index_; }
  int64_t size() const { return index_.total_tokens; }
  // Copies tokens [begin, begin + out.size()) of the stream into `out`,
  // across shard boundaries. OutOfRange outside the stream; Corrupt naming the
  // shard for a stored id outside the vocabulary.
  Status read(int64_t begin, std::span<int32_t> out) const;

 private:
  TokenDataset();

  std::string dir_;
  TokenIndex index_ = {};
  std::vector<InputFile> shards_;  // read with pread: NOTE [token shards are read, not mapped] in data.cc
  std::vector<int64_t> starts_;  // first stream index of each shard, then total
};

struct DataLoaderOptions {
  int64_t seq = 0;               // tokens per example input (T)
  int64_t micro_batch = 1;       // examples per micro-batch (B)
  int64_t accumulation = 1;      // micro-batches per optimizer step per replica
  int64_t replicas = 1;          // R
  int64_t replica = 0;           // r in [0, R)
  double val_fraction = 0.0;     // in [0, 1)
  uint64_t seed = 0;
};

struct Position {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;  // micro-batches this replica drew in the epoch
  bool operator==(const Position&) const = default;
};

struct Batch {
  Tensor inputs;   // i32 [B, T]
  Tensor targets;  // i32 [B, T]: inputs shifted left by one token
};

// Which examples each micro-batch of a replica holds: the validation split,
// each epoch's shuffle, the replica's slice of every global batch and the
// position, as the header comment above describes for token shards.
// DataLoader (tokens) and ArrayLoader (train/arrays.h) cut their data by it.
class ExampleOrder {
 public:
  ExampleOrder() = default;
  // `num_examples` examples, `val_gap` of them left out between the splits
  // (NOTE [validation gap]); options.seq is not looked at. InvalidArgument
  // naming the option for bad options, or `what` when the training split is
  // smaller than one global batch (`detail`: where the count came from).
  static Result<ExampleOrder> make(int64_t num_examples, int64_t val_gap, const DataLoaderOptions& options,
                                   const std::string& what, const std::string& detail);
  // The options' own checks (make() runs them first): InvalidArgument naming the option.
  static Status check(const DataLoaderOptions& options);

  const DataLoaderOptions& options() const { return options_; }
  int64_t num_examples() const { return num_examples_; }
  int64_t train_examples() const { return train_examples_; }
  int64_t val_examples() const { return val_examples_; }
  int64_t global_batch() const;                                 // B × acc × R
  int64_t steps_per_epoch() const { return steps_per_epoch_; }  // micro-batches per replica

  // This replica's next micro-batch's examples; moves into the next epoch
  // (and its permutation) when this one is done.
  std::vector<int64_t> next();
  Position position() const { return position_; }
  // The examples and epoch of the last next() (none before the first): what the replica consumed.
  const std::vector<int64_t>& last() const { return last_; }
  int64_t last_epoch() const { return last_epoch_; }
  // OutOfRange for a negative epoch or a step outside [0, steps_per_epoch].
  Status restore(const Position& p);

  // The order in which `epoch` visits the training examples: a permutation
  // of [0, train_examples). Valid until the next call.
  const std::vector<int64_t>& epoch_order(int64_t epoch);
  // This replica's micro-batch `step` of `epoch`.
  std::vector<int64_t> batch_examples(int64_t epoch, int64_t step);

  // Validation: global batches of B × R examples, in order; replica r takes
  // [r*B, (r+1)*B) of each. val_batch(i) for i in [0, val_steps()); OutOfRange outside.
  int64_t val_steps() const;
  Result<std::vector<int64_t>> val_batch(int64_t i) const;
  int64_t val_begin() const { return num_examples_ - val_examples_; }

 private:
  DataLoaderOptions options_ = {};
  int64_t num_examples_ = 0, train_examples_ = 0, val_examples_ = 0, steps_per_epoch_ = 0;
  Position position_ = {};
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;  // the permutation of [0, train_examples) for order_epoch_
  std::vector<int64_t> last_;
  int64_t last_epoch_ = -1;
};

class DataLoader {
 public:
  // InvalidArgument naming the option for bad options, or when the training
  // split is smaller than one global batch (the message gives both counts).
  static Result<DataLoader> open(const std::string& dir, const DataLoaderOptions& options);

  const DataLoaderOptions& options() const { return order_.options(); }
  const TokenDataset& dataset() const { return dataset_; }
  int64_t num_examples() const { return order_.num_examples(); }  // (tokens - 1) / seq
  int64_t train_examples() const { return order_.train_examples(); }
  int64_t val_examples() const { return order_.val_examples(); }
  int64_t global_batch() const { return order_.global_batch(); }
  int64_t steps_per_epoch() const { return order_.steps_per_epoch(); }

  // This replica's next training micro-batch; after an error the position is where it was.
  Result<Batch> next();
  Position position() const { return order_.position(); }
  const ExampleOrder& order() const { return order_; }  // last(): the examples of the last next()
  Status restore(const Position& p) { return order_.restore(p); }

  const std::vector<int64_t>& epoch_order(int64_t epoch) { return order_.epoch_order(epoch); }
  // Example indices (into the whole stream) of this replica's micro-batch
  // `step` of `epoch`.
  std::vector<int64_t> batch_examples(int64_t epoch, int64_t step) { return order_.batch_examples(epoch, step); }

  int64_t val_steps() const { return order_.val_steps(); }
  Result<Batch> val_batch(int64_t i) const;
  // The first validation example's index in the stream.
  int64_t val_begin() const { return order_.val_begin(); }

  // The batch of the given examples (indices into the stream).
  Result<Batch> make_batch(std::span<const int64_t> examples) const;

 private:
  explicit DataLoader(TokenDataset dataset) : dataset_(std::move(dataset)) {}

  TokenDataset dataset_;
  ExampleOrder order_;
};

// Fisher-Yates permutation of [0, n) from Philox(seed, stream): draw k (for
// position i = n-1-k) takes elements 2k and 2k+1 of the stream as a u64 u and
// swaps i with floor(u × (i+1) / 2^64). Pinned: changing it changes data order.
std::vector<int64_t> philox_permutation(int64_t n, uint64_t seed, uint64_t stream);

}  // namespace aspen::train
