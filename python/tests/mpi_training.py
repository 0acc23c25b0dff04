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
