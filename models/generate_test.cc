// Generation against Hugging Face's greedy continuations (models/testdata:
// generate_ids for one prompt, generate_batch_ids for two left-padded
// prompts), determinism of sampling, streaming, stop tokens and bad input.
#include "models/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/executable.h"
#include "graph/builder.h"
#include "models/causal_lm.h"
#include "models/weights.h"
#include "profile/diff.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

const std::string kTestdata = ASPEN_MODELS_TESTDATA;

nlohmann::json golden(const std::string& model) {
  std::ifstream in(kTestdata + "/" + model + "/golden.json");
  return nlohmann::json::parse(in);
}

std::vector<std::vector<int32_t>> ids_of(const nlohmann::json& j) { return j.get<std::vector<std::vector<int32_t>>>(); }

class GreedyParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyParity, MatchesHuggingFaceGenerate) {
  const nlohmann::json j = golden(GetParam());
  SamplingOptions greedy{.max_new_tokens = 32, .temperature = 0.0f};
  {
    auto gen = Generator::open(kTestdata + "/" + GetParam(), {.max_batch = 1, .max_length = 48, .max_prompt = 16});
    ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
    // Both programs run on fast kernels only.
    for (int p = 0; p < 2; ++p)
      for (const auto& ins : (*gen)->session().executable(p).program.code)
        EXPECT_FALSE(ins.reference) << (*gen)->session().executable(p).listing();
    auto out = (*gen)->generate(ids_of(j.at("generate_prompt")), greedy);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, ids_of(j.at("generate_ids")));
  }
  {
    // Two prompts of different lengths (HF left-padded them to 7; we pad to 12).
    const auto padded = ids_of(j.at("generate_batch_input_ids"));
    const auto mask = ids_of(j.at("generate_batch_attention_mask"));
    std::vector<std::vector<int32_t>> prompts(padded.size());
    for (size_t r = 0; r < padded.size(); ++r)
      for (size_t t = 0; t < padded[r].size(); ++t)
        if (mask[r][t]) prompts[r].push_back(padded[r][t]);
    auto gen = Generator::open(kTestdata + "/" + GetParam(), {.max_batch = 3, .max_length = 44, .max_prompt = 12});
    ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
    auto out = (*gen)->generate(prompts, greedy);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, ids_of(j.at("generate_batch_ids")));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GreedyParity,
                         ::testing::Values("gpt2-tiny", "gptj-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny",
                                           "llama-dynamic-tiny"));

TEST(Generate, SeedStreamingAndStopTokens) {
  auto gen = Generator::open(kTestdata + "/gptj-tiny", {.max_batch = 2, .max_length = 40, .max_prompt = 8});
  ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  const std::vector<std::vector<int32_t>> prompts = {{600, 190, 212}, {5, 6, 7, 8, 9}};
  SamplingOptions s{.max_new_tokens = 20, .temperature = 0.9f, .top_k = 40, .top_p = 0.95f,
                    .repetition_penalty = 1.3f, .seed = 1234};
  auto a = (*gen)->generate(prompts, s);
  auto b = (*gen)->generate(prompts, s);
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string();
  EXPECT_EQ(*a, *b);  // same seed, same text (the cache from the first call is overwritten)
  s.seed = 99;
  auto c = (*gen)->generate(prompts, s);
  ASSERT_TRUE(c.is_ok());
  EXPECT_NE(*a, *c);
  for (const auto& row : *a) EXPECT_EQ(row.size(), 20u);

  // Streaming sees every token in order; a stop token ends its row (kept).
  s.seed = 1234;
  std::vector<std::vector<int32_t>> streamed(2);
  s.on_token = [&](int64_t row, int32_t token) {
    streamed[size_t(row)].push_back(token);
    return true;
  };
  const int32_t stop = (*a)[0][4];
  s.stop_tokens = {stop};
  auto d = (*gen)->generate(prompts, s);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(streamed, *d);
  const auto first = std::find((*a)[0].begin(), (*a)[0].end(), stop);
  EXPECT_EQ((*d)[0], std::vector<int32_t>((*a)[0].begin(), first + 1));
  // The callback can stop the call.
  s.stop_tokens.clear();
  int calls = 0;
  s.on_token = [&](int64_t, int32_t) { return ++calls < 3; };
  auto e = (*gen)->generate({{1, 2}}, s);
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ((*e)[0].size(), 3u);
}

// bf16 weights under f32 activations: every instruction on a fast kernel
// (mixed matmuls, bf16 embedding rows), and a deterministic continuation.
TEST(Generate, Bf16Weights) {
  for (const char* model : {"gpt2-tiny", "gptj-tiny"}) {
    auto gen = Generator::open(kTestdata + "/" + model,
                               {.max_batch = 2, .max_length = 24, .max_prompt = 8, .weights = DType::bf16});
    ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
    for (int p = 0; p < 2; ++p)
      for (const auto& ins : (*gen)->session().executable(p).program.code)
        EXPECT_FALSE(ins.reference) << (*gen)->session().executable(p).listing();
    SamplingOptions s{.max_new_tokens = 12, .temperature = 0.0f};
    auto a = (*gen)->generate({{1, 2, 3}, {4, 5, 6, 7, 8}}, s);
    auto b = (*gen)->generate({{1, 2, 3}, {4, 5, 6, 7, 8}}, s);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.status().to_string();
    EXPECT_EQ(*a, *b);
    EXPECT_EQ((*a)[1].size(), 12u);
  }
}

// A model trained with a sparse layout generates through it (NOTE [model layouts]): two left-padded prompts
// (their cache slots are not their positions), greedy, against each row's whole sequence run alone without a
// cache through the same layout (build_causal_lm, positions 0..): every generated token is that forward's
// argmax. The same model read as dense generates something else (the layout matters at these lengths).
TEST(Generate, SparseLayoutModelsGenerateThroughTheirLayout) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(model);
    const std::string dir = ::testing::TempDir() + "/sparse_" + model;
    std::filesystem::remove_all(dir);
    std::filesystem::copy(kTestdata + "/" + model, dir);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
    cfg["aspen_sparse_attention"] = {{"kind", "bigbird"},          {"block", 4},
                                     {"attention", "unidirectional"}, {"num_random_blocks", 1},
                                     {"num_sliding_window_blocks", 1}, {"num_global_blocks", 1},
                                     {"different_layout_per_head", true}, {"seed", 3}};
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 9, 11, 2, 8}, {21, 4}};
    SamplingOptions greedy{.max_new_tokens = 24, .temperature = 0.0f};
    Result<std::vector<std::vector<int32_t>>> out = Status(), dense = Status();
    for (const std::string& d : {dir, kTestdata + "/" + model}) {
      auto gen = Generator::open(d, {.max_batch = 2, .max_length = 40, .max_prompt = 12, .threads = 1});
      ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
      (d == dir ? out : dense) = (*gen)->generate(prompts, greedy);
    }
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    ASSERT_TRUE(dense.is_ok()) << dense.status().to_string();
    EXPECT_NE(*out, *dense);

    auto ckpt = Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    constexpr int64_t kSeq = 40;
    auto layout = model_layout(ckpt->config(), kSeq, "test");
    ASSERT_TRUE(layout.is_ok() && layout->has_value()) << layout.status().to_string();
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build_causal_lm(b, ckpt->config(), {.batch = 1, .seq = kSeq, .layout = &**layout}).is_ok());
    auto exe = compiler::compile(g, {});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    auto session = runtime::Session::create(std::move(exe).value(), {.threads = 1});
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    auto plan = plan_weights(g, *ckpt);
    ASSERT_TRUE(plan.is_ok());
    ASSERT_TRUE(load_weights(*plan, [&](const std::string& name, const Tensor& t) {
                  return (*session)->set_parameter(name, t);
                }).is_ok());
    for (size_t r = 0; r < prompts.size(); ++r) {
      std::vector<int32_t> seq = prompts[r];
      seq.insert(seq.end(), (*out)[r].begin(), (*out)[r].end());
      Tensor ids(DType::i32, Shape{1, kSeq}), pos(DType::i32, Shape{1, kSeq});
      for (int64_t t = 0; t < kSeq; ++t) {
        ids.data<int32_t>()[t] = t < int64_t(seq.size()) ? seq[size_t(t)] : 0;  // after the end: never attended
        pos.data<int32_t>()[t] = int32_t(t);
      }
      auto res = (*session)->run({{"input_ids", &ids}, {"positions", &pos}});
      ASSERT_TRUE(res.is_ok()) << res.status().to_string();
      const Tensor& logits = res->at("logits");
      const int64_t V = logits.shape()[2];
      for (size_t t = 0; t < (*out)[r].size(); ++t) {
        const float* row = logits.data<float>() + (int64_t(prompts[r].size()) - 1 + int64_t(t)) * V;
        EXPECT_EQ(int32_t(std::max_element(row, row + V) - row), (*out)[r][t]) << "row " << r << " token " << t;
      }
    }
  }
}

TEST(Generate, BadInputIsNamed) {
  auto gen = Generator::open(kTestdata + "/gpt2-tiny", {.max_batch = 2, .max_length = 16, .max_prompt = 4});
  ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  SamplingOptions s{.max_new_tokens = 4, .temperature = 0.0f};
  EXPECT_EQ((*gen)->generate({{1, 2, 3, 4, 5}}, s).status().message(),
            "generate: prompt 0: expected at most max_prompt = 4 tokens, found 5 tokens");
  EXPECT_EQ((*gen)->generate({{1}, {}}, s).status().message(), "generate: prompt 1: expected at least one token, found none");
  EXPECT_EQ((*gen)->generate({{1, 1000}}, s).status().message(), "generate: prompt 0: expected ids in [0, 1000), found 1000");
  EXPECT_EQ((*gen)->generate({{1}, {2}, {3}}, s).status().message(),
            "generate: prompts: expected 1 to max_batch = 2, found 3");
  s.max_new_tokens = 14;
  EXPECT_EQ((*gen)->generate({{1}}, s).status().message(),
            "generate: max_new_tokens: expected a number in [1, max_length - max_prompt + 1 = 13], found 14");
  s.max_new_tokens = 4;
  s.temperature = -1;
  EXPECT_EQ((*gen)->generate({{1}}, s).status().message(), "generate: temperature: expected >= 0 (0: greedy), found -1.000000");
  EXPECT_EQ(Generator::open(kTestdata + "/bert-tiny").status().message(),
            kTestdata + "/bert-tiny/config.json: model_type: expected a causal language model (gpt2, gptj, llama, mistral, "
                        "qwen2), found 'bert'");
  EXPECT_EQ(Generator::open(kTestdata + "/gpt2-tiny", {.max_length = 65}).status().message(),
            "generator: max_length: expected a number in [2, n_positions = 64], found 65");
}

}  // namespace
}  // namespace aspen::models

namespace aspen::models {
namespace {

// NOTE [profile diff] on real runs: two profiled decodes of gpt2-tiny, the second with the decode program's
// longest instruction slowed 3x (NOTE [slowed instruction]): the diff names it, first; two plain runs: the
// hook unset, nothing named slower by 3x. (The 5 % trials are `aspen bench profile`: a noisy host's runs
// differ by several percent per instruction, and the diff says how much it can tell.)
TEST(ProfileDiff, NamesTheInstructionSlowedInARealDecode) {
  auto decode = [](profile::TraceRecorder* trace) {
    GeneratorOptions o{.max_batch = 1, .max_length = 60, .max_prompt = 4, .threads = 1};
    o.trace = trace;
    auto gen = Generator::open(kTestdata + "/gpt2-tiny", o);
    ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
    ASSERT_TRUE((*gen)->generate({{5, 7}}, {.max_new_tokens = 40, .temperature = 0.0f}).is_ok());
  };
  profile::TraceRecorder a;
  decode(&a);
  std::map<std::string, std::vector<double>> runs;  // decode-program instructions' times
  for (const profile::TraceEvent& e : a.events()) {
    std::string program, node;
    for (const auto& [k, v] : e.args) {
      if (k == "program") program = v;
      if (k == "node") node = v;
    }
    if (program == "1" && !node.empty() && e.category == profile::category::kKernel)
      runs[node].push_back(double(e.duration_ns()));
  }
  ASSERT_FALSE(runs.empty());
  std::string slowed;  // the longest by its median run (a total can be one preempted run)
  double longest = -1;
  for (auto& [node, v] : runs) {
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    if (v[v.size() / 2] > longest) longest = v[v.size() / 2], slowed = node;
  }
  profile::TraceRecorder b, c;
  ::setenv("ASPEN_TEST_SLOW_INSTRUCTION", ("1:" + slowed + ":2").c_str(), 1);
  decode(&b);
  ::unsetenv("ASPEN_TEST_SLOW_INSTRUCTION");
  decode(&c);
  const profile::ProfileDiff d = profile::diff_profiles(a.events(), b.events());
  ASSERT_FALSE(d.slower.empty()) << "detectable " << d.detectable << ", run factor " << d.run_factor << ", spread "
                                 << d.spread << ", compared " << d.compared << ", slowed node " << slowed;
  EXPECT_EQ(d.slower[0].program, "1");
  EXPECT_EQ(d.slower[0].node, slowed);
  EXPECT_GT(d.slower[0].ratio, 2.0);
  for (const profile::InstructionDiff& x : profile::diff_profiles(a.events(), c.events()).slower)
    EXPECT_LT(x.ratio, 3.0) << x.name << " " << x.node;
  // A hook value that does not parse is named when the session is made.
  ::setenv("ASPEN_TEST_SLOW_INSTRUCTION", "1:x", 1);
  auto bad = Generator::open(kTestdata + "/gpt2-tiny", {.max_batch = 1, .max_length = 16, .max_prompt = 4});
  ::unsetenv("ASPEN_TEST_SLOW_INSTRUCTION");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("ASPEN_TEST_SLOW_INSTRUCTION"), std::string::npos) << bad.status().to_string();
}

}  // namespace
}  // namespace aspen::models
