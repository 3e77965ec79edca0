"""channels_last: NHWC memory format for models with 2-D convolutions, inputs converted as they arrive.

It helps mobilenet_v2 and resnets and hurts alexnet and vgg16 on a 2-core Zen 3 (docs/accelerators/channels_last.md).
"""
from __future__ import annotations

import torch

from accel.accelerator import Accelerator, Stage, register
from accel.errors import Skip


def to_channels_last(batch: torch.Tensor) -> torch.Tensor:
    """Images (4-D floating tensors) go NHWC; labels and everything else pass unchanged."""
    if batch.dim() == 4 and batch.is_floating_point():
        return batch.contiguous(memory_format=torch.channels_last)
    return batch


@register
class ChannelsLast(Accelerator):
    name = "channels_last"
    stage = Stage.KERNELS

    def apply(self, ctx):
        convs = sum(isinstance(m, torch.nn.Conv2d) for m in ctx.model.modules())
        if not convs:
            raise Skip("the model has no Conv2d: channels_last only changes 2-D convolutions")
        ctx.model.to(memory_format=torch.channels_last)
        changes = {"memory_format": "channels_last", "conv2d_layers": convs}
        if ctx.loader is not None:
            ctx.batch_transforms.append(to_channels_last)
            changes["inputs"] = "converted in the loader"
        else:
            changes["inputs"] = "not converted (no loader): convert them yourself or let the first conv do it"
        return changes
