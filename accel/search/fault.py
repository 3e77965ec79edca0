"""Who gives a loss that is not finite while plan="auto" measures: the candidate in place, or the plain loop too.

The step's forwards (kept by hooks on your model: references, no copies) are replayed under the plain loop, without
grad, in the model's mode, with torch's RNG as it was, everything put back after (docs/measurement.md): not finite
there either, or the weights were not, is the data's (or the model's) fault; finite there and not under the plan,
or finite but different, the plan's; the same output, the loss your code computes from it (the data or the loop).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from accel import clock
from accel.optim import optimizer_moment, set_optimizer_moment
from accel.run.interrupts import deferred

MAX_CALLS = 4  # training forwards kept per step (the last ones: a loop's extra forwards before them are dropped)


@dataclass
class Call:
    """One training forward of your model: its inputs, the CPU RNG state it drew from, and its output."""

    args: tuple
    kwargs: dict
    rng: torch.Tensor
    output: Any = None


@dataclass
class Fault:
    """A loss that was not finite: the step, the plan in place, its forwards, and the model's state then (None: as
    it is when judged, on an accelerator)."""

    step: int
    plan: str
    calls: list[Call]
    state: dict[str, torch.Tensor] | None = None
    optimizer: dict | None = None  # your optimizer's state and groups then (optimizer_moment; None: not undone)


@dataclass
class Blame:
    """The verdict on a fault: ``plan`` True when the plan gives it and the plain loop does not."""

    plan: bool
    who: str  # "the plan", "the data", "the model", "the data or the loop"
    words: str
    step: int = 0
    also: list[int] = field(default_factory=list)  # later steps with the same fault (said once)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def finite(value: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tree_leaves(value)
               if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()))


def _same(a: Any, b: Any, tolerance: float) -> bool:
    left, right = ([t for t in tree_leaves(x) if isinstance(t, torch.Tensor) and t.is_floating_point()] for x in (a, b))
    return bool(left) and len(left) == len(right) and all(
        x.shape == y.shape and float((x.float() - y.float().to(x.device)).abs().max())
        <= tolerance * max(float(y.float().abs().max()), 1e-6) for x, y in zip(left, right))


def replay(model: torch.nn.Module, calls: list[Call], state: dict | None, capture: Faults | None = None) -> list:
    """The model's outputs on these forwards' inputs under the plain loop, in the state given, in full precision;
    parameters, buffers and torch's RNG are put back however it ends."""
    kept, rng = snapshot(model), torch.get_rng_state()
    if capture is not None:
        capture.paused = True
    try:
        with torch.no_grad(), contextlib.ExitStack() as precision:
            for kind in {"cpu"} | {p.device.type for p in model.parameters()}:
                with contextlib.suppress(RuntimeError):  # a device type autocast does not know
                    precision.enter_context(torch.autocast(device_type=kind, enabled=False))
            if state is not None:
                model.load_state_dict(state, strict=False)
            outputs = []
            for call in calls:
                torch.set_rng_state(call.rng)
                outputs.append(model(*call.args, **call.kwargs))
            return outputs
    finally:
        with torch.no_grad():
            model.load_state_dict(kept, strict=False)
        torch.set_rng_state(rng)
        if capture is not None:
            capture.paused = False


def blame(model: torch.nn.Module, fault: Fault, tolerance: float, capture: Faults | None = None) -> Blame:
    """Judge a fault under the plain loop (the search has switched to it)."""
    at, during = f"at step {fault.step}", f"at step {fault.step} ({fault.plan} in place)"

    def said(plan: bool, who: str, words: str) -> Blame:
        return Blame(plan, who, f"a loss was not finite {words}", fault.step)

    if fault.state is None and not finite(model.state_dict()):  # its own step may have made them so
        return said(True, "the plan", f"{at} under it, and by the chunk's end your model's weights were not finite "
                                      "either, so it could not be cleared (on an accelerator they are not copied)")
    if not finite(fault.state or model.state_dict()):
        return said(False, "the model", f"{during}, and your model's weights or buffers were already not finite: "
                                         "the plain loop gives it too")
    if not fault.calls:
        return said(True, "the plan", f"{at} under it (no forward of your model was seen to replay under the plain "
                                      "loop, so it could not be cleared)")
    plain = replay(model, fault.calls, fault.state, capture)
    if not finite(plain):
        data = "" if finite([(c.args, c.kwargs) for c in fault.calls]) else ": the batch holds NaN or inf"
        return said(False, "the data", f"{during}, and the plain loop's forward on that batch is not finite either "
                                       f"(the data{data})")
    planned = [c.output for c in fault.calls]
    if any(o is None for o in planned) or not finite(planned):
        return said(True, "the plan", f"{at} under it: your model's output on that batch was not finite under it (or "
                                      "not seen), and is finite under the plain loop")
    if _same(planned, plain, tolerance):
        return said(False, "the data or the loop", f"{during}, though your model's output on that batch is finite "
                    "and the same under the plain loop: the loss your code computes from it and the batch (its "
                    "targets) is not finite, whichever plan runs (the data or the loop)")
    return said(True, "the plan", f"{at} under it; your model's output on that batch is finite under it and the "
                                  "plain loop, but not the same, so it could not be cleared")


class Faults:
    """The losses of the measured steps, checked: on a CPU at each step before its update (judged in the weights it
    happened in), on an accelerator at the chunk's end, with your model's forwards with grad since the last backward,
    kept by hooks (a deepcopy of it, an EMA's, shares the hooks and is ignored). ``blames``: the faults no plan paid
    for, each kind once."""

    def __init__(self, model: torch.nn.Module, tolerance: float, optimizer: torch.optim.Optimizer | None = None):
        """``optimizer``: yours, to put back with the weights when a plan's own NaN step is undone (a single process:
        with several ranks one rank's undoing would leave the replicas apart)."""
        self.model, self.tolerance, self.paused, self.removed, self.handles = model, tolerance, False, False, []
        self.optimizer = optimizer
        self.forwards, self.losses, self.calls, self.record, self.blames = [], [], [], [], []
        self.fault: Fault | None = None  # this chunk's first loss that was not finite, judged at its end
        ref = weakref.ref(self)

        def before(module, args, kwargs):
            own = ref()
            if own is not None and not own.paused and module is model and torch.is_grad_enabled():
                own.forwards = own.forwards[-(MAX_CALLS - 1):] + [Call(args, kwargs, torch.get_rng_state())]

        def after(module, args, output):
            own = ref()
            if own is not None and not own.paused and module is model and torch.is_grad_enabled() \
                    and own.forwards and own.forwards[-1].output is None:
                own.forwards[-1].output = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, output)

        self.hooks = (before, after)
        self.attach()

    def attach(self) -> None:
        """(Again) the last of your model's hooks, after a switch: the output kept is the one your loss saw."""
        if not self.removed:
            for handle in self.handles:
                handle.remove()
            self.handles = [self.model.register_forward_pre_hook(self.hooks[0], with_kwargs=True),
                            self.model.register_forward_hook(self.hooks[1])]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.forwards, self.removed = [], [], True

    def backward(self, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach())
        self.calls, self.forwards = self.calls + self.forwards, []

    def before_update(self, step: int, plan: str, on_cpu: bool, copy: bool) -> float:
        """Check this step's losses; the seconds a copy of the weights took (not the plan's: the chunk skips them)."""
        losses, calls, self.losses, self.calls = self.losses, self.calls, [], []
        if self.fault is not None or not losses:
            return 0.0
        if not on_cpu:
            self.record.append((step, losses, calls))
        elif not finite(losses):
            began = clock.now()
            kept = optimizer_moment(self.optimizer) if copy and self.optimizer is not None else None
            self.fault = Fault(step, plan, calls, snapshot(self.model) if copy else None, kept)
            return clock.now() - began
        return 0.0

    def chunk_fault(self, plan: str) -> Fault | None:
        """The chunk's fault (a CPU step's, or on an accelerator its first step not finite); the record is cleared."""
        fault, record, self.fault, self.record = self.fault, self.record, None, []
        return fault or next((Fault(step, plan, calls) for step, losses, calls in record if not finite(losses)), None)

    def judge(self, fault: Fault, plain: bool) -> Blame:
        """Whose fault: the plan's, or the plain loop's too (replayed under it: the plain loop is in place)."""
        if plain:
            blamed = Blame(False, "the data or the loop", f"a loss was not finite at step {fault.step} under the "
                                                          "plain loop itself", fault.step)
        else:
            with deferred():  # the replay puts your model's weights back: never half-way
                blamed = blame(self.model, fault, self.tolerance, self)
                if blamed.plan and fault.state is not None and fault.optimizer is not None:  # its NaN step trained
                    with torch.no_grad():  # your weights and optimizer on: undone, as the plain loop never took it
                        self.model.load_state_dict(fault.state, strict=False)
                    set_optimizer_moment(self.optimizer, fault.optimizer)
                    for p in self.model.parameters():  # gradients a step schedule holds have its NaN in them
                        p.grad = None
                    blamed.words += (f"; your model's weights and your optimizer's state are put back as they were "
                                     f"before step {fault.step} (the steps since under it are undone, the gradients "
                                     "held dropped)")
        if not blamed.plan:
            same = next((b for b in self.blames if b.who == blamed.who), None)
            same.also.append(blamed.step) if same is not None else self.blames.append(blamed)
        return blamed


def summary(blames: list[Blame]) -> list[str]:
    """One line per fault no plan paid for (a plan's own is said in its candidate's reason)."""
    return [f"{b.who}'s fault, nothing dropped: {b.words}" + (f" (again at {len(b.also)} later step(s))" if b.also
                                                             else "") for b in blames]
