"""grad_clipping: clip the gradients' total norm (or each value) before every optimizer step.

What it does: on each real optimizer step (never on accumulation's micro-steps) it unscales the gradients and
applies ``clip_grad_norm_`` or ``clip_grad_value_``; ``run.state("grad_clipping").last_norm`` is the norm before.
When it helps: stability, not speed.

What it keeps: everything but its declared change (gradients above the limit scaled down). Its card:
docs/accelerators/grad_clipping.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from accel.errors import Problem
from accel.plan.contract import Accelerator, Capability, Keeps, Stage, State, register
from accel.plan.options import Options, option, positive

__all__ = ["GradClipping", "GradClippingOptions", "GradClippingState"]


@dataclass(frozen=True, kw_only=True)
class GradClippingOptions(Options):
    example = {"max_norm": 1.0}
    max_norm: int | float | None = option(None, (int, float, type(None)), check=positive,
                                          help="largest total gradient norm")
    norm_type: int | float | str = option(2.0, (int, float, str), choices=("inf",),  # (the check sees numbers only)
                                          check=lambda p: None if p > 0 else "must be > 0 or 'inf'",
                                          help="the p of the p-norm, or 'inf'")
    value: int | float | None = option(None, (int, float, type(None)), check=positive,
                                       help="clamp every gradient to +-value")
    foreach: bool | None = option(None, (bool, type(None)), help="None: torch's choice of the foreach kernels")


@dataclass
class GradClippingState(State):
    last_norm: torch.Tensor | None = None  # the total norm before the last clipping (max_norm only)


@register
class GradClipping(Accelerator[GradClippingOptions, GradClippingState]):
    name = "grad_clipping"
    stage = Stage.STEP
    requires = ("optimizer",)
    provides = (Capability.GRADIENTS_CLIP,)
    after = (Capability.STEP_SCHEDULE,)  # clip the accumulated gradient, once per optimizer step
    keeps = Keeps("changed", note="gradients above max_norm scaled down to it (or clamped to +-value)")

    def check(self, ctx):
        if (self.config.max_norm is None) == (self.config.value is None):
            return [Problem(self.name, "give max_norm (clip the total norm) or value (clamp each gradient), one of "
                            "them", field="max_norm", value=self.config.max_norm, allowed="max_norm=1.0, or value=0.5")]
        return []

    def apply(self, ctx):
        config = self.config
        changes = {"value": config.value} if config.max_norm is None else {
            "max_norm": config.max_norm, "norm_type": config.norm_type,
            "under_grad_scaler": "unscaled first" if ctx.decisions.loss_scaling else "no scaler"}
        return GradClippingState(changes=changes, relies_on={"step": "clipping of the gradients before the update"})

    def step(self, run, state, optimizer, proceed):
        config = self.config
        run.unscale_gradients(optimizer)  # true gradients under a loss scaler (fp16), before they are read
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if config.max_norm is not None:
            state.last_norm = torch.nn.utils.clip_grad_norm_(params, config.max_norm, norm_type=float(config.norm_type),
                                                             foreach=config.foreach).detach()
        else:
            torch.nn.utils.clip_grad_value_(params, config.value, foreach=config.foreach)
        return proceed(optimizer)
