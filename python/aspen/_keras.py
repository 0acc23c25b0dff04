"""A Keras model (tf.keras / Keras 3 on TensorFlow) as an aspen model: converted with tf2onnx at the first
call (TensorFlow and tf2onnx are imported only then).

NOTE [keras weights] tf2onnx names initializers after TensorFlow ops ("functional_1/dense_1/Cast/
ReadVariableOp:0"), folds constants (a zero bias disappears, a kernel is reshaped) and has no map back to
the model's variables, which training needs (to train the right tensors, and for copyWeightsToHost). So a
training export is made with every trainable variable set, for the conversion only, to its own random
values: each then shows as an initializer holding exactly those values (reshaped, or with its axes
permuted: a Dense kernel transposed, a Conv2D kernel [kh, kw, in, out] as ONNX's [out, in, kh, kw]), found
by comparing bytes; the real values are written into those initializers before the
file is compiled, and the variables restored. A variable that cannot be found (tf2onnx computed something
from it at conversion) is an error naming it. Inference exports the real values directly.

NOTE [keras lstm weights]: tf2onnx writes a Keras LSTM's kernel [I, 4H] and recurrent kernel [H, 4H] as
ONNX's W [1, 4H, I] and R [1, 4H, H]: the gate blocks reordered (Keras i, f, c, o; ONNX i, o, f, c) and
transposed, one more way a variable shows. Its bias [4H] becomes half of B [1, 8H] = [Wb, Rb] with Rb zero
(ONNX adds both): B is rewritten as Concat(Wb, zeros), so that Wb is the bias reordered (one tensor trains,
as in Keras, not two halves each taking the whole step).
"""

import itertools
import os
import shutil
import tempfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

from ._source import Source  # noqa: E402

_OPSET = 17


class KerasSource(Source):
    def __init__(self, model):
        self.model = model
        try:
            inputs = list(model.inputs)
        except (AttributeError, ValueError):
            inputs = []
        if not inputs:
            raise ValueError(f"Keras model {model.name}: expected a model with defined inputs (functional, or "
                             "Sequential built from keras.Input), found none")
        self.input_names = [self._input_name(t, i) for i, t in enumerate(inputs)]
        self.output_names = []
        self._dir = None
        self._map = {}  # variable index -> (initializer name, axis permutation or None, initializer shape)

    def describe(self):
        return f"Keras model '{self.model.name}' (converted by tf2onnx)"

    def cut(self, begins):
        """Options.setPipelineStages by layer names (NOTE [keras stages])."""
        index = {layer.name: i for i, layer in enumerate(self.model.layers)}
        at = []
        for k, b in enumerate(begins):
            if b not in index:
                raise ValueError(f"setPipelineStages: begins[{k}]: expected a layer of Keras model "
                                 f"{self.model.name} ({', '.join(index)}), found '{b}'")
            if at and index[b] <= at[-1]:
                raise ValueError(f"setPipelineStages: begins[{k}]: expected a layer after '{begins[k - 1]}' "
                                 f"(stages in the model's order), found '{b}'")
            at.append(index[b])
        self._cut = list(begins)
        self._cut_at = at  # the first layers' places in model.layers
        return {}

    @staticmethod
    def _input_name(t, i):
        name = getattr(t, "name", None) or f"input_{i}"
        return name.split(":")[0]

    def export(self, example, training, loss_kind):
        import tf2onnx
        from onnx import numpy_helper
        spec = [tf.TensorSpec(tuple(example[n].shape), tf.as_dtype(np.asarray(example[n]).dtype), name=n)
                for n in self.input_names]
        variables = list(self.model.trainable_variables)
        originals = [v.numpy() for v in variables]
        tags = []
        if training:  # NOTE [keras weights]
            rng = np.random.default_rng(20261203)
            for v, o in zip(variables, originals):
                t = rng.standard_normal(o.shape).astype(o.dtype) if o.dtype.kind == "f" else o
                v.assign(t)
                tags.append(t)
        try:
            if isinstance(self.model, tf.keras.Sequential) or type(self.model).__name__ == "Sequential":
                # tf2onnx's from_keras fails inside Keras 3's Sequential ("'keras_tensor_2'"): the model's call
                # as a tf.function converts the same layers.
                model = self.model
                fn = tf.function(lambda *xs: model(xs[0] if len(xs) == 1 else list(xs), training=False))
                proto, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=_OPSET)
            else:
                proto, _ = tf2onnx.convert.from_keras(self.model, input_signature=spec, opset=_OPSET)
        except Exception as e:
            raise RuntimeError(f"tf2onnx could not convert Keras model {self.model.name}: {e}") from e
        finally:
            if training:
                for v, o in zip(variables, originals):
                    v.assign(o)
        self.output_names = [o.name for o in proto.graph.output]
        if training and getattr(self, "_cut", None):
            self._tag_stages(proto)
        if training:
            self._split_lstm_biases(proto)  # NOTE [keras lstm weights]
            by_bytes = {}
            for k, init in enumerate(proto.graph.initializer):
                a = numpy_helper.to_array(init)
                if a.dtype.kind == "f":
                    by_bytes.setdefault(a.tobytes(), []).append(k)
            self._map = {}
            for i, (v, t) in enumerate(zip(variables, tags)):
                if t.dtype.kind != "f":
                    continue
                found, how = by_bytes.get(np.ascontiguousarray(t).tobytes()), None
                for candidate in self._layouts(t) if not found else ():
                    found = by_bytes.get(np.ascontiguousarray(self._arrange(t, candidate)).tobytes())
                    if found:
                        how = candidate
                        break
                if not found or len(found) > 1:
                    raise NotImplementedError(
                        f"Keras variable '{v.path if hasattr(v, 'path') else v.name}': tf2onnx computed other "
                        "tensors from it at conversion, so aspen cannot train it (NOTE [keras weights])")
                k = found[0]
                init = proto.graph.initializer[k]
                shape = tuple(init.dims)
                init.CopyFrom(numpy_helper.from_array(self._to_initializer(originals[i], how, shape), init.name))
                self._map[i] = (init.name, how, shape)
        self.close()
        self._dir = tempfile.mkdtemp(prefix="aspen-keras-")
        path = os.path.join(self._dir, "model.onnx")
        with open(path, "wb") as f:
            f.write(proto.SerializeToString())
        return path

    def _tag_stages(self, proto):
        """NOTE [keras stages] tf2onnx names each node by the name scopes it was traced in, among them its
        layer's ("functional_1/dense_2_1/MatMul": Keras 3 adds a suffix to each layer's scope). A node takes the
        stage of the last layer its name shows, by model.layers' order and the cut's first layers; a node
        showing none (a cast at an input) takes the stage before it. The stages reach the importer as each
        node's "aspen.stage" metadata, as aspen.poptorch's blocks do (train/pipeline.h)."""
        index = {layer.name: i for i, layer in enumerate(self.model.layers)}
        parts = [n.name.split("/") for n in proto.graph.node]

        def layers_of(components, suffix):
            return [c[:len(c) - len(suffix)] for c in components
                    if c.endswith(suffix) and c[:len(c) - len(suffix)] in index]
        # The exporter's suffix: the one under which the most nodes show a layer.
        suffix = max(("", "_1", "_2"), key=lambda suf: sum(bool(layers_of(p, suf)) for p in parts))
        stage, used = 0, set()
        for node, components in zip(proto.graph.node, parts):
            mine = layers_of(components, suffix)
            if mine:
                stage = sum(1 for b in self._cut_at if b <= index[mine[-1]])
            used.add(stage)
            node.metadata_props.add(key="aspen.stage", value=str(stage))
        for k in range(len(self._cut) + 1):
            if k not in used:
                where = "before '" + self._cut[0] + "'" if k == 0 else "from '" + self._cut[k - 1] + "'"
                raise ValueError(f"setPipelineStages: stage {k} ({where}) of Keras model {self.model.name}: "
                                 "expected layers that compute something, found no node of the converted model "
                                 "in it")

    def compiled_loss(self):
        """The model's compiled loss as aspen's kind: cross_entropy or mse (None otherwise)."""
        loss = getattr(self.model, "loss", None)
        name = loss if isinstance(loss, str) else type(loss).__name__ if loss is not None else ""
        config = loss.get_config() if hasattr(loss, "get_config") else {}
        from_logits = bool(config.get("from_logits", False))
        if name in ("SparseCategoricalCrossentropy", "sparse_categorical_crossentropy") and from_logits:
            return "cross_entropy"
        if name in ("MeanSquaredError", "mse", "mean_squared_error"):
            return "mse"
        return None

    def parameter_names(self, params):
        variables = list(self.model.trainable_variables)
        if params is None:
            chosen = range(len(variables))
        else:
            ids = {id(v): i for i, v in enumerate(variables)}
            chosen = []
            for p in params:
                if id(p) not in ids:
                    raise ValueError("optimizer params: expected trainable variables of the model being trained, "
                                     f"found {getattr(p, 'name', p)!r}")
                chosen.append(ids[id(p)])
        return [self._map[i][0] for i in chosen if i in self._map]

    def host_weights(self):
        return {name: self._to_initializer(self.model.trainable_variables[i].numpy(), how, shape)
                for i, (name, how, shape) in self._map.items()}

    # A variable's layouts in the file: ("axes", permutation) for a transposed kernel, ("gates", order) for an
    # LSTM's blocks of its last axis reordered (then transposed, for a 2-D kernel; NOTE [keras lstm weights]).
    _LSTM_GATES = (0, 3, 1, 2)

    @classmethod
    def _layouts(cls, t):
        if 2 <= t.ndim <= 5:
            for perm in itertools.permutations(range(t.ndim)):
                if perm != tuple(range(t.ndim)):
                    yield ("axes", perm)
        if t.ndim in (1, 2) and t.shape[-1] % 4 == 0:
            yield ("gates", cls._LSTM_GATES)

    @staticmethod
    def _gate_index(n, order):
        h = n // len(order)
        return np.concatenate([np.arange(h) + h * g for g in order])

    @classmethod
    def _arrange(cls, value, how):
        """The variable's value as the file holds it (before the initializer's reshape)."""
        if how is None:
            return value
        kind, arg = how
        if kind == "axes":
            return np.transpose(value, arg)
        reordered = value[..., cls._gate_index(value.shape[-1], arg)]
        return reordered.T if reordered.ndim == 2 else reordered

    @classmethod
    def _to_initializer(cls, value, how, shape):
        return np.ascontiguousarray(cls._arrange(value, how)).reshape(shape)

    @classmethod
    def _from_initializer(cls, w, how, shape):
        """The inverse of _to_initializer: the variable's value (its shape `shape`) from the file's tensor."""
        if how is None:
            return w.reshape(shape)
        kind, arg = how
        if kind == "axes":
            return np.transpose(w.reshape(tuple(shape[k] for k in arg)), np.argsort(arg))
        w = w.reshape(shape[::-1]).T if len(shape) == 2 else w.reshape(shape)
        return w[..., np.argsort(cls._gate_index(shape[-1], arg))]

    @staticmethod
    def _split_lstm_biases(proto):
        """NOTE [keras lstm weights]: each LSTM's B [D, 8H] initializer whose recurrent half is zero becomes
        Concat(B__wb [D, 4H], zeros): a Constant node, not an initializer (initializers train)."""
        from onnx import helper, numpy_helper
        inits = {init.name: k for k, init in enumerate(proto.graph.initializer)}
        added, done = [], set()
        for node in proto.graph.node:
            if node.op_type != "LSTM" or len(node.input) < 4 or node.input[3] not in inits or node.input[3] in done:
                continue
            name = node.input[3]
            done.add(name)  # a B two LSTMs share is split once
            b = numpy_helper.to_array(proto.graph.initializer[inits[name]])
            if b.ndim != 2 or b.shape[1] % 2 or np.any(b[:, b.shape[1] // 2:]):
                continue
            half = b.shape[1] // 2
            proto.graph.initializer[inits[name]].CopyFrom(numpy_helper.from_array(b[:, :half].copy(), name + "__wb"))
            zeros = numpy_helper.from_array(np.zeros_like(b[:, half:]), name + "__rb")
            added.append(helper.make_node("Constant", [], [name + "__rb"], value=zeros))
            added.append(helper.make_node("Concat", [name + "__wb", name + "__rb"], [name], axis=1))
        for k, node in enumerate(added):
            proto.graph.node.insert(k, node)

    def copy_to_host(self, weights):
        variables = list(self.model.trainable_variables)
        for i, (name, how, _) in self._map.items():
            w = weights.get(name)
            if w is None:
                continue
            v = variables[i]
            v.assign(self._from_initializer(w, how, tuple(v.shape)))

    def close(self, _rmtree=shutil.rmtree):  # bound now: at interpreter exit the module's globals may be gone
        if self._dir is not None:
            _rmtree(self._dir, ignore_errors=True)
            self._dir = None
