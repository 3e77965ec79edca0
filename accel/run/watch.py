"""Noticing the calls that go around the run (the loop's own ``optimizer.step()``, ``loss.backward()``, accumulation
or loader) and a ``run.step()`` with no backward since the last one. When the loop goes around a call an
accelerator's work goes through (``State.relies_on``), the run names it once (a ``BypassWarning``, its row "idle")
and it puts its half-done work right (``Accelerator.bypassed``). Nothing is watched where none relies on a call."""
from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any

from accel.errors import BypassWarning, LoopWarning, loops_level
from accel.plan.contract import Capability

# what the loop did, what to call instead, and the call whose work it goes around (see State.relies_on)
WENT_AROUND = {
    "backward": ("the loop called loss.backward() itself, not run.backward(loss)", "call run.backward(loss)",
                 "backward"),
    "step": ("the loop called optimizer.step() itself, not run.step()",
             "call run.step() once per batch (it steps the optimizer and zeroes the gradients)", "step"),
    "batch": ("the loop called run.backward() on a second batch of run.loader before run.step(): it accumulates "
              "gradients itself",
              "call run.step() after every batch", "batch"),
    "closure": ("the loop stepped a closure optimizer itself (optimizer.step(closure), as LBFGS needs), which "
                "run.step() cannot take", "drop it from the plan for a closure optimizer", "step"),
    "zero_grad": ("the loop zeroed the gradients held between run.step() and the next run.backward() "
                  "(optimizer.zero_grad() each batch), throwing away what accumulates across run.step() calls",
                  "drop your optimizer.zero_grad(): run.step() zeroes the gradients after each optimizer step",
                  "batch"),
}


class Watch:
    """The run's calls counted since the last optimizer step, and who relies on them. Where any relies on one, a
    pre-step hook on each optimizer the loop may step (the run's and the user's), removed by run.close()."""

    def __init__(self, run: Any, journal: Any, user_optimizer: Any):
        self.relying = {went: [a for a in run.accelerators if call in run.states[a.name].relies_on]
                        for went, (_, _, call) in WENT_AROUND.items()}
        self.backwards = 0  # run.backward() calls since the last optimizer step
        self.stepping = False  # inside run.step(): the optimizer step is the run's own
        self.drawn = 0  # batches of run.loader so far: where the loop iterates it, batch_drawn() tells for sure
        self.fresh = False  # a batch was drawn since the last run.backward()
        self.noticed: set[str] = set()  # the calls said (and "nothing", "several backwards", "loader"): each once
        self.idle: set[str] = set()  # accelerators already named: each says it once, whatever the loop goes around next
        self.held: list | None = None  # the gradients a run.step() left to accumulate on: (param, grad, version)
        if not self.needed:
            return
        hook = functools.partial(self._optimizer_steps, weakref.ref(run))  # your optimizer must not keep a run alive
        for optimizer in {id(o): o for o in (run.optimizer, user_optimizer) if o is not None}.values():
            journal.hook(f"accel watches {type(optimizer).__name__}.step() for steps that bypass run.step()",
                         lambda o=optimizer: o.register_step_pre_hook(hook))
        if run.loader is not None:
            run.loader.drawn = self.batch_drawn

    @property
    def needed(self) -> bool:
        return any(self.relying.values())

    def _optimizer_steps(self, ref: weakref.ref, optimizer: Any, args: Any, kwargs: Any) -> None:
        run = ref()
        if self.stepping or run is None or run.closed:  # a run dropped without close(): its hook stays, idle
            return
        # nothing went through run.backward() for this update either: the loop's own backward (a closure optimizer
        # computes them in its step, after this hook)
        closure = len(args) > 1 or kwargs.get("closure") is not None  # (args: the optimizer, then step's)
        self.notice(run, ["closure"] if closure else ["step"] if self.backwards else ["backward", "step"])
        self.backwards = 0

    def before_backward(self, run: Any) -> None:
        """A second backward before run.step(), on a batch drawn since the first: the loop accumulates itself (one
        that draws its next batch before run.step() draws it after its backward, and is not taken for it)."""
        self.check_loader(run)
        if self.held is not None and not self.unchanged():
            self.notice(run, ["zero_grad"])
        self.held = None
        if self.backwards and self.fresh:
            self.notice(run, ["batch"])
        self.fresh = False
        if self.backwards and self.relying["batch"] and not self.drawn and "several backwards" not in self.noticed:
            self.noticed.add("several backwards")  # a GAN's two losses, or the loop's own accumulation
            for accelerator in self.relying["batch"]:
                self.say(run, accelerator, f"run.backward() was called {self.backwards + 1} times before run.step(): "
                         "fine for one batch with several losses (a GAN's real and fake); if your loop accumulates "
                         f"gradients itself, {accelerator.name} accumulates on top of it (iterate run.loader and "
                         "accel notices it)", idle=False)
        self.backwards += 1

    def before_step(self, run: Any) -> None:
        """At run.step() with no run.backward() since the last: gradients the last run.step() did not leave came from
        the loop's own backward; without them the optimizer has nothing new to step on (said once)."""
        self.check_loader(run)
        if not self.backwards:
            held = self.held is not None and self.unchanged()
            if not held and any(p.grad is not None for group in run.optimizer.param_groups for p in group["params"]):
                if self.relying["backward"] and "backward" not in self.noticed:
                    self.notice(run, ["backward"])
            elif "nothing" not in self.noticed:
                self.noticed.add("nothing")
                what = ("this batch added nothing to the gradients held for accumulation (it counts as one of its "
                        "batches)" if held else "no gradients: the optimizer had nothing to step on, so the weights "
                        "did not change")
                warnings.warn(f"accel: run.step() was called with no run.backward() since the last run.step() and "
                              f"{what}; call run.backward(loss) before run.step()", LoopWarning,
                              stacklevel=loops_level())
        self.backwards = 0
        self.held = None

    def after_step(self, stepped: bool, optimizer: Any) -> None:
        """A run.step() that did not update (a step schedule holds it) leaves gradients to accumulate on: noted, to
        tell the loop's zero_grad or own backward from them."""
        if self.needed and not stepped:
            self.held = [(p, p.grad, p.grad._version) for group in optimizer.param_groups for p in group["params"]
                         if p.grad is not None] or None

    def unchanged(self) -> bool:
        """The gradients are those the last run.step() left: no backward and no zero_grad since."""
        return all(p.grad is grad and grad._version == version for p, grad, version in self.held)

    def check_loader(self, run: Any) -> None:
        """At the first backward or step: where the plan changed the batches (a rebuilt loader, each rank's shard,
        the move to the device), a loop that has not iterated run.loader took its batch elsewhere: said once."""
        if "loader" in self.noticed:
            return
        self.noticed.add("loader")
        loader = run.loader
        if loader is None or loader.epoch or not (loader.rebuilt or loader.transforms or loader.device.type != "cpu"):
            return
        text = ("the loop never iterated run.loader (its batches came from elsewhere: the loader you gave "
                "accelerate()?), so they did not go through {}; iterate run.loader")
        changing = [a for a in run.accelerators if {Capability.DATA_LOADER, Capability.DATA_SHARD} & set(a.provides)]
        for accelerator in changing:
            self.say(run, accelerator, text.format(f"what {accelerator.name} changed in run.loader"), idle=False)
        if not changing:
            warnings.warn("accel: " + text.format(f"the move to {loader.device}"), BypassWarning,
                          stacklevel=loops_level())

    def batch_drawn(self) -> None:
        """A batch of run.loader (see before_backward)."""
        self.drawn += 1
        self.fresh = True

    def notice(self, run: Any, calls: list[str]) -> None:
        """Once per call: each accelerator relying on one of them says what it does now, in its row and a warning."""
        calls = [c for c in calls if c not in self.noticed]
        self.noticed.update(calls)
        for accelerator in {id(a): a for c in calls for a in self.relying[c] if a.name not in self.idle}.values():
            self.idle.add(accelerator.name)
            mine = [c for c in calls if accelerator in self.relying[c]]
            did = "; ".join(WENT_AROUND[c][0] for c in mine)
            state = run.states[accelerator.name]
            missed = " and ".join(state.relies_on[WENT_AROUND[c][2]] for c in mine)
            fix = "; ".join(WENT_AROUND[c][1] for c in mine)
            now = accelerator.bypassed(run, state, WENT_AROUND[mine[-1]][2])
            run._sync(release=True)  # a schedule that stood aside accumulates no more
            self.say(run, accelerator, f"bypassed: {did}, so its {missed} did not happen; {now}; {fix}")

    def say(self, run: Any, accelerator: Any, text: str, idle: bool = True) -> None:
        """Into the accelerator's row, and a warning pointing at the loop's line."""
        row = run.report.row(accelerator.name)
        if idle:
            row.status, row.reason = "idle", text
        else:
            row.warnings.append(text)
        warnings.warn(f"accel: {accelerator.name}: {text}", BypassWarning, stacklevel=loops_level())
