"""aspen.optim: the optimizers a training model compiles in, with PopTorch's (and torch.optim's) arguments.

    optimizer = aspen.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    training = aspen.trainingModel(model, opts, optimizer=optimizer)
    ...
    optimizer.param_groups[0]["lr"] = 5e-4
    training.setOptimizer(optimizer)      # a new learning rate, no recompilation

`params` is what torch.optim takes (a module's parameters; parameters left out are not trained), or, for
an ONNX file, initializer names (None: every float initializer). One parameter group: settings per group
are not supported (an error says so). The update rules are torch.optim's: AdamW with decoupled weight
decay and bias correction, SGD with momentum, Nesterov and L2 weight decay; LAMB is You et al.'s (what
poptorch.optim.LAMB runs). `loss_scaling`: a static loss scale for f16 compute, or "dynamic".
"""

__all__ = ["SGD", "AdamW", "LAMB", "Optimizer"]


def _number(name, v, low=0.0):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= low:
        raise ValueError(f"{name}: expected a number >= {low}, found {v!r}")
    return float(v)


class Optimizer:
    kind = ""

    def __init__(self, params, lr, loss_scaling):
        groups = list(params) if params is not None else None
        if groups and isinstance(groups[0], dict):
            if len(groups) != 1:
                raise NotImplementedError(f"aspen.optim.{type(self).__name__}: expected one parameter group, found "
                                          f"{len(groups)} (settings per group are not supported)")
            extra = set(groups[0]) - {"params"}
            if extra:
                raise NotImplementedError(f"aspen.optim.{type(self).__name__}: a parameter group's own settings "
                                          f"({', '.join(sorted(extra))}) are not supported")
            groups = list(groups[0]["params"])
        self.params = groups
        self.param_groups = [{"lr": _number("lr", lr)}]
        if loss_scaling is not None and loss_scaling != "dynamic":
            _number("loss_scaling", loss_scaling, 1e-30)
        self.loss_scaling = loss_scaling

    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    def _settings(self):
        """The dict the C++ side takes (python/module.cc training_from); lr apart."""
        s = {"optimizer": self.kind, "lr": _number("lr", self.param_groups[0]["lr"])}
        s.update(self._rule())
        if self.loss_scaling == "dynamic":
            s["dynamic_loss_scaling"] = True
        elif self.loss_scaling is not None:
            s["loss_scaling"] = float(self.loss_scaling)
        return s

    def _rule(self):
        raise NotImplementedError

    def __repr__(self):
        return f"aspen.optim.{type(self).__name__}({self._settings()})"


class SGD(Optimizer):
    kind = "sgd"

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 loss_scaling=None):
        super().__init__(params, lr, loss_scaling)
        if dampening != 0:
            raise NotImplementedError(f"aspen.optim.SGD: dampening {dampening!r} is not supported (0 only)")
        if nesterov and not momentum:
            raise ValueError("aspen.optim.SGD: nesterov: expected a momentum > 0 with it, found momentum 0")
        self.momentum = _number("momentum", momentum)
        self.weight_decay = _number("weight_decay", weight_decay)
        self.nesterov = bool(nesterov)

    def _rule(self):
        return {"momentum": self.momentum, "weight_decay": self.weight_decay, "nesterov": self.nesterov}


class AdamW(Optimizer):
    kind = "adamw"

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False,
                 loss_scaling=None):
        super().__init__(params, lr, loss_scaling)
        if amsgrad:
            raise NotImplementedError("aspen.optim.AdamW: amsgrad is not supported")
        self.betas = (_number("betas[0]", betas[0]), _number("betas[1]", betas[1]))
        self.eps = _number("eps", eps)
        self.weight_decay = _number("weight_decay", weight_decay)

    def _rule(self):
        return {"beta1": self.betas[0], "beta2": self.betas[1], "eps": self.eps, "weight_decay": self.weight_decay}


class LAMB(AdamW):
    kind = "lamb"

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, loss_scaling=None):
        super().__init__(params, lr, betas, eps, weight_decay, False, loss_scaling)
