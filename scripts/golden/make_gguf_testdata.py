#!/usr/bin/env python3
"""Writes io/testdata/gguf/tiny.gguf and tiny.expected.npz for io/gguf_test.cc: a small GGUF file with metadata of
every value type and tensors in F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K, written by llama.cpp's own Python package
(`gguf`, PyPI), and each tensor's values as that package dequantizes them (the oracle aspen's reader must equal,
value for value). The K-quants have no quantizer in the package: their blocks are random bytes with sane scales.

    python3 scripts/golden/make_gguf_testdata.py [OUT_DIR]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "io", "testdata", "gguf")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(20261206)

w = gguf.GGUFWriter(os.path.join(out, "tiny.gguf"), "llama")
w.add_uint32("tiny.u32", 7)
w.add_int32("tiny.i32", -3)
w.add_float32("tiny.f32", 0.25)
w.add_bool("tiny.bool", True)
w.add_string("tiny.string", "héllo")
w.add_array("tiny.strings", ["a", "bc", ""])
w.add_array("tiny.ints", [1, -2, 3])
w.add_uint64("tiny.u64", 2 ** 40)
w.add_float64("tiny.f64", -1.5)

expected = {}


def quantized(name, shape, qtype):
    x = rng.standard_normal(shape).astype(np.float32)
    q = quants.quantize(x, qtype)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
    expected[name] = quants.dequantize(q, qtype)


x = rng.standard_normal((3, 5)).astype(np.float32)
w.add_tensor("plain.f32", x)
expected["plain.f32"] = x
h = rng.standard_normal((2, 64)).astype(np.float16)
w.add_tensor("plain.f16", h)
expected["plain.f16"] = h.astype(np.float32)
b = (rng.standard_normal((2, 8)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
w.add_tensor("plain.bf16", b.view(np.uint8).reshape(2, 16), raw_shape=(2, 16), raw_dtype=T.BF16)
expected["plain.bf16"] = (b.astype(np.uint32) << 16).view(np.float32)
quantized("blocks.q8_0", (3, 64), T.Q8_0)
quantized("blocks.q4_0", (2, 96), T.Q4_0)
# Q4_K: 2 rows of 2 super-blocks; random scales and nibbles under small f16 d and dmin.
raw = rng.integers(0, 256, size=(2, 2, 144), dtype=np.uint8)
raw[..., 0:2] = np.array(rng.uniform(0.001, 0.05, size=(2, 2)), np.float16).view(np.uint8).reshape(2, 2, 2)
raw[..., 2:4] = np.array(rng.uniform(0.001, 0.05, size=(2, 2)), np.float16).view(np.uint8).reshape(2, 2, 2)
q4k = raw.reshape(2, 288)
# Q6_K (d last) and Q5_K (d, dmin first): the K-quants of llama.cpp's mixed files (Q4_K_M keeps some matrices
# in Q6_K), random bytes under small f16 scales likewise; written before Q4_K, whose bytes end the file
# (io/gguf_test.cc damages that tensor's header and cuts the file short anywhere).
raw = rng.integers(0, 256, size=(3, 1, 210), dtype=np.uint8)
raw[..., 208:210] = np.array(rng.uniform(0.001, 0.05, size=(3, 1)), np.float16).view(np.uint8).reshape(3, 1, 2)
raw = raw.reshape(3, 210)
w.add_tensor("blocks.q6_k", raw, raw_shape=raw.shape, raw_dtype=T.Q6_K)
expected["blocks.q6_k"] = quants.dequantize(raw, T.Q6_K)
raw = rng.integers(0, 256, size=(2, 2, 176), dtype=np.uint8)
raw[..., 0:4] = np.array(rng.uniform(0.001, 0.05, size=(2, 2, 2)), np.float16).view(np.uint8).reshape(2, 2, 4)
raw = raw.reshape(2, 352)
w.add_tensor("blocks.q5_k", raw, raw_shape=raw.shape, raw_dtype=T.Q5_K)
expected["blocks.q5_k"] = quants.dequantize(raw, T.Q5_K)
w.add_tensor("blocks.q4_k", q4k, raw_shape=q4k.shape, raw_dtype=T.Q4_K)
expected["blocks.q4_k"] = quants.dequantize(q4k, T.Q4_K)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
np.savez(os.path.join(out, "tiny.expected.npz"), **expected)
print({k: v.shape for k, v in expected.items()})
