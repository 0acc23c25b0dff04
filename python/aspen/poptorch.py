"""aspen.poptorch: PopTorch's public API on aspen, so that a PopTorch program runs with one line changed:

    import aspen.poptorch as poptorch      # instead of: import poptorch

What is here (W3.3, docs/python.md "PopTorch programs"): trainingModel / inferenceModel (PopTorch's
default optimizer, SGD at lr 0.01; torch.optim's optimizers and poptorch.optim's), Options (IPU-only
settings accepted and reported once as having no effect), OutputMode, ReductionType, DataLoader and
DataLoaderMode (torch.utils.data underneath, PopTorch's combined batch, asynchronous prefetch),
identity_loss, and the host weights kept in sync with the training model (NOTE [implicit weight sync],
model.py); a training call returns what forward returns (NOTE [training outputs], model.py); Block,
BeginBlock, BlockFunction and the execution strategies split a training model into pipeline stages (NOTE
[blocks in the export], _blocks.py); Precision.halfFloatCasting and HalfFloatCastingBehavior (NOTE [half float
casting], _torch.py); Precision.enableStochasticRounding; parameter groups; PopTorch's accumulation and state
types (accum_type, first/second_order_momentum_accum_type, velocity_accum_type: aspen.optim).
Anchored tensors: Options.anchorTensor with "Gradient___<parameter>" / "UpdatedVar___<parameter>",
getTensorNames, getAnchoredTensor (the last step's values).
"""

import enum
import queue
import sys
import threading

import numpy
import torch

from . import _poptorch_optim as optim
from .model import InferenceModel, TrainingModel
from .options import HalfFloatCastingBehavior, Options, OutputMode, ReductionType

sys.modules[__name__ + ".optim"] = optim  # import aspen.poptorch.optim, as poptorch.optim

__all__ = ["trainingModel", "inferenceModel", "Options", "OutputMode", "ReductionType", "HalfFloatCastingBehavior",
           "DataLoader", "DataLoaderMode", "AsynchronousDataAccessor", "identity_loss", "optim", "setLogLevel",
           "ipu_print_tensor", "set_available_memory", "Block", "BeginBlock", "BlockFunction", "Stage", "Phase",
           "AutoStage", "PipelinedExecution", "ShardedExecution", "SerialPhasedExecution"]


def trainingModel(model, options=None, optimizer=None):
    """PopTorch's trainingModel: `model`'s forward returns (output, loss) or the loss; the optimizer is a
    poptorch.optim or torch.optim one (default: SGD at lr 0.01 over every parameter, as PopTorch)."""
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return TrainingModel(model, options, optimizer, None)


def inferenceModel(model, options=None):
    """PopTorch's inferenceModel: call it as the module; a training model of the same module's newer weights
    are taken before each call (NOTE [implicit weight sync])."""
    if options is not None and options.gradient_accumulation != 1:
        raise ValueError(f"inferenceModel: options: expected Training.gradientAccumulation 1 (an inference model "
                         f"does not accumulate; PopTorch refuses it too), found {options.gradient_accumulation}")
    return InferenceModel(model, options)


def identity_loss(x, reduction):
    """The loss a model returns, reduced: "sum", "mean" or "none" (PopTorch marks it as the loss; aspen's
    training model takes the loss forward returns)."""
    if reduction == "sum":
        return torch.sum(x)
    if reduction == "mean":
        return torch.mean(x)
    if reduction == "none":
        return x
    raise ValueError(f"identity_loss: reduction: expected 'sum', 'mean' or 'none', found {reduction!r}")


def ipu_print_tensor(tensor, title=""):
    """PopTorch prints the tensor from the IPU; here the tensor passes through unchanged."""
    return tensor


def set_available_memory(tensor, available_memory_proportion):
    """An IPU tile-memory hint for the op making `tensor`; no effect on a CPU."""
    return tensor


def setLogLevel(level):
    """PopTorch's log level; aspen's messages are errors and warnings, always shown."""


# Model parallelism: blocks of forward become pipeline stages (NOTE [blocks in the export], _blocks.py).
from ._blocks import (AutoStage, BeginBlock, Block, BlockFunction, Phase, PipelinedExecution,  # noqa: E402
                      SerialPhasedExecution, ShardedExecution, Stage)


class DataLoaderMode(enum.Enum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


_ASYNC_KEYS = {"buffer_size", "miss_sleep_time_in_ms", "load_indefinitely", "early_preload", "sharing_strategy"}


class _Prefetching:
    """Batches made ahead by one background thread at a time (_prefetched), stopped by terminate()."""

    _stop = None

    def _ahead(self, batches, depth):
        self.terminate()
        self._stop = threading.Event()
        return _prefetched(batches, depth, self._stop)

    def terminate(self):
        """Stops the background thread (PopTorch's terminate)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None


class DataLoader(_Prefetching, torch.utils.data.DataLoader):
    """PopTorch's DataLoader: torch's, yielding combined batches of batch_size x deviceIterations x
    replicationFactor x gradientAccumulation samples (what one call of a model with these options takes),
    drop_last True by default (a call needs a whole combined batch). In an MPI job each process reads its own
    contiguous share of the dataset (Distributed.configureProcessId; auto_distributed_partitioning).
    mode Async / AsyncRebatched: batches are made ahead by a background thread into a bounded queue
    (async_options buffer_size, default 3), beside num_workers worker processes when given; AsyncRebatched
    lets workers make batches of rebatched_worker_size samples and joins them into combined batches.
    samples_seen counts the samples the loader has yielded, to check an epoch against the dataset."""

    def __init__(self, options, dataset, batch_size=1, shuffle=False, num_workers=0, drop_last=True,
                 persistent_workers=None, auto_distributed_partitioning=True, mode=DataLoaderMode.Sync,
                 async_options=None, rebatched_worker_size=None, **kwargs):
        if not isinstance(options, Options):
            raise ValueError(f"DataLoader: options: expected an aspen.poptorch.Options, found {type(options).__name__}")
        if not isinstance(mode, DataLoaderMode):
            raise ValueError(f"DataLoader: mode: expected a poptorch.DataLoaderMode, found {mode!r}")
        async_options = dict(async_options or {})
        unknown = set(async_options) - _ASYNC_KEYS
        if unknown:
            raise ValueError(f"DataLoader: async_options: expected keys among {', '.join(sorted(_ASYNC_KEYS))}, "
                             f"found {', '.join(sorted(unknown))}")
        self._options = options
        self._mode = mode
        self._buffer = int(async_options.get("buffer_size", 3))
        if self._buffer < 1:
            raise ValueError(f"DataLoader: async_options['buffer_size']: expected >= 1, found {self._buffer}")
        per_call = options.device_iterations * options.replication_factor * options.gradient_accumulation
        self._combined = None if batch_size is None else batch_size * per_call
        if _is_tf_dataset(dataset):
            if shuffle:
                raise ValueError("DataLoader: shuffle: expected False with a tf.data.Dataset (shuffle it in "
                                 "TensorFlow: dataset.shuffle(n)), found True")
            if num_workers:
                raise ValueError(f"DataLoader: num_workers: expected 0 with a tf.data.Dataset (TensorFlow runs its "
                                 f"own pipeline; each worker would read all of it), found {num_workers}")
            dataset = _TfDataset(dataset)
        if options._values.get("mpi") and auto_distributed_partitioning:
            dataset = _share_of(dataset)
        if _gatherable(dataset) and kwargs.get("collate_fn") is None:
            dataset = _TensorRows(*dataset.tensors)
            kwargs["collate_fn"] = _collate_rows
        self._rebatched_drop_last = drop_last
        torch_batch = self._combined
        if mode is DataLoaderMode.AsyncRebatched:
            if self._combined is None:
                raise ValueError("DataLoader: AsyncRebatched: expected a batch_size, found None")
            torch_batch = rebatched_worker_size or self._combined
            if torch_batch > self._combined:
                raise ValueError(f"DataLoader: rebatched_worker_size: expected at most the combined batch "
                                 f"{self._combined}, found {torch_batch}")
            drop_last = False
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        self.samples_seen = 0
        super().__init__(dataset, batch_size=torch_batch, shuffle=shuffle, num_workers=num_workers,
                         drop_last=drop_last, persistent_workers=persistent_workers, **kwargs)

    @property
    def combinedBatchSize(self):
        return self._combined

    @property
    def options(self):
        return self._options

    def __len__(self):
        if self._mode is DataLoaderMode.AsyncRebatched:
            n = len(self.dataset)
            return n // self._combined + (0 if self._rebatched_drop_last or n % self._combined == 0 else 1)
        return super().__len__()

    def __iter__(self):
        batches = super().__iter__()
        if self._mode is DataLoaderMode.AsyncRebatched:
            batches = _rebatched(batches, self._combined, self._rebatched_drop_last)
        if self._mode is not DataLoaderMode.Sync:
            batches = self._ahead(batches, self._buffer)
        for b in batches:
            self.samples_seen += _batch_rows(b)
            yield b


class AsynchronousDataAccessor(_Prefetching):
    """PopTorch's AsynchronousDataAccessor: iterates `dataset` (a DataLoader, or any iterable of batches) with
    the batches made ahead by a background thread into a queue of buffer_size."""

    def __init__(self, dataset, buffer_size=3, miss_sleep_time_in_ms=0.1, load_indefinitely=True,
                 early_preload=False, sharing_strategy=None, rebatched_size=None):
        if isinstance(dataset, DataLoader) and dataset._mode is not DataLoaderMode.Sync:
            raise ValueError("AsynchronousDataAccessor: dataset: expected a DataLoader in mode Sync (this one "
                             "already makes its batches ahead), found mode " + dataset._mode.name)
        if int(buffer_size) < 1:
            raise ValueError(f"AsynchronousDataAccessor: buffer_size: expected >= 1, found {buffer_size}")
        self._dataset = dataset
        self._buffer = int(buffer_size)
        self._rebatched = rebatched_size

    def __len__(self):
        return len(self._dataset)

    def __iter__(self):
        batches = iter(self._dataset)
        if self._rebatched:
            batches = _rebatched(batches, int(self._rebatched), True)
        return self._ahead(batches, self._buffer)

    def __del__(self):
        self.terminate()


def _is_tf_dataset(d):
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(d, tf.data.Dataset)


class _TfDataset(torch.utils.data.IterableDataset):
    """A tf.data.Dataset's elements as torch tensors (its numpy values, shared, not copied)."""

    def __init__(self, dataset):
        self.dataset = dataset
        n = int(dataset.cardinality())
        self._len = n if n >= 0 else None  # infinite (-1) or unknown (-2): no length

    def __len__(self):
        if self._len is None:
            raise TypeError("DataLoader: a tf.data.Dataset of infinite or unknown length has no len()")
        return self._len

    def __iter__(self):
        def tensor(v):
            import numpy as np
            return torch.from_numpy(v) if isinstance(v, np.ndarray) else torch.as_tensor(np.asarray(v))
        for element in self.dataset.as_numpy_iterator():
            if isinstance(element, dict):
                yield {k: tensor(v) for k, v in element.items()}
            elif isinstance(element, (tuple, list)):
                yield type(element)(tensor(v) for v in element)
            else:
                yield tensor(element)


def _gatherable(dataset):
    """A TensorDataset whose rows are its tensors' rows (its own __getitem__), of CPU tensors numpy holds."""
    return (isinstance(dataset, torch.utils.data.TensorDataset)
            and type(dataset).__getitem__ is torch.utils.data.TensorDataset.__getitem__
            and all(t.device.type == "cpu" and not t.requires_grad and t.dtype in _NUMPY_DTYPES
                    for t in dataset.tensors))


_NUMPY_DTYPES = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool}


class _Gathered(list):
    """A batch of a _TensorRows, already stacked: one tensor per tensor of the dataset."""


class _TensorRows(torch.utils.data.TensorDataset):
    """A TensorDataset whose batches are gathered with one numpy take per tensor (__getitems__), not one
    __getitem__ per sample and a stack: the same rows in the same order, about 4000 Python calls fewer per
    combined batch of the pipelining tutorial (its loader took 0.19 ms per micro-batch, 10 % of the step).
    numpy's take runs on the calling thread: torch's indexing opens a parallel region, whose workers then
    contend with the model's device team for the same cores (the basics tutorial's loop, 16 rows a call, ran
    2x slower with it)."""

    def __init__(self, *tensors):
        super().__init__(*tensors)
        self._arrays = [t.numpy() for t in tensors]

    def __getitems__(self, indices):
        idx = numpy.asarray(indices, dtype=numpy.int64)
        return _Gathered(torch.from_numpy(a.take(idx, axis=0)) for a in self._arrays)


def _collate_rows(data):
    if isinstance(data, _Gathered):
        return list(data)  # what default_collate makes of a batch of tuples: a list, one stacked tensor each
    return torch.utils.data.default_collate(data)


def _batch_rows(batch):
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    return int(first.shape[0]) if hasattr(first, "shape") and len(first.shape) else 1


def _share_of(dataset):
    """This MPI process's contiguous share of the dataset (equal shares; the remainder is left out, as
    PopTorch's distributed loader does)."""
    import os
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", 0)))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", 1)))
    per = len(dataset) // size
    return torch.utils.data.Subset(dataset, range(rank * per, (rank + 1) * per))


def _rebatched(batches, size, drop_last):
    """Worker batches joined into batches of `size` rows (the last one short unless drop_last)."""
    pending, rows = [], 0
    for b in batches:
        pending.append(b)
        rows += _batch_rows(b)
        while rows >= size:
            whole = _concat(pending)
            yield _narrow(whole, 0, size)
            rest = _narrow(whole, size, rows - size)
            rows -= size
            pending = [rest] if rows else []
    if rows and not drop_last:
        yield _concat(pending)


def _concat(parts):
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, (list, tuple)):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    raise ValueError(f"DataLoader: AsyncRebatched: expected batches of tensors, tuples or dicts, found "
                     f"{type(first).__name__}")


def _narrow(x, start, n):
    if isinstance(x, torch.Tensor):
        return x[start:start + n]
    if isinstance(x, (list, tuple)):
        return type(x)(_narrow(v, start, n) for v in x)
    return {k: _narrow(v, start, n) for k, v in x.items()}


_DONE = object()


def _prefetched(batches, depth, stop):
    """Batches made ahead by a background thread into a queue of `depth`; an error in the thread is raised
    here, where the loop reads."""
    q = queue.Queue(maxsize=depth)

    def fill():
        try:
            for b in batches:
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as e:  # noqa: BLE001 (handed to the reader)
            q.put(e)

    t = threading.Thread(target=fill, name="aspen-dataloader", daemon=True)
    t.start()
    while True:
        b = q.get()
        if b is _DONE:
            return
        if isinstance(b, BaseException):
            raise b
        yield b
