"""A torch.nn.Module as an aspen model: exported with torch.onnx at the first call (imported only then)."""

import contextlib
import inspect
import io
import logging
import os
import shutil
import tempfile
import warnings

import numpy as np
import torch
import torch.utils._pytree as pytree

from . import _blocks
from ._source import Source
from .options import HalfFloatCastingBehavior


class TorchSource(Source):
    def __init__(self, module):
        self.module = module
        sig = inspect.signature(module.forward)
        self.input_names = []
        self._optional = set()
        for p in sig.parameters.values():
            if p.kind == p.VAR_POSITIONAL:
                raise NotImplementedError(f"{type(module).__name__}.forward: *{p.name} arguments are not supported "
                                          "(inputs are named by forward's parameters)")
            if p.kind == p.VAR_KEYWORD:
                continue  # a Hugging Face model's **kwargs: its inputs are its named parameters
            self.input_names.append(p.name)
            if p.default is not p.empty:
                self._optional.add(p.name)  # left out, forward's default (None: HF's labels, masks, ...)
        self.output_names = []
        self._spec = None
        self._dir = None
        self._static = {}  # forward's non-array arguments, as given
        self._half = False  # the exported module's parameters were f16 (NOTE [half modules])
        self._output_types = None  # forward's output types under _DowncastMixed (NOTE [half float casting])
        self._state_files = set()  # initializers the program updates (a training batch norm's statistics)
        self._state_buffers = set()  # module buffers among those (named as their initializers)
        self._exported = False
        self._file_name = {}  # module parameter name -> its initializer's name in the exported file
        self.stages = 1  # pipeline stages the module's blocks make (NOTE [blocks in the export])

    def optional_inputs(self):
        return self._optional

    # NOTE [half modules]: a module made half (model.half(), PopTorch's mixed-precision tutorial) is exported
    # from a float32 copy and compiled with float16 compute (Precision.setComputeType, unless set): its
    # matmuls run in f16 while f32 master weights train, as PopTorch keeps them; half inputs are fed as
    # float32, outputs come back half, and copyWeightsToHost rounds the master weights into the half
    # parameters. Loss scaling is the optimizer's (loss_scaling=, 'dynamic' included). Whether the module is
    # half is read once, at the export the program is compiled from (not on every call).
    def resolve_options(self, options):
        if self._half and "precision" not in options:
            options = dict(options, precision="f16")
        return options

    def feeds(self, arrays):
        if not self._half:
            return arrays
        out = {}
        for n, a in arrays.items():
            if isinstance(a, torch.Tensor) and a.dtype == torch.float16:
                a = a.float()
            elif isinstance(a, np.ndarray) and a.dtype == np.float16:
                a = a.astype(np.float32)
            out[n] = a
        return out

    def describe(self):
        return f"{type(self.module).__name__} (exported by torch.onnx)"

    # NOTE [half float casting]: PopTorch 2.x's Precision.halfFloatCasting. Under FloatDowncastToHalf (its
    # default) an op whose floating operands mix float32 and float16 computes in float16, the float32 ones
    # cast down; under HalfUpcastToFloat torch's promotion holds (float32). When a call's floating inputs mix
    # the two (the module not half: NOTE [half modules]), the eager pass and the export run forward under
    # _DowncastMixed, a torch function mode that casts the float32 tensor arguments of each mixed call, and
    # torch.export records the casts: the program takes each input in its own type and returns what forward
    # returns under the mode (x + y of a float32 x and a half y: half); outputs come back in the types forward
    # returned (torch.onnx writes some ops of half operands, mse_loss, with a float32 result).
    # Calls that change a tensor in place (x.add_(h), x[i] = h, x += h, batch_norm's running statistics) or
    # take a type from a tensor (h.type_as(x), h.to(x)) keep torch's meaning. The exporter's optimizer is off
    # then: it folds a parameter's cast into a new initializer, and the parameter would lose its name
    # (copyWeightsToDevice, NOTE [implicit weight sync]). Other calls run without the mode, as before.
    def _downcasts(self, inputs, half_casting):
        """Whether forward runs under _DowncastMixed for these inputs (NOTE [half float casting])."""
        return (half_casting is HalfFloatCastingBehavior.FloatDowncastToHalf and not self._half
                and _mixes_floats(inputs))

    def static_argument(self, name, value):
        """A Python setting (use_cache=False, return_dict=True, a float scale) goes to forward as it is, at the
        export; the program is compiled for it, and another value in a later call is refused by name."""
        if not (value is None or isinstance(value, (bool, str, int, float))):
            return False
        if name in self._static and self._static[name] != value and self._exported:
            raise ValueError(f"input '{name}': expected {self._static[name]!r} (the value the program was compiled "
                             f"with; a setting, not an array), found {value!r}")
        self._static[name] = value
        return True

    def _training_batch_norms(self):
        """The batch norm layers in training mode, by module path; refused by name where aspen cannot follow
        torch (no running statistics, or momentum None: a cumulative average)."""
        found = {}
        for name, m in self.module.named_modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training:
                if not m.track_running_stats or m.momentum is None:
                    raise NotImplementedError(
                        f"{type(self.module).__name__}.{name} ({type(m).__name__}): expected a batch norm with "
                        f"running statistics and a momentum, found track_running_stats={m.track_running_stats}, "
                        f"momentum={m.momentum}")
                found[name] = m
        return found

    def _mark_training_batch_norms(self, model, norms, saved):
        """NOTE [batch norm in training] (models/onnx_ops_nn.cc): torch.onnx writes a batch norm of a module in
        training mode as inference's node; its nodes (in the loaded ONNX `model`) are marked training_mode 1
        (with torch's momentum and unbiased running variance), found by the layer path torch.onnx records in
        each node's metadata."""
        from onnx import helper, numpy_helper
        for init in model.graph.initializer:  # the statistics as they were before the export ran forward
            if init.name in saved:
                init.CopyFrom(numpy_helper.from_array(saved[init.name].float().numpy().reshape(tuple(init.dims)),
                                                      init.name))
        nodes = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
        marked = set()
        for n in nodes:
            meta = {p.key: p.value for p in n.metadata_props}
            # Each scope is an enclosing module's full path ('', 'net', 'net.bn1'), then the op.
            scopes = _blocks.name_scopes(meta.get("pkg.torch.onnx.name_scopes", ""))
            layer = scopes[-2] if len(scopes) >= 2 else ""
            if layer not in norms:
                if len(norms) == sum(1 for _ in nodes) and not meta:
                    layer = list(norms)[len(marked)]  # no metadata: the layers in order
                else:
                    continue
            m = norms[layer]
            self._state_files.update(n.input[3:5])  # the running statistics' initializers
            keep = [a for a in n.attribute if a.name not in ("training_mode", "momentum")]
            del n.attribute[:]
            n.attribute.extend(keep + [helper.make_attribute("training_mode", 1),
                                       helper.make_attribute("momentum", 1.0 - float(m.momentum)),
                                       helper.make_attribute("aspen_unbiased_running_var", 1)])
            marked.add(layer)
        missing = sorted(set(norms) - marked)
        if missing:
            raise NotImplementedError(f"{type(self.module).__name__}.{missing[0]}: a batch norm in training mode "
                                      "whose node aspen could not find in torch.onnx's export")

    def export(self, example, training, loss_kind, strategy=None,
               half_casting=HalfFloatCastingBehavior.Default):
        """Exports forward for one micro-batch of these inputs; returns the .onnx path. A training model whose
        forward enters blocks has its nodes tagged with their stages (NOTE [blocks in the export]; `strategy`:
        an aspen.poptorch execution strategy or None), and self.stages says how many. `half_casting`: the
        type of an op mixing float32 and float16 (NOTE [half float casting])."""
        args = {n: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for n, a in example.items()}
        module = self.module
        self._half = any(p.dtype == torch.float16 for p in module.parameters())
        if self._half:  # NOTE [half modules]: exported from a float32 copy
            import copy
            module = copy.deepcopy(self.module).float()
            args = {n: a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.float16 else a
                    for n, a in args.items()}
        names = [n for n in self.input_names if n in args]
        given = {n: args[n] for n in names}  # by name: an input left out keeps forward's default
        # A Hugging Face model returns its KV cache unless told not to: the compiled program keeps its own.
        if "use_cache" in self.input_names and "use_cache" not in self._static:
            self._static["use_cache"] = False
        statics = dict(self._static)
        downcast = self._downcasts(given.values(), half_casting)
        casting = _DowncastMixed() if downcast else contextlib.nullcontext()
        was_training = module.training
        norms = self._training_batch_norms() if training else {}
        self._state_files = set()
        # A batch norm in training mode updates its running statistics on every forward, the export's own
        # included: they are put back after it, in the module and in the file.
        saved = {n: b.detach().clone() for n, b in module.named_buffers()} if norms else {}
        if not training:
            module.eval()
        try:
            with torch.no_grad(), _blocks.recording() as blocks, casting:
                out = module(**given, **statics)
            self.stages = 1
            stage_of_block = (_blocks.stages_of(blocks.blocks, strategy)
                              if training and (blocks.blocks or strategy is not None) else None)
            leaves, self._spec = pytree.tree_flatten(out)
            for i, leaf in enumerate(leaves):
                if not isinstance(leaf, torch.Tensor):
                    raise ValueError(f"{type(self.module).__name__}.forward: output {i}: expected tensors, found "
                                     f"{type(leaf).__name__}")
            self.output_names = [f"output{i}" for i in range(len(leaves))]
            self._output_types = [leaf.dtype for leaf in leaves] if downcast else None
            if training and loss_kind is None:
                # PopTorch's convention, the loss last; a Hugging Face output names it ("loss", with labels=).
                at = len(leaves) - 1
                if hasattr(out, "keys") and "loss" in out.keys() and out["loss"] is not None:
                    at = next(i for i, leaf in enumerate(leaves) if leaf is out["loss"])
                if leaves[at].dim() != 0:
                    raise ValueError(f"{type(self.module).__name__}.forward: expected (output, loss) or a loss, the "
                                     f"loss a scalar (PopTorch's convention; a Hugging Face model's with labels=), "
                                     f"found a last output of shape {tuple(leaves[at].shape)} (or pass "
                                     f"loss='cross_entropy' or 'mse')")
                self.output_names[at] = "loss"
            self.close()
            self._dir = tempfile.mkdtemp(prefix="aspen-torch-")
            path = os.path.join(self._dir, "model.onnx")
            # For training, without the exporter's optimizer: it folds a transposed weight into a new
            # initializer (val_N), and a parameter must keep its module's name to be trained and copied back.
            # The exporter's progress lines and warnings are kept, and shown only if it fails.
            chatter = io.StringIO()
            onnx_log = logging.getLogger("torch.onnx")
            level = onnx_log.level
            onnx_log.setLevel(logging.ERROR)
            try:
                with warnings.catch_warnings(), contextlib.redirect_stdout(chatter), casting:
                    warnings.simplefilter("ignore")
                    traced = module
                    if stage_of_block:  # NOTE [blocks in the export]
                        with _blocks.tracing():
                            traced = torch.export.export(module, (), kwargs={**given, **statics}, strict=False)
                        _blocks.scope_nodes(traced)
                    torch.onnx.export(traced, (), path, kwargs={**given, **statics}, input_names=names,
                                      output_names=self.output_names, dynamo=True, external_data=False,
                                      verbose=False, optimize=not training and not downcast)
            except Exception as e:
                raise RuntimeError(f"torch.onnx.export of {type(self.module).__name__} failed: {e}\n"
                                   f"{chatter.getvalue()}") from e
            finally:
                onnx_log.setLevel(level)
            if stage_of_block or norms:  # the file rewritten once: stages first (their scopes out of the way)
                import onnx
                model = onnx.load(path)
                if stage_of_block:
                    self.stages = _blocks.tag_stages(model, stage_of_block)
                if norms:
                    with torch.no_grad():
                        for n, b in module.named_buffers():
                            b.copy_(saved[n])
                    self._mark_training_batch_norms(model, norms, saved)
                onnx.save(model, path)
            self._names_in_file(path)
            self._exported = True
        finally:
            module.train(was_training)
        return path

    def _names_in_file(self, path):
        """Each parameter's name in the exported file: a tied parameter (GPT-2's lm_head and wte) has several
        names in the module and is one initializer under one of them."""
        from . import _aspen
        initializers = set(_aspen.onnx_signature(path)["initializers"])
        aliases = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        self._file_name = {}
        for name, p in self.module.named_parameters():
            found = [a for a in aliases[id(p)] if a in initializers]
            if found:
                self._file_name[name] = found[0]
        # Buffers the program updates (a training batch norm's running statistics), by their file names.
        self._state_buffers = {name for name, _ in self.module.named_buffers()
                               if name in initializers and name in self._state_files}

    def loss_output(self):
        return "loss"

    def check_parameters(self, params):
        """Each entry a parameter of the module, or the name of one (a misspelt name was once dropped)."""
        from . import _check
        named = dict(self.module.named_parameters(remove_duplicate=False))
        ids = {id(p) for p in named.values()}
        for k, p in enumerate(params or ()):
            if isinstance(p, str):
                if p not in named:
                    raise ValueError(f"optimizer params[{k}]: expected a parameter name of "
                                     f"{type(self.module).__name__} ({_check.listing(named)}), found {p!r}")
            elif not isinstance(p, torch.Tensor):
                raise ValueError(f"optimizer params[{k}]: expected a parameter of {type(self.module).__name__} or "
                                 f"its name, found {_check.found(p)}")
            elif id(p) not in ids:
                raise ValueError("optimizer params: expected parameters of the module being trained, found a tensor "
                                 f"of shape {tuple(p.shape)} that is not one")

    def parameter_names(self, params):
        """The names of the parameters the optimizer trains (all that require grad when params is None)."""
        named = list(self.module.named_parameters())
        by_id = {id(p): n for n, p in named}
        aliases = {n: by_id[id(p)] for n, p in self.module.named_parameters(remove_duplicate=False)}
        chosen = []
        for p in (self.module.parameters() if params is None else params):
            if isinstance(p, str):
                chosen.append(aliases[p])
            elif p.requires_grad:
                chosen.append(by_id[id(p)])
        # A parameter forward never reads is not in the file: nothing to train.
        return [self._file_name[n] for n in chosen if n in self._file_name]

    def outputs(self, values, framework):
        leaves = [values[n] for n in self.output_names]
        if self._half:  # NOTE [half modules]: a half module's outputs are half
            leaves = [v.astype(np.float16) if v.dtype == np.float32 else v for v in leaves]
        if self._output_types is not None:  # NOTE [half float casting]: the types forward returned
            leaves = [v.astype(_NUMPY_FLOATS[t]) if t in _NUMPY_FLOATS and v.dtype in _NUMPY_FLOATS.values() else v
                      for v, t in zip(leaves, self._output_types)]
        if framework == "torch":
            leaves = [torch.from_numpy(v) for v in leaves]
        return pytree.tree_unflatten(leaves, self._spec)

    def host_weights(self):
        out = {self._file_name[n]: p.detach().float().contiguous().numpy() for n, p in self.module.named_parameters()
               if n in self._file_name}
        for n, b in self.module.named_buffers():
            if n in self._state_buffers:
                out[n] = b.detach().float().contiguous().numpy()
        return out

    def copy_to_host(self, weights):
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                w = weights.get(self._file_name.get(name, name))
                if w is None:
                    continue  # not a parameter of the program (unused by forward, or folded away)
                p.copy_(torch.from_numpy(w).reshape(p.shape))
            for name, b in self.module.named_buffers():  # running statistics the program updated
                w = weights.get(name) if name in self._state_buffers else None
                if w is not None:
                    b.copy_(torch.from_numpy(w).reshape(b.shape))

    def close(self, _rmtree=shutil.rmtree):  # bound now: at interpreter exit the module's globals may be gone
        if self._dir is not None:
            _rmtree(self._dir, ignore_errors=True)
            self._dir = None


# Calls that keep their float32 arguments, besides in-place ones named with a trailing _ (NOTE [half float
# casting]); torch runs batch_norm's half input with float32 running statistics, which it updates in place.
_KEEPS_TYPES = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                "__ipow__", "__imatmul__", "to", "type", "type_as", "batch_norm", "instance_norm"}
_NUMPY_FLOATS = {torch.float32: np.float32, torch.float16: np.float16}


def _mixes_floats(values):
    """Whether the tensors among `values` include both float32 and float16 ones."""
    dtypes = {v.dtype for v in values if isinstance(v, torch.Tensor)}
    return torch.float32 in dtypes and torch.float16 in dtypes


def _half_of_float(t):
    return t.half() if t.dtype == torch.float32 else t


class _DowncastMixed(torch.overrides.TorchFunctionMode):
    """NOTE [half float casting]: each call whose tensor arguments (in lists and tuples too) mix float32 and
    float16 gets its float32 ones as float16. Inside the handler the mode is off: the casts and the call's
    own inner calls are torch's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _mixes_floats(pytree.tree_leaves((args, kwargs))) and "out" not in kwargs:
            name = getattr(func, "__name__", "")
            if name not in _KEEPS_TYPES and not (name.endswith("_") and not name.startswith("__")):
                args, kwargs = pytree.tree_map_only(torch.Tensor, _half_of_float, (args, kwargs))
        return func(*args, **kwargs)
