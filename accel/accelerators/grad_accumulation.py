"""grad_accumulation: N batches per optimizer step, their gradients averaged: a batch N times larger.

What it does: ``run.backward`` divides each loss by N; ``run.step()`` steps the optimizer only on every N-th call
(True on the others), with DDP's and FSDP's gradient reduction off in between. When it helps: the batch you want
does not fit, or an all-reduce per batch costs too much; no step gets faster.

What it keeps: everything but its declared change (one update every N batches on the mean of their gradients).
Its card: docs/accelerators/grad_accumulation.md.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from accel.errors import LoopWarning, Skip, loops_level
from accel.plan.contract import Accelerator, Call, Capability, Keeps, Stage, State, StepSchedule, register
from accel.plan.options import Options, at_least, option

if TYPE_CHECKING:
    from accel.run.context import Context
    from accel.run.run import Run

__all__ = ["GradAccumulation", "GradAccumulationOptions", "GradAccumulationState"]


@dataclass(frozen=True, kw_only=True)
class GradAccumulationOptions(Options):
    example = {"steps": 2}
    steps: int = option(1, check=at_least(1), help="micro-batches per optimizer step")


@dataclass
class GradAccumulationState(State):
    per_rank: ClassVar[bool] = True  # while the wrappers' reduction is off each rank accumulates its own gradients
    model: torch.nn.Module  # its parameters are read when saved: fsdp, applied later, replaces them in place
    steps: int
    micro: int = 0  # micro-batches since the last optimizer step
    divided: bool = False  # the gradients hold a loss it divided (since the last optimizer step)
    idle: bool = False  # the loop went around the run (accel/run/watch.py): it stands aside
    lrs: tuple = ()  # the learning rates at the last run.step() that held the update (none after run.load)
    lr_moved: bool = False  # they changed while this update was held
    moving: int = 0  # updates in a row held while they changed: 2 is a scheduler stepped every batch (said)

    def state_dict(self) -> dict[str, Any]:
        params = self.model.named_parameters() if self.micro else ()  # nothing held at an update's boundary
        return {"micro": self.micro, "grads": {n: p.grad.detach().clone() for n, p in params if p.grad is not None}}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Take the micro-step and the gradients held at it, each checked against its parameter first (a ValueError
        names every one that differs, nothing taken); all are made before any is set: never half a checkpoint's."""
        micro, grads = saved.get("micro"), saved.get("grads", {})
        if not isinstance(micro, int) or isinstance(micro, bool) or not 0 <= micro < self.steps:
            raise ValueError(f"micro-step {micro!r} does not fit steps={self.steps}")
        if not isinstance(grads, dict):
            raise ValueError(f"accumulated gradients are a {type(grads).__name__}, not gradients by parameter name")
        if grads and not micro:
            raise ValueError("gradients held at micro-step 0 (an update's boundary holds none): "
                             f"{sorted(map(str, grads))[:5]}")
        params = dict(self.model.named_parameters())
        problems = misfits(grads, params)
        if problems:
            raise ValueError("accumulated gradients do not fit the model: " + "; ".join(problems))
        taken = {name: grads[name].to(param.device).clone() for name, param in params.items() if name in grads}
        self.micro, self.divided = micro, micro > 0  # what it resumes holds losses it divided
        for name, param in params.items():
            param.grad = taken.get(name)


def misfits(grads: dict[str, Any], params: dict[str, torch.nn.Parameter]) -> list[str]:
    """What of held gradients does not fit the parameters they name: no such parameter, not a tensor, a tensor
    without data (meta), another shape, another dtype than the parameter's gradient takes (torch's ``grad_dtype``:
    a cast would change what the next update adds). The device is not compared: run.load reads every tensor to
    the CPU, and each gradient goes to its parameter's."""
    def some(found: list[str]) -> str:
        return "; ".join(found[:5]) + (" ..." if len(found) > 5 else "")

    unknown = sorted(str(n) for n in grads if n not in params)
    known = {n: (g, params[n]) for n, g in grads.items() if n in params}
    kinds = [f"{n} (a {type(g).__name__})" for n, (g, _) in known.items()
             if not isinstance(g, torch.Tensor)]
    known = {n: (g, p) for n, (g, p) in known.items() if isinstance(g, torch.Tensor)}
    empty = [f"{n} (a meta tensor)" for n, (g, _) in known.items() if g.device.type == "meta"]
    shapes = [f"{n} {tuple(g.shape)} vs {tuple(p.shape)}" for n, (g, p) in known.items() if g.shape != p.shape]
    dtypes = [f"{n} {g.dtype} vs {taken}" for n, (g, p) in known.items()
              if (taken := getattr(p, "grad_dtype", p.dtype)) is not None and g.dtype != taken]
    return ([f"the checkpoint's {unknown[:5]}{' ...' if len(unknown) > 5 else ''} are not in the model"]
            if unknown else []) + [f"{what}: {some(found)}" for what, found in (
                ("not tensors", kinds), ("without data", empty), ("shapes differ (checkpoint vs model)", shapes),
                ("dtypes differ (checkpoint vs model)", dtypes)) if found]


@register
class GradAccumulation(Accelerator[GradAccumulationOptions, GradAccumulationState],
                       StepSchedule[GradAccumulationState]):
    name = "grad_accumulation"
    stage = Stage.STEP
    requires = ("optimizer",)
    provides = (Capability.STEP_SCHEDULE,)
    keeps = Keeps("changed", note="one optimizer step every N batches, on the mean of their gradients")

    def decide(self, ctx: Context) -> None:
        if self.config.steps == 1:
            raise Skip("steps=1: every batch steps the optimizer; give steps >= 2 to accumulate")
        ctx.decide("accumulation_steps", self.config.steps, "asked for")

    def apply(self, ctx: Context) -> GradAccumulationState:
        steps = self.config.steps
        return GradAccumulationState(ctx.model, steps, changes={
            "steps": steps, "loss": f"divided by {steps} before backward",
            "optimizer": f"steps once every {steps} run.step() calls; run.step() returns True in between",
            "gradient_sync": "off for the forward and backward of the first N-1 micro-batches (DDP, FSDP), "
                             "whatever the loop enters"},
            relies_on={"backward": f"division of the loss by {steps}",
                       "step": f"holding of the optimizer step for {steps} batches",
                       "batch": "counting of batches (one per run.step())"})

    def accumulating(self, state: GradAccumulationState) -> bool:
        return state.micro + 1 < state.steps and not state.idle

    def bypassed(self, run: Run, state: GradAccumulationState, call: Call) -> str:
        """Half-done accumulation would train something else than either loop: it stands aside, and gradients it
        divided by N are multiplied back (exactly for N a power of two, else to float rounding), those a wrapper
        holds unreduced (FSDP2 while accumulating) as well as the .grad tensors."""
        steps = self.config.steps
        state.idle, multiplied = True, state.divided
        if multiplied:
            grads = [*run.held_gradients(), *(p.grad for p in run.unwrap().parameters() if p.grad is not None)]
            for grad in {id(g): g for g in grads}.values():  # each once, whoever names it
                grad.mul_(steps)
        state.micro, state.divided = 0, False
        return ("idle from here on: it divides no loss and holds no step, your loop's own updates train"
                + (f" (the gradients it had divided were multiplied back by {steps})" if multiplied else "")
                + ("; let it hold the step, or drop it from the plan and keep your own "
                   "accumulation" if call == "batch" else ""))

    def backward(self, run: Run, state: GradAccumulationState, loss: torch.Tensor,
                 proceed: Callable[[torch.Tensor], None]) -> None:
        state.divided = not state.idle
        proceed(loss / self.config.steps if state.divided else loss)

    def step(self, run: Run, state: GradAccumulationState, optimizer: torch.optim.Optimizer,
             proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        if state.idle:
            return proceed(optimizer)
        lrs = tuple(lr if not isinstance(lr, torch.Tensor) else float(lr) if lr.device.type == "cpu" else id(lr)
                    for lr in (group.get("lr") for group in optimizer.param_groups))  # (reading a device's: a sync)
        state.lr_moved |= bool(state.micro and state.lrs and lrs != state.lrs)  # (an epoch's scheduler: once)
        state.micro += 1
        if state.micro < self.config.steps:
            state.lrs = lrs
            return False  # keep accumulating: no update, gradients kept
        state.moving, state.lr_moved = state.moving + 1 if state.lr_moved else 0, False
        if state.moving == 2:
            warnings.warn("accel: grad_accumulation: the learning rate changed between run.step() calls that held the "
                          "update (a scheduler stepped on every batch): the schedule runs once per batch, "
                          f"{self.config.steps} times per update; step it when run.step() returns False",
                          LoopWarning, stacklevel=loops_level())
        state.micro, state.divided = 0, False
        return proceed(optimizer)
