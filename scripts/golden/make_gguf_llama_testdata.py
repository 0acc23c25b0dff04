#!/usr/bin/env python3
"""Writes io/testdata/gguf/llama-tiny-vocab.gguf, qwen2-tiny-vocab.gguf and spm-tiny-vocab.gguf (the
tokenizers alone; the last a SentencePiece one, with llama.cpp's ids for some texts in spm-tiny.llama-cpp.json)
for io/gguf_tokenizer_test.cc, and models/testdata/gguf/llama-64-q8_0.gguf and llama-64.golden.json for
models/gguf_test.cc, with
llama.cpp's own converter (convert_hf_to_gguf.py from the llama-cpp-python source distribution bench/llama_cpp.py
fetches): a tiny random Llama (hidden 64, 4 heads of 16 over 2 key/value heads, so the converter's Q/K row
permutation is exercised on grouped heads; every matrix whole Q8_0 blocks; untied head; the tokenizer of
models/testdata/llama-tiny, Llama 3's split, which the converter is told: "llama-bpe"; Llama 3's rope scaling,
which the converter writes as per-frequency factors), converted to GGUF Q8_0,
the logits transformers computes with the original f32 weights for a prompt, and with the file's weights as ggml
dequantizes them (the gguf package; llama.cpp's names mapped back and its Q/K rows put back in Hugging Face's
order). aspen reading the file must give the second up to f32 rounding (dequantized) and stay within Q8_0's
error of the first (in blocks).

    python3 scripts/golden/make_gguf_llama_testdata.py [--sdist llama_cpp_python-X.tar.gz]

Needs torch, transformers and sentencepiece (PyPI; the converter imports it before it looks for a
tokenizer.model). Regenerating writes the same bytes (fixed seeds and names).
"""
import argparse
import json
import subprocess
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llama_cpp  # noqa: E402  (bench/llama_cpp.py: cache_dir, source_tree, stage_model, converter, VERSION)

ap = argparse.ArgumentParser()
ap.add_argument("--sdist", help="a llama_cpp_python-*.tar.gz to use instead of downloading one")
a = ap.parse_args()
llama = llama_cpp.source_tree(llama_cpp.cache_dir(None), llama_cpp.VERSION, a.sdist)
tok_dir = ROOT / "models" / "testdata" / "llama-tiny"
out_dir = ROOT / "models" / "testdata" / "gguf"
out_dir.mkdir(parents=True, exist_ok=True)

# The tokenizers alone (--vocab-only) for io/gguf_tokenizer_test.cc: Llama 3's split ("llama-bpe") and Qwen2's
# ("qwen2"), each rebuilt by aspen from the file must give the ids of the Hugging Face directory it came from.
for name, pre in (("llama-tiny", "llama-bpe"), ("qwen2-tiny", "qwen2")):
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / name
        stage.mkdir()
        config = llama_cpp.stage_model(ROOT / "models" / "testdata" / name, stage)
        if name == "llama-tiny":  # its config's bos/eos (999) are not its tokenizer's template's (997, 998)
            config.update(bos_token_id=997, eos_token_id=998)
            (stage / "config.json").write_text(json.dumps(config))
        vocab = ROOT / "io" / "testdata" / "gguf" / f"{name}-vocab.gguf"
        subprocess.run(llama_cpp.converter(llama, stage, vocab, "--vocab-only", pre=pre), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

# A SentencePiece tokenizer (Llama 2's kind: model "llama", pieces and scores, no merges) for
# io/gguf_tokenizer_test.cc: the converter reads the tokenizer.model of
# make_llama_tokenizer_golden.py (the same training, the same bytes), and aspen rebuilding it must give the ids of
# that script's Hugging Face conversion (io/testdata/spm_legacy) and of llama.cpp itself (llama-tokenize on the
# file, recorded in spm-tiny.llama-cpp.json with the texts).
sys.path.insert(0, str(ROOT / "scripts" / "golden"))
import make_llama_tokenizer_golden as llama_tok  # noqa: E402  (spm_model, LLAMA_CASES)

bin_dir = llama_cpp.build(llama_cpp.cache_dir(None), llama_cpp.VERSION, llama)
spm_gguf = ROOT / "io" / "testdata" / "gguf" / "spm-tiny-vocab.gguf"
with tempfile.TemporaryDirectory() as tmp:
    stage = Path(tmp) / "spm-tiny"
    stage.mkdir()
    shutil.copy(llama_tok.spm_model(tmp), stage / "tokenizer.model")
    (stage / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}))
    (stage / "tokenizer_config.json").write_text(json.dumps({  # Llama 2's: <s> first, no </s>
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": True,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    subprocess.run(llama_cpp.converter(llama, stage, spm_gguf, "--vocab-only"), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shakespeare = llama_tok.CORPUS.read_text(encoding="utf-8")
    texts = ["", "Hello world", " leading space", "<s>The end</s>", "numbers 12345 and   spaces\n\nnew lines\t tabs",
             "naïve café — ünïcödé 🙂", "It's, don't; we'll: they're!", "  ", "\n", "▁already▁escaped ▁"]
    texts += llama_tok.LLAMA_CASES + [shakespeare[k * 200000:k * 200000 + 1500] for k in range(5)]
    cases = []
    for i, text in enumerate(texts):
        f = Path(tmp) / f"{i}.txt"
        f.write_bytes(text.encode("utf-8"))
        out = subprocess.run([str(bin_dir / "llama-tokenize"), "-m", str(spm_gguf), "-f", str(f), "--ids",
                              "--no-escape", "--log-disable"], check=True, capture_output=True, text=True).stdout
        cases.append({"text": text, "ids": json.loads(out.strip().splitlines()[-1])})
    (ROOT / "io" / "testdata" / "gguf" / "spm-tiny.llama-cpp.json").write_text(
        json.dumps({"file": spm_gguf.name, "tool": "llama-tokenize --ids --no-escape (BOS added, special tokens "
                    "parsed)", "cases": cases}, ensure_ascii=False, indent=0) + "\n")

torch.manual_seed(20261207)
config = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                  # Llama 3's scaling, which the converter writes as a rope_freqs tensor: 4 of the 8
                                  # frequencies between the ends, and angles the scaling changes within the prompt
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 8.0,
                                                   "original_max_position_embeddings": 256},
                                  bos_token_id=997, eos_token_id=998, pad_token_id=999)  # the tokenizer's
model = transformers.LlamaForCausalLM(config).eval()
with torch.no_grad():  # larger than the init's 0.02, so the logits spread and quantization shows
    for p in model.parameters():
        if p.dim() == 2:
            p.mul_(4.0)
tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir)
prompt = "First Citizen: Before we proceed any further, hear me speak."
ids = tokenizer(prompt)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -1].tolist()

gguf_file = out_dir / "llama-64-q8_0.gguf"
with tempfile.TemporaryDirectory() as tmp:
    hf = Path(tmp) / "hf"
    model.save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tok_dir / f).exists():
            shutil.copy(tok_dir / f, hf / f)
    stage = Path(tmp) / "llama-64"  # the converter writes the folder's name as general.name
    stage.mkdir()
    llama_cpp.stage_model(hf, stage)
    subprocess.run(llama_cpp.converter(llama, stage, gguf_file, "--outtype", "q8_0", pre="llama-bpe"), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

sys.path[:0] = [str(llama / "gguf-py")]
import gguf  # noqa: E402
from gguf import quants  # noqa: E402
names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
         "output.weight": "lm_head.weight"}
parts = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
         "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def unpermute(w, heads):  # the converter's permute undone: rows (head, half, i) from (head, i, half)
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


state = model.state_dict()
tensors = gguf.GGUFReader(gguf_file).tensors
assert any(t.name == "rope_freqs.weight" for t in tensors)  # the scaling, as factors
for t in tensors:
    if t.name == "rope_freqs.weight":
        continue
    values = torch.tensor(quants.dequantize(t.data, t.tensor_type)).float()
    if t.name in names:
        key = names[t.name]
    else:
        _, layer, part, leaf = t.name.split(".")
        key = f"model.layers.{layer}.{parts[part]}.{leaf}"
    values = values.reshape(state[key].shape)
    if t.name.endswith("attn_q.weight"):
        values = unpermute(values, config.num_attention_heads)
    elif t.name.endswith("attn_k.weight"):
        values = unpermute(values, config.num_key_value_heads)
    state[key] = values
model.load_state_dict(state)
with torch.no_grad():
    dequantized = model(torch.tensor([ids])).logits[0, -1].tolist()
worst = max(abs(x - y) for x, y in zip(logits, dequantized))
assert worst < 0.1 * max(abs(x) for x in logits), worst  # Q8_0's error, not a mapping's

(out_dir / "llama-64.golden.json").write_text(json.dumps(
    {"prompt": prompt, "input_ids": ids, "last_logits": [round(x, 6) for x in logits],
     "dequantized_last_logits": [round(x, 6) for x in dequantized]}) + "\n")
print(gguf_file, gguf_file.stat().st_size, "bytes")
