"""aspen.optim: the optimizers a training model compiles in, with PopTorch's (and torch.optim's) arguments.

    optimizer = aspen.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    training = aspen.trainingModel(model, opts, optimizer=optimizer)
    ...
    optimizer.param_groups[0]["lr"] = 5e-4
    training.setOptimizer(optimizer)      # a new learning rate, no recompilation

`params` is what torch.optim takes (a module's parameters; parameters left out are not trained), or, for
an ONNX file, initializer names (None: every float initializer). One parameter group: settings per group
are not supported (an error says so). A torch.optim optimizer (SGD, Adam, AdamW; aspen.poptorch.optim's,
which are torch's with PopTorch's arguments) is taken too: `from_torch` reads its one group's settings. The update rules are torch.optim's: AdamW with decoupled weight
decay and bias correction, SGD with momentum, Nesterov and L2 weight decay; LAMB is You et al.'s (what
poptorch.optim.LAMB runs). `loss_scaling`: a static loss scale for f16 compute, or "dynamic".
"""

from . import _check

__all__ = ["SGD", "AdamW", "LAMB", "Optimizer", "from_torch"]


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

    def __init__(self, params, lr, loss_scaling, max_grad_norm=None):
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
        if max_grad_norm is not None and max_grad_norm != float("inf"):
            max_grad_norm = _check.real("max_grad_norm", max_grad_norm, 0, low_open=True,
                                        expected="a finite number > 0, inf or None (no clipping)")
        else:
            max_grad_norm = None
        self.max_grad_norm = max_grad_norm  # clip the global gradient norm to it (PopTorch's max_grad_norm)

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
        if self.max_grad_norm is not None:
            s["clip_grad_norm"] = float(self.max_grad_norm)
        return s

    def _rule(self):
        raise NotImplementedError

    def __repr__(self):
        rule = "".join(f", {k}={v!r}" for k, v in self._rule().items())
        return f"aspen.optim.{type(self).__name__}(lr={self.lr!r}{rule}, loss_scaling={self.loss_scaling!r})"


class SGD(Optimizer):
    kind = "sgd"

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 loss_scaling=None, max_grad_norm=None):
        super().__init__(params, lr, loss_scaling, max_grad_norm)
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
                 loss_scaling=None, max_grad_norm=None):
        super().__init__(params, lr, loss_scaling, max_grad_norm)
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

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, loss_scaling=None,
                 max_grad_norm=None):
        super().__init__(params, lr, betas, eps, weight_decay, False, loss_scaling, max_grad_norm)


def from_torch(opt):
    """The aspen optimizer that runs torch.optim optimizer `opt`'s update (PopTorch takes torch.optim's SGD,
    Adam, AdamW and its own; aspen.poptorch.optim's add PopTorch's arguments). Its one parameter group's
    settings are read now: after a learning-rate scheduler steps, setOptimizer(opt) reads them again. What
    aspen's update rules cannot follow is refused by name (never run differently)."""
    import torch
    kind = f"{type(opt).__module__}.{type(opt).__qualname__}"
    groups = opt.param_groups
    if len(groups) != 1:
        raise NotImplementedError(f"{kind}: expected one parameter group, found {len(groups)} (settings per group "
                                  "are not supported yet)")
    g = groups[0]
    if g.get("maximize"):
        raise NotImplementedError(f"{kind}: maximize=True is not supported (aspen minimizes the loss)")
    extra = {"loss_scaling": getattr(opt, "loss_scaling", None), "max_grad_norm": getattr(opt, "max_grad_norm", None)}
    if extra["loss_scaling"] == 1.0:
        extra["loss_scaling"] = None  # PopTorch's default: no scaling
    params = list(g["params"])
    if isinstance(opt, torch.optim.SGD):
        return SGD(params, lr=g["lr"], momentum=g.get("momentum", 0.0), dampening=g.get("dampening", 0.0),
                   weight_decay=g.get("weight_decay", 0.0), nesterov=g.get("nesterov", False), **extra)
    if isinstance(opt, torch.optim.AdamW) or (isinstance(opt, torch.optim.Adam) and not g.get("weight_decay")):
        if g.get("amsgrad"):
            raise NotImplementedError(f"{kind}: amsgrad=True is not supported")
        wd = g.get("weight_decay", 0.0) if isinstance(opt, torch.optim.AdamW) else 0.0
        if getattr(opt, "bias_correction", True) is False:
            raise NotImplementedError(f"{kind}: bias_correction=False is not supported (aspen's AdamW corrects)")
        return AdamW(params, lr=g["lr"], betas=g["betas"], eps=g["eps"], weight_decay=wd, **extra)
    if isinstance(opt, torch.optim.Adam):
        raise NotImplementedError(f"{kind}: weight_decay {g['weight_decay']} (Adam's L2 penalty added to the "
                                  "gradient) is not supported; AdamW's decoupled decay is, or Adam with weight_decay 0")
    if type(opt).__name__ == "LAMB" and hasattr(opt, "max_weight_norm"):
        if opt.max_weight_norm not in (None, 65500.0):
            raise NotImplementedError(f"{kind}: max_weight_norm {opt.max_weight_norm} is not supported (aspen's "
                                      "LAMB does not clip the weight norm; PopTorch's default 65500 is accepted)")
        return LAMB(params, lr=g["lr"], betas=g["betas"], eps=g["eps"], weight_decay=g["weight_decay"], **extra)
    raise NotImplementedError(f"optimizer {kind}: expected torch.optim's SGD, Adam or AdamW, or an aspen.optim "
                              "optimizer (SGD, AdamW, LAMB); RMSprop and the others have no update rule in aspen yet")
