"""channels_last: NHWC memory format for the inputs of a model's 2-D convolutions.

What it does: a forward pre-hook on every Conv2d (through the run's journal) turns its input into channels_last, so
oneDNN and cuDNN run their NHWC kernels. When it helps depends on the model and the CPU, which is why tune and
``plan="auto"`` measure it; a model without Conv2d is skipped.

What it keeps: the same math in another memory order (``SAME_MATH``); dropout gets its input in the plain loop's
order, so it draws the plain loop's masks. Its card: docs/accelerators/channels_last.md.
"""
from __future__ import annotations

import torch

from accel.errors import Skip
from accel.modules import recomputable
from accel.plan.contract import SAME_MATH, Accelerator, Capability, Stage, register

__all__ = ["ChannelsLast"]


@recomputable
def to_channels_last(module: torch.nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook: the conv's 4-D floating input in NHWC (a no-op when it already is)."""
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4 and args[0].is_floating_point():
        return (args[0].contiguous(memory_format=torch.channels_last), *args[1:])
    return None


@recomputable
def to_contiguous(module: torch.nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook on a dropout layer: its input in the plain loop's memory order, since dropout draws its mask
    in memory order (an NHWC input would get another mask than the plain loop's)."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


def has_conv2d(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


@register
class ChannelsLast(Accelerator):
    name = "channels_last"
    stage = Stage.KERNELS
    provides = (Capability.MODEL_LAYOUT,)
    keeps = SAME_MATH

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        return [{}] if has_conv2d(model) else []

    def decide(self, ctx):
        if not has_conv2d(ctx.model):
            raise Skip("the model has no Conv2d: channels_last only changes 2-D convolutions")

    def apply(self, ctx):
        convs = [(name, m) for name, m in ctx.model.named_modules() if isinstance(m, torch.nn.Conv2d)]
        drops = [(name, m) for name, m in ctx.model.named_modules()
                 if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
        for hook, what, modules in ((to_channels_last, "channels_last pre-hook on {}", convs),
                                    (to_contiguous, "channels_last: {} draws its mask in your memory order", drops)):
            for name, module in modules:
                if hook not in module._forward_pre_hooks.values():  # once, whatever runs came before
                    ctx.journal.hook(what.format(name), lambda m=module, h=hook: m.register_forward_pre_hook(h))
        return {"memory_format": "channels_last", "conv2d_layers": len(convs),
                "inputs": "each Conv2d's input converted (the batch itself and your parameters unchanged)"}
