"""aspen.poptorch: PopTorch's API as PopTorch programs use it (W3.3), checked against eager PyTorch.

Graphcore's tutorials are the acceptance suite; these are the project's own tests of what they use."""

import copy
import warnings

import numpy as np
import pytest
import torch

import aspen.poptorch as poptorch
import aspen.optim as aspen_optim


class _Classifier(torch.nn.Module):
    """The tutorials' pattern: forward(x, labels=None), the loss when labels are given."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        out = self.net(x)
        if labels is None:
            return out
        return self.loss(out, labels)


def _batches(n, rows=8, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 12, generator=g), torch.randint(0, 4, (rows,), generator=g)) for _ in range(n)]


def _torch_losses(model, opt, batches, sched=None):
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def _aspen_losses(training, opt, batches, sched):
    """A training model's losses with torch's scheduler stepping the optimizer and setOptimizer passing it on."""
    losses = []
    for x, y in batches:
        losses.append(float(training(x, y)))
        sched.step()
        training.setOptimizer(opt)
    return losses


# --- the data loader -------------------------------------------------------------------------------------

class _Numbers(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i


@pytest.mark.parametrize("mode", [poptorch.DataLoaderMode.Sync, poptorch.DataLoaderMode.Async,
                                  poptorch.DataLoaderMode.AsyncRebatched])
def test_data_loader_yields_combined_batches_each_sample_once(mode):
    opts = poptorch.Options().deviceIterations(3)
    opts.Training.gradientAccumulation(2)
    loader = poptorch.DataLoader(opts, _Numbers(100), batch_size=4, shuffle=True, mode=mode,
                                 rebatched_worker_size=5 if mode is poptorch.DataLoaderMode.AsyncRebatched else None)
    assert loader.combinedBatchSize == 24
    assert len(loader) == 4  # drop_last by default: 100 // 24
    for _epoch in range(2):
        seen = []
        for x, i in loader:
            assert x.shape == (24, 1) and i.shape == (24,)
            torch.testing.assert_close(x[:, 0], i.float())
            seen += i.tolist()
        assert len(seen) == 96 and len(set(seen)) == 96  # each sample at most once, a whole combined batch each
    assert loader.samples_seen == 2 * 96
    loader.terminate()


@pytest.mark.parametrize("mode", [poptorch.DataLoaderMode.Sync, poptorch.DataLoaderMode.AsyncRebatched])
def test_a_tensor_dataset_is_gathered_into_the_batches_torch_collates(mode):
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(50, 2, 3, generator=g), torch.arange(50),
                                          torch.randn(50, generator=g).double())
    opts = poptorch.Options().deviceIterations(2)
    kw = dict(batch_size=4, shuffle=True, drop_last=False)
    loader = poptorch.DataLoader(opts, data, mode=mode, rebatched_worker_size=3 if mode.value == 2 else None,
                                 generator=torch.Generator().manual_seed(7), **kw)
    reference = torch.utils.data.DataLoader(data, batch_size=8 if mode.value == 0 else 3, shuffle=True,
                                            drop_last=False, generator=torch.Generator().manual_seed(7))
    got, want = list(loader), list(reference)
    assert type(loader.dataset).__getitems__ is not None and isinstance(loader.dataset,
                                                                         torch.utils.data.TensorDataset)
    if mode.value == 2:  # rebatched: the same rows, joined into combined batches
        cat = [torch.cat([b[k] for b in want]) for k in range(3)]
        want = [[c[i:i + 8] for c in cat] for i in range(0, 50, 8)]
    assert len(got) == len(want) == 7
    for a, b in zip(got, want):
        assert isinstance(a, list) and len(a) == 3
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.is_contiguous()
            torch.testing.assert_close(x, y, rtol=0, atol=0)

    class Squares(torch.utils.data.TensorDataset):  # its own rows: read one by one, as torch does
        def __getitem__(self, i):
            return self.tensors[0][i] ** 2,
    plain = poptorch.DataLoader(opts, Squares(torch.arange(6.0)), batch_size=3)
    assert [b[0].tolist() for b in plain] == [[0.0, 1.0, 4.0, 9.0, 16.0, 25.0]]
    halves = torch.utils.data.TensorDataset(torch.arange(6.0).bfloat16())  # numpy has no bf16: read as torch does
    assert [b[0].tolist() for b in poptorch.DataLoader(opts, halves, batch_size=3)] == [[0, 1, 2, 3, 4, 5]]


def test_data_loader_keeps_a_short_last_batch_when_asked_and_names_bad_arguments():
    loader = poptorch.DataLoader(poptorch.Options().deviceIterations(2), _Numbers(10), batch_size=3,
                                 drop_last=False)
    assert [len(i) for _, i in loader] == [6, 4]
    rebatched = poptorch.DataLoader(poptorch.Options().deviceIterations(2), _Numbers(10), batch_size=3,
                                    drop_last=False, mode=poptorch.DataLoaderMode.AsyncRebatched,
                                    rebatched_worker_size=2)
    assert len(rebatched) == 2 and sorted(sum((i.tolist() for _, i in rebatched), [])) == list(range(10))
    with pytest.raises(ValueError, match="async_options: expected keys among .* found bogus"):
        poptorch.DataLoader(poptorch.Options(), _Numbers(4), async_options={"bogus": 1})
    with pytest.raises(ValueError, match="rebatched_worker_size: expected at most the combined batch 3, found 4"):
        poptorch.DataLoader(poptorch.Options(), _Numbers(4), batch_size=3,
                            mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=4)


def test_async_loader_raises_the_dataset_error_where_the_loop_reads():
    class Broken(_Numbers):
        def __getitem__(self, i):
            if i == 7:
                raise KeyError("sample 7 is corrupt")
            return super().__getitem__(i)

    loader = poptorch.DataLoader(poptorch.Options(), Broken(10), batch_size=2, mode=poptorch.DataLoaderMode.Async)
    with pytest.raises(KeyError, match="sample 7 is corrupt"):
        for _ in loader:
            pass


# --- options ---------------------------------------------------------------------------------------------

def test_ipu_settings_are_accepted_and_reported_once():
    from aspen import options
    options._REPORTED.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opts = poptorch.Options().deviceIterations(20).replicationFactor(1).randomSeed(123).useIpuModel(True)
        opts.useIpuModel(True)
        opts.TensorLocations.setOptimizerLocation(None)
        opts._Popart.set("defaultPrefetchBufferingDepth", 3)
    texts = [str(x.message) for x in w]
    assert texts.count("aspen.Options.useIpuModel: the IPU Model is a simulated IPU; it has no effect on a CPU") == 1
    assert any("TensorLocations.setOptimizerLocation" in t for t in texts)
    assert opts.device_iterations == 20
    with pytest.raises(AttributeError, match="setAutomaticLoadBalancing: a PopTorch option aspen does not support"):
        opts.setAutomaticLoadBalancing(True)


def test_cloned_options_are_independent():
    opts = poptorch.Options().deviceIterations(4)
    opts.Training.gradientAccumulation(3)
    copy = opts.clone()
    copy.Training.gradientAccumulation(1)
    copy.deviceIterations(12)
    assert (opts.gradient_accumulation, opts.device_iterations) == (3, 4)
    assert (copy.gradient_accumulation, copy.device_iterations) == (1, 12)
    with pytest.raises(ValueError, match="expected Training.gradientAccumulation 1"):
        poptorch.inferenceModel(_Classifier(), opts)


# --- optimizers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["torch_sgd", "torch_adam", "poptorch_adamw", "default", "torch_rmsprop",
                                  "poptorch_rmsprop_centered", "torch_adam_l2"])
def test_optimizers_train_as_torch_optim(kind):
    batches = _batches(6)

    def make(model):
        params = model.parameters()
        return {"torch_sgd": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
                "torch_adam": lambda: torch.optim.Adam(params, lr=0.01),
                "poptorch_adamw": lambda: poptorch.optim.AdamW(params, lr=0.01, weight_decay=0.05,
                                                               accum_type=torch.float32, loss_scaling=None),
                "default": lambda: torch.optim.SGD(params, lr=0.01),
                "torch_rmsprop": lambda: torch.optim.RMSprop(params, lr=0.01, alpha=0.9, weight_decay=1e-3),
                "torch_adam_l2": lambda: torch.optim.Adam(params, lr=0.01, weight_decay=0.05),
                "poptorch_rmsprop_centered": lambda: poptorch.optim.RMSprop(params, lr=0.01, momentum=0.5,
                                                                             centered=True, eps=1e-6)}[kind]()

    ref = _Classifier()
    want = _torch_losses(ref, make(ref), batches)
    model = _Classifier()
    training = poptorch.trainingModel(model, poptorch.Options(), None if kind == "default" else make(model))
    got = [float(training(x, y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_scheduler_drives_the_learning_rate_through_set_optimizer():
    batches = _batches(6)
    ref = _Classifier()
    ref_opt = poptorch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    want = _torch_losses(ref, ref_opt, batches, torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.3))
    model = _Classifier()
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3)
    training = poptorch.trainingModel(model, optimizer=opt)
    got = _aspen_losses(training, opt, batches, sched)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _rounded_adam_losses(model, batches, accumulation, lr, grad_t, first_t, second_t, wd=0.01, b1=0.9, b2=0.999,
                         eps=1e-8):
    """torch.optim.AdamW's rule by hand, with PopTorch's types: each micro-batch's gradient rounded to grad_t and
    their sum rounded after every addition; the moments kept in first_t and second_t."""
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    losses = []
    for step in range(1, len(batches) // accumulation + 1):
        acc = [None] * len(params)
        for x, y in batches[(step - 1) * accumulation:step * accumulation]:
            model.zero_grad()
            loss = model(x, y)
            loss.backward()
            losses.append(loss.item())
            for i, p in enumerate(params):
                g = p.grad.to(grad_t).float()
                acc[i] = g if acc[i] is None else (acc[i] + g).to(grad_t).float()
        with torch.no_grad():
            for i, p in enumerate(params):
                g = acc[i] / accumulation
                m[i] = (b1 * m[i] + (1 - b1) * g).to(first_t).float()
                v[i] = (b2 * v[i] + (1 - b2) * g * g).to(second_t).float()
                p.mul_(1 - lr * wd)
                denom = (v[i] / (1 - b2 ** step)).sqrt() + eps
                p.sub_(lr / (1 - b1 ** step) * m[i] / denom)
    return losses


@pytest.mark.parametrize("accumulation", [1, 3])
def test_half_accumulation_and_state_types_train_as_rounded_torch(accumulation):
    """PopTorch's accum_type (gradients rounded and summed in float16), first_order_momentum_accum_type float16
    and second_order_momentum_accum_type bfloat16: against AdamW by hand with the same rounding; the state is
    kept in its types (half the memory), and the rounding is not a no-op (float32 types train differently)."""
    batches = _batches(6)
    ref = _Classifier()
    want = _rounded_adam_losses(ref, batches, accumulation, 0.01, torch.float16, torch.float16, torch.bfloat16)
    plain = _rounded_adam_losses(_Classifier(), batches, accumulation, 0.01, torch.float32, torch.float32,
                                 torch.float32)
    model = _Classifier()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    opt = poptorch.optim.AdamW(model.parameters(), lr=0.01, accum_type=torch.float16,
                               first_order_momentum_accum_type=torch.float16,
                               second_order_momentum_accum_type=torch.bfloat16)
    training = poptorch.trainingModel(model, opts, opt)
    got = []
    for k in range(0, len(batches), accumulation):
        if k == len(batches) // 2:  # the state leaves the device and comes back in its types
            state = training._program.optimizer_state()
            assert {str(a.dtype) for n, a in state.items() if "exp_avg." in n} == {"float16"}
            second = [a for n, a in state.items() if "exp_avg_sq." in n]  # bf16 reaches numpy as float32
            assert second and all((a.view(np.uint32) & 0xFFFF == 0).all() for a in second)
            training.detachFromDevice()
            training.attachToDevice()
        chunk = batches[k:k + accumulation]
        out = training(torch.cat([x for x, _ in chunk]), torch.cat([y for _, y in chunk]))
        got.append(float(out))  # the step's loss: the mean over its micro-batches
    want = np.asarray(want).reshape(-1, accumulation).mean(axis=1)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    assert max(abs(a - b) for a, b in zip(want, plain)) > 1e-6  # the rounding shows


@pytest.mark.parametrize("accumulation", [1, 3])
def test_half_accumulation_rounds_each_gradient_and_each_sum(accumulation):
    """accum_type float16 with plain SGD (lr 1: the weights move by the gradient itself): one step equals the
    float16 sum by hand; an f32 sum, or rounding only at the end, moves most weights differently. Up to rare
    ties of the float16 rounding that f32 ordering differences flip (an element in a thousand)."""
    batches = _batches(accumulation)

    def reference(grad_t, round_each=True):
        ref = _Classifier()
        acc = None
        for x, y in batches:
            ref.zero_grad()
            ref(x, y).backward()
            g = [p.grad.to(grad_t).float() for p in ref.parameters()]
            acc = g if acc is None else [(a + b).to(grad_t).float() if round_each else a + b for a, b in zip(acc, g)]
        with torch.no_grad():
            return torch.cat([(p - a.to(grad_t).float() / accumulation).flatten()
                              for p, a in zip(ref.parameters(), acc)])

    model = _Classifier()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=1.0,
                                                                       accum_type=torch.float16))
    training(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
    training.copyWeightsToHost()
    got = torch.cat([p.detach().flatten() for p in model.parameters()])

    def differing(want):
        return float(((got - want).abs() > 1e-7 * (1 + want.abs())).float().mean())

    assert differing(reference(torch.float16)) < 2e-3
    assert differing(reference(torch.float32)) > 0.3
    if accumulation > 1:
        assert differing(reference(torch.float16, round_each=False)) > 0.02


def test_optimizers_aspen_cannot_follow_are_refused_by_name():
    m = _Classifier()
    with pytest.raises(NotImplementedError, match="the others have no update rule"):
        poptorch.trainingModel(m, optimizer=torch.optim.Adagrad(m.parameters(), lr=0.01))
    with pytest.raises(ValueError, match="accum_type: expected torch.float32, torch.float16, torch.bfloat16 or None"):
        poptorch.optim.AdamW(m.parameters(), lr=0.01, accum_type=torch.int32)
    groups = [{"params": m.net[0].parameters()}, {"params": m.net[2].parameters(), "lr": 0.1, "dampening": 0.5}]
    with pytest.raises(NotImplementedError, match=r"param_groups\[1\]: dampening 0.5 is not supported"):
        poptorch.trainingModel(m, optimizer=torch.optim.SGD(groups, lr=0.01))


@pytest.mark.parametrize("kind", ["torch_adamw", "torch_sgd", "poptorch_adam", "torch_rmsprop"])
def test_parameter_groups_train_as_torch_optim_under_a_scheduler(kind):
    """Each group with its own learning rate and settings (NOTE [parameter groups]), a scheduler moving the
    rates in proportion through setOptimizer; against torch.optim with the same groups."""
    batches = _batches(6)

    def make(model):
        first, second = model.net[0], model.net[2]
        if kind == "torch_adamw":
            return torch.optim.AdamW([{"params": first.parameters()},
                                      {"params": [second.weight], "lr": 0.002, "weight_decay": 0.0,
                                       "betas": (0.8, 0.99)},
                                      {"params": [second.bias], "eps": 1e-4}], lr=0.01, weight_decay=0.1)
        if kind == "torch_sgd":
            return torch.optim.SGD([{"params": first.parameters(), "momentum": 0.0},
                                    {"params": second.parameters(), "lr": 0.2, "weight_decay": 0.01}],
                                   lr=0.05, momentum=0.9)
        if kind == "torch_rmsprop":
            return torch.optim.RMSprop([{"params": first.parameters(), "momentum": 0.3},
                                        {"params": second.parameters(), "lr": 0.002, "alpha": 0.9}], lr=0.01)
        return poptorch.optim.Adam([{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.03}],
                                   lr=0.01, loss_scaling=None)

    ref = _Classifier()
    ref_opt = make(ref)
    want = _torch_losses(ref, ref_opt, batches, torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5))
    model = _Classifier()
    opt = make(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    training = poptorch.trainingModel(model, optimizer=opt)
    got = _aspen_losses(training, opt, batches, sched)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    want_state = ref.state_dict()
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, want_state[name], rtol=2e-5, atol=2e-6, msg=name)
    opt.param_groups[1]["lr"] *= 3  # one group's rate alone: a ratio the program does not have
    with pytest.raises(NotImplementedError, match="setOptimizer: parameter groups: expected"):
        training.setOptimizer(opt)


def test_parameter_groups_follow_a_warm_up_from_zero_and_refuse_what_would_run_differently():
    """A LambdaLR warm-up from 0 (the ratios from the groups' initial rates), against torch; groups swapped
    after compiling, and a parameter in two groups, refused by name."""
    batches = _batches(5)

    def make(model):
        opt = torch.optim.SGD([{"params": model.net[0].parameters()}, {"params": model.net[2].parameters(),
                                                                       "lr": 0.02}], lr=0.1)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / 2))

    ref = _Classifier()
    ref_opt, ref_sched = make(ref)
    want = _torch_losses(ref, ref_opt, batches, ref_sched)
    model = _Classifier()
    opt, sched = make(model)
    training = poptorch.trainingModel(model, optimizer=opt)
    got = _aspen_losses(training, opt, batches, sched)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    swapped = torch.optim.SGD([{"params": model.net[2].parameters()}, {"params": model.net[0].parameters(),
                                                                       "lr": 0.02}], lr=0.1)
    with pytest.raises(NotImplementedError, match="each group to hold the parameters it held"):
        training.setOptimizer(swapped)
    with pytest.raises(ValueError, match="expected each parameter in one group, found one in groups 0 and 1"):
        aspen_optim.SGD([{"params": [model.net[0].weight]}, {"params": [model.net[0].weight], "lr": 0.1}], lr=0.1)


def test_stochastic_rounding_with_accumulation_replicas_and_dynamic_loss_scaling():
    """The split step's norm and optimizer programs cast no parameter: stochastic rounding compiles and trains
    with them (NOTE [stochastic cast]), the same seed giving the same losses."""
    batches = _batches(4, rows=8)

    def run():
        model = _Tutorial()
        opts = poptorch.Options().randomSeed(3).replicationFactor(2)
        opts.Training.gradientAccumulation(2)
        opts.Precision.setComputeType(torch.half)
        opts.Precision.enableStochasticRounding(True)
        training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1,
                                                                          loss_scaling="dynamic"))
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])  # 2 replicas x 2 x 8 rows
        return [float(training(x, y)[1]) for _ in range(3)]

    a, b = run(), run()
    assert a == b and all(np.isfinite(a))


# --- weights kept in sync --------------------------------------------------------------------------------

def test_host_weights_follow_the_training_model_without_copy_weights_to_host():
    batches = _batches(5)
    ref = _Classifier()
    _torch_losses(ref, torch.optim.SGD(ref.parameters(), lr=0.1), batches)
    model = _Classifier()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    inference = poptorch.inferenceModel(model.net)  # the inner module, as the MNIST tutorial does
    x = batches[0][0]
    before = inference(x)  # compiled on the initial weights
    for xb, yb in batches:
        training(xb, yb)
    with torch.no_grad():
        want = ref.net(x)
    torch.testing.assert_close(torch.as_tensor(inference(x)), want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(torch.as_tensor(before), want)
    state = model.state_dict()  # the trained weights, no copyWeightsToHost
    torch.testing.assert_close(state["net.0.weight"], ref.net[0].weight, rtol=1e-5, atol=1e-6)
    training(*batches[0])  # one more step: state_dict follows it
    assert not torch.allclose(model.state_dict()["net.0.weight"], ref.net[0].weight)


def test_identity_loss_reduces_as_poptorch():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert float(poptorch.identity_loss(x, "sum")) == 6.0
    assert float(poptorch.identity_loss(x, "mean")) == 2.0
    assert poptorch.identity_loss(x, "none") is x
    with pytest.raises(ValueError, match="expected 'sum', 'mean' or 'none', found 'max'"):
        poptorch.identity_loss(x, "max")


class _Tutorial(torch.nn.Module):
    """The tutorials' model: (output, loss) in training, the output alone in inference."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
                                       torch.nn.LogSoftmax(dim=1))
        self.loss = torch.nn.NLLLoss()

    def forward(self, x, labels=None):
        out = self.net(x)
        if self.training:
            return out, self.loss(out, labels)
        return out


@pytest.mark.parametrize("mode", ["Default", "All"])
def test_output_and_loss_come_back_as_forward_returns_them(mode):
    """`output, loss = model(data, labels)` with deviceIterations 2 x gradientAccumulation 2: the output of
    the micro-batches the mode picks (Final: the last), each computed before its step's update."""
    batches = _batches(8, rows=4)
    ref = _Tutorial()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want_out, want_loss = [], []
    for step in range(4):
        opt.zero_grad()
        losses = []
        for x, y in batches[2 * step:2 * step + 2]:
            out, loss = ref(x, y)
            (loss / 2).backward()
            want_out.append(out.detach())
            losses.append(loss.item())
        opt.step()
        want_loss.append(sum(losses) / 2)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    if mode == "All":
        opts.outputMode(poptorch.OutputMode.All)
    model = _Tutorial()
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    loader = poptorch.DataLoader(opts, torch.utils.data.TensorDataset(torch.cat([b[0] for b in batches]),
                                                                      torch.cat([b[1] for b in batches])),
                                 batch_size=4)
    got_out, got_loss = [], []
    for x, y in loader:
        out, loss = training(x, y)
        got_out.append(out)
        got_loss.append(loss)
    if mode == "All":
        torch.testing.assert_close(torch.cat(got_out), torch.cat(want_out), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(torch.cat(got_loss).numpy(), want_loss, rtol=1e-5)
    else:
        torch.testing.assert_close(torch.stack(got_out), torch.stack([want_out[3], want_out[7]]), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose([float(v) for v in got_loss], [want_loss[1], want_loss[3]], rtol=1e-5)
    model.eval()  # the tutorials' evaluation: the same module, inference, no copyWeightsToHost
    x = batches[0][0]
    with torch.no_grad():
        ref.eval()
        torch.testing.assert_close(poptorch.inferenceModel(model)(x), ref(x), rtol=1e-5, atol=1e-6)


def test_the_mixed_precision_tutorials_settings():
    """model.half() with Precision.setPartialsType(torch.half) or torch.float and poptorch.optim.AdamW's
    accum_type float32 train; half partials with a float model are refused by name at compile (the compute
    type of a half module is known only then)."""
    batches = _batches(3, rows=6)
    for partials in (torch.float, torch.half):
        model = _Tutorial().half()
        opts = poptorch.Options()
        opts.Precision.setPartialsType(partials)
        training = poptorch.trainingModel(model, options=opts, optimizer=poptorch.optim.AdamW(
            params=model.parameters(), lr=1e-3, accum_type=torch.float32, loss_scaling=None))
        for x, y in batches:
            out, loss = training(x.half(), y)
            assert out.dtype == torch.float16 and np.isfinite(float(loss))
    opts = poptorch.Options()
    opts.Precision.setPartialsType(torch.half)
    model = _Tutorial()
    training = poptorch.trainingModel(model, options=opts)
    with pytest.raises(ValueError, match=r"setPartialsType: expected float32 or the compute type \(float32"):
        training(*batches[0])


def test_stochastic_rounding_is_seeded_and_changes_only_the_half_copies():
    """Precision.enableStochasticRounding with float16 compute (NOTE [stochastic cast]): the same seed gives the
    same losses bit for bit, another seed or round-to-nearest others (the half weight copies differ), every
    one close to torch's float32 training; a half module (the mixed-precision tutorial's) trains with it."""
    batches = _batches(4, rows=6)

    def run(seed, stochastic):
        model = _Tutorial()
        opts = poptorch.Options().randomSeed(seed)
        opts.Precision.setComputeType(torch.half)
        if stochastic:
            opts.Precision.enableStochasticRounding(True)
        training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
        return [float(training(x, y)[1]) for x, y in batches]

    a, again, other, nearest = run(5, True), run(5, True), run(6, True), run(5, False)
    assert a == again
    assert a != other and a != nearest
    ref = _Tutorial()
    want = []
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        _, loss = ref(x, y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(a, want, rtol=2e-2)
    half = _Tutorial().half()
    opts = poptorch.Options()
    opts.Precision.enableStochasticRounding(True)
    training = poptorch.trainingModel(half, opts, torch.optim.SGD(half.parameters(), lr=0.1))
    assert all(np.isfinite(float(training(x.half(), y)[1])) for x, y in batches)
    with pytest.raises(ValueError, match="Precision.enableStochasticRounding: expected a bool"):
        poptorch.Options().Precision.enableStochasticRounding("yes")


class _Sum(torch.nn.Module):
    def forward(self, x, y):
        return x + y


class _MixedLinear(torch.nn.Module):
    """A float32 Linear fed the sum of the inputs; with labels, (output, MSE loss) as PopTorch trains."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x, y, labels=None):
        out = self.lin(x + y)
        if labels is None:
            return out
        return out, torch.nn.functional.mse_loss(out, labels)


def _mixed_inputs(rows=6):
    """A float32 x and a half y; x[0, 0] + y[0, 0] rounds apart in half and in float32 (a tie of x's rounding
    to half goes to even, 1.0, then 1.0 + 2^-12 rounds to 1.0; in float32 the sum rounds to 1 + 2^-10)."""
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g).half()
    x[0, 0], y[0, 0] = 1.0 + 2.0 ** -11, 2.0 ** -12
    return x, y


def _refused_mode(*_):
    raise AssertionError("forward ran under the half float casting mode")


def test_half_float_casting_computes_mixed_operands_in_half_by_default():
    """PopTorch 2.x's default, FloatDowncastToHalf: an op mixing float32 and half computes in half, the float32
    operands cast down, in inference and in training (the weights cast for each op, their gradients float32)."""
    assert poptorch.HalfFloatCastingBehavior.Default is poptorch.HalfFloatCastingBehavior.FloatDowncastToHalf
    assert "HalfFloatCastingBehavior" in poptorch.__all__
    x, y = _mixed_inputs()
    for opts in (None, poptorch.Options().Precision.halfFloatCasting(
            poptorch.HalfFloatCastingBehavior.FloatDowncastToHalf)):
        out = poptorch.inferenceModel(_Sum(), opts)(x, y)
        assert out.dtype == torch.float16
        assert torch.equal(out, x.half() + y) and not torch.equal(out, (x + y.float()).half())
    assert poptorch.inferenceModel(_Sum())(x.numpy(), y.numpy()).dtype == np.float16
    model = _MixedLinear()
    inference = poptorch.inferenceModel(model)
    out = inference(x, y)
    half = copy.deepcopy(model).half()
    with torch.no_grad():
        assert out.dtype == torch.float16
        torch.testing.assert_close(out, half(x.half(), y), rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="input 'y': expected f16 elements, found f32"):
        inference(x, y.float())  # the program takes each input in its own type

    ref = copy.deepcopy(model)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(12)
    for _ in range(3):
        labels = torch.randn(6, 3, generator=g)
        out, loss = training(x, y, labels)
        sgd.zero_grad()
        want_out = torch.nn.functional.linear(x.half() + y, ref.lin.weight.half(), ref.lin.bias.half())
        want = torch.nn.functional.mse_loss(want_out, labels.half())
        want.backward()
        sgd.step()
        assert out.dtype == torch.float16 and loss.dtype == torch.float16
        torch.testing.assert_close(out, want_out.detach(), rtol=5e-3, atol=5e-3)
        torch.testing.assert_close(loss, want.detach(), rtol=5e-3, atol=5e-3)
    training.copyWeightsToHost()
    assert model.lin.weight.dtype == torch.float32
    torch.testing.assert_close(model.lin.weight, ref.lin.weight, rtol=0, atol=1e-3)


def test_half_float_casting_upcast_follows_torch_and_float_models_are_unchanged(monkeypatch):
    """HalfUpcastToFloat: torch's promotion, float32. A call whose floating inputs do not mix never runs under
    the casting mode; a behaviour other than a HalfFloatCastingBehavior is refused by the setter's name."""
    import aspen._torch
    monkeypatch.setattr(aspen._torch._DowncastMixed, "__init__", _refused_mode)
    x, y = _mixed_inputs()
    opts = poptorch.Options().Precision.halfFloatCasting(poptorch.HalfFloatCastingBehavior.HalfUpcastToFloat)
    out = poptorch.inferenceModel(_Sum(), opts)(x, y)
    assert out.dtype == torch.float32 and torch.equal(out, x + y)
    model = _MixedLinear()
    out = poptorch.inferenceModel(model, opts)(x, y)
    with torch.no_grad():
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, model(x, y), rtol=1e-5, atol=1e-6)
        out = poptorch.inferenceModel(model)(x, y.float())  # float32 inputs, the default behaviour
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, model(x, y.float()), rtol=1e-5, atol=1e-6)
    for wrong in (0, "FloatDowncastToHalf", poptorch.OutputMode.All):
        with pytest.raises(TypeError, match=r"^Precision.halfFloatCasting: expected an "
                           r"aspen.poptorch.HalfFloatCastingBehavior \(FloatDowncastToHalf or HalfUpcastToFloat\), "
                           r"found (0|'FloatDowncastToHalf'|an OutputMode)$"):
            poptorch.Options().Precision.halfFloatCasting(wrong)


def test_synthetic_data_runs_every_call_on_zeros_of_the_first_shapes():
    opts = poptorch.Options().enableSyntheticData(True)
    model = _Tutorial()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.0))
    batches = _batches(3, rows=4)
    losses = [float(training(x, y)[1]) for x, y in batches]
    ref = _Tutorial()
    _, want = ref(torch.zeros(4, 12), torch.zeros(4, dtype=torch.long))
    np.testing.assert_allclose(losses, [want.item()] * 3, rtol=1e-5)  # the data never reached the model
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(4, 12\) \(enableSyntheticData"):
        training(torch.randn(8, 12), torch.zeros(8, dtype=torch.long))


def test_asynchronous_data_accessor_yields_each_batch_ahead_once():
    loader = poptorch.DataLoader(poptorch.Options().deviceIterations(2), _Numbers(50), batch_size=5, shuffle=True)
    accessor = poptorch.AsynchronousDataAccessor(loader, buffer_size=2)
    assert len(accessor) == len(loader) == 5
    for _ in range(2):
        seen = sum((i.tolist() for _, i in accessor), [])
        assert sorted(seen) == list(range(50))
    accessor.terminate()
    with pytest.raises(ValueError, match="expected a DataLoader in mode Sync"):
        poptorch.AsynchronousDataAccessor(poptorch.DataLoader(poptorch.Options(), _Numbers(4),
                                                              mode=poptorch.DataLoaderMode.Async))


@pytest.mark.parametrize("accumulation", [1, 2])
def test_anchored_gradients_and_updated_weights_equal_torchs(accumulation):
    """The observing-tensors tutorial's anchors: the last step's gradient (the mean over its micro-batches,
    as torch's .grad of the mean loss) and the weight after it."""
    batches = _batches(2 * accumulation, rows=6)
    ref = _Classifier()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        for x, y in batches[step * accumulation:(step + 1) * accumulation]:
            (ref(x, y) / accumulation).backward()
        grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
        opt.step()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    opts.anchorTensor("g0", "Gradient___net.0.weight")
    opts.anchorTensor("w2", "UpdatedVar___net.2.bias")
    model = _Classifier()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(2):
        part = batches[step * accumulation:(step + 1) * accumulation]
        training(torch.cat([b[0] for b in part]), torch.cat([b[1] for b in part]))
    assert {"Gradient___net.0.weight", "UpdatedVar___net.2.bias"} <= set(training.getTensorNames())
    torch.testing.assert_close(training.getAnchoredTensor("g0"), grads["net.0.weight"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(training.getAnchoredTensor("w2"), ref.net[2].bias, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="getAnchoredTensor: expected an anchored name"):
        training.getAnchoredTensor("g1")
    with pytest.raises(NotImplementedError, match="expected 'Gradient___<parameter>' or 'UpdatedVar___"):
        opts.anchorTensor("a", "Activation___net.0")
