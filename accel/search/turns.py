"""The rounds of plan="auto" in your loop: the search's comparisons (strategy.py) measured on your own steps.

A comparison's plans take turns in chunks of your whole steps, the reference first in one round and last in the next;
a chunk is timed from the end of its first step after a switch to the end of its last. From the third round a decided
challenger stops taking turns (docs/measurement.md). Under a launcher every rank takes the slowest rank's times and
rank 0's clock (accel.distributed.agreement).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import accel.search.cache as plancache
from accel import clock
from accel.distributed.agreement import ChunkTimes
from accel.measure import SETTLE_BELOW_S, chunk_steps, round_order, synchronize
from accel.plan.contract import Capability
from accel.search.results import OUT, Arm, Comparison, admit, timing_fields
from accel.search.settings import SLOW_STOP, provides
from accel.search.words import say

MIN_ROUNDS = 3  # rounds of a comparison before any verdict
MAX_ROUNDS = 30
MOST_STEPS = 4  # timed steps of a chunk at most: 3 rounds of 2 plans end by the 30th step of a run of short steps
EXPECTED_SHARE = 0.3  # with expected_steps, the measurement spends at most this share of the plain run's time
STOP_COST_S = 0.5  # a candidate is stopped only once its slowness cost this much in one chunk
LEAST_STEPS = 2  # timed steps of the chunk before it can be stopped (one is a spike as much as a verdict)


def beside(reference: dict[int, float], round_index: int) -> float | None:
    """The reference's step (round -> seconds) in this round, else its latest before; None before it ran."""
    return max(((r, s) for r, s in reference.items() if r <= round_index), default=(None, None))[1]


def stop_reason(fastest_s: float, timed: int, reference_s: float | None, against: str = "the plain loop") -> str:
    """Why the candidate stops now ("" when it does not): the fastest of ``timed`` steps over SLOW_STOP reference
    steps, at a cost over STOP_COST_S."""
    if reference_s is None or reference_s <= 0 or timed < LEAST_STEPS or fastest_s <= SLOW_STOP * reference_s \
            or (fastest_s - reference_s) * timed <= STOP_COST_S:
        return ""
    return (f"its steps took {fastest_s:.3f} s or more, over {SLOW_STOP:g}x {against}'s {reference_s:.3f} s in the "
            "round beside it")


@dataclass
class Chunk:
    """The turn in progress: its steps, how it is timed so far, and what a fault is judged on."""

    steps: int = 0
    untimed: int = 1  # steps after the switch not timed (1, or 0 without a switch or on later turns of long steps)
    started: float = 0.0
    last_end: float = 0.0
    wait_at_start: float = 0.0  # the loop's data wait when its timing began
    timed_s: list[float] = field(default_factory=list)  # on a CPU, its timed steps
    recheck: tuple | None = None  # a challenger the stop rule caught: (arm, its fastest step, timed steps)

    def starts(self, at: float, wait_s: float) -> None:
        self.started, self.last_end, self.wait_at_start, self.timed_s = at, at, wait_s, []


class Turns:
    """Runs the search's comparisons on the steps of a plan="auto" run (inloop.InLoopSearch: ``run``)."""

    def __init__(self, run: Any):
        self.run, self.arms = run, [Arm({}, "measuring")]
        self.plain = self.reference = self.active = self.arms[0]
        self.comparisons, self.request = run.strategy.comparisons(), None
        self.challengers: list[Arm] = []
        self.round = self.first_round = 0
        self.order: list[Arm] = []  # the round's turns still to come
        self.chunk, self.chunk_steps = Chunk(), 2  # timed steps per chunk, paced after the plain loop's first
        self.deadline = run.settings.deadline(run.started)
        self.turn_began, self.note, self.cut = run.started, "", False  # cut: a verdict the budget left unclear

    def answer(self, outcomes: list[Arm] | None = None) -> None:
        """The strategy is sent these outcomes (None: it begins) and its next comparison begun; the run chooses at the
        first verdict and finishes after the last."""
        was = self.run.strategy.decided
        try:
            request = self.comparisons.send(outcomes)
        except StopIteration:  # a rebuilt loader is decided by the loop's wait for data: the plain loop's, timed alone
            # if no comparison timed it
            if self.plain.rounds or not self.run.epochwise or (self.request and not self.request.challengers):
                return self.run.finish()
            return self._begin(Comparison({}, [], (), "the plain loop alone, for your loop's wait for data"))
        if self.run.strategy.decided and not was:
            self.run.choose()
        self._begin(request)

    def _begin(self, request: Comparison) -> None:
        run, self.request, self.reference = self.run, request, self.arm(request.reference)
        self.deadline, self.note, unmeasured = admit(request, run.settings, run.cache_key, self.deadline, run.steps,
                                                     self.reference.median_s(), run.ranks.decide)  # rank 0's clock
        if unmeasured:
            self.cut = self.cut or unmeasured[0].reason == OUT
            return self.answer(unmeasured)
        if request.costly:
            run.faults.remove()  # compile would trace hooks on the model: no replay from here
        self.challengers = [self.arm(plan) for plan in request.challengers]
        for arm in self.challengers:
            if arm.status in ("waiting", "measuring", "measured"):  # one that could not run before is not tried again
                arm.against, arm.status, arm.reason = self.reference, "measuring", ""
        self.reference.status, self.first_round = "measuring", self.round
        self._next_round() if self._live() or not request.challengers else self._end_comparison()

    def _end_comparison(self) -> None:
        reference, challengers, self.challengers = self.reference, self.challengers, []
        for arm in challengers:
            arm.ratio, arm.reference_s, arm.note = arm.ratio_to(reference), reference.median_s(), self.note
            if arm.status in ("measuring", "measured"):
                arm.status, arm.reason = ("measured", arm.reason) if arm.ratio.samples else ("not measured", OUT)
            if self.request.costly and arm.first_s is not None:
                arm.first_s = self.run.ranks.slowest(arm.first_s)  # the warm-up every rank waited for
            arm.fields, arm.warmup_s = timing_fields(arm.median_s(), arm.first_s), (arm.first_s or 0.0) - (
                arm.reference_s or 0.0)
            if self.request.costly and arm.first_s is not None:
                plancache.remember_warmup(self.run.cache_key, self.request.added, arm.warmup_s, self.run.settings.cache)
        reference.status = "measured" if reference is not self.plain else reference.status
        self.answer(challengers)

    def arm(self, plan: dict[str, dict]) -> Arm:
        if all(a.plan != plan for a in self.arms):
            self.arms.append(Arm(dict(plan), "waiting"))
        return next(a for a in self.arms if a.plan == plan)

    def _live(self) -> list[Arm]:
        return [a for a in self.challengers if a.status == "measuring"]

    def _next_round(self) -> None:
        self.order = round_order([self.reference, *self._live()], self.round - self.first_round, rotate=False)
        self._next_turn(first=True)

    def _next_turn(self, first: bool = False) -> None:
        if not first and self.run.ranks.past(self.deadline, clock.now()):  # never past by more than one chunk
            self.cut = self.cut or bool(self._live())
            return self._end_comparison()
        self.order = [a for a in self.order if a.status == "measuring"]
        if self.order:
            return self._go(self.order.pop(0))
        self.round += 1
        if self.round - self.first_round >= MIN_ROUNDS:
            for arm, ratio in ((a, a.ratio_to(self.reference)) for a in self._live()):  # more rounds would not
                if ratio.below(max(self.request.thresholds)) or ratio.above(min(self.request.thresholds)):  # change it
                    arm.status = "measured"
        alone = not self.request.challengers and self.round - self.first_round < MIN_ROUNDS  # the plain loop alone
        if not (self._live() or alone) or self.round - self.first_round >= MAX_ROUNDS:
            return self._end_comparison()
        self._next_round()

    def _go(self, arm: Arm) -> None:
        self.turn_began = clock.now()  # before the deadline, always: _next_turn checks it first
        switched = self.run.switch(arm.plan, arm)
        if switched is None:  # refused or failed: its status says why; a recheck waiting for it goes unjudged
            self.chunk.recheck = None
            return self._next_turn()
        self.active, self.chunk.steps, self.run.faults.record = arm, 0, []
        # steps of 2 s or more are timed from the switch on a plan's later turns (not a costly plan's: it may build)
        long_steps = all(a.rounds and min(a.rounds.values()) >= SETTLE_BELOW_S for a in (self.reference, arm))
        later = arm.first_s is not None and (not switched or long_steps and not provides(
            arm.plan, Capability.SETUP_COSTLY))
        self.chunk.untimed = 0 if later else 1
        if later:
            self.chunk.starts(self.run.switched_at, self.run.loader.waited_s)
        say(self.run)

    def before_update(self) -> None:
        spent = self.run.faults.before_update(self.run.steps + 1, self.active.name, self.run.device.type == "cpu",
                                              self.active is not self.plain)
        self.chunk.started, self.chunk.last_end = self.chunk.started + spent, self.chunk.last_end + spent

    def after_step(self) -> None:
        chunk, arm, run = self.chunk, self.active, self.run
        chunk.steps += 1
        arm.steps += 1
        if chunk.steps == chunk.untimed:  # the step after a switch
            synchronize(run.device)
            now = clock.now()
            arm.first_s = now - run.switched_at if arm.first_s is None else arm.first_s
            return chunk.starts(now, run.loader.waited_s)
        timed, against = chunk.steps - chunk.untimed, None if arm is self.reference else self.reference
        if run.device.type == "cpu":  # (on an accelerator, reading the time every step would wait for the device)
            now = clock.now()
            chunk.timed_s.append(now - chunk.last_end)
            chunk.last_end = now
        # mid-chunk the stop rule reads this rank's clock: with several ranks a chunk runs to its end
        if timed < self.chunk_steps and (against is None or run.device.type != "cpu" or run.ranks.world_size > 1
                                         or not self._stop_reason(timed, against)):
            return
        synchronize(run.device)
        fault = run.faults.chunk_fault(arm.name)
        agreed = run.ranks.chunk(ChunkTimes(clock.now() - chunk.started, tuple(chunk.timed_s), fault is not None))
        chunk.timed_s, elapsed = list(agreed.step_s), agreed.seconds
        if agreed.nonfinite and arm is not self.plain:  # the plain loop judges it, every rank there together (ddp's
            run.switch({})  # wrapping is collective)
        blamed = run.faults.judge(fault, arm is self.plain) if fault is not None else None
        step_s, fastest = self._steps(timed, elapsed)
        if chunk.recheck is not None:  # this chunk timed the reference again, for the arm caught before it
            caught, its_fastest, count = chunk.recheck
            chunk.recheck, why = None, stop_reason(its_fastest, count, step_s, self.reference.name)
            if why:
                caught.status, caught.reason = "stopped early", why.replace("in the round beside it",
                                                                            "timed again right after it")
        elif run.ranks.any_true(blamed is not None and blamed.plan):
            arm.status, arm.reason = "loss off", (blamed.words if blamed is not None else "a loss was not finite on "
                                                  "another rank under it, and was finite there under the plain loop")
        elif against is not None and self._stop_reason(timed, against, elapsed):
            chunk.recheck = (arm, fastest, timed)
            return self._go(against)
        else:
            arm.rounds[self.round] = step_s
            if arm is self.plain:
                run.loader.plain[0] += run.loader.waited_s - chunk.wait_at_start
                run.loader.plain[1] += elapsed
                if len(arm.rounds) == 1:
                    self._pace(step_s)
        self._next_turn()

    def _pace(self, step_s: float) -> None:
        settings = self.run.settings
        self.chunk_steps = chunk_steps(step_s, least=2, most=MOST_STEPS, target_s=self.run.chunk_s)
        self.deadline = max(self.deadline, settings.deadline(self.run.started, step_s))  # (a warm-up past it stays)
        if settings.expected_steps:
            self.deadline = min(self.deadline, self.run.started + EXPECTED_SHARE * settings.expected_steps * step_s)

    def _steps(self, timed: int, elapsed: float = 0.0) -> tuple[float, float]:
        """The chunk's step and the stop rule's evidence: on a CPU the lower median and the fastest of its timed steps
        (a spike lands on single steps), elsewhere their mean (reading each step's time would wait for the device)."""
        steps = self.chunk.timed_s
        return (statistics.median_low(steps), min(steps)) if len(steps) == timed else (elapsed / timed,) * 2

    def _stop_reason(self, timed: int, against: Arm, elapsed: float = 0.0) -> str:
        return stop_reason(self._steps(timed, elapsed)[1], timed, beside(against.rounds, self.round), against.name)
