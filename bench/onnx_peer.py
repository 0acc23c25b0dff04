#!/usr/bin/env python3
"""The models and the onnxruntime peer of `aspen bench onnx` (W2.3).

    python3 bench/onnx_peer.py --export DIR [--quick]
        Writes DIR/<case>/model.onnx and input_<k>.pb (ONNX TensorProtos) for every case, unless there:
        gpt2_b1, gpt2_b8: GPT-2-124M-shaped (12 layers, d_model 768, 12 heads, vocab 50257) random weights,
            input_ids [B, 128], exported by torch.export (torch.onnx.export(dynamo=True), static shapes)
        bert_b1, bert_b8: BERT-base-shaped (12 layers, hidden 768, 12 heads, vocab 30522) random weights,
            input_ids and attention_mask [B, 128] (the second row's last quarter padded)
        --quick: 2-layer versions (a smoke test, not a measurement). Needs torch and transformers.
    python3 bench/onnx_peer.py --time DIR --threads N [--reps R] [--case NAME]
        For every case in DIR, onnxruntime at its best settings (all graph optimizations, N intra-op
        threads, sequential execution): one warm-up run, then the best of R timed runs. Prints one JSON
        object per line: {"bench": "onnx_ort", "case": ..., "ms": float, "threads": N}.
Exit status 2 with a message on stderr when a needed package is missing; 1 on other errors.
"""
import argparse
import json
import os
import sys
import time


def export(out, quick):
    try:
        import torch
        from onnx import numpy_helper
        from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"onnx_peer.py: {e} (the export needs torch, transformers and onnx)", file=sys.stderr)
        sys.exit(2)
    layers = 2 if quick else 12
    torch.manual_seed(0)
    for family in ("gpt2", "bert"):
        for batch in (1, 8):
            case = os.path.join(out, f"{family}_b{batch}")
            if os.path.exists(os.path.join(case, "model.onnx")):
                continue
            os.makedirs(case, exist_ok=True)
            if family == "gpt2":
                model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=12, n_embd=768, vocab_size=50257))
                args = (torch.randint(0, 50257, (batch, 128)),)
                names = ["input_ids"]
            else:
                model = BertModel(BertConfig(num_hidden_layers=layers, num_attention_heads=12, hidden_size=768,
                                             intermediate_size=3072, vocab_size=30522))
                mask = torch.ones(batch, 128, dtype=torch.int64)
                if batch > 1:
                    mask[1, 96:] = 0
                args = (torch.randint(0, 30522, (batch, 128)), mask)
                names = ["input_ids", "attention_mask"]
            model.eval()
            model.config.use_cache = False
            tmp = os.path.join(case, "model.onnx.tmp")
            print(f"exporting {family} batch {batch} ...", file=sys.stderr, flush=True)
            torch.onnx.export(model, args, tmp, dynamo=True, input_names=names, external_data=False)
            for k, (n, a) in enumerate(zip(names, args)):
                with open(os.path.join(case, f"input_{k}.pb"), "wb") as f:
                    f.write(numpy_helper.from_array(a.numpy(), n).SerializeToString())
            os.replace(tmp, os.path.join(case, "model.onnx"))


def time_cases(out, threads, reps, only=None):
    try:
        import onnx
        import onnxruntime as ort
        from onnx import numpy_helper
    except ImportError as e:
        print(f"onnx_peer.py: {e} (the peer needs onnxruntime and onnx)", file=sys.stderr)
        sys.exit(2)
    for case in sorted(os.listdir(out)):
        d = os.path.join(out, case)
        if not os.path.exists(os.path.join(d, "model.onnx")) or (only and case != only):
            continue
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(os.path.join(d, "model.onnx"), opts, providers=["CPUExecutionProvider"])
        feeds = {}
        for k, i in enumerate(sess.get_inputs()):
            t = onnx.load_tensor(os.path.join(d, f"input_{k}.pb"))
            feeds[i.name] = numpy_helper.to_array(t)
        sess.run(None, feeds)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            best = min(best, time.perf_counter() - t0)
        print(json.dumps({"bench": "onnx_ort", "case": case, "ms": best * 1e3, "threads": threads,
                          "ort": ort.__version__}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--export")
    p.add_argument("--time")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--case", help="time this case directory only")
    a = p.parse_args()
    if a.export:
        export(a.export, a.quick)
    if a.time:
        time_cases(a.time, a.threads, a.reps, a.case)


if __name__ == "__main__":
    main()
