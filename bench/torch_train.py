#!/usr/bin/env python3
"""PyTorch peer for `aspen bench train` (W1.4): GPT-2 124M training steps on the CPU (or Llama, BERT).

How aspen's bench calls it (only with `aspen bench train --python PATH`), once per dtype, right after aspen's
own row of that dtype:

    PATH bench/torch_train.py --json --dtypes f32 --threads 2 --steps 5 [shape flags]

reading one JSON object per line from stdout (progress goes to stderr):

    {"bench": "train_torch", "dtype": "f32"|"bf16", "mode": "f32-eager"|"bf16-autocast",
     "tokens_per_s": float (median step), "tokens_per_s_best": float, "step_s": float,
     "peak_rss_bytes": int (VmHWM of the worker process), "loss": float, "threads": 2, "batch": 4, "seq": 256}

Exit status 2 with a message on stderr when torch (or transformers) is not installed; 1 on other errors.

The configuration (torch at its best on a small CPU): torch.set_num_threads(--threads, default 2),
OpenMP's wait policy left at its default, as aspen's is. The model is transformers'
GPT2LMHeadModel(GPT2Config(...)) with its random init (torch.manual_seed(0)), every dropout 0, sdpa attention,
train mode; torch.optim.AdamW(lr 1e-4, weight_decay 0.1 except biases and LayerNorms, as aspen's step; foreach
at its default). The loss is cross-entropy of logits [B*T, V] against random targets [B*T], no shift (what
aspen's graph computes). One step: forward, loss, backward, optimizer.step(), zero_grad(set_to_none=True).
--family bert: transformers' BertForMaskedLM(BertConfig(...)) (dropout 0, sdpa: dense attention, the only
training path PyTorch has on a CPU), targets -100 but at a random 15 % of the positions (HF's MLM labels).
  f32   eager f32
  bf16  the f32 model and optimizer under torch.autocast("cpu", dtype=torch.bfloat16) for forward and loss
        (backward runs in the types autocast chose; AdamW on the f32 master weights)
--compile: each dtype also runs with torch.compile (inductor) of the model ("f32-compile",
"bf16-autocast-compile"), two warm-up steps (the first compiles), in its own worker after the eager one; one
JSON line per mode (aspen's bench keeps the faster: PyTorch's best mode).
Each dtype runs in its own worker process (this script re-invoked with --worker), so its peak RSS is its own:
one warm-up step, then --steps timed steps; tokens_per_s = batch * seq / the median step time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def peak_rss_bytes():
    """VmHWM: the high-water RSS of this address space (ru_maxrss may carry a parent's across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(args):
    try:
        import torch
        import torch.nn.functional as F
        import transformers
        from transformers import (AutoModelForCausalLM, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel,
                                  LlamaConfig, LlamaForCausalLM)
    except ImportError as e:
        print(f"torch_train.py: cannot import {e.name or e} ({e}); install torch and transformers "
              "(see scripts/golden/requirements.txt) to get the PyTorch peer figures", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    dtype = args.worker
    if args.model:  # the user's directory, as aspen's row (every dropout 0 there too)
        model_type = json.load(open(os.path.join(args.model, "config.json")))["model_type"]
        dropout = (dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0) if model_type == "gpt2"
                   else dict(attention_dropout=0.0))
        model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa", **dropout).train()
    elif args.family == "bert":  # aspen's masked-LM row: MiniLM's shape, positions grown to the sequence
        cfg = BertConfig(vocab_size=args.vocab, hidden_size=args.d_model, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, intermediate_size=args.d_ff,
                         max_position_embeddings=args.n_positions, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = BertForMaskedLM(cfg).train()
    elif args.family == "llama":  # aspen's Llama-shaped row: RMSNorm, SwiGLU, rotary, grouped-query attention
        cfg = LlamaConfig(vocab_size=args.vocab, max_position_embeddings=args.n_positions, hidden_size=args.d_model,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, intermediate_size=args.d_ff, tie_word_embeddings=False)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).train()
    else:
        cfg = GPT2Config(vocab_size=args.vocab, n_positions=args.n_positions, n_embd=args.d_model,
                         n_layer=args.layers, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg).train()
    skip = ("bias", "ln_", "norm", "LayerNorm")  # biases and LayerNorm / RMSNorm weights, as aspen's step
    decay = [p for n, p in model.named_parameters() if not any(s in n for s in skip)]
    no_decay = [p for n, p in model.named_parameters() if any(s in n for s in skip)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    targets = torch.randint(0, args.vocab, (args.batch * args.seq,), generator=g)
    if args.family == "bert":
        targets[torch.rand(targets.shape, generator=g) >= 0.15] = -100
    autocast = dtype == "bf16"

    # --compile: torch.compile (inductor) of the model's forward; backward through AOTAutograd's compiled graph.
    forward = torch.compile(model) if args.compile else model

    def step():
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = forward(ids).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, float(loss.detach())

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {dtype}, threads "
        f"{torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, batch {args.batch} x seq {args.seq}")
    for _ in range(2 if args.compile else 1):  # warm-up (compiled: the first compiles, the second may recompile)
        dt, loss = step()
        log(f"  warm-up {dt:.3f} s, loss {loss:.3f}")
    times = []
    for i in range(args.steps):
        dt, loss = step()
        times.append(dt)
        log(f"  step {i + 1}: {dt:.3f} s, loss {loss:.3f}")
    tokens = args.batch * args.seq
    med = statistics.median(times)
    mode = ("bf16-autocast" if autocast else "f32") + ("-compile" if args.compile else ("" if autocast else "-eager"))
    print(json.dumps({"bench": "train_torch", "dtype": dtype, "mode": mode,
                      "tokens_per_s": round(tokens / med, 3), "tokens_per_s_best": round(tokens / min(times), 3),
                      "step_s": med, "peak_rss_bytes": peak_rss_bytes(), "loss": loss,
                      "threads": torch.get_num_threads(), "batch": args.batch, "seq": args.seq}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="JSON lines only on stdout (the table goes to stderr)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up step")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--model", default="", help="a Hugging Face GPT-2 directory instead of a random model")
    ap.add_argument("--n-positions", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--family", choices=["gpt2", "llama", "bert"], default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=4, help="llama: key/value heads")
    ap.add_argument("--d-ff", type=int, default=2048, help="llama: SwiGLU width; bert: intermediate_size")
    ap.add_argument("--compile", action="store_true",
                    help="also time torch.compile (inductor) of the model, in its own worker after eager's")
    ap.add_argument("--worker", choices=["f32", "bf16"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    rows = []
    for dtype in args.dtypes.split(","):
        if dtype not in ("f32", "bf16"):
            ap.error(f"unknown dtype {dtype}")
        for compiled in ([False, True] if args.compile else [False]):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", dtype] + (["--compile"] if compiled else [])
            cmd += [f"--{k}={v}" for k, v in (("threads", args.threads), ("steps", args.steps), ("batch", args.batch),
                                               ("seq", args.seq), ("vocab", args.vocab),
                                               ("n-positions", args.n_positions), ("d-model", args.d_model),
                                               ("layers", args.layers), ("heads", args.heads), ("model", args.model),
                                               ("family", args.family), ("kv-heads", args.kv_heads),
                                               ("d-ff", args.d_ff))]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            if p.returncode != 0:
                sys.exit(p.returncode)
            row = next(json.loads(l) for l in p.stdout.splitlines() if l.startswith("{"))
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    out = sys.stderr if args.json else sys.stdout
    print(f"\n{'dtype':5s} {'mode':22s} {'tokens/s':>9s} {'best':>9s} {'peak RSS':>10s}", file=out)
    for r in rows:
        print(f"{r['dtype']:5s} {r['mode']:22s} {r['tokens_per_s']:9.1f} {r['tokens_per_s_best']:9.1f} "
              f"{r['peak_rss_bytes'] / 2**30:8.2f} GiB", file=out)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        print(f"torch_train.py: error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
