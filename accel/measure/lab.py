"""Trials: candidate plans alive side by side on copies of the user's objects, measured interleaved."""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from accel import clock, randomness
from accel.api import accelerate
from accel.errors import MeasureError, PlanError
from accel.measure import SETTLE_BELOW_S, Ratio, TrainStep, chunk_steps, endless, paired, round_order, timed_steps
from accel.optim import copy_with_optimizer
from accel.plan import Plan


@dataclass
class Trial:
    """One plan applied to copies of the user's model and optimizer (over the user's loader), ready to step.
    ``check_losses``: its first steps' losses from the common start, on the same batches as every trial."""

    plan: dict[str, dict]
    run: Any = None
    error: str = ""
    status: str = "ready"  # ready, failed, refused
    check_losses: list[float] = field(default_factory=list)
    first_s: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # every timed step, seconds
    rounds: dict[int, float] = field(default_factory=dict)  # round -> median seconds per step in its chunk
    batches: Any = None

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def settled_step_s(self) -> float:
        """Its quickest first step after the very first (which holds the warm-up)."""
        return min(self.first_s[1:] or self.first_s)

    @property
    def warmup_s(self) -> float:
        """Time of the first steps beyond what as many steady steps take (compile and warm-up)."""
        steady = self.median_s or (min(self.first_s) if self.first_s else 0.0)
        return max(0.0, sum(self.first_s) - steady * len(self.first_s))


class Lab:
    """Measures plans on deep copies of the user's model and optimizer, interleaved: the loader's generator and
    torch's RNG restored before every trial's first steps and at the end; process-wide changes switched by journal."""

    round = 0  # rounds run so far, over every call of rounds(): a trial's rounds are keyed by it

    def __init__(self, model: torch.nn.Module, optimizer: Any, loader: Any, device: Any, step: TrainStep,
                 check_steps: int = 2):
        self.model, self.optimizer, self.loader, self.device, self.step = model, optimizer, loader, device, step
        self.check_steps = check_steps
        self.trials: list[Trial] = []
        self.active: Trial | None = None
        self.chunk_steps, self.settle = 1, 0
        self.start = randomness.save(loader)  # every trial's first steps start from here; close() comes back

    def copies(self) -> tuple[torch.nn.Module, Any]:
        try:
            return copy_with_optimizer(self.model, self.optimizer)
        except Exception as error:
            raise MeasureError(f"measuring copies your model and optimizer so that they stay untouched, and copying "
                               f"them failed: {type(error).__name__}: {error}") from error

    def trial(self, plan: Any) -> Trial:
        """Apply the plan to fresh copies and take its first steps from the common start (timed apart)."""
        try:
            trial = Trial(Plan(plan).to_dict())
        except PlanError as error:
            return Trial({}, status="refused", error=str(error))
        self.trials.append(trial)
        self.activate(None)
        model, optimizer = self.copies()
        try:
            trial.run = accelerate(model, optimizer, self.loader, plan=trial.plan, device=self.device)
        except PlanError as error:
            trial.status, trial.error = "refused", " ".join(str(error).split("\n")[1:]).strip()
            return trial
        except Exception as error:  # AccelerateError: applying failed and was rolled back
            trial.status, trial.error = "failed", str(error)
            return trial
        self.active = trial
        self.start.restore()
        iterator = iter(trial.run.loader)
        try:
            trial.first_s, trial.check_losses = timed_steps(trial.run, iterator, self.check_steps, self.step)
        except Exception as error:  # a plan that cannot train here is reported, not fatal
            trial.status, trial.error = "failed", f"{type(error).__name__}: {error}"
            self.retire(trial)
            return trial
        trial.batches = itertools.chain(iterator, endless(trial.run.loader))
        return trial

    def activate(self, trial: Trial | None) -> None:
        """Make this trial's process state current (threads, affinity, environment)."""
        if self.active is trial:
            return
        if self.active is not None and self.active.run is not None:
            self.active.run.journal.suspend()
        if trial is not None:
            trial.run.journal.resume()
        self.active = trial

    def chunk(self, trial: Trial, limit_s: float) -> float:
        """The trial's next steps, its median step in seconds (the first ``settle`` after a switch not counted)."""
        self.activate(trial)
        times: list[float] = []
        started = clock.now()
        for _ in range(self.settle + self.chunk_steps):
            seconds, _ = timed_steps(trial.run, trial.batches, 1, self.step)
            times += seconds
            if clock.now() - started > limit_s:
                break
        counted = times[self.settle:] or times[-1:]
        trial.times += counted
        return statistics.median(counted)

    def rounds(self, trials: list[Trial], reference: Trial, thresholds: tuple[float, ...], min_rounds: int = 3,
               max_rounds: int = 8, deadline: float = math.inf) -> dict[int, Ratio]:
        """Interleaved rounds, each in a rotated order: every trial's ratio to the reference, until every interval
        clears every threshold, the rounds run out, or the deadline passes (after two rounds)."""
        arms = [reference] + [t for t in trials if t is not reference]
        ratios = {id(t): Ratio() for t in arms if t is not reference}
        limit = max(2.0, 5 * (self.settle + self.chunk_steps) * (reference.median_s or 0.1))
        first = self.round
        for index in range(max_rounds):
            self.round += 1
            for trial in round_order(arms, index):
                try:
                    trial.rounds[self.round] = self.chunk(trial, limit_s=limit)
                except Exception as error:  # a plan that breaks later (out of memory, NaN checks): it leaves
                    if trial is reference:
                        raise
                    trial.status, trial.error = "failed", f"{type(error).__name__}: {error}"
                    arms.remove(trial)
                    self.retire(trial)
            for trial in arms[1:]:
                ratios[id(trial)] = paired({r: t for r, t in trial.rounds.items() if r > first}, reference.rounds)
            if len(arms) == 1:  # every challenger failed: nothing left to compare
                break
            decided = all(ratios[id(t)].below(x) or ratios[id(t)].above(x) for t in arms[1:] for x in thresholds)
            if (index + 1 >= min_rounds and decided) or (index + 1 >= 2 and clock.now() > deadline):
                break
        return ratios

    def pace(self, step_s: float, steps: int | None = None) -> None:
        """Steps per chunk: about CHUNK_S worth (at least one), and a settling step for steps under SETTLE_BELOW_S."""
        self.chunk_steps = steps or chunk_steps(step_s)
        self.settle = 1 if step_s < SETTLE_BELOW_S else 0

    def retire(self, trial: Trial) -> None:
        """Free a trial: its process changes undone, its copies released."""
        if trial.run is not None:
            if self.active is trial:
                self.activate(None)
            trial.run.journal.rollback()
            trial.run, trial.batches = None, None

    def close(self) -> None:
        self.activate(None)
        for trial in self.trials:
            self.retire(trial)
        self.start.restore()
