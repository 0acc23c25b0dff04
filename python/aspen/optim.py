"""aspen.optim: the optimizers a training model compiles in, with PopTorch's (and torch.optim's) arguments.

    optimizer = aspen.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    training = aspen.trainingModel(model, opts, optimizer=optimizer)
    ...
    optimizer.param_groups[0]["lr"] = 5e-4
    training.setOptimizer(optimizer)      # a new learning rate, no recompilation

`params` is what torch.optim takes (a module's parameters; parameters left out are not trained; or
parameter groups, dicts with "params" and settings of their own: "lr", "weight_decay", "betas", "eps",
"momentum", "alpha"), or, for an ONNX file, initializer names (None: every float initializer). NOTE [parameter
groups]: the first group's settings are the optimizer's, every other group's parameters step with theirs
(train::ParamGroup), and a group's learning rate is the first group's times a ratio fixed at compile:
setOptimizer and torch's schedulers move the rates in proportion (LambdaLR with one lambda, StepLR,
CosineAnnealingLR to 0, ...); a change of ratio is refused by name, never run differently. A torch.optim
optimizer (SGD, Adam, AdamW, RMSprop; aspen.poptorch.optim's, which are torch's with PopTorch's arguments) is
taken too: `from_torch` reads its groups' settings. The update rules are torch.optim's: AdamW with decoupled weight
decay and bias correction, SGD with momentum, Nesterov and L2 weight decay, RMSprop (alpha, momentum,
centered, L2 weight decay); LAMB is You et al.'s (what
poptorch.optim.LAMB runs). `loss_scaling`: a static loss scale for f16 compute, or "dynamic".

PopTorch's types (torch.float32 or None, torch.float16, torch.bfloat16): `accum_type`, the type gradients are
rounded to and summed in over micro-batches (train::OptimizerOptions::gradient_dtype: the rounding of a half
precision accumulation, in f32 buffers); `first_order_momentum_accum_type` (SGD: `velocity_accum_type`) and
`second_order_momentum_accum_type`, the types the optimizer state is kept in (half the memory; the update
widens it to f32 and rounds its new value to nearest even). The state's names and types are in the checkpoint.
"""

from . import _check

__all__ = ["SGD", "Adam", "AdamW", "LAMB", "RMSprop", "Optimizer", "from_torch"]


def _number(name, v, low=0.0):
    """A finite number >= low (numpy's scalars too)."""
    return _check.real(name, v, low)


def _fraction(name, v):
    """A number in [0, 1): a beta, a momentum (what the update rules take, graph/ops_optim.cc)."""
    return _check.real(name, v, 0, 1, high_open=True)


def _state_type(name, dtype):
    """A PopTorch accumulation type (torch.float32 / float16 / bfloat16, their names, or None: float32) as the
    C++ side's "f32" / "f16" / "bf16"."""
    if dtype is None:
        return "f32"
    key = str(dtype).rsplit(".", 1)[-1]
    key = {"float": "float32", "half": "float16"}.get(key, key)
    known = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
    if key not in known:
        raise ValueError(f"{name}: expected torch.float32, torch.float16, torch.bfloat16 or None, found "
                         f"{_check.found(dtype)}")
    return known[key]


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
    _group_keys = ()  # the settings a parameter group may have of its own, besides "params" and "lr"

    def __init__(self, params, lr, loss_scaling, max_grad_norm=None, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None):
        self.accum_type = _state_type("accum_type", accum_type)
        self.first_order_momentum_accum_type = _state_type("first_order_momentum_accum_type",
                                                           first_order_momentum_accum_type)
        self.second_order_momentum_accum_type = _state_type("second_order_momentum_accum_type",
                                                            second_order_momentum_accum_type)
        groups = _params(params)
        self._groups = None  # the parameter groups' own settings (NOTE [parameter groups]), or None
        lrs = [_number("lr", lr)]
        if groups and isinstance(groups[0], dict):
            if not all(isinstance(g, dict) and "params" in g for g in groups):
                raise ValueError(f"aspen.optim.{type(self).__name__}: params: expected parameter groups, each a dict "
                                 f"with 'params', found {_check.found(groups)}")
            self._groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
            self.group_params = [_params(g["params"], group=True) for g in groups]
            seen = {}
            for k, ps in enumerate(self.group_params):
                for p in ps:
                    key = p if isinstance(p, str) else id(p)
                    if key in seen:
                        raise ValueError(f"aspen.optim.{type(self).__name__}: params: expected each parameter in one "
                                         f"group, found one in groups {seen[key]} and {k}")
                    seen[key] = k
            lrs = [_number(f"param_groups[{k}]['lr']", g.get("lr", lr)) for k, g in enumerate(self._groups)]
            groups = [p for ps in self.group_params for p in ps]
        self.params = groups
        self.param_groups = [{"lr": v} for v in lrs]
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

    def _group_rules(self):
        """Each parameter group's update settings (the optimizer's, overridden by the group's own)."""
        rules = []
        for k, own in enumerate(self._groups or [{}]):
            extra = set(own) - {"lr", "initial_lr"} - set(self._group_keys)
            if extra:
                raise NotImplementedError(f"aspen.optim.{type(self).__name__}: param_groups[{k}]: settings "
                                          f"{', '.join(sorted(extra))}: expected only lr, "
                                          f"{', '.join(self._group_keys)}")
            rules.append(self._rule({k: v for k, v in own.items() if k != "initial_lr"}))
        return rules

    @property
    def lr(self):
        return self.param_groups[0]["lr"]

    def _settings(self):
        """The dict the C++ side takes (python/module.cc training_from): the first group's settings, and
        "groups": the others' as train::ParamGroup fields (their "params" added by the model, which names
        them)."""
        n = len(self._groups or [{}])
        if len(self.param_groups) != n or any(set(g) != {"lr"} for g in self.param_groups):
            groups = "one group" if n == 1 else f"{n} groups"
            raise ValueError(f"param_groups: expected {groups} with 'lr' alone (the other settings are the "
                             f"optimizer's arguments or the groups' own, fixed when it was made), found "
                             f"{_check.found(self.param_groups)}")
        lrs = [_number(f"param_groups[{k}]['lr']", g["lr"]) for k, g in enumerate(self.param_groups)]
        base = lrs  # what the ratios are taken from: the rates, or (all 0: a scheduler at 0) the initial ones
        initial = [g.get("initial_lr") for g in (self._groups or [{}])]
        if lrs[0] == 0 and all(isinstance(v, (int, float)) and v > 0 for v in initial):
            base = [float(v) for v in initial]
        rules = self._group_rules()
        s = {"optimizer": self.kind, "lr": lrs[0]}
        s.update(rules[0])
        if n > 1:
            groups = []
            for k in range(1, n):
                if lrs[0] == 0 and lrs[k] != 0:
                    raise NotImplementedError(f"param_groups[{k}]['lr'] {lrs[k]} with param_groups[0]['lr'] 0: a "
                                              "group's rate is the first group's times a ratio (NOTE [parameter "
                                              "groups]); give the first group a rate > 0")
                own = {key: v for key, v in rules[k].items()
                       if key not in ("nesterov", "centered", "l2_weight_decay")}  # one rule for all groups
                groups.append(dict(own, lr_scale=base[k] / base[0] if base[0] else 1.0))
            s["groups"] = groups
        if self.loss_scaling == "dynamic":
            s["dynamic_loss_scaling"] = True
        elif self.loss_scaling is not None:
            s["loss_scaling"] = float(self.loss_scaling)
        if self.max_grad_norm is not None:
            s["clip_grad_norm"] = float(self.max_grad_norm)
        for key, t in (("gradient_dtype", self.accum_type), ("first_order_dtype", self.first_order_momentum_accum_type),
                       ("second_order_dtype", self.second_order_momentum_accum_type)):
            if t != "f32":
                s[key] = t
        return s

    def _rule(self, own=None):
        raise NotImplementedError

    def __repr__(self):
        rule = "".join(f", {k}={v!r}" for k, v in self._rule().items())
        return f"aspen.optim.{type(self).__name__}(lr={self.lr!r}{rule}, loss_scaling={self.loss_scaling!r})"


def same_groups(compiled, given, rates_zero=False):
    """Whether setOptimizer's groups keep the compiled ones: equal settings and learning-rate ratios (up to the
    rounding a scheduler's arithmetic leaves; any ratio when every rate is 0)."""
    if len(compiled or []) != len(given or []):
        return False
    for a, b in zip(compiled or [], given or []):
        if set(a) != set(b) or any(a[k] != b[k] for k in a if k != "lr_scale"):
            return False
        if not rates_zero and abs(a["lr_scale"] - b["lr_scale"]) > 1e-9 * max(1.0, abs(a["lr_scale"])):
            return False
    return True


class SGD(Optimizer):
    kind = "sgd"

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 loss_scaling=None, max_grad_norm=None, accum_type=None, velocity_accum_type=None):
        super().__init__(params, lr, loss_scaling, max_grad_norm, accum_type, velocity_accum_type)
        if _number("dampening", dampening) != 0:
            raise NotImplementedError(f"aspen.optim.SGD: dampening {dampening!r} is not supported (0 only)")
        self.momentum = _fraction("momentum", momentum)
        self.weight_decay = _number("weight_decay", weight_decay)
        self.nesterov = _check.boolean("nesterov", nesterov)
        if self.nesterov and not self.momentum:
            raise ValueError("aspen.optim.SGD: nesterov: expected a momentum > 0 with it, found momentum 0")
        self._group_rules()

    _group_keys = ("momentum", "weight_decay")

    def _rule(self, own=None):
        own = own or {}
        r = {"momentum": _fraction("momentum", own.get("momentum", self.momentum)),
             "weight_decay": _number("weight_decay", own.get("weight_decay", self.weight_decay))}
        if self.nesterov and not r["momentum"]:
            raise ValueError("aspen.optim.SGD: nesterov: expected a momentum > 0 in every group, found momentum 0")
        return dict(r, nesterov=self.nesterov)


class AdamW(Optimizer):
    kind = "adamw"

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, amsgrad=False,
                 loss_scaling=None, max_grad_norm=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None):
        super().__init__(params, lr, loss_scaling, max_grad_norm, accum_type, first_order_momentum_accum_type,
                         second_order_momentum_accum_type)
        if _check.boolean("amsgrad", amsgrad):
            raise NotImplementedError("aspen.optim.AdamW: amsgrad is not supported")
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise ValueError(f"betas: expected a pair (beta1, beta2), found {_check.found(betas)}")
        self.betas = (_fraction("betas[0]", betas[0]), _fraction("betas[1]", betas[1]))
        self.eps = _number("eps", eps)
        self.weight_decay = _number("weight_decay", weight_decay)
        self._group_rules()

    _group_keys = ("betas", "eps", "weight_decay")

    def _rule(self, own=None):
        own = own or {}
        betas = own.get("betas", self.betas)
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise ValueError(f"betas: expected a pair (beta1, beta2), found {_check.found(betas)}")
        return {"beta1": _fraction("betas[0]", betas[0]), "beta2": _fraction("betas[1]", betas[1]),
                "eps": _number("eps", own.get("eps", self.eps)),
                "weight_decay": _number("weight_decay", own.get("weight_decay", self.weight_decay))}


class Adam(AdamW):
    """torch.optim.Adam's rule: AdamW's, with the weight decay an L2 term added to the gradient before the
    moments (train::OptimizerOptions::l2_weight_decay) instead of decoupled."""

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.0, amsgrad=False,
                 loss_scaling=None, max_grad_norm=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, loss_scaling, max_grad_norm, accum_type,
                         first_order_momentum_accum_type, second_order_momentum_accum_type)

    def _rule(self, own=None):
        return dict(super()._rule(own), l2_weight_decay=True)


class RMSprop(Optimizer):
    """torch.optim.RMSprop's rule (train::OptimizerKind::rmsprop): alpha, eps outside the root, L2 weight decay
    added to the gradient, momentum, centered."""
    kind = "rmsprop"

    def __init__(self, params, lr=0.01, alpha=0.99, eps=1e-08, weight_decay=0.0, momentum=0.0, centered=False,
                 loss_scaling=None, max_grad_norm=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None):
        super().__init__(params, lr, loss_scaling, max_grad_norm, accum_type, first_order_momentum_accum_type,
                         second_order_momentum_accum_type)
        self.alpha = _fraction("alpha", alpha)
        self.eps = _number("eps", eps)
        self.weight_decay = _number("weight_decay", weight_decay)
        self.momentum = _fraction("momentum", momentum)
        self.centered = _check.boolean("centered", centered)
        self._group_rules()

    _group_keys = ("alpha", "eps", "weight_decay", "momentum")

    def _rule(self, own=None):
        own = own or {}
        return {"alpha": _fraction("alpha", own.get("alpha", self.alpha)),
                "eps": _number("eps", own.get("eps", self.eps)),
                "weight_decay": _number("weight_decay", own.get("weight_decay", self.weight_decay)),
                "momentum": _fraction("momentum", own.get("momentum", self.momentum)),
                "centered": self.centered}


class LAMB(AdamW):
    kind = "lamb"

    def __init__(self, params, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, loss_scaling=None,
                 max_grad_norm=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None):
        super().__init__(params, lr, betas, eps, weight_decay, False, loss_scaling, max_grad_norm, accum_type,
                         first_order_momentum_accum_type, second_order_momentum_accum_type)


def from_torch(opt):
    """The aspen optimizer that runs torch.optim optimizer `opt`'s update (PopTorch takes torch.optim's SGD,
    Adam, AdamW and its own; aspen.poptorch.optim's add PopTorch's arguments). Its parameter groups' settings
    are read now (NOTE [parameter groups]): after a learning-rate scheduler steps, setOptimizer(opt) reads them
    again. What aspen's update rules cannot follow is refused by name (never run differently)."""
    import torch
    kind = f"{type(opt).__module__}.{type(opt).__qualname__}"
    groups = opt.param_groups
    for k, g in enumerate(groups):
        if g.get("maximize"):
            raise NotImplementedError(f"{kind}: param_groups[{k}]: maximize=True is not supported (aspen minimizes "
                                      "the loss)")
        if g.get("amsgrad"):
            raise NotImplementedError(f"{kind}: param_groups[{k}]: amsgrad=True is not supported")
    g = groups[0]
    extra = {"loss_scaling": getattr(opt, "loss_scaling", None), "max_grad_norm": getattr(opt, "max_grad_norm", None)}
    if extra["loss_scaling"] == 1.0:
        extra["loss_scaling"] = None  # PopTorch's default: no scaling
    types = getattr(opt, "accum_types", {})  # aspen.poptorch.optim's (PopTorch's accum_type, ...)
    extra["accum_type"] = types.get("accum_type")
    first = types.get("first_order_momentum_accum_type", types.get("velocity_accum_type"))
    second = types.get("second_order_momentum_accum_type")

    def own(keys):
        return [dict({k: grp[k] for k in keys + ("initial_lr",) if k in grp}, params=list(grp["params"]), lr=grp["lr"])
                for grp in groups]
    if isinstance(opt, torch.optim.SGD):
        for k, grp in enumerate(groups):
            if grp.get("dampening", 0.0):
                raise NotImplementedError(f"{kind}: param_groups[{k}]: dampening {grp['dampening']} is not "
                                          "supported (0 only)")
            if grp.get("nesterov", False) != g.get("nesterov", False):
                raise NotImplementedError(f"{kind}: param_groups[{k}]: nesterov {grp.get('nesterov')}: expected "
                                          f"the first group's ({g.get('nesterov', False)}): one rule for all groups")
        return SGD(own(("momentum", "weight_decay")), lr=g["lr"], momentum=g.get("momentum", 0.0),
                   weight_decay=g.get("weight_decay", 0.0), nesterov=g.get("nesterov", False),
                   velocity_accum_type=first, **extra)
    extra.update(first_order_momentum_accum_type=first, second_order_momentum_accum_type=second)
    if isinstance(opt, torch.optim.Adam):  # torch's AdamW is an Adam with decoupled weight decay
        if getattr(opt, "bias_correction", True) is False:
            raise NotImplementedError(f"{kind}: bias_correction=False is not supported (aspen's AdamW corrects)")
        decoupled = isinstance(opt, torch.optim.AdamW) or g.get("decoupled_weight_decay", False)
        cls = AdamW if decoupled else Adam
        return cls(own(("betas", "eps", "weight_decay")), lr=g["lr"], betas=g["betas"], eps=g["eps"],
                   weight_decay=g.get("weight_decay", 0.0), **extra)
    if isinstance(opt, torch.optim.RMSprop):
        for k, grp in enumerate(groups):
            if grp.get("centered", False) != g.get("centered", False):
                raise NotImplementedError(f"{kind}: param_groups[{k}]: centered {grp.get('centered')}: expected "
                                          f"the first group's ({g.get('centered', False)}): one rule for all groups")
        return RMSprop(own(("alpha", "eps", "weight_decay", "momentum")), lr=g["lr"], alpha=g["alpha"], eps=g["eps"],
                       weight_decay=g["weight_decay"], momentum=g["momentum"], centered=g["centered"], **extra)
    if type(opt).__name__ == "LAMB" and hasattr(opt, "max_weight_norm"):
        if opt.max_weight_norm not in (None, 65500.0):
            raise NotImplementedError(f"{kind}: max_weight_norm {opt.max_weight_norm} is not supported (aspen's "
                                      "LAMB does not clip the weight norm; PopTorch's default 65500 is accepted)")
        return LAMB(own(("betas", "eps", "weight_decay")), lr=g["lr"], betas=g["betas"], eps=g["eps"],
                    weight_decay=g["weight_decay"], **extra)
    raise NotImplementedError(f"optimizer {kind}: expected torch.optim's SGD, Adam, AdamW or RMSprop, or an aspen.optim "
                              "optimizer (SGD, AdamW, LAMB, RMSprop); the others have no update rule in aspen yet")
