#!/usr/bin/env python3
"""Writes, with llama.cpp's own converter (convert_hf_to_gguf.py from the llama-cpp-python source distribution
bench/llama_cpp.py fetches):
- io/testdata/gguf/gpt2-tiny-vocab.gguf for io/gguf_tokenizer_test.cc: models/testdata/gpt2-tiny's tokenizer (and
  config) as the converter writes it (--vocab-only); aspen's tokenizer rebuilt from it must give the ids the
  Hugging Face files give;
- models/testdata/gguf/gpt2-64-q8_0.gguf and gpt2-64.golden.json for models/gguf_test.cc: a tiny random
GPT-2 (n_embd 64, so every matrix is whole Q8_0 blocks; the tokenizer of models/testdata/gpt2-tiny), converted to
GGUF Q8_0, and the logits transformers computes with the original f32 weights for a prompt, with
its greedy continuation. aspen's logits from the Q8_0 file must stay within the quantization's error of these: a
name or a transpose read wrong would be far outside it.

    python3 scripts/golden/make_gguf_gpt2_testdata.py [--sdist llama_cpp_python-X.tar.gz]
"""
import argparse
import json
import math
import shutil
import subprocess
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
tok_dir = ROOT / "models" / "testdata" / "gpt2-tiny"
out_dir = ROOT / "models" / "testdata" / "gguf"
out_dir.mkdir(parents=True, exist_ok=True)

# The stages are named: the converter writes the folder's name as general.name (a temporary one would make each
# run's file differ).
with tempfile.TemporaryDirectory() as tmp:  # the tokenizer alone
    stage = Path(tmp) / "gpt2-tiny"
    stage.mkdir()
    llama_cpp.stage_model(tok_dir, stage)
    vocab = ROOT / "io" / "testdata" / "gguf" / "gpt2-tiny-vocab.gguf"
    subprocess.run(llama_cpp.converter(llama, stage, vocab, "--vocab-only"), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

torch.manual_seed(20261206)
config = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                 bos_token_id=999, eos_token_id=999, activation_function="gelu_new")
model = transformers.GPT2LMHeadModel(config).eval()
with torch.no_grad():  # larger than the init's 0.02, so the logits spread and quantization shows
    for p in model.parameters():
        p.mul_(4.0)
tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir)
prompt = "First Citizen: Before we proceed any further, hear me speak."
ids = tokenizer(prompt)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -1].tolist()
    greedy = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                            pad_token_id=999)[0, len(ids):].tolist()

gguf_file = out_dir / "gpt2-64-q8_0.gguf"
with tempfile.TemporaryDirectory() as tmp:
    hf = Path(tmp) / "hf"
    model.save_pretrained(hf)
    for f in ("tokenizer.json", "vocab.json", "merges.txt"):
        shutil.copy(tok_dir / f, hf / f)
    stage = Path(tmp) / "gpt2-64"
    stage.mkdir()
    llama_cpp.stage_model(hf, stage)
    subprocess.run(llama_cpp.converter(llama, stage, gguf_file, "--outtype", "q8_0"), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

# transformers again with the file's weights as ggml dequantizes them (the gguf package, which aspen's reader
# equals value for value): the logits aspen must give from the file up to f32 rounding. llama.cpp's names mapped
# back, its [out, in] rows transposed to GPT-2's Conv1D [in, out].
sys.path[:0] = [str(llama / "gguf-py")]
import gguf  # noqa: E402
from gguf import quants  # noqa: E402
names = {"token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
         "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias"}
parts = {"attn_norm": "ln_1", "ffn_norm": "ln_2", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj",
         "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
state = model.state_dict()
for t in gguf.GGUFReader(gguf_file).tensors:
    values = torch.tensor(quants.dequantize(t.data, t.tensor_type)).float()
    if t.name in names:
        key = names[t.name]
    else:
        _, layer, part, leaf = t.name.split(".")
        key = f"transformer.h.{layer}.{parts[part]}.{leaf}"
    if key.endswith(".weight") and ".c_" in key:
        values = values.t()
    assert values.shape == state[key].shape, (t.name, values.shape, state[key].shape)
    state[key] = values.reshape(state[key].shape)
model.load_state_dict(state)
with torch.no_grad():
    dequantized = model(torch.tensor([ids])).logits[0, -1].tolist()
    # Perplexity by llama.cpp's method (models/perplexity.h: windows of ctx tokens, each window's second half
    # scored, log-softmax in f64) on a text the test reads back from this file.
    text = (ROOT.parent / "shared" / "data" / "tinyshakespeare.txt").read_text()[:1200]
    text_ids = tokenizer(text)["input_ids"]
    ctx, nll, scored = 32, 0.0, 0
    for w in range(len(text_ids) // ctx):
        window = text_ids[w * ctx:(w + 1) * ctx]
        lp = torch.log_softmax(model(torch.tensor([window])).logits[0].double(), dim=-1)
        for j in range(ctx // 2, ctx - 1):
            nll -= lp[j, window[j + 1]].item()
            scored += 1
    perplexity = {"text": text, "ctx": ctx, "scored": scored, "dequantized": math.exp(nll / scored)}
worst = max(abs(x - y) for x, y in zip(logits, dequantized))
assert worst < 0.1 * max(abs(x) for x in logits), worst  # Q8_0's error, not a mapping's

(out_dir / "gpt2-64.golden.json").write_text(json.dumps(
    {"prompt": prompt, "input_ids": ids, "last_logits": [round(x, 6) for x in logits],
     "dequantized_last_logits": [round(x, 6) for x in dequantized], "greedy": greedy,
     "perplexity": perplexity}) + "\n")
print(gguf_file, gguf_file.stat().st_size, "bytes")
