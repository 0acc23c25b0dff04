// models/bert.h: the BERT encoder graph (Hugging Face BertModel), its pooler,
// and the sentence embedding of sentence-transformers models (mean pooling,
// then L2 normalization), built from the blocks of models/blocks.h.
//
//   graph::Graph g;
//   graph::Builder b(g);
//   ASPEN_ASSIGN_OR_RETURN(BertGraph m, build_bert(b, BertConfig::minilm_l6(),
//                                                  {.batch = 8, .seq = 128, .sentence_embedding = true}));
//
// The graph, as Hugging Face's modeling_bert computes it (eval mode, dropout off):
//   x = LayerNorm(word[input_ids] + token_type[token_type_ids] + position[t])   (absolute positions 0..T-1)
//   per layer i (post-LN):
//     q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv       (nn.Linear, biased)
//     attention without a causal mask, scale 1/sqrt(D), keys with attention_mask 0 never attended
//     x = LayerNorm(dense(heads merged) + x)                (attention.output)
//     x = LayerNorm(dense(act(dense(x))) + x)               (intermediate, output; act: erf GELU for "gelu")
//   last_hidden_state = x
//   pooler_output = tanh(pooler.dense(x[:, 0]))             (the [CLS] token)
//   sentence_embedding = normalize(sum_t mask[t] x[t] / sum_t mask[t])   (L2; a row needs one token at least)
//   logits = LayerNorm(act(dense(x))) word^T + bias          (BertForMaskedLM's cls.predictions head)
//
// Parameter names are Hugging Face BertModel's (a BertForX checkpoint adds a
// "bert." prefix, which models/weights.h maps when loading):
//   embeddings.{word,position,token_type}_embeddings.weight      [vocab | max_positions | type_vocab, d_model]
//   embeddings.LayerNorm.{weight,bias}                           [d_model]
//   encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}   [d_model, d_model], [d_model]
//   encoder.layer.{i}.attention.output.dense.{weight,bias}       [d_model, d_model], [d_model]
//   encoder.layer.{i}.attention.output.LayerNorm.{weight,bias}   [d_model]
//   encoder.layer.{i}.intermediate.dense.{weight,bias}           [d_ff, d_model], [d_ff]
//   encoder.layer.{i}.output.dense.{weight,bias}                 [d_model, d_ff], [d_model]
//   encoder.layer.{i}.output.LayerNorm.{weight,bias}             [d_model]
//   pooler.dense.{weight,bias}                                   [d_model, d_model], [d_model]   (with the pooler)
//   cls.predictions.transform.dense.{weight,bias}                [d_model, d_model], [d_model]   (with the MLM head;
//   cls.predictions.transform.LayerNorm.{weight,bias}            [d_model]                        BertForMaskedLM's
//   cls.predictions.bias                                         [vocab]                          names: no prefix)
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/builder.h"
#include "models/blocks.h"

namespace aspen::models {

struct BertConfig {
  int64_t vocab = 30522, type_vocab = 2, max_positions = 512, d_model = 768, n_layer = 12, n_head = 12,
          d_ff = 3072;
  double layer_norm_eps = 1e-12;
  Activation activation = Activation::gelu_erf;
  DType dtype = DType::f32;

  // google-bert/bert-base-uncased (the defaults above).
  static BertConfig bert_base() { return BertConfig{}; }
  // sentence-transformers/all-MiniLM-L6-v2.
  static BertConfig minilm_l6() { return BertConfig{.d_model = 384, .n_layer = 6, .n_head = 12, .d_ff = 1536}; }
  // A tiny random configuration for tests: every dimension distinct.
  static BertConfig tiny() {
    return BertConfig{
        .vocab = 29, .type_vocab = 3, .max_positions = 13, .d_model = 20, .n_layer = 2, .n_head = 4, .d_ff = 26};
  }

  int64_t head_dim() const { return n_head > 0 ? d_model / n_head : 0; }
  // Every key in range: a Status naming the key ("bert config: n_head"),
  // what was expected and what was found.
  Status validate() const;
};

struct BertOptions {
  int64_t batch = 1, seq = 1;
  bool pooler = false;              // output "pooler_output" [batch, d_model]
  bool sentence_embedding = false;  // output "sentence_embedding" [batch, d_model]
  // Output "logits" [batch, seq, vocab]: BertForMaskedLM's head (cls.predictions: a dense layer, the
  // activation, a LayerNorm, then the decoder tied to the word embeddings plus a vocabulary bias).
  bool mlm_head = false;
  // Training the MLM head (with mlm_head): input "targets" i32 [batch * seq] (the id to predict at each
  // position, -100 where nothing is: HF's labels) and output "loss", the mean cross-entropy over the others.
  bool with_loss = false;
  // Training the MLM head on K = mlm_predictions rows per example only (0: every position), as NVIDIA's and
  // Graphcore's BERT do: input "mlm_positions" i32 [batch * K] (row b * seq + t of the micro-batch's tokens;
  // padding entries any row, their target -100), "targets" i32 [batch * K], "logits" [batch, K, vocab]. The
  // loss is the same mean over the predicted tokens; the head's work shrinks by seq / K.
  int64_t mlm_predictions = 0;
  // Sparse attention: a bidirectional block layout for seq tokens (kernels/attention_layout.h; blocks *
  // block == seq; one layout or one per head), a constant of the graph on top of attention_mask.
  const kernels::BlockLayout* layout = nullptr;
  // Dropout on the attention probabilities (training; [0, 1)): input "dropout_seed" i64 [1] (negative:
  // none), layer i's Philox stream i (models/blocks.h AttentionSpec).
  double attention_dropout = 0.0;
};

struct BertGraph {
  graph::ValueId input_ids, token_type_ids, attention_mask, targets, mlm_positions, dropout_seed;
  graph::ValueId last_hidden_state;
  graph::ValueId pooler_output;       // invalid unless built with options.pooler
  graph::ValueId sentence_embedding;  // invalid unless built with options.sentence_embedding
  graph::ValueId logits;              // invalid unless built with options.mlm_head
  graph::ValueId loss;                // invalid unless built with options.with_loss
};

// The masked-LM head's rows per example when `probability` of `seq` tokens are predicted: the mean plus six
// standard deviations of the count (a row exceeds it with probability below 1e-9); 0 (every position) when
// that reaches seq.
int64_t default_mlm_predictions(int64_t seq, double probability);
// The inputs of the head on the predicted rows only (BertOptions::mlm_predictions K): from targets [B, T]
// (-100 where nothing is predicted), each row's predicted tokens in order, then padding: positions [B, K]
// (b * T + t; padding b * T) and kept [B, K] (their targets; padding -100). Returns how many predicted
// tokens past K a row had (left out).
int64_t gather_mlm_predictions(const int32_t* targets, int64_t B, int64_t T, int64_t K, int32_t* positions,
                               int32_t* kept);

// Records the BERT encoder for fixed [batch, seq]:
//   inputs  "input_ids" i32 [batch, seq], "token_type_ids" i32 [batch, seq],
//           "attention_mask" u8 [batch, seq] (1 = token, 0 = padding),
//   outputs "last_hidden_state" [batch, seq, d_model], and as asked
//           "pooler_output" and "sentence_embedding" [batch, d_model].
// A bad config or shape is a Status; so is the builder's first error.
Result<BertGraph> build_bert(graph::Builder& b, const BertConfig& c, const BertOptions& options);

}  // namespace aspen::models
