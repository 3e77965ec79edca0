"""plan="auto" in your own loop: the first steps of the real training are the measurement.

    run = accel.accelerate(model, optimizer, loader, plan="auto")
    for x, y in run.loader:                       # your loop, unchanged
        ...; run.backward(loss); run.step()

Arms (the plain loop, the stack of every candidate that can be switched between steps, and that stack without
each member) take turns in chunks of your steps, in an order that reverses every round (A B C, C B A, ...), so a
change in the machine's load hits every arm alike. A chunk is timed from the end of its first step (the one
after a switch; for steps of 2 s or more, from the switch on an arm's later turns) to the end of its last: whole
steps, with your data loading, your code, forward, backward and update. Each round gives every arm a ratio to the
plain loop measured beside it (accel.measure.Ratio). An arm confidently slower than the best is dropped, and so
is one confidently no faster than the plain loop by the margin (it could never be kept); one that cannot be told
from the best within the margin is dropped when it holds more accelerators. The search settles when one arm is left against the plain loop and faster than it, when none is
left, or when the budget is spent; it keeps the best arm only when it is faster than the plain loop with 95%
confidence. compile comes last, on top of the winner, if its warm-up fits what is left of the budget. A rebuilt
loader cannot change mid-epoch: it is decided by how long your loop waits for data, and joins at the next epoch.
An arm hopelessly slower than the plain loop's round beside it stops mid-chunk (stoprule.py); a loss that is not
finite drops an arm only when the plain loop does not give it too on that batch (fault.py); the report says what
auto has done so far at every moment (searchstate.py).

Nothing is copied: every step is a real step of your model and optimizer. A switch is accelerate() on your
objects (the earlier plan undone, its counters and state handed over), so each plan keeps its card.
"""
from __future__ import annotations

import datetime as _dt
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from accel import clock
from accel.accelerator import REGISTRY
from accel.autotune.config import BUDGET_STEPS, MIN_BUDGET_S, Settings, expected_warmup, remember_warmup
from accel.autotune.fault import Blame, Capture, Fault, blame, record, snapshot, summary
from accel.autotune.results import TuneResult, TuneRow
from accel.autotune.search import for_device, generate_candidates
from accel.autotune.searchstate import SearchState
from accel.autotune.state import established, payback
from accel.autotune.stoprule import beside, stop_reason
from accel.autotune.strategies import stack_of
from accel.context import placement
from accel.core import accelerate
from accel.errors import AccelerateError, BypassWarning, MeasureError, PlanError
from accel.hardware import probe
from accel.measure import SETTLE_BELOW_S, Ratio, TrainStep, chunk_steps, paired, plan_label, round_order, synchronize
from accel.plan import Plan

CHUNK_S = 0.5  # a chunk's timed steps take about this long (accel.measure.CHUNK_S; tests shorten it here)
MIN_ROUNDS = 3  # rounds before any verdict
MAX_ROUNDS = 30
DATA_WAIT = 0.10  # a rebuilt loader (workers) pays when the loop waits this fraction of its step for data
EXPECTED_SHARE = 0.3  # with expected_steps, the measurement spends at most this share of the plain run's time (its
# steps are training steps, most of them faster than the plain loop's: what it costs is their gap to the best)


@dataclass
class Arm:
    """One plan taking turns: its step time per round, and how it ended."""

    plan: dict[str, dict]
    tests: str = ""  # the accelerator whose effect it shows (the stack without it), or "" for a whole stack
    rounds: dict[int, float] = field(default_factory=dict)  # round -> seconds per step in its chunk of that round
    status: str = "measuring"  # measuring, settled, slower, not faster, not needed, refused, failed, loss off (a
    # loss not finite under it and not under the plain loop), stopped early, not measured
    reason: str = ""
    first_s: float | None = None  # its first step after the first switch to it (compile lands there)
    steps: int = 0
    decided_by: str = ""  # a measured signal instead of timed turns (the loader: the loop's wait for data)

    @property
    def name(self) -> str:
        return plan_label(self.plan)

    def ratio_to(self, other: Arm) -> Ratio:
        """Its step time over the other's, from the rounds both ran."""
        return paired(self.rounds, other.rounds)


class TuningLoader:
    """run.loader during the search: your loader's batches, prepared by the plan taking its turn, and the time the
    loop waits for each one counted."""

    def __init__(self, tuning: TuningRun):
        self.tuning = tuning

    def __iter__(self):
        tuning = self.tuning
        tuning.epoch_boundary()
        inner = tuning.current.loader
        batches = iter(inner.start_epoch())
        while True:
            started = clock.now()
            try:
                batch = next(batches)
            except StopIteration:
                return
            tuning.data_wait_s += clock.now() - started
            if tuning.bypassed and tuning.phase != "settled":
                tuning._end_bypassed()
            tuning.first_batch(batch)
            yield tuning.current.loader.prepare(batch)

    def __len__(self) -> int:
        return len(self.tuning.current.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "tuning":
            raise AttributeError(name)
        return getattr(self.tuning.current.loader, name)


class States:
    """``run.state`` of a TuningRun. Called, an accelerator's run state, as on accel.Run; read as an attribute, 0.2's
    name of the search state (now ``run.search``), with a DeprecationWarning until 0.4."""

    def __init__(self, tuning: TuningRun):
        self._tuning = tuning

    def __call__(self, name: str) -> Any:
        return self._tuning.current.state(name)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key == "_tuning":
            raise AttributeError(key)
        warnings.warn(f"accel: run.state.{key} of plan='auto' is run.search.{key} (run.state(name) is an "
                      "accelerator's run state, as on accel.Run); the old name goes in 0.4 (docs/migration.md)",
                      DeprecationWarning, stacklevel=2)
        return getattr(self._tuning.search, key)


class TuningRun:
    """What plan="auto" returns: a Run whose plan changes between chunks of your steps until the search settles.

    Use it as any run: run.model, run.optimizer, run.loader, run.autocast(), run.backward(), run.step(),
    run.report (its `search` says what auto has done so far, at every moment; its `tuning` has the search's table and
    why once it settled). Read run.model inside the loop, not once before it: compile, when it wins, wraps it.
    """

    def __init__(self, settings: Settings, model, optimizer, loader, device: Any = "auto"):
        if optimizer is None or loader is None:
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
        given = settings.candidates is not None
        candidates = ([Plan(c).to_dict() for c in settings.candidates] if given else
                      generate_candidates(self.hardware, model, optimizer, loader, settings.accelerators))
        candidates = [c for c in candidates if c]
        self.costly = [c for c in candidates if any(REGISTRY[n].costly_setup for n in c)]
        self.epochwise = [c for c in candidates if c not in self.costly
                          and any(REGISTRY[n].switch_at == "epoch" for n in c)]
        stepwise = [c for c in candidates if c not in self.costly and c not in self.epochwise]
        self.notes: list[str] = []
        self.arms = [Arm({}, status="measuring")]
        if given:
            self.arms += [Arm(c) for c in stepwise]
        else:
            full, left_out = stack_of(stepwise)
            if left_out:
                self.notes.append("left out of the stack: " + "; ".join(left_out))
            if full:
                self.arms.append(Arm(full))
                if len(full) > 1:
                    self.arms += [Arm({k: v for k, v in full.items() if k != name}, tests=name) for name in full]
        self.plain = self.arms[0]
        self.phase = "measuring" if len(self.arms) > 1 or self.costly or self.epochwise else "settled"
        self.round, self.order, self.turn, self.phase_start = 0, [], 0, 0
        self.chunk_steps = 2  # timed steps per chunk, paced after the plain loop's first chunk
        self.in_chunk = 0
        self.untimed = 1  # steps after the switch not timed in this chunk (1, or 0 on later turns of long steps)
        self.chunk_started = self.switched_at = clock.now()
        self.data_wait_s = 0.0
        self.loader_read = False  # whether the loop iterated run.loader (it may read another run's: a GAN's generator)
        self.plain_wait = [0.0, 0.0]  # data wait and time of the plain loop's timed steps
        self.deadline = self.started + (settings.budget_s if settings.budget_s is not None else MIN_BUDGET_S)
        self.losses: list[torch.Tensor] = []
        self.pending: dict[str, dict] | None = None  # the plan to take at the next epoch (a rebuilt loader)
        self.compile_arm: Arm | None = None
        self.compile_base: Arm | None = None
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
        self.step_losses: list[torch.Tensor] = []  # this step's losses, and your model's forwards that gave them
        self.step_calls: list = []
        self.chunk_record: list[tuple[int, list, list]] = []  # on an accelerator: (step, losses, forwards) per step
        self.timed_s: list[float] = []  # on a CPU, this chunk's timed steps one by one (the stop rule's evidence)
        self.last_end = self.started
        self.current = accelerate(model, optimizer, loader, plan={}, device=device)
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

    # --- what the loop calls ---------------------------------------------------------------------------------

    @property
    def model(self):
        return self.current.model

    @property
    def optimizer(self):
        return self.current.optimizer

    @property
    def report(self):
        return self.current.report

    @property
    def steps(self) -> int:
        return self.current.steps

    def autocast(self):
        return self.current.autocast()

    @property
    def state(self) -> "States":
        """``run.state(name)``: the run state of that accelerator in the plan taking its turn (accel.Run.state).
        What auto has done so far is ``run.search`` (also ``run.report.search``)."""
        return States(self)

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

    def _end_bypassed(self) -> None:
        for arm in self.arms:
            if arm is not self.plain and arm.status == "measuring":
                arm.status, arm.reason = "not measured", "your loop steps the optimizer itself"
        self.winner, self.settle_how = self.plain, "your loop bypasses run.step()"
        self._finish("your loop calls optimizer.step() itself, not run.step(): plan='auto' times the steps between "
                     "run.step() calls, so nothing was measured: the plain loop is kept")

    def load(self, path) -> dict:
        """Resume a run: the checkpoint's plan is taken as the answer (nothing is measured), then its state loads
        into that plan's run, as run.load does. A sharded folder (fsdp) is loaded by run.load of a plain plan."""
        from accel import sharded_checkpoint
        from accel.checkpoint import saved_plan

        if sharded_checkpoint.is_sharded_checkpoint(path):
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

    def __getattr__(self, name: str) -> Any:  # unscale_gradients, unwrap, save, load, state_dict, accelerator, ...
        if name == "current":
            raise AttributeError(name)
        return getattr(self.current, name)

    # --- the search ------------------------------------------------------------------------------------------

    def first_batch(self, batch: Any) -> None:
        """At the first batch: the cache's answer, if this setup was measured before (the key needs the batch)."""
        self.loader_read = True
        if self.cache_key is not None or not self.settings.cache or self.phase == "settled":
            return
        from accel import plancache

        model, optimizer, loader = self._objects
        self.cache_key = plancache.key_parts(model, optimizer, loader, batch, self.device, self.hardware,
                                             self._key_settings(), TrainStep())
        hit = plancache.lookup(self.cache_key, self.settings.cache)
        if hit is not None:
            result = TuneResult.from_dict(hit)
            result.from_cache, result.elapsed_s = True, clock.now() - self.started
            result.settings = {**result.settings, "settled_at_step": self.steps}
            self.measured_s = result.elapsed_s
            self.result = result
            self._take(result.plan.to_dict())
            self.current.report.tuning = result
            self.phase = "settled"
            self.settled_at = self.steps
            self.capture.remove()
            self.search.settle(self, cached=f"from the cache, key {result.key[:12]}")

    def _key_settings(self) -> dict[str, Any]:
        s = self.settings
        return {"search": "your loop", "tolerance": s.tolerance, "margin": s.margin,
                "expected_steps": s.expected_steps, "accelerators": s.accelerators,
                "candidates": [Plan(c).to_dict() for c in s.candidates] if s.candidates is not None else "generated"}

    def epoch_boundary(self) -> None:
        if self.pending is not None:
            plan, self.pending = self.pending, None
            self._switch(plan)

    def _after_step(self) -> None:
        self.in_chunk += 1
        self.active.steps += 1
        if self.in_chunk == self.untimed:  # the step after a switch, when it is not timed (self.untimed is 1)
            synchronize(self.device)
            now = clock.now()
            if self.active.first_s is None:
                self.active.first_s = now - self.switched_at
            self._chunk_starts(now)
            return
        arm = self.active
        timed = self.in_chunk - self.untimed
        against = self._against(arm)
        if self.device.type == "cpu":  # (on an accelerator, reading the time every step would wait for the device)
            now = clock.now()
            self.timed_s.append(now - self.last_end)
            self.last_end = now
        if timed < self.chunk_steps and (against is None or self.device.type != "cpu"
                                         or not self._stop_reason(timed, against)):
            return
        synchronize(self.device)
        elapsed = clock.now() - self.chunk_started
        fault = self.fault or self._chunk_fault()
        self.fault, self.chunk_record = None, []
        self.losses.clear()
        blamed = self._judge(fault) if fault is not None else None
        if blamed is not None and blamed.plan:
            arm.status, arm.reason = "loss off", blamed.words
        else:
            arm.rounds[self.round] = elapsed / timed
            why = self._stop_reason(timed, against, elapsed) if against is not None else ""
            if why:  # bf16 emulated on a CPU without it was 14x slower: no more turns for it
                arm.status, arm.reason = "stopped early", why
        if arm is self.plain:
            self.plain_wait[0] += self.data_wait_s - self.wait_at_start
            self.plain_wait[1] += elapsed
            if self.round == 0 and self.chunk_steps == 2:
                self._pace(elapsed / timed)
        self._next_turn()

    def _chunk_starts(self, at: float) -> None:
        self.chunk_started, self.last_end, self.wait_at_start = at, at, self.data_wait_s
        self.timed_s = []

    def _against(self, arm: Arm) -> Arm | None:
        """What an arm's turn is compared with: the plain loop, or in compile's rounds the winner under it."""
        reference = self.winner if self.phase == "compile" else self.plain
        return None if arm is reference or reference is None else reference

    def _stop_reason(self, timed: int, against: Arm, elapsed: float | None = None) -> str:
        """The stop rule (stoprule.py) on this chunk: its fastest timed step on a CPU, its mean elsewhere, against the
        step of ``against`` in the round beside it."""
        fastest = min(self.timed_s) if len(self.timed_s) == timed else (elapsed or 0.0) / timed
        name = "the plain loop" if against is self.plain else against.name
        return stop_reason(fastest, timed, beside(against.rounds, self.round), name)

    # --- faults: a loss that is not finite (fault.py) ----------------------------------------------------------

    def _check_step(self) -> None:
        """Before a step's update: on a CPU (where reading a loss costs nothing) its loss is checked now, so a fault is
        judged in the weights it happened in (a copy is kept, its time left out of the chunk's); on an accelerator the
        step is kept for the chunk's end."""
        losses, calls, self.step_losses, self.step_calls = self.step_losses, self.step_calls, [], []
        if self.fault is not None or not losses:
            return
        if self.device.type != "cpu":
            self.chunk_record.append((self.steps + 1, losses, calls))
            return
        if _finite(losses):
            return
        started = clock.now()
        state = snapshot(self._objects[0]) if self.active is not self.plain else None
        self.fault = Fault(self.steps + 1, self.active.name, calls, state)
        spent = clock.now() - started  # not the plan's time: the chunk's marks move past it
        self.chunk_started, self.last_end = self.chunk_started + spent, self.last_end + spent

    def _chunk_fault(self) -> Fault | None:
        """On an accelerator, the chunk's first step whose loss was not finite (judged in the weights as they are)."""
        for step, losses, calls in self.chunk_record:
            if not _finite(losses):
                return Fault(step, self.active.name, calls)
        return None

    def _judge(self, fault: Fault) -> Blame:
        """Whose fault: the plan's, or the plain loop's too (replayed under it, nothing changed: fault.py)."""
        if self.active is self.plain:
            blamed = Blame(False, "the data or the loop", f"a loss was not finite at step {fault.step} under the "
                                                          "plain loop itself", fault.step, fault.arm)
        else:
            self._switch({})  # the plain loop, to replay the step's forward under
            blamed = blame(self._objects[0], fault, self.settings.tolerance, self.capture)
        if not blamed.plan:
            record(self.blames, blamed)
        return blamed

    def _pace(self, step_s: float) -> None:
        self.chunk_steps = chunk_steps(step_s, least=2, target_s=CHUNK_S)
        if self.settings.budget_s is None:
            self.deadline = max(self.deadline, self.started + BUDGET_STEPS * step_s)
        if self.settings.expected_steps:
            self.deadline = min(self.deadline, self.started + EXPECTED_SHARE * self.settings.expected_steps * step_s)

    def _live(self) -> list[Arm]:
        return [a for a in self.arms if a.status == "measuring"]

    def _next_round(self) -> None:
        live = self._live()
        self.order = round_order(live, self.round, rotate=False)  # the plain loop stays first or last
        self.turn = 0
        self._go(self.order[0])

    def _next_turn(self) -> None:
        if clock.now() >= self.deadline:  # never past the budget by more than the chunk just run
            self._end_compile() if self.phase == "compile" else self._settle("budget")
            return
        self.turn += 1
        while self.turn < len(self.order) and self.order[self.turn].status != "measuring":
            self.turn += 1
        if self.turn < len(self.order):
            self._go(self.order[self.turn])
            return
        self._verdicts()  # may settle, or start compile's rounds
        if self.phase == "settled":
            return
        self.round += 1
        if self.round - self.phase_start >= MAX_ROUNDS:
            self._end_compile() if self.phase == "compile" else self._settle("rounds")
            return
        self._next_round()

    def _go(self, arm: Arm) -> None:
        self.turn_began = clock.now()  # before the deadline, always: _next_turn checks it first
        if not self._switch(arm.plan, arm):
            self._next_turn()
            return
        self.active, self.in_chunk = arm, 0
        self.search.update(self)  # the report says whose turn it is, and what the rounds so far measured
        # A step of 2 s or more is timed from the switch on an arm's later turns: what a switch leaves cold (caches,
        # the allocator) is small beside it, and an untimed step would cost a third of every turn.
        # compile is left out: a switch back to it may recompile (its hooks' guards), and that is not its step.
        long_steps = all(a.rounds and min(a.rounds.values()) >= SETTLE_BELOW_S for a in (self.plain, arm))
        costly = any(REGISTRY[name].costly_setup for name in arm.plan)
        self.untimed = 0 if arm.first_s is not None and long_steps and not costly else 1
        if not self.untimed:
            self._chunk_starts(self.switched_at)

    def _switch(self, plan: dict[str, dict], arm: Arm | None = None) -> bool:
        """accelerate() on your objects with this plan (the earlier run handed over); False when it is refused."""
        if self.current.plan.to_dict() == Plan(plan).to_dict() and not self.current.closed:
            self.switched_at = clock.now()
            return True
        model, optimizer, loader = self._objects
        started = clock.now()
        leaving = [a.name for a in self.current.accelerators]
        for name in leaving:  # each arm's state (amp's GradScaler) waits for its next turn
            self.saved[name] = self.current.accelerator_state_dict(name)
        try:
            self.current = accelerate(model, optimizer, loader, plan=plan, device=self.device)
            self.current.report.search = self.search  # every plan's report says what auto has done so far
            self.capture.attach()  # after the plan's own hooks on your model
            for accelerator in self.current.accelerators:  # those handed over by the run before already have it
                if accelerator.name not in leaving and accelerator.name in self.saved:
                    try:
                        self.current.load_accelerator_state(accelerator.name, self.saved[accelerator.name])
                    except ValueError:  # another configuration of it (bf16 after fp16): it starts afresh
                        pass
        except (PlanError, AccelerateError) as error:  # the earlier run is back as it was
            if arm is not None:
                arm.status = "refused" if isinstance(error, PlanError) else "failed"
                lines = [line.strip(" -") for line in str(error).splitlines()]
                arm.reason = "; ".join(line for line in lines[1:] if line)[:300] or lines[0]
            return False
        finally:
            self.switched_at = clock.now()
            self.switch_s += self.switched_at - started
        return True

    def _verdicts(self) -> None:
        """After a round: drop what is confidently slower than the best, confidently no faster than the plain loop
        by the margin, or no faster than the best and larger; settle when none is left, or when one is left and it
        is confidently faster than the plain loop by the margin."""
        if self.phase == "compile" and self.compile_arm.status != "measuring":  # refused, failed, loss not finite
            self._end_compile()
            return
        if self.round + 1 - self.phase_start < MIN_ROUNDS:
            return
        margin = self.settings.margin
        if self.phase == "compile":
            ratio = self.compile_arm.ratio_to(self.winner)
            if ratio.below(1 - margin / 2) or ratio.above(1 - margin):
                self._end_compile()
            return
        rivals = [a for a in self._live() if a is not self.plain and a.rounds]
        if not rivals:
            self._settle("no candidate could be timed")
            return
        for arm in rivals:  # it could only be kept faster than the plain loop by the margin: it is confidently not
            vs_plain = arm.ratio_to(self.plain)
            if vs_plain.above(1 - margin):
                arm.status, arm.reason = "not faster", f"{vs_plain} of the plain loop's step"
        rivals = [a for a in rivals if a.status == "measuring"]
        if not rivals:  # every candidate is confidently no faster: more turns would only cost your run time
            self._settle("settled")
            return
        best = min(rivals, key=lambda a: a.ratio_to(self.plain).estimate)
        for arm in rivals:
            if arm is best:
                continue
            ratio = arm.ratio_to(best)
            if ratio.above(1 + margin):
                arm.status, arm.reason = "slower", f"{ratio} of {best.name}'s step"
            elif ratio.below(1 + margin) and ratio.above(1 - margin) and len(arm.plan) > len(best.plan):
                arm.status, arm.reason = "not needed", f"{ratio} of {best.name}'s step, with more accelerators"
        left = [a for a in self._live() if a is not self.plain]
        if left == [best] and best.ratio_to(self.plain).below(1 - margin):
            self._settle("settled")

    def _settle(self, how: str) -> None:
        margin = self.settings.margin
        self.plain.status = "baseline"
        rivals = [a for a in self.arms if a is not self.plain and a.rounds and a.status == "measuring"]
        faster = [a for a in rivals if established(a.ratio_to(self.plain), margin)]
        self.winner = min(faster, key=lambda a: a.ratio_to(self.plain).estimate) if faster else self.plain
        for arm in rivals:
            if arm is not self.winner:
                arm.status = "not chosen"
                arm.reason = arm.reason or f"{arm.ratio_to(self.plain)} of the plain loop's step"
        self.winner.status = "settled"
        self.settle_how = how
        if how == "budget":
            self.notes.append("the budget ran out before every verdict was clear")
        for arm in self.arms:
            if arm.status == "measuring":
                arm.status = "not measured"
                arm.reason = "budget" if how == "budget" else how
        plan = dict(self.winner.plan)
        if self._try_compile(plan):
            return
        self._finish_with(plan)

    def _try_compile(self, plan: dict[str, dict]) -> bool:
        if not self.costly:
            return False
        candidate = self.costly[0]
        left = self.deadline - clock.now()
        guess, known = expected_warmup(candidate, self.cache_key, self.settings.cache)
        if left < guess:
            self.compile_arm = Arm({**plan, **candidate}, tests=next(iter(candidate)), status="not measured",
                                   reason=f"its warm-up (about {guess:.0f} s, {known}) does not fit the "
                                          f"{max(left, 0):.0f} s of budget left")
            self.arms.append(self.compile_arm)
            return False
        self.compile_arm = Arm({**plan, **candidate}, tests=next(iter(candidate)))
        self.compile_base = self.winner  # what compile goes on top of, and is compared with
        self.arms.append(self.compile_arm)
        self.winner.status = "measuring"
        self.phase, self.phase_start = "compile", self.round + 1  # its rounds start after this one
        self.capture.remove()  # compile would trace hooks on the model: no replay in its rounds
        return True

    def _end_compile(self) -> None:
        arm, base = self.compile_arm, self.winner
        ratio = arm.ratio_to(base)
        margin = self.settings.margin
        step = base.rounds and sorted(base.rounds.values())[len(base.rounds) // 2] or 0.0
        warmup = (arm.first_s or 0.0) - step
        if arm.first_s is not None:
            remember_warmup(self.costly[0], self.cache_key, self.settings.cache, warmup)
        expected = self.settings.expected_steps
        faster, break_even, pays = payback(ratio, step, warmup, margin, expected)
        base.status = "settled"
        if arm.status != "measuring":  # it could not take its turns: said in its own status and reason
            self._finish_with(dict(base.plan))
            return
        if pays:
            arm.status, arm.reason = "settled", f"{ratio} of {base.name}'s step; warm-up {warmup:.1f} s pays back " \
                                                f"after {break_even} steps"
            self.winner = arm
        else:
            arm.status = "not chosen"
            arm.reason = (f"{ratio} of {base.name}'s step" + ("" if faster else ": not faster")
                          + (f"; its {warmup:.1f} s warm-up pays back after {break_even} steps, beyond the run's "
                             f"{expected}" if faster and not pays else ""))
        self._finish_with(dict(self.winner.plan))

    def _finish_with(self, plan: dict[str, dict]) -> None:
        """Decide the loader by the measured data wait, take the plan, and write the result."""
        wait, spent = self.plain_wait
        share = wait / spent if spent else 0.0
        for candidate in self.epochwise:
            name = next(iter(candidate))
            arm = Arm(candidate, tests=name, decided_by="by data wait" if self.loader_read else "")
            if not self.loader_read:
                arm.status, arm.reason = "not measured", "your loop never iterated run.loader: its data wait is unknown"
            elif share >= DATA_WAIT:
                plan = {**plan, **candidate}
                arm.status, arm.reason = "settled", (f"your loop waited {share:.0%} of its step for data: it joins at "
                                                     "the next epoch")
            else:
                arm.status, arm.reason = "not needed", f"your loop waited {share:.0%} of its step for data"
            self.arms.append(arm)
        self._finish(self._why(plan), plan)

    def _why(self, plan: dict[str, dict]) -> str:
        winner = self.winner
        if winner is self.plain or winner is None:
            measured = [a for a in self.arms if a is not self.plain and a.rounds]
            if not measured:
                return "no candidate could be timed in your loop: the plain loop is kept"
            return (f"no plan was faster than the plain loop by more than {self.settings.margin:.0%} with 95% "
                    f"confidence ({len(measured)} measured; {self.settle_how}): the plain loop is kept")
        ratio = winner.ratio_to(self.plain) if winner is not self.compile_arm else None
        text = f"{winner.name}: " + (f"{ratio} of the plain loop's step" if ratio else winner.reason)
        return text + f", settled at step {self.steps} ({self.settle_how})"

    def _finish(self, why: str, plan: dict[str, dict] | None = None) -> None:
        plan = plan or {}
        self.phase = "settled"
        self.settled_at = self.steps
        self.measured_s = clock.now() - self.started
        rows = [self._row(a) for a in self.arms]
        elapsed = clock.now() - self.started
        settings = {**self._key_settings(), "budget_s": round(self.deadline - self.started, 1),
                    "settled_at_step": self.steps, "switch_s": round(self.switch_s, 3)}
        if not self.loader_read and self.settings.cache and any(a.rounds for a in self.arms):
            self.notes.append("your loop never iterated run.loader, so the cache was neither read nor written (its "
                              "key needs a batch)")
        self.notes += summary(self.blames)
        if self.notes:
            why += "; " + "; ".join(self.notes)
        self.result = TuneResult(Plan(plan), rows, why, rows[0].median_ms, elapsed, settings,
                                 measured_at=_dt.datetime.now().isoformat(timespec="seconds"),
                                 established=self.winner is not self.plain or not any(  # undecided arms
                                     self._undecided(a.ratio_to(self.plain)) for a in self.arms[1:]
                                     if a.status == "not chosen" and a.rounds and a is not self.compile_arm))
        self._take(plan)
        self.current.report.tuning = self.result
        complete = (self.result.established and self.settle_how == "settled"
                    and not any(r.status == "not measured" for r in rows))
        if self.cache_key is not None and complete:
            from accel import plancache

            self.result.key = plancache.store(self.cache_key, self.result.to_dict(), self.settings.cache)
        self.capture.remove()
        self.search.settle(self, cached=self._cached_words())

    def _cached_words(self) -> str:
        if self.result.key:
            return f"cached under key {self.result.key[:12]}"
        why = ("cache=False" if not self.settings.cache else "no batch was read for its key" if self.cache_key is None
               else "only an established, complete answer is kept")
        return f"not cached ({why})"

    def _undecided(self, ratio: Ratio) -> bool:
        """Neither established faster than the plain loop nor confidently no faster by the margin: the two verdicts
        the search drops or keeps an arm by."""
        margin = self.settings.margin
        return not (established(ratio, margin) or ratio.above(1 - margin))

    def _take(self, plan: dict[str, dict]) -> None:
        """The chosen plan now, but its rebuilt loader only from the next epoch."""
        now = {k: v for k, v in plan.items() if REGISTRY[k].switch_at != "epoch"}
        if now != plan:
            self.pending = plan
        self._switch(now)

    def _row(self, arm: Arm) -> TuneRow:
        against = self.compile_base if arm is self.compile_arm and self.compile_base is not None else self.plain
        ratio = arm.ratio_to(against) if arm is not self.plain and arm.rounds else None
        ordered = sorted(arm.rounds.values())
        median = ordered[len(ordered) // 2] if ordered else None
        status = {"settled": "measured", "measuring": "measured", "baseline": "measured"}.get(arm.status, arm.status)
        if arm.status in ("slower", "not faster", "not needed", "not chosen") and arm.rounds:
            status = "measured"
        if arm.decided_by:
            status = arm.decided_by
        decision = ("chosen" if arm.status == "settled" and arm is not self.plain else
                    "baseline (your plain loop)" if arm is self.plain else "")
        return TuneRow(arm.name, arm.plan, status, against="" if arm is self.plain else
                       "eager" if against is self.plain else against.name,
                       ratio=ratio.to_dict() if ratio else None,
                       vs_baseline=round(ratio.estimate, 4) if ratio and ratio.samples else None,
                       median_ms=round(median * 1000, 3) if median is not None else None,
                       first_step_s=round(arm.first_s, 4) if arm.first_s is not None else None,
                       decision=decision, reason=arm.reason or f"{len(arm.rounds)} rounds, {arm.steps} steps",
                       tests=arm.tests)


def _finite(losses: list[torch.Tensor]) -> bool:
    return bool(torch.isfinite(torch.cat([loss.detach().float().reshape(-1) for loss in losses])).all())
