#include "train/demo.h"

#include <algorithm>
#include <filesystem>

#include "core/atomic_file.h"

namespace aspen::train {

namespace {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to
// U+0100 onwards in byte order. Returned as UTF-8.
std::string byte_to_unicode_utf8(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  uint32_t cp = uint32_t(b);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    cp = 256 + uint32_t(n);
  }
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {  // < 0x800 here
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// v in the order of philox_permutation (train/data.h: the loader's shuffle).
template <class T>
void shuffle(std::vector<T>& v, uint64_t seed, uint64_t stream) {
  std::vector<T> out;
  out.reserve(v.size());
  for (int64_t i : philox_permutation(int64_t(v.size()), seed, stream)) out.push_back(v[size_t(i)]);
  v = std::move(out);
}

constexpr uint64_t kSplitStream = 0x41444431;  // "ADD1"
constexpr uint64_t kPassStream = 0x41444432;   // "ADD2" + pass

}  // namespace

Status write_byte_tokenizer(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(Code::kIoError, "tokenizer directory '" + dir + "'", "a directory", ec.message());
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) vocab += "\"" + json_escape(byte_to_unicode_utf8(b)) + "\": " + std::to_string(b) + ", ";
  vocab += "\"<|endoftext|>\": " + std::to_string(kByteEosId) + "}\n";
  ASPEN_RETURN_IF_ERROR(write_file_atomic(dir + "/vocab.json", vocab));
  ASPEN_RETURN_IF_ERROR(write_file_atomic(dir + "/merges.txt", "#version: 0.2\n"));
  return write_file_atomic(dir + "/tokenizer_config.json",
                           "{\"tokenizer_class\": \"GPT2Tokenizer\", \"bos_token\": \"<|endoftext|>\", "
                           "\"eos_token\": \"<|endoftext|>\", \"unk_token\": \"<|endoftext|>\", "
                           "\"model_max_length\": 1024}\n");
}

AdditionTask make_addition_task(uint64_t seed, double test_fraction) {
  AdditionTask t;
  t.seed = seed;
  t.test_fraction = test_fraction;
  std::vector<std::pair<int, int>> all;
  for (int a = 0; a < 100; ++a)
    for (int b = 0; b < 100; ++b) all.emplace_back(a, b);
  shuffle(all, seed, kSplitStream);
  const size_t test = size_t(double(all.size()) * test_fraction);
  t.test.assign(all.begin(), all.begin() + long(test));
  t.train.assign(all.begin() + long(test), all.end());
  return t;
}

namespace {
std::string padded(int v, int width) {
  std::string s = std::to_string(v);
  return std::string(size_t(std::max<int>(0, width - int(s.size()))), '0') + s;
}
}  // namespace

std::string addition_prompt(int a, int b) { return padded(a, 2) + "+" + padded(b, 2) + "="; }
std::string addition_answer(int a, int b) { return padded(a + b, 3); }

Result<TokenIndex> write_addition_shards(const AdditionTask& task, int64_t repeats, const std::string& dir,
                                         const std::string& tokenizer_dir) {
  if (repeats < 1) return Status::invalid_argument("addition shards: repeats", ">= 1", std::to_string(repeats));
  TokenShardWriterOptions o;
  o.vocab_size = kByteVocab;
  o.eos_id = kByteEosId;
  o.tokenizer_dir = tokenizer_dir;
  // Its fingerprint, which training checks against the model's tokenizer (none when the directory holds none).
  if (Result<std::string> fp = tokenizer_fingerprint(tokenizer_dir); fp.is_ok()) o.tokenizer_hash = *fp;
  ASPEN_ASSIGN_OR_RETURN(TokenShardWriter w, TokenShardWriter::create(dir, o));
  std::vector<io::TokenId> ids;
  for (int64_t pass = 0; pass < repeats; ++pass) {
    std::vector<std::pair<int, int>> order = task.train;
    shuffle(order, task.seed, kPassStream + uint64_t(pass));
    for (const auto& [a, b] : order) {
      const std::string text = addition_prompt(a, b) + addition_answer(a, b);
      ids.assign(text.begin(), text.end());
      ASPEN_RETURN_IF_ERROR(w.add_document(ids));
    }
  }
  return w.finish();
}

}  // namespace aspen::train
