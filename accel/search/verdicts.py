"""What "faster", "no faster", "pays" and "a costly warm-up pays back" mean, in one place for every search.

A ratio is a challenger's step over a reference's (accel.measure.Ratio: a verdict needs its 90% interval and its
median round past the threshold); the margin is how much faster a plan must be to replace the one it is compared with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from accel.measure import Ratio

LONG_RUN_SHARE = 0.02  # in a run of known length, a costly warm-up may take this share of the run still ahead


def established(ratio: Ratio | None, margin: float) -> bool:
    """Faster than what it is compared with, with 95% confidence, and by more than the margin."""
    return ratio is not None and bool(ratio.samples) and ratio.below(1.0) and ratio.estimate <= 1 - margin


def pays(without: Ratio, margin: float) -> bool:
    """An accelerator shown to pay: the plan with it established faster than the plan without it (``without``: the
    step without it over the step with it). One not shown to pay goes: on vgg16 a budget that ran out kept threads on
    top, 1.04x slower, inside the interval."""
    return established(Ratio([1 / s for s in without.samples]), margin)


def decided(ratio: Ratio, thresholds: tuple[float, ...]) -> bool:
    """More rounds would not change its verdict: confidently below the highest threshold (faster; or an
    accelerator that does not pay) or above the lowest (no faster by the margin; or one that pays)."""
    return ratio.below(max(thresholds)) or ratio.above(min(thresholds))


def words(ratio: Ratio, margin: float) -> str:
    """'faster', 'not faster' (clearly not by the margin) or 'noisy' (the rounds cannot tell)."""
    if established(ratio, margin):
        return "faster"
    return "not faster" if ratio.above(1 - margin) or ratio.estimate > 1 else "noisy"


@dataclass(frozen=True)
class WarmupFit:
    """Whether a costly candidate's expected warm-up fits what the search may spend on it, and why (not)."""

    fits: bool
    guess_s: float
    known: str  # measured on this setup before, or assumed
    left_s: float  # the budget left
    ahead_s: float = 0.0  # the run still ahead at the best plan's step (expected_steps known), else 0

    @property
    def past_budget(self) -> bool:
        return self.fits and self.guess_s > self.left_s

    @property
    def allowance_s(self) -> float:
        return LONG_RUN_SHARE * self.ahead_s

    @property
    def reason(self) -> str:
        guess = f"its warm-up (about {self.guess_s:.0f} s, {self.known})"
        if self.past_budget:
            return (f"tried past the budget: {guess} is within {LONG_RUN_SHARE:.0%} of the run still ahead "
                    f"({self.ahead_s:.0f} s at the best plan's step), and a second run starts warm")
        return (f"{guess} does not fit the {max(self.left_s, 0):.0f} s of budget left"
                + (f", nor {LONG_RUN_SHARE:.0%} of the run still ahead ({self.ahead_s:.0f} s)" if self.ahead_s else ""))


def run_ahead_s(expected_steps: int | None, steps_done: int, step_s: float | None) -> float:
    """The seconds the run still has ahead at this step time, when its length is known (else 0)."""
    return max(expected_steps - steps_done, 0) * step_s if expected_steps and step_s else 0.0


def warmup_fit(guess_s: float, known: str, left_s: float, ahead_s: float = 0.0) -> WarmupFit:
    """A warm-up longer than the budget left would run the search far past it; but in a run known to be long (2,000
    steps of 0.5 s: 1,000 s ahead) a 20 s one is worth risking once: kept only if it pays back."""
    return WarmupFit(left_s >= guess_s or guess_s <= LONG_RUN_SHARE * ahead_s, guess_s, known, left_s, ahead_s)


def payback(ratio: Ratio, step_s: float, extra_warmup_s: float, margin: float,
            expected_steps: int | None) -> tuple[bool, int | None, bool]:
    """A costly accelerator's verdict: (faster, the step its extra warm-up pays back at, kept)."""
    gain_s = step_s * (1 - ratio.estimate) if ratio.samples else 0.0
    break_even = math.ceil(extra_warmup_s / gain_s) if gain_s > 0 else None
    faster = bool(ratio.samples) and ratio.below(1 - margin / 2) and ratio.estimate <= 1 - margin
    return faster, break_even, faster and (expected_steps is None or (break_even or math.inf) < expected_steps)
