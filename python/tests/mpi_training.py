"""Run under mpirun by ctest (python_mpi_np2, not collected by pytest): data-parallel training across the
processes of an MPI job through Options.Distributed equals one process accumulating the same micro-batches.

    mpirun -np 2 python3 python/tests/mpi_training.py
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import aspen

rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.fc2 = torch.nn.Linear(32, 5)

    def forward(self, x, labels):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return logits, F.cross_entropy(logits, labels)


def make():
    torch.manual_seed(0)
    return Mlp()


g = torch.Generator().manual_seed(1)
steps = [(torch.randn(size * 4, 12, generator=g), torch.randint(0, 5, (size * 4,), generator=g)) for _ in range(3)]

opts = aspen.Options()
opts.Distributed.configureProcessId(rank, size)
model = make()
training = aspen.trainingModel(model, opts, optimizer=aspen.optim.AdamW(model.parameters(), lr=1e-2))
# Each process feeds its replica's micro-batch of every step (rows rank*4 .. rank*4+3).
losses = [float(training(x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4])[1]) for x, y in steps]
training.copyWeightsToHost()

ref_model = make()
ref_opts = aspen.Options()
ref_opts.Training.gradientAccumulation(size)
ref = aspen.trainingModel(ref_model, ref_opts, optimizer=aspen.optim.AdamW(ref_model.parameters(), lr=1e-2))
want = [float(ref(x, y)[1]) for x, y in steps]
ref.copyWeightsToHost()

np.testing.assert_allclose(losses, want, rtol=1e-6)
for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
    np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=n)
try:
    aspen.Options().Distributed.configureProcessId(rank + 1, size)
    sys.exit("configureProcessId accepted a wrong process id")
except ValueError as e:
    assert "configureProcessId" in str(e)
print(f"rank {rank} of {size}: {len(losses)} steps equal {size}-way accumulation in one process")


# PopTorch's combined layout across processes: each process a replica of a model split into two pipeline
# stages by its blocks (aspen.poptorch.BeginBlock), with gradient accumulation as the pipeline's micro-batches,
# equals one process accumulating every replica's micro-batches on one device.
import aspen.poptorch as poptorch  # noqa: E402


class Piped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.fc1 = torch.nn.Linear(12, 32)
        self.fc2 = poptorch.BeginBlock(torch.nn.Linear(32, 5), "second", ipu_id=1)

    def forward(self, x, labels):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return logits, F.cross_entropy(logits, labels)


acc = 2
g = torch.Generator().manual_seed(3)
steps = [(torch.randn(size * acc * 4, 12, generator=g), torch.randint(0, 5, (size * acc * 4,), generator=g))
         for _ in range(3)]
opts = poptorch.Options()
opts.Distributed.configureProcessId(rank, size)
opts.Training.gradientAccumulation(acc)
model = Piped()
training = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def mine(t):  # this replica's micro-batches: micro-batch a of replica r is number a * size + r of the step
    return torch.cat([t[(a * size + rank) * 4:(a * size + rank + 1) * 4] for a in range(acc)])


losses = [float(training(mine(x), mine(y))[1]) for x, y in steps]
assert training._program.pipeline_stages == 2
training.copyWeightsToHost()
ref_model = Piped()
ref_opts = poptorch.Options()
ref_opts.Training.gradientAccumulation(size * acc)
ref_opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.Stage("second")))
ref = poptorch.trainingModel(ref_model, ref_opts,
                             optimizer=torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9))
want = [float(ref(x, y)[1]) for x, y in steps]
ref.copyWeightsToHost()
np.testing.assert_allclose(losses, want, rtol=1e-6)
for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
    np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-7, err_msg=n)
print(f"rank {rank} of {size}: a 2-stage pipeline per process equals {size * acc}-way accumulation in one process")
