#!/usr/bin/env python3
"""PyTorch peer for `aspen bench attention` (W2.5): scaled dot-product attention on the CPU.

How aspen's bench calls it (unless `--python none`), once per run, after aspen's own rows:

    PATH bench/torch_attention.py --json --t 1024,4096 --masks causal,local,blockdiag --passes fwd,fwd_bwd
        --dtypes f32,bf16 --heads 4 --d 64 --window 256 --documents 8 --threads 2 --repeats 3

and reads one JSON object per line from stdout (progress goes to stderr):

    {"bench": "attention_torch", "mask": str, "T": int, "dtype": "f32"|"bf16", "pass": "fwd"|"fwd_bwd",
     "seconds": float (best of --repeats), "kernel": "sdpa"|"sdpa+mask", "threads": int}

Exit status 2 with a message on stderr when torch is not installed; 1 on other errors.

The problem (aspen's rows measure the same): q, k, v [1, heads, T, d] f32 (or bf16: the same values rounded,
and SDPA then runs its bf16 kernel), standard normal, scale 1/sqrt(d).
  causal     torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True): PyTorch's flash
             attention for the CPU, which skips the blocks above the diagonal
  local      the same with attn_mask = a boolean [T, T] causal band of --window keys
  blockdiag  attn_mask = causal within --documents equal documents (T / documents tokens each)
  bigbird, longformer
             attn_mask = aspen's block layout (--layouts DIR holds {mask}_{T}.npy, u8 [heads, blocks, blocks],
             written by aspen's bench) expanded to a per-head [1, heads, T, T] boolean mask; rows above
             --layout-max-t are not run (the mask alone would be gigabytes)
  decode     one query row per head against T cached keys (q [1, heads, 1, d]; no mask: the row sees
             every key), forward only: a decoding step's attention
A boolean mask is the dense input PyTorch's SDPA takes: its CPU kernel visits every block and masks
per element (it cannot skip blocks the mask removes).
fwd is one forward call; fwd_bwd is a forward and backward of out.sum() with q, k, v requiring gradients.
With --flex, every fwd row except decode also times FlexAttention (torch.compile'd flex_attention with a
block mask made from the same mask: it skips the blocks the mask removes; PyTorch runs it forward only on
CPUs), as {"bench": "attention_flex", ...} rows; the compilation is the warm-up call, not timed.
torch.set_num_threads(--threads). Each (mask, T, pass) runs once to warm up, then --repeats times; the
fastest counts.
"""

import argparse
import json
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def mask_of(torch, kind, T, window, documents, layouts=None):
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    causal = j <= i
    if kind == "local":
        return causal & (j > i - window)
    if kind == "blockdiag":
        size = max(1, T // documents)
        return causal & ((i // size) == (j // size))
    import numpy as np
    layout = torch.from_numpy(np.load(f"{layouts}/{kind}_{T}.npy")).bool()  # [heads, blocks, blocks]
    block = T // layout.shape[-1]
    return layout.repeat_interleave(block, 1).repeat_interleave(block, 2)[None]


def time_flex(torch, kind, T, args, q, k, v):
    """The best of --repeats FlexAttention forwards (after a compiling warm-up) with `kind`'s block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    heads = None
    if kind == "causal":
        def mod(b, h, i, j):
            return i >= j
    elif kind == "local":
        def mod(b, h, i, j):
            return (i >= j) & (i - j < args.window)
    elif kind == "blockdiag":
        size = max(1, T // args.documents)

        def mod(b, h, i, j):
            return (i >= j) & (i // size == j // size)
    else:
        import numpy as np
        layout = torch.from_numpy(np.load(f"{args.layouts}/{kind}_{T}.npy")).bool()
        block = T // layout.shape[-1]
        heads = layout.shape[0]

        def mod(b, h, i, j):
            return layout[h, i // block, j // block]
    mask = create_block_mask(mod, None, heads, T, T, device="cpu")
    # One static compilation per row: after a second shape, torch.compile's automatic dynamic shapes would
    # switch to a generic kernel that measured 10-40x slower here.
    run = torch.compile(flex_attention, dynamic=False)
    with torch.no_grad():
        run(q, k, v, block_mask=mask)
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run(q, k, v, block_mask=mask)
            best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--t", default="1024,4096")
    ap.add_argument("--masks", default="causal,local,blockdiag")
    ap.add_argument("--passes", default="fwd,fwd_bwd")
    ap.add_argument("--dtypes", default="f32")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--documents", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layouts", default="", help="directory of {mask}_{T}.npy block layouts")
    ap.add_argument("--layout-max-t", type=int, default=8192)
    ap.add_argument("--flex", action="store_true", help="also time FlexAttention on the fwd rows")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        log(f"torch_attention.py: torch is not installed ({e})")
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    F = torch.nn.functional
    for T in [int(x) for x in args.t.split(",") if x]:
        q32, k32, v32 = (torch.randn(1, args.heads, T, args.d) for _ in range(3))
        for kind, dtype in [(m, d) for m in args.masks.split(",") if m for d in args.dtypes.split(",") if d]:
            q, k, v = (x.to(torch.bfloat16 if dtype == "bf16" else torch.float32) for x in (q32, k32, v32))
            if kind in ("bigbird", "longformer") and T > args.layout_max_t:
                continue
            if kind == "decode":
                kw = {}
            else:
                kw = {"is_causal": True} if kind == "causal" else {
                    "attn_mask": mask_of(torch, kind, T, args.window, args.documents, args.layouts)}
            qd = q[:, :, -1:] if kind == "decode" else q
            for p in [x for x in args.passes.split(",") if x]:
                if kind == "decode" and p != "fwd":
                    continue
                if p == "fwd":
                    def run():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(qd, k, v, **kw)
                else:
                    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))

                    def run():
                        for x in (qq, kk, vv):
                            x.grad = None
                        F.scaled_dot_product_attention(qq, kk, vv, **kw).sum().backward()
                run()
                best = float("inf")
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    run()
                    best = min(best, time.perf_counter() - t0)
                row = {"bench": "attention_torch", "mask": kind, "T": T, "dtype": dtype, "pass": p,
                       "seconds": best, "kernel": "sdpa" if kind in ("causal", "decode") else "sdpa+mask",
                       "threads": args.threads}
                log(f"torch {kind} T={T} {dtype} {p}: {best * 1e3:.2f} ms")
                print(json.dumps(row), flush=True)
                if args.flex and p == "fwd" and kind != "decode":
                    best = time_flex(torch, kind, T, args, q, k, v)
                    log(f"flex {kind} T={T} {dtype} {p}: {best * 1e3:.2f} ms")
                    print(json.dumps(dict(row, bench="attention_flex", seconds=best, kernel="flex_attention")),
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
