"""A torch module's layers on pipeline stages, as PopTorch's Block / BeginBlock / BlockFunction put them on IPUs,
and the execution strategies (PipelinedExecution, ShardedExecution, SerialPhasedExecution) that name the stages.

NOTE [blocks in the export]: a block marks the ops that run inside it. While aspen exports a training model
whose forward entered blocks, torch.export traces with node metadata preserved and each block sets the custom
annotation "aspen_block" (torch.fx.traceback's current meta), so every FX node made inside a block carries its
name. torch.onnx writes a node's module scopes but not custom annotations: each annotated node gets a scope
"__aspen_block.<name>" in its module stack, which torch.onnx records in the ONNX node's name_scopes; after the
export that scope is taken out again and the node gets the metadata "aspen.stage" (models/onnx_import.h), the
stage of its block. A node outside every block takes the stage of the node before it (the file's order is the
order forward ran), so the ops before the first block run on stage 0 and an op between two blocks on the
earlier one, as PopTorch keeps them on the IPU of the last block. The stages are then the pipeline's
(train/pipeline.h); the cut only decides where each op runs, never what it computes.
"""

import enum
import functools

_KEY = "aspen_block"
_SCOPE = "__aspen_block."


class _State:
    recording = None  # the blocks entered in order, while aspen runs forward to export it (else None)
    tracing = False   # torch.export is tracing: blocks annotate the nodes
    current = None    # the block whose ops run now
    auto = 0          # Blocks made without a user_id in this run of forward (each run counts from 0, so the
    #                   eager run and the trace name a forward's unnamed blocks alike)
    auto_begin = 0    # BeginBlocks made without a user_id (once, with the model)


class AutoStage(enum.Enum):
    SameAsIpu = 0
    AutoIncrement = 1


def _meta():
    import torch.fx.traceback as fxt
    return fxt.current_meta


def _set(block):
    _State.current = block
    if block is not None and _State.recording is not None and block not in _State.recording:
        _State.recording.append(block)
    if _State.tracing:
        custom = _meta().setdefault("custom", {})
        if block is None:
            custom.pop(_KEY, None)
        else:
            custom[_KEY] = block.name


class _BlockId:
    """A block: its name and the IPU it asked for (None: by the strategy or its order)."""

    def __init__(self, user_id, ipu_id, begin=False):
        if user_id is None and begin:
            _State.auto_begin += 1
            user_id = f"begin_block{_State.auto_begin}"
        elif user_id is None:
            _State.auto += 1
            user_id = f"block{_State.auto}"
        if not isinstance(user_id, str):
            raise TypeError(f"Block: user_id: expected a string or None, found {type(user_id).__name__}")
        if not user_id or any(c in user_id for c in "/,'\"[]"):
            raise ValueError(f"Block: user_id: expected a name without / , ' \" [ or ], found {user_id!r}")
        if ipu_id is not None and (not isinstance(ipu_id, int) or isinstance(ipu_id, bool) or ipu_id < 0):
            raise ValueError(f"Block '{user_id}': ipu_id: expected an integer >= 0 or None, found {ipu_id!r}")
        self.name = user_id
        self.ipu = ipu_id

    def __eq__(self, other):
        return isinstance(other, _BlockId) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


class Block:
    """PopTorch's Block: the ops run inside `with Block("name", ipu_id=...)` make one block (one pipeline stage
    unless the strategy groups blocks). Blocks of the same name are one block."""

    def __init__(self, user_id=None, ipu_id=None):
        self._id = _BlockId(user_id, ipu_id)
        self._saved = []

    def __enter__(self):
        self._saved.append(_State.current)
        _set(self._id)
        return self

    def __exit__(self, *exc):
        _set(self._saved.pop())
        return False

    @staticmethod
    def useAutoId():
        """PopTorch's: blocks without a user_id are numbered (they are here)."""


def BeginBlock(layer_to_call, user_id=None, ipu_id=None):
    """PopTorch's BeginBlock: a block begins where `layer_to_call` (a torch module) runs and goes on until the
    next block begins. Returns the module."""
    import torch
    if not isinstance(layer_to_call, torch.nn.Module):
        raise TypeError(f"BeginBlock: layer_to_call: expected a torch.nn.Module, found {type(layer_to_call).__name__}")
    block = _BlockId(user_id, ipu_id, begin=True)
    old = getattr(layer_to_call, "_aspen_begin_block", None)
    if old is not None:
        old[1].remove()  # a second BeginBlock on one module replaces the first, as PopTorch's does
    handle = layer_to_call.register_forward_pre_hook(lambda module, args: _set(block))
    layer_to_call._aspen_begin_block = (block, handle)
    return layer_to_call


def BlockFunction(user_id=None, ipu_id=None):
    """PopTorch's BlockFunction: a decorator running the function inside a Block."""
    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with Block(user_id, ipu_id):
                return fn(*args, **kwargs)
        return run
    return decorate


class Stage:
    """PopTorch's Stage: the blocks one stage runs (by user_id), on `.ipu(n)`."""

    def __init__(self, *block_ids):
        for b in block_ids:
            if not isinstance(b, str):
                raise TypeError(f"Stage: block ids: expected strings, found {type(b).__name__}")
        if not block_ids:
            raise ValueError("Stage: expected at least one block id, found none")
        self.blocks = tuple(block_ids)
        self.ipu_id = None

    def ipu(self, ipu_id):
        if not isinstance(ipu_id, int) or isinstance(ipu_id, bool) or ipu_id < 0:
            raise ValueError(f"Stage{self.blocks}.ipu: expected an integer >= 0, found {ipu_id!r}")
        self.ipu_id = ipu_id
        return self


class Phase:
    """PopTorch's Phase (serial phased execution): its stages run one after another here."""

    def __init__(self, *stages):
        self.stages = tuple(s if isinstance(s, Stage) else Stage(s) for s in stages)


class _Strategy:
    schedule = "1f1b"

    def __init__(self, *args):
        self.auto = AutoStage.SameAsIpu
        self.stages = []
        for a in args:
            if isinstance(a, AutoStage):
                self.auto = a
            elif isinstance(a, Stage):
                self.stages.append(a)
            elif isinstance(a, str):
                self.stages.append(Stage(a))
            elif isinstance(a, Phase):
                self.stages.extend(a.stages)
            else:
                raise TypeError(f"{type(self).__name__}: expected Stage, a block id, Phase or AutoStage arguments, "
                                f"found {type(a).__name__}")


class PipelinedExecution(_Strategy):
    """The stages as a pipeline: each on a device of its own, the micro-batches of gradient accumulation flowing
    through them (aspen's 1F1B schedule)."""


class ShardedExecution(_Strategy):
    """The stages on devices of their own without a pipeline schedule of PopTorch's kind; aspen runs them as the
    GPipe schedule (the same numbers: a schedule orders the micro-batches' passes, it does not change them)."""
    schedule = "gpipe"


class SerialPhasedExecution(ShardedExecution):
    """PopTorch's phased execution (IPU memory phases): run as sharded, every phase's stages in order."""

    def setTensorsLiveness(self, liveness):
        return self

    def useSeparateBacklogPhase(self, use=True):
        return self


def stages_of(blocks, strategy):
    """Block name -> stage number for the blocks forward entered (in order), by the strategy's stages, or
    (none given) by their IPUs (AutoStage.SameAsIpu, where every block names one) or their order."""
    names = [b.name for b in blocks]
    if strategy is not None and strategy.stages and not names:
        raise ValueError(f"{type(strategy).__name__}: expected a forward that enters the blocks its stages name "
                         f"({', '.join(n for st in strategy.stages for n in st.blocks)}), found no block")
    if strategy is not None and strategy.stages:
        stage = {}
        for k, st in enumerate(strategy.stages):
            for name in st.blocks:
                if name not in names:
                    raise ValueError(f"{type(strategy).__name__}: Stage{st.blocks}: block '{name}': expected a block "
                                     f"forward runs ({', '.join(names) or 'none'}), found none of that name")
                if name in stage:
                    raise ValueError(f"{type(strategy).__name__}: block '{name}': expected in one Stage, found in "
                                     f"stages {stage[name]} and {k}")
                stage[name] = k
        missing = [n for n in names if n not in stage]
        if missing:
            raise ValueError(f"{type(strategy).__name__}: block '{missing[0]}': expected in a Stage of the strategy "
                             f"(its stages name {', '.join(sorted(stage))}), found in none")
        return stage
    auto = strategy.auto if strategy is not None else AutoStage.SameAsIpu
    if auto is AutoStage.SameAsIpu and blocks and all(b.ipu is not None for b in blocks):
        # The ops before the first block run on IPU 0, as PopTorch places them: its stage (tag_stages drops
        # a stage no op runs on).
        ipus = sorted({0} | {b.ipu for b in blocks})
        return {b.name: ipus.index(b.ipu) for b in blocks}
    return {name: k for k, name in enumerate(names)}


class recording:
    """Collects the blocks forward enters (the eager run before the export)."""

    def __enter__(self):
        _State.recording = []
        _State.current = None
        _State.auto = 0
        return self

    def __exit__(self, *exc):
        self.blocks = _State.recording
        _State.recording = None
        _State.current = None
        return False


class tracing:
    """While torch.export traces: blocks annotate the nodes (NOTE [blocks in the export])."""

    def __enter__(self):
        import torch.fx.traceback as fxt
        if not hasattr(fxt, "preserve_node_meta") or not hasattr(fxt, "current_meta"):
            raise NotImplementedError("aspen.poptorch blocks: expected a torch with torch.fx.traceback's node "
                                      "metadata (2.6 or later), found one without")
        self._preserve = fxt.preserve_node_meta()
        self._preserve.__enter__()
        self._had_custom = "custom" in _meta()
        _State.tracing = True
        _State.current = None
        _State.auto = 0
        return self

    def __exit__(self, *exc):
        _State.tracing = False
        _State.current = None
        meta = _meta()
        meta.get("custom", {}).pop(_KEY, None)
        if not self._had_custom and not meta.get("custom", True):
            meta.pop("custom", None)  # as it was (an empty dict left behind would annotate every later trace)
        self._preserve.__exit__(*exc)
        return False


def scope_nodes(exported):
    """Each node an annotated block made gets the block as a module scope torch.onnx writes down."""
    for node in exported.graph.nodes:
        name = (node.meta.get("custom") or {}).get(_KEY)
        if name is None:
            continue
        stack = dict(node.meta.get("nn_module_stack") or {})
        stack["__aspen_block"] = (_SCOPE + name, "aspen.poptorch.Block")
        node.meta["nn_module_stack"] = stack


def name_scopes(value):
    """torch.onnx's "pkg.torch.onnx.name_scopes" metadata ("['', 'net', 'net.bn1', 'op']") as a list."""
    return [s.strip(" '\"") for s in value.strip("[]").split(",")]


def tag_stages(model, stage_of_block):
    """In a loaded ONNX model, the blocks' scopes become "aspen.stage" metadata (the other nodes take the
    stage before them; the ops before the first block stage 0). Stages no node runs on are dropped, the others
    numbered from 0 in order; returns how many there are."""
    stage = 0
    tags = []
    for n in model.graph.node:
        block = None
        for p in n.metadata_props:
            if p.key == "pkg.torch.onnx.name_scopes":
                scopes = name_scopes(p.value)
                mine = [s for s in scopes if s.startswith(_SCOPE)]
                if mine:
                    block = mine[-1][len(_SCOPE):]
                    keep = [s for s in scopes if not s.startswith(_SCOPE)]
                    p.value = "[" + ", ".join(repr(s) for s in keep) + "]"
            elif p.key == "pkg.torch.onnx.class_hierarchy":
                p.value = p.value.replace("'aspen.poptorch.Block', ", "").replace(", 'aspen.poptorch.Block'", "")
            elif p.key == "namespace":
                parts = [s for s in p.value.split("/") if not s.startswith(_SCOPE)]
                p.value = "/".join(parts)
        if block is not None:
            if block not in stage_of_block:
                raise ValueError(f"aspen.poptorch blocks: block '{block}' ran in the export's trace but not in the "
                                 f"eager run before it ({', '.join(stage_of_block)}): a forward must enter the same "
                                 "blocks on every call")
            stage = stage_of_block[block]
        tags.append(n.metadata_props.add(key="aspen.stage", value=str(stage)))
    used = sorted({int(t.value) for t in tags})
    for t in tags:
        t.value = str(used.index(int(t.value)))
    return len(used)
