// python/text.cc: the built-in families' doors in aspen._aspen: a Hugging Face tokenizer, a compiled
// generator and a sentence embedder (python/aspen/text.py wraps them).
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "io/tokenizer.h"
#include "models/embedder.h"
#include "models/generate.h"
#include "models/weights.h"
#include "python/binding.h"

using namespace nb::literals;

namespace aspen::python {
namespace {

class PyTokenizer {
 public:
  explicit PyTokenizer(std::unique_ptr<io::Tokenizer> t) : t_(std::move(t)) {}
  static PyTokenizer from_file(const std::string& path) {
    const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
    return PyTokenizer(take(json ? io::load_tokenizer_json(path) : models::load_model_tokenizer(path)));
  }
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const {
    return t_->encode(text, add_special_tokens);
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    for (size_t i = 0; i < ids.size(); ++i)  // (negative ids were once dropped without a word)
      if (ids[i] < 0) bad_argument("ids[" + std::to_string(i) + "]", "a token id >= 0", std::to_string(ids[i]));
    return t_->decode(ids, skip_special_tokens);
  }
  std::optional<std::string> id_to_token(int32_t id) const { return t_->id_to_token(id); }
  std::optional<int32_t> token_to_id(const std::string& token) const { return t_->token_to_id(token); }
  size_t vocab_size() const { return t_->vocab_size(); }
  const io::Tokenizer& get() const { return *t_; }

 private:
  std::unique_ptr<io::Tokenizer> t_;
};

class PyGenerator {
 public:
  PyGenerator(const std::string& dir, int64_t max_batch, int64_t max_length, int64_t max_prompt, int threads,
              const std::string& weights) {
    models::GeneratorOptions o;
    if (max_batch < 1) bad_argument("max_batch", ">= 1", std::to_string(max_batch));
    if (max_length < 0) bad_argument("max_length", ">= 0 (0: the model's n_positions)", std::to_string(max_length));
    if (max_prompt < 0) bad_argument("max_prompt", ">= 0 (0: half of max_length)", std::to_string(max_prompt));
    if (threads < 0) bad_argument("threads", ">= 0 (0: the free cores)", std::to_string(threads));
    o.max_batch = max_batch;
    o.max_length = max_length;
    o.max_prompt = max_prompt;
    o.threads = threads;
    if (weights == "bf16") o.weights = DType::bf16;
    else if (weights != "f32") bad_argument("dtype", "f32 or bf16", "'" + weights + "'");
    nb::gil_scoped_release unlocked;
    g_ = take(models::Generator::open(dir, o));
    tok_ = PyTokenizer(take(models::load_model_tokenizer(dir)));  // a directory, or a GGUF file
  }

  const PyTokenizer& tokenizer() const { return tok_; }
  std::vector<int32_t> stop_tokens() const {
    std::vector<int32_t> out;
    for (int64_t id : g_->config().eos_token_ids) out.push_back(int32_t(id));
    return out;
  }
  int64_t max_prompt() const { return g_->options().max_prompt; }

  // One continuation per prompt; on_token(row, token) is called as each token is drawn (with the GIL),
  // returning False stops the call.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                             int64_t max_new_tokens, float temperature, int32_t top_k, float top_p,
                                             float repetition_penalty, uint64_t seed, bool stop_at_eos,
                                             std::optional<nb::callable> on_token) {
    models::SamplingOptions s;
    s.max_new_tokens = max_new_tokens;
    s.temperature = temperature;
    s.top_k = top_k;
    s.top_p = top_p;
    s.repetition_penalty = repetition_penalty;
    s.seed = seed;
    if (stop_at_eos) s.stop_tokens = stop_tokens();
    std::exception_ptr failure;
    if (on_token) {
      s.on_token = [&](int64_t row, int32_t token) {
        nb::gil_scoped_acquire locked;
        try {
          nb::object r = (*on_token)(row, token);
          return r.is_none() || nb::cast<bool>(r);
        } catch (...) {
          failure = std::current_exception();
          return false;
        }
      };
    }
    Result<std::vector<std::vector<int32_t>>> r = [&] {
      nb::gil_scoped_release unlocked;
      return g_->generate(prompts, s);
    }();
    if (failure) std::rethrow_exception(failure);  // the callback's own exception, as Python raised it
    return take(std::move(r));
  }

 private:
  std::unique_ptr<models::Generator> g_;
  PyTokenizer tok_{nullptr};
};

class PyEmbedder {
 public:
  PyEmbedder(const std::string& dir, int64_t max_batch, int64_t max_length, int threads) {
    if (max_batch < 1) bad_argument("max_batch", ">= 1", std::to_string(max_batch));
    if (max_length < 0) bad_argument("max_length", ">= 0 (0: the model's)", std::to_string(max_length));
    if (threads < 0) bad_argument("threads", ">= 0 (0: the free cores)", std::to_string(threads));
    models::EmbedderOptions o{.max_batch = max_batch, .max_length = max_length, .threads = threads};
    nb::gil_scoped_release unlocked;
    e_ = take(models::Embedder::open(dir, o));
  }
  nb::object embed(const std::vector<std::string>& texts) {
    std::vector<std::vector<float>> v;
    {
      nb::gil_scoped_release unlocked;
      v = take(e_->embed(texts));
    }
    const int64_t n = int64_t(texts.size()), d = e_->dim();
    Tensor t = take(Tensor::make_uninitialized(DType::f32, Shape{n, d}));
    for (int64_t i = 0; i < n; ++i) std::memcpy(t.data<float>() + i * d, v[size_t(i)].data(), size_t(d) * 4);
    return to_numpy(std::move(t));
  }
  int64_t dim() const { return e_->dim(); }

 private:
  std::unique_ptr<models::Embedder> e_;
};

}  // namespace

void bind_text(nb::module_& m) {
  nb::class_<PyTokenizer>(m, "Tokenizer")
      .def_static("from_file", &PyTokenizer::from_file, "path"_a)
      .def("encode", &PyTokenizer::encode, "text"_a, "add_special_tokens"_a = true)
      .def("decode", &PyTokenizer::decode, "ids"_a, "skip_special_tokens"_a = false)
      .def("id_to_token", &PyTokenizer::id_to_token, "id"_a)
      .def("token_to_id", &PyTokenizer::token_to_id, "token"_a)
      .def_prop_ro("vocab_size", &PyTokenizer::vocab_size);

  nb::class_<PyGenerator>(m, "Generator")
      .def(nb::init<const std::string&, int64_t, int64_t, int64_t, int, const std::string&>(), "model_dir"_a,
           "max_batch"_a = 1, "max_length"_a = 0, "max_prompt"_a = 0, "threads"_a = 0, "dtype"_a = "f32")
      .def_prop_ro("tokenizer", &PyGenerator::tokenizer, nb::rv_policy::reference_internal)
      .def_prop_ro("max_prompt", &PyGenerator::max_prompt)
      .def("generate", &PyGenerator::generate, "prompts"_a, "max_new_tokens"_a, "temperature"_a, "top_k"_a,
           "top_p"_a, "repetition_penalty"_a, "seed"_a, "stop_at_eos"_a, "on_token"_a = nb::none());

  nb::class_<PyEmbedder>(m, "Embedder")
      .def(nb::init<const std::string&, int64_t, int64_t, int>(), "model_dir"_a, "max_batch"_a = 32,
           "max_length"_a = 0, "threads"_a = 0)
      .def("embed", &PyEmbedder::embed, "texts"_a)
      .def_prop_ro("dim", &PyEmbedder::dim);
}

}  // namespace aspen::python
