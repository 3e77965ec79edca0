"""Loops that use the model between steps: their own checkpoints, validation passes, a BatchNorm kept in eval
mode, hooks, and averages of the weights (EMA, SWA) that are evaluated as well."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from accel.testing.trace import Loop


class OwnCheckpoint(Loop):
    """The user's own checkpoint code: state_dict() of model and optimizer at step 1, loaded back at step 2."""

    name = "own_checkpoint"

    def before(self, step, held, run):
        if step == 1:
            self.saved = copy.deepcopy({"model": held.model.state_dict(), "optimizer": held.optimizer.state_dict()})
        if step == 2:
            held.model.load_state_dict(self.saved["model"])
            held.optimizer.load_state_dict(self.saved["optimizer"])
        return run


class Validation(Loop):
    """A validation pass before steps 1 and 2: model.eval(), no_grad, model.train(); through the user's model,
    then through run.model."""

    name = "validation"

    def start(self, held, run):
        self.outputs = {}

    def before(self, step, held, run):
        if step in (1, 2):
            model = held.model if step == 1 else run.model
            model.eval()
            with torch.no_grad():
                self.outputs[f"validation {step}"] = held.evaluate(model).float()
            model.train()
        return run

    def observed(self):
        return self.outputs


class FrozenNorm(Loop):
    """A detector's habit: the backbone's BatchNorm kept in eval mode (a submodule's eval()) while training."""

    name = "frozen_norm"

    def start(self, held, run):
        held.model.norm.eval()


class Hooks(Loop):
    """A forward hook and a gradient hook registered after accelerate(), on the user's modules and parameters."""

    name = "hooks"

    def start(self, held, run):
        held.model.fc.register_forward_hook(lambda module, args, output: output * 0.5)
        weight = held.model.conv2.weight
        if weight.requires_grad:
            weight.register_hook(lambda grad: grad * 0.25)


class Ema(Loop):
    """An exponential moving average of the user's model, updated after every step, then evaluated."""

    name = "ema"

    def average(self, model: nn.Module) -> AveragedModel:
        return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8))

    def start(self, held, run):
        self.held = held
        self.model = self.average(held.model)

    def after(self, step, held, run, loss):
        self.model.update_parameters(held.model)

    def observed(self):
        self.model.eval()
        with torch.no_grad():
            output = self.held.evaluate(self.model).float()
        return {**{f"average {k}": v.detach().float() for k, v in self.model.module.state_dict().items()},
                "average's output": output}


class Swa(Ema):
    """Stochastic weight averaging (the mean of the weights seen), buffers averaged too."""

    name = "swa"

    def average(self, model):
        return AveragedModel(model, use_buffers=True)
