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

from . import _check

__all__ = ["SGD", "AdamW", "LAMB", "Optimizer"]


def _number(name, v, low=0.0):
    """A finite number >= low (numpy's scalars too)."""
    return _check.real(name, v, low)


def _fraction(name, v):
    """A number in [0, 1): a beta, a momentum (what the update rules take, graph/ops_optim.cc)."""
    return _check.real(name, v, 0, 1, high_open=True)


def _params(params, group=False):
    """What torch.optim takes (an iterable of parameters or of parameter groups; a group's "params" may be one
    tensor), names, or None."""
    if params is None:
        return None
    if hasattr(params, "ndim"):  # a tensor iterates over its rows
        if group:
            return [params]
        raise ValueError(f"params: expected an iterable of parameters or of their names, found a "
                         f"{type(params).__name__} (wrap it in a list)")
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise ValueError("params: expected an iterable of parameters or of their names (None: every parameter), "
                         f"found {_check.found(params)}")
    return list(params)


class Optimizer:
    kind = ""

    def __init__(self, params, lr, loss_scaling):
        groups = _params(params)
        if groups and isinstance(groups[0], dict):
            if len(groups) != 1:
                raise NotImplementedError(f"aspen.optim.{type(self).__name__}: expected one parameter group, found "
                                          f"{len(groups)} (settings per group are not supported)")
            extra = set(groups[0]) - {"params"}
            if extra:
                raise NotImplementedError(f"aspen.optim.{type(self).__name__}: a parameter group's own settings "
                                          f"({', '.join(sorted(extra))}) are not supported")
            groups = _params(groups[0]["params"], group=True)
        self.params = groups
        self.param_groups = [{"lr": _number("lr", lr)}]
        if loss_scaling is not None and not (isinstance(loss_scaling, str) and loss_scaling == "dynamic"):
            loss_scaling = _check.real("loss_scaling", loss_scaling, 0, low_open=True,
                                       expected="a finite number > 0, 'dynamic' or None")
        self.loss_scaling = loss_scaling

    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    def _settings(self):
        """The dict the C++ side takes (python/module.cc training_from); lr apart."""
        if len(self.param_groups) != 1 or set(self.param_groups[0]) != {"lr"}:
            raise ValueError(f"param_groups: expected one group with 'lr' alone (the other settings are the "
                             f"optimizer's arguments), found {_check.found(self.param_groups)}")
        s = {"optimizer": self.kind, "lr": _number("param_groups[0]['lr']", self.param_groups[0]["lr"])}
        s.update(self._rule())
        if self.loss_scaling == "dynamic":
            s["dynamic_loss_scaling"] = True
        elif self.loss_scaling is not None:
            s["loss_scaling"] = float(self.loss_scaling)
        return s

    def _rule(self):
        raise NotImplementedError

    def __repr__(self):
        rule = "".join(f", {k}={v!r}" for k, v in self._rule().items())
        return f"aspen.optim.{type(self).__name__}(lr={self.lr!r}{rule}, loss_scaling={self.loss_scaling!r})"


class SGD(Optimizer):
    kind = "sgd"

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 loss_scaling=None):
        super().__init__(params, lr, loss_scaling)
        if _number("dampening", dampening) != 0:
            raise NotImplementedError(f"aspen.optim.SGD: dampening {dampening!r} is not supported (0 only)")
        self.momentum = _fraction("momentum", momentum)
        self.weight_decay = _number("weight_decay", weight_decay)
        self.nesterov = _check.boolean("nesterov", nesterov)
        if self.nesterov and not self.momentum:
            raise ValueError("aspen.optim.SGD: nesterov: expected a momentum > 0 with it, found momentum 0")

    def _rule(self):
        return {"momentum": self.momentum, "weight_decay": self.weight_decay, "nesterov": self.nesterov}


class AdamW(Optimizer):
    kind = "adamw"

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False,
                 loss_scaling=None):
        super().__init__(params, lr, loss_scaling)
        if _check.boolean("amsgrad", amsgrad):
            raise NotImplementedError("aspen.optim.AdamW: amsgrad is not supported")
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise ValueError(f"betas: expected a pair (beta1, beta2), found {_check.found(betas)}")
        self.betas = (_fraction("betas[0]", betas[0]), _fraction("betas[1]", betas[1]))
        self.eps = _number("eps", eps)
        self.weight_decay = _number("weight_decay", weight_decay)

    def _rule(self):
        return {"beta1": self.betas[0], "beta2": self.betas[1], "eps": self.eps, "weight_decay": self.weight_decay}


class LAMB(AdamW):
    kind = "lamb"

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, loss_scaling=None):
        super().__init__(params, lr, betas, eps, weight_decay, False, loss_scaling)
