"""Train a Keras model with aspen, then run it for inference.

    python3 examples/python/keras_training.py

aspen converts the model with tf2onnx at the first call, compiles its training program and runs it; the
loss is the one the model was compiled with (or loss="cross_entropy" / "mse"), and copyWeightsToHost()
writes the trained weights back into the model's variables, so Keras itself can predict with them.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import aspen  # noqa: E402

keras = tf.keras
keras.utils.set_random_seed(0)
inputs = keras.Input((2,), name="points")
hidden = keras.layers.Dense(64, activation="relu")(inputs)
model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

rng = np.random.default_rng(0)


def batch(n):
    """Points in the plane; the label says whether they lie inside the unit circle."""
    x = (rng.standard_normal((n, 2)) * 1.2).astype(np.float32)
    return x, ((x ** 2).sum(1) < 1).astype(np.int64)


opts = aspen.Options().deviceIterations(8)  # 8 optimizer steps per call
training = aspen.trainingModel(model, opts, optimizer=aspen.optim.AdamW(model.trainable_variables, lr=0.02))
for call in range(25):
    loss = training(*batch(8 * 32))
    if call % 6 == 0:
        print(f"call {call:2d}: loss {float(loss):.4f}")
training.copyWeightsToHost()

x, y = batch(512)
logits = aspen.inferenceModel(model)(x)
accuracy = float((logits.argmax(1) == y).mean())
same = np.allclose(logits, model.predict(x, verbose=0), atol=1e-5)
print(f"accuracy on new points: {accuracy:.1%}; aspen's logits equal Keras's: {same}")
assert accuracy > 0.9 and same
