#!/usr/bin/env python3
"""Models as users hold them, against PyTorch on this machine (W3.2's speed table).

    python3 bench/models.py [--quick] [--json] [--threads 2] [--rounds 5] [--compile] [--batch-norm]
                            [--rows lstm,vit]
    aspen bench models [the same options]

Each row is a model passed to aspen as it is (aspen.inferenceModel / aspen.trainingModel of the torch
module) and the same model in PyTorch eager (and, with --compile, torch.compile), on the same inputs:
two calls of each in turn per round, the second timed (interleaved, so a noisy minute slows both; the first
call lets the other candidate's spinning OpenMP workers go idle, as in a user's loop), the median of the
rounds.
Printed: milliseconds per call of each and ratio_vs_eager = eager / aspen (above 1: aspen faster), per row,
inference and one training step (SGD; batch norms frozen, as when fine-tuning; --batch-norm adds resnet18 at
64x64 training its batch norms, the running statistics updated as torch's train mode does).
The first call's export + compile time is printed beside it (torch.compile's first call with --compile).

Rows: torchvision resnet18 at 64x64 (batch 8) and 224x224 (batch 1), the MNIST tutorial's CNN (batch 16),
an LSTM classifier (2 layers, bidirectional, 32 steps, batch 8) and a small ViT (batch 8).
--quick: one round of small rows, to check that the bench runs.
"""

import argparse
import json
import statistics
import time
import warnings

import torch

import aspen


def mnist_cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(64 * 5 * 5, 10))


class LstmClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.fc(h[:, -1])


def vit():
    import transformers
    cfg = transformers.ViTConfig(image_size=64, patch_size=8, hidden_size=192, num_hidden_layers=4,
                                 num_attention_heads=3, intermediate_size=768, num_labels=10,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.ViTForImageClassification(cfg)

        def forward(self, x):
            return self.m(pixel_values=x).logits

    return Logits()


def frozen_norms(m):
    for mod in m.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.eval()
    return m


def rows(quick, batch_norm):
    """(name, make, input shape, batch norms training)"""
    import torchvision
    out = [("mnist_cnn", mnist_cnn, (16, 1, 28, 28), False)]
    if not quick:
        out += [("resnet18_64", lambda: torchvision.models.resnet18(num_classes=10), (8, 3, 64, 64), False),
                ("resnet18_224", lambda: torchvision.models.resnet18(num_classes=10), (1, 3, 224, 224), False),
                ("lstm", LstmClassifier, (8, 32, 32), False),
                ("vit", vit, (8, 3, 64, 64), False)]
        if batch_norm:
            out.append(("resnet18_64_bn", lambda: torchvision.models.resnet18(num_classes=10), (8, 3, 64, 64), True))
    return out


class WithLoss(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.net(x), y)


def timed(f):
    s = time.perf_counter()
    f()
    return time.perf_counter() - s


def steady(f):
    """One timed call after an untimed one of the same candidate: libgomp's idle workers spin for
    milliseconds after a parallel region (aspen's and torch's each have their own), so a call right after
    the other candidate's would share its cores with them; after its own, it runs as in a user's loop."""
    f()
    return timed(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also torch.compile (slow first call)")
    ap.add_argument("--batch-norm", action="store_true", help="also resnet18 training its batch norms")
    ap.add_argument("--rows", default="", help="comma-separated row names to run (default: all)")
    a = ap.parse_args()
    wanted = set(filter(None, a.rows.split(",")))
    warnings.simplefilter("ignore")
    torch.set_num_threads(a.threads)
    rounds = 1 if a.quick else a.rounds
    opts = aspen.Options().setThreads(a.threads)
    table = rows(a.quick, a.batch_norm)
    unknown = wanted - {r[0] for r in table}
    if unknown:
        raise SystemExit(f"--rows: unknown row(s) {sorted(unknown)}; expected some of {[r[0] for r in table]}")
    for name, make, shape, train_norms in table:
        if wanted and name not in wanted:
            continue
        torch.manual_seed(0)
        x = torch.randn(*shape)
        y = torch.randint(0, 10, (shape[0],))
        norms = (lambda m: m) if train_norms else frozen_norms
        if train_norms:  # the inference row is resnet18_64's
            training_row(a, name, make, norms, x, y, opts, rounds)
            continue
        # inference
        ref = frozen_norms(make()).eval()
        inf = aspen.inferenceModel(make().eval(), opts)
        first = timed(lambda: inf(x))
        peers = {"eager": ref}
        first_compile = None
        if a.compile:
            comp = torch.compile(ref)
            with torch.no_grad():
                first_compile = timed(lambda: comp(x))
            peers["compiled"] = comp
        times = {k: [] for k in ["aspen", *peers]}
        with torch.no_grad():
            for _ in range(rounds):
                times["aspen"].append(steady(lambda: inf(x)))
                for k, m in peers.items():
                    times[k].append(steady(lambda: m(x)))
        report(a, name, "inference", times, first, first_compile)
        training_row(a, name, make, norms, x, y, opts, rounds)


def training_row(a, name, make, norms, x, y, opts, rounds):
    """One SGD step of aspen and of torch (eager, compiled), interleaved."""
    ref_t = norms(WithLoss(make()))
    opt = torch.optim.SGD(ref_t.parameters(), lr=0.01)

    def eager_step():
        opt.zero_grad()
        ref_t(x, y).backward()
        opt.step()

    model = norms(WithLoss(make()))
    tr = aspen.trainingModel(model, opts, optimizer=aspen.optim.SGD(model.parameters(), lr=0.01))
    first = timed(lambda: tr(x, y))
    steps = {"eager": eager_step}
    first_compile = None
    if a.compile:
        comp_t = torch.compile(ref_t)

        def compiled_step():
            opt.zero_grad()
            comp_t(x, y).backward()
            opt.step()
        first_compile = timed(compiled_step)
        steps["compiled"] = compiled_step
    eager_step()
    # torch's counter sees products and convolutions, not a recurrent layer's steps: no rate for those.
    recurrent = any(isinstance(m, torch.nn.RNNBase) for m in ref_t.modules())
    flops = None if recurrent else step_flops(eager_step)
    times = {k: [] for k in ["aspen", *steps]}
    for _ in range(rounds):
        times["aspen"].append(steady(lambda: tr(x, y)))
        for k, f in steps.items():
            times[k].append(steady(f))
    report(a, name, "training", times, first, first_compile, flops)


def step_flops(step):
    """The FLOPs of one call as torch counts them (products and convolutions, forward and backward): beside
    the times, the GFLOP/s each candidate reaches, to hold against the machine's peak (aspen bench gemm)."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops()


def report(a, name, what, times, first, first_compile, flops=None):
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"bench": "models", "case": name, "what": what, "aspen_ms": med["aspen"] * 1e3,
           "eager_ms": med["eager"] * 1e3, "ratio_vs_eager": med["eager"] / med["aspen"],
           "first_call_s": first}
    if flops:
        row.update(gflop_per_call=flops / 1e9, aspen_gflops=flops / 1e9 / med["aspen"],
                   eager_gflops=flops / 1e9 / med["eager"])
    if "compiled" in med:
        row.update(compiled_ms=med["compiled"] * 1e3, ratio_vs_compiled=med["compiled"] / med["aspen"],
                   compile_first_call_s=first_compile)
    if a.json:
        print(json.dumps(row, sort_keys=True), flush=True)
    else:
        extra = (f", torch.compile {row['compiled_ms']:.1f} ms (x{row['ratio_vs_compiled']:.2f}, first call "
                 f"{first_compile:.1f} s)" if "compiled" in med else "")
        rate = (f"; {row['gflop_per_call']:.2f} GFLOP a step: aspen {row['aspen_gflops']:.0f} GFLOP/s, eager "
                f"{row['eager_gflops']:.0f}" if flops else "")
        print(f"{name:14s} {what:9s} aspen {row['aspen_ms']:8.1f} ms, eager {row['eager_ms']:8.1f} ms "
              f"(ratio_vs_eager {row['ratio_vs_eager']:.2f}){extra}; aspen's first call {first:.2f} s{rate}",
              flush=True)


if __name__ == "__main__":
    main()
