"""Train a PyTorch model with aspen, PopTorch's way, then run it for inference.

    python3 examples/python/torch_training.py

The model is an ordinary torch.nn.Module whose forward returns (output, loss). aspen exports it with
torch.onnx at the first call, compiles the forward pass, its backward pass and the optimizer into one
program, and runs it; copyWeightsToHost() writes the trained weights back into the module.
"""
import torch
import torch.nn.functional as F

import aspen


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(2, 64)
        self.fc2 = torch.nn.Linear(64, 2)

    def forward(self, x, labels):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return logits, F.cross_entropy(logits, labels)


def batch(n, g):
    """Points in the plane; the label says whether they lie inside the unit circle."""
    x = torch.randn(n, 2, generator=g) * 1.2
    return x, (x.pow(2).sum(1) < 1).long()


torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
model = Classifier()

opts = aspen.Options().deviceIterations(4)   # 4 optimizer steps per call
opts.Training.gradientAccumulation(2)        # of 2 micro-batches each
optimizer = aspen.optim.AdamW(model.parameters(), lr=0.02)
training = aspen.trainingModel(model, opts, optimizer=optimizer)

for call in range(25):
    x, y = batch(4 * 2 * 32, g)               # the combined batch: 4 x 2 micro-batches of 32
    logits, loss = training(x, y)             # what forward returns: the last micro-batch's logits, the
                                              # last step's loss (OutputMode.Final)
    if call % 5 == 0:
        print(f"call {call:2d}: loss {float(loss):.4f}")
training.copyWeightsToHost()

inference = aspen.inferenceModel(model.eval())
x, y = batch(256, g)
logits, _ = inference(x, y)
accuracy = (logits.argmax(1) == y).float().mean().item()
with torch.no_grad():
    same = torch.allclose(logits, model(x, y)[0], atol=1e-5)
print(f"accuracy on new points: {accuracy:.1%}; aspen's logits equal the module's: {same}")
assert accuracy > 0.9 and same
