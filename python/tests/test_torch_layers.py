"""W3.2's layers as PyTorch users write them, each trained by aspen.trainingModel beside torch.optim on the same
batches (and inferred beside the module): losses (NLL, class weights), convolutions and pooling, group /
instance / batch norms, recurrent layers, resizing, transposed convolutions, LRN, TopK, scatter, and
model.half()."""

import numpy as np
import pytest

import torch  # required: scripts/install-deps.sh installs it

import aspen
from conftest import aspen_sgd_losses, assert_same_parameters, loss_value, sgd_losses


class _Classifier(torch.nn.Module):
    """The MNIST tutorials' loss (log_softmax + nll_loss), or a class-weighted summed cross-entropy."""

    def __init__(self, loss):
        super().__init__()
        torch.manual_seed(3)
        self.fc1 = torch.nn.Linear(20, 32)
        self.fc2 = torch.nn.Linear(32, 10)
        self.loss = loss
        self.register_buffer("class_weight", torch.linspace(0.5, 2.0, 10))

    def forward(self, x, y):
        logits = self.fc2(torch.relu(self.fc1(x)))
        if self.loss == "nll":
            return logits, torch.nn.functional.nll_loss(torch.log_softmax(logits, dim=1), y, ignore_index=7)
        return logits, torch.nn.functional.cross_entropy(logits, y, weight=self.class_weight, reduction="sum")


@pytest.mark.parametrize("loss", ["nll", "weighted_sum"])
def test_nll_and_weighted_losses_train_as_torch(loss):
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(16, 20, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(5)]
    ref = _Classifier(loss)
    want = sgd_losses(ref, batches, lr=0.05)
    model = _Classifier(loss)
    training, got = aspen_sgd_losses(model, batches, lr=0.05)
    np.testing.assert_allclose(got, want, rtol=2e-5)
    training.copyWeightsToHost()
    assert_same_parameters(model, ref)


class _Cnn(torch.nn.Module):
    """Convolutions as users write them: the MNIST tutorial's stack (conv, relu, max-pool, nll_loss), a
    strided padded conv, a depthwise one, a grouped one with a bias, average pooling with padding."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.c1 = torch.nn.Conv2d(1, 8, 3)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gc = torch.nn.Conv2d(8, 12, (3, 1), padding=(1, 0), groups=4)
        self.pool = torch.nn.MaxPool2d(2)
        self.avg = torch.nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.fc = torch.nn.Linear(12 * 3 * 3, 10)

    def forward(self, x, y):
        h = self.pool(torch.relu(self.c1(x)))           # [N, 8, 7, 7]
        h = torch.relu(self.c2(h))                      # [N, 8, 4, 4]
        h = self.avg(torch.relu(self.dw(h)))            # [N, 8, 4, 4]
        h = torch.nn.functional.max_pool2d(self.gc(h), 2, ceil_mode=True)  # [N, 12, 2, 2]... ceil: 2x2
        h = torch.nn.functional.pad(h, (0, 1, 0, 1))    # [N, 12, 3, 3]
        logits = self.fc(h.flatten(1))
        return logits, torch.nn.functional.nll_loss(torch.log_softmax(logits, dim=1), y)


def test_convolutions_and_pooling_train_as_torch():
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randn(4, 1, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(10)]
    ref = _Cnn()
    want = sgd_losses(ref, batches, lr=0.05)
    model = _Cnn()
    with torch.no_grad():
        logits, _ = model(*batches[0])
    out, _ = aspen.inferenceModel(_Cnn())(*batches[0])
    torch.testing.assert_close(torch.as_tensor(out), logits, rtol=1e-5, atol=1e-5)
    training, got = aspen_sgd_losses(model, batches, lr=0.05)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    training.copyWeightsToHost()
    assert_same_parameters(model, ref)


class _Norms(torch.nn.Module):
    """Group norm, instance norm (affine) and, with bn, a batch norm (inference only: its running statistics)."""

    def __init__(self, bn):
        super().__init__()
        torch.manual_seed(8)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.gn = torch.nn.GroupNorm(4, 8)
        self.inorm = torch.nn.InstanceNorm2d(8, affine=True)
        self.bn = torch.nn.BatchNorm2d(8) if bn else None
        self.fc = torch.nn.Linear(8 * 6 * 6, 4)
        with torch.no_grad():  # parameters and statistics away from their initial 1 and 0
            for p in [self.gn.weight, self.gn.bias, self.inorm.weight, self.inorm.bias]:
                p.add_(torch.randn(p.shape) * 0.3)
            if bn:
                self.bn.running_mean.normal_(0, 0.5)
                self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x, y):
        h = self.inorm(torch.relu(self.gn(self.conv(x))))
        if self.bn is not None:
            h = self.bn(h)
        logits = self.fc(h.flatten(1))
        return logits, torch.nn.functional.cross_entropy(logits, y)


def test_group_instance_and_batch_norm_as_torch():
    g = torch.Generator().manual_seed(9)
    batches = [(torch.randn(2, 3, 6, 6, generator=g), torch.randint(0, 4, (2,), generator=g)) for _ in range(3)]
    ref = _Norms(bn=True).eval()
    with torch.no_grad():
        want, _ = ref(*batches[0])
    got, _ = aspen.inferenceModel(_Norms(bn=True).eval())(*batches[0])
    torch.testing.assert_close(torch.as_tensor(got), want, rtol=1e-5, atol=1e-5)

    ref = _Norms(bn=False)
    want = sgd_losses(ref, batches, lr=0.1)
    model = _Norms(bn=False)
    training, got = aspen_sgd_losses(model, batches, lr=0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    training.copyWeightsToHost()
    assert_same_parameters(model, ref)

    # A batch norm in training mode: batch statistics, and the running ones updated as torch updates them
    # (NOTE [batch norm in training]); in eval() afterwards the model infers as torch's.
    ref = _Norms(bn=True)
    want = sgd_losses(ref, batches, lr=0.1)
    model = _Norms(bn=True)
    training, got = aspen_sgd_losses(model, batches, lr=0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    training.copyWeightsToHost()
    torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.bn.running_var, ref.bn.running_var, rtol=1e-5, atol=1e-6)
    ref.eval()
    with torch.no_grad():
        want_eval, _ = ref(*batches[0])
    got_eval, _ = aspen.inferenceModel(model.eval())(*batches[0])
    torch.testing.assert_close(torch.as_tensor(got_eval), want_eval, rtol=1e-4, atol=1e-5)


class _Recurrent(torch.nn.Module):
    """The issue's LSTM and GRU classifiers: two layers, bidirectional, batch first, the last step's state."""

    def __init__(self, kind):
        super().__init__()
        torch.manual_seed(11)
        cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
        self.rnn = cls(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = torch.nn.Linear(16, 3)

    def forward(self, x, y):
        h, _ = self.rnn(x)
        logits = self.fc(h[:, -1])
        return logits, torch.nn.functional.cross_entropy(logits, y)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_layers_train_as_torch(kind):
    g = torch.Generator().manual_seed(12)
    batches = [(torch.randn(4, 7, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(10)]
    ref = _Recurrent(kind)
    with torch.no_grad():
        want_logits, _ = ref(*batches[0])
    logits, _ = aspen.inferenceModel(_Recurrent(kind))(*batches[0])
    torch.testing.assert_close(torch.as_tensor(logits), want_logits, rtol=1e-5, atol=1e-5)
    want = sgd_losses(ref, batches, lr=0.1)
    model = _Recurrent(kind)
    training, got = aspen_sgd_losses(model, batches, lr=0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    training.copyWeightsToHost()
    assert_same_parameters(model, ref)


def test_a_half_module_trains_with_f32_master_weights():
    """model.half() (PopTorch's mixed-precision tutorial): f16 matmuls, f32 master weights, loss scaling;
    the losses follow the f32 model's, the parameters stay half, the outputs come back half."""
    def make_mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = make_mlp()

        def forward(self, x, y):
            out = self.net(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(10)]
    ref = WithLoss()
    want = sgd_losses(ref, batches, lr=0.1)
    model = WithLoss().half()
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.parameters(), lr=0.1, loss_scaling=128.0))
    got = [loss_value(training(x.half(), y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=2e-3)
    training.copyWeightsToHost()
    assert model.net[0].weight.dtype == torch.float16
    torch.testing.assert_close(model.net[0].weight.float(), ref.net[0].weight, rtol=0, atol=5e-3)
    out, _ = aspen.inferenceModel(model)(batches[0][0].half(), batches[0][1])
    assert out.dtype == torch.float16


def test_a_half_cnn_trains_with_f32_master_weights():
    """model.half() of the MNIST tutorial's CNN: f16 convolutions (oneDNN's f32 primitives on widened copies,
    rounded once), f16 max-pooling and batch norms in training, f32 master weights: 10 SGD steps follow the
    f32 model's losses."""
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(31)
            self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                           torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, stride=2),
                                           torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 2 * 2, 10))

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.net(x).float(), y)

    g = torch.Generator().manual_seed(32)
    batches = [(torch.randn(8, 1, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(10)]
    want = sgd_losses(WithLoss(), batches, lr=0.05)
    model = WithLoss().half()
    training = aspen.trainingModel(model, optimizer=aspen.optim.SGD(model.parameters(), lr=0.05, loss_scaling=128.0))
    got = [loss_value(training(x.half(), y)) for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=5e-3)


class _Resampled(torch.nn.Module):
    """Bilinear and nearest resizing, a learned exponent tensor (Pow), pixel shuffle (DepthToSpace)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.p = torch.nn.Parameter(torch.linspace(0.5, 2.0, 4).reshape(4, 1, 1))
        self.fc = torch.nn.Linear(1 * 12 * 12, 3)

    def forward(self, x, y):
        h = torch.nn.functional.interpolate(self.conv(x), scale_factor=2.0, mode="bilinear", align_corners=False)
        h = (h.abs() + 1.0).pow(self.p)
        h = torch.nn.functional.pixel_shuffle(h, 2)  # [N, 1, 12, 12]
        h = torch.nn.functional.interpolate(h, size=(12, 12), mode="nearest")
        logits = self.fc(h.flatten(1))
        return logits, torch.nn.functional.cross_entropy(logits, y)


def test_resize_pow_and_pixel_shuffle_train_as_torch():
    g = torch.Generator().manual_seed(14)
    batches = [(torch.randn(2, 2, 3, 3, generator=g), torch.randint(0, 3, (2,), generator=g)) for _ in range(3)]
    ref = _Resampled()
    want = sgd_losses(ref, batches, lr=0.01)
    model = _Resampled()
    training, got = aspen_sgd_losses(model, batches, lr=0.01)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    training.copyWeightsToHost()
    assert_same_parameters(model, ref)


class _Decoder(torch.nn.Module):
    """Transposed convolutions (strided, grouped, output_padding), a 1-D and a 3-D convolution."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(15)
        self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = torch.nn.ConvTranspose2d(6, 2, (2, 3), stride=(1, 2), dilation=(2, 1))
        self.c1 = torch.nn.Conv1d(2, 3, 3, padding=2, dilation=2)
        self.c3 = torch.nn.Conv3d(1, 2, 2, stride=(1, 2, 1))
        self.fc = torch.nn.Linear(3 * 10 + 2 * 2 * 2 * 3, 3)

    def forward(self, x, v, u, y):
        h = self.up2(torch.relu(self.up(x)))              # [N, 2, 10, 17]
        a = self.c1(h.mean(dim=3))                        # [N, 3, 10]
        b = self.c3(u)                                    # [N, 2, 2, 2, 3]
        logits = self.fc(torch.cat([a.flatten(1), b.flatten(1)], dim=1)) + v.sum()
        return logits, torch.nn.functional.cross_entropy(logits, y)


def test_transposed_1d_and_3d_convolutions_train_as_torch():
    g = torch.Generator().manual_seed(16)
    batches = [(torch.randn(2, 4, 4, 4, generator=g), torch.randn(3, generator=g),
                torch.randn(2, 1, 3, 4, 4, generator=g), torch.randint(0, 3, (2,), generator=g)) for _ in range(3)]
    ref = _Decoder()
    want = sgd_losses(ref, batches, lr=0.02)
    model = _Decoder()
    training, got = aspen_sgd_losses(model, batches, lr=0.02)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    training.copyWeightsToHost()
    assert_same_parameters(model, ref)


def test_local_response_norm_trains_as_torch():
    class Lrn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(17)
            self.conv = torch.nn.Conv2d(3, 6, 3)
            self.lrn = torch.nn.LocalResponseNorm(3, alpha=0.1, beta=0.75, k=2.0)
            self.fc = torch.nn.Linear(6 * 4 * 4, 2)

        def forward(self, x, y):
            logits = self.fc(self.lrn(self.conv(x)).flatten(1))
            return logits, torch.nn.functional.cross_entropy(logits, y)

    g = torch.Generator().manual_seed(18)
    batches = [(torch.randn(2, 3, 6, 6, generator=g), torch.randint(0, 2, (2,), generator=g)) for _ in range(3)]
    ref = Lrn()
    want = sgd_losses(ref, batches, lr=0.05)
    model = Lrn()
    training, got = aspen_sgd_losses(model, batches, lr=0.05)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_topk_values_train_as_torch():
    """torch.topk's values (largest and smallest) in a loss: the gradient reaches the picked elements."""
    class Picked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(19)
            self.fc = torch.nn.Linear(6, 10)

        def forward(self, x):
            h = self.fc(x)
            top, idx = torch.topk(h, 3, dim=1)
            low, _ = torch.topk(h, 2, dim=1, largest=False)
            return idx, (top ** 2).sum() - low.sum()

    g = torch.Generator().manual_seed(20)
    batches = [torch.randn(4, 6, generator=g) for _ in range(3)]
    ref = Picked()
    want = sgd_losses(ref, batches, lr=0.05)
    model = Picked()
    with torch.no_grad():
        want_idx, _ = model(batches[0])
    got_idx, _ = aspen.inferenceModel(Picked())(batches[0])
    assert torch.equal(torch.as_tensor(got_idx), want_idx)
    training, got = aspen_sgd_losses(model, batches, lr=0.05)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_scatter_with_fixed_indices_trains_as_torch():
    """scatter / scatter_add / index_put with indices fixed in the module, on computed values (NOTE [scatter of
    known indices]): the outputs equal torch's and both the data and the updates train."""
    class Scattered(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(23)
            self.a = torch.nn.Linear(5, 6)
            self.b = torch.nn.Linear(5, 3)
            # scatter's duplicates are undefined (and torch's backward sends the position's gradient to each of
            # them): distinct per row; scatter_add's add up.
            self.register_buffer("idx", torch.tensor([[0, 4, 3], [5, 1, 0], [2, 1, 3], [1, 0, 5]]))
            self.register_buffer("dup", torch.tensor([[0, 4, 4], [5, 1, 0], [2, 2, 3], [1, 0, 5]]))

        def forward(self, x):
            data, upd = self.a(x), self.b(x)
            replaced = data.scatter(1, self.idx, upd)
            summed = data.scatter_add(1, self.dup, upd * 2)
            rows = data.index_put((torch.tensor([3, 0]),), upd[:2, :1].expand(2, 6))
            return replaced, (replaced ** 2).sum() + summed.sum() + (rows * rows).mean()

    g = torch.Generator().manual_seed(24)
    batches = [torch.randn(4, 5, generator=g) for _ in range(3)]
    with torch.no_grad():
        want_out, _ = Scattered()(batches[0])
    got_out, _ = aspen.inferenceModel(Scattered())(batches[0])
    torch.testing.assert_close(torch.as_tensor(got_out), want_out, rtol=1e-5, atol=1e-6)
    ref = Scattered()
    want = sgd_losses(ref, batches, lr=0.05)
    model = Scattered()
    training, got = aspen_sgd_losses(model, batches, lr=0.05)
    np.testing.assert_allclose(got, want, rtol=1e-5)
