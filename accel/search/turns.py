"""The turns of plan="auto" in your loop: arms take turns in chunks of your steps, a round at a time, and after
each round the verdicts (verdicts.py) drop what cannot win.

A chunk is timed from the end of its first step (the one after a switch; for steps of 2 s or more, from the
switch on an arm's later turns) to the end of its last: whole steps, with your data loading, your code, forward,
backward and update. The order reverses every round (A B C, C B A, ...), so a change in the machine's load hits
every arm alike. An arm hopelessly slower than the plain loop's round beside it stops mid-chunk (stoprule.py), and
its reference (the plain loop) is timed again at once: the arm is dropped only when it is still hopelessly slower
than that fresh chunk, so a machine that got busy between the two chunks drops nothing (the disputed chunk is no
sample of the round).

Two seams, a method each: ``_step_time_of_chunk`` (a chunk's timed steps become the arm's step time in that
round) and ``_next_arm`` (which arm takes the next turn); a job of several ranks agrees on both there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from accel import clock
from accel.plan.contract import REGISTRY
from accel.search.arms import Arm
from accel.search.ranks import ChunkTimes
from accel.search.stoprule import beside, stop_reason
from accel.search.verdicts import alike, clearly_faster, no_faster, slower
from accel.measure import SETTLE_BELOW_S, round_order, synchronize

MIN_ROUNDS = 3  # rounds before any verdict
MAX_ROUNDS = 30


@dataclass
class Chunk:
    """The turn in progress: the steps it has taken, how it is timed so far, and what a fault is judged on."""

    steps: int = 0  # steps since the switch
    untimed: int = 1  # steps after the switch not timed (1, or 0 on later turns of long steps)
    started: float = 0.0  # when its timing began
    last_end: float = 0.0  # when its last step ended
    wait_at_start: float = 0.0  # the run's data wait when its timing began
    timed_s: list[float] = field(default_factory=list)  # on a CPU, its timed steps (the stop rule's evidence)
    record: list[tuple[int, list, list]] = field(default_factory=list)  # on an accelerator: (step, losses, forwards)


@dataclass(frozen=True)
class Recheck:
    """An arm the stop rule caught, waiting for the chunk of its reference that is timed right after it."""

    arm: Arm
    fastest_s: float  # its chunk's fastest timed step (on an accelerator, the mean)
    timed: int


class TurnTaking:
    """The turns of a TuningRun (inloop.py), apart because it is one job."""

    def _after_step(self) -> None:
        self.chunk.steps += 1
        self.active.steps += 1
        if self.chunk.steps == self.chunk.untimed:  # the step after a switch, when it is not timed (untimed is 1)
            synchronize(self.device)
            now = clock.now()
            if self.active.first_s is None:
                self.active.first_s = now - self.switched_at
            self._chunk_starts(now)
            return
        arm = self.active
        timed = self.chunk.steps - self.chunk.untimed
        against = self._against(arm)
        if self.device.type == "cpu":  # (on an accelerator, reading the time every step would wait for the device)
            now = clock.now()
            self.chunk.timed_s.append(now - self.chunk.last_end)
            self.chunk.last_end = now
        # mid-chunk, the stop rule reads this rank's clock: with several ranks a chunk runs to its end (its verdict
        # is then taken on the slowest rank's steps, the same on every rank)
        if timed < self.chunk_steps and (against is None or self.device.type != "cpu" or self.ranks.world_size > 1
                                         or not self._stop_reason(timed, against)):
            return
        synchronize(self.device)
        elapsed = clock.now() - self.chunk.started
        fault = self.fault or self._chunk_fault()
        self.fault, self.chunk.record = None, []
        self.losses.clear()
        elapsed, blamed, plan_blamed = self._agree_on_chunk(elapsed, fault)
        if self.recheck is not None:  # this chunk timed the reference again, for the arm caught before it
            self._end_recheck(self._step_time_of_chunk(elapsed, timed))
            self._next_turn()
            return
        if plan_blamed:
            arm.status, arm.reason = "loss off", (blamed.words if blamed is not None and blamed.plan else
                                                  "a loss was not finite on another rank under this plan, and was "
                                                  "finite there under the plain loop")
        elif against is not None and self._stop_reason(timed, against, elapsed):
            # bf16 emulated on a CPU without it was 14x slower: it may get no more turns, once its reference,
            # timed again now, confirms it (a machine that got busy since the reference's chunk slows both)
            self.recheck = Recheck(arm, self._fastest(timed, elapsed), timed)
            self._go(against)
            return
        else:
            arm.rounds[self.round] = self._step_time_of_chunk(elapsed, timed)
        if arm is self.plain:
            self.plain_wait[0] += self.data_wait_s - self.chunk.wait_at_start
            self.plain_wait[1] += elapsed
            if self.round == 0 and self.chunk_steps == 2:
                self._pace(elapsed / timed)
        self._next_turn()

    def _agree_on_chunk(self, elapsed: float, fault):
        """The chunk as every rank takes it (ranks.py; in a single process, this rank's own): the slowest rank's
        seconds and steps, and whether the arm pays for a loss that was not finite on any rank (judged where it
        happened, under the plain loop every rank switches to together: ddp's wrapping is collective)."""
        agreed = self.ranks.chunk(ChunkTimes(elapsed, tuple(self.chunk.timed_s), fault is not None))
        self.chunk.timed_s = list(agreed.step_s)
        if agreed.nonfinite and self.ranks.world_size > 1 and self.active is not self.plain:
            self._switch({})
        blamed = self._judge(fault) if fault is not None else None
        return agreed.seconds, blamed, self.ranks.any_true(blamed is not None and blamed.plan)

    def _step_time_of_chunk(self, elapsed: float, timed: int) -> float:
        """Seam: the seconds per step this chunk gives its arm for this round (this process's own)."""
        return elapsed / timed

    def _chunk_starts(self, at: float) -> None:
        self.chunk.started, self.chunk.last_end, self.chunk.wait_at_start = at, at, self.data_wait_s
        self.chunk.timed_s = []

    def _against(self, arm: Arm) -> Arm | None:
        """What an arm's turn is compared with: the plain loop, or in compile's rounds the winner under it."""
        reference = self.winner if self.phase == "compile" else self.plain
        return None if arm is reference or reference is None else reference

    def _fastest(self, timed: int, elapsed: float | None = None) -> float:
        """The stop rule's evidence from this chunk: its fastest timed step on a CPU, its mean elsewhere."""
        return min(self.chunk.timed_s) if len(self.chunk.timed_s) == timed else (elapsed or 0.0) / timed

    def _stop_reason(self, timed: int, against: Arm, elapsed: float | None = None) -> str:
        """The stop rule (stoprule.py) on this chunk, against the step of ``against`` in the round beside it."""
        name = "the plain loop" if against is self.plain else against.name
        return stop_reason(self._fastest(timed, elapsed), timed, beside(against.rounds, self.round), name)

    def _end_recheck(self, reference_s: float) -> None:
        """The reference was timed again right after the caught arm's chunk: the arm stops when it is still
        hopelessly slower than that; else it goes on, its disputed chunk no sample of the round."""
        check, self.recheck = self.recheck, None
        name = "the plain loop" if self.active is self.plain else self.active.name
        why = stop_reason(check.fastest_s, check.timed, reference_s, name)
        if why:
            check.arm.status = "stopped early"
            check.arm.reason = why.replace("in the round beside it", "timed again right after it")

    def _live(self) -> list[Arm]:
        return [a for a in self.arms if a.status == "measuring"]

    def _next_round(self) -> None:
        live = self._live()
        self.order = round_order(live, self.round, rotate=False)  # the plain loop stays first or last
        self.turn = -1
        self._go(self._next_arm())

    def _next_arm(self) -> Arm | None:
        """Seam: the arm whose turn is next in this round's order (one still measuring), or None at its end."""
        self.turn += 1
        while self.turn < len(self.order) and self.order[self.turn].status != "measuring":
            self.turn += 1
        return self.order[self.turn] if self.turn < len(self.order) else None

    def _next_turn(self) -> None:
        if self.ranks.past(self.deadline, clock.now()):  # never past the budget by more than the chunk just run
            self._end_compile() if self.phase == "compile" else self._settle("budget")
            return
        arm = self._next_arm()
        if arm is not None:
            self._go(arm)
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
            # a caught arm whose reference could not be timed again goes on unjudged: the next chunk is another
            # arm's, and its disputed chunk stays no sample of the round
            self.recheck = None
            self._next_turn()
            return
        self.active, self.chunk.steps = arm, 0
        self.search.update(self)  # the report says whose turn it is, and what the rounds so far measured
        # A step of 2 s or more is timed from the switch on an arm's later turns: what a switch leaves cold (caches,
        # the allocator) is small beside it, and an untimed step would cost a third of every turn.
        # compile is left out: a switch back to it may recompile (its hooks' guards), and that is not its step.
        long_steps = all(a.rounds and min(a.rounds.values()) >= SETTLE_BELOW_S for a in (self.plain, arm))
        costly = any(REGISTRY[name].costly_setup for name in arm.plan)
        self.chunk.untimed = 0 if arm.first_s is not None and long_steps and not costly else 1
        if not self.chunk.untimed:
            self._chunk_starts(self.switched_at)

    def _verdicts(self) -> None:
        """After a round: drop what is confidently slower than the best, confidently no faster than the plain loop
        by the margin, or no faster than the best and larger; settle when none is left, or when one is left and it
        is confidently faster than the plain loop by the margin."""
        if self.phase == "compile":
            self._compile_verdict()
            return
        if self.round + 1 - self.phase_start < MIN_ROUNDS:
            return
        margin = self.settings.margin
        rivals = [a for a in self._live() if a is not self.plain and a.rounds]
        if not rivals:
            self._settle("no candidate could be timed")
            return
        for arm in rivals:  # it could only be kept faster than the plain loop by the margin: it is confidently not
            vs_plain = arm.ratio_to(self.plain)
            if no_faster(vs_plain, margin):
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
            if slower(ratio, margin):
                arm.status, arm.reason = "slower", f"{ratio} of {best.name}'s step"
            elif alike(ratio, margin) and len(arm.plan) > len(best.plan):
                arm.status, arm.reason = "not needed", f"{ratio} of {best.name}'s step, with more accelerators"
        left = [a for a in self._live() if a is not self.plain]
        if left == [best] and clearly_faster(best.ratio_to(self.plain), margin):
            self._settle("settled")
