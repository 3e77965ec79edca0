"""The rounds of plan="auto" in your loop: the one search's comparisons (strategy.py) measured on your own steps.

Each comparison's plans take turns in chunks of your steps, a round at a time, the reference first in one round
and last in the next (P C | C P | P C: no switch at a round's edge). A chunk is timed from the end of its first step
after a switch (for steps of 2 s or more, from the switch on a plan's later turns) to the end of its last: whole
steps, with your data loading, your code, forward, backward and update. After each round from the third, a
challenger whose ratio to the reference clears the comparison's thresholds stops taking turns; the comparison ends
when none is left, after MAX_ROUNDS, or when the budget is spent (checked after every chunk), and its outcomes go
back to the search for the next one.

The stop rule (stoprule.py): a challenger hopelessly slower than the reference's round beside it stops mid-chunk,
and the reference is timed again at once: it is dropped only when still hopelessly slower than that fresh chunk, so
a machine that got busy between the two drops nothing. A loss that is not finite is judged under the plain loop
(fault.py): a plan pays only for its own. Under a launcher every rank takes the slowest rank's times and rank 0's
clock (ranks.py), so every rank runs the same plan at every step and reaches the same verdicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from accel import clock
from accel.measure import SETTLE_BELOW_S, Ratio, chunk_steps, paired, plan_label, round_order, synchronize
from accel.plan.contract import Capability
from accel.search.fault import Blame, Fault, blame, interrupts_held, record, snapshot
from accel.search.ranks import ChunkTimes
from accel.search.remembered import expected_warmup, remember_warmup
from accel.search.settings import BUDGET_STEPS, MIN_BUDGET_S, provides
from accel.search.stoprule import beside, stop_reason
from accel.search.strategy import Comparison, Outcome
from accel.search.verdicts import decided, run_ahead_s, warmup_fit

MIN_ROUNDS = 3  # rounds of a comparison before any verdict
MAX_ROUNDS = 30
MOST_STEPS = 4  # timed steps of a chunk at most: 3 rounds of 2 plans end by the 30th step of a run of short steps
EXPECTED_SHARE = 0.3  # with expected_steps, the measurement spends at most this share of the plain run's time


@dataclass
class Arm:
    """One plan taking turns: its step time per round, and how its last comparison ended for it."""

    plan: dict[str, dict]
    rounds: dict[int, float] = field(default_factory=dict)  # round -> seconds per step in its chunk of that round
    status: str = "waiting"  # waiting, measuring, measured, refused, failed, loss off, stopped early, not measured
    reason: str = ""
    first_s: float | None = None  # its first step after the first switch to it (compile lands there)
    steps: int = 0
    against: Arm | None = None  # the reference of its last comparison

    @property
    def name(self) -> str:
        return plan_label(self.plan)

    def ratio_to(self, other: Arm) -> Ratio:
        return paired(self.rounds, other.rounds)

    def median_s(self) -> float | None:
        ordered = sorted(self.rounds.values())
        return ordered[len(ordered) // 2] if ordered else None


@dataclass
class Chunk:
    """The turn in progress: the steps it has taken, how it is timed so far, and what a fault is judged on."""

    steps: int = 0
    untimed: int = 1  # steps after the switch not timed (1, or 0 without a switch or on later turns of long steps)
    started: float = 0.0
    last_end: float = 0.0
    wait_at_start: float = 0.0  # the loop's data wait when its timing began
    timed_s: list[float] = field(default_factory=list)  # on a CPU, its timed steps (the stop rule's evidence)
    record: list[tuple[int, list, list]] = field(default_factory=list)  # on an accelerator: (step, losses, forwards)
    recheck: tuple | None = None  # a challenger the stop rule caught: (arm, its fastest step, timed steps)


class Turns:
    """Runs the search's comparisons on the loop's steps of a plan="auto" run (inloop.InLoopSearch, ``run``)."""

    def __init__(self, run: Any):
        self.run = run
        self.arms: list[Arm] = [Arm({}, status="measuring")]
        self.plain = self.arms[0]
        self.comparisons = run.strategy.comparisons()
        self.request: Comparison | None = None
        self.note = ""  # the comparison's word on its rows (a warm-up tried past the budget)
        self.cut = False  # a comparison the budget ended before its verdicts were clear
        self.reference, self.challengers = self.plain, []
        self.round = self.first_round = self.turn = 0
        self.order: list[Arm] = []
        self.active = self.plain
        self.chunk = Chunk()
        self.chunk_steps = 2  # timed steps per chunk, paced after the plain loop's first chunk
        settings = run.settings
        self.deadline = run.started + (settings.budget_s if settings.budget_s is not None else MIN_BUDGET_S)
        self.turn_began = run.started
        self.plain_wait = [0.0, 0.0]  # data wait and time of the plain loop's timed steps
        self.fault: Fault | None = None  # this chunk's first loss that was not finite, judged at its end
        self.losses: list[torch.Tensor] = []  # this step's losses, and your model's forwards that gave them
        self.calls: list = []

    # --- the comparisons -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._next(lambda: next(self.comparisons))

    def _next(self, ask) -> None:
        """The search's next comparison (``ask``), begun; the run finishes when there is none."""
        decided_before = self.run.strategy.decided
        try:
            request = ask()
        except StopIteration:
            self.run.finish()
            return
        if self.run.strategy.decided and not decided_before:
            self.run.choose()
        self._begin(request)

    def _begin(self, request: Comparison) -> None:
        self.request, self.note = request, ""
        self.reference = self.arm(request.reference)
        if request.costly:
            fit = self._warmup_fit(request)
            if not fit.fits:
                return self._answer([Outcome("not measured", fit.reason)])
            if fit.past_budget:  # its warm-up and its rounds, on the run's allowance
                self.deadline, self.note = clock.now() + 2 * fit.allowance_s, fit.reason
            self.run.capture.remove()  # compile would trace hooks on the model: no replay from here
        if self.run.ranks.past(self.deadline, clock.now()):
            self.cut = True
            return self._answer([Outcome("not measured", "the budget ran out") for _ in request.challengers])
        self.challengers = [self.arm(plan) for plan in request.challengers]
        for arm in self.challengers:
            if arm.status in ("waiting", "measuring", "measured"):
                arm.against, arm.status, arm.reason = self.reference, "measuring", ""
        self.reference.status, self.first_round = "measuring", self.round
        if not self._live():  # each could not run before: it is not tried again
            return self._end_comparison()
        self._next_round()

    def _warmup_fit(self, request: Comparison):
        candidate = {k: v for k, v in request.challengers[0].items() if k not in request.reference}
        guess = expected_warmup(candidate, self.run.cache_key, self.run.settings.cache)
        ahead = run_ahead_s(self.run.settings.expected_steps, self.run.steps, self.reference.median_s())
        return self.run.ranks.decide(warmup_fit(*guess, self.deadline - clock.now(), ahead))  # rank 0's clock

    def _answer(self, outcomes: list[Outcome]) -> None:
        self._next(lambda: self.comparisons.send(outcomes))

    def _end_comparison(self) -> None:
        reference, outcomes = self.reference, []
        for arm in self.challengers:
            ratio = arm.ratio_to(reference)
            if arm.status in ("measuring", "measured"):
                arm.status = "measured" if ratio.samples else "not measured"
                arm.reason = arm.reason or ("" if ratio.samples else "the budget ran out")
            if self.request.costly and arm.first_s is not None:
                arm.first_s = self.run.ranks.slowest(arm.first_s)  # the warm-up every rank waited for
                remember_warmup({k: v for k, v in arm.plan.items() if k not in reference.plan}, self.run.cache_key,
                                self.run.settings.cache, arm.first_s - (reference.median_s() or 0.0))
            fields = {"median_ms": round(arm.median_s() * 1000, 3)} if arm.rounds else {}
            if arm.first_s is not None:
                fields["first_step_s"] = round(arm.first_s, 4)
            outcomes.append(Outcome(arm.status, arm.reason, ratio, dict(arm.rounds), fields,
                                    (arm.first_s or 0.0) - (reference.median_s() or 0.0), reference.median_s(),
                                    self.note))
        self.challengers = []
        reference.status = "measured" if reference is not self.plain else reference.status
        self._answer(outcomes)

    def arm(self, plan: dict[str, dict]) -> Arm:
        found = next((a for a in self.arms if a.plan == plan), None)
        if found is None:
            found = Arm(dict(plan))
            self.arms.append(found)
        return found

    # --- turns and rounds ----------------------------------------------------------------------------------------

    def _live(self) -> list[Arm]:
        return [a for a in self.challengers if a.status == "measuring"]

    def _next_round(self) -> None:
        self.order = round_order([self.reference, *self._live()], self.round - self.first_round, rotate=False)
        self.turn = -1
        self._next_turn(first=True)

    def _next_turn(self, first: bool = False) -> None:
        if not first and self.run.ranks.past(self.deadline, clock.now()):  # never past by more than one chunk
            self.cut = self.cut or bool(self._live())
            return self._end_comparison()
        self.turn += 1
        while self.turn < len(self.order) and self.order[self.turn].status != "measuring":
            self.turn += 1
        if self.turn < len(self.order):
            return self._go(self.order[self.turn])
        self.round += 1
        done = self.round - self.first_round
        if done >= MIN_ROUNDS:
            for arm in self._live():
                if decided(arm.ratio_to(self.reference), self.request.thresholds):
                    arm.status = "measured"
        if not self._live() or done >= MAX_ROUNDS:
            return self._end_comparison()
        self._next_round()

    def _go(self, arm: Arm) -> None:
        self.turn_began = clock.now()  # before the deadline, always: _next_turn checks it first
        switched = self.run.switch(arm.plan, arm)
        if switched is None:  # refused or failed: its status says why; a recheck waiting for it goes unjudged
            self.chunk.recheck = None
            return self._next_turn()
        self.active, self.chunk.steps, self.chunk.record = arm, 0, []
        # A step of 2 s or more is timed from the switch on a plan's later turns: what a switch leaves cold is small
        # beside it, and an untimed step would cost a third of every turn. Not a costly plan: a switch back to it may
        # build again (compile's guards), and that is not its step.
        long_steps = all(a.rounds and min(a.rounds.values()) >= SETTLE_BELOW_S for a in (self.reference, arm))
        costly = provides(arm.plan, Capability.SETUP_COSTLY)
        later = arm.first_s is not None and ((long_steps and not costly) or not switched)
        self.chunk.untimed = 0 if later else 1
        if not self.chunk.untimed:
            self._chunk_starts(self.run.switched_at)
        self.run.update_words()

    def _chunk_starts(self, at: float) -> None:
        chunk = self.chunk
        chunk.started, chunk.last_end, chunk.wait_at_start, chunk.timed_s = at, at, self.run.data_wait_s, []

    def restart_chunk(self) -> None:
        """The plan was switched away and back under this chunk (a refused run.load): it starts again."""
        self.chunk.steps, self.chunk.untimed, self.chunk.record = 0, 1, []

    # --- a step --------------------------------------------------------------------------------------------------

    def before_update(self) -> None:
        """Before a step's update: on a CPU (where reading a loss costs nothing) its loss is checked now, so a fault
        is judged in the weights it happened in (a copy is kept, its time left out of the chunk's); on an accelerator
        the step is kept for the chunk's end."""
        losses, calls, self.losses, self.calls = self.losses, self.calls, [], []
        if self.fault is not None or not losses:
            return
        if self.run.device.type != "cpu":
            self.chunk.record.append((self.run.steps + 1, losses, calls))
        elif not finite(losses):
            began = clock.now()
            state = snapshot(self.run.objects[0]) if self.active is not self.plain else None
            self.fault = Fault(self.run.steps + 1, self.active.name, calls, state)
            spent = clock.now() - began  # not the plan's time: the chunk's marks move past it
            self.chunk.started, self.chunk.last_end = self.chunk.started + spent, self.chunk.last_end + spent

    def after_step(self) -> None:
        chunk, arm, run = self.chunk, self.active, self.run
        chunk.steps += 1
        arm.steps += 1
        if chunk.steps == chunk.untimed:  # the step after a switch
            synchronize(run.device)
            now = clock.now()
            if arm.first_s is None:
                arm.first_s = now - run.switched_at
            return self._chunk_starts(now)
        timed = chunk.steps - chunk.untimed
        against = None if arm is self.reference else self.reference
        if run.device.type == "cpu":  # (on an accelerator, reading the time every step would wait for the device)
            now = clock.now()
            chunk.timed_s.append(now - chunk.last_end)
            chunk.last_end = now
        # mid-chunk the stop rule reads this rank's clock: with several ranks a chunk runs to its end
        if timed < self.chunk_steps and (against is None or run.device.type != "cpu" or run.ranks.world_size > 1
                                         or not self._stop_reason(timed, against)):
            return
        synchronize(run.device)
        elapsed = clock.now() - chunk.started
        fault = self.fault or self._chunk_fault()
        self.fault, chunk.record = None, []
        agreed = run.ranks.chunk(ChunkTimes(elapsed, tuple(chunk.timed_s), fault is not None))
        chunk.timed_s, elapsed = list(agreed.step_s), agreed.seconds
        if agreed.nonfinite and run.ranks.world_size > 1 and arm is not self.plain:
            run.switch({})  # every rank switches to the plain loop together (ddp's wrapping is collective)
        blamed = self._judge(fault) if fault is not None else None
        if chunk.recheck is not None:  # this chunk timed the reference again, for the arm caught before it
            self._end_recheck(self._step_s(timed, elapsed))
        elif run.ranks.any_true(blamed is not None and blamed.plan):
            arm.status = "loss off"
            arm.reason = blamed.words if blamed is not None else ("a loss was not finite on another rank under this "
                                                                  "plan, and was finite there under the plain loop")
        elif against is not None and self._stop_reason(timed, against, elapsed):
            chunk.recheck = (arm, self._fastest(timed, elapsed), timed)  # bf16 emulated on a Zen 3 was 14x slower
            return self._go(against)
        else:
            arm.rounds[self.round] = self._step_s(timed, elapsed)
            if arm is self.plain:
                self.plain_wait[0] += run.data_wait_s - chunk.wait_at_start
                self.plain_wait[1] += elapsed
                if self.chunk_steps == 2 and len(arm.rounds) == 1:
                    self._pace(arm.rounds[self.round])
        self._next_turn()

    def _pace(self, step_s: float) -> None:
        settings = self.run.settings
        self.chunk_steps = chunk_steps(step_s, least=2, most=MOST_STEPS, target_s=self.run.chunk_s)
        if settings.budget_s is None:
            self.deadline = max(self.deadline, self.run.started + BUDGET_STEPS * step_s)
        if settings.expected_steps:
            self.deadline = min(self.deadline, self.run.started + EXPECTED_SHARE * settings.expected_steps * step_s)

    def _step_s(self, timed: int, elapsed: float) -> float:
        """The chunk's step: on a CPU the lower median of its timed steps (a spike of load lands on single steps, and
        most steps of a chunk are spared: an A/A test under seeded spikes of 30-150 steps chose the plain loop's twin
        by the chunks' means), elsewhere their mean (reading each step's time would wait for the device)."""
        steps = sorted(self.chunk.timed_s)
        return steps[(len(steps) - 1) // 2] if len(steps) == timed else elapsed / timed

    def _fastest(self, timed: int, elapsed: float | None = None) -> float:
        """The stop rule's evidence from this chunk: its fastest timed step on a CPU, its mean elsewhere."""
        return min(self.chunk.timed_s) if len(self.chunk.timed_s) == timed else (elapsed or 0.0) / timed

    def _stop_reason(self, timed: int, against: Arm, elapsed: float | None = None) -> str:
        name = "the plain loop" if against is self.plain else against.name
        return stop_reason(self._fastest(timed, elapsed), timed, beside(against.rounds, self.round), name)

    def _end_recheck(self, reference_s: float) -> None:
        """The reference was timed again right after the caught arm's chunk: the arm stops when it is still
        hopelessly slower than that; else it goes on, its disputed chunk no sample of the round."""
        (arm, fastest_s, timed), self.chunk.recheck = self.chunk.recheck, None
        name = "the plain loop" if self.reference is self.plain else self.reference.name
        why = stop_reason(fastest_s, timed, reference_s, name)
        if why:
            arm.status, arm.reason = "stopped early", why.replace("in the round beside it", "timed again right after it")

    # --- faults --------------------------------------------------------------------------------------------------

    def _chunk_fault(self) -> Fault | None:
        """On an accelerator, the chunk's first step whose loss was not finite (judged in the weights as they are)."""
        return next((Fault(step, self.active.name, calls) for step, losses, calls in self.chunk.record
                     if not finite(losses)), None)

    def _judge(self, fault: Fault):
        """Whose fault: the plan's, or the plain loop's too (replayed under it, nothing changed: fault.py)."""
        if self.active is self.plain:
            blamed = Blame(False, "the data or the loop", f"a loss was not finite at step {fault.step} under the "
                                                          "plain loop itself", fault.step, fault.arm)
        else:
            self.run.switch({})  # the plain loop, to replay the step's forward under
            with interrupts_held():  # the replay puts your model's weights back: never half-way
                blamed = blame(self.run.objects[0], fault, self.run.settings.tolerance, self.run.capture)
        if not blamed.plan:
            record(self.run.blames, blamed)
        return blamed


def finite(losses: list[torch.Tensor]) -> bool:
    return bool(torch.isfinite(torch.cat([loss.detach().float().reshape(-1) for loss in losses])).all())
