"""aspen: compile a model into a static program and run it, for inference and training, PopTorch's way.

    import aspen, torch
    opts = aspen.Options().deviceIterations(4)
    opts.Training.gradientAccumulation(2)
    training = aspen.trainingModel(model, opts, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-3))
    for x, y in loader:
        out, loss = training(x, y)   # what forward returns, (output, loss)
    training.copyWeightsToHost()

See docs/python.md. The C++ engine does the work (the extension module aspen._aspen); this package adapts
frameworks and types around it. torch and TensorFlow are imported only when a model of theirs is passed.
"""

import os as _os
import sys as _sys

# NOTE [python cores] The C++ runtime gives each device a team that reserves its cores (core/thread_team.h),
# so a process's live models cannot share them: right for the `aspen` command, which runs one model, but a
# Python session keeps several models alive (a reference model beside a compiled one, a model kept by a
# traceback). The package therefore lets its models share the machine's cores: it raises the budget
# (ASPEN_CORES, unless the user set it) and gives every model an explicit thread count, the CPUs this
# process may run on split over the model's devices (Options.setThreads overrides it). Models called one
# at a time run at full speed (an idle model's OpenMP workers are freed: NOTE [idle pools] in
# core/thread_team.cc); models called from several Python threads at once oversubscribe the cores.
CPUS = len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity") else (_os.cpu_count() or 1)
_os.environ.setdefault("ASPEN_CORES", str(min(CPUS * 256, 4096)))  # core/thread_team.cc ignores more than 4096

# NOTE [python protobuf] The module reads ONNX files with Debian's libprotobuf. TensorFlow, imported
# before aspen, loads its own copy of protobuf's C++ symbols into the global scope, and the dynamic linker
# would bind libprotobuf's own references to that copy: a crash on the first ONNX file. Loaded with
# RTLD_DEEPBIND, the module and the libraries it brings resolve their symbols among themselves first.
# NOTE [tensorflow and torch]: torch imports triton (a GPU compiler its wheels bring) the first time anything
# touches torch._dynamo (torch.optim's constructors do, and torch.onnx's exporter); triton and TensorFlow
# each link their own LLVM, and whichever loads second aborts the interpreter ("LLVM ERROR: inconsistency in
# registered CommandLine options"). A script that loads data with TensorFlow and trains a torch module (the
# founding document's example) would die. So, from the package's import on: once TensorFlow is loaded (before
# aspen, or later: a finder watches for its import), triton is marked absent (sys.modules["triton"] = None,
# which torch reads as "not installed", as in its CPU wheels; nothing on a CPU needs it); and importing
# TensorFlow after triton was already loaded is an ImportError saying so, not an abort.


class _TensorFlowLoader:
    """TensorFlow's own loader, which first keeps triton out (or refuses, when triton is already loaded)."""

    def __init__(self, real):
        self._real = real

    def create_module(self, spec):
        if _sys.modules.get("triton") is not None:
            raise ImportError("tensorflow: triton (torch's GPU compiler, loaded by torch.compile, torch.optim or "
                              "torch.onnx) is already in this process, and TensorFlow's LLVM beside triton's "
                              "aborts the interpreter; import tensorflow before using torch (NOTE [tensorflow and "
                              "torch], python/aspen/__init__.py)")
        _sys.modules.setdefault("triton", None)
        return self._real.create_module(spec)

    def exec_module(self, module):
        return self._real.exec_module(module)

    def __getattr__(self, name):  # everything else is TensorFlow's loader's
        return getattr(self._real, name)


class _TritonBesideTensorFlow:
    """A meta-path finder for TensorFlow alone: the spec the other finders give, its loader wrapped. A probe
    (importlib.util.find_spec) changes nothing; only the import does."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _TensorFlowLoader):
                    spec.loader = _TensorFlowLoader(spec.loader)
                return spec
        return None


if "tensorflow" in _sys.modules:
    _sys.modules.setdefault("triton", None)
elif not any(isinstance(f, _TritonBesideTensorFlow) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _TritonBesideTensorFlow())

_flags = _sys.getdlopenflags()
if hasattr(_os, "RTLD_DEEPBIND"):
    _sys.setdlopenflags(_os.RTLD_NOW | _os.RTLD_DEEPBIND)
try:
    from . import _aspen  # noqa: E402 (after the core budget is set)
finally:
    _sys.setdlopenflags(_flags)
from . import optim  # noqa: E402
from .model import InferenceModel, TrainingModel, inferenceModel, trainingModel
from .options import Options, OutputMode, ReductionType
from .text import Embedder, Encoding, Generator, Tokenizer, embed, embedder, generate, generator

__version__ = "0.1.0"

__all__ = ["Options", "OutputMode", "ReductionType", "inferenceModel", "trainingModel", "InferenceModel",
           "TrainingModel", "optim", "generate", "embed", "Tokenizer", "Encoding", "Generator", "Embedder",
           "generator", "embedder", "input_copies"]


def input_copies():
    """Inputs gathered into a copy since the package loaded, because their memory was not C-contiguous
    (every other input is read in place)."""
    return _aspen.input_copies()
