"""aspen.inferenceModel and aspen.trainingModel on Keras models (converted with tf2onnx): outputs equal
Keras's own, training steps equal Keras's train_on_batch with the same optimizer, and copyWeightsToHost
writes the model's variables."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # required: scripts/install-deps.sh installs tensorflow-cpu and tf2onnx

import aspen
from conftest import assert_close

keras = tf.keras


def mlp(seed=0):
    keras.utils.set_random_seed(seed)
    x = keras.Input((12,), name="x")
    h = keras.layers.Dense(24, activation="relu")(x)
    h = keras.layers.LayerNormalization()(h)
    return keras.Model(x, keras.layers.Dense(5)(h))


def encoder(seed=0):
    keras.utils.set_random_seed(seed)
    x = keras.Input((7, 16), name="x")
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    h = keras.layers.LayerNormalization()(x + a)
    f = keras.layers.Dense(16)(keras.layers.Dense(32, activation="relu")(h))
    out = keras.layers.LayerNormalization()(h + f)
    return keras.Model(x, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(out)))


def cnn(seed=0):
    """A Sequential CNN (issue W3.2's Keras row): Conv2D, MaxPooling2D, Flatten, Dense."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((10, 10, 1), name="x"), keras.layers.Conv2D(6, 3, activation="relu"),
                             keras.layers.MaxPooling2D(2), keras.layers.Conv2D(4, 3, padding="same"),
                             keras.layers.Flatten(), keras.layers.Dense(3)])


def lstm(seed=0):
    """A Sequential LSTM classifier."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6, 5), name="x"), keras.layers.LSTM(8), keras.layers.Dense(3)])


_SHAPES = {"mlp": ((12,), 5), "encoder": ((7, 16), 4), "cnn": ((10, 10, 1), 3), "lstm": ((6, 5), 3)}


def batches(kind, steps, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    shape, classes = (batch,) + _SHAPES[kind][0], _SHAPES[kind][1]
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, batch).astype(np.int64))
            for _ in range(steps)]


def make(kind, seed=0):
    return {"mlp": mlp, "encoder": encoder, "cnn": cnn, "lstm": lstm}[kind](seed)


@pytest.mark.parametrize("kind", ["mlp", "encoder", "cnn", "lstm"])
def test_inference_equals_keras(kind):
    model = make(kind)
    x, _ = batches(kind, 1)[0]
    want = model(x, training=False).numpy()
    got = aspen.inferenceModel(model)(x)
    assert isinstance(got, np.ndarray)
    assert_close(got, want, atol=1e-5, what=kind)


@pytest.mark.parametrize("kind", ["mlp", "encoder", "cnn", "lstm"])
def test_training_equals_train_on_batch(kind):
    data = batches(kind, 10)
    ref = make(kind)
    ref.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    want = [float(ref.train_on_batch(x, y)) for x, y in data]
    model = make(kind)
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.trainable_variables, lr=0.05,
                                                                    momentum=0.9), loss="cross_entropy")
    got = [float(training(x, y)) for x, y in data]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    training.copyWeightsToHost()
    for v, r in zip(model.trainable_variables, ref.trainable_variables):
        assert_close(v.numpy(), r.numpy(), atol=2e-5, rtol=1e-4, what=v.path)


def test_layer_ranges_become_pipeline_stages():
    """Options.setPipelineStages by Keras layer names (NOTE [keras stages]): the encoder cut before its first
    Dense layer trains as one device accumulating the same micro-batches, and its variables come back to the
    Keras model; a name that is no layer, and stages out of order, are named."""
    data = batches("encoder", 4, batch=8)

    def run(begins=None):
        model = encoder()
        opts = aspen.Options()
        opts.Training.gradientAccumulation(4)
        if begins:
            opts.setPipelineStages(begins(model))
        training = aspen.trainingModel(model, opts, optimizer=aspen.optim.SGD(model.trainable_variables, lr=0.05,
                                                                              momentum=0.9), loss="cross_entropy")
        losses = [float(training(x, y)) for x, y in data]
        training.copyWeightsToHost()
        return losses, [v.numpy() for v in model.trainable_variables], training._program.pipeline_stages

    def first_dense(model):
        return [next(layer.name for layer in model.layers if isinstance(layer, keras.layers.Dense))]
    want, w_want, one = run()
    got, w_got, stages = run(first_dense)
    assert (one, stages) == (1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(w_got, w_want):
        assert_close(a, b, atol=1e-5, rtol=1e-5)
    model = encoder()
    with pytest.raises(ValueError, match=r"begins\[0\]: expected a layer of Keras model .*found 'nope'"):
        aspen.trainingModel(model, aspen.Options().setPipelineStages(["nope"]),
                            optimizer=aspen.optim.SGD(None, lr=0.1), loss="cross_entropy")(*data[0])
    names = [layer.name for layer in model.layers]
    with pytest.raises(ValueError, match=r"begins\[1\]: expected a layer after"):
        aspen.trainingModel(model, aspen.Options().setPipelineStages([names[3], names[2]]),
                            optimizer=aspen.optim.SGD(None, lr=0.1), loss="cross_entropy")(*data[0])


def test_a_variable_tf2onnx_computes_from_is_refused_by_name():
    """tf2onnx folds a BatchNormalization after a Conv2D into the convolution's weights at conversion: a
    tensor computed from the variables, which aspen cannot train through, and says which (NOTE [keras
    weights])."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10, 10, 1), name="x"), keras.layers.Conv2D(4, 3),
                              keras.layers.BatchNormalization(), keras.layers.Flatten(), keras.layers.Dense(3)])
    x, y = batches("cnn", 1)[0]
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.trainable_variables, lr=0.05),
                                   loss="cross_entropy")
    with pytest.raises(NotImplementedError, match=r"Keras variable '.*batch_normalization.*': tf2onnx computed"):
        training(x, y)


def test_an_unconverted_layer_names_the_keras_model_not_a_temporary_file():
    """A Keras GRU converts to an ONNX Loop, which aspen does not convert: the error names the model and the
    layer's node, never the deleted temporary file."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 5), name="x"), keras.layers.GRU(8), keras.layers.Dense(3)],
                             name="my_gru")
    x, _ = batches("lstm", 1)[0]
    with pytest.raises(NotImplementedError) as e:
        aspen.inferenceModel(model)(x)
    assert "Keras model 'my_gru' (converted by tf2onnx)" in str(e.value)
    assert "gru" in str(e.value) and "(Loop)" in str(e.value) and "/tmp/" not in str(e.value)


def test_adamw_steps_equal_keras():
    data = batches("mlp", 8)
    ref = mlp()
    ref.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=0.01, epsilon=1e-8),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    want = [float(ref.train_on_batch(x, y)) for x, y in data]
    model = mlp()
    training = aspen.trainingModel(model, optimizer=aspen.optim.AdamW(model.trainable_variables, lr=1e-2,
                                                                      weight_decay=0.01), loss="cross_entropy")
    got = [float(training(x, y)) for x, y in data]
    # Keras adds epsilon to sqrt(v) before v's bias correction (an epsilon of eps / sqrt(1 - beta2^t) in
    # torch's form), torch and aspen after it: with eps 1e-8 the steps differ far below these tolerances.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_the_compiled_keras_loss_is_used_and_mse_trains():
    data = [(x, np.tanh(x[:, :5])) for x, _ in batches("mlp", 5)]
    ref = mlp()
    ref.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss=keras.losses.MeanSquaredError())
    want = [float(ref.train_on_batch(x, y)) for x, y in data]
    model = mlp()
    model.compile(optimizer="sgd", loss=keras.losses.MeanSquaredError())
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(None, lr=0.1))
    got = [float(training(x, y)) for x, y in data]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


def test_keras_errors():
    model = mlp()
    with pytest.raises(ValueError, match="loss: expected"):
        aspen.trainingModel(model, optimizer=aspen.optim.SGD(None, lr=0.1))
    other = mlp(1)
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(other.trainable_variables, lr=0.1),
                                   loss="cross_entropy")
    x, y = batches("mlp", 1)[0]
    with pytest.raises(ValueError, match="trainable variables of the model"):
        training(x, y)


def test_tensorflow_data_feeds_a_torch_model_in_one_process():
    """The founding document's script: tf.data batches a torch module trains on, TensorFlow imported first.
    torch's exporter would load triton's LLVM beside TensorFlow's and abort the interpreter (NOTE [tensorflow
    and torch] in python/aspen/__init__.py); the run equals torch's own steps."""
    import torch
    import aspen.poptorch as poptorch

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.fc = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

        def forward(self, x, labels=None):
            out = self.fc(x)
            return out if labels is None else (out, torch.nn.functional.cross_entropy(out, labels))

    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.normal(size=(40, 6)).astype(np.float32),
                                               rng.integers(0, 3, 40).astype(np.int64))).batch(8)
    batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data.as_numpy_iterator()]
    ref = Classifier()
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    want = []
    for x, y in batches:
        opt.zero_grad()
        _, loss = ref(x, y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    model = Classifier()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.2))
    got = [float(training(x, y)[1]) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_tensorflow_imported_after_aspen_and_torch_still_runs_and_never_aborts():
    """The other import order, in a fresh interpreter: aspen and torch first, TensorFlow after; then torch's
    optimizer and exporter (both reach for triton) in the same process. And TensorFlow imported after triton
    was loaded: an ImportError that says why, not an abort."""
    import subprocess
    import sys
    later = ("import aspen, aspen.poptorch as poptorch, torch\n"
             "import tensorflow as tf\n"
             "m = torch.nn.Linear(3, 2)\n"
             "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
             "x = tf.constant([[1.0, 2.0, 3.0]]).numpy()\n"
             "print(poptorch.inferenceModel(m)(torch.from_numpy(x)).shape)\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", later], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch.Size([1, 2])" in r.stdout
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return  # a CPU-only torch without triton: the abort this guards against cannot happen
    first = "import triton\nimport aspen\ntry:\n    import tensorflow\nexcept ImportError as e:\n    print(e)\n"
    r = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tensorflow: triton (torch's GPU compiler" in r.stdout


def test_a_tf_data_dataset_feeds_poptorchs_data_loader():
    import torch
    import aspen.poptorch as poptorch
    data = tf.data.Dataset.from_tensor_slices((np.arange(30, dtype=np.float32).reshape(30, 1),
                                               np.arange(30, dtype=np.int64)))
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, data, batch_size=4)
    assert loader.combinedBatchSize == 8 and len(loader) == 3
    got = [(x, i) for x, i in loader]
    assert [tuple(x.shape) for x, _ in got] == [(8, 1)] * 3
    assert torch.cat([i for _, i in got]).tolist() == list(range(24))
    with pytest.raises(ValueError, match="shuffle: expected False with a tf.data.Dataset"):
        poptorch.DataLoader(opts, data, batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="num_workers: expected 0 with a tf.data.Dataset"):
        poptorch.DataLoader(opts, data, batch_size=4, num_workers=2)
