"""Loops that drive the training their own way: accelerate() again each epoch, their own backward and optimizer
step, their own accumulation, and a second model with its own run beside the first."""
from __future__ import annotations

import copy

import torch

from accel.api import accelerate
from accel.errors import PlanError
from accel.plan.contract import REGISTRY
from accel.testing.trace import Loop


class Again(Loop):
    """accelerate() once per epoch: the same objects accelerated again at step 2; the optimizer's state and the
    run's counters go on."""

    name = "again"

    def __init__(self):
        self.done, self.stepped, self.boundary = False, 0, False

    def after(self, step, held, run, loss):
        self.boundary, self.stepped = run.optimizer_steps > self.stepped, run.optimizer_steps

    def before(self, step, held, run):
        # at an epoch's end that is also an optimizer step's, as accel asks under fsdp (a new run cannot take over
        # gradients FSDP holds unreduced in the middle of accumulating); without accumulation: at step 2
        if step >= 2 and not self.done and self.boundary:
            self.done = True
            return accelerate(held.model, held.optimizer, held.loader, plan=run.plan, device=run.device)
        return run


class HalfMigrated(Loop):
    """The first thing people do when they migrate: run.loader, run.model and run.autocast(), but their own
    loss.backward(), optimizer.step() and zero_grad(). accel notices it (accel/run/watch.py): what relies on
    run.backward()/run.step() stands aside, named in the report, and the loop trains as it did without accel."""

    name = "half_migrated"

    def step(self, index, run, held, batch, loss_of):
        with run.autocast():
            loss = loss_of(run, batch)
        loss.backward()
        held.optimizer.step()
        held.optimizer.zero_grad()
        return loss.detach()


class OwnAccumulation(Loop):
    """transformers' run_glue_no_trainer: the loss divided by N and backward every batch, the optimizer stepped
    every N batches, by the loop itself. With grad_accumulation in the plan as well, accel notices the second batch
    drawn before run.step() and grad_accumulation stands aside: the loop's own accumulation trains."""

    name = "own_accumulation"
    every = 2

    def step(self, index, run, held, batch, loss_of):
        with run.autocast():
            loss = loss_of(run, batch)
        run.backward(loss / self.every)
        if (index + 1) % self.every == 0:
            run.step()
        return loss.detach()


class TwoModels(Loop):
    """A second model trained beside the first on the same batches (a GAN's critic, a student beside its
    teacher), with its own optimizer and its own accelerate() with the same plan (what needs a loader aside), closed
    after the first: the runs compose, and the process is as it was once both are closed."""

    name = "two_models"

    def prepare(self, held):
        self.model = copy.deepcopy(held.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.run = None

    def start(self, held, run):
        plan = [{name: options} for name, options in run.plan.to_dict().items()
                if "loader" not in REGISTRY[name].requires]
        try:
            self.run = accelerate(self.model, self.optimizer, None, plan=plan, device=run.device)
        except PlanError as error:  # what needs data without needing the loader (prune's dummy input)
            refused = {problem.accelerator for problem in error.problems}
            plan = [entry for entry in plan if next(iter(entry)) not in refused]
            self.run = accelerate(self.model, self.optimizer, None, plan=plan, device=run.device)

    def step(self, index, run, held, batch, loss_of):
        loss = super().step(index, run, held, batch, loss_of)
        super().step(index, self.run, held, batch, loss_of)
        return loss

    def observed(self):
        return {f"second model's {k}": v for k, v in self.run.unwrap().state_dict().items()}

    def finish(self):
        if self.run is not None:
            self.run.close()
