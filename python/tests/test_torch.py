"""aspen.inferenceModel and aspen.trainingModel on torch.nn.Modules (exported with torch.onnx): outputs
equal the module's own, 10 AdamW steps equal torch's own, copyWeightsToHost writes the module's
parameters, replicas equal accumulation bit for bit, and torch tensors go in and come out without copies."""

import copy

import numpy as np
import pytest

import torch  # required: scripts/install-deps.sh installs it
import torch.nn.functional as F

import aspen
from conftest import aspen_sgd_losses, assert_same_parameters, sgd_losses, assert_close, loss_value


class Mlp(torch.nn.Module):
    def __init__(self, d_in=12, d_hidden=32, classes=5):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.norm = torch.nn.LayerNorm(d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, classes)

    def forward(self, x, labels):
        logits = self.fc2(F.gelu(self.norm(self.fc1(x))))
        return logits, F.cross_entropy(logits, labels)


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d=32, heads=4, vocab=50):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, d)
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids, targets):
        x = self.embed(ids)
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        x = x + self.down(F.gelu(self.up(self.ln2(x))))
        logits = self.head(x)
        return logits, F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def mlp_data(steps, batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 12, generator=g), torch.randint(0, 5, (batch,), generator=g)) for _ in range(steps)]


def block_data(steps, batch=2, seq=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, 50, (batch, seq + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def make(kind, seed=0):
    torch.manual_seed(seed)
    return Mlp() if kind == "mlp" else Block()


def data(kind, steps, **kw):
    return mlp_data(steps, **kw) if kind == "mlp" else block_data(steps, **kw)


@pytest.mark.parametrize("kind", ["mlp", "block"])
def test_inference_equals_the_module(kind):
    model = make(kind).eval()
    x, y = data(kind, 1)[0]
    with torch.no_grad():
        want_logits, want_loss = model(x, y)
    compiled = aspen.inferenceModel(model)
    logits, loss = compiled(x, y)
    assert isinstance(logits, torch.Tensor) and isinstance(loss, torch.Tensor)
    assert_close(logits.numpy(), want_logits.numpy(), atol=1e-5, what=f"{kind} logits")
    assert_close(loss.numpy(), want_loss.numpy(), atol=1e-5, what=f"{kind} loss")
    # numpy in, numpy out
    logits_np, _ = compiled(x.numpy(), y.numpy())
    assert isinstance(logits_np, np.ndarray)
    np.testing.assert_array_equal(logits_np, logits.numpy())


def test_torch_tensors_cross_without_copies():
    model = make("mlp").eval()
    x, y = data("mlp", 1)[0]
    compiled = aspen.inferenceModel(model)
    compiled(x, y)
    before = aspen.input_copies()
    logits, _ = compiled(x, y)
    assert aspen.input_copies() == before
    # The returned tensor shares aspen's buffer (torch.from_numpy over the capsule-owned array).
    base = logits.numpy()
    assert not base.flags.owndata
    # A transposed (non-contiguous) input: one counted copy, the same result.
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    logits2, _ = compiled(xt, y)
    assert aspen.input_copies() == before + 1
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)


def torch_steps(model, batches, lr=1e-3, weight_decay=0.01, outputs=None):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        out, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if outputs is not None:
            outputs.append(out.detach())
    return losses


@pytest.mark.parametrize("kind", ["mlp", "block"])
def test_ten_adamw_steps_equal_torch(kind):
    batches = data(kind, 10)
    ref = make(kind)
    want = torch_steps(ref, batches)
    model = make(kind)
    training = aspen.trainingModel(model, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-3,
                                                                      weight_decay=0.01))
    got = [loss_value(training(x, y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # Before copyWeightsToHost the module still holds its initial weights; after, aspen's.
    first = make(kind)
    for (n, p), (_, p0) in zip(model.named_parameters(), first.named_parameters()):
        torch.testing.assert_close(p, p0, rtol=0, atol=0, msg=n)
    training.copyWeightsToHost()
    for (n, p), (_, pr) in zip(model.named_parameters(), ref.named_parameters()):
        if n == "qkv.bias":
            # The key bias adds the same amount to every score of a query row, which softmax cancels: its
            # gradient is rounding noise in both, which Adam's normalization turns into steps of random sign.
            d = p.shape[0] // 3
            torch.testing.assert_close(p[:d], pr[:d], rtol=1e-4, atol=2e-6, msg=n)
            torch.testing.assert_close(p[2 * d:], pr[2 * d:], rtol=1e-4, atol=2e-6, msg=n)
            continue
        torch.testing.assert_close(p, pr, rtol=1e-4, atol=2e-6, msg=n)


def test_replicas_equal_gradient_accumulation_bit_for_bit():
    batches = data("mlp", 3, batch=8)
    combined = [(x, y) for x, y in batches]

    def run(opts):
        model = make("mlp")
        training = aspen.trainingModel(model, opts, optimizer=aspen.optim.SGD(model.parameters(), lr=0.1,
                                                                              momentum=0.9))
        losses = [training(x, y)[1].numpy().copy() for x, y in combined]
        training.copyWeightsToHost()
        return losses, [p.detach().clone() for p in model.parameters()]

    r_losses, r_params = run(aspen.Options().replicationFactor(2))
    a_opts = aspen.Options()
    a_opts.Training.gradientAccumulation(2)
    a_losses, a_params = run(a_opts)
    for a, b in zip(r_losses, a_losses):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(r_params, a_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["All", "Final", "Sum", "EveryN"])
def test_device_iterations_in_training_by_output_mode(mode):
    """A call returns what forward returns, (output, loss), each by the output mode (NOTE [training
    outputs]): the outputs of the steps the mode picks, as forward computed them before each update."""
    batches = data("mlp", 4)
    ref = make("mlp")
    outs = []
    want = torch_steps(ref, batches, outputs=outs)
    opts = aspen.Options().deviceIterations(4)
    if mode == "EveryN":
        opts.outputMode(aspen.OutputMode.EveryN, 2)
    else:
        opts.outputMode(getattr(aspen.OutputMode, mode))
    model = make("mlp")
    training = aspen.trainingModel(model, opts, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    out, loss = training(x, y)
    got = loss.numpy()
    if mode == "All":
        np.testing.assert_allclose(got, want, rtol=1e-4)
        want_out = torch.cat(outs)
    elif mode == "Final":
        np.testing.assert_allclose(got, want[-1], rtol=1e-4)
        want_out = outs[-1]
    elif mode == "EveryN":
        np.testing.assert_allclose(got, [want[1], want[3]], rtol=1e-4)
        want_out = torch.cat([outs[1], outs[3]])
    else:
        np.testing.assert_allclose(got, sum(want), rtol=1e-4)
        want_out = sum(outs)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-5)
    assert [s["step"] for s in training.lastSteps()] == [1, 2, 3, 4]


def test_set_optimizer_changes_the_learning_rate_without_recompiling():
    batches = data("mlp", 4)
    ref = make("mlp")
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for i, (x, y) in enumerate(batches):
        if i == 2:
            opt.param_groups[0]["lr"] = 0.01
        opt.zero_grad()
        _, loss = ref(x, y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    model = make("mlp")
    optimizer = aspen.optim.SGD(model.parameters(), lr=0.1)
    training = aspen.trainingModel(model, optimizer=optimizer)
    got = []
    for i, (x, y) in enumerate(batches):
        if i == 2:
            optimizer.param_groups[0]["lr"] = 0.01
            training.setOptimizer(optimizer)
        got.append(loss_value(training(x, y)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="momentum"):
        training.setOptimizer(aspen.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))


def test_detach_and_come_back_goes_on_as_if_it_had_stayed():
    batches = data("mlp", 6)
    ref = make("mlp")
    want = torch_steps(ref, batches)
    model = make("mlp")
    training = aspen.trainingModel(model, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-3))
    got = [loss_value(training(x, y)) for x, y in batches[:3]]
    training.detachFromDevice()
    assert not training.isCompiled()
    got += [loss_value(training(x, y)) for x, y in batches[3:]]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    training.copyWeightsToHost()
    for (n, p), (_, pr) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, pr, rtol=1e-4, atol=2e-6, msg=n)


def test_frozen_parameters_stay_put():
    model = make("mlp")
    model.fc1.weight.requires_grad_(False)
    before = model.fc1.weight.detach().clone()
    fc2_before = model.fc2.weight.detach().clone()
    training = aspen.trainingModel(model, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-2))
    for x, y in data("mlp", 3):
        training(x, y)
    training.copyWeightsToHost()
    torch.testing.assert_close(model.fc1.weight, before, rtol=0, atol=0)
    assert not torch.equal(model.fc2.weight, fc2_before)


def test_a_named_loss_over_a_module_that_returns_logits():
    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(12, 5)

        def forward(self, x):
            return self.fc(x)

    torch.manual_seed(0)
    ref = Logits()
    model = copy.deepcopy(ref)
    batches = mlp_data(3)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(ref(x), y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.parameters(), lr=0.1), loss="cross_entropy")
    got = [loss_value(training(x, targets=y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_torch_errors():
    model = make("mlp")
    with pytest.raises(ValueError, match="expected an aspen.optim optimizer .* or a torch.optim one .*found builtins.str"):
        aspen.trainingModel(model, optimizer="sgd")
    with pytest.raises(NotImplementedError, match="amsgrad"):
        aspen.optim.AdamW(model.parameters(), amsgrad=True)
    with pytest.raises(NotImplementedError, match=r"param_groups\[1\]: settings nesterov: expected only lr"):
        aspen.optim.SGD([{"params": [model.fc1.weight]}, {"params": [model.fc2.weight], "nesterov": True}], lr=0.1)
    with pytest.raises(ValueError, match="not one"):
        other = torch.nn.Linear(3, 3)
        training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(other.parameters(), lr=0.1))
        training(*data("mlp", 1)[0])

    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(12, 5)

        def forward(self, x):
            return self.fc(x)

    with pytest.raises(ValueError, match="expected \\(output, loss\\) or a loss"):
        aspen.trainingModel(NoLoss())(torch.randn(4, 12))


def test_optimizer_arguments_are_refused_by_name():
    """A misspelt parameter name was once dropped (that parameter silently not trained), inf and nan were
    taken for lr, eps, weight_decay and momentum, betas and momentum out of [0, 1) were refused only at the
    first call by the graph, and betas=0.9, params=5 or a str failed with Python's own words or trained a
    parameter named 'w'. numpy's scalars are numbers."""

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.fc2 = torch.nn.Linear(2, 2)

        def forward(self, a, b):
            out = self.fc2(self.fc(a))
            return out, F.mse_loss(out, b)

    with pytest.raises(ValueError, match=r"^optimizer params\[1\]: expected a parameter name of Two \(fc.weight, "
                                         r"fc.bias, fc2.weight, fc2.bias\), found 'fc2.wieght'$"):
        aspen.trainingModel(Two(), optimizer=aspen.optim.SGD(["fc.weight", "fc2.wieght"], lr=0.5))
    with pytest.raises(ValueError, match=r"^optimizer params\[0\]: expected a parameter of Two or its name, found 3$"):
        aspen.trainingModel(Two(), optimizer=aspen.optim.SGD([3], lr=0.5))
    model = Two()
    before, before2 = model.fc.weight.detach().clone(), model.fc2.weight.detach().clone()
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(["fc2.weight"], lr=0.5))
    training(torch.randn(2, 4), torch.ones(2, 2))
    training.copyWeightsToHost()
    torch.testing.assert_close(model.fc.weight, before, rtol=0, atol=0)  # names choose what trains
    assert not torch.equal(model.fc2.weight, before2)

    inf, nan = float("inf"), float("nan")
    cases = [(lambda: aspen.optim.AdamW(None, lr=inf), r"lr: expected a finite number >= 0, found inf"),
             (lambda: aspen.optim.AdamW(None, eps=inf), r"eps: expected a finite number >= 0, found inf"),
             (lambda: aspen.optim.AdamW(None, weight_decay=nan),
              r"weight_decay: expected a finite number >= 0, found nan"),
             (lambda: aspen.optim.SGD(None, lr=0.1, weight_decay=inf), r"weight_decay: expected a finite number >= 0, "
                                                                       r"found inf"),
             (lambda: aspen.optim.SGD(None, lr=0.1, momentum=5), r"momentum: expected a number in \[0, 1\), found 5"),
             (lambda: aspen.optim.SGD(None, lr=0.1, momentum=nan),
              r"momentum: expected a number in \[0, 1\), found nan"),
             (lambda: aspen.optim.SGD(None, lr=0.1, nesterov="yes"), r"nesterov: expected a bool \(True or False\), "
                                                                     r"found 'yes'"),
             (lambda: aspen.optim.AdamW(None, betas=(1.5, 0.999)), r"betas\[0\]: expected a number in \[0, 1\), "
                                                                   r"found 1.5"),
             (lambda: aspen.optim.LAMB(None, betas=(0.9, 1.0)),
              r"betas\[1\]: expected a number in \[0, 1\), found 1.0"),
             (lambda: aspen.optim.AdamW(None, betas=0.9), r"betas: expected a pair \(beta1, beta2\), found 0.9"),
             (lambda: aspen.optim.AdamW(None, betas=(0.9, 0.99, 0.5)), r"betas: expected a pair \(beta1, beta2\), "
                                                                       r"found \(0.9, 0.99, 0.5\)"),
             (lambda: aspen.optim.AdamW(5), r"params: expected an iterable of parameters or of their names \(None: "
                                            r"every parameter\), found 5"),
             (lambda: aspen.optim.AdamW("w"), r"params: expected an iterable of parameters or of their names \(None: "
                                              r"every parameter\), found 'w'"),
             (lambda: aspen.optim.AdamW(torch.zeros(3)), r"params: expected an iterable of parameters or of their "
                                                         r"names, found a Tensor \(wrap it in a list\)"),
             (lambda: aspen.optim.AdamW(None, loss_scaling="static"), r"loss_scaling: expected a finite number > 0, "
                                                                      r"'dynamic' or None, found 'static'")]
    for call, message in cases:
        with pytest.raises(ValueError, match="^" + message + "$"):
            call()
    assert aspen.optim.AdamW(None, lr=np.float32(0.5), betas=(np.float64(0.5), 0.25)).lr == 0.5
    assert aspen.optim.SGD([], lr=np.float64(0.1), loss_scaling=np.float32(128)).loss_scaling == 128.0


def test_executable_cache_is_hit_by_a_second_model(tmp_path):
    x, y = data("mlp", 1)[0]
    opts = aspen.Options().enableExecutableCaching(tmp_path / "cache")
    first = aspen.inferenceModel(make("mlp").eval(), opts)
    a, _ = first(x, y)
    assert not first._program.cache_hit
    second = aspen.inferenceModel(make("mlp").eval(), opts)
    b, _ = second(x, y)
    assert second._program.cache_hit
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("scaling", [128.0, "dynamic"])
def test_loss_scaling_leaves_f32_training_unchanged(scaling):
    batches = data("mlp", 4)

    def run(loss_scaling):
        model = make("mlp")
        training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.parameters(), lr=0.1,
                                                                        loss_scaling=loss_scaling))
        return [loss_value(training(x, y)) for x, y in batches], training.lastSteps()

    plain, _ = run(None)
    scaled, steps = run(scaling)
    np.testing.assert_allclose(scaled, plain, rtol=1e-6)
    assert steps[-1]["loss_scale"] >= 1.0 and not steps[-1]["skipped"]
    with pytest.raises(ValueError, match="loss_scaling"):
        aspen.optim.SGD([], lr=0.1, loss_scaling=-1)


def test_lamb_trains():
    batches = data("mlp", 1) * 8
    model = make("mlp")
    training = aspen.trainingModel(model, optimizer=aspen.optim.LAMB(model.parameters(), lr=1e-2))
    losses = [loss_value(training(x, y)) for x, y in batches]
    assert losses[-1] < 0.8 * losses[0]


def test_an_onnx_file_called_with_torch_tensors_returns_torch_tensors():
    from conftest import TESTDATA, read_onnx_tensor
    d = TESTDATA / "onnx" / "mlp_ts"
    x = read_onnx_tensor(d / "input_0.pb")
    model = aspen.inferenceModel(d / "model.onnx")
    y_np = model(x)
    y_t = model(torch.from_numpy(x))
    assert isinstance(y_t, torch.Tensor)
    np.testing.assert_array_equal(y_t.numpy(), y_np)


def test_export_onnx_writes_the_trained_weights(tmp_path):
    import onnxruntime as ort
    model = make("mlp")
    training = aspen.trainingModel(model, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-2))
    for x, y in data("mlp", 3):
        training(x, y)
    training.exportOnnx(tmp_path / "trained.onnx")
    training.copyWeightsToHost()
    x, y = data("mlp", 1, seed=5)[0]
    with torch.no_grad():
        want = model(x, y)[0].numpy()
    session = ort.InferenceSession(str(tmp_path / "trained.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: v for i, v in zip(session.get_inputs(), (x.numpy(), y.numpy()))}
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)


class OpenEndedSlices(torch.nn.Module):
    """A loss on open-ended slices, as people write them: torch's training export writes the end as the
    int64 maximum (through a Cast), which an empty slice once silently took the place of."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 4)

    def forward(self, x, labels):
        o = self.fc(x)  # [B, T, 4]
        shifted = F.cross_entropy(o[:, :-1].reshape(-1, 4), labels[:, 1:].reshape(-1))  # the shifted LM loss
        return o, (o[:, 1:] ** 2).sum() + (o ** 2).mean() + o[1:, 2::3].sum() + shifted


def test_open_ended_slices_in_a_training_loss_equal_torch():
    torch.manual_seed(0)
    ref = OpenEndedSlices()
    model = copy.deepcopy(ref)
    x = torch.randn(6, 8, 12)
    labels = torch.randint(0, 4, (6, 8))
    want_out, want_loss = ref(x, labels)
    got_out, got_loss = aspen.inferenceModel(copy.deepcopy(ref))(x, labels)
    np.testing.assert_allclose(float(got_loss), float(want_loss.detach()), rtol=1e-5)
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.parameters(), lr=0.01))
    np.testing.assert_allclose(loss_value(training(x, labels)), float(want_loss.detach()), rtol=1e-5)
    # One SGD step of torch's own gives the weights aspen's step gave.
    opt = torch.optim.SGD(ref.parameters(), lr=0.01)
    opt.zero_grad()
    ref(x, labels)[1].backward()
    opt.step()
    training.copyWeightsToHost()
    for (n, p), (_, pr) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, pr, rtol=1e-5, atol=1e-6, msg=n)


class _Dropped(torch.nn.Module):
    """loss = sum(dropout(x) * w): the gradient of w is dropout(x), so one SGD step shows the mask."""

    def __init__(self, n, p):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(n))
        self.drop = torch.nn.Dropout(p)

    def forward(self, x):
        d = self.drop(x)
        return d, (d * self.w).sum()


def test_dropout_trains_with_one_mask_forward_and_backward():
    n, p, lr = 4096, 0.25, 0.5
    x = torch.rand(n) + 0.5

    def steps(seed, calls):
        model = _Dropped(n, p)
        opts = aspen.Options().randomSeed(seed)
        training = aspen.trainingModel(model, opts, optimizer=aspen.optim.SGD(model.parameters(), lr=lr))
        out = []
        for _ in range(calls):
            before = model.w.detach().clone()
            loss = loss_value(training(x))
            training.copyWeightsToHost()
            out.append((loss, (before - model.w.detach()) / lr, before))
        return out

    (loss, d, w0), (_, d2, _) = steps(7, 2)
    kept = d != 0
    # Each element is dropped or scaled by 1 / (1 - p); the loss saw the mask the gradient saw.
    torch.testing.assert_close(d[kept], x[kept] / (1 - p), rtol=1e-5, atol=1e-6)
    assert abs(kept.float().mean().item() - (1 - p)) < 0.03
    assert abs(loss - float((d * w0).sum())) <= 1e-4 * abs(loss)
    assert not torch.equal(d2 != 0, kept), "the next step draws another mask"
    (_, again, _), = steps(7, 1)
    torch.testing.assert_close(again, d, rtol=0, atol=0)  # the same seed: the same masks
    (_, other, _), = steps(8, 1)
    assert not torch.equal(other != 0, kept)


def test_dropout_is_the_identity_in_inference():
    model = _Dropped(64, 0.5)
    x = torch.rand(64)
    out, loss = aspen.inferenceModel(model)(x)
    torch.testing.assert_close(torch.as_tensor(out), x)


def _hf_causal_lms():
    import transformers
    small = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=32)
    return {
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
            intermediate_size=64, num_key_value_heads=2, bos_token_id=0, eos_token_id=0, pad_token_id=0, **small)),
    }


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hugging_face_models_train_as_they_are(family):
    """A Hugging Face model passed as it is: inputs bound by name (forward(**kwargs)), its own labels= loss
    (the shifted cross-entropy, Pad and all; Llama's rotary Sin/Cos), use_cache left to aspen."""
    make = _hf_causal_lms()[family]
    torch.manual_seed(0)
    ref = make()
    model = make()
    model.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(1)
    batches = [dict(input_ids=ids, labels=ids) for ids in (torch.randint(1, 97, (2, 16), generator=g) for _ in range(10))]
    want = sgd_losses(ref, batches, lr=0.1)
    training, got = aspen_sgd_losses(model, batches, lr=0.1)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    with pytest.raises(ValueError, match=r"input 'use_cache': expected False \(the value the program was compiled"):
        training(**batches[0], use_cache=True)


class _Warp(torch.nn.Module):
    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(x, grid, align_corners=False)  # GridSample: not converted


class _Warped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.warp = _Warp()

    def forward(self, x, grid):
        return self.warp(self.conv(x), grid)


def test_an_unsupported_layer_is_named_with_its_module_and_line():
    with pytest.raises(NotImplementedError) as e:
        aspen.inferenceModel(_Warped())(torch.randn(1, 1, 6, 6), torch.rand(1, 4, 4, 2) * 2 - 1)
    text = str(e.value)
    assert text.startswith("_Warped (exported by torch.onnx): 1 node(s)"), text
    assert "(GridSample; from torch: layer 'warp' (_Warp), aten.grid_sampler" in text, text
    assert "test_torch.py line" in text, text
    assert "aspen-torch-" not in text and "hint" not in text, text
