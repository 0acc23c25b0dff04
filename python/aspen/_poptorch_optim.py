"""aspen.poptorch.optim: PopTorch's optimizers, which are torch.optim's with PopTorch's arguments.

They are torch.optim optimizers (torch's learning-rate schedulers drive them; setOptimizer passes the new
rate without recompiling); a training model runs their update with aspen's rules (aspen.optim.from_torch).
PopTorch's arguments:
- loss_scaling: a static loss scale (1.0 or None: none);
- max_grad_norm: clip the global gradient norm (inf or None: no clipping);
- accum_type (the type gradients are rounded to and accumulated in), velocity_accum_type /
  first_order_momentum_accum_type and second_order_momentum_accum_type (the types the optimizer state is kept
  in): torch.float32, torch.float16 or torch.bfloat16, as aspen.optim takes them;
- velocity_scaling, use_combined_accum: how an IPU keeps its fp16 velocity in range and where it
  accumulates; with an f32 velocity they change nothing (accepted); a scaled half velocity is refused;
- LAMB's max_weight_norm: PopTorch's default (65500) only.
Arguments given as None take torch's defaults, as in PopTorch.
"""

import torch

from .optim import _state_type

__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "LAMB"]


def _given(**kw):
    return {k: v for k, v in kw.items() if v is not None}


class _PopTorchArgs:
    def _poptorch(self, loss_scaling, max_grad_norm, **types):
        for k, v in types.items():
            _state_type(k, v)  # refused now, as PopTorch's constructor refuses it
        self.accum_types = {k: v for k, v in types.items() if v is not None}
        self.loss_scaling = loss_scaling
        self.max_grad_norm = max_grad_norm


class SGD(torch.optim.SGD, _PopTorchArgs):
    def __init__(self, params, lr, momentum=None, dampening=None, weight_decay=None, nesterov=None, maximize=None,
                 foreach=None, differentiable=None, loss_scaling=None, velocity_scaling=None,
                 use_combined_accum=None, accum_type=None, velocity_accum_type=None, max_grad_norm=None):
        super().__init__(params, lr=lr, **_given(momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                                 nesterov=nesterov, maximize=maximize, foreach=foreach,
                                                 differentiable=differentiable))
        self._poptorch(loss_scaling, max_grad_norm, accum_type=accum_type, velocity_accum_type=velocity_accum_type)
        if velocity_scaling not in (None, 1.0) and velocity_accum_type in (torch.float16, torch.bfloat16):
            raise NotImplementedError(f"aspen.poptorch.optim.SGD: velocity_scaling {velocity_scaling} with a "
                                      f"{velocity_accum_type} velocity is not supported (aspen keeps the velocity "
                                      "unscaled, which rounds it differently); leave velocity_scaling at 1.0")
        self.velocity_scaling = velocity_scaling
        self.use_combined_accum = use_combined_accum


class Adam(torch.optim.Adam, _PopTorchArgs):
    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None, amsgrad=None, foreach=None,
                 maximize=None, capturable=None, differentiable=None, fused=None, loss_scaling=None,
                 accum_type=None, first_order_momentum_accum_type=None, second_order_momentum_accum_type=None,
                 max_grad_norm=None):
        super().__init__(params, **_given(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                          foreach=foreach, maximize=maximize, capturable=capturable,
                                          differentiable=differentiable, fused=fused))
        self._poptorch(loss_scaling, max_grad_norm, accum_type=accum_type,
                       first_order_momentum_accum_type=first_order_momentum_accum_type,
                       second_order_momentum_accum_type=second_order_momentum_accum_type)


class AdamW(torch.optim.AdamW, _PopTorchArgs):
    def __init__(self, params, lr=None, betas=None, eps=None, weight_decay=None, amsgrad=None, maximize=None,
                 foreach=None, capturable=None, differentiable=None, fused=None, loss_scaling=None,
                 bias_correction=None, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None, max_grad_norm=None):
        super().__init__(params, **_given(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                          maximize=maximize, foreach=foreach, capturable=capturable,
                                          differentiable=differentiable, fused=fused))
        self._poptorch(loss_scaling, max_grad_norm, accum_type=accum_type,
                       first_order_momentum_accum_type=first_order_momentum_accum_type,
                       second_order_momentum_accum_type=second_order_momentum_accum_type)
        self.bias_correction = True if bias_correction is None else bool(bias_correction)


class RMSprop(torch.optim.RMSprop, _PopTorchArgs):
    def __init__(self, params, lr=None, alpha=None, eps=None, weight_decay=None, momentum=None, centered=None,
                 foreach=None, maximize=None, differentiable=None, loss_scaling=None, accum_type=None,
                 first_order_momentum_accum_type=None, second_order_momentum_accum_type=None, use_tf_variant=None,
                 max_grad_norm=None):
        super().__init__(params, **_given(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                          centered=centered, foreach=foreach, maximize=maximize,
                                          differentiable=differentiable))
        self._poptorch(loss_scaling, max_grad_norm, accum_type=accum_type,
                       first_order_momentum_accum_type=first_order_momentum_accum_type,
                       second_order_momentum_accum_type=second_order_momentum_accum_type)
        self.use_tf_variant = bool(use_tf_variant)


class LAMB(torch.optim.Optimizer, _PopTorchArgs):
    """PopTorch's LAMB (You et al.), run by aspen's LAMB rule; a torch.optim.Optimizer so that schedulers drive
    it. It has no step() of its own: only a training model runs it."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, bias_correction=True,
                 loss_scaling=1.0, max_weight_norm=65500.0, accum_type=None, first_order_momentum_accum_type=None,
                 second_order_momentum_accum_type=None, max_grad_norm=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._poptorch(loss_scaling, max_grad_norm, accum_type=accum_type,
                       first_order_momentum_accum_type=first_order_momentum_accum_type,
                       second_order_momentum_accum_type=second_order_momentum_accum_type)
        if not bias_correction:
            raise NotImplementedError("aspen.poptorch.optim.LAMB: bias_correction=False is not supported")
        self.max_weight_norm = max_weight_norm

    def step(self, closure=None):
        raise NotImplementedError("aspen.poptorch.optim.LAMB.step: LAMB runs inside a training model only")
