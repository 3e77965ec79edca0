"""grad_accumulation: N batches per optimizer step, their gradients averaged: a batch N times larger.

What it does: ``run.backward`` divides each micro-batch's loss by N, so the N gradients add up to their mean;
``run.step()`` steps the optimizer (and zeroes the gradients) only on every N-th call and returns True
("not stepped") on the others, so a learning-rate scheduler steps with the optimizer. Under DDP, the forward
passes of the first N-1 micro-batches run inside DDP's ``no_sync`` (entered by ``run.autocast()``, as in the
README loop), and under FSDP their backward passes run with its gradient reduction off
(``set_requires_gradient_sync(False)``), so gradients are reduced once per optimizer step. ``run.save`` keeps the micro-step and
the gradients accumulated so far, each rank's own (they differ under no_sync): a run resumed mid-accumulation
continues exactly.

When it helps: the batch you want does not fit in memory, or an all-reduce per batch costs too much.
It does not make a step faster by itself: the same work, fewer optimizer updates.

What it keeps: not the plain loop's training: that is its purpose. Declared: one optimizer step every N
batches on the mean of their gradients, the same update as one batch of N x B samples for models without
batch statistics (BatchNorm sees micro-batches of B). Everything else (batches, structure, the user's
objects) is kept exactly.
"""
from __future__ import annotations

import contextlib

from accel.accelerator import Accelerator, Keeps, Option, Stage, at_least, register
from accel.errors import Skip


def no_sync(run) -> contextlib.AbstractContextManager:
    """The gradient-sync pause of the first wrapper that has one (DDP, FSDP), or nothing to pause."""
    for model in run.wrappers():
        if hasattr(model, "no_sync"):
            return model.no_sync()
    return contextlib.nullcontext()


@register
class GradAccumulation(Accelerator):
    name = "grad_accumulation"
    example = {"steps": 2}
    stage = Stage.STEP
    needs = ("optimizer",)
    provides = ("step.schedule",)
    keeps = Keeps("changed", note="one optimizer step every N batches, on the mean of their gradients")
    state_per_rank = True  # under DDP's no_sync each rank accumulates its own gradients
    options = {"steps": Option(1, (int,), check=at_least(1), help="micro-batches per optimizer step")}

    def decide(self, ctx):
        if self.steps == 1:
            raise Skip("steps=1: every batch steps the optimizer; give steps >= 2 to accumulate")
        ctx.decide("accumulation_steps", self.steps, "asked for")

    def apply(self, ctx):
        self.micro = 0  # micro-batches since the last optimizer step
        self.divided = False  # the gradients hold a loss it divided (since the last optimizer step)
        self.idle = False  # the loop went around the run (accel/watch.py): it stands aside
        self.model = ctx.model  # its parameters are read when saved: fsdp, applied later, replaces them in place
        self.pausing = None  # the run's accelerators that reduce gradients in backward (fsdp): found at the first one
        return {"steps": self.steps, "loss": f"divided by {self.steps} before backward",
                "optimizer": f"steps once every {self.steps} run.step() calls; run.step() returns True in between",
                "no_sync": "the first N-1 forwards under DDP (inside run.autocast()); their backward without "
                                "reduction under FSDP"}

    def relies_on(self):
        return {"backward": f"division of the loss by {self.steps}",
                "step": f"holding of the optimizer step for {self.steps} batches",
                "batch": "counting of batches (one per run.step())"}

    def bypassed(self, run, call):
        """Half-done accumulation would train something else than either loop: it stands aside, and gradients it
        divided by N are multiplied back (exactly for N a power of two, else to float rounding)."""
        self.idle, multiplied = True, self.divided
        if multiplied:
            held = [g for a in self.pausing or [] for g in a.held_gradients()]  # unreduced by fsdp, not yet in .grad
            for grad in [*held, *(p.grad for p in run.unwrap().parameters() if p.grad is not None)]:
                grad.mul_(self.steps)
        self.micro, self.divided = 0, False
        return ("idle from here on: it divides no loss and holds no step, your loop's own updates train"
                + (f" (the gradients it had divided were multiplied back by {self.steps})" if multiplied else ""))

    def forward_context(self, run):
        return no_sync(run) if self.micro + 1 < self.steps and not self.idle else None

    def backward(self, run, loss, proceed):
        if self.idle:
            return proceed(loss)
        self.divided = True
        if self.pausing is None:
            self.pausing = [a for a in run.accelerators if hasattr(a, "gradient_sync")]
        pausing = self.pausing if self.micro + 1 < self.steps else []
        for accelerator in pausing:  # fsdp reduces gradients in backward: not on the micro-steps
            accelerator.gradient_sync(False)
        try:
            proceed(loss / self.steps)
        finally:
            for accelerator in pausing:
                accelerator.gradient_sync(True)

    def step(self, run, optimizer, proceed):
        if self.idle:
            return proceed(optimizer)
        self.micro += 1
        if self.micro < self.steps:
            return False  # keep accumulating: no update, gradients kept
        self.micro, self.divided = 0, False
        return proceed(optimizer)

    def state_dict(self):
        params = dict(self.model.named_parameters())
        grads = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None} if self.micro else {}
        return {"micro": self.micro, "grads": grads}

    def load_state_dict(self, state):
        micro, grads = state.get("micro"), state.get("grads", {})
        params = dict(self.model.named_parameters())
        if not isinstance(micro, int) or not 0 <= micro < self.steps:
            raise ValueError(f"micro-step {micro!r} does not fit steps={self.steps}")
        unknown = set(grads) - set(params)
        wrong = [n for n, g in grads.items() if n in params and g.shape != params[n].shape]
        if unknown or wrong:
            raise ValueError(f"accumulated gradients do not fit the model (unknown {sorted(unknown)}, "
                             f"other shapes {sorted(wrong)})")
        self.micro = micro
        for name, param in params.items():
            param.grad = grads[name].to(param.device, param.dtype).clone() if name in grads else None
