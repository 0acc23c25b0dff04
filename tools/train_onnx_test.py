#!/usr/bin/env python3
"""tools/train_onnx_test.py: `aspen train` on a user's own ONNX model and numpy arrays, end to end.

    python3 tools/train_onnx_test.py ASPEN SOURCE_DIR

The exported MLP of models/testdata/onnx/mlp_dynamo trains for 40 AdamW steps on an .npz written by
numpy.savez_compressed (MSE against targets it does not yet fit), with validation; then onnxruntime runs
the copy the run exports (runs/<name>/model/model.onnx) and its outputs must equal `aspen onnx run`'s on
the same file and inputs, differ from the untrained model's, and fit the targets better. A model with a
Dropout in training mode (written with onnx.helper) trains through aspen's seeded dropout: two runs of one
seed print the same losses, another seed other ones. Exits non-zero
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
        dropout_runs(aspen, d, x)


def dropout_runs(aspen, d, x):
    """y = Dropout(x W, 0.3, training_mode=True): the losses depend on train.seed alone."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((12, 10)).astype(np.float32) * 0.3, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Dropout", ["h", "ratio", "training"], ["y"], name="drop")],
        "dropped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [w, numpy_helper.from_array(np.array(0.3, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "training")])
    path = os.path.join(d, "dropped.onnx")
    np.savez_compressed(os.path.join(d, "dropped.npz"), x=x,
                        targets=np.random.default_rng(2).standard_normal((len(x), 10)).astype(np.float32))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    losses = []
    for k, seed in enumerate((3, 3, 4)):
        cfg = os.path.join(d, f"dropped{k}.yaml")
        with open(cfg, "w") as f:
            f.write(f"""name: dropped{k}
model: {{from: "{path}", loss: mse}}
data: {{train: "{d}/dropped.npz", val_fraction: 0.125}}
optimizer: {{name: sgd, lr: 0.05}}
batch: {{micro: 8}}
train: {{steps: 6, threads: 2, seed: {seed}}}
eval: {{interval: 3, batches: 1}}
log: {{run_dir: "{d}/run{k}", progress: lines}}
""")
        out = run([aspen, "train", cfg])
        losses.append([line.split(";")[0] for line in out.splitlines() if line.startswith("loss: ") or "val_loss" in line])
        if len(losses[-1]) != 3:
            sys.exit(f"expected two val_loss lines and the summary, found {losses[-1]}:\n{out}")
    if losses[0] != losses[1]:
        sys.exit(f"two runs of seed 3 trained differently: {losses[0]} and {losses[1]}")
    if losses[0] == losses[2]:
        sys.exit(f"seeds 3 and 4 drew the same dropout masks: {losses[0]}")
    print(f"ok: dropout in training, seed 3 {losses[0]}, seed 4 {losses[2]}")


if __name__ == "__main__":
    main()
