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

from . import _aspen

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
    implementation; encode and decode match the `tokenizers` package."""

    def __init__(self, native):
        self._t = native

    @staticmethod
    def from_file(path):
        """tokenizer.json, or a model directory (tokenizer.json, vocab.json + merges.txt, vocab.txt)."""
        return Tokenizer(_aspen.Tokenizer.from_file(os.fspath(path)))

    def encode(self, text, add_special_tokens=True):
        if not isinstance(text, str):
            raise ValueError(f"encode: expected a str, found {type(text).__name__}")
        ids = self._t.encode(text, add_special_tokens)
        return Encoding(ids, [self._t.id_to_token(i) for i in ids])

    def encode_batch(self, texts, add_special_tokens=True):
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids, skip_special_tokens=True):
        return self._t.decode([int(i) for i in ids], skip_special_tokens)

    def decode_batch(self, sequences, skip_special_tokens=True):
        return [self.decode(s, skip_special_tokens) for s in sequences]

    def token_to_id(self, token):
        return self._t.token_to_id(token)

    def id_to_token(self, id):
        return self._t.id_to_token(int(id))

    def get_vocab_size(self, with_added_tokens=True):
        return self._t.vocab_size


Generator = _aspen.Generator
Embedder = _aspen.Embedder
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
    return threads or CPUS  # NOTE [python cores]


def generator(model_dir, max_batch=1, max_length=0, max_prompt=0, threads=0, dtype="f32"):
    """The compiled generator of a GPT-2 or GPT-J directory (kept for later calls with the same settings)."""
    threads = _threads(threads)
    key = (os.path.realpath(os.fspath(model_dir)), max_batch, max_length, max_prompt, threads, dtype)
    if key not in _generators:
        _generators[key] = _aspen.Generator(os.fspath(model_dir), max_batch, max_length, max_prompt, threads, dtype)
    return _generators[key]


def embedder(model_dir, max_batch=32, max_length=0, threads=0):
    """The compiled sentence embedder of a BERT directory (kept for later calls with the same settings)."""
    threads = _threads(threads)
    key = (os.path.realpath(os.fspath(model_dir)), max_batch, max_length, threads)
    if key not in _embedders:
        _embedders[key] = _aspen.Embedder(os.fspath(model_dir), max_batch, max_length, threads)
    return _embedders[key]


def _stable(text):
    """The text without a trailing incomplete UTF-8 sequence (which the decoder shows as U+FFFD)."""
    return text.rstrip("\ufffd")


def generate(model_dir, prompt, max_new_tokens=32, temperature=1.0, top_k=0, top_p=1.0, seed=0, stream=True,
             repetition_penalty=1.0, stop_at_eos=True, skip_special_tokens=True, max_length=0, threads=0,
             dtype="f32"):
    """Text generated from `prompt` by a GPT-2 or GPT-J directory: with stream=True an iterator of text
    pieces as tokens are drawn (their concatenation is the decoded continuation), else the text. Sampling is
    Hugging Face's (temperature 0: greedy; top_k 0 and top_p 1: off); the same seed gives the same text."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt: expected a str, found {type(prompt).__name__}")
    g = generator(model_dir, 1, max_length, 0, threads, dtype)
    ids = g.tokenizer.encode(prompt, True)
    if not ids:
        raise ValueError("prompt: expected text with at least one token, found an empty prompt")
    args = ([ids], max_new_tokens, float(temperature), top_k, float(top_p), float(repetition_penalty), seed,
            stop_at_eos)
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
    if isinstance(sentences, str):
        raise ValueError("sentences: expected a list of str, found a str (wrap it in a list)")
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise ValueError(f"sentences[{i}]: expected a str, found {type(s).__name__}")
    return embedder(model_dir, 32, max_length, threads).embed(sentences)
