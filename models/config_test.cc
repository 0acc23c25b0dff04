// Tests of models/config.cc: the tiny checkpoints' config.json files, and
// every error worded exactly.
#include "models/config.h"

#include <gtest/gtest.h>

#include <tuple>

#include "core/log.h"

namespace aspen::models {
namespace {

const std::string kTestdata = ASPEN_MODELS_TESTDATA;

// A minimal valid config of `type` with `extra` keys appended (a JSON fragment starting with a comma).
std::string json_of(const std::string& type, const std::string& extra = "") {
  if (type == "gpt2" || type == "gptj")
    return R"({"model_type": ")" + type + R"(", "vocab_size": 50, "n_positions": 16, "n_embd": 12, "n_layer": 2,
              "n_head": 3)" + extra + "}";
  if (type == "llama" || type == "mistral" || type == "qwen2")
    return R"({"model_type": ")" + type + R"(", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 20, "max_position_embeddings": 16)" + extra + "}";
  return R"({"model_type": "bert", "vocab_size": 50, "hidden_size": 12, "num_hidden_layers": 2,
            "num_attention_heads": 3, "intermediate_size": 20, "max_position_embeddings": 16)" + extra + "}";
}

std::string error_of(const std::string& text) { return parse_config(text, "c.json").status().message(); }

TEST(Config, LoadsTheTinyCheckpointsConfigs) {
  auto gpt2 = load_config(kTestdata + "/gpt2-tiny/config.json");
  ASSERT_TRUE(gpt2.is_ok()) << gpt2.status().to_string();
  ASSERT_NE(gpt2->gpt2(), nullptr);
  EXPECT_EQ(gpt2->model_type, "gpt2");
  const Gpt2Config& g = *gpt2->gpt2();
  EXPECT_EQ(g.vocab, 1000);
  EXPECT_EQ(g.d_model, 48);
  EXPECT_EQ(g.n_head, 3);
  EXPECT_EQ(g.n_layer, 3);
  EXPECT_EQ(g.n_positions, 64);
  EXPECT_EQ(g.ff_dim(), 192);  // n_inner null
  EXPECT_EQ(g.layer_norm_eps, 1e-5);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(gpt2->bos_token_id, 999);
  EXPECT_EQ(gpt2->pad_token_id, 999);
  EXPECT_EQ(gpt2->eos_token_ids, std::vector<int64_t>{999});
  EXPECT_TRUE(gpt2->unknown_keys.empty());

  auto gptj = load_config(kTestdata + "/gptj-tiny/config.json");
  ASSERT_TRUE(gptj.is_ok()) << gptj.status().to_string();
  ASSERT_NE(gptj->gptj(), nullptr);
  EXPECT_EQ(gptj->gptj()->rotary_dim, 8);
  EXPECT_EQ(gptj->gptj()->d_model, 48);
  EXPECT_TRUE(gptj->unknown_keys.empty());

  auto bert = load_config(kTestdata + "/bert-tiny/config.json");
  ASSERT_TRUE(bert.is_ok()) << bert.status().to_string();
  ASSERT_NE(bert->bert(), nullptr);
  const BertConfig& b = *bert->bert();
  EXPECT_EQ(b.d_model, 48);
  EXPECT_EQ(b.d_ff, 100);
  EXPECT_EQ(b.type_vocab, 2);
  EXPECT_EQ(b.max_positions, 64);
  EXPECT_EQ(b.layer_norm_eps, 1e-12);
  EXPECT_EQ(b.activation, Activation::gelu_erf);
  EXPECT_EQ(bert->pad_token_id, 0);
  EXPECT_FALSE(bert->bos_token_id.has_value());  // null
  EXPECT_TRUE(bert->eos_token_ids.empty());
  EXPECT_TRUE(bert->unknown_keys.empty());
}

TEST(Config, DefaultsNullsAndLists) {
  auto c = parse_config(json_of("gptj", R"(, "rotary_dim": null, "eos_token_id": [7, 9])"), "c.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->gptj()->rotary_dim, 4);  // null: the whole head
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{7, 9}));
  auto b = parse_config(json_of("bert", R"(, "hidden_act": "gelu_new")"), "c.json");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->bert()->activation, Activation::gelu_tanh);
  EXPECT_EQ(b->bert()->layer_norm_eps, 1e-12);
}

TEST(Config, UnknownKeysAreAWarningListingThem) {
  std::vector<std::string> logged;
  LogSink old = set_log_sink([&](LogLevel level, const std::string& m) {
    if (level == LogLevel::warning) logged.push_back(m);
  });
  auto c = parse_config(json_of("gpt2", R"(, "zeta": 1, "alpha_thing": true, "resid_pdrop": 0.1, "dtype": "float32")"),
                        "c.json");
  set_log_sink(old);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->unknown_keys, (std::vector<std::string>{"alpha_thing", "zeta"}));
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("c.json: unknown gpt2 config keys ignored: alpha_thing, zeta"), std::string::npos)
      << logged[0];
}

TEST(Config, ErrorsNameTheFileTheKeyAndWhatWasFound) {
  EXPECT_EQ(error_of(R"({"model_type": "t5"})"),
            "c.json: model_type: expected one of gpt2, gptj, bert, llama, mistral, qwen2, found \"t5\"");
  EXPECT_EQ(error_of(R"({"n_embd": 4})"), "c.json: key 'model_type': expected present, found none");
  EXPECT_EQ(error_of(R"({"model_type": "gpt2", "vocab_size": 50, "n_positions": 16, "n_layer": 2, "n_head": 3})"),
            "c.json: key 'n_embd': expected present (it sizes the model), found none");
  EXPECT_EQ(error_of(json_of("bert").substr(0, 40) + "}"), "c.json: expected well-formed JSON, found a parse error");
  EXPECT_EQ(error_of("[1, 2]"), "c.json: expected a JSON object, found array");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "n_inner": "big")")),
            "c.json: key 'n_inner': expected an integer, found \"big\"");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "activation_function": "relu")")),
            "c.json: key 'activation_function': expected \"gelu_new\" (what the graph computes), found \"relu\"");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "scale_attn_by_inverse_layer_idx": true)")),
            "c.json: key 'scale_attn_by_inverse_layer_idx': expected false (what the graph computes), found true");
  EXPECT_EQ(error_of(json_of("gptj", R"(, "tie_word_embeddings": true)")),
            "c.json: key 'tie_word_embeddings': expected false (what the graph computes), found true");
  EXPECT_EQ(error_of(json_of("bert", R"(, "hidden_act": "relu")")),
            "c.json: key 'hidden_act': expected \"gelu\" or \"gelu_new\" (what the graph computes), found \"relu\"");
  EXPECT_EQ(error_of(json_of("bert", R"(, "position_embedding_type": "relative_key")")),
            "c.json: key 'position_embedding_type': expected \"absolute\" (what the graph computes), found "
            "\"relative_key\"");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "layer_norm_epsilon": "small")")),
            "c.json: key 'layer_norm_epsilon': expected a number, found \"small\"");
  // The family's own validation, in the graph's names, prefixed with the file.
  EXPECT_EQ(error_of(R"({"model_type": "gpt2", "vocab_size": 50, "n_positions": 16, "n_embd": 13, "n_layer": 2,
                        "n_head": 3})"),
            "c.json: gpt2 config: d_model: expected a multiple of n_head (3), found 13");
  EXPECT_EQ(error_of(json_of("gptj", R"(, "rotary_dim": 3)")),
            "c.json: gptj config: rotary_dim: expected an even number, found 3");
  auto missing = load_config("/nonexistent/config.json");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "/nonexistent/config.json: expected a readable file, found No such file or directory");
  // A directory, a FIFO or /dev/zero where config.json belongs: refused at once, never read until memory runs out.
  EXPECT_EQ(load_config("/dev/zero").status().message(), "/dev/zero: expected a regular file, found a character device");
  EXPECT_EQ(load_config("/tmp").status().message(), "/tmp: expected a regular file, found a directory");
}

// The config written for export reads back to the same family config and ids.
void expect_round_trip(const ModelConfig& c) {
  auto text = to_hf_config_json(c);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  auto back = parse_config(*text, "exported.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string() << "\n" << *text;
  EXPECT_EQ(back->model_type, c.model_type);
  EXPECT_TRUE(back->unknown_keys.empty()) << *text;
  EXPECT_EQ(back->bos_token_id, c.bos_token_id);
  EXPECT_EQ(back->pad_token_id, c.pad_token_id);
  EXPECT_EQ(back->eos_token_ids, c.eos_token_ids);
  if (const Gpt2Config* a = c.gpt2()) {
    const Gpt2Config* b = back->gpt2();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(std::tie(a->vocab, a->n_positions, a->d_model, a->n_layer, a->n_head, a->d_ff, a->layer_norm_eps,
                       a->tie_word_embeddings),
              std::tie(b->vocab, b->n_positions, b->d_model, b->n_layer, b->n_head, b->d_ff, b->layer_norm_eps,
                       b->tie_word_embeddings));
  } else if (const LlamaConfig* l = c.llama()) {
    const LlamaConfig* b = back->llama();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(std::tie(l->vocab, l->n_positions, l->d_model, l->n_layer, l->n_head, l->d_ff, l->rms_norm_eps,
                       l->tie_word_embeddings, l->qkv_bias, l->o_bias, l->mlp_bias, l->sliding_window),
              std::tie(b->vocab, b->n_positions, b->d_model, b->n_layer, b->n_head, b->d_ff, b->rms_norm_eps,
                       b->tie_word_embeddings, b->qkv_bias, b->o_bias, b->mlp_bias, b->sliding_window));
    EXPECT_EQ(l->kv_heads(), b->kv_heads());
    EXPECT_EQ(l->head_size(), b->head_size());
    EXPECT_EQ(std::tie(l->rope.theta, l->rope.scaling, l->rope.factor, l->rope.low_freq_factor,
                       l->rope.high_freq_factor),
              std::tie(b->rope.theta, b->rope.scaling, b->rope.factor, b->rope.low_freq_factor,
                       b->rope.high_freq_factor));
    if (l->rope.scaling == "llama3") {
      EXPECT_EQ(l->rope.original_max_positions, b->rope.original_max_positions);
    }
  } else {
    const GptjConfig* a2 = c.gptj();
    const GptjConfig* b = back->gptj();
    ASSERT_NE(a2, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(std::tie(a2->vocab, a2->n_positions, a2->d_model, a2->n_layer, a2->n_head, a2->rotary_dim, a2->d_ff,
                       a2->layer_norm_eps),
              std::tie(b->vocab, b->n_positions, b->d_model, b->n_layer, b->n_head, b->rotary_dim, b->d_ff,
                       b->layer_norm_eps));
  }
}

TEST(Config, HfConfigJsonRoundTripsThroughParseConfig) {
  for (const char* name : {"gpt2-tiny", "gptj-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny", "llama-dynamic-tiny"}) {
    SCOPED_TRACE(name);
    auto c = load_config(kTestdata + "/" + name + "/config.json");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    expect_round_trip(*c);
  }
  // Untied head, explicit n_inner, an odd epsilon, an eos list and no bos or pad.
  auto c = parse_config(json_of("gpt2", R"(, "tie_word_embeddings": false, "n_inner": 17,
                                           "layer_norm_epsilon": 1.2345678901234567e-7, "eos_token_id": [3, 4])"),
                        "c.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  expect_round_trip(*c);
  auto j = parse_config(json_of("gptj", R"(, "rotary_dim": 2, "bos_token_id": 1, "pad_token_id": 0)"), "c.json");
  ASSERT_TRUE(j.is_ok()) << j.status().to_string();
  expect_round_trip(*j);
}

// The Llama family as transformers 5.24 saves it (models/testdata), and as 4.x
// wrote rope_theta and rope_scaling beside the other keys.
TEST(Config, LlamaFamilyConfigs) {
  auto llama = load_config(kTestdata + "/llama-tiny/config.json");
  ASSERT_TRUE(llama.is_ok()) << llama.status().to_string();
  const LlamaConfig* l = llama->llama();
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(llama->unknown_keys.empty());
  EXPECT_EQ(std::tie(l->n_head, l->n_kv_head, l->head_dim, l->d_ff), std::make_tuple(4, 2, 12, 80));
  EXPECT_EQ(std::tie(l->rope.scaling, l->rope.theta, l->rope.factor, l->rope.original_max_positions),
            std::make_tuple(std::string("llama3"), 500.0, 4.0, 16));
  EXPECT_FALSE(l->tie_word_embeddings || l->qkv_bias || l->mlp_bias || l->sliding_window);

  auto mistral = load_config(kTestdata + "/mistral-tiny/config.json");
  ASSERT_TRUE(mistral.is_ok()) << mistral.status().to_string();
  const LlamaConfig* m = mistral->llama();
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(mistral->unknown_keys.empty());
  EXPECT_EQ(std::tie(m->n_kv_head, m->head_dim, m->sliding_window), std::make_tuple(1, 16, 6));
  EXPECT_EQ(m->rope.scaling, "none");
  EXPECT_TRUE(m->tie_word_embeddings);

  auto qwen = load_config(kTestdata + "/qwen2-tiny/config.json");
  ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
  const LlamaConfig* q = qwen->llama();
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(qwen->unknown_keys.empty());
  EXPECT_TRUE(q->qkv_bias);
  EXPECT_FALSE(q->o_bias);
  EXPECT_EQ(q->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(std::tie(q->rope.scaling, q->rope.factor), std::make_tuple(std::string("linear"), 2.0));

  // transformers 4.x: rope_theta beside rope_scaling ("type" in the oldest files).
  auto old = parse_config(json_of("llama", R"(, "rope_theta": 500000.0, "num_key_value_heads": 2,
      "rope_scaling": {"type": "linear", "factor": 8.0}, "attention_bias": true)"), "c.json");
  ASSERT_TRUE(old.is_ok()) << old.status().to_string();
  EXPECT_EQ(old->llama()->rope.theta, 500000.0);
  EXPECT_EQ(old->llama()->rope.scaling, "linear");
  EXPECT_TRUE(old->llama()->qkv_bias && old->llama()->o_bias);
  EXPECT_EQ(old->llama()->head_size(), 4);
}

TEST(Config, LlamaFamilyErrorsNameTheKey) {
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_scaling": {"rope_type": "yarn", "factor": 2.0})")),
            "c.json: key 'rope_scaling.rope_type': expected \"default\", \"linear\", \"llama3\" or \"dynamic\" "
            "(yarn and longrope: not in this build), found \"yarn\"");
  {  // dynamic NTK scaling: over max_position_embeddings, which it runs past by its factor
    auto d = parse_config(json_of("llama", R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"), "c.json");
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_EQ(d->llama()->rope.scaling, "dynamic");
    EXPECT_EQ(d->llama()->rope.original_max_positions, d->llama()->n_positions);
    EXPECT_EQ(d->n_positions(), 2 * d->llama()->n_positions);
  }
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 0.5})")),
            "c.json: llama config: rope_scaling: expected dynamic with factor >= 1 over max_position_embeddings "
            "(16), found factor 0.500000 over 16");
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
      "partial_rotary_factor": 0.5})")),
            "c.json: key 'rope_parameters.partial_rotary_factor': expected none (not part of linear scaling here), "
            "found 0.5");
  // Rope settings read differently by transformers releases, or not at all: refused by name.
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_scaling": {"rope_type": "linear"})")),
            "c.json: key 'rope_scaling.factor': expected a number (linear scaling needs one), found none");
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0},
      "rope_scaling": {"type": "linear", "factor": 4.0})")),
            "c.json: key 'rope_scaling.factor': expected the value rope_parameters.factor gives (2.0), or no "
            "rope_scaling, found 4.0");
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_theta": 10000.0,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})")),
            "c.json: key 'rope_theta': expected the value rope_parameters.rope_theta gives (500000.0), found 10000.0");
  {  // the same values in both forms are fine
    auto both = parse_config(json_of("llama", R"(, "rope_theta": 500000.0,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0},
        "rope_scaling": {"type": "linear", "factor": 2.0})"), "c.json");
    ASSERT_TRUE(both.is_ok()) << both.status().to_string();
    EXPECT_EQ(both->llama()->rope.factor, 2.0);
  }
  EXPECT_EQ(error_of(json_of("llama", R"(, "hidden_act": "gelu")")),
            "c.json: key 'hidden_act': expected \"silu\" (what the graph computes), found \"gelu\"");
  EXPECT_EQ(error_of(json_of("llama", R"(, "num_key_value_heads": 3)")),
            "c.json: llama config: n_kv_head: expected a divisor of n_head (4), found 3");
  EXPECT_EQ(error_of(json_of("llama", R"(, "pretraining_tp": 2)")),
            "c.json: key 'pretraining_tp': expected 1 (the projections whole), found 2");
  EXPECT_EQ(error_of(json_of("qwen2", R"(, "use_sliding_window": true)")),
            "c.json: key 'use_sliding_window': expected false (what the graph computes), found true");
  EXPECT_EQ(error_of(json_of("mistral", R"(, "sliding_window": 4, "layer_types": ["sliding_attention",
      "full_attention"])")),
            "c.json: key 'layer_types': expected 2 times \"sliding_attention\" (every layer alike), found "
            "[\"sliding_attention\",\"full_attention\"]");
  EXPECT_EQ(error_of(json_of("llama", R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})")),
            "c.json: llama config: rope_scaling: expected 0 < low_freq_factor < high_freq_factor and "
            "original_max_position_embeddings > 0, found 4.000000, 1.000000, 8192");
}

TEST(Config, HfConfigJsonHasTransformersKeys) {
  auto c = load_config(kTestdata + "/gpt2-tiny/config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto text = to_hf_config_json(*c);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  for (const char* key : {R"("model_type": "gpt2")", R"("architectures": [)", R"("GPT2LMHeadModel")",
                          R"("n_inner": null)", R"("torch_dtype": "float32")", R"("tie_word_embeddings": true)",
                          R"("bos_token_id": 999)", R"("eos_token_id": 999)"})
    EXPECT_NE(text->find(key), std::string::npos) << key << " not in\n" << *text;
  auto none = parse_config(json_of("gpt2"), "c.json");
  ASSERT_TRUE(none.is_ok());
  auto t2 = to_hf_config_json(*none);
  ASSERT_TRUE(t2.is_ok());
  EXPECT_NE(t2->find(R"("bos_token_id": null)"), std::string::npos) << *t2;  // not HF's default 50256
}

// A model's sparse layout (NOTE [model layouts]): written by to_hf_config_json, read back field for field;
// model_layout cuts the layout of the whole context; bad keys and lengths are named.
TEST(Config, SparseAttentionRoundTripsAndCutsTheContextsLayout) {
  auto base = parse_config(json_of("gpt2"), "c.json");  // n_positions 16, n_head 3
  ASSERT_TRUE(base.is_ok());
  kernels::SparsityConfig sc = kernels::SparsityConfig::bigbird(3);
  sc.block = 4;
  sc.num_random_blocks = 2;
  sc.num_sliding_window_blocks = 1;
  sc.different_layout_per_head = true;
  sc.seed = 12345678901234ULL;
  ModelConfig with = *base;
  with.sparse_attention = sc;
  auto text = to_hf_config_json(with);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_NE(text->find(R"("aspen_sparse_attention": {)"), std::string::npos) << *text;
  auto back = parse_config(*text, "c.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(back->unknown_keys.empty());
  ASSERT_TRUE(back->sparse_attention.has_value());
  const kernels::SparsityConfig& r = *back->sparse_attention;
  EXPECT_EQ(r.kind, sc.kind);
  EXPECT_EQ(r.num_heads, 3);
  EXPECT_EQ(r.block, 4);
  EXPECT_EQ(r.num_random_blocks, 2);
  EXPECT_EQ(r.num_sliding_window_blocks, 1);
  EXPECT_TRUE(r.different_layout_per_head);
  EXPECT_EQ(r.seed, sc.seed);
  EXPECT_EQ(r.attention, sc.attention);
  EXPECT_FALSE(base->sparse_attention.has_value());
  auto dense = model_layout(*base, 8, "x");
  ASSERT_TRUE(dense.is_ok());
  EXPECT_FALSE(dense->has_value());

  auto master = kernels::make_layout(sc, 16);
  ASSERT_TRUE(master.is_ok());
  for (int64_t seq : {4, 8, 16}) {
    auto l = model_layout(*back, seq, "x");
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    ASSERT_TRUE(l->has_value());
    EXPECT_EQ((*l)->blocks, seq / 4);
    EXPECT_EQ((*l)->bits, kernels::layout_prefix(*master, seq / 4)->bits) << seq;
  }
  EXPECT_EQ(model_layout(*back, 6, "embedder").status().message(),
            "embedder: rows of 6 tokens: expected whole blocks of the sparse layout (block: 4 tokens), found 1 blocks "
            "and 2 tokens over");
  EXPECT_EQ(model_layout(*back, 20, "x").status().message(),
            "x: rows of 20 tokens: expected at most the model's context (16 positions, whole blocks of 4: 16), found 20");

  EXPECT_EQ(error_of(json_of("gpt2", R"(, "aspen_sparse_attention": {"kind": "bigbird", "blocks": 4})")),
            "c.json: key 'aspen_sparse_attention'.blocks: expected a key of DeepSpeed's sparsity configs (kind, block, "
            "different_layout_per_head, num_local_blocks, num_global_blocks, attention, horizontal_global_attention, "
            "num_different_global_patterns, num_random_blocks, local_window_blocks, global_block_indices, "
            "global_block_end_indices, num_sliding_window_blocks, seed), found an unknown key");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "aspen_sparse_attention": {"kind": "sparse"})")),
            "c.json: key 'aspen_sparse_attention': kind: expected one of dense, fixed, variable, bigbird, bslongformer, "
            "local_sliding_window, found 'sparse'");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "aspen_sparse_attention": {"kind": "fixed", "block": -4})")),
            "c.json: key 'aspen_sparse_attention'.block: expected an integer >= 0, found -4");
  EXPECT_EQ(error_of(json_of("gpt2", R"(, "aspen_sparse_attention": [1])")),
            "c.json: key 'aspen_sparse_attention': expected an object (a sparsity config), found [1]");
}

TEST(Config, HfConfigJsonErrors) {
  ModelConfig bad;
  bad.model_type = "gpt2";
  bad.family = Gpt2Config{.vocab = 10, .n_positions = 4, .d_model = 13, .n_layer = 1, .n_head = 3};
  EXPECT_EQ(to_hf_config_json(bad).status().message(),
            "to_hf_config_json: gpt2 config: d_model: expected a multiple of n_head (3), found 13");
}

}  // namespace
}  // namespace aspen::models
