#!/usr/bin/env python3
"""Writes the Llama-family tokenizer golden data under io/testdata/ (run by a developer, not CI).

  pip install tokenizers transformers sentencepiece   (versions: scripts/golden/requirements.txt)
  python3 scripts/golden/make_llama_tokenizer_golden.py

No Llama, Mistral or Qwen2 tokenizer can be obtained offline from PyPI, so
small ones are made here with each family's exact pipeline, trained
deterministically on ../shared/data/tinyshakespeare.txt (plus a few lines of
other scripts, so that some non-ASCII characters are in the vocabularies and
others fall back to bytes):

  spm_legacy/   Llama 2 / Mistral: a SentencePiece BPE model with byte
                fallback, converted as transformers' LlamaConverter converts it
                (legacy: Prepend + Replace normalizers, no pre-tokenizer;
                Replace, ByteFallback, Fuse, Strip decoders; <s> $A).
  spm_metaspace/ the same model converted non-legacy (Metaspace pre-tokenizer,
                prepend_scheme "first"), as newer Llama / Mistral files are.
  spm_metaspace_split/ the same with Metaspace splitting words, prepend_scheme
                "always" and the Metaspace decoder (T5 / ALBERT style).
  llama3_bpe/   Llama 3: byte-level BPE behind a Split on Llama 3's regex and
                ByteLevel without its regex, ignore_merges, a Sequence
                post-processor adding <|begin_of_text|>.
  qwen2_bpe/    Qwen2: the same with Qwen2's regex (single digits), an NFC
                normalizer and no BOS.
  spm_added/, qwen2_added/  spm_legacy and qwen2_bpe with tokens a user added,
                normalized and not (ADDED_CASES exercise them).

Each directory holds tokenizer.json only. The cases are
io/testdata/tokenizer_hard_cases.txt (shared with the GPT-2 / BERT goldens)
plus LLAMA_CASES below; io/testdata/tokenizer_llama_golden.json has, per
tokenizer, the ids with and without special tokens, both decodes, and a
digest of every line of tinyshakespeare (as make_tokenizer_golden.py).
"""
import json
import os
import pathlib
import shutil
import sys
import tempfile

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers.tokenization_utils_base import generate_merges

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_tokenizer_golden import cases_golden, fnv1a  # noqa: E402  (the same cases and digest)

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("ASPEN_SHARED_DIR", REPO.parent / "shared"))
CORPUS = SHARED / "data" / "tinyshakespeare.txt"
OUT = REPO / "io" / "testdata"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Lines added to the training text: characters these tokenizers should know.
EXTRA_TRAINING = [
    "café naïve résumé Ångström straße Привет мир Ελληνικά",
    "你好世界 中文测试 日本語のテキスト 한국어",
    "12345 67890 3.14159 1,000,000",
] * 20 + [
    # digits in runs, so that merges of 2 and 3 digits exist and the regexes' digit limits show
    " ".join(str(n) for n in range(0, 3000, 7)),
    "I'M SURE IT'S WHAT THEY'D'VE WANTED; WE'LL SEE, YOU'RE RIGHT\n\n  \r\n",
] * 50

LLAMA_CASES = [
    "'S 'T 'RE 'Ve 'M 'LL 'D 'ſ 'K x's X'S",
    "12 123 1234 12345678901 ١٢٣٤٥ ²³⁴ 1.5e10",
    "a\n\nb \n c\r\n\r\nd  \n\n  e\t\n",
    "   \n",
    "\n",
    "trailing spaces   ",
    " leading space",
    "  two leading spaces",
    "▁literal▁metaspace ▁ and  ",
    "<s>bos inside</s> and <unk> and <s><s>",
    "<|begin_of_text|>hello<|end_of_text|> <|eot_id|>x",
    "unseen: 😀 🤷🏻‍♀️ ☃ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "NFC input: e\u0301 A\u030a \u1e9b\u0323 \u0071\u0307\u0323 \uac00\u11a8 \u1100\u1161\u11a8",
    "punct!?…—‘quoted’ «x» (a) [b] {c}",
    "$100 #tag @user ~/path a_b a-b a.b a/b",
]


def spm_model(tmp):
    text = pathlib.Path(tmp) / "train.txt"
    text.write_text(CORPUS.read_text(encoding="utf-8") + "\n".join(EXTRA_TRAINING) + "\n", encoding="utf-8")
    prefix = str(pathlib.Path(tmp) / "spm")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=prefix, model_type="bpe", vocab_size=1000, byte_fallback=True,
        character_coverage=0.999, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, num_threads=1, minloglevel=2)
    return prefix + ".model"


def spm_tokenizer(model_file, legacy, split=False):
    """What transformers' LlamaConverter makes of a SentencePiece BPE model (its code, step by step:
    transformers 5.24's converter itself fails on a list where it expects a class)."""
    sp = spm.SentencePieceProcessor(model_file=model_file)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = generate_merges(vocab)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True, dropout=None))
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), normalized=False, special=True) for i in range(3)])
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(prepend="\u2581"),
                                               normalizers.Replace(pattern=" ", content="\u2581")])
    elif not split:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    else:  # T5 / ALBERT style: a piece per word, the Metaspace decoder
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    if split:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(replacement="\u2581", prepend_scheme="always")])
    else:
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    # LlamaTokenizerFast's post-processor: <s> $A.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def byte_level_bpe(regex, nfc, bos):
    tok = Tokenizer(models.BPE(ignore_merges=bos is not None))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] if bos else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    # 997 + 3 special tokens: the tiny Llama-family models' vocabulary of 1000 (make_generate_text_golden.py)
    trainer = trainers.BpeTrainer(vocab_size=997, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    lines = CORPUS.read_text(encoding="utf-8").split("\n") + EXTRA_TRAINING
    tok.train_from_iterator(lines, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if bos:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def with_added(tok, tokens):
    tok.add_tokens([t for t in tokens if not t.special])
    tok.add_special_tokens([t for t in tokens if t.special])
    return tok


ADDED_CASES = [
    "hello fooBar there", "fooBarfooBar", "x baz qux y", "the zed is fooBar", " fooBar", "baz quxfooBar",
    "a  <tool>  b", "[x]   y", "<s>fooBar</s>", "cafe\u0301 cafe\u0301s caf\u00e9 Straße", "zedzed fooBar[x]",
]


def digest(tok, lines):
    total, hashes = 0, []
    h = 0xCBF29CE484222325
    for i, line in enumerate(lines):
        ids = tok.encode(line, add_special_tokens=True).ids
        total += len(ids)
        h = fnv1a(h, ids)
        if i % 1000 == 999 or i == len(lines) - 1:
            hashes.append(f"{h:016x}")
            h = 0xCBF29CE484222325
    return {"lines": len(lines), "total_tokens": total, "block_hashes": hashes}


def main():
    tmp = tempfile.mkdtemp()
    model_file = model_file_copy = spm_model(tmp)
    if True:
        toks = {
            "spm_legacy": spm_tokenizer(model_file, legacy=True),
            "spm_metaspace": spm_tokenizer(model_file, legacy=False),
            "spm_metaspace_split": spm_tokenizer(model_file, legacy=False, split=True),
        }
    toks["llama3_bpe"] = byte_level_bpe(LLAMA3_REGEX, nfc=False, bos="<|begin_of_text|>")
    toks["qwen2_bpe"] = byte_level_bpe(QWEN2_REGEX, nfc=True, bos=None)
    # Tokens a user added (tokenizer.add_tokens): normalized ones match the normalized text, as their
    # content normalized (Prepend makes "fooBar" "\u2581fooBar"), the others the raw text first.
    toks["spm_added"] = with_added(spm_tokenizer(model_file_copy, legacy=True), [
        AddedToken("fooBar", normalized=True), AddedToken("baz qux", normalized=True),
        AddedToken("zed", normalized=False), AddedToken("<tool>", normalized=False, special=True, lstrip=True),
        AddedToken("[x]", normalized=True, rstrip=True)])
    toks["qwen2_added"] = with_added(byte_level_bpe(QWEN2_REGEX, nfc=True, bos=None), [
        AddedToken("cafe\u0301", normalized=True), AddedToken("Straße", normalized=False)])

    hard = (OUT / "tokenizer_hard_cases.txt").read_bytes().decode("utf-8").split("\n")
    lines = CORPUS.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    golden = {"cases": LLAMA_CASES, "added_cases": ADDED_CASES}
    for name, tok in toks.items():
        d = OUT / name
        d.mkdir(exist_ok=True)
        tok.save(str(d / "tokenizer.json"))
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))  # what a user's file gives
        golden[name] = {"vocab_size": tok.get_vocab_size(), "hard_cases": cases_golden(tok, hard),
                        "llama_cases": cases_golden(tok, LLAMA_CASES), "added_cases": cases_golden(tok, ADDED_CASES),
                        "tinyshakespeare": digest(tok, lines)}
    shutil.rmtree(tmp)
    (OUT / "tokenizer_llama_golden.json").write_text(json.dumps(golden, ensure_ascii=False, indent=None) + "\n",
                                                     encoding="utf-8")


if __name__ == "__main__":
    main()
