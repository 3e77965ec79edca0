"""plan="auto" in your loop: the first steps of the real training are the measurement.

    run = accel.accelerate(model, optimizer, loader, plan="auto")
    for x, y in run.loader:                       # your loop, unchanged
        ...; run.backward(loss); run.step()

Arms (arms.py: the plain loop, the stack of every candidate that can be switched between steps, and that stack
without each member) take turns in chunks of your steps (turns.py). Each round gives every arm a ratio to the
plain loop measured beside it (accel.measure.Ratio). An arm confidently slower than the best is dropped, and so
is one confidently no faster than the plain loop by the margin (it could never be kept); one that cannot be told
from the best within the margin is dropped when it holds more accelerators (verdicts.py, the verdicts tune()
reaches too). The search settles when one arm is left against the plain loop and faster than it, when none is
left, or when the budget is spent; it keeps the best arm only when it is faster than the plain loop with 95%
confidence (settle.py). compile comes last, on top of the winner, if its warm-up fits what is left of the budget
(compilelast.py). A rebuilt loader cannot change mid-epoch: it is decided by how long your loop waits for data, and
joins at the next epoch. A loss that is not finite drops an arm only when the plain loop does not give it too on
that batch (loopfaults.py, fault.py); the report says what auto has done so far at every moment (searchstate.py).

Nothing is copied: every step is a real step of your model and optimizer. A switch is accelerate() on your
objects (switch.py: the earlier plan undone, its counters and state handed over), so each plan keeps its card.
The TuningRun is an accel.Run: every method and property of Run is its own, answered by the run of the plan in
place (``run.current``); none is forwarded by name.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from accel import clock
from accel.search.arms import Arm, Candidates, apart_arms, starting_arms
from accel.search.compilelast import CompileLast
from accel.search.config import BUDGET_STEPS, MIN_BUDGET_S, Settings
from accel.search.fault import Blame, Capture, Fault
from accel.search.loopfaults import FaultWatch
from accel.search.ranks import DISTRIBUTING, in_step
from accel.search.results import TuneResult
from accel.search.search import for_device, generate_candidates
from accel.search.searchstate import SearchState
from accel.search.settle import DATA_WAIT, Settling  # noqa: F401  (inloop.DATA_WAIT, as before)
from accel.search.switch import States, Switching, TuningLoader
from accel.search.turns import MAX_ROUNDS, MIN_ROUNDS, Chunk, Recheck, TurnTaking  # noqa: F401  (inloop.MIN_ROUNDS)
from accel.run.checkpoint import saved_plan
from accel.run.context import placement
from accel.api import accelerate
from accel.errors import BypassWarning, MeasureError, PlanError
from accel.hardware import probe
from accel.measure import chunk_steps, plan_label
from accel.plan import Plan
from accel.run import Run
from accel.run.sharded_checkpoint import is_sharded_checkpoint

CHUNK_S = 0.5  # a chunk's timed steps take about this long (accel.measure.CHUNK_S; tests shorten it here)
EXPECTED_SHARE = 0.3  # with expected_steps, the measurement spends at most this share of the plain run's time (its
# steps are training steps, most of them faster than the plain loop's: what it costs is their gap to the best)


class TuningRun(TurnTaking, FaultWatch, Switching, CompileLast, Settling, Run):
    """What plan="auto" returns: a Run whose plan changes between chunks of your steps until the search settles.

    Use it as any run: run.model, run.optimizer, run.loader, run.autocast(), run.backward(), run.step(),
    run.report (its `search` says what auto has done so far, at every moment; its `tuning` has the search's table and
    why once it settled). Read run.model inside the loop, not once before it: compile, when it wins, wraps it.
    """

    def __init__(self, settings: Settings, model, optimizer, loader, device: Any = "auto"):  # no Run.__init__: the
        if optimizer is None or loader is None:  # run of the plan in place (self.current) is the one made
            missing = " and ".join(what for what, given in (("an optimizer", optimizer), ("a loader", loader))
                                   if given is None)
            raise MeasureError(
                f"plan='auto' measures your training steps: it needs {missing}. A model with no loader of its own (a "
                "GAN's generator) can be given the loader that paces its steps (the discriminator's): its turns are "
                "timed between your run.step() calls; or give it a plan (docs/two_models.md)")
        self.settings = settings
        self.started = clock.now()
        self._objects = (model, optimizer, loader)
        hardware, problems = probe(), []
        decided = placement(device, hardware, problems)
        if decided is None:
            raise PlanError(problems)
        self.device = decided.device
        self.hardware = for_device(hardware, self.device)
        self.notes: list[str] = []
        self.launch = decided.launch
        self.distributed, self.hold, self.ranks = in_step(decided.launch, model, optimizer, self.device, settings,
                                                          self.notes)
        self.given = [Plan(c).to_dict() for c in settings.candidates] if settings.candidates is not None else None
        kinds = Candidates.of([c for c in (self.given if self.given is not None else generate_candidates(
            self.hardware, model, optimizer, loader, settings.accelerators)) if not c.keys() & DISTRIBUTING])
        self.costly, self.epochwise = kinds.costly, kinds.epochwise
        self.arms = starting_arms(kinds.stepwise, self.given is not None, self.notes)
        self.plain = self.arms[0]
        self.phase = "measuring" if len(self.arms) > 1 or self.costly or self.epochwise else "settled"
        self.arms += apart_arms(kinds.apart)
        self.round, self.order, self.turn, self.phase_start = 0, [], 0, 0
        self.chunk_steps = 2  # timed steps per chunk, paced after the plain loop's first chunk
        self.switched_at = clock.now()
        self.chunk = Chunk(started=self.switched_at, last_end=self.switched_at)  # the turn in progress
        self.data_wait_s = 0.0
        self.loader_read = False  # whether the loop iterated run.loader (it may read another run's: a GAN's generator)
        self.plain_wait = [0.0, 0.0]  # data wait and time of the plain loop's timed steps
        self.deadline = self.started + (settings.budget_s if settings.budget_s is not None else MIN_BUDGET_S)
        self.losses: list[torch.Tensor] = []
        self.pending: dict[str, dict] | None = None  # the plan to take at the next epoch (a rebuilt loader)
        self.compile_arm: Arm | None = None
        self.compile_base: Arm | None = None
        self.compile_warm = False  # whether compile's turn was expected to start warm (its warm-up kept apart)
        self.winner: Arm | None = None
        self.settle_how = ""  # how it ended: "settled", "budget", "rounds", "resumed from ..." ("" until it does)
        self.result: TuneResult | None = None
        self.cache_key: dict | None = None
        self.switch_s = 0.0
        self.saved: dict[str, dict] = {}  # accelerator name -> its saved state when its arm last stepped aside
        self.measured_s: float | None = None  # from accelerate() to the settled plan
        self.turn_began = self.started  # when the last chunk began
        self.active = self.plain
        self.blames: list[Blame] = []  # faults no arm paid for (the data's, the loop's): said in the notes
        self.fault: Fault | None = None  # this chunk's first loss that was not finite, judged at its end
        self.recheck: Recheck | None = None  # an arm the stop rule caught, waiting for its reference timed again
        self.step_losses: list[torch.Tensor] = []  # this step's losses, and your model's forwards that gave them
        self.step_calls: list = []
        self.current: Run = accelerate(model, optimizer, loader, plan=dict(self.distributed), device=device)
        self.search = SearchState(since_step=self.current.steps)  # what the report says auto has done, kept current
        self.current.report.search = self.search
        self.capture = Capture(model)  # your model's training forwards: what a fault is replayed on
        self.loader = TuningLoader(self)
        self.stepping, self.bypassed = False, False  # the search times steps between run.step() calls
        mine = weakref.WeakMethod(self._optimizer_steps)  # the user's optimizer must not keep a dropped search alive
        self.watching = optimizer.register_step_pre_hook(lambda *args: mine() and mine()(*args))
        self.settled_at: int | None = None
        if self.phase == "settled":
            self.settle_how = "settled"
            self._finish("nothing to measure: no accelerator offers a candidate for this model on this hardware")
        else:
            self._next_round()

    # --- what the loop calls: the search's own ---------------------------------------------------------------

    def backward(self, loss: torch.Tensor) -> None:
        if self.phase != "settled":
            self.losses.append(loss.detach())
            self.step_losses.append(loss.detach())
            self.step_calls += self.capture.take()
        self.current.backward(loss)

    def step(self) -> bool:
        if self.phase != "settled":
            self._check_step()
        self.stepping = True
        try:
            skipped = self.current.step()
        finally:
            self.stepping = False
        if self.phase != "settled":
            self.search.step = self.steps
            self._after_step()
        return skipped

    def close(self) -> None:
        """Close the run; before auto settled, the report says so: nothing chosen, nothing cached, what it learned."""
        if self.phase != "settled":
            self.search.end(self)
        self.capture.remove()
        self.watching.remove()
        self.current.close()
        self.hold.release()  # the group leaves with the last run that held it (when accel joined it)

    def load(self, path) -> dict:
        """Resume a run: the checkpoint's plan is taken as the answer (nothing is measured), then its state loads
        into that plan's run, as run.load does. A sharded folder (fsdp) is loaded by run.load of a plain plan."""
        if is_sharded_checkpoint(path):
            return self.current.load(path)
        plan = saved_plan(path).to_dict()
        if self.phase != "settled":
            for arm in self.arms:
                if arm.status == "measuring":
                    arm.status, arm.reason = "not measured", "resumed from a checkpoint"
            self.winner, self.settle_how = self.plain, f"resumed from {path}"
            self._finish(f"resumed from {path}: its plan {plan_label(plan)} is taken as it was saved, nothing "
                         "measured", plan)
        elif self.current.plan.to_dict() != plan:
            self._take(plan)
        return self.current.load(path)

    @property
    def state(self) -> States:
        """``run.state(name)``: the run state of that accelerator in the plan taking its turn (accel.Run.state).
        What auto has done so far is ``run.search`` (also ``run.report.search``)."""
        return States(self)

    def _optimizer_steps(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step that did not come through run.step(): the search cannot time the loop's steps. It
        ends on the plain loop, said at once; the switch waits for the next batch or call (not inside the step)."""
        if self.stepping or self.bypassed or self.phase == "settled":
            return
        self.bypassed = True
        warnings.warn("accel: plan='auto' times your steps between run.step() calls, and your loop called "
                      "optimizer.step() itself: nothing can be measured, so the plain loop stays (nothing applied); "
                      "call run.step() once per batch to let auto measure", BypassWarning, stacklevel=3)
        if not self.current.plan.to_dict():
            self._end_bypassed()

    def _pace(self, step_s: float) -> None:
        self.chunk_steps = chunk_steps(step_s, least=2, target_s=CHUNK_S)
        if self.settings.budget_s is None:
            self.deadline = max(self.deadline, self.started + BUDGET_STEPS * step_s)
        if self.settings.expected_steps:
            self.deadline = min(self.deadline, self.started + EXPECTED_SHARE * self.settings.expected_steps * step_s)

    # --- accel.Run's methods (its attributes: RUN_ATTRIBUTES, below): the run of the plan in place answers ------

    def autocast(self):
        return self.current.autocast()

    def held_gradients(self) -> list[torch.Tensor]:
        return self.current.held_gradients()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.current.unscale_gradients(optimizer)

    def accelerator(self, name: str):
        return self.current.accelerator(name)

    def accelerator_state_dict(self, name: str) -> dict[str, Any]:
        return self.current.accelerator_state_dict(name)

    def load_accelerator_state(self, name: str, saved: dict[str, Any]) -> None:
        self.current.load_accelerator_state(name, saved)

    def wrappers(self) -> list[torch.nn.Module]:
        return self.current.wrappers()

    def unwrap(self) -> torch.nn.Module:
        return self.current.unwrap()

    def hand_over(self, successor: Run) -> None:
        self.current.hand_over(successor)

    def state_dict(self, model: bool = True) -> dict[str, Any]:
        return self.current.state_dict(model)

    def state_problems(self, state: dict[str, Any]) -> list[str]:
        return self.current.state_problems(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current.load_state_dict(state)

    def restore_progress(self, state: dict[str, Any]) -> None:
        self.current.restore_progress(state)

    def save(self, path) -> None:
        self.current.save(path)


RUN_ATTRIBUTES = ("model", "optimizer", "plan", "report", "decisions", "extras", "journal", "accelerators", "states",
                  "steps", "optimizer_steps", "closed", "watch", "scaler", "autocast_dtype", "accumulating", "sharded")


def _of_the_plan_in_place(name: str) -> property:
    return property(lambda self: getattr(self.current, name),
                    doc=f"accel.Run.{name}, of the run of the plan in place (read run.model inside the loop)")


for _name in RUN_ATTRIBUTES:  # read-only properties, each named: nothing else is forwarded
    setattr(TuningRun, _name, _of_the_plan_in_place(_name))
