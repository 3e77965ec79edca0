"""The verdicts both searches reach, in one place: tune() on copies (search.py, strategies.py) and plan="auto" in
your loop (inloop.py and its parts) judge a ratio and a costly candidate by these functions alone, so the two
cannot drift apart in what "faster", "no faster" or "compile pays" means.

A ratio is a challenger's step time over a reference's (accel.measure.Ratio, with its 95% interval). The margin
is how much faster a plan must be to replace the one it is compared with (config.MARGIN). Inside both searches a
plan is a ``dict[str, dict]`` (what ``Plan.to_dict()`` gives); Plan appears only at their edges (the user's
candidates in, the TuneResult out).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from accel.search.remembered import expected_warmup
from accel.measure import Ratio


def established(ratio: Ratio | None, margin: float) -> bool:
    """Faster than what it is compared with, with 95% confidence, and by more than the margin."""
    return ratio is not None and bool(ratio.samples) and ratio.below(1.0) and ratio.estimate <= 1 - margin


def no_faster(ratio: Ratio, margin: float) -> bool:
    """Confidently not faster by the margin: it could never be kept, so more rounds would only cost time."""
    return ratio.above(1 - margin)


def undecided(ratio: Ratio, margin: float) -> bool:
    """Neither established faster nor confidently no faster by the margin."""
    return not (established(ratio, margin) or no_faster(ratio, margin))


def verdict(ratio: Ratio, margin: float) -> str:
    """'faster' (established), 'not faster' (clearly not by the margin), or 'noisy' (cannot tell)."""
    if established(ratio, margin):
        return "faster"
    return "not faster" if no_faster(ratio, margin) or ratio.estimate > 1 else "noisy"


def slower(ratio: Ratio, margin: float) -> bool:
    """Confidently slower than the best by more than the margin: dropped."""
    return ratio.above(1 + margin)


def clearly_faster(ratio: Ratio, margin: float) -> bool:
    """Confidently faster by the whole margin (its interval below 1 - margin): the last arm left may settle."""
    return ratio.below(1 - margin)


def alike(ratio: Ratio, margin: float) -> bool:
    """Confidently within the margin of the best either way: the one with more accelerators is not needed."""
    return ratio.below(1 + margin) and ratio.above(1 - margin)


# --- the compile-last rule: a costly candidate (compile) goes on top of the best plan, last --------------------

@dataclass(frozen=True)
class WarmupFit:
    """Whether a costly candidate's expected warm-up fits the budget left, and why not when it does not."""

    fits: bool
    guess_s: float
    known: str  # how the guess is known: measured on this setup before (warm or cold), or assumed
    left_s: float

    @property
    def reason(self) -> str:
        return (f"its warm-up (about {self.guess_s:.0f} s, {self.known}) does not fit the {max(self.left_s, 0):.0f} s "
                "of budget left")


def warmup_fit(candidate: dict[str, dict], facts: dict[str, Any] | None, cache: Any, warm: bool,
               left_s: float) -> WarmupFit:
    """Started on whatever budget is left, a warm-up longer than it would run the search far past it."""
    guess, known = expected_warmup(candidate, facts, cache, warm)
    return WarmupFit(left_s >= guess, guess, known, left_s)


def settled_enough(ratio: Ratio, margin: float) -> bool:
    """A costly candidate's rounds may end: it is confidently faster than half the margin, or confidently not
    faster by the margin."""
    return ratio.below(1 - margin / 2) or ratio.above(1 - margin)


def payback(ratio: Ratio, step_s: float, extra_warmup_s: float, margin: float,
            expected_steps: int | None) -> tuple[bool, int | None, bool]:
    """A costly accelerator's verdict (compile): (faster, the step its extra warm-up pays back at, kept)."""
    gain_s = step_s * (1 - ratio.estimate) if ratio.samples else 0.0
    break_even = math.ceil(extra_warmup_s / gain_s) if gain_s > 0 else None
    faster = bool(ratio.samples) and ratio.below(1 - margin / 2) and ratio.estimate <= 1 - margin
    pays = faster and (expected_steps is None or (break_even is not None and break_even < expected_steps))
    return faster, break_even, pays
