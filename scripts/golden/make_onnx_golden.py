#!/usr/bin/env python3
"""ONNX models as PyTorch exports them, with onnxruntime's outputs, for models/onnx_import_test.cc.

Each case is a directory models/testdata/onnx/<case>/ holding model.onnx, the inputs input_<k>.pb and
onnxruntime's outputs output_<k>.pb (ONNX TensorProtos, as ONNX's own backend tests lay them out), and
dims.txt: the symbolic dimensions the test binds ("batch 2"). The models are small random ones:
  mlp_{ts,dynamo}:      Linear, GELU, LayerNorm, Dropout (eval), Linear, ReLU
  block_{ts,dynamo}:    a pre-norm transformer block: nn.MultiheadAttention, RMSNorm and SwiGLU written out
  gpt2, bert, llama, gptj: tiny random Hugging Face models (the torch.export exporter; the TorchScript one
                        fails on transformers' masking code, aten::diff)
  gpt2_unoptimized:     gpt2 exported with optimize=False (the graph torch.export makes, unfolded)
For block_dynamo and gpt2_unoptimized also models/testdata/onnx_train/<case>/: 10 AdamW steps of PyTorch's own from
the exported weights (eval mode: no dropout), one batch per step: inputs.pb and targets.pb (the 10 batches
stacked), and losses.txt (the loss of each step, before its update). block: MSE against random targets;
gpt2: cross-entropy against random labels with ignored (-100) positions.
The TorchScript exports (dynamo=False, opset 17) have a symbolic batch; the torch.export ones
(dynamo=True, its default opset) a symbolic batch where the exporter keeps it.

Run by a developer (not CI), with the venv of scripts/golden/requirements.txt plus onnx and onnxruntime:
    python scripts/golden/make_onnx_golden.py
"""
import copy
import os
import shutil
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "models", "testdata", "onnx")
warnings.filterwarnings("ignore")


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.drop, self.fc2 = nn.Linear(12, 24), nn.LayerNorm(24), nn.Dropout(0.1), nn.Linear(24, 5)

    def forward(self, x):
        return torch.relu(self.fc2(self.drop(self.norm(nn.functional.gelu(self.fc1(x))))))


class RmsNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(d) + 0.5), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, d=16, heads=2, hidden=40):
        super().__init__()
        self.n1, self.n2 = RmsNorm(d), RmsNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.gate, self.up, self.down = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False), nn.Linear(hidden, d, bias=False)
        # nn.MultiheadAttention starts its biases at zero, and torch.export's optimizer drops a zero bias
        # (Gemm without C): the exported graph would have no parameter for the one PyTorch trains.
        with torch.no_grad():
            self.attn.in_proj_bias.normal_(0, 0.1)
            self.attn.out_proj.bias.normal_(0, 0.1)

    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = self.n2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def save_case(name, path, inputs, dims):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.move(path, os.path.join(d, "model.onnx"))
    model = onnx.load(os.path.join(d, "model.onnx"))
    onnx.checker.check_model(model)
    names = [i.name for i in model.graph.input]
    feeds = dict(zip(names, inputs))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    for k, (n, x) in enumerate(feeds.items()):
        with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, n).SerializeToString())
    for k, (o, y) in enumerate(zip(sess.get_outputs(), outs)):
        with open(os.path.join(d, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(y, o.name).SerializeToString())
    with open(os.path.join(d, "dims.txt"), "w") as f:
        for k, v in dims.items():
            f.write(f"{k} {v}\n")
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{name}: opset {model.opset_import[0].version}, {len(model.graph.node)} nodes, ops {ops}")


TRAIN = os.path.join(ROOT, "models", "testdata", "onnx_train")
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def train_case(name, module, forward, batches, targets, loss_fn):
    """PyTorch's own 10 AdamW steps (a copy of the exported module), saved for the parity test."""
    d = os.path.join(TRAIN, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    module.eval()
    opt = torch.optim.AdamW(module.parameters(), **ADAMW)
    losses = []
    for x, t in zip(batches, targets):
        opt.zero_grad()
        loss = loss_fn(forward(module, x), t)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with open(os.path.join(d, "inputs.pb"), "wb") as f:
        f.write(numpy_helper.from_array(torch.stack(batches).numpy(), "inputs").SerializeToString())
    with open(os.path.join(d, "targets.pb"), "wb") as f:
        f.write(numpy_helper.from_array(torch.stack(targets).numpy(), "targets").SerializeToString())
    with open(os.path.join(d, "losses.txt"), "w") as f:
        f.write("".join(f"{v!r}\n" for v in losses))
    print(f"{name}: losses {losses[0]:.5f} .. {losses[-1]:.5f}")


def export(module, args, path, dynamo, input_names, dynamic_batch=True, optimize=True):
    module.eval()
    if dynamo:
        kw = {"optimize": optimize}
        if dynamic_batch:
            batch = torch.export.Dim("batch", min=1, max=64)
            kw["dynamic_shapes"] = tuple({0: batch} for _ in args)
        torch.onnx.export(module, args, path, dynamo=True, input_names=input_names, external_data=False, **kw)
    else:
        torch.onnx.export(module, args, path, dynamo=False, opset_version=17, input_names=input_names,
                          dynamic_axes={n: {0: "batch"} for n in input_names})


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    tmp = os.path.join(OUT, "tmp.onnx")
    x = torch.randn(3, 12)
    for dynamo in (False, True):
        tag = "dynamo" if dynamo else "ts"
        mlp = Mlp()
        export(mlp, (x,), tmp, dynamo, ["x"])
        save_case(f"mlp_{tag}", tmp, [x.numpy()], {"batch": 3})
        blk = Block()
        xb = torch.randn(2, 7, 16)
        export(blk, (xb,), tmp, dynamo, ["x"])
        save_case(f"block_{tag}", tmp, [xb.numpy()], {"batch": 2})
        if dynamo:
            train_case("block_dynamo", copy.deepcopy(blk), lambda m, x: m(x), [torch.randn(2, 7, 16) for _ in range(10)],
                       [torch.randn(2, 7, 16) for _ in range(10)], nn.functional.mse_loss)

    from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, GPTJConfig, GPTJForCausalLM,
                              LlamaConfig, LlamaForCausalLM)
    hf = {
        "gpt2": (GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=32)), ["input_ids"]),
        "bert": (BertModel(BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=16, intermediate_size=32,
                                      vocab_size=50, max_position_embeddings=32)), ["input_ids", "attention_mask"]),
        "llama": (LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               hidden_size=16, intermediate_size=32, vocab_size=50,
                                               max_position_embeddings=32)), ["input_ids"]),
        "gptj": (GPTJForCausalLM(GPTJConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=32,
                                            rotary_dim=4)), ["input_ids"]),
    }
    for name, (m, ins) in hf.items():
        m.config.use_cache = False
        args = []
        for i in ins:
            if i == "input_ids":
                args.append(torch.randint(0, 50, (2, 7)))
            else:
                mask = torch.ones(2, 7, dtype=torch.int64)
                mask[1, 5:] = 0  # the second row is padded
                args.append(mask)
        trained = copy.deepcopy(m)
        export(m, tuple(args), tmp, True, ins, dynamic_batch=False)
        save_case(name, tmp, [a.numpy() for a in args], {})
        if name == "gpt2":
            # Unoptimized: torch.export's optimizer folds what it can (zero biases dropped, the position
            # embedding rows and the tied head's transpose made into new initializers), which no longer
            # has PyTorch's parameters; without it every parameter is an initializer of its own name.
            export(m, tuple(args), tmp, True, ins, dynamic_batch=False, optimize=False)
            save_case("gpt2_unoptimized", tmp, [a.numpy() for a in args], {})
            labels = []
            for _ in range(10):
                y = torch.randint(0, 50, (2, 7))
                y[0, 0] = y[1, 3] = -100
                labels.append(y)
            train_case("gpt2_unoptimized", trained, lambda mm, x: mm(x).logits, [torch.randint(0, 50, (2, 7)) for _ in range(10)],
                       labels, lambda logits, y: nn.functional.cross_entropy(logits.reshape(-1, 50), y.reshape(-1)))
    if os.path.exists(tmp):
        os.remove(tmp)
    for f in os.listdir(OUT):
        if f.endswith(".data"):
            os.remove(os.path.join(OUT, f))


if __name__ == "__main__":
    main()
