#!/usr/bin/env python3
"""onnxruntime's com.microsoft ops in small hand-built models, with onnxruntime's outputs, for
models/onnx_import_test.cc (the layout of make_onnx_golden.py: model.onnx, input_<k>.pb, output_<k>.pb,
dims.txt, in models/testdata/onnx/<case>/).

  ms_fused:            FastGelu (with and without bias), BiasGelu, Gelu, SkipLayerNormalization (every output),
                       SkipSimplifiedLayerNormalization (output, inv_std_var, sum), a symbolic batch
  ms_attention_plain:  Attention, no mask, default scale
  ms_attention_lengths, ms_attention_ends_starts: mask_index [B] and [2B]
  ms_attention_raw2d:  a raw [B, T] mask whose second row masks every key (onnxruntime then attends evenly)
  ms_attention_causal: unidirectional with a raw [B, T] mask
  ms_attention_raw3d_causal: a raw [B, S, T] mask, unidirectional
  ms_attention_sizes:  qkv_hidden_sizes with a narrower v, an explicit scale, an attention_bias input
  ms_bert_optimized:   the tiny BERT of make_onnx_golden.py (case bert) after onnxruntime's transformer
                       optimizer (SkipLayerNormalization and BiasGelu fused; it finds no Attention in
                       torch.export's graph), with bert's inputs

Run by a developer (numpy, onnx and onnxruntime from PyPI; no torch):
    python3 scripts/golden/make_onnx_contrib_golden.py
"""
import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "models", "testdata", "onnx")
RNG = np.random.default_rng(7)
MS = "com.microsoft"


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def write_case(name, model, feeds, dims):
    """model.onnx, onnxruntime's outputs on `feeds` and dims.txt in models/testdata/onnx/<name>/."""
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    onnx.save(model, os.path.join(d, "model.onnx"))
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), providers=["CPUExecutionProvider"])
    results = sess.run(None, feeds)
    for k, v in enumerate(model.graph.input):
        with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[v.name], v.name).SerializeToString())
    for k, (v, r) in enumerate(zip(model.graph.output, results)):
        with open(os.path.join(d, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(r), v.name).SerializeToString())
    with open(os.path.join(d, "dims.txt"), "w") as f:
        f.write(dims)
    return results


def save(name, nodes, inputs, outputs, initializers, feeds, dims=None):
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    results = write_case(name, model, feeds, "".join(f"{k} {v}\n" for k, v in (dims or {}).items()))
    print(name, [np.asarray(r).shape for r in results])


def fused():
    B, S, C = 2, 5, 8
    nodes = [
        helper.make_node("FastGelu", ["x", "b1"], ["g1"], domain=MS),
        helper.make_node("FastGelu", ["g1"], ["g2"], domain=MS),
        helper.make_node("BiasGelu", ["g2", "b2"], ["g3"], domain=MS),
        helper.make_node("Gelu", ["g3"], ["g4"], domain=MS),
        helper.make_node("SkipLayerNormalization", ["g4", "x", "gamma", "beta", "bias"],
                         ["ln", "mean", "inv_std", "sum"], domain=MS, epsilon=1e-5),
        helper.make_node("SkipSimplifiedLayerNormalization", ["ln", "skip2", "gamma2", "bias2"],
                         ["rms", "", "rms_inv_std", "rms_sum"], domain=MS, epsilon=1e-6),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", S, C])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ("ln", "mean", "inv_std", "sum", "rms", "rms_inv_std", "rms_sum")]
    init = {"b1": f32(C), "b2": f32(C), "gamma": f32(C), "beta": f32(C), "bias": f32(C),
            "skip2": f32(1, S, C), "gamma2": f32(C), "bias2": f32(C)}
    save("ms_fused", nodes, [x], outs, init, {"x": f32(B, S, C)}, {"batch": B})


def attention(name, B=2, S=6, D=8, N=2, mask=None, mask_shape=None, attrs=None, sizes=None, bias_input=False):
    attrs = dict(attrs or {})
    q, k, v = sizes or (D, D, D)
    if sizes:
        attrs["qkv_hidden_sizes"] = list(sizes)
    ins = ["x", "w", "b", "mask" if mask is not None else "", "", "ab" if bias_input else ""]
    while ins and ins[-1] == "":
        ins.pop()
    node = helper.make_node("Attention", ins, ["y"], domain=MS, num_heads=N, **attrs)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])]
    feeds = {"x": f32(B, S, D)}
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, list(mask_shape or mask.shape)))
        feeds["mask"] = mask.astype(np.int32)
    if bias_input:
        inputs.append(helper.make_tensor_value_info("ab", TensorProto.FLOAT, [1, N, S, S]))
        feeds["ab"] = f32(1, N, S, S)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    init = {"w": f32(D, q + k + v, scale=0.5), "b": f32(q + k + v, scale=0.1)}
    save(name, [node], inputs, [out], init, feeds)


def bert_optimized():
    from onnxruntime.transformers import optimizer
    src = os.path.join(OUT, "bert")
    opt = optimizer.optimize_model(os.path.join(src, "model.onnx"), model_type="bert", num_heads=0, hidden_size=0,
                                   opt_level=0)
    model = opt.model
    feeds = {}
    for k, v in enumerate(model.graph.input):
        feeds[v.name] = numpy_helper.to_array(onnx.load_tensor(os.path.join(src, f"input_{k}.pb")))
    with open(os.path.join(src, "dims.txt")) as f:
        results = write_case("ms_bert_optimized", model, feeds, f.read())
    fused_ops = sorted({n.op_type for n in model.graph.node if n.domain == MS})
    print("ms_bert_optimized", fused_ops, [np.asarray(r).shape for r in results])


def main():
    bert_optimized()
    fused()
    attention("ms_attention_plain")
    attention("ms_attention_lengths", mask=np.array([6, 3]))
    attention("ms_attention_ends_starts", mask=np.array([5, 6, 1, 2]))
    raw = np.ones((2, 6), np.int32)
    raw[0, 4:] = 0
    raw[1, :] = 0  # every key masked: onnxruntime adds -10000 to each, so the row attends evenly
    attention("ms_attention_raw2d", mask=raw)
    raw = np.ones((2, 6), np.int32)
    raw[1, 2] = 0
    raw[1, 5] = 0
    attention("ms_attention_causal", mask=raw, attrs={"unidirectional": 1})
    raw3 = (RNG.random((2, 6, 6)) > 0.3).astype(np.int32)
    attention("ms_attention_raw3d_causal", mask=raw3, attrs={"unidirectional": 1})
    attention("ms_attention_sizes", D=12, N=3, sizes=(12, 12, 6), attrs={"scale": 0.2}, bias_input=True)


if __name__ == "__main__":
    main()
