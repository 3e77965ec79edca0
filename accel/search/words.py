"""What plan="auto" in your loop says at every moment, in the report: what it is measuring now, what it chose and
why, and what measuring cost. ``str(run.report)`` prints the words; ``run.report.to_dict()["search"]`` holds them
with the numbers behind them (rounds, steps, seconds).

Why: a run that ended before auto settled printed the plan in place as "applied" and "asked for"; later the words
were the search's own ("arm", "'s turn, not a choice"). A PyTorch user reads "measuring", "candidate", "chosen".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from accel.measure import plan_label

ASKED = "asked for"  # an accelerator's words for an option the plan gave: under auto, the plan was auto's


def label(plan: dict[str, dict] | None) -> str:
    return "the plain loop (nothing applied)" if not plan else plan_label(plan)


@dataclass
class Seen:
    """One candidate as far as it was measured."""

    name: str
    status: str  # measuring, measured, stopped early, loss off, refused, failed, not measured, waiting
    against: str = "the plain loop"  # what it is compared with
    ratio: str = ""  # "0.71 (0.66-0.77)": its step over the reference's, with the 90% interval
    estimate: float | None = None
    reason: str = ""
    rounds: int = 0
    step_ms: float | None = None


@dataclass
class SearchState:
    phase: str = "measuring"  # measuring, chosen (measuring what budget is left), settled, ended early
    since_step: int = 0  # the step auto began measuring at
    step: int = 0
    measuring: str = ""  # what is compared now
    in_place: dict[str, dict] = field(default_factory=dict)  # the plan in place now
    plain_ms: float | None = None  # the plain loop's step
    candidates: list[Seen] = field(default_factory=list)
    chosen: dict[str, dict] | None = None
    chosen_at: int | None = None  # the step of the first verdict
    settled_at: int | None = None  # the step the measuring ended at
    chosen_why: str = ""  # "0.56x the plain loop's step (0.54-0.58)"
    by: dict[str, str] = field(default_factory=dict)  # accelerator -> who chose it, on what measure
    faults: list[str] = field(default_factory=list)  # faults no candidate paid for (the data's, the loop's)
    cached: str = "nothing cached yet"
    how: str = ""  # how the measuring ended (settled, the budget, from the cache, resumed, ...)
    cost: dict[str, float] = field(default_factory=dict)  # measured_s, steps, extra_s, switch_s

    def choose(self, plan: dict[str, dict], step: int, why: str, cached: str, by: dict[str, str]) -> None:
        self.phase = "chosen" if self.phase == "measuring" else self.phase
        self.chosen, self.chosen_at, self.chosen_why, self.cached, self.by = dict(plan), step, why, cached, by

    # --- what the report shows --------------------------------------------------------------------------------

    def row_view(self, row: Any) -> Any:  # an accel.run.report.Row
        """The report's row of an accelerator in place, with who put it there: auto measuring it, or auto's choice."""
        if row.name not in self.in_place or row.status == "skipped":
            return row
        if self.chosen is not None and self.in_place == self.chosen:
            who, short = self.by.get(row.name, "chosen by plan='auto'"), "chosen by plan='auto'"
        elif self.phase == "ended early":
            who, short = "plan='auto' ended before any verdict: a candidate it was measuring, never chosen", \
                "plan='auto' (ended before a verdict)"
        else:
            who, short = "plan='auto' is measuring this candidate" + (
                f" against the chosen {label(self.chosen)}" if self.chosen is not None else ", not chosen yet"), \
                "plan='auto' (measuring)"
        changes = {k: (short if v == ASKED else v) for k, v in row.changes.items()}
        return dataclasses.replace(row, reason=who + (f"; {row.reason}" if row.reason else ""), changes=changes)

    def headline(self) -> str:
        if self.phase == "ended early":
            return (f"ended at step {self.step} while measuring, before any verdict: nothing chosen, nothing cached"
                    + (f"; measured so far: {self._so_far()}" if self._so_far() else ""))
        if self.chosen is None:
            return f"measuring since step {self.since_step} (now step {self.step}): {self.measuring}; nothing chosen yet"
        if self.phase == "chosen":
            place = "the choice" if self.in_place == self.chosen else f"{label(self.in_place)}, a candidate"
            return (f"chose {label(self.chosen)} so far: {self.chosen_why}; {self.cached}; first verdict at step "
                    f"{self.chosen_at}; with the budget left, now measuring {self.measuring} (in place now: {place})")
        when = (f"settled at step {self.settled_at}" if self.chosen_at == self.settled_at else
                f"first verdict at step {self.chosen_at}, settled at step {self.settled_at}")
        if self.how == "from the cache":
            return f"chose {label(self.chosen)} at step {self.settled_at} {self.chosen_why}"
        return f"chose {label(self.chosen)}: {self.chosen_why}; {self.cached}; {when}" + (
            f" ({self.how})" if self.how != "settled" else "")

    def _so_far(self) -> str:
        return "; ".join(f"{c.name} {c.ratio} of {c.against}'s step" for c in self.candidates if c.ratio)

    def lines(self) -> list[str]:
        body = [f"  the plain loop: {self.plain_ms:.1f} ms a step"] if self.plain_ms is not None else []
        for c in self.candidates:
            status = {"measured": "", "measuring": "measuring"}.get(c.status, c.status)
            ratio = f"{c.ratio} of {c.against}'s step" if c.ratio else ""
            said = ", ".join(part for part in (ratio, status, c.reason if c.reason not in ratio else "") if part)
            body.append(f"  candidate {c.name}: {said or 'not measured yet'}")
        cost = self.cost
        if cost.get("steps"):
            over = (f", {cost['extra_s']:.1f} s more than {label(self.chosen)} would have taken"
                    if self.chosen is not None else "")
            body.append(f"  cost: {cost['measured_s']:.1f} s measuring over {cost['steps']} steps{over}"
                        + (f" (switching plans: {cost['switch_s']:.1f} s)" if cost.get("switch_s", 0) >= 0.05 else ""))
        return [f"auto: {self.headline()}", *body, *(f"  {f}" for f in self.faults)]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "headline": self.headline()}

    def __str__(self) -> str:
        return "\n".join(self.lines())
