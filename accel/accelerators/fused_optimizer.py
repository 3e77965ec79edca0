"""fused_optimizer: rebuild Adam, AdamW, SGD or Adagrad with ``fused=True``, one kernel for the whole update.

What it does: the run gets a new optimizer of the same class over the same parameters, with the same param
groups and hyperparameters, the same state (moments, step counts), and ``fused=True``. The user's optimizer is
not changed. It is skipped with the reason for other classes, an already fused optimizer, and parameters whose
device or dtype has no fused kernel. It declares ``optimizer.update``: another accelerator that replaces the
update (IPEX's fused step) conflicts with it.

When it helps: the update is a large part of the step (big models, small batches). An Adam step on resnet18's
parameters took 4.7x less time fused here (7.9 ms against 36.8 ms foreach, benchmarks/bench_fused_optimizer.py
on the Zen 4; 3.0x, 6.6 against 20 ms, on the Zen 3 of NOTES.md); in a whole training step, alexnet ran 0.78
and vgg16 0.85 of eager. When it does nothing: on resnet18 alone 1.01 (its step is mostly convolutions), and
on top of channels_last + bf16 it read 0.47 -> 0.46 in one run and 0.45 -> 0.46 in the seed-model run
(docs/measurement.md): within the noise; resnet50 read 1.17 in one fresh-process run,
inside that measurement's noise. Build learning-rate schedulers on ``run.optimizer``.

What it keeps: the same update math in one kernel (``SAME_MATH``): weights and optimizer state equal to
float precision.
"""
from __future__ import annotations

import torch

from accel.accelerator import SAME_MATH, Accelerator, Stage, register
from accel.errors import Skip
from accel.optim import describe_optimizer, rebuild_optimizer

FUSABLE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad)


def fused_problem(optimizer: torch.optim.Optimizer) -> str | None:
    """Why this optimizer cannot take ``fused=True`` here, or None."""
    if type(optimizer) not in FUSABLE:
        return (f"{type(optimizer).__name__} has no fused implementation in torch "
                f"(fused: {', '.join(c.__name__ for c in FUSABLE)})")
    if optimizer.defaults.get("differentiable"):
        return "a differentiable optimizer cannot be fused"
    from torch.optim.optimizer import _device_dtype_check_for_fused

    cuda_unsupported = isinstance(optimizer, torch.optim.Adagrad)  # torch fuses Adagrad on CPU only
    for group in optimizer.param_groups:
        for param in group["params"]:
            try:
                _device_dtype_check_for_fused(param, cuda_unsupported=cuda_unsupported)
            except RuntimeError as error:
                return f"{type(optimizer).__name__}: {error}"
    return None


@register
class FusedOptimizer(Accelerator):
    name = "fused_optimizer"
    stage = Stage.KERNELS  # after surgery, which rebuilds the optimizer on the new parameters
    needs = ("optimizer",)
    provides = ("optimizer.update",)
    conflicts = ("optimizer.update",)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if optimizer is not None and not optimizer.defaults.get("fused") and not fused_problem(optimizer) else []

    def apply(self, ctx):
        optimizer = ctx.optimizer
        if optimizer.defaults.get("fused"):
            raise Skip(f"{type(optimizer).__name__} is already fused")
        why = fused_problem(optimizer)
        if why:
            raise Skip(why)
        changes = {"optimizer": f"{type(optimizer).__name__} rebuilt with fused=True",
                   "state": "kept" if optimizer.state else "empty (no step taken yet)"}
        overrides = {"fused": True}
        if optimizer.defaults.get("foreach"):
            overrides["foreach"] = None  # torch refuses foreach=True together with fused=True
            changes["foreach"] = "True -> None (fused replaces it)"
        ctx.optimizer = rebuild_optimizer(optimizer, **overrides)
        changes["now"] = describe_optimizer(ctx.optimizer)
        return changes
