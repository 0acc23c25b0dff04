#!/usr/bin/env python3
"""tools/onnx_run_bind_test.py: `aspen onnx run` binds an input the importer needs at compile time.

    python3 tools/onnx_run_bind_test.py ASPEN

A model whose Reshape takes its shape from a graph input (as exporters leave shapes and axes) runs with
that input given as an .npy like any other: aspen says it bound the input at compile time, and the output
equals numpy's reshape. Exits non-zero on any mismatch.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper


def main():
    aspen = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        graph = helper.make_graph(
            [helper.make_node("Reshape", ["x", "shape"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "bind",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
             helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
        path = os.path.join(d, "bind.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        x = (np.arange(12, dtype=np.float32) - 5).reshape(2, 6)
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "shape.npy"), np.array([3, 2, 2], np.int64))
        p = subprocess.run([aspen, "onnx", "run", path, "--input", f"x={d}/x.npy", "--input", f"shape={d}/shape.npy",
                            "--output-dir", d], capture_output=True, text=True)
        out = p.stdout + p.stderr
        if p.returncode != 0:
            sys.exit(f"aspen onnx run failed ({p.returncode}):\n{out}")
        if "input 'shape' bound at compile time" not in out:
            sys.exit(f"aspen onnx run did not say it bound 'shape':\n{out}")
        got = np.load(os.path.join(d, "z.npy"))
        want = np.maximum(x.reshape(3, 2, 2), 0)
        if got.shape != want.shape or not np.array_equal(got, want):
            sys.exit(f"expected {want.tolist()}, found {got.tolist()}")
        print("ok: 'shape' bound at compile time; z equals numpy's")


if __name__ == "__main__":
    main()
