"""What "faster", "pays", "a costly warm-up pays back" and "hopelessly slower" mean, for every search: a ratio is a
challenger's step over a reference's (accel.measure.Ratio); the margin is how much faster a plan must be to replace
another. The stop rule is paired: a candidate stops mid-chunk only against its reference's step beside it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from accel.measure import Ratio
from accel.search.settings import SLOW_STOP

LONG_RUN_SHARE = 0.02  # in a run of known length, a costly warm-up may take this share of the run still ahead
STOP_COST_S = 0.5  # a candidate is stopped only once its slowness cost this much in one chunk
LEAST_STEPS = 2  # timed steps of the chunk before it can be stopped (one is a spike as much as a verdict)


def established(ratio: Ratio | None, margin: float) -> bool:
    """Faster than what it is compared with, with 95% confidence, and by more than the margin."""
    return ratio is not None and bool(ratio.samples) and ratio.below(1.0) and ratio.estimate <= 1 - margin


def pays(without: Ratio, margin: float) -> bool:
    """The plan with an accelerator established faster than without it (``without``: without over with)."""
    return established(Ratio([1 / s for s in without.samples]), margin)


def decided(ratio: Ratio, thresholds: tuple[float, ...]) -> bool:
    """More rounds would not change its verdict: confidently below the highest threshold or above the lowest."""
    return ratio.below(max(thresholds)) or ratio.above(min(thresholds))


def words(ratio: Ratio, margin: float) -> str:
    """'faster', 'not faster' (clearly not by the margin) or 'noisy' (the rounds cannot tell)."""
    if established(ratio, margin):
        return "faster"
    return "not faster" if ratio.above(1 - margin) or ratio.estimate > 1 else "noisy"


@dataclass(frozen=True)
class WarmupFit:
    """Whether a costly candidate's expected warm-up fits what the search may spend, and why (not)."""

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
    """It fits the budget left, or a small share of a run known to be long (then kept only if it pays back)."""
    return WarmupFit(left_s >= guess_s or guess_s <= LONG_RUN_SHARE * ahead_s, guess_s, known, left_s, ahead_s)


def payback(ratio: Ratio, step_s: float, extra_warmup_s: float, margin: float,
            expected_steps: int | None) -> tuple[bool, int | None, bool]:
    """A costly accelerator's verdict: (faster, the step its extra warm-up pays back at, kept)."""
    gain_s = step_s * (1 - ratio.estimate) if ratio.samples else 0.0
    break_even = math.ceil(extra_warmup_s / gain_s) if gain_s > 0 else None
    faster = bool(ratio.samples) and ratio.below(1 - margin / 2) and ratio.estimate <= 1 - margin
    return faster, break_even, faster and (expected_steps is None or (break_even or math.inf) < expected_steps)


def beside(reference: dict[int, float], round_index: int) -> float | None:
    """The reference's step (round -> seconds) in this round, else its latest before; None before it ran."""
    earlier = [r for r in reference if r <= round_index]
    return reference[max(earlier)] if earlier else None


def stop_reason(fastest_s: float, timed: int, reference_s: float | None, against: str = "the plain loop") -> str:
    """Why the candidate stops now ("" when it does not): the fastest of ``timed`` steps over SLOW_STOP reference
    steps, at a cost over STOP_COST_S."""
    if reference_s is None or reference_s <= 0 or timed < LEAST_STEPS or fastest_s <= SLOW_STOP * reference_s \
            or (fastest_s - reference_s) * timed <= STOP_COST_S:
        return ""
    return (f"its steps took {fastest_s:.3f} s or more, over {SLOW_STOP:g}x {against}'s {reference_s:.3f} s in the "
            "round beside it")
