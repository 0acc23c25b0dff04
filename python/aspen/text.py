"""The built-in families' doors: generate text, embed sentences, tokenize as Hugging Face does.

    for piece in aspen.generate("models/testdata/gpt2-tiny", "ROMEO:", max_new_tokens=16, temperature=0):
        print(piece, end="", flush=True)
    vectors = aspen.embed(minilm_dir, ["A man is eating food.", "I love you."])   # numpy [2, 384]
    tok = aspen.Tokenizer.from_file("tokenizer.json")
    tok.encode("Hello world").ids, tok.decode([15496, 995])

Models are compiled once per directory and settings, and kept for later calls (generator() and
embedder() give the objects themselves).
"""

import atexit
import os
import queue
import threading

from . import _aspen, _check

__all__ = ["generate", "embed", "Tokenizer", "Encoding", "Generator", "Embedder", "generator", "embedder"]


class Encoding:
    """What Tokenizer.encode returns (the fields of Hugging Face tokenizers' Encoding that aspen has)."""

    __slots__ = ("ids", "tokens", "attention_mask")

    def __init__(self, ids, tokens):
        self.ids = ids
        self.tokens = tokens
        self.attention_mask = [1] * len(ids)

    def __len__(self):
        return len(self.ids)

    def __repr__(self):
        return f"Encoding(num_tokens={len(self.ids)}, ids={self.ids})"


class Tokenizer:
    """A Hugging Face tokenizer (tokenizer.json, vocab.json + merges.txt, or vocab.txt) run by aspen's C++
    implementation; encode and decode match the `tokenizers` package. Unlike `tokenizers`, an id outside
    the vocabulary is refused (ValueError naming it), in decode and id_to_token, never dropped."""

    def __init__(self, native):
        self._t = native

    @staticmethod
    def from_file(path):
        """tokenizer.json, a model directory (tokenizer.json, vocab.json + merges.txt, vocab.txt), or a llama.cpp
        GGUF file (its GPT-2 tokenizer)."""
        return Tokenizer(_aspen.Tokenizer.from_file(_check.path("path", path)))

    def encode(self, text, add_special_tokens=True):
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, found {_check.found(text)}")
        ids = self._t.encode(text, _check.boolean("add_special_tokens", add_special_tokens))
        return Encoding(ids, [self._t.id_to_token(i) for i in ids])

    def encode_batch(self, texts, add_special_tokens=True):
        return [self.encode(t, add_special_tokens) for t in _check.strings("texts", texts)]

    def decode(self, ids, skip_special_tokens=True):
        return self._t.decode(_token_ids("ids", ids, self._t.vocab_size),
                              _check.boolean("skip_special_tokens", skip_special_tokens))

    def decode_batch(self, sequences, skip_special_tokens=True):
        if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__iter__"):
            raise ValueError(f"sequences: expected a list of token id sequences, found "
                             f"{'a str' if isinstance(sequences, str) else _check.found(sequences)}")
        skip = _check.boolean("skip_special_tokens", skip_special_tokens)
        return [self._t.decode(_token_ids(f"sequences[{i}]", s, self._t.vocab_size), skip)
                for i, s in enumerate(sequences)]

    def token_to_id(self, token):
        return self._t.token_to_id(_check.string("token", token))

    def id_to_token(self, id):
        return self._t.id_to_token(_token_id("id", id, self._t.vocab_size))

    def get_vocab_size(self, with_added_tokens=True):
        """One past the largest id, added tokens included (counting without them is not supported)."""
        if not _check.boolean("with_added_tokens", with_added_tokens):
            raise NotImplementedError("get_vocab_size: with_added_tokens=False is not supported (aspen's "
                                      "tokenizers count one past the largest id, added tokens included)")
        return self._t.vocab_size


def _token_id(name, i, vocab_size):
    i = _check.integer(name, i, what="an integer token id")
    if not 0 <= i < vocab_size:
        raise ValueError(f"{name}: expected a token id in [0, {vocab_size}), found {i}")
    return i


def _token_ids(name, ids, vocab_size=None):
    """A sequence of token ids (a list, a 1-D integer array) as a list of ints, each in [0, vocab_size) (in
    the int32 range without one)."""
    what = None
    if isinstance(ids, (str, bytes)):
        what = f"a {type(ids).__name__}"
    elif getattr(ids, "ndim", 1) != 1:
        what = f"an array of shape {tuple(ids.shape)}"
    elif not hasattr(ids, "__iter__"):
        what = _check.found(ids)
    if what is not None:
        raise ValueError(f"{name}: expected a sequence of token ids, found {what}")
    if hasattr(ids, "tolist"):  # numpy arrays and torch tensors: their elements as Python numbers
        ids = ids.tolist()
    out = []
    for k, i in enumerate(ids):
        if vocab_size is None:  # (the C++ side takes int32 and checks the vocabulary itself)
            out.append(_check.integer(f"{name}[{k}]", i, 0, _check.INT32_MAX, what="an integer token id"))
            continue
        i = _check.integer(f"{name}[{k}]", i, what="an integer token id")
        if not 0 <= i < vocab_size:
            raise ValueError(f"{name}[{k}]: expected a token id in [0, {vocab_size}), found {i}")
        out.append(i)
    return out


def _generator_args(model_dir, max_batch, max_length, max_prompt, threads, dtype):
    return (_check.path("model_dir", model_dir), _check.integer("max_batch", max_batch, 1, _check.INT64_MAX),
            _check.integer("max_length", max_length, 0, _check.INT64_MAX, note="0: the model's n_positions"),
            _check.integer("max_prompt", max_prompt, 0, _check.INT64_MAX, note="0: half of max_length"),
            _check.integer("threads", threads, 0, _check.INT32_MAX, note="0: the free cores"),
            _check.string("dtype", dtype, ("f32", "bf16")))


def _sampling(max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop_at_eos):
    """Generator.generate's settings, each checked by name (the C++ side takes f32, int32 and uint64)."""
    return (_check.integer("max_new_tokens", max_new_tokens, 1, _check.INT64_MAX),
            _check.real("temperature", temperature, 0, _check.F32_MAX, note="0: greedy"),
            _check.integer("top_k", top_k, 0, _check.INT32_MAX, note="0: off"),
            _check.real("top_p", top_p, 0, 1, low_open=True, note="1: off"),
            _check.real("repetition_penalty", repetition_penalty, 0, _check.F32_MAX, low_open=True, note="1: off"),
            _check.integer("seed", seed, 0, _check.UINT64_MAX),
            _check.boolean("stop_at_eos", stop_at_eos))


class Generator(_aspen.Generator):
    """The compiled generator of a GPT-2, GPT-J or Llama-family directory (python/text.cc), its arguments
    checked by name here first."""

    def __init__(self, model_dir, max_batch=1, max_length=0, max_prompt=0, threads=0, dtype="f32"):
        super().__init__(*_generator_args(model_dir, max_batch, max_length, max_prompt, threads, dtype))

    def generate(self, prompts, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop_at_eos,
                 on_token=None):
        """One continuation (token ids) per prompt (a list of token id lists); on_token(row, token) is called
        as each token is drawn, and returning False stops."""
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
            raise ValueError(f"prompts: expected a list of token id lists, found {_check.found(prompts)}")
        prompts = [_token_ids(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        if on_token is not None and not callable(on_token):
            raise ValueError(f"on_token: expected a callable or None, found {_check.found(on_token)}")
        return super().generate(prompts, *_sampling(max_new_tokens, temperature, top_k, top_p, repetition_penalty,
                                                    seed, stop_at_eos), on_token=on_token)


class Embedder(_aspen.Embedder):
    """The compiled sentence embedder of a BERT directory (python/text.cc), its arguments checked by name
    here first."""

    def __init__(self, model_dir, max_batch=32, max_length=0, threads=0):
        super().__init__(_check.path("model_dir", model_dir),
                         _check.integer("max_batch", max_batch, 1, _check.INT64_MAX),
                         _check.integer("max_length", max_length, 0, _check.INT64_MAX, note="0: the model's"),
                         _check.integer("threads", threads, 0, _check.INT32_MAX, note="0: the free cores"))

    def embed(self, texts):
        return super().embed(_check.strings("texts", texts))


_generators = {}
_streams = set()  # (stop event, worker thread) of every stream still generating


@atexit.register
def _stop_streams():
    """At interpreter exit: stop the streams a script left half read and wait for their workers, then free
    the compiled models while Python still runs (a worker still inside the generator at shutdown once
    ended the process with "terminate called without an active exception")."""
    for stop, worker in list(_streams):
        stop.set()
        worker.join()
    _generators.clear()
    _embedders.clear()
_embedders = {}


def _threads(threads):
    from . import CPUS
    # NOTE [python cores]: 0 is the CPUs this process may run on
    return _check.integer("threads", threads, 0, _check.INT32_MAX, note="0: the free cores") or CPUS


def generator(model_dir, max_batch=1, max_length=0, max_prompt=0, threads=0, dtype="f32"):
    """The compiled generator of a GPT-2 or GPT-J directory (kept for later calls with the same settings)."""
    args = _generator_args(model_dir, max_batch, max_length, max_prompt, _threads(threads), dtype)
    key = (os.path.realpath(args[0]),) + args[1:]
    if key not in _generators:
        _generators[key] = Generator(*args)
    return _generators[key]


def embedder(model_dir, max_batch=32, max_length=0, threads=0):
    """The compiled sentence embedder of a BERT directory (kept for later calls with the same settings)."""
    model_dir = _check.path("model_dir", model_dir)
    key = (os.path.realpath(model_dir), max_batch, max_length, _threads(threads))
    if key not in _embedders:
        _embedders[key] = Embedder(model_dir, max_batch, max_length, _threads(threads))
    return _embedders[key]


def _stable(text):
    """The text without a trailing incomplete UTF-8 sequence (which the decoder shows as U+FFFD)."""
    return text.rstrip("\ufffd")


def generate(model_dir, prompt, max_new_tokens=32, temperature=1.0, top_k=0, top_p=1.0, seed=0, stream=True,
             repetition_penalty=1.0, stop_at_eos=True, skip_special_tokens=True, max_length=0, threads=0,
             dtype="f32"):
    """Text generated from `prompt` by a causal LM directory (GPT-2, GPT-J, Llama, Mistral, Qwen2) or a llama.cpp
    GGUF file (GPT-2; its weights dequantized when loaded): with stream=True an iterator of text
    pieces as tokens are drawn (their concatenation is the decoded continuation), else the text. Sampling is
    Hugging Face's (temperature 0: greedy; top_k 0 and top_p 1: off); the same seed gives the same text."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt: expected a str, found {_check.found(prompt)}")
    sampling = _sampling(max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop_at_eos)
    stream = _check.boolean("stream", stream)
    skip_special_tokens = _check.boolean("skip_special_tokens", skip_special_tokens)
    g = generator(model_dir, 1, max_length, 0, threads, dtype)
    ids = g.tokenizer.encode(prompt, True)
    if not ids:
        raise ValueError("prompt: expected text with at least one token, found an empty prompt")
    args = ([ids],) + sampling
    if not stream:
        out = g.generate(*args)
        return g.tokenizer.decode(out[0], skip_special_tokens)
    return _stream(g, args, skip_special_tokens)


def _stream(g, args, skip_special_tokens):
    pieces = queue.Queue()
    stop = threading.Event()
    done = object()
    failure = []
    generated = []
    printed = [0]

    def on_token(row, token):
        generated.append(token)
        text = _stable(g.tokenizer.decode(generated, skip_special_tokens))
        if len(text) > printed[0]:
            pieces.put(text[printed[0]:])
            printed[0] = len(text)
        return not stop.is_set()

    def run():
        try:
            g.generate(*args, on_token=on_token)
            text = g.tokenizer.decode(generated, skip_special_tokens)
            if len(text) > printed[0]:
                pieces.put(text[printed[0]:])
        except BaseException as e:  # handed to the consumer
            failure.append(e)
        pieces.put(done)

    worker = threading.Thread(target=run, daemon=True)
    entry = (stop, worker)
    _streams.add(entry)
    worker.start()
    try:
        while True:
            item = pieces.get()
            if item is done:
                break
            yield item
    finally:
        stop.set()
        worker.join()
        _streams.discard(entry)
    if failure:
        raise failure[0]


def embed(model_dir, sentences, max_length=0, threads=0):
    """L2-normalized sentence embeddings (numpy float32 [len(sentences), dim]) from a BERT directory
    (all-MiniLM-L6-v2's mean pooling, as sentence-transformers computes them)."""
    sentences = _check.strings("sentences", sentences)
    return embedder(model_dir, 32, max_length, threads).embed(sentences)
