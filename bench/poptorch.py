#!/usr/bin/env python3
"""PopTorch programs end to end, on aspen.poptorch and on PyTorch (W3.3's speed table).

    python3 bench/poptorch.py [--quick] [--json] [--threads 2] [--rounds 3] [--compile] [--case NAME]...
    aspen bench poptorch [the same options]

Each row is a training loop shaped like one of Graphcore's PopTorch tutorials (our own code of the same
model, batch and options; the tutorials themselves are not in this repository): its data loader included,
samples per second through `import aspen.poptorch as poptorch` (poptorch.DataLoader, trainingModel with a
torch optimizer, `output, loss = model(x, y)`) against the same model and loop in PyTorch eager (a
torch.utils.data.DataLoader of the micro-batch, one optimizer step per micro-batch) and, with --compile,
torch.compile. The rounds interleave aspen, eager and compiled over the same samples; printed: the median
samples/s of each and ratio_vs_eager, ratio_vs_compiled (above 1: aspen faster).

Rows:
- mnist: simple_applications/pytorch/mnist's network (two conv blocks, a dropout, softmax then cross-entropy),
  batch 8, deviceIterations 50, SGD;
- basics: tutorials/pytorch/basics' classifier (convolutions, max-pooling, group norm, log-softmax and NLL
  loss), batch 16, deviceIterations 1, SGD with momentum (one call per micro-batch: Python's cost shows);
- pipelining: tutorials/pytorch/pipelining's network in four blocks, batch 40, deviceIterations 10,
  gradientAccumulation 10, AdamW, run as two pipeline stages (PipelinedExecution: blocks 1-2 and 3-4, a
  device each) and as one device (one stage of all four blocks): ratio_2_devices_vs_1 is the pipeline's
  gain on this machine's cores. The eager loop accumulates the same 10 micro-batches per step.
--quick: one round of few samples, to check that the bench runs.
"""

import argparse
import json
import statistics
import time
import warnings

import torch

import aspen.poptorch as poptorch


class MnistNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(1600, 128), torch.nn.ReLU(),
                                        torch.nn.Dropout(0.5), torch.nn.Linear(128, 10), torch.nn.Softmax(1))
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        out = self.head(self.features(x))
        return out if labels is None else (out, self.loss(out, labels))


class BasicsNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(1, 5, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2), torch.nn.Conv2d(5, 12, 5),
            torch.nn.ReLU(), torch.nn.GroupNorm(3, 12), torch.nn.Flatten(), torch.nn.Linear(972, 100),
            torch.nn.ReLU(), torch.nn.Linear(100, 10), torch.nn.LogSoftmax(dim=1))
        self.loss = torch.nn.NLLLoss()

    def forward(self, x, labels=None):
        out = self.body(x)
        if self.training:
            return out, self.loss(out, labels)
        return out


class PipelinedNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = torch.nn.Sequential(torch.nn.Conv2d(1, 10, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU())
        self.layer2 = torch.nn.Sequential(torch.nn.Conv2d(10, 20, 5), torch.nn.MaxPool2d(2), torch.nn.ReLU())
        self.layer3 = torch.nn.Linear(320, 256)
        self.layer4 = torch.nn.Linear(256, 10)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        with poptorch.Block("B1"):
            x = self.layer1(x)
        with poptorch.Block("B2"):
            x = self.layer2(x)
        with poptorch.Block("B3"):
            x = torch.relu(self.layer3(x.view(-1, 320)))
        with poptorch.Block("B4"):
            x = self.layer4(x)
            return x if labels is None else (x, self.loss(x, labels))


def _stages(*groups):
    return poptorch.PipelinedExecution(*(poptorch.Stage(*g) for g in groups))


class Row:
    def __init__(self, make, batch, iters, optim, acc=1, strategies=None):
        self.make, self.batch, self.iters, self.optim, self.acc = make, batch, iters, optim, acc
        self.strategies = strategies or {"aspen": None}  # candidate name -> execution strategy


ROWS = {
    "mnist": Row(MnistNet, 8, 50, lambda p: torch.optim.SGD(p, lr=0.05)),
    "basics": Row(BasicsNet, 16, 1, lambda p: torch.optim.SGD(p, lr=0.001, momentum=0.9)),
    "pipelining": Row(PipelinedNet, 40, 10, lambda p: torch.optim.AdamW(p, lr=0.001), acc=10, strategies={
        "aspen": lambda: _stages(("B1",), ("B2", "B3", "B4")),
        "aspen_4_stages": lambda: _stages(("B1",), ("B2",), ("B3",), ("B4",)),
        "aspen_1_device": lambda: _stages(("B1", "B2", "B3", "B4"))}),
}


def dataset(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, 1, 28, 28, generator=g),
                                          torch.randint(0, 10, (n,), generator=g))


def aspen_epoch(row, strategy, data):
    torch.manual_seed(0)
    model = row.make()
    opts = poptorch.Options().deviceIterations(row.iters)
    opts.Training.gradientAccumulation(row.acc)
    if strategy is not None:
        opts.setExecutionStrategy(strategy())
    loader = poptorch.DataLoader(opts, data, batch_size=row.batch, shuffle=True)
    training = poptorch.trainingModel(model, opts, row.optim(model.parameters()))
    x, y = next(iter(loader))
    training.compile(x, y)  # compile outside the timing (the tutorials' first call; printed apart)

    def run():
        n = 0
        for x, y in loader:
            _, loss = training(x, y)
            n += x.shape[0]
        float(loss)
        return n
    return run


def torch_epoch(row, data, compiled):
    torch.manual_seed(0)
    model = row.make()
    step_model = torch.compile(model) if compiled else model
    opt = row.optim(model.parameters())
    loader = torch.utils.data.DataLoader(data, batch_size=row.batch, shuffle=True, drop_last=True)

    def micro(x, y, k):
        if k == 0:
            opt.zero_grad()
        _, loss = step_model(x, y)
        (loss / row.acc if row.acc > 1 else loss).backward()
        if k + 1 == row.acc:
            opt.step()
        return loss

    x, y = next(iter(loader))
    for k in range(row.acc):
        micro(x, y, k)  # torch.compile's compile outside the timing, as aspen's

    def run():
        n = 0
        for i, (x, y) in enumerate(loader):
            loss = micro(x, y, i % row.acc)
            n += x.shape[0]
        float(loss)
        return n
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also torch.compile")
    ap.add_argument("--case", choices=sorted(ROWS), action="append", help="only these rows (default: all)")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(a.threads)
    rounds = 1 if a.quick else a.rounds
    for name, row in ROWS.items():
        if a.case and name not in a.case:
            continue
        per_call = row.batch * row.iters * row.acc
        samples = per_call * (1 if a.quick else max(1, 4000 // per_call))
        data = dataset(samples)
        candidates, first = {}, {}
        for k, strategy in row.strategies.items():
            t = time.perf_counter()
            candidates[k] = aspen_epoch(row, strategy, data)
            first[k] = time.perf_counter() - t
        candidates["eager"] = torch_epoch(row, data, False)
        if a.compile:
            candidates["compiled"] = torch_epoch(row, data, True)
        rates = {k: [] for k in candidates}
        for _ in range(rounds):
            for k, run in candidates.items():
                s = time.perf_counter()
                n = run()
                rates[k].append(n / (time.perf_counter() - s))
        med = {k: statistics.median(v) for k, v in rates.items()}
        out = {"bench": "poptorch", "case": name, "batch": row.batch, "device_iterations": row.iters,
               "gradient_accumulation": row.acc, "samples": samples, "aspen_samples_per_s": med["aspen"],
               "eager_samples_per_s": med["eager"], "ratio_vs_eager": med["aspen"] / med["eager"],
               "aspen_first_call_s": first["aspen"]}
        if "compiled" in med:
            out.update(compiled_samples_per_s=med["compiled"], ratio_vs_compiled=med["aspen"] / med["compiled"])
        if "aspen_1_device" in med:
            out.update(aspen_1_device_samples_per_s=med["aspen_1_device"],
                       ratio_2_devices_vs_1=med["aspen"] / med["aspen_1_device"],
                       ratio_1_device_vs_eager=med["aspen_1_device"] / med["eager"])
        if "aspen_4_stages" in med:
            out.update(aspen_4_stages_samples_per_s=med["aspen_4_stages"],
                       ratio_4_stages_vs_eager=med["aspen_4_stages"] / med["eager"])
        if a.json:
            print(json.dumps(out, sort_keys=True), flush=True)
        else:
            extra = (f", torch.compile {med['compiled']:8.0f} (x{out['ratio_vs_compiled']:.2f})"
                     if "compiled" in med else "")
            if "aspen_1_device" in med:
                extra += (f"; 2 stages vs 1 device x{out['ratio_2_devices_vs_1']:.2f}; 1 device vs eager "
                          f"x{out['ratio_1_device_vs_eager']:.2f}")
            if "aspen_4_stages" in med:
                extra += f"; the tutorial's 4 stages vs eager x{out['ratio_4_stages_vs_eager']:.2f}"
            print(f"{name:10s} batch {row.batch:3d} x {row.iters:2d} x {row.acc:2d}: aspen {med['aspen']:8.0f} samples/s, "
                  f"eager {med['eager']:8.0f} (ratio_vs_eager {out['ratio_vs_eager']:.2f}){extra}; aspen's compile "
                  f"{first['aspen']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
