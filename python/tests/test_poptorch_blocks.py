"""aspen.poptorch's model parallelism as PopTorch programs write it: Block, BeginBlock and BlockFunction in a torch
module's forward, and the execution strategies naming the stages (NOTE [blocks in the export]). A pipelined
model trains as the same model on one device, checked against eager PyTorch with the same accumulation."""

import os

import numpy as np
import onnx
import pytest
import torch

import aspen.poptorch as poptorch


class _Staged(torch.nn.Module):
    """Three blocks (a convolution, a hidden layer, the classifier with its loss), marked in one of PopTorch's
    three ways."""

    def __init__(self, style):
        super().__init__()
        torch.manual_seed(11)
        self.style = style
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.pool = torch.nn.MaxPool2d(2)
        self.hidden = torch.nn.Linear(36, 16)
        self.out = torch.nn.Linear(16, 5)
        self.loss = torch.nn.CrossEntropyLoss()
        if style == "begin":
            poptorch.BeginBlock(self.conv, "one")
            poptorch.BeginBlock(self.hidden, "two")
            poptorch.BeginBlock(self.out, "three")

    @poptorch.BlockFunction("two")
    def _hidden(self, x):
        return self.hidden(x.flatten(1)).relu()

    def forward(self, x, labels=None):
        if self.style == "begin":
            x = self.out(self.hidden(self.pool(self.conv(x)).relu().flatten(1)).relu())
        else:
            with poptorch.Block("one"):
                x = self.pool(self.conv(x)).relu()
            if self.style == "function":
                x = self._hidden(x)
            else:
                with poptorch.Block("two"):
                    x = self.hidden(x.flatten(1)).relu()
            with poptorch.Block("three"):
                x = self.out(x)
        if labels is None:
            return x
        with poptorch.Block("three"):
            loss = self.loss(x, labels)
        return x, loss


def _data(n, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def _reference(style, x, y, rows, micro, lr):
    """Eager torch: each step's `micro` micro-batches of `rows`, their gradients averaged (PopTorch's mean)."""
    model = _Staged(style)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    outs, losses = [], []
    for step in range(len(x) // (rows * micro)):
        opt.zero_grad()
        step_losses = []
        for m in range(micro):
            at = (step * micro + m) * rows
            out, loss = model(x[at:at + rows], y[at:at + rows])
            (loss / micro).backward()
            outs.append(out.detach())
            step_losses.append(loss.item())
        opt.step()
        losses.append(sum(step_losses) / micro)
    return model, torch.cat(outs), losses


def _stage_strategy(kind):
    if kind == "pipelined":
        return poptorch.PipelinedExecution(poptorch.Stage("one").ipu(0), poptorch.Stage("two").ipu(1),
                                           poptorch.Stage("three").ipu(2))
    if kind == "sharded":
        return poptorch.ShardedExecution("one", "two", "three")
    if kind == "two stages":
        return poptorch.PipelinedExecution(poptorch.Stage("one", "two"), poptorch.Stage("three"))
    return None  # blocks and no strategy: pipelined, a stage per block, as PopTorch runs them


@pytest.mark.parametrize("style,kind,replicas", [
    ("block", "pipelined", 1), ("begin", None, 1), ("function", "sharded", 1), ("block", "two stages", 2)])
def test_blocks_train_as_the_model_on_one_device(style, kind, replicas):
    """Losses, every micro-batch's output (OutputMode.All) and the trained weights, against eager torch."""
    rows, acc, iters = 4, 3, 2
    micro = acc * replicas
    x, y = _data(rows * micro * iters * 2)
    ref, want_out, want_loss = _reference(style, x, y, rows, micro, lr=0.01)
    opts = poptorch.Options().deviceIterations(iters).replicationFactor(replicas)
    opts.Training.gradientAccumulation(acc)
    opts.outputMode(poptorch.OutputMode.All)
    strategy = _stage_strategy(kind)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    model = _Staged(style)
    training = poptorch.trainingModel(model, opts, poptorch.optim.AdamW(model.parameters(), lr=0.01))
    loader = poptorch.DataLoader(opts, torch.utils.data.TensorDataset(x, y), batch_size=rows)
    got_out, got_loss = [], []
    for xb, yb in loader:
        out, loss = training(xb, yb)
        got_out.append(out)
        got_loss.append(loss)
    stages = 2 if kind == "two stages" else 3
    assert training._program.pipeline_stages == stages
    np.testing.assert_allclose(torch.cat(got_loss).numpy(), want_loss, rtol=2e-5)
    torch.testing.assert_close(torch.cat(got_out), want_out, rtol=2e-5, atol=2e-6)
    want = ref.state_dict()
    for name, p in model.state_dict().items():  # synced implicitly
        torch.testing.assert_close(p, want[name], rtol=2e-5, atol=2e-6, msg=name)
    # Each layer's nodes were tagged with its block's stage.
    tags = {}
    for n in onnx.load(os.path.join(training._source._dir, "model.onnx")).graph.node:
        meta = {p.key: p.value for p in n.metadata_props}
        assert "aspen_block" not in meta.get("pkg.torch.onnx.name_scopes", "")
        tags.setdefault(n.op_type, set()).add(int(meta["aspen.stage"]))
    assert tags["Conv"] == {0}
    assert tags["SoftmaxCrossEntropyLoss"] == {stages - 1}
    # The tutorials' evaluation: the same module in an inference model (blocks run, stages unused).
    model.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(poptorch.inferenceModel(model)(x[:8]), ref(x[:8]), rtol=2e-5, atol=2e-6)


def test_strategies_naming_blocks_wrongly_are_refused_by_name():
    x, y = _data(4)

    def train(strategy):
        opts = poptorch.Options().setExecutionStrategy(strategy)
        model = _Staged("block")
        return poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))(x, y)

    with pytest.raises(ValueError, match=r"Stage\('four',\): block 'four': expected a block forward runs "
                                         r"\(one, two, three\)"):
        train(poptorch.PipelinedExecution("one", "two", "three", "four"))
    with pytest.raises(ValueError, match="block 'three': expected in a Stage of the strategy"):
        train(poptorch.PipelinedExecution("one", "two"))
    with pytest.raises(ValueError, match="block 'two': expected in one Stage, found in stages 1 and 2"):
        train(poptorch.PipelinedExecution(poptorch.Stage("one"), poptorch.Stage("two"), poptorch.Stage("two", "three")))
    with pytest.raises(ValueError, match="Block: user_id: expected a name without"):
        poptorch.Block("a/b")
    with pytest.raises(TypeError, match="setExecutionStrategy: expected aspen.poptorch.PipelinedExecution"):
        poptorch.Options().setExecutionStrategy("pipelined")


def test_blocks_by_ipu_share_a_stage():
    """Blocks naming IPUs (no strategy): AutoStage.SameAsIpu puts the blocks of one IPU on one stage."""

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(2)
            self.a, self.b, self.c = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

        def forward(self, x, labels):
            with poptorch.Block("a", ipu_id=0):
                x = self.a(x).tanh()
            with poptorch.Block("b", ipu_id=0):
                x = self.b(x).tanh()
            with poptorch.Block("c", ipu_id=1):
                return torch.nn.functional.cross_entropy(self.c(x), labels)

    model = Two()
    ref = Two()
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    training = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        loss = training(x, y)
        opt.zero_grad()
        want = ref(x, y)
        want.backward()
        opt.step()
        np.testing.assert_allclose(float(loss), want.item(), rtol=1e-5)
    assert training._program.pipeline_stages == 2


def test_stochastic_rounding_through_pipeline_stages_equals_one_device():
    """Precision.enableStochasticRounding with stages: every stage takes the micro-batch's seed (its backward's
    recomputed forward draws what its forward drew), so three stages round as one stage does; off, the losses
    differ."""
    x, y = _data(16)

    def run(stages, stochastic=True):
        opts = poptorch.Options().randomSeed(5)
        opts.Training.gradientAccumulation(4)
        strategy = (poptorch.PipelinedExecution("one", "two", "three") if stages == 3 else
                    poptorch.PipelinedExecution(poptorch.Stage("one", "two", "three")))
        opts.setExecutionStrategy(strategy)
        opts.Precision.setComputeType(torch.half)
        opts.Precision.enableStochasticRounding(stochastic)
        model = _Staged("block")
        training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
        losses = [float(training(x, y)[1]) for _ in range(4)]
        assert training._program.pipeline_stages == stages
        return losses

    one, three = run(1), run(3)
    np.testing.assert_allclose(three, one, rtol=1e-6)  # another seed moves them by 1e-5
    nearest = run(3, stochastic=False)
    assert max(abs(a - b) for a, b in zip(nearest, three)) > 1e-5


def test_unnamed_blocks_and_a_strategy_without_blocks():
    """Blocks without a user_id (a new Block or BlockFunction() on every call) name alike in the eager run and
    the trace, a stage each; a strategy naming stages of a forward without blocks is refused by name."""

    class Unnamed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(5)
            self.a, self.b = torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)

        @poptorch.BlockFunction(ipu_id=1)
        def head(self, x, labels):
            return torch.nn.functional.cross_entropy(self.b(x), labels)

        def forward(self, x, labels):
            with poptorch.Block(ipu_id=0):
                x = self.a(x).relu()
            return self.head(x, labels)

    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    model, ref = Unnamed(), Unnamed()
    training = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        loss = float(training(x, y))
        opt.zero_grad()
        want = ref(x, y)
        want.backward()
        opt.step()
        np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    assert training._program.pipeline_stages == 2

    plain = torch.nn.Sequential(torch.nn.Linear(6, 3))

    class NoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = plain

        def forward(self, x, labels):
            return torch.nn.functional.cross_entropy(self.net(x), labels)

    m = NoBlocks()
    opts = poptorch.Options().setExecutionStrategy(poptorch.PipelinedExecution("one", "two"))
    with pytest.raises(ValueError, match=r"PipelinedExecution: expected a forward that enters the blocks its stages "
                                         r"name \(one, two\), found no block"):
        poptorch.trainingModel(m, opts, torch.optim.SGD(m.parameters(), lr=0.1))(x, y)


def test_ops_before_the_first_block_run_on_ipu_0():
    """PopTorch places the layers before the first BeginBlock on IPU 0: with the only block on IPU 1 they make
    stage 0 of two, which trains as one device accumulating the same micro-batches."""
    class Tail(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(4)
            self.fc1 = torch.nn.Linear(12, 16)
            self.fc2 = poptorch.BeginBlock(torch.nn.Linear(16, 5), "tail", ipu_id=1)

        def forward(self, x, labels):
            out = self.fc2(self.fc1(x).relu())
            return out, torch.nn.functional.cross_entropy(out, labels)

    g = torch.Generator().manual_seed(9)
    x, y = torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)

    def run(strategy):
        opts = poptorch.Options()
        opts.Training.gradientAccumulation(4)
        if strategy is not None:
            opts.setExecutionStrategy(strategy)
        model = Tail()
        training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
        return [float(training(x, y)[1]) for _ in range(3)], training._program.pipeline_stages

    piped, stages = run(None)
    one, single = run(poptorch.PipelinedExecution(poptorch.Stage("tail")))
    assert (stages, single) == (2, 1)
    np.testing.assert_allclose(piped, one, rtol=1e-6)
