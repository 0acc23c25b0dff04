#!/usr/bin/env python3
"""tools/train_onnx_test.py: `aspen train` on a user's own ONNX model and numpy arrays, end to end.

    python3 tools/train_onnx_test.py ASPEN SOURCE_DIR

The exported MLP of models/testdata/onnx/mlp_dynamo trains for 40 AdamW steps on an .npz written by
numpy.savez_compressed (MSE against targets it does not yet fit), with validation; then onnxruntime runs
the copy the run exports (runs/<name>/model/model.onnx) and its outputs must equal `aspen onnx run`'s on
the same file and inputs, differ from the untrained model's, and fit the targets better. Exits non-zero
on any mismatch (CTest runs it; scripts/install-deps.sh installs numpy and onnxruntime).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def main():
    aspen, source = sys.argv[1], sys.argv[2]
    model = os.path.join(source, "models/testdata/onnx/mlp_dynamo/model.onnx")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        x = rng.standard_normal((64, 12)).astype(np.float32)
        before = ort.InferenceSession(model)
        y0 = before.run(None, {"x": x})[0]
        targets = (np.abs(y0) * 0.5 + 0.25).astype(np.float32)
        np.savez_compressed(os.path.join(d, "train.npz"), x=x, targets=targets)
        cfg = os.path.join(d, "mlp.yaml")
        with open(cfg, "w") as f:
            f.write(f"""name: mlp
model: {{from: "{model}", loss: mse}}
data: {{train: "{d}/train.npz", val_fraction: 0.125}}
optimizer: {{name: adamw, lr: 0.01}}
batch: {{micro: 8}}
train: {{steps: 40, threads: 2}}
eval: {{interval: 20, batches: 1}}
log: {{run_dir: "{d}/run", progress: lines}}
""")
        out = run([aspen, "train", cfg])
        for want in ("the ONNX model", "batch 8 examples", "compile: ", "step 20: val_loss", "trained to step 40",
                     "examples/s"):
            if want not in out:
                sys.exit(f"aspen train printed no '{want}':\n{out}")

        exported = os.path.join(d, "run/model/model.onnx")
        probe = rng.standard_normal((5, 12)).astype(np.float32)
        np.save(os.path.join(d, "probe.npy"), probe)
        ours = run([aspen, "onnx", "run", exported, "--input", f"x={d}/probe.npy", "--output-dir", f"{d}/out"])
        aspen_y = np.load(os.path.join(d, "out/relu.npy"))
        after = ort.InferenceSession(exported)
        ort_y = after.run(None, {"x": probe})[0]
        scale = max(1.0, float(np.abs(ort_y).max()))
        err = float(np.abs(aspen_y - ort_y).max()) / scale
        if not err <= 1e-5:
            sys.exit(f"onnxruntime and aspen disagree on the exported model: max error {err:.3g} of scale {scale}\n{ours}")
        if np.allclose(ort_y, before.run(None, {"x": probe})[0]):
            sys.exit("the exported model computes what the untrained one does: the trained weights were not written")
        fit_before = float(np.mean((y0 - targets) ** 2))
        fit_after = float(np.mean((after.run(None, {"x": x})[0] - targets) ** 2))
        if not fit_after < 0.5 * fit_before:
            sys.exit(f"training did not fit the targets: MSE {fit_before:.4g} before, {fit_after:.4g} after")
        print(f"ok: onnxruntime = aspen on the exported model (max error {err:.2g}); MSE {fit_before:.4g} -> {fit_after:.4g}")


if __name__ == "__main__":
    main()
