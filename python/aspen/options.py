"""aspen.Options: how a model is compiled and run, with PopTorch's names.

    opts = aspen.Options()
    opts.deviceIterations(4).replicationFactor(2)
    opts.Training.gradientAccumulation(8)
    opts.outputMode(aspen.OutputMode.All)
    opts.enableExecutableCaching("~/.cache/aspen/exe")

An option aspen does not have is an AttributeError naming it (and saying when it is a PopTorch option aspen
does not support), never silently ignored. Values are checked when set (ValueError) and again, against each
other, when the model compiles.
"""

import copy
import enum
import os
import warnings

from . import _check

__all__ = ["Options", "OutputMode", "ReductionType", "HalfFloatCastingBehavior"]


class OutputMode(enum.Enum):
    """Which steps' outputs a call returns (poptorch.OutputMode)."""

    All = "all"  # every step's, stacked on the combined batch
    Final = "final"  # the last step's
    Sum = "sum"  # the sum over the steps
    EveryN = "every_n"  # every N-th step's (outputMode(OutputMode.EveryN, N))
    Default = "default"  # All for inference, Final for training (PopTorch's defaults)


class HalfFloatCastingBehavior(enum.IntEnum):
    """The type of an op whose floating operands mix float32 and float16 (poptorch.HalfFloatCastingBehavior,
    PopTorch 2.x's values): Precision.halfFloatCasting."""

    FloatDowncastToHalf = 0  # float16: the float32 operands are cast down (PopTorch's default)
    HalfUpcastToFloat = 1  # float32: torch's own type promotion
    Default = FloatDowncastToHalf


class ReductionType(enum.Enum):
    """How the gradients of micro-batches and replicas combine (poptorch.ReductionType)."""

    Mean = "mean"
    Sum = "sum"


# PopTorch options that aspen does not have: asking for one says so by name.
_POPTORCH_ONLY = {
    "useOfflineIpuTarget", "setAutomaticLoadBalancing",
    "relaxOptimizerAttributesChecks", "lazyCompilation", "sendOnlyUsedParameters",
    "updatableNamedBuffers",
}

# IPU settings a PopTorch program sets that mean nothing on a CPU: accepted, and reported once each
# (warnings.warn) as having no effect, so that the program runs unchanged and its user knows.
_REPORTED = set()


def _no_effect(owner, name, what):
    if name not in _REPORTED:
        _REPORTED.add(name)
        warnings.warn(f"aspen.Options.{name}: {what}; it has no effect on a CPU", stacklevel=3)
    return owner


def _positive(name, n):
    return _check.integer(name, n, 1, _check.INT64_MAX)


def core_budget():
    """The cores this process's devices may reserve in all, read as core/thread_team.cc reads them: the
    environment's ASPEN_CORES when it is an integer in [1, 4096], else the machine's CPUs. (The C++ side
    reads it once, at the first model: the package sets it at import, NOTE [python cores].)"""
    text = os.environ.get("ASPEN_CORES", "")
    if text.lstrip().lstrip("+-").isdigit() and 1 <= int(text) <= 4096:
        return int(text)
    return os.cpu_count() or 1


_DTYPE_TEXT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _dtype_name(what, dtype):
    """f32 / f16 / bf16 from a torch or numpy dtype, or the name itself."""
    text = str(dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    names = {"float": "f32", "float32": "f32", "f32": "f32", "half": "f16", "float16": "f16", "f16": "f16",
             "bfloat16": "bf16", "bf16": "bf16"}
    if text not in names:
        raise ValueError(f"{what}: expected float32, float16 or bfloat16, found {dtype!r}")
    return names[text]


class _Section:
    """A group of options (opts.Training, opts.Precision, opts.Distributed): unknown names are errors."""

    _section = ""

    def __init__(self, owner):
        object.__setattr__(self, "_owner", owner)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"aspen.Options.{self._section} has no option '{name}' (aspen does not support it); "
                             f"it has: {', '.join(self._names())}")

    def __setattr__(self, name, value):
        raise AttributeError(f"aspen.Options.{self._section}.{name}: options are set by calling their method")

    def _names(self):
        return sorted(n for n in type(self).__dict__ if not n.startswith("_"))


class _Training(_Section):
    _section = "Training"

    def gradientAccumulation(self, n):
        """Micro-batches per optimizer step (training models only)."""
        self._owner._values["gradient_accumulation"] = _positive("Training.gradientAccumulation", n)
        return self._owner

    def accumulationAndReplicationReductionType(self, reduction):
        """Mean (the default) or Sum of the micro-batches' and replicas' gradients."""
        if not isinstance(reduction, ReductionType):
            raise ValueError(f"Training.accumulationAndReplicationReductionType: expected aspen.ReductionType.Mean "
                             f"or .Sum, found {reduction!r}")
        self._owner._reduction = reduction.value
        return self._owner


class _Precision(_Section):
    _section = "Precision"

    def setPartialsType(self, dtype):
        """The type of matmul partial sums: float32, or the compute type (torch.half with half compute)."""
        self._owner._values["partials"] = _dtype_name("Precision.setPartialsType", dtype)
        return self._owner

    def setComputeType(self, dtype):
        """aspen's own: run matmuls in bfloat16 or float16 (weights stay f32 and are cast, like autocast)."""
        self._owner._values["precision"] = _dtype_name("Precision.setComputeType", dtype)
        return self._owner

    def enableStochasticRounding(self, enabled=True):
        """PopTorch's: with float16 or bfloat16 compute, the master weights' narrow copies are rounded
        stochastically in training (each micro-batch from its own seed, each parameter on its own stream:
        unbiased, so updates smaller than a half ulp still move the copy on average; reproducible with
        Options.randomSeed). NOTE [stochastic cast] in graph/ops_elementwise.cc. Inference and validation round
        to nearest; with float32 compute nothing is rounded. Pipeline stages each take the micro-batch's seed
        (the same rounding as one device); not with tensor shards (refused by name)."""
        if _check.boolean("Precision.enableStochasticRounding", enabled):
            self._owner._values["stochastic_rounding"] = True
        else:
            self._owner._values.pop("stochastic_rounding", None)
        return self._owner

    def halfFloatCasting(self, behavior):
        """PopTorch 2.x's: the type of an op whose floating operands mix float32 and float16, a
        HalfFloatCastingBehavior. FloatDowncastToHalf (the default, HalfFloatCastingBehavior.Default):
        float16, the float32 operands cast down, so forward(x, y) = x + y of a float32 x and a float16 y
        returns float16; HalfUpcastToFloat: torch's own promotion, float32. It applies to a torch module
        whose call mixes float32 and float16 inputs (NOTE [half float casting], _torch.py); other calls
        compute as torch does."""
        if not isinstance(behavior, HalfFloatCastingBehavior):
            raise TypeError(f"Precision.halfFloatCasting: expected an aspen.poptorch.HalfFloatCastingBehavior "
                            f"(FloatDowncastToHalf or HalfUpcastToFloat), found {_check.found(behavior)}")
        object.__setattr__(self._owner, "_half_casting", behavior)
        return self._owner


class _TensorLocations(_Section):
    _section = "TensorLocations"

    def setActivationLocation(self, location):
        return _no_effect(self._owner, "TensorLocations.setActivationLocation", "where an IPU keeps activations")

    def setWeightLocation(self, location):
        return _no_effect(self._owner, "TensorLocations.setWeightLocation", "where an IPU keeps weights")

    def setAccumulatorLocation(self, location):
        return _no_effect(self._owner, "TensorLocations.setAccumulatorLocation", "where an IPU keeps accumulators")

    def setOptimizerLocation(self, location):
        return _no_effect(self._owner, "TensorLocations.setOptimizerLocation",
                          "where an IPU keeps optimizer state (all of it is in this machine's memory)")


class _Popart(_Section):
    _section = "_Popart"

    def set(self, key, value):
        return _no_effect(self._owner, f"_Popart.set({key!r})", "a PopART session option")


class _Jit(_Section):
    _section = "Jit"

    def traceModel(self, trace_model):
        return _no_effect(self._owner, "Jit.traceModel", "how PopTorch captured the model (aspen exports it "
                          "with torch.onnx)")


class _Distributed(_Section):
    _section = "Distributed"

    def configureProcessId(self, process_id, num_processes):
        """This process's place in an MPI job (started by mpirun): training models' replicas then span the
        job's processes. aspen takes the layout from MPI; the values given must agree with it."""
        where = "Distributed.configureProcessId"
        num_processes = _check.integer(f"{where}: num_processes", num_processes, 1, _check.INT32_MAX)
        process_id = _check.integer(f"{where}: process_id", process_id, 0, num_processes - 1,
                                    note=f"one of num_processes {num_processes}")
        for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
            if var in os.environ and int(os.environ[var]) != process_id:
                raise ValueError(f"{where}: process_id: expected {os.environ[var]} ({var}), found {process_id!r}")
        for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
            if var in os.environ and int(os.environ[var]) != num_processes:
                raise ValueError(f"{where}: num_processes: expected {os.environ[var]} ({var}), found "
                                 f"{num_processes!r}")
        self._owner._values["mpi"] = True
        return self._owner


class Options:
    """Compile and run options (poptorch.Options). Every setter returns the Options, so calls chain."""

    def __init__(self):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_output_mode", OutputMode.Default)
        object.__setattr__(self, "_reduction", "mean")
        object.__setattr__(self, "Training", _Training(self))
        object.__setattr__(self, "Precision", _Precision(self))
        object.__setattr__(self, "Distributed", _Distributed(self))
        object.__setattr__(self, "TensorLocations", _TensorLocations(self))
        object.__setattr__(self, "_Popart", _Popart(self))
        object.__setattr__(self, "Jit", _Jit(self))
        object.__setattr__(self, "_anchors", {})
        object.__setattr__(self, "_strategy", None)
        object.__setattr__(self, "_pipeline", None)  # setPipelineStages: (begins, schedule)
        object.__setattr__(self, "_half_casting", HalfFloatCastingBehavior.Default)  # the package's, not the engine's

    def anchorTensor(self, short_name, long_name, output_mode=None, output_return_period=1):
        """PopTorch's anchored tensors of a training model: long_name "Gradient___<parameter>" (the last step's
        gradient, as the optimizer took it) or "UpdatedVar___<parameter>" (the parameter after the last step),
        read with getAnchoredTensor(short_name) after a call. The last step's value only (OutputMode.Final)."""
        _check.string("anchorTensor: short_name", short_name)
        _check.string("anchorTensor: long_name", long_name)
        if not long_name.startswith(("Gradient___", "UpdatedVar___")):
            raise NotImplementedError(f"anchorTensor: long_name: expected 'Gradient___<parameter>' or "
                                      f"'UpdatedVar___<parameter>' (the tensors aspen can anchor), found {long_name!r}")
        if output_mode not in (None, OutputMode.Final, OutputMode.Default):
            raise NotImplementedError(f"anchorTensor: output_mode: expected None or OutputMode.Final (the last "
                                      f"step's value), found {output_mode}")
        self._anchors[short_name] = long_name

    def setExecutionStrategy(self, strategy):
        """PopTorch's: how the blocks of a training model's forward (aspen.poptorch.Block, BeginBlock) become
        pipeline stages, each on a device of its own: PipelinedExecution, ShardedExecution or
        SerialPhasedExecution, with Stage(...).ipu(n) arguments or an AutoStage. A model with blocks and no
        strategy runs pipelined, a stage per block. Inference runs the whole model on every core (a CPU's
        devices share its memory: nothing to gain from stages there)."""
        from . import _blocks
        if not isinstance(strategy, _blocks._Strategy):
            raise TypeError(f"setExecutionStrategy: expected aspen.poptorch.PipelinedExecution, ShardedExecution or "
                            f"SerialPhasedExecution, found {type(strategy).__name__}")
        object.__setattr__(self, "_strategy", strategy)
        return self

    def setPipelineStages(self, begins, schedule="1f1b"):
        """A training model of an ONNX file or a Keras model cut into pipeline stages, each on a device of its
        own (a torch module's are its Blocks: setExecutionStrategy). Stage k >= 1 begins at begins[k - 1]: for an
        ONNX file, the first node (after the stage before) whose name starts with it
        (models::OnnxImportOptions::stage_begins); for a Keras model, the layer of that name (model.layers'
        order: every later layer is in the stage too, or a later one). `schedule`: "1f1b" (PopTorch's
        PipelinedExecution) or "gpipe" (its ShardedExecution's numbers). The micro-batches of gradient
        accumulation flow through the stages; inference runs the whole model."""
        begins = _check.strings("setPipelineStages: begins", begins)
        if not begins:
            raise ValueError("setPipelineStages: begins: expected at least one name (where stage 1 begins), found "
                             "none")
        if schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"setPipelineStages: schedule: expected '1f1b' or 'gpipe', found {_check.found(schedule)}")
        object.__setattr__(self, "_pipeline", (tuple(begins), schedule))
        return self

    def _anchors_gradients(self):
        """Some anchor names a gradient (the training step must keep them)."""
        return any(v.startswith("Gradient___") for v in self._anchors.values())

    def clone(self):
        """An independent copy (PopTorch's: after a model has taken these options, change a copy)."""
        return copy.deepcopy(self)

    # --- IPU settings: accepted, no effect on a CPU (reported once each) ---
    def useIpuModel(self, use_model=True):
        _check.boolean("useIpuModel", use_model)
        return _no_effect(self, "useIpuModel", "the IPU Model is a simulated IPU")

    def useIpuId(self, ipu_id):
        _check.integer("useIpuId", ipu_id, 0, _check.INT32_MAX)
        return _no_effect(self, "useIpuId", "which IPU runs the model")

    def autoRoundNumIPUs(self, auto_round=True):
        _check.boolean("autoRoundNumIPUs", auto_round)
        return _no_effect(self, "autoRoundNumIPUs", "IPUs come in powers of two")

    def setAvailableMemoryProportion(self, proportions):
        return _no_effect(self, "setAvailableMemoryProportion", "the share of an IPU tile's memory for temporaries")

    def connectionType(self, connection_type):
        return _no_effect(self, "connectionType", "when the host attaches to an IPU")

    def syncPattern(self, sync_pattern):
        return _no_effect(self, "syncPattern", "how IPUs synchronise with the host")

    def logCycleCount(self, log_cycle_count=True):
        _check.boolean("logCycleCount", log_cycle_count)
        return _no_effect(self, "logCycleCount", "IPU cycle counts (aspen's timings: enableProfiling)")

    def showCompilationProgressBar(self, show=True):
        return _no_effect(self, "showCompilationProgressBar", "Poplar's compile progress")

    def enableStableNorm(self, enabled=True):
        return _no_effect(self, "enableStableNorm", "aspen's norms are computed about the mean already")

    def logDir(self, path):
        return _no_effect(self, "logDir", "where PopART writes its logs")

    def modelName(self, name):
        return _no_effect(self, "modelName", "the name in PopVision reports")

    def bufferingDepth(self, depth):
        return _no_effect(self, "bufferingDepth", "IPU host-transfer buffers")

    def deviceIterations(self, n):
        """Steps run per call without returning to Python; inputs carry n times the batch."""
        self._values["device_iterations"] = _positive("deviceIterations", n)
        return self

    def replicationFactor(self, n):
        """Replicas: devices of this process, each running the model on its slice of every input."""
        cores = core_budget()
        self._values["replication_factor"] = _check.integer(
            "replicationFactor", n, 1, cores, note=f"each replica takes a core; aspen's core budget is {cores}, "
            "ASPEN_CORES")
        return self

    def outputMode(self, output_mode, output_return_period=None):
        """Which steps' outputs a call returns (OutputMode.EveryN takes the period)."""
        if not isinstance(output_mode, OutputMode):
            raise ValueError(f"outputMode: expected an aspen.OutputMode, found {output_mode!r}")
        if output_mode is OutputMode.EveryN:
            self._values["output_every_n"] = _positive("outputMode(EveryN) period", output_return_period)
        elif output_return_period is not None:
            raise ValueError(f"outputMode: expected no period with {output_mode}, found {output_return_period!r}")
        object.__setattr__(self, "_output_mode", output_mode)
        return self

    anchorMode = outputMode  # PopTorch's older name

    def enableExecutableCaching(self, path):
        """Keep compiled programs in this directory; a later compile of the same graph loads them."""
        self._values["executable_cache"] = os.path.expanduser(_check.path("enableExecutableCaching: path", path))
        return self

    def randomSeed(self, seed):
        self._values["random_seed"] = _check.integer("randomSeed", seed, 0, _check.UINT64_MAX)
        return self

    def enableProfiling(self, path):
        """aspen's own: every call's instructions, rewritten after each call: a path ending in .json is one
        Chrome trace file; any other a profile directory (report.html, trace.pftrace, profile.json; docs/profile.md)."""
        self._values["profile"] = _check.path("enableProfiling: path", path)
        return self

    def setThreads(self, n):
        """aspen's own: threads per device (0: every free core)."""
        cores = core_budget()
        self._values["threads"] = _check.integer("setThreads", n, 0, cores, note="0: every free core; "
                                                 f"aspen's core budget is {cores}, ASPEN_CORES")
        return self

    def enableSyntheticData(self, enabled=True):
        """PopTorch's synthetic data: no host data reaches the device; every call runs on zeros of the first
        call's input shapes and types (a measure of the device alone; the outputs mean nothing)."""
        self._values["synthetic_data"] = _check.boolean("enableSyntheticData", enabled)
        return self

    def recomputation(self, enabled=True):
        """aspen's own: recompute activations in the backward pass (training)."""
        self._values["recompute"] = _check.boolean("recomputation", enabled)
        return self

    # --- read back (PopTorch has these as properties) ---
    @property
    def device_iterations(self):
        return self._values.get("device_iterations", 1)

    @property
    def replication_factor(self):
        return self._values.get("replication_factor", 1)

    @property
    def gradient_accumulation(self):
        return self._values.get("gradient_accumulation", 1)

    @property
    def output_mode(self):
        return self._output_mode

    def _validate(self):
        """The settings checked against each other, naming the setters (at model creation and compile:
        a setter cannot, as the other may come later)."""
        v = self._values
        if self._output_mode is OutputMode.EveryN and self.device_iterations % v["output_every_n"]:
            raise ValueError(f"outputMode(EveryN) period: expected a divisor of deviceIterations "
                             f"({self.device_iterations}), found {v['output_every_n']}")
        # Half partials need half compute: set by setComputeType, or by a half module (model.half(), NOTE
        # [half modules]), which is known only at export; then check_partials runs again at compile.
        compute = v.get("precision", "f32")
        if "precision" in v and v.get("partials", "f32") not in ("f32", compute):
            raise ValueError(f"Precision.setPartialsType: expected float32 or the compute type "
                             f"(Precision.setComputeType: {_DTYPE_TEXT[compute]}), found {_DTYPE_TEXT[v['partials']]}")
        cores = core_budget()
        if v.get("threads", 0) * self.replication_factor > cores:
            raise ValueError(f"setThreads x replicationFactor: expected at most aspen's core budget {cores} "
                             f"(ASPEN_CORES) in all, found {v['threads']} x {self.replication_factor}")

    @staticmethod
    def check_partials(resolved):
        """A resolved options dict (the model's compute type known): half partials with half compute only."""
        compute = resolved.get("precision", "f32")
        if resolved.get("partials", "f32") not in ("f32", compute):
            raise ValueError(f"Precision.setPartialsType: expected float32 or the compute type ({_DTYPE_TEXT[compute]}: "
                             f"Precision.setComputeType, or a half module), found {_DTYPE_TEXT[resolved['partials']]}")
        return resolved

    def _resolved(self, training, check=True):
        """The dict the C++ side takes (python/module.cc options_from)."""
        if check:
            self._validate()
        v = dict(self._values)
        v.pop("synthetic_data", None)  # the package's (model.py), not the engine's
        if not training:  # training settings, as PopTorch ignores them for an inference model
            v.pop("gradient_accumulation", None)
            v.pop("recompute", None)
            v.pop("stochastic_rounding", None)
        if "threads" not in v or v["threads"] == 0:  # NOTE [python cores]
            from . import CPUS
            v["threads"] = max(1, CPUS // v.get("replication_factor", 1))
        mode = self._output_mode
        if mode is OutputMode.Default:
            mode = OutputMode.Final if training else OutputMode.All
        v["output_mode"] = mode.value
        return v

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        what = "a PopTorch option aspen does not support" if name in _POPTORCH_ONLY else "no such option"
        supported = sorted(n for n in Options.__dict__ if not n.startswith("_") and n[0].islower() and
                           not isinstance(Options.__dict__[n], property))
        raise AttributeError(f"aspen.Options.{name}: {what}; the options are {', '.join(supported)} and "
                             f"Training.*, Precision.*, Distributed.*")

    def __setattr__(self, name, value):
        raise AttributeError(f"aspen.Options.{name}: options are set by calling their method")

    def __repr__(self):
        return f"aspen.Options({self._resolved(False, check=False)})"
