#!/usr/bin/env python3
"""ONNX models as PyTorch exports them, with onnxruntime's outputs, for models/onnx_import_test.cc.

Each case is a directory models/testdata/onnx/<case>/ holding model.onnx, the inputs input_<k>.pb and
onnxruntime's outputs output_<k>.pb (ONNX TensorProtos, as ONNX's own backend tests lay them out), and
dims.txt: the symbolic dimensions the test binds ("batch 2"). The models are small random ones:
  mlp_{ts,dynamo}:      Linear, GELU, LayerNorm, Dropout (eval), Linear, ReLU
  block_{ts,dynamo}:    a pre-norm transformer block: nn.MultiheadAttention, RMSNorm and SwiGLU written out
  gpt2, bert, llama, gptj: tiny random Hugging Face models (the torch.export exporter; the TorchScript one
                        fails on transformers' masking code, aten::diff)
The TorchScript exports (dynamo=False, opset 17) have a symbolic batch; the torch.export ones
(dynamo=True, its default opset) a symbolic batch where the exporter keeps it.

Run by a developer (not CI), with the venv of scripts/golden/requirements.txt plus onnx and onnxruntime:
    python scripts/golden/make_onnx_golden.py
"""
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


def export(module, args, path, dynamo, input_names, dynamic_batch=True):
    module.eval()
    if dynamo:
        kw = {}
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
        export(m, tuple(args), tmp, True, ins, dynamic_batch=False)
        save_case(name, tmp, [a.numpy() for a in args], {})
    if os.path.exists(tmp):
        os.remove(tmp)
    for f in os.listdir(OUT):
        if f.endswith(".data"):
            os.remove(os.path.join(OUT, f))


if __name__ == "__main__":
    main()
