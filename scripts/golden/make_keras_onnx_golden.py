#!/usr/bin/env python3
"""ONNX models as tf2onnx converts Keras ones, with onnxruntime's outputs, for models/onnx_import_test.cc.

Writes models/testdata/onnx/keras_mlp and keras_encoder in the layout of make_onnx_golden.py (model.onnx,
input_<k>.pb, output_<k>.pb, dims.txt):
  keras_mlp:     Dense + GELU (tanh form), LayerNormalization, Dropout (inference), Dense + ReLU; a symbolic batch
  keras_encoder: layers.MultiHeadAttention, residual LayerNormalization, a ReLU feed-forward; a symbolic batch
  tf_bert:       Hugging Face's TFBertModel (tiny random config, GELU's tanh form: TF's exact GELU becomes an
                 Erfc op that ONNX lacks and onnxruntime refuses), input_ids and a padded attention_mask with
                 symbolic [batch, sequence]; outputs last_hidden_state and pooler_output

Run by a developer (not CI) in a venv with TensorFlow (its own: it pins numpy and protobuf apart from torch;
transformers 5 dropped its TensorFlow models, so 4.x, with tf-keras for them):
    python3 -m venv ~/tf-venv && ~/tf-venv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0 onnxruntime \
        "transformers<5" tf-keras
    ~/tf-venv/bin/python scripts/golden/make_keras_onnx_golden.py
"""
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "models", "testdata", "onnx")


def mlp():
    x = tf.keras.Input((12,), name="x")
    # GELU's tanh form: Keras's exact one becomes tf.math.erfc, which tf2onnx writes as an op ONNX lacks.
    h = tf.keras.layers.Dense(24, activation=lambda v: tf.keras.activations.gelu(v, approximate=True))(x)
    h = tf.keras.layers.LayerNormalization()(h)
    h = tf.keras.layers.Dropout(0.1)(h)
    return tf.keras.Model(x, tf.keras.layers.Dense(5, activation="relu")(h))


def encoder():
    x = tf.keras.Input((7, 16), name="x")
    a = tf.keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    h = tf.keras.layers.LayerNormalization()(x + a)
    f = tf.keras.layers.Dense(16)(tf.keras.layers.Dense(32, activation="relu")(h))
    return tf.keras.Model(x, tf.keras.layers.LayerNormalization()(h + f))


def save_case(name, path, feeds):
    """Runs onnxruntime on `feeds` and writes input_<k>.pb, output_<k>.pb and dims.txt (every symbolic
    dimension of the inputs bound to the feeds' extents) beside the model."""
    d = os.path.dirname(path)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    dims = {}
    for k, v in enumerate(m.graph.input):
        with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[v.name], v.name).SerializeToString())
        for axis, dim in enumerate(v.type.tensor_type.shape.dim):
            if dim.dim_param:
                dims[dim.dim_param] = feeds[v.name].shape[axis]
    for k, (o, y) in enumerate(zip(sess.get_outputs(), outs)):
        with open(os.path.join(d, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(y, o.name).SerializeToString())
    with open(os.path.join(d, "dims.txt"), "w") as f:
        for sym, extent in dims.items():
            f.write(f"{sym} {extent}\n")
    print(f"{name}: opset {[o.version for o in m.opset_import]}, {len(m.graph.node)} nodes, "
          f"ops {sorted({n.op_type for n in m.graph.node})}, symbols {dims}")


def tf_bert():
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    from transformers import BertConfig, TFBertModel
    cfg = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64, hidden_act="gelu_new")
    model = TFBertModel(cfg)
    ids = np.array([[5, 7, 9, 11, 3, 2, 1], [4, 8, 15, 16, 23, 42, 0]], dtype=np.int32)
    mask = np.array([[1] * 7, [1] * 5 + [0] * 2], dtype=np.int32)
    model(ids, attention_mask=mask)
    spec = (tf.TensorSpec((None, None), tf.int32, name="input_ids"),
            tf.TensorSpec((None, None), tf.int32, name="attention_mask"))

    @tf.function(input_signature=spec)
    def forward(input_ids, attention_mask):
        o = model(input_ids=input_ids, attention_mask=attention_mask)
        return {"last_hidden_state": o.last_hidden_state, "pooler_output": o.pooler_output}

    d = os.path.join(OUT, "tf_bert")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    path = os.path.join(d, "model.onnx")
    tf2onnx.convert.from_function(forward, input_signature=spec, opset=17, output_path=path)
    save_case("tf_bert", path, {"input_ids": ids, "attention_mask": mask})


def main():
    tf.random.set_seed(0)
    rng = np.random.default_rng(0)
    for name, model, shape in (("keras_mlp", mlp(), (3, 12)), ("keras_encoder", encoder(), (2, 7, 16))):
        d = os.path.join(OUT, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        spec = (tf.TensorSpec((None,) + shape[1:], tf.float32, name="x"),)
        path = os.path.join(d, "model.onnx")
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=path)
        m = onnx.load(path)
        onnx.checker.check_model(m)
        x = rng.standard_normal(shape).astype(np.float32)
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {sess.get_inputs()[0].name: x}
        outs = sess.run(None, feeds)
        with open(os.path.join(d, "input_0.pb"), "wb") as f:
            f.write(numpy_helper.from_array(x, sess.get_inputs()[0].name).SerializeToString())
        for k, (o, y) in enumerate(zip(sess.get_outputs(), outs)):
            with open(os.path.join(d, f"output_{k}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(y, o.name).SerializeToString())
        batch = m.graph.input[0].type.tensor_type.shape.dim[0].dim_param
        with open(os.path.join(d, "dims.txt"), "w") as f:
            f.write(f"{batch} {shape[0]}\n")
        print(f"{name}: opset {[o.version for o in m.opset_import]}, {len(m.graph.node)} nodes, "
              f"ops {sorted({n.op_type for n in m.graph.node})}, batch symbol {batch!r}")
    tf_bert()


if __name__ == "__main__":
    main()
