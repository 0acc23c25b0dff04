"""aspen.inferenceModel and aspen.trainingModel: a user's model compiled into a static program and run,
PopTorch's way (docs/python.md).

The model is an ONNX file, a torch.nn.Module (exported with torch.onnx at the first call) or a Keras model
(converted with tf2onnx at the first call); neither framework is imported unless such a model is passed.
The first call fixes the shapes (static, as PopTorch) and compiles; later calls run. Inputs are PopTorch's
combined batch: each carries deviceIterations x replicationFactor (x gradientAccumulation, training)
micro-batches merged on its first dimension.
"""

import os
import sys
import weakref

import numpy as np

from . import _aspen, _check
from ._source import Source
from .optim import Optimizer, same_groups
from .options import Options, OutputMode

__all__ = ["inferenceModel", "trainingModel", "InferenceModel", "TrainingModel"]

# NOTE [implicit weight sync]: as PopTorch keeps them, the host module's weights follow its training model
# without copyWeightsToHost: a training model registers itself under its torch module; an inference model
# of that module (or of one inside it, or around it) copies the trainer's newer weights to the host and onto
# its own device before it runs (each trainer's call count tells it there are newer ones), and state_dict()
# of the module or of any module inside it copies them to the host first (a state-dict pre-hook).
# Parameters read directly (model.fc.weight) are not followed: copyWeightsToHost() first, or detachFromDevice().
_TRAINERS = weakref.WeakKeyDictionary()  # torch module -> weakref to its latest TrainingModel

_LOSS_KINDS = ("cross_entropy", "mse")
_LOSS_KEYS = ("kind", "output", "targets", "ignore_index")


def _is_torch_module(model):
    torch = _module_if_loaded("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def _is_keras_model(model):
    for name in ("keras", "tf_keras", "tensorflow"):
        mod = _module_if_loaded(name)
        if mod is None:
            continue
        model_cls = getattr(mod, "Model", None) or getattr(getattr(mod, "keras", None), "Model", None)
        if model_cls is not None and isinstance(model, model_cls):
            return True
    return False


def _module_if_loaded(name):
    """A framework module if the program imported it (a model of its kind exists only then)."""
    return sys.modules.get(name)


def _is_torch_tensor(x):
    torch = _module_if_loaded("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _source_of(model):
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if os.path.isdir(path):
            return _HfDirectory(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model '{path}': expected an ONNX file, found no such file")
        return _OnnxFile(path)
    if _is_torch_module(model):
        from ._torch import TorchSource
        return TorchSource(model)
    if _is_keras_model(model):
        from ._keras import KerasSource
        return KerasSource(model)
    raise ValueError(f"model: expected an ONNX file path, a torch.nn.Module or a Keras model, found "
                     f"{type(model).__module__}.{type(model).__qualname__}")


_mpi_started = []


def _start_mpi():
    """MPI for Options.Distributed: initialized once (by the first model that asks), finalized at exit."""
    if not _mpi_started:
        import atexit
        _mpi_started.append(_aspen.mpi_init())
        atexit.register(_aspen.mpi_finalize)
    return _mpi_started[0]


class _OnnxFile(Source):
    """A model that is an ONNX file already."""

    def __init__(self, path):
        self.path = path
        sig = _aspen.onnx_signature(path)
        self.input_names = [name for name, _, _ in sig["inputs"]]
        self.output_names = list(sig["outputs"])
        self._initializers = list(sig["initializers"])

    def export(self, example, training, loss_kind):
        return self.path

    def check_parameters(self, params):
        for k, n in enumerate(params or ()):
            if not isinstance(n, str) or n not in self._initializers:
                raise ValueError(f"optimizer params[{k}]: expected an initializer name of {self.path} "
                                 f"({_check.listing(self._initializers)}), found {_check.found(n)}")

    def parameter_names(self, params):
        return None if params is None else list(params)

    def loss_output(self):
        return "loss" if "loss" in self.output_names else None

    def cut(self, begins):
        return {"stage_begins": list(begins)}  # the importer finds them (an unmatched prefix is named there)



def _int32(name, a):
    """Integer ids as the int32 the built-in graphs take, refusing values that int32 cannot hold."""
    a = np.asarray(a)
    if a.dtype.kind not in "iu":  # bool ids once went through as 0 and 1
        raise ValueError(f"input '{name}': expected integer ids, found {a.dtype}")
    if a.size and a.dtype != np.int32 and (int(a.min()) < -2 ** 31 or int(a.max()) >= 2 ** 31):
        # (uint32 ids of 2^31 and more once wrapped to negative ones)
        raise ValueError(f"input '{name}': expected ids in the int32 range, found {a.min()} .. {a.max()}")
    return a.astype(np.int32, copy=False)


def _mask(name, m):
    """An attention mask as the uint8 the graphs take: 0 and 1 only (a mask of 256 once wrapped to 0)."""
    m = np.asarray(m)
    if m.dtype.kind not in "iub":
        raise ValueError(f"input '{name}': expected a mask of 0 and 1, found {m.dtype}")
    if m.size and m.dtype.kind != "b" and (int(m.min()) < 0 or int(m.max()) > 1):
        raise ValueError(f"input '{name}': expected a mask of 0 and 1, found values {m.min()} .. {m.max()}")
    return m.astype(np.uint8, copy=False)


class _HfDirectory(Source):
    """A built-in family's Hugging Face directory (config.json, model.safetensors): aspen's own GPT-2,
    GPT-J or BERT graph, no export. GPT-2 and GPT-J take input_ids [batch, seq] (positions 0..seq-1) and
    return logits; training takes targets too (the next token of each position: the loss does not shift)
    and returns the loss. BERT takes input_ids, attention_mask and token_type_ids (ones and zeros when not
    given) and returns last_hidden_state, and pooler_output when the checkpoint has a pooler."""

    def __init__(self, path):
        import json
        config = os.path.join(path, "config.json")
        if not os.path.exists(config):
            raise FileNotFoundError(f"model '{path}': expected a Hugging Face directory with config.json, found "
                                    "none")
        with open(config) as f:
            cfg = json.load(f)
        self.model_type = cfg.get("model_type")
        # The embedding tables' sizes, which ids must index (the graphs' gather checks them too, by node).
        self._table_sizes = {"input_ids": ("vocab_size", cfg.get("vocab_size")),
                             "targets": ("vocab_size", cfg.get("vocab_size")),
                             "token_type_ids": ("type_vocab_size", cfg.get("type_vocab_size", 2))}
        self.path = path
        if self.model_type == "bert":
            self.input_names = ["input_ids", "attention_mask", "token_type_ids"]
        else:
            self.input_names = ["input_ids"]
        self.output_names = []
        self._program_inputs = []

    def optional_inputs(self):
        return {"attention_mask", "token_type_ids"} if self.model_type == "bert" else set()

    def compile(self, arrays, per_call, options, training):
        ids = arrays["input_ids"]
        if len(ids.shape) != 2 or ids.shape[0] % per_call:
            raise ValueError(f"input 'input_ids': expected [batch, sequence] with a batch that is a multiple of "
                             f"{per_call} (the micro-batches of a call), found shape {tuple(ids.shape)}")
        program = _aspen.OnnxProgram.from_hf(self.path, ids.shape[0] // per_call, ids.shape[1], options, training)
        self.output_names = [n for n in program.outputs if n != "loss"] if training is None else ["loss"]
        self._program_inputs = program.inputs
        return program

    def feeds(self, arrays):
        """The program's inputs from the call's (int32 ids, the positions, default masks)."""
        ids = np.asarray(arrays["input_ids"])
        n, t = ids.shape if ids.ndim == 2 else (0, 0)
        out = {"input_ids": self._ids("input_ids", ids)}
        if "positions" in self._program_inputs:
            out["positions"] = np.broadcast_to(np.arange(t, dtype=np.int32), (n, t))
        if "targets" in self._program_inputs:
            targets = np.asarray(arrays["targets"])
            if targets.shape != ids.shape:  # (the program takes them flat: its message would show [n x t])
                raise ValueError(f"input 'targets': expected shape {ids.shape} (that of input_ids: the next token "
                                 f"of each position), found shape {targets.shape}")
            out["targets"] = self._ids("targets", targets, ignored=-100).reshape(-1)
        if "attention_mask" in self._program_inputs:
            m = arrays.get("attention_mask")
            out["attention_mask"] = np.ones((n, t), np.uint8) if m is None else _mask("attention_mask", m)
        if "token_type_ids" in self._program_inputs:
            tt = arrays.get("token_type_ids")
            out["token_type_ids"] = np.zeros((n, t), np.int32) if tt is None else self._ids("token_type_ids", tt)
        return out

    def _ids(self, name, a, ignored=None):
        """Ids as int32, each an index of its table in config.json (or `ignored`), refused by name otherwise."""
        a = _int32(name, a)
        key, size = self._table_sizes[name]
        if not isinstance(size, int) or not a.size:
            return a
        bad = (a < 0) | (a >= size)
        if ignored is not None:
            bad &= a != ignored
        if bad.any():
            where = tuple(int(k) for k in np.argwhere(bad)[0])
            also = f" or {ignored} (ignored)" if ignored is not None else ""
            raise ValueError(f"input '{name}': expected ids in [0, {size}) (config.json {key}){also}, found "
                             f"{name}[{', '.join(map(str, where))}] = {a[where]}")
        return a

    def loss_output(self):
        return "loss"

    def check_parameters(self, params):
        if params is not None:
            raise ValueError(f"optimizer params: expected None for a Hugging Face directory (every weight trains), "
                             f"found {_check.found(params)}")

    def parameter_names(self, params):
        return None



class _Model:
    """What inferenceModel and trainingModel share: binding a call's arguments, compiling on the first."""

    _training = False

    def __init__(self, model, options):
        if options is None:
            options = Options()
        if not isinstance(options, Options):
            raise ValueError(f"options: expected an aspen.Options, found {type(options).__name__}")
        options._validate()
        self._options = options
        if options._values.get("mpi"):
            _start_mpi()
        self._source = _source_of(model)
        self._program = None
        self._input_names = list(self._source.input_names)

    @property
    def options(self):
        return self._options

    def _per_call(self):
        o = self._options
        n = o.device_iterations * o.replication_factor
        return n * o.gradient_accumulation if self._training else n

    def _bind(self, args, kwargs):
        names = self._input_names
        if len(args) > len(names):
            raise ValueError(f"call: expected at most {len(names)} positional inputs ({', '.join(names)}), "
                             f"found {len(args)}")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ValueError(f"input '{k}': expected one of the model's inputs ({', '.join(names)}), found "
                                 "no input of that name")
            if k in given:
                raise ValueError(f"input '{k}': given twice (by position and by name)")
            given[k] = v
        optional = self._source.optional_inputs()
        missing = [n for n in names if n not in given and n not in optional]
        if missing:
            raise ValueError(f"inputs: expected {', '.join(names)}, found no value for {', '.join(missing)}")
        framework = "numpy"
        arrays = {}
        for name in names:
            if name not in given:
                continue
            v = given[name]
            if self._source.static_argument(name, v):
                continue
            if _is_torch_tensor(v):
                framework = "torch"
                if v.device.type != "cpu":
                    raise ValueError(f"input '{name}': expected a CPU tensor, found one on {v.device}")
                v = v.detach()
            elif not isinstance(v, np.ndarray) and not hasattr(v, "__dlpack__"):
                v = np.asarray(v)
            if isinstance(v, np.ndarray) and v.dtype.kind not in "biufc":
                raise ValueError(f"input '{name}': expected a numeric array, found dtype {v.dtype}")
            arrays[name] = v
        return arrays, framework

    def _synthetic(self, arrays):
        """Options.enableSyntheticData: zeros of the first call's inputs in place of every call's."""
        if not self._options._values.get("synthetic_data"):
            return arrays
        cached = self.__dict__.get("_synthetic_arrays")
        if cached is None:
            cached = {}
            for n, a in arrays.items():
                cached[n] = _module_if_loaded("torch").zeros_like(a) if _is_torch_tensor(a) else np.zeros_like(a)
            self._synthetic_arrays = cached
        for n, a in arrays.items():
            if n not in cached or tuple(a.shape) != tuple(cached[n].shape):
                raise ValueError(f"input '{n}': expected shape {tuple(cached[n].shape) if n in cached else None} "
                                 f"(enableSyntheticData runs every call on the first call's shapes), found "
                                 f"{tuple(a.shape)}")
        return cached

    def _micro_shapes(self, arrays):
        per = self._per_call()
        shapes = {}
        for name, a in arrays.items():
            shape = list(a.shape)
            if per > 1:
                if not shape or shape[0] % per:
                    raise ValueError(
                        f"input '{name}': expected a first dimension that is a multiple of {per} (the micro-batches "
                        f"of a call: {self._call_text()}), found shape {tuple(shape)}")
                shape[0] //= per
            shapes[name] = shape
        return shapes

    def _call_text(self):
        o = self._options
        parts = [f"deviceIterations {o.device_iterations}", f"replicationFactor {o.replication_factor}"]
        if self._training:
            parts.append(f"gradientAccumulation {o.gradient_accumulation}")
        return " x ".join(parts)

    def _example(self, arrays, shapes):
        """One micro-batch of each input (what a framework's exporter traces)."""
        return {name: a[: shapes[name][0]] if shapes[name] and len(a.shape) else a for name, a in arrays.items()}

    def _export(self, example, training, loss_kind):
        """The source's ONNX file for one micro-batch; a torch module's export also follows the execution
        strategy (training) and Precision.halfFloatCasting (NOTE [half float casting], _torch.py)."""
        if not hasattr(self._source, "stages"):  # not a torch module
            return self._source.export(example, training=training, loss_kind=loss_kind)
        return self._source.export(example, training=training, loss_kind=loss_kind,
                                   strategy=self._options._strategy if training else None,
                                   half_casting=self._options._half_casting)

    def _compile(self, arrays):
        raise NotImplementedError

    def _compile_for(self, arrays):
        """Compiles for these inputs (kept for attachToDevice, which compiles for their shapes again)."""
        self._compile(arrays)
        self._attach_example = dict(arrays)

    def isAttachedToDevice(self):
        """Whether the model holds its compiled program (False after detachFromDevice until it is attached or
        called again)."""
        return self._program is not None

    def attachToDevice(self):
        """After detachFromDevice: compiles again now, for the shapes it last ran with, with the weights and
        optimizer state it had (the next call would do it otherwise)."""
        if self._program is not None:
            raise RuntimeError("attachToDevice: expected a model detached from its device (detachFromDevice), "
                               "found it attached")
        example = getattr(self, "_attach_example", None)
        if example is None:
            raise RuntimeError("attachToDevice: expected a model compiled before, found one never compiled (call "
                               "it, or compile(), first)")
        self._compile_for(example)

    def isCompiled(self):
        return self._program is not None

    def detachFromDevice(self):
        """Frees the compiled program and its device memory; the next call compiles again. A training
        model first copies its weights to the host and keeps them, with its optimizer state (moments, step
        count), which the next compile puts back, so training goes on as if it had stayed, whatever the
        model came from (an ONNX file, whose weights have no host model to go to, included)."""
        if self._program is not None and self._training:
            self._check_detachable()
            self.copyWeightsToHost()
            self._saved_state = (self._program.optimizer_state(), self._program.steps_done, self._program.weights())
        self._program = None

    def _check_detachable(self):
        """Raises, before anything is freed, for a source whose training cannot come back."""

    def destroy(self):
        self._program = None
        self._source.close()

    def copyWeightsToDevice(self):
        """The host model's current weights onto the device (after changing them in the framework)."""
        if self._program is not None:
            self._program.set_weights(self._source.host_weights())

    def __del__(self):
        source = getattr(self, "_source", None)
        if source is not None:
            source.close()


class InferenceModel(_Model):
    """A compiled inference program (poptorch.inferenceModel's result): call it like the model."""

    def __call__(self, *args, **kwargs):
        arrays, framework = self._bind(args, kwargs)
        arrays = self._synthetic(arrays)
        if _TRAINERS:
            self._follow_trainers()
        if self._program is None:
            self._compile_for(arrays)
        out = self._program.run(self._source.feeds(arrays))
        return self._source.outputs(out, framework)

    def _follow_trainers(self):
        """NOTE [implicit weight sync]: newer weights of a training model of the same module, here first."""
        mine = getattr(self._source, "module", None)
        if mine is None:
            return
        seen = self.__dict__.setdefault("_trainer_versions", {})
        for module, ref in list(_TRAINERS.items()):
            trainer = ref()
            if trainer is None or trainer._calls == 0 or seen.get(id(trainer)) == trainer._calls:
                continue
            if not (module is mine or any(m is mine for m in module.modules())
                    or any(m is module for m in mine.modules())):
                continue
            trainer._sync_host()
            if self._program is not None:
                self.copyWeightsToDevice()
            seen[id(trainer)] = trainer._calls

    def compile(self, *args, **kwargs):
        """Compiles for these inputs' shapes without running."""
        arrays, _ = self._bind(args, kwargs)
        self._compile_for(arrays)

    def _compile(self, arrays):
        if isinstance(self._source, _HfDirectory):
            self._program = self._source.compile(arrays, self._per_call(), self._options._resolved(False), None)
            return
        shapes = self._micro_shapes(arrays)
        path = self._export(self._example(arrays, shapes), training=False, loss_kind=None)
        with self._source.naming_errors(path):
            self._program = _aspen.OnnxProgram(path, shapes, Options.check_partials(self._source.resolve_options(self._options._resolved(False))))


class TrainingModel(_Model):
    """A compiled training program (poptorch.trainingModel's result). Each call makes deviceIterations
    optimizer steps of gradientAccumulation micro-batches (on each replica) and returns the losses by the
    output mode (Final by default: the last step's loss)."""

    _training = True

    def __init__(self, model, options, optimizer, loss):
        super().__init__(model, options)
        from . import optim
        if optimizer is None:
            optimizer = optim.AdamW(None, lr=1e-3)
        self._user_optimizer = optimizer
        optimizer = _check_optimizer("optimizer", optimizer)
        self._source.check_parameters(optimizer.params)
        self._optimizer = optimizer
        self._settings = optimizer._settings()
        self._loss = self._loss_of(loss)
        if "kind" in self._loss:
            self._input_names.append(self._loss["targets"])
        if isinstance(self._source, _HfDirectory):
            if self._source.model_type not in ("gpt2", "gptj", "llama", "mistral", "qwen2"):
                raise ValueError(f"model '{self._source.path}': expected a model that trains here (gpt2, gptj, "
                                 "llama, mistral, qwen2), "
                                 f"found model_type {self._source.model_type}")
            if "kind" in self._loss:
                raise ValueError("loss: expected none for a Hugging Face directory (the model's own loss over "
                                 f"targets), found {loss!r}")
            self._input_names.append("targets")
        self._calls = 0  # training calls made; _host_calls: how many the host's weights have seen
        self._host_calls = 0
        module = getattr(self._source, "module", None)
        if module is not None:
            _TRAINERS[module] = weakref.ref(self)
            me = weakref.ref(self)

            def sync_before_state_dict(*_):
                t = me()
                if t is not None:
                    t._sync_host()
            for m in module.modules():
                m.register_state_dict_pre_hook(sync_before_state_dict)

    def _sync_host(self):
        """The device's weights into the host module, when it has trained since they were last copied."""
        if self._program is not None and self._host_calls != self._calls:
            self.copyWeightsToHost()

    def _loss_of(self, loss):
        if loss is None:
            loss = self._source.compiled_loss()  # a Keras model's compiled loss
        if loss is None:
            out = self._source.loss_output()
            if out is None:
                raise ValueError("loss: expected a model that computes its loss (a torch module whose forward "
                                 "returns (output, loss), an ONNX file with an output 'loss'), or loss= one of "
                                 f"{', '.join(_LOSS_KINDS)} or the name of the output that is the loss; found none")
            return {"output": out}
        if isinstance(loss, str) and loss in _LOSS_KINDS:
            return {"kind": loss, "targets": "targets"}
        if isinstance(loss, dict):
            d = dict(loss)
            for k in d:
                if k not in _LOSS_KEYS:
                    raise ValueError(f"loss[{k!r}]: expected one of the keys {', '.join(_LOSS_KEYS)}, found an "
                                     "unknown key")
            if d.get("kind") not in _LOSS_KINDS:
                raise ValueError(f"loss['kind']: expected one of {', '.join(_LOSS_KINDS)}, found {d.get('kind')!r}")
            d.setdefault("targets", "targets")
            _check.string("loss['targets']", d["targets"])
            if "output" in d:
                _check.string("loss['output']", d["output"])
            if "ignore_index" in d:
                if d["kind"] != "cross_entropy":
                    raise ValueError(f"loss['ignore_index']: expected only with kind cross_entropy, found it with "
                                     f"kind {d['kind']}")
                d["ignore_index"] = _check.integer("loss['ignore_index']", d["ignore_index"], _check.INT32_MIN,
                                                   _check.INT32_MAX)
            return d
        if isinstance(loss, str):
            if loss not in self._source.output_names:
                raise ValueError(f"loss '{loss}': expected {', '.join(_LOSS_KINDS)} or an output of the model "
                                 f"({', '.join(self._source.output_names)}), found neither")
            return {"output": loss}
        raise ValueError(f"loss: expected a string or a dict, found {loss!r}")

    def __call__(self, *args, **kwargs):
        arrays, framework = self._bind(args, kwargs)
        arrays = self._synthetic(arrays)
        if self._program is None:
            self._compile_for(arrays)
        ran = self._program.run(self._source.feeds(arrays))
        out = ran["loss"]
        self._calls += 1
        if hasattr(self._user_optimizer, "param_groups") and not isinstance(self._user_optimizer, Optimizer):
            self._user_optimizer._opt_called = True  # a torch optimizer stepped (on the device): its schedulers know
        if self._outputs:  # NOTE [training outputs]: what forward returns, (output, loss) as PopTorch returns it
            values = {n: self._by_mode(ran[n]) for n in self._outputs}
            values[self._loss["output"]] = out
            return self._source.outputs(values, framework)
        if framework == "torch":
            import torch
            return torch.from_numpy(out)
        return out

    def compile(self, *args, **kwargs):
        arrays, _ = self._bind(args, kwargs)
        self._compile_for(arrays)

    # NOTE [training outputs]: a torch module's training call returns what its forward returns, as PopTorch's
    # does (`output, loss = model(x, y)`): the program outputs each of forward's other outputs for every
    # micro-batch (train::TrainingOptions::outputs), and the output mode picks from them as it picks the
    # losses: All every micro-batch's (merged on the first dimension, in the inputs' order), Final the last
    # micro-batch of each replica, Sum their sum over the steps' micro-batches (per replica), EveryN the last
    # micro-batch of every N-th step. An ONNX file, a Keras model and a loss aspen adds (loss="mse") return
    # the loss alone. With pipeline stages each output comes from its stage; not with tensor shards (refused by name).
    _outputs = ()

    def _by_mode(self, a):
        o = self._options
        R, iters, acc = o.replication_factor, o.device_iterations, o.gradient_accumulation
        mode = o.output_mode
        per = tuple(a.shape[1:])
        if mode is OutputMode.All:
            sel = a
        elif mode in (OutputMode.Final, OutputMode.Default):
            sel = a[-R:]
        elif mode is OutputMode.Sum:
            sel = a.reshape((iters * acc, R) + per).sum(0)
        else:  # EveryN
            n = o._values["output_every_n"]
            sel = a.reshape((iters, acc, R) + per)[n - 1::n, -1].reshape((-1,) + per)
        k = sel.shape[0]
        if per:
            return sel.reshape((k * per[0],) + per[1:])
        return sel[0] if k == 1 else sel

    def _compile(self, arrays):
        training = dict(self._settings)
        training["reduction"] = self._options._reduction
        if "groups" in training and isinstance(self._source, _HfDirectory):
            raise NotImplementedError("parameter groups of a Hugging Face directory's training model: not supported "
                                      "(one group: its parameters all step alike)")
        if isinstance(self._source, _HfDirectory):
            self._program = self._source.compile(arrays, self._per_call(), self._options._resolved(True), training)
            return
        shapes = self._micro_shapes(arrays)
        model_inputs = {n: a for n, a in arrays.items() if n != self._loss.get("targets")}
        example = self._example(model_inputs, shapes)
        strategy = self._options._strategy
        if strategy is not None and not hasattr(self._source, "stages"):
            raise NotImplementedError(f"setExecutionStrategy: blocks of a torch module's forward make the stages; "
                                      f"{self._source.describe()} has none")
        cut = self._options._pipeline
        if cut is not None and hasattr(self._source, "stages"):
            raise NotImplementedError("setPipelineStages: a torch module's stages are its blocks: use "
                                      "aspen.poptorch.Block / BeginBlock and setExecutionStrategy")
        if cut is not None:
            training.update(self._source.cut(cut[0]))
        path = self._export(example, training=True, loss_kind=self._loss.get("kind"))
        options = self._source.resolve_options(self._options._resolved(True))
        stages = getattr(self._source, "stages", 1) if cut is None else len(cut[0]) + 1
        if stages > 1:  # NOTE [blocks in the export]: a device per stage
            training["pipeline_stages"] = stages
            training["pipeline_schedule"] = (strategy.schedule if strategy is not None else
                                             cut[1] if cut is not None else "1f1b")
            if not self._options._values.get("threads"):  # NOTE [python cores]: the cores shared by the stages
                from . import CPUS
                options["threads"] = max(1, CPUS // (self._options.replication_factor * stages))
        if self._options._anchors_gradients():
            training["keep_gradients"] = True  # anchored gradients: the split step keeps them
        if "output" in self._loss and getattr(self._source, "module", None) is not None:
            self._outputs = tuple(n for n in self._source.output_names if n != self._loss["output"])
            if self._outputs:
                training["outputs"] = list(self._outputs)
        trained = self._source.parameter_names(self._optimizer.params)
        if "groups" in training:  # NOTE [parameter groups]: each group's parameters by their names in the file
            training["groups"] = [dict(g, params=self._source.parameter_names(ps)) for g, ps in
                                  zip(training["groups"], self._optimizer.group_params[1:])]
        with self._source.naming_errors(path):
            self._program = _aspen.OnnxProgram(path, {n: shapes[n] for n in model_inputs},
                                               Options.check_partials(options), training, self._loss, trained)
        self._restore_state()

    def _group_names(self, optimizer):
        """Each parameter group's parameters beyond the first, by name (or by identity before an export)."""
        return [sorted(p if isinstance(p, str) else str(id(p)) for p in ps)
                for ps in getattr(optimizer, "group_params", [[]])[1:]]

    def _check_detachable(self):
        if isinstance(self._source, _HfDirectory):
            raise NotImplementedError("detachFromDevice of a Hugging Face directory's training model: its "
                                      "program cannot take its trained weights back yet (the model stays on the "
                                      "device; copy the weights out with weights() first if you need them)")

    def _restore_state(self):
        """After detachFromDevice: the weights and optimizer state the model had."""
        saved = getattr(self, "_saved_state", None)
        if saved is not None:
            state, steps, weights = saved
            self._program.set_weights(weights)
            self._program.set_optimizer_state(state, steps)
            self._saved_state = None

    def setOptimizer(self, optimizer):
        """A new learning rate (optimizer.param_groups[0]["lr"]) without recompiling. Other settings
        belong to the compiled program: changing them is an error."""
        user = optimizer
        optimizer = _check_optimizer("setOptimizer: optimizer", optimizer)
        settings = optimizer._settings()
        for k, v in settings.items():
            if k not in ("lr", "groups") and self._settings.get(k) != v:
                raise ValueError(f"setOptimizer: {k}: expected {self._settings.get(k)!r} (only the learning rate "
                                 f"changes without recompiling), found {v!r}")
        names = self._group_names(optimizer)
        if names != self._group_names(self._optimizer):  # which parameters each group holds: fixed at compile
            raise NotImplementedError("setOptimizer: parameter groups: expected each group to hold the parameters "
                                      "it held when the program was compiled, found other parameters in a group")
        if not same_groups(self._settings.get("groups"), settings.get("groups"),
                           rates_zero=settings["lr"] == 0):  # NOTE [parameter groups]
            raise NotImplementedError(
                f"setOptimizer: parameter groups: expected {self._settings.get('groups')!r} (their settings and "
                f"learning-rate ratios to the first group's, fixed at compile; rates change in proportion), found "
                f"{settings.get('groups')!r}")
        self._settings = settings
        self._optimizer = optimizer
        self._user_optimizer = user
        if self._program is not None:
            self._program.set_learning_rate(settings["lr"])

    def copyWeightsToHost(self):
        """The trained weights back into the model: the torch module's parameters, the Keras model's
        variables (an ONNX file is left as it is: see exportOnnx)."""
        if self._program is not None:
            self._source.copy_to_host(self._program.weights())
            self._host_calls = self._calls

    def _trained_names(self):
        """The trained parameters: the user's name (a torch module's) -> the name in the program."""
        files = self._source.parameter_names(self._optimizer.params)
        by_file = {f: m for m, f in getattr(self._source, "_file_name", {}).items()}
        return {by_file.get(f, f): f for f in files}

    def getTensorNames(self):
        """The tensors options.anchorTensor can name: "Gradient___<parameter>" (with a Gradient___ anchor) and
        "UpdatedVar___<parameter>" for each trained parameter (PopTorch's names)."""
        if self._program is None:
            raise RuntimeError("getTensorNames: the model has not been compiled (call it, or compile(), first)")
        names = list(self._trained_names())
        return ([f"Gradient___{n}" for n in names] if self._options._anchors_gradients() else []) + [f"UpdatedVar___{n}" for n in names]

    def getAnchoredTensor(self, short_name):
        """An anchored tensor's value after the last call (options.anchorTensor(short_name, long_name))."""
        anchors = self._options._anchors
        if short_name not in anchors:
            raise ValueError(f"getAnchoredTensor: expected an anchored name ({', '.join(anchors) or 'none anchored'}: "
                             f"Options.anchorTensor), found {short_name!r}")
        if self._program is None or self._calls == 0:
            raise RuntimeError("getAnchoredTensor: the model has not run a step yet")
        long_name = anchors[short_name]
        kind, param = long_name.split("___", 1)
        names = self._trained_names()
        if param not in names:
            raise ValueError(f"getAnchoredTensor({short_name!r}): {long_name!r}: expected a trained parameter "
                             f"({', '.join(names)}), found {param!r}")
        values = self._program.gradients() if kind == "Gradient" else self._program.weights()
        value = values[names[param]]
        module = getattr(self._source, "module", None)
        if module is None:
            return value
        import torch
        p = dict(module.named_parameters())[param]
        return torch.from_numpy(np.ascontiguousarray(value)).reshape(p.shape)

    def weights(self):
        """The device's weights by name, as numpy arrays."""
        if self._program is None:
            raise RuntimeError("weights: the model has not been compiled (call it, or compile(), first)")
        return self._program.weights()

    def exportOnnx(self, path):
        """A copy of the compiled ONNX file with the trained weights."""
        if self._program is None:
            raise RuntimeError("exportOnnx: the model has not been compiled (call it, or compile(), first)")
        self._program.export_onnx(_check.path("exportOnnx: path", path))

    def lastSteps(self):
        """What the last call did, step by step (loss, lr, grad_norm, loss_scale, skipped)."""
        return self._program.last_steps() if self._program is not None else []


def _check_optimizer(name, optimizer):
    """The aspen optimizer for `optimizer`: itself, or a torch.optim optimizer's (optim.from_torch)."""
    from . import optim
    if isinstance(optimizer, optim.Optimizer):
        return optimizer
    torch = _module_if_loaded("torch")
    if torch is not None and isinstance(optimizer, torch.optim.Optimizer):
        return optim.from_torch(optimizer)
    kind = "None" if optimizer is None else f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    raise ValueError(f"{name}: expected an aspen.optim optimizer (SGD, AdamW, LAMB) or a torch.optim one (SGD, "
                     f"Adam, AdamW), found {kind}")


def inferenceModel(model, options=None):
    """An inference program for `model` (an ONNX file, a torch.nn.Module or a Keras model); it compiles at
    its first call."""
    return InferenceModel(model, options)


def trainingModel(model, options=None, optimizer=None, loss=None):
    """A training program for `model`. `loss`: None when the model computes its own (a torch module whose
    forward returns (output, loss); an ONNX file's output 'loss'); "cross_entropy" or "mse" over the model's
    first output, with the targets as one more input named "targets" (also a dict with "kind", "output",
    "targets", "ignore_index"); or the name of the output that is the loss."""
    return TrainingModel(model, options, optimizer, loss)
