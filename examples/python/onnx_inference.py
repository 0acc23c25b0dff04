"""Run an ONNX file with aspen: compiled at the first call, four steps per call over a combined batch.

    python3 examples/python/onnx_inference.py [MODEL.onnx]

Without an argument it runs the small MLP in models/testdata/onnx/mlp_ts (exported from PyTorch) and
checks the result against onnxruntime.
"""
import os
import sys
import time

import numpy as np

import aspen

here = os.path.dirname(os.path.abspath(__file__))
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "models", "testdata", "onnx", "mlp_ts",
                                                          "model.onnx")
opts = aspen.Options().deviceIterations(4).outputMode(aspen.OutputMode.All)
model = aspen.inferenceModel(path, opts)
x = np.random.default_rng(0).standard_normal((4 * 3, 12)).astype(np.float32)  # 4 steps of 3 rows
start = time.perf_counter()
y = model(x)  # compiles, then runs
print(f"first call (compile + run): {time.perf_counter() - start:.3f} s; output {y.dtype}{list(y.shape)}")
start = time.perf_counter()
for _ in range(100):
    y = model(x)
print(f"later calls: {(time.perf_counter() - start) / 100 * 1e6:.0f} us each")
if len(sys.argv) == 1:
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, {"x": x[i * 3:(i + 1) * 3]})[0] for i in range(4)])
    print(f"largest difference from onnxruntime: {np.abs(y - want).max():.2e}")
    assert np.abs(y - want).max() < 1e-4
