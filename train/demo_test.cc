#include "train/demo.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "io/tokenizer.h"

namespace aspen::train {
namespace {

std::string temp_dir(const std::string& name) {
  const std::string d = std::filesystem::temp_directory_path() / ("aspen_demo_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  return d;
}

TEST(Demo, ByteTokenizerIsOneTokenPerByte) {
  const std::string dir = temp_dir("tok");
  ASSERT_TRUE(write_byte_tokenizer(dir).is_ok());
  auto tok = io::load_tokenizer(dir);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::string text = "37+45=82 \n\xc3\xa9";
  const std::vector<io::TokenId> ids = (*tok)->encode(text, false);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], int32_t(uint8_t(text[i]))) << i;
  EXPECT_EQ((*tok)->decode(ids), text);
  ASSERT_TRUE((*tok)->special_ids().eos.has_value());
  EXPECT_EQ(*(*tok)->special_ids().eos, kByteEosId);
  EXPECT_EQ((*tok)->vocab_size(), kByteVocab);
  std::filesystem::remove_all(dir);
}

TEST(Demo, AdditionSplitIsDisjointAndDeterministic) {
  const AdditionTask t = make_addition_task(3);
  EXPECT_EQ(t.train.size() + t.test.size(), 10000u);
  EXPECT_EQ(t.test.size(), 1000u);
  std::set<std::pair<int, int>> train(t.train.begin(), t.train.end());
  for (const auto& p : t.test) EXPECT_EQ(train.count(p), 0u);
  EXPECT_EQ(make_addition_task(3).test, t.test);
  EXPECT_NE(make_addition_task(4).test, t.test);
  // Fixed width (NOTE [demo recipe] in demo.h): two digits a side, three for the sum.
  EXPECT_EQ(addition_prompt(7, 45), "07+45=");
  EXPECT_EQ(addition_answer(7, 45), "052");
  EXPECT_EQ(addition_answer(99, 99), "198");
  EXPECT_EQ(addition_prompt(0, 0) + addition_answer(0, 0), "00+00=000");
}

TEST(Demo, ShardsHoldEveryTrainingProblemOncePerPass) {
  const std::string dir = temp_dir("shards");
  const AdditionTask t = make_addition_task(1);
  auto index = write_addition_shards(t, 2, dir, "tok");
  ASSERT_TRUE(index.is_ok()) << index.status().to_string();
  EXPECT_EQ(index->documents, int64_t(2 * t.train.size()));
  EXPECT_EQ(index->eos_id, kByteEosId);
  auto ds = TokenDataset::open(dir);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  std::vector<int32_t> all(static_cast<size_t>(index->total_tokens));
  ASSERT_TRUE(ds->read(0, all).is_ok());
  std::string text;
  int64_t problems = 0;
  std::multiset<std::string> seen;
  for (int32_t id : all) {
    if (id == kByteEosId) {
      seen.insert(text);
      text.clear();
      ++problems;
    } else {
      text += char(id);
    }
  }
  EXPECT_EQ(problems, int64_t(2 * t.train.size()));
  for (const auto& [a, b] : t.train) EXPECT_EQ(seen.count(addition_prompt(a, b) + addition_answer(a, b)), 2u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace aspen::train
