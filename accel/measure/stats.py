"""Ratios with their uncertainty (a comparison on a busy machine means little without its interval), and plan labels."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from accel.plan import Plan

# one-sided 95% quantiles of Student's t by degrees of freedom (a ratio "clearly below x" has 95% confidence)
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}


def t95(df: int) -> float:
    """The nearest smaller df's (a slightly wider, never narrower, interval; beyond the table, its last)."""
    return T95[max(k for k in T95 if k <= df)] if df > 0 else math.inf


def summarize(times_s: list[float]) -> dict[str, float]:
    """Median, min, max, standard deviation (ms) and spread (max-min as % of the median) of step times."""
    ms = [t * 1000 for t in times_s]
    median = statistics.median(ms)
    return {"median_ms": round(median, 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3),
            "stdev_ms": round(statistics.stdev(ms), 3) if len(ms) > 1 else 0.0,
            "spread_pct": round(100 * (max(ms) - min(ms)) / median, 2) if median else 0.0}


@dataclass
class Ratio:
    """A time ratio (candidate / baseline) from interleaved rounds, with its 90% interval.

    Each sample is one round's ratio of the candidate's median step to the baseline's median step measured
    next to it, so a change in the machine's load hits both sides of a sample alike.
    """

    samples: list[float] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def estimate(self) -> float:
        return math.exp(statistics.fmean(math.log(s) for s in self.samples)) if self.samples else math.nan

    def _half_width(self) -> float:
        if len(self.samples) < 2:
            return math.inf
        logs = [math.log(s) for s in self.samples]
        return t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))

    @property
    def low(self) -> float:
        return self.estimate * math.exp(-self._half_width()) if self.samples else math.nan

    @property
    def high(self) -> float:
        return self.estimate * math.exp(self._half_width()) if self.samples else math.nan

    @property
    def median(self) -> float:
        """The middle round's ratio: what most rounds say, whatever a few heavy-tailed ones do to the mean."""
        return statistics.median(self.samples) if self.samples else math.nan

    def below(self, threshold: float) -> bool:
        """Confidently below ``threshold`` (95%, one-sided), and so in most rounds: a few rounds a load spike hit can
        carry the t-interval alone, never the median (docs/measurement.md)."""
        return self.high < threshold and self.median < threshold

    def above(self, threshold: float) -> bool:
        """Confidently above ``threshold``, and so in most rounds (as ``below``)."""
        return self.low > threshold and self.median > threshold

    def noisy(self) -> bool:
        """1.0 lies inside the interval, or the median round says otherwise than it: the two cannot be told apart."""
        return not (self.below(1.0) or self.above(1.0))

    def __str__(self) -> str:
        if not self.samples:
            return "not measured"
        if self.rounds < 2:
            return f"{self.estimate:.2f} (1 round)"
        # an interval clear of 1.0 that the median round does not follow is why no verdict was reached: say so
        split = (self.high < 1.0 <= self.median) or (self.low > 1.0 >= self.median)
        return f"{self.estimate:.2f} ({self.low:.2f}-{self.high:.2f}" + (
            f"; median round {self.median:.2f})" if split else ")")

    def to_dict(self) -> dict[str, Any]:
        finite = self.rounds >= 2
        return {"estimate": round(self.estimate, 4) if self.samples else None,
                "low": round(self.low, 4) if finite else None, "high": round(self.high, 4) if finite else None,
                "rounds": self.rounds, "samples": [round(s, 4) for s in self.samples]}


def paired(times: dict[int, float], reference: dict[int, float]) -> Ratio:
    """times / reference from the rounds both ran (round -> seconds per step): the ratio every comparison uses."""
    return Ratio([times[r] / reference[r] for r in sorted(times.keys() & reference.keys()) if reference[r] > 0])


def round_order(arms: list, index: int, rotate: bool = True) -> list:
    """The order of round ``index``: reversed every other round (A B C, C B A) so a drift in the machine's load
    hits every arm alike, and with ``rotate`` shifted every two rounds, so no arm always follows the same one."""
    shift = (index // 2) % len(arms) if rotate and arms else 0
    order = arms[shift:] + arms[:shift]
    return order[::-1] if index % 2 else order



def plan_label(plan: Any) -> str:
    """One name for a plan in every report and table: 'eager', 'auto', or the names in plan order joined by '+'."""
    if (isinstance(plan, str) and plan == "auto") or (hasattr(plan, "resolve") and not hasattr(plan, "names")):
        return "auto"
    return "+".join(Plan(plan).names()) or "eager"
