"""Loops that release a frozen layer while training: by requires_grad_(), or with a new param group."""
from __future__ import annotations

import torch
from torch import nn

from accel.testing.trace import Held, Loop


def layer(model: nn.Module) -> list[nn.Parameter]:
    """The parameters a progressive-unfreezing loop releases late: the second convolution's."""
    return list(model.conv2.parameters())


class Unfreeze(Loop):
    """Progressive unfreezing: a layer frozen before accelerate(), unfrozen with requires_grad_() at step 1."""

    name = "unfreeze"

    def prepare(self, held):
        held.model.conv2.requires_grad_(False)

    def before(self, step, held, run):
        if step == 1:
            held.model.conv2.requires_grad_(True)
        return run


class AddGroup(Loop):
    """Unfreezing with a new param group: the layer is not in the optimizer until step 1."""

    name = "add_group"

    def prepare(self, held):
        late = {id(p) for p in layer(held.model)}
        for group in held.optimizer.param_groups:  # as if the optimizer had been built without the layer
            group["params"] = [p for p in group["params"] if id(p) not in late]
        for param in layer(held.model):
            held.optimizer.state.pop(param, None)  # Adagrad makes its state in __init__
        held.model.conv2.requires_grad_(False)

    def before(self, step, held, run):
        if step == 1:
            self.unfreeze(held)
            held.optimizer.add_param_group({"params": self.late_params(held)})  # the optimizer's defaults
            if isinstance(held.optimizer, torch.optim.Adagrad):  # torch 2.8's Adagrad makes its state only in
                group = held.optimizer.param_groups[-1]  # __init__ (KeyError 'sum' otherwise): as __init__ does
                for param in group["params"]:
                    held.optimizer.state.setdefault(param, {
                        "step": torch.tensor(0.0), "sum": torch.full_like(param, group["initial_accumulator_value"],
                                                                          memory_format=torch.preserve_format)})
        return run


    def unfreeze(self, held: Held) -> None:
        held.model.conv2.requires_grad_(True)

    def late_params(self, held: Held) -> list[nn.Parameter]:
        return layer(held.model)


class LateGroup(AddGroup):
    """AddGroup over the Parameter objects the script took before accelerate() (``backbone =
    list(model.backbone.parameters())``), unfrozen there: under fsdp, the tensors it replaced by their shards."""

    name, holds_from_before = "late_group", True

    def prepare(self, held):
        super().prepare(held)
        self.late = layer(held.model)

    def unfreeze(self, held):
        for param in self.late:
            param.requires_grad_(True)

    def late_params(self, held):
        return self.late
