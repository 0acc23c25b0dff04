// io/tokenizer.h: Hugging Face tokenizers, reproduced id for id.
//
// Loaded from Hugging Face files:
//   * byte-level BPE: GPT-2, GPT-J (tokenizer.json, or vocab.json + merges.txt),
//     Llama 3 and Qwen2 (tokenizer.json: Split on their regexes, NFC);
//   * SentencePiece conversions (Llama 2, Mistral: tokenizer.json with byte
//     fallback, Prepend/Replace or Metaspace);
//   * WordPiece (BERT): tokenizer.json, or vocab.txt (uncased BERT defaults).
// tokenizer.json is read as the pipeline of components it names
// (io/tokenizer_pipeline.h; docs/tokenizers.md lists them).
// load_tokenizer() picks the files in a model directory. encode() gives the
// ids `tokenizers` (the Rust library behind transformers' fast tokenizers)
// gives for the same text, including added/special tokens matched before
// normalization, and decode() gives the text its decoder gives. How exactness
// is achieved, and what aspen does with invalid UTF-8, is in docs/tokenizers.md.
//
// Input text is UTF-8. Invalid UTF-8 is not an error: it is first decoded
// lossily (each maximal invalid subsequence becomes U+FFFD, as Python's
// bytes.decode("utf-8", "replace")), then tokenized.
//
// Thread-safety: a loaded Tokenizer is immutable apart from an internal,
// mutex-guarded cache; all methods may be called from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace aspen::io {

using TokenId = int32_t;

// Ids of the tokens models treat specially; absent when the vocabulary has none.
// Found by name: bos/eos "<|endoftext|>" (GPT-2 uses one token for both),
// "<s>"/"</s>" or "<|begin_of_text|>"/"<|end_of_text|>"; unk from the model;
// pad "[PAD]"/"<pad>" or tokenizer.json's
// padding; cls "[CLS]", sep "[SEP]", mask "[MASK]".
struct SpecialTokenIds {
  std::optional<TokenId> bos, eos, unk, pad, cls, sep, mask;
};

// A fixed-length encoding for batched models.
struct PaddedEncoding {
  std::vector<TokenId> ids;
  std::vector<int32_t> attention_mask;  // 1 for real tokens, 0 for padding
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`. add_special_tokens applies the post-processor
  // (BERT: [CLS] ... [SEP]; byte-level BPE: nothing).
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // Text of `ids`, as the model's decoder joins them. Ids outside the
  // vocabulary are skipped (as Hugging Face does); skip_special_tokens also
  // drops added tokens marked special.
  virtual std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const = 0;

  // encode(), then truncated to `length` (post-processor tokens kept, as HF's
  // LongestFirst truncation) and padded with the pad token on the right.
  // FailedPrecondition when the tokenizer has no pad token.
  virtual Result<PaddedEncoding> encode_padded(std::string_view text, size_t length,
                                               bool add_special_tokens = true) const = 0;

  // The token's string, or nullopt for an id outside the vocabulary.
  virtual std::optional<std::string> id_to_token(TokenId id) const = 0;
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;
  // One past the largest id, added tokens included.
  virtual size_t vocab_size() const = 0;
  virtual const SpecialTokenIds& special_ids() const = 0;
};

// Loads the tokenizer of a model directory: tokenizer.json if present, else
// vocab.json + merges.txt (byte-level BPE), else vocab.txt (WordPiece).
// NotFound names the directory and the files looked for; Corrupt names the
// file and the key or line; Unimplemented names a component this build lacks.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& model_dir);

// The loaders load_tokenizer() dispatches to, for callers that know the format.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path);
// The same loader over tokenizer.json text in memory (tests, fuzzing);
// `name` stands in for the path in errors.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_json_from_string(std::string_view text,
                                                                   const std::string& name = "<memory>");
Result<std::unique_ptr<Tokenizer>> load_bpe_files(const std::string& vocab_json_path,
                                                  const std::string& merges_txt_path);
Result<std::unique_ptr<Tokenizer>> load_wordpiece_vocab(const std::string& vocab_txt_path);

class GgufFile;
// The tokenizer llama.cpp's converter wrote into a GGUF file (tokenizer.ggml.*; NOTE [GGUF tokenizers] in
// tokenizer_load.cc): GPT-2's byte-level BPE. NotFound / Corrupt name the file and the key; Unimplemented
// names a tokenizer model or split not read yet.
Result<std::unique_ptr<Tokenizer>> load_gguf_tokenizer(const GgufFile& file);

}  // namespace aspen::io
