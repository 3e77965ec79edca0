"""Who gives a loss that is not finite in plan="auto"'s turns: the plan whose turn it was, or the plain loop too.

Why: a NaN loss at step 20 that the plain loop also gives (a NaN in the data, labels that make the loss inf, weights
already gone) once dropped the arm whose turn it was as "loss off". Before an arm pays for a fault, the model's
forward on that step's inputs is replayed under the plain loop (the search switches to it first): without grad, in
the mode the loop had it in (no eval(): a BatchNorm keeps using the batch's statistics), with torch's RNG as it was at
that forward (dropout draws the same mask), and with every parameter, buffer (BatchNorm's running statistics) and
the RNG put back afterwards, so nothing the training holds changes. Your own forward hooks do see that one extra
forward. The verdict:

- the plain forward is not finite either, or the weights were not: the data's (or the model's) fault, no arm pays;
- the plain forward is finite and the plan's was not: the plan's fault, its arm is dropped ("loss off");
- both finite and the same: what is not finite is the loss your code computes from that output and the batch (its
  targets): the data's or the loop's fault, no arm pays; both finite but different: the plan's, as it cannot be
  cleared.

What it needs is the model's training forwards of the step: a forward pre-hook and hook on your model record their
inputs and outputs (references, no copies) while the search measures, removed when it settles or closes.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

MAX_CALLS = 4  # training forwards kept per step (the last ones: a loop's extra forwards before them are dropped)


@dataclass
class Call:
    """One training forward of your model: its inputs, the CPU RNG state it drew from, and its output."""

    args: tuple
    kwargs: dict
    rng: torch.Tensor
    output: Any = None


class Capture:
    """The training forwards of your model since the last backward: what a fault is replayed on. The hooks are
    closures (a deepcopy of your model, an EMA's, shares them and is ignored: only your model's forwards count)."""

    def __init__(self, model: torch.nn.Module):
        self.calls: list[Call] = []
        self.paused, self.removed, self.handles = False, False, []
        ref = weakref.ref(self)

        def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            capture = ref()
            if capture is None or capture.paused or module is not model or not torch.is_grad_enabled():
                return  # a validation pass (no grad) is not a step's forward
            capture.calls = capture.calls[-(MAX_CALLS - 1):] + [Call(args, kwargs, torch.get_rng_state())]

        def after(module: torch.nn.Module, args: tuple, output: Any) -> None:
            capture = ref()
            if capture is not None and not capture.paused and module is model and torch.is_grad_enabled() \
                    and capture.calls and capture.calls[-1].output is None:
                capture.calls[-1].output = tree_map(
                    lambda t: t.detach() if isinstance(t, torch.Tensor) else t, output)  # no graph kept

        self.model, self.hooks = model, (before, after)
        self.attach()

    def attach(self) -> None:
        """(Again) the last of the model's hooks, after a switch: the output kept is the one a plan's own forward
        hooks made, as your loss saw it."""
        if self.removed:
            return
        for handle in self.handles:
            handle.remove()
        before, after = self.hooks
        self.handles = [self.model.register_forward_pre_hook(before, with_kwargs=True),
                        self.model.register_forward_hook(after)]

    def take(self) -> list[Call]:
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles, self.calls, self.removed = [], [], True


@dataclass
class Fault:
    """A loss that was not finite: at which step, under which arm, on which forwards, and the model's state then
    (None: as it is when it is judged, on an accelerator where checking every step would wait for the device)."""

    step: int
    arm: str
    calls: list[Call]
    state: dict[str, torch.Tensor] | None = None


@dataclass
class Blame:
    """The verdict on a fault: ``plan`` True when the arm gives it and the plain loop does not; the words say who."""

    plan: bool
    who: str  # "the plan", "the data", "the model", "the data or the loop"
    words: str
    step: int = 0
    arm: str = ""
    also: list[int] = field(default_factory=list)  # later steps with the same fault (said once)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the model's parameters and buffers: the state a fault is judged in, kept before the step updates it."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()
            if isinstance(value, torch.Tensor)}


def _plain_precision(model: torch.nn.Module) -> contextlib.ExitStack:
    """No autocast, whatever context the loop calls run.step() in: the plain loop's forward is in full precision."""
    stack = contextlib.ExitStack()
    kinds = {"cpu"} | {p.device.type for p in model.parameters()}
    for kind in kinds:
        try:
            stack.enter_context(torch.autocast(device_type=kind, enabled=False))
        except RuntimeError:  # a device type autocast does not know: nothing to switch off
            pass
    return stack


def _finite(value: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tree_leaves(value)
               if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()))


def _same(a: Any, b: Any, tolerance: float) -> bool:
    left = [t for t in tree_leaves(a) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    right = [t for t in tree_leaves(b) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not left or len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if x.shape != y.shape:
            return False
        x, y = x.detach().float(), y.detach().float().to(x.device)
        if float((x - y).abs().max()) > tolerance * max(float(y.abs().max()), 1e-6):
            return False
    return True


def replay(model: torch.nn.Module, calls: list[Call], state: dict[str, torch.Tensor] | None,
           capture: Capture | None = None) -> list[Any]:
    """The model's outputs on these forwards' inputs, run as it is now (the plain loop's), in the state given, with
    nothing it holds changed: parameters, buffers and torch's RNG are put back however it ends."""
    kept, rng = snapshot(model), torch.get_rng_state()
    if capture is not None:
        capture.paused = True
    try:
        with torch.no_grad(), _plain_precision(model):
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


def blame(model: torch.nn.Module, fault: Fault, tolerance: float, capture: Capture | None = None) -> Blame:
    """Judge a fault under the plain loop (the search has switched to it): see the module's docstring."""
    at, turn = f"at step {fault.step}", f"({fault.arm}'s turn)"

    def said(plan: bool, who: str, words: str) -> Blame:
        return Blame(plan, who, words, fault.step, fault.arm)

    # on an accelerator the weights are those at the chunk's end: not finite, the arm's own step may have made them so
    if fault.state is None and not _finite(list(snapshot(model).values())):
        return said(True, "the plan", f"a loss was not finite {at} under it, and by the chunk's end your model's "
                                      "weights were not finite either, so it could not be cleared (on an accelerator "
                                      "the weights are not copied before each step)")
    state = fault.state if fault.state is not None else snapshot(model)
    if not _finite(list(state.values())):
        return said(False, "the model", f"a loss was not finite {at} {turn}, and your model's weights or buffers were "
                                        "already not finite: the plain loop gives it too")
    if not fault.calls:
        return said(True, "the plan", f"a loss was not finite {at} under it (no forward of your model was seen to "
                                      "replay under the plain loop, so it could not be cleared)")
    plain = replay(model, fault.calls, fault.state, capture)
    if not _finite(plain):
        inputs = "" if _finite([(c.args, c.kwargs) for c in fault.calls]) else ": the batch holds NaN or inf"
        return said(False, "the data", f"a loss was not finite {at} {turn}, and the plain loop's forward on that batch "
                                       f"is not finite either (the data{inputs})")
    planned = [c.output for c in fault.calls]
    if any(o is None for o in planned):
        return said(True, "the plan", f"a loss was not finite {at} under it; the plain loop's forward on that batch is "
                                      "finite, and its own output was not seen, so it could not be cleared")
    if not _finite(planned):
        return said(True, "the plan", f"a loss was not finite {at} under it: your model's output on that batch was "
                                      "not finite under it, and is under the plain loop")
    if _same(planned, plain, tolerance):
        return said(False, "the data or the loop",
                    f"a loss was not finite {at} {turn}, though your model's output on that batch is finite and the "
                    "same under the plain loop: the loss your code computes from it and the batch (its targets) is "
                    "not finite, whichever plan runs (the data or the loop)")
    return said(True, "the plan", f"a loss was not finite {at} under it; your model's output on that batch is finite "
                                  "under it and the plain loop, but not the same, so it could not be cleared")


def summary(blames: list[Blame]) -> list[str]:
    """One line per fault no arm paid for (the plan's are said in their arm's reason), later repeats counted."""
    lines = []
    for b in blames:
        more = f" (again at {len(b.also)} later step(s))" if b.also else ""
        lines.append(f"{b.who}'s fault, no arm dropped: {b.words}{more}")
    return lines


def record(blames: list[Blame], new: Blame) -> None:
    """Keep the first fault of each kind with its words; a later one of the same kind is counted, not repeated."""
    for b in blames:
        if b.who == new.who:
            b.also.append(new.step)
            return
    blames.append(new)


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C (SIGINT) held while the search changes what training and the process hold (a plan switch, a replay,
    closing), and delivered once it is whole: cut half-way, neither plan's journal would be whole for close() to put
    back (a Ctrl-C while compile's candidate switched in left its environment variables set). Only the main thread
    receives signals; elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])  # Python's own handler raises KeyboardInterrupt here

