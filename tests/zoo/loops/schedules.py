"""Loops that move the learning rate and other hyper-parameters: schedulers built before or after accelerate(),
and nanoGPT's writes into param_groups."""
from __future__ import annotations

from torch.optim import lr_scheduler

from accel.testing.trace import Loop


class Scheduler(Loop):
    """A learning-rate scheduler stepped after every batch, as the PyTorch docs show."""

    def after(self, step, held, run, loss):
        self.scheduler.step()


class OneCycle(Scheduler):
    name, holds_from_before = "onecycle", True

    def prepare(self, held):  # built before accelerate(), on the user's optimizer
        groups = held.optimizer.param_groups
        self.scheduler = lr_scheduler.OneCycleLR(  # it cycles momentum where the optimizer has one (not Adagrad)
            held.optimizer, max_lr=[2 * g["lr"] for g in groups], total_steps=100,
            cycle_momentum=all("betas" in g or g.get("momentum") for g in groups))


class LambdaDecay(Scheduler):
    name, holds_from_before = "lambda", True

    def prepare(self, held):
        self.scheduler = lr_scheduler.LambdaLR(held.optimizer, lambda step: 1.0 / (1 + step))


class Plateau(Loop):
    name, holds_from_before = "plateau", True

    def prepare(self, held):
        self.scheduler = lr_scheduler.ReduceLROnPlateau(held.optimizer, factor=0.5, patience=0, threshold=10.0)

    def after(self, step, held, run, loss):
        self.scheduler.step(loss)


class Warmup(Scheduler):
    """Built after accelerate(), on run.optimizer: warm-up, then exponential decay."""

    name = "warmup"

    def start(self, held, run):
        optimizer = run.optimizer
        self.scheduler = lr_scheduler.SequentialLR(optimizer, [lr_scheduler.LinearLR(optimizer, 0.25, total_iters=2),
                                                               lr_scheduler.ExponentialLR(optimizer, 0.7)],
                                                   milestones=[2])


class LrWrites(Loop):
    """nanoGPT's loop: it writes the learning rate (and other hyper-parameters) into param_groups every step."""

    name = "lr_writes"

    def start(self, held, run):
        self.base = [group["lr"] for group in held.optimizer.param_groups]

    def before(self, step, held, run):
        for base, group in zip(self.base, held.optimizer.param_groups):
            group["lr"] = base * max(0.1, 1 - 0.15 * step)  # a decay to a floor, as nanoGPT's cosine to min_lr
            # (without the floor, the rate turned negative at step 7 and a 24-step run diverged)
            if "weight_decay" in group:
                group["weight_decay"] = 0.001 * step
            if group.get("momentum"):
                group["momentum"] = 0.8
            if "betas" in group:
                group["betas"] = (0.8, 0.99)
        return run
