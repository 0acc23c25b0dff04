#!/usr/bin/env python3
"""Writes the fuzz seed corpus (fuzz/corpus/) and the corrupt-file corpus
(io/testdata/corrupt/ with MANIFEST.txt). The files are committed; rerun this
after changing it and commit what changes. A regression found by a fuzzer is
added by hand instead (docs/fuzzing.md), so it is kept byte for byte.

Usage: python3 fuzz/make_corpus.py   (from the repository root)
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED_ST = os.path.join(ROOT, "fuzz/corpus/safetensors")
SEED_TJ = os.path.join(ROOT, "fuzz/corpus/tokenizer_json")
SEED_OX = os.path.join(ROOT, "fuzz/corpus/onnx")
CORRUPT = os.path.join(ROOT, "io/testdata/corrupt")

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1, "BOOL": 1}


def st_bytes(header, data=b"", pad=True, length=None):
    """A safetensors file: u64 header length, header JSON (str or dict), data."""
    text = header if isinstance(header, (bytes, str)) else json.dumps(header, separators=(",", ":"))
    text = text.encode() if isinstance(text, str) else text
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def st_valid(tensors, metadata=None):
    """tensors: [(name, dtype, shape)]; data is a counting byte pattern."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape in tensors:
        n = SIZES[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    return st_bytes(header, bytes(i % 251 for i in range(off)))


def entry(dt, shape, begin, end):
    return {"dtype": dt, "shape": shape, "data_offsets": [begin, end]}


# A tiny byte-level BPE: the 256 byte symbols, a few merges, one added token.
def byte_chars():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tiny_bpe():
    vocab = {"<|endoftext|>": 0}
    for ch in byte_chars():
        vocab[ch] = len(vocab)
    merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["l", "l"], ["e", "r"], ["i", "n"], ["Ġ", "w"]]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return {
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [a + " " + b for a, b in merges]},
    }


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def tiny_spm(legacy):
    """A SentencePiece-converted BPE (Llama 2 / Mistral): characters, <0xXX> byte tokens, byte fallback."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("\u2581abcdehilnorstw")
    merges = [["\u2581", "t"], ["h", "e"], ["\u2581t", "he"], ["l", "l"], ["e", "r"], ["i", "n"], ["<0xE4>", "<0xBD>"]]
    vocab = {t: i for i, t in enumerate(toks)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(toks[:3])]
    added.append({"id": len(vocab), "content": "fooBar", "single_word": False, "lstrip": False, "rstrip": True,
                  "normalized": True, "special": False})  # matched in the normalized text
    base = {
        "version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                    {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    if legacy:
        base["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    else:
        base["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    return base


def tiny_wordpiece():
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "a", "the", "cat", "sat", "on", "mat",
            "play", "##ing", "##ed", "##s", "un", "##able", "hello", "world", "你", "好", "cafe"]
    vocab = {t: i for i, t in enumerate(toks)}
    special = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for t in toks[:5]]
    return {
        "version": "1.0",
        "padding": None,
        "added_tokens": special,
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }


def tj(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def with_(base, **changes):
    """A deep copy of base with top-level keys replaced (None deletes)."""
    out = json.loads(json.dumps(base))
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def model_with(base, **changes):
    out = json.loads(json.dumps(base))
    for k, v in changes.items():
        if v is None:
            out["model"].pop(k, None)
        else:
            out["model"][k] = v
    return out


def seeds():
    st = {
        "one_f32.safetensors": st_valid([("w", "F32", [2, 3])]),
        "all_dtypes.safetensors": st_valid([(f"t_{d.lower()}", d, [3]) for d in SIZES]),
        "metadata_scalar_empty.safetensors": st_valid([("s", "F32", []), ("e", "I64", [0, 4]), ("b", "BF16", [1, 2, 2])],
                                                      {"format": "pt", "note": "tiny"}),
        "rank8.safetensors": st_valid([("r", "U8", [1, 2, 1, 2, 1, 1, 2, 1])]),
    }
    bpe, wp = tiny_bpe(), tiny_wordpiece()
    tjs = {
        "bpe.json": tj(bpe),
        "bpe_with_text.json": tj(bpe) + b"\0the weather, isn't it?  \xe2\x82\xac 123\0<|endoftext|>hello",
        "wordpiece.json": tj(wp),
        "wordpiece_with_text.json": tj(wp) + b"\0The cat sat on the mat. Playing unable!\0\xe4\xbd\xa0\xe5\xa5\xbd CAF\xc3\x89",
        "wordpiece_bert_processing.json": tj(with_(wp, post_processor={"type": "BertProcessing", "sep": ["[SEP]", 3],
                                                                       "cls": ["[CLS]", 2]})),
        # The Llama family's pipelines (io/tokenizer_pipeline.h).
        "spm_legacy.json": tj(tiny_spm(True)) + "\0the weather \u4f60\u597d\U0001f600\0<s>hello  there".encode(),
        "spm_metaspace.json": tj(tiny_spm(False)) + "\0 two  words\u2581and\0".encode(),
        "llama3_split.json": tj(with_(
            model_with(bpe, ignore_merges=True),
            normalizer={"type": "NFC"},
            pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            post_processor={"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                          {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                                      "tokens": ["<|endoftext|>"]}}}]})) +
            "\0I'M 12345 x\r\n\n  y\0e\u0301\u1100\u1161".encode(),
    }
    return st, tjs


# (file name, bytes, expected substring of the error message)
def corrupt_safetensors():
    ok = entry("F32", [2], 0, 8)
    data8 = bytes(8)
    deep = b"[" * 100000 + b"]" * 100000
    return [
        ("st_empty.safetensors", b"", "expected at least 8 bytes (the header length), found 0 bytes"),
        ("st_seven_bytes.safetensors", b"\x02\0\0\0\0\0\0", "found 7 bytes"),
        ("st_header_length_huge.safetensors", st_bytes({"a": ok}, data8, length=1 << 63),
         "header length: expected at most 104857600 bytes, found 9223372036854775808"),
        ("st_header_length_past_eof.safetensors", st_bytes(b"{}", length=4096),
         "header length: expected at most 8 bytes (file size 16 - 8), found 4096"),
        ("st_header_not_json.safetensors", st_bytes(b"{\"a\": "), "header: expected well-formed UTF-8 JSON"),
        ("st_header_invalid_utf8.safetensors", st_bytes(b'{"\xff\xfe":{}}'), "header: expected well-formed UTF-8 JSON"),
        ("st_header_not_object.safetensors", st_bytes([1, 2]), "header: expected a JSON object, found a JSON array"),
        ("st_entry_not_object.safetensors", st_bytes({"a": 5}), "tensor 'a': expected an object, found a JSON number"),
        ("st_missing_dtype.safetensors", st_bytes({"a": {"shape": [2], "data_offsets": [0, 8]}}, data8),
         "tensor 'a': expected a field 'dtype', found none"),
        ("st_extra_field.safetensors", st_bytes({"a": dict(ok, foo=1)}, data8),
         "expected only the fields dtype, shape, data_offsets, found field 'foo'"),
        ("st_dtype_not_string.safetensors", st_bytes({"a": entry(4, [2], 0, 8)}, data8),
         "tensor 'a': dtype: expected a string, found a JSON number"),
        ("st_unknown_dtype.safetensors", st_bytes({"a": entry("F33", [2], 0, 8)}, data8),
         "expected a safetensors dtype (F32, BF16, F16, I32, I64, U8, BOOL), found 'F33'"),
        ("st_unsupported_dtype.safetensors", st_bytes({"a": entry("F64", [1], 0, 8)}, data8),
         "expected a dtype this build supports"),
        ("st_shape_not_array.safetensors", st_bytes({"a": entry("F32", 2, 0, 8)}, data8),
         "tensor 'a': shape: expected an array, found a JSON number"),
        ("st_shape_negative.safetensors", st_bytes({"a": entry("F32", [-2], 0, 8)}, data8),
         "shape: expected non-negative integer extents, found -2 at dimension 0"),
        ("st_shape_float.safetensors", st_bytes({"a": entry("F32", [2.5], 0, 8)}, data8),
         "shape: expected non-negative integer extents, found 2.5 at dimension 0"),
        ("st_shape_rank9.safetensors", st_bytes({"a": entry("U8", [1] * 9, 0, 1)}, b"\0"),
         "shape: expected rank at most 8, found rank 9"),
        ("st_shape_elements_overflow.safetensors", st_bytes({"a": entry("U8", [1 << 32, 1 << 32], 0, 1)}, b"\0"),
         "an element count that fits in 63 bits"),
        ("st_shape_bytes_overflow.safetensors", st_bytes({"a": entry("I64", [1 << 61, 2], 0, 8)}, data8),
         "expected a byte size that fits in 64 bits"),
        ("st_size_mismatch.safetensors", st_bytes({"a": entry("F32", [2, 3], 0, 20)}, bytes(24)),
         "tensor 'a': expected 24 bytes"),
        ("st_offsets_reversed.safetensors", st_bytes({"a": entry("F32", [0], 8, 0)}, data8),
         "data_offsets: expected begin <= end, found [8, 0]"),
        ("st_offsets_one_number.safetensors", st_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8]}}, data8),
         "data_offsets: expected two non-negative integers [begin, end], found [8]"),
        ("st_offsets_negative.safetensors", st_bytes({"a": entry("F32", [2], -8, 0)}, data8),
         "data_offsets: expected two non-negative integers [begin, end], found [-8,0]"),
        ("st_range_past_eof.safetensors", st_bytes({"a": entry("F32", [4], 0, 16)}, data8),
         "data_offsets: expected an end within the data section (8 bytes), found [0, 16]"),
        ("st_overlapping_ranges.safetensors", st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)},
                                                       bytes(12)),
         "tensor 'b': expected a byte range not overlapping tensor 'a' [0, 8), found [4, 12)"),
        ("st_duplicate_names.safetensors", st_bytes(b'{"a":' + tj(ok) + b',"a":' + tj(ok) + b"}", data8),
         "header: expected unique keys, found key 'a' twice"),
        ("st_metadata_not_object.safetensors", st_bytes({"__metadata__": ["x"]}),
         "__metadata__: expected an object, found a JSON array"),
        ("st_metadata_not_string.safetensors", st_bytes({"__metadata__": {"epoch": 3}}),
         "__metadata__ 'epoch': expected a string value, found a JSON number"),
        # Found by reading the code for the fuzz work: error messages used to
        # dump() the offending value, which recurses once per nesting level.
        ("st_deep_nesting_offsets.safetensors",
         st_bytes(b'{"a":{"dtype":"F32","shape":[0],"data_offsets":' + deep + b"}}"),
         "data_offsets: expected two non-negative integers [begin, end], found a JSON array of 1 element"),
    ]


def corrupt_tokenizer():
    bpe, wp = tiny_bpe(), tiny_wordpiece()
    small = {"a": 0, "b": 1, "ab": 2}
    deep = "[" * 100000 + "]" * 100000
    return [
        ("tj_not_json.json", b'{"model": {', "expected well-formed JSON, found a parse error at byte"),
        ("tj_root_not_object.json", b"[1, 2, 3]", "(root): expected an object, found a JSON array"),
        ("tj_model_missing.json", tj(with_(bpe, model=None)), "model: expected an object, found none"),
        ("tj_model_unknown_type.json", tj(model_with(bpe, type="Unigram")),
         "model.type: expected BPE or WordPiece, found 'Unigram'"),
        ("tj_vocab_missing.json", tj(model_with(wp, vocab=None)), "model.vocab: expected an object of token -> id, found none"),
        ("tj_vocab_not_object.json", tj(model_with(wp, vocab=["[UNK]", "a"])),
         "model.vocab: expected an object of token -> id, found a JSON array"),
        ("tj_vocab_id_negative.json", tj(model_with(bpe, vocab=dict(small, c=-1), merges=[])),
         "model.vocab.c: expected an id in [0, 2^30], found -1"),
        ("tj_vocab_id_sparse.json", tj(model_with(bpe, vocab=dict(small, c=1 << 29), merges=[])),
         "expected token ids below 2 * (number of tokens) + 1024"),
        ("tj_merges_not_array.json", tj(model_with(bpe, vocab=small, merges="a b")),
         "model.merges: expected an array, found a JSON string"),
        ("tj_merge_three_tokens.json", tj(model_with(bpe, vocab=small, merges=["a b c"])),
         "model.merges[0]: expected two tokens separated by one space, found 'a b c'"),
        ("tj_merge_unknown_token.json", tj(model_with(bpe, vocab=small, merges=["a z"])),
         "model.merges[0]: expected a merge of two vocabulary tokens, found token 'z' not in the vocabulary"),
        ("tj_merge_result_missing.json", tj(model_with(bpe, vocab=small, merges=["b a"])),
         "model.merges[0]: expected the merged token in the vocabulary, found token 'ba' not in it"),
        ("tj_merge_deep_nesting.json", tj(model_with(bpe, vocab=small, merges=[])).replace(b'"merges":[]', b'"merges":[' + deep.encode() + b"]"),
         "model.merges[0]: expected \"left right\" or [left, right], found a JSON array of 1 element"),
        ("tj_added_tokens_not_array.json", tj(with_(wp, added_tokens={"id": 0})),
         "added_tokens: expected an array, found a JSON object"),
        ("tj_added_token_no_content.json", tj(with_(wp, added_tokens=[{"id": 0, "special": True}])),
         "added_tokens[0].content: expected a string, found none"),
        ("tj_added_token_id_string.json", tj(with_(wp, added_tokens=[{"id": "0", "content": "[PAD]"}])),
         "added_tokens[0].id: expected an id in [0, 2^30], found \"0\""),
        ("tj_added_token_special_not_bool.json", tj(with_(wp, added_tokens=[{"id": 0, "content": "[PAD]", "special": 1}])),
         "added_tokens[0].special: expected true or false, found a JSON number"),
        ("tj_pre_tokenizer_unknown_regex.json",
         tj(with_(wp, pre_tokenizer={"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "Isolated", "invert": False}]})),
         "pre_tokenizer.pretokenizers[0].pattern.Regex: expected the GPT-2, Llama 3 or Qwen2 split regex, found '\\d+'"),
        ("tj_metaspace_replacement_two_chars.json",
         tj(with_(wp, pre_tokenizer={"type": "Metaspace", "replacement": "__", "prepend_scheme": "always"})),
         "pre_tokenizer.replacement: expected one character, found '__'"),
        ("tj_bpe_unk_not_in_vocab.json", tj(model_with(bpe, vocab=small, merges=[], unk_token="<unk>")),
         "model.unk_token: expected a token of the vocabulary, found '<unk>'"),
        ("tj_decoder_unknown.json", tj(with_(wp, decoder={"type": "Sequence", "decoders": [{"type": "CTC"}]})),
         "decoder.decoders[0].type: expected ByteLevel, WordPiece, Metaspace, Replace, ByteFallback, Fuse, Strip, "
         "Sequence or null, found 'CTC'"),
        ("tj_post_processor_unknown_token.json",
         tj(with_(wp, post_processor={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[BOS]"}},
                                                                             {"Sequence": {"id": "A"}}]})),
         "post_processor.single: expected a token of the vocabulary, found '[BOS]'"),
        ("tj_post_processor_id_out_of_range.json",
         tj(with_(wp, post_processor={"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", -5]})),
         "post_processor: expected ids of vocabulary tokens, found id -5"),
        ("tj_template_id_out_of_range.json",
         tj(with_(wp, post_processor={"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]"}},
                                                                             {"Sequence": {"id": "A"}}],
                                      "special_tokens": {"[CLS]": {"ids": [100000]}}})),
         "post_processor: expected ids of vocabulary tokens, found id 100000"),
    ]


# ---- ONNX: a protobuf encoder for the few messages of onnx.proto the reader converts (field numbers
# from onnx.proto), so this script needs no onnx package.

def varint(n):
    n &= (1 << 64) - 1  # negative int64 as protobuf writes it: ten bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pb_int(field, n):
    return varint(field << 3) + varint(n)


def pb_bytes(field, data):
    data = data.encode() if isinstance(data, str) else data
    return varint((field << 3) | 2) + varint(len(data)) + data


def pb_float(field, x):
    return varint((field << 3) | 5) + struct.pack("<f", x)


def ox_tensor(name, dtype, dims, raw=None, floats=None, ints64=None, external=None):
    out = b"".join(pb_int(1, d) for d in dims) + pb_int(2, dtype) + pb_bytes(8, name)
    if raw is not None:
        out += pb_bytes(9, raw)
    if floats is not None:
        out += pb_bytes(4, struct.pack(f"<{len(floats)}f", *floats))
    if ints64 is not None:
        out += pb_bytes(7, b"".join(varint(v) for v in ints64))
    if external is not None:
        out += b"".join(pb_bytes(13, pb_bytes(1, k) + pb_bytes(2, v)) for k, v in external) + pb_int(14, 1)
    return out


def ox_value(name, elem=1, dims=None):
    """A ValueInfoProto of a tensor; dims: ints or symbol strings (None: no shape)."""
    tensor = pb_int(1, elem)
    if dims is not None:
        shape = b"".join(pb_bytes(1, pb_bytes(2, d) if isinstance(d, str) else pb_int(1, d)) for d in dims)
        tensor += pb_bytes(2, shape)
    return pb_bytes(1, name) + pb_bytes(2, pb_bytes(1, tensor))


def ox_attr_float(name, x):
    return pb_bytes(1, name) + pb_int(20, 1) + pb_float(2, x)


def ox_attr_ints(name, xs):
    return pb_bytes(1, name) + pb_int(20, 7) + b"".join(pb_int(8, x) for x in xs)


def ox_node(op, inputs, outputs, name="", attrs=()):
    out = b"".join(pb_bytes(1, i) for i in inputs) + b"".join(pb_bytes(2, o) for o in outputs)
    if name:
        out += pb_bytes(3, name)
    return out + pb_bytes(4, op) + b"".join(pb_bytes(5, a) for a in attrs)


def ox_model(nodes, initializers=(), inputs=(), outputs=(), opset=17, ir=8, domain=""):
    graph = (b"".join(pb_bytes(1, n) for n in nodes) + pb_bytes(2, "g") + b"".join(pb_bytes(5, t) for t in initializers)
             + b"".join(pb_bytes(11, v) for v in inputs) + b"".join(pb_bytes(12, v) for v in outputs))
    return pb_int(1, ir) + pb_bytes(2, "make_corpus") + pb_bytes(7, graph) + pb_bytes(8, pb_bytes(1, domain) + pb_int(2, opset))


def ox_mlp(**changes):
    """y = LeakyRelu(MatMul(x, w) + b): x [batch, 3], w raw FLOAT [3, 2], b typed FLOAT [2]."""
    args = dict(
        nodes=[ox_node("MatMul", ["x", "w"], ["xw"], "mm"), ox_node("Add", ["xw", "b"], ["h"]),
               ox_node("LeakyRelu", ["h"], ["y"], attrs=[ox_attr_float("alpha", 0.25)])],
        initializers=[ox_tensor("w", 1, [3, 2], raw=struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
                      ox_tensor("b", 1, [2], floats=[0.5, -0.5])],
        inputs=[ox_value("x", 1, ["batch", 3])], outputs=[ox_value("y", 1, ["batch", 2])])
    args.update(changes)
    return ox_model(**args)


def ox_seeds():
    return {
        "mlp.onnx": ox_mlp(),
        "shapes.onnx": ox_model(
            [ox_node("Shape", ["x"], ["s"]), ox_node("Gather", ["s", "zero"], ["n"]),
             ox_node("Reshape", ["x", "flat"], ["y"])],
            initializers=[ox_tensor("zero", 7, [], ints64=[0]), ox_tensor("flat", 7, [1], ints64=[-1])],
            inputs=[ox_value("x", 1, ["b", "t", 4])], outputs=[ox_value("y", 1, ["flat"]), ox_value("n", 7, [])]),
        "external.onnx": ox_mlp(initializers=[ox_tensor("w", 1, [3, 2], external=[("location", "w.bin")]),
                                              ox_tensor("b", 1, [2], floats=[0.5, -0.5])]),
    }


def corrupt_onnx():
    w = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    good = ox_mlp()
    return [
        ("ox_empty.onnx", b"", "expected an ONNX model (a protobuf ModelProto), found an empty file"),
        ("ox_no_graph.onnx", pb_int(1, 8) + pb_bytes(8, pb_bytes(1, "") + pb_int(2, 17)), "model: expected a graph, found none"),
        ("ox_not_protobuf.onnx", b"\xff\xff\xff\xff not a model", "expected an ONNX model (a protobuf ModelProto)"),
        ("ox_truncated.onnx", good[:len(good) - 7], "expected an ONNX model (a protobuf ModelProto)"),
        ("ox_no_opset.onnx", ox_mlp()[:0] + pb_int(1, 8) + pb_bytes(7, pb_bytes(2, "g")),
         "opset_import: expected the default domain (ai.onnx) imported, found no opset for it"),
        ("ox_undefined_input.onnx", ox_mlp(nodes=[ox_node("MatMul", ["x", "nope"], ["y"], "mm")]),
         "node 0 'mm' (MatMul): input 'nope': expected a value defined before the node"),
        ("ox_defined_twice.onnx", ox_mlp(nodes=[ox_node("Relu", ["x"], ["y"]), ox_node("Relu", ["x"], ["y"], "again")]),
         "value 'y': expected one definition, found a second one by node 1 'again' (Relu)"),
        ("ox_raw_short.onnx", ox_mlp(initializers=[ox_tensor("w", 1, [3, 2], raw=w[:20]), ox_tensor("b", 1, [2], floats=[0, 0])]),
         "initializer 'w': expected 24 bytes of FLOAT data, found 20 bytes"),
        ("ox_negative_dim.onnx", ox_mlp(initializers=[ox_tensor("w", 1, [-3, 2], raw=w), ox_tensor("b", 1, [2], floats=[0, 0])]),
         "initializer 'w': expected non-negative dims, found -3 at dimension 0"),
        ("ox_huge_dims.onnx", ox_mlp(initializers=[ox_tensor("w", 1, [1 << 40, 1 << 40], raw=w),
                                                    ox_tensor("b", 1, [2], floats=[0, 0])]),
         "initializer 'w': expected at most 68719476736 bytes, found dims past that at dimension 0"),
        ("ox_external_escape.onnx", ox_mlp(initializers=[ox_tensor("w", 1, [3, 2], external=[("location", "../../etc/passwd")]),
                                                          ox_tensor("b", 1, [2], floats=[0, 0])]),
         "external data location: expected a file inside the model's directory, found '../../etc/passwd'"),
        ("ox_external_missing.onnx", ox_mlp(initializers=[ox_tensor("w", 1, [3, 2], external=[("location", "absent.bin")]),
                                                           ox_tensor("b", 1, [2], floats=[0, 0])]),
         "absent.bin'"),
        ("ox_bad_output.onnx", ox_mlp(outputs=[ox_value("z")]), "graph output 'z': expected a value the graph defines"),
    ]


def write(directory, name, data):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def main():
    st, tjs = seeds()
    for name, data in st.items():
        write(SEED_ST, name, data)
    for name, data in tjs.items():
        write(SEED_TJ, name, data)
    oxs = ox_seeds()
    for name, data in oxs.items():
        write(SEED_OX, name, data)
    lines = ["# io/testdata/corrupt: file<TAB>substring its error message must contain.",
             "# Written by fuzz/make_corpus.py; fuzzer regressions go in MANIFEST.regressions.txt (docs/fuzzing.md).",
             "# st_* files are read with SafetensorsFile::open, tj_* with load_tokenizer_json, ox_* with read_onnx_model."]
    for name, data, expected in corrupt_safetensors() + corrupt_tokenizer() + corrupt_onnx():
        assert "\t" not in expected and "\n" not in expected
        write(CORRUPT, name, data)
        lines.append(f"{name}\t{expected}")
    write(CORRUPT, "MANIFEST.txt", ("\n".join(lines) + "\n").encode())
    print(f"wrote {len(st)} + {len(tjs)} + {len(oxs)} seeds, {len(lines) - 3} corrupt files")


if __name__ == "__main__":
    main()
