"""What plan="auto" in your loop says at every moment, in words a PyTorch user reads ("measuring", "candidate",
"chosen"): ``str(run.report)`` prints them, ``run.report.to_dict()["search"]`` holds the numbers behind them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from accel import clock
from accel.measure import plan_label
from accel.search.fault import summary
from accel.search.strategy import Arm

ASKED = "asked for"  # an accelerator's words for an option the plan gave: under auto, the plan was auto's
COPY = ("it trains a copy of your model, which a switch back to another plan would leave behind: measured apart on "
        "copies by accel.tune (or plan=accel.Auto(step_fn=...)), or ask for it in a plan")


def label(plan: dict[str, dict] | None) -> str:
    return "the plain loop (nothing applied)" if not plan else plan_label(plan)


@dataclass
class SearchState:
    phase: str = "measuring"  # measuring, chosen (measuring what budget is left), settled, ended early
    since_step: int = 0  # the step auto began measuring at
    step: int = 0
    measuring: str = ""  # what is compared now
    in_place: dict[str, dict] = field(default_factory=dict)  # the plan in place now
    plain_ms: float | None = None  # the plain loop's step
    candidates: list[dict[str, Any]] = field(default_factory=list)  # each as far as it was measured (_seen)
    chosen: dict[str, dict] | None = None
    chosen_at: int | None = None  # the step of the first verdict
    settled_at: int | None = None  # the step the measuring ended at
    chosen_why: str = ""  # "0.56x the plain loop's step (0.54-0.58, 90% interval)"
    by: dict[str, str] = field(default_factory=dict)  # accelerator -> who chose it, on what measure
    faults: list[str] = field(default_factory=list)  # faults no candidate paid for (the data's, the loop's)
    cached: str = "nothing cached yet"
    how: str = ""  # how the measuring ended (settled, the budget, from the cache, resumed...)
    cost: dict[str, float] = field(default_factory=dict)  # measured_s, steps, extra_s, switch_s

    def row_view(self, row: Any) -> Any:  # an accel.run.report.Row
        """An accelerator's row of the plan in place, with who put it there."""
        if row.name not in self.in_place or row.status == "skipped":
            return row
        if self.chosen is not None and self.in_place == self.chosen:
            who, short = self.by.get(row.name, "chosen by plan='auto'"), "chosen by plan='auto'"
        elif self.phase == "ended early":
            who = "plan='auto' ended before any verdict: a candidate it was measuring, never chosen"
            short = "plan='auto' (ended before a verdict)"
        else:
            who, short = "plan='auto' is measuring this candidate" + (
                ", not chosen yet" if self.chosen is None else f" against the chosen {plan_label(self.chosen)}"
                if self.chosen else " against the plain loop, chosen so far"), "plan='auto' (measuring)"
        changes = {k: (short if v == ASKED else v) for k, v in row.changes.items()}
        return dataclasses.replace(row, reason=who + (f"; {row.reason}" if row.reason else ""), changes=changes)

    def headline(self) -> str:
        so_far = "; ".join(f"{c['name']} {c['ratio']} of {c['against']}'s step" for c in self.candidates if c["ratio"])
        if self.phase == "ended early":
            return (f"ended at step {self.step} while measuring, before any verdict: nothing chosen, nothing cached"
                    + (f"; measured so far: {so_far}" if so_far else ""))
        if self.chosen is None:
            return (f"measuring since step {self.since_step} (now step {self.step}): {self.measuring}; "
                    "nothing chosen yet")
        if self.how == "from the cache":
            return f"chose {label(self.chosen)} at step {self.settled_at} {self.chosen_why}"
        head = (f"chose {label(self.chosen)}{' so far' if self.phase == 'chosen' else ''}: {self.chosen_why}; "
                f"{self.cached}")
        if self.phase == "chosen":
            place = "the choice" if self.in_place == self.chosen else f"{label(self.in_place)}, a candidate"
            return (f"{head}; first verdict at step {self.chosen_at}; with the budget left, now measuring "
                    f"{self.measuring} (in place now: {place})")
        when = (f"settled at step {self.settled_at}" if self.chosen_at == self.settled_at else
                f"first verdict at step {self.chosen_at}, settled at step {self.settled_at}")
        return f"{head}; {when}" + (f" ({self.how})" if self.how != "settled" else "")

    def lines(self) -> list[str]:
        body = [f"  the plain loop: {self.plain_ms:.1f} ms a step"] if self.plain_ms is not None else []
        for c in self.candidates:
            ratio = f"{c['ratio']} of {c['against']}'s step" if c["ratio"] else ""
            said = [part for part in (ratio, "" if c["status"] == "measured" else c["status"], c["reason"]) if part]
            body.append(f"  candidate {c['name']}: {', '.join(said) or 'not measured yet'}")
        cost = self.cost
        if cost.get("steps"):
            body.append(f"  cost: {cost['measured_s']:.1f} s measuring over {cost['steps']} steps" + (
                f", {cost['extra_s']:.1f} s more than {label(self.chosen)} would have taken" if self.chosen is not None
                else "") + (f" (switching plans: {cost['switch_s']:.1f} s)" if cost["switch_s"] >= 0.05 else ""))
        return [f"auto: {self.headline()}", *body, *(f"  {f}" for f in self.faults)]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "headline": self.headline()}

    def __str__(self) -> str:
        return "\n".join(self.lines())


def say(run: Any) -> None:
    """Bring the words up to date from an InLoopSearch, in place (every plan's report holds them)."""
    words, turns, result, strategy = run.search, run.turns, run.result, run.strategy
    words.step = run.current.steps
    words.in_place = {k: v for k, v in run.current.plan.to_dict().items() if k not in run.distributed}
    words.measuring = turns.request.what if turns.request is not None else ""
    words.plain_ms = round(turns.plain.median_s() * 1000, 3) if turns.plain.rounds else None
    if result is not None and words.phase in ("chosen", "settled"):
        plan = {k: v for k, v in result.plan.to_dict().items() if k not in run.distributed}
        if result.from_cache:
            why, by = (f"from the cache (measured on this setup {result.measured_at}, key {result.key[:12]}): "
                       "nothing measured"), f"chosen by plan='auto' from the cache (measured {result.measured_at})"
        elif words.how.startswith("resumed") or not strategy.best:
            why = result.why.split("; ")[0]
            by = f"taken by plan='auto' ({why})"
        else:
            why, by = strategy.gain, f"chosen by plan='auto': {strategy.gain}"
        words.chosen, words.chosen_why, words.by = plan, why, dict.fromkeys(plan, by)
        words.by.update({r.tests: f"chosen by plan='auto': {r.reason}" for r in result.rows  # the loader's wait
                         if r.decision == "chosen" and r.tests in plan and r.status == "by data wait"})
        words.cached = (f"cached for the next run of this setup (key {result.key[:12]})" if result.key else
                        "not cached (" + ("cache=False" if not run.settings.cache else "no batch was read for its key"
                                          if run.cache_key is None else "measured under a launcher: the cache keeps "
                                          "a single process's answers" if run.distributed else "the search could not "
                                          "establish its answer") + ")")
    chosen = words.chosen if words.phase in ("chosen", "settled") else None
    words.candidates = [_seen(a, chosen) for a in run.arms[1:] if a.status != "waiting" or a.rounds]
    words.candidates += [_seen(Arm(c, "not measured", COPY), None) for c in run.copies]
    words.faults = summary(run.faults.blames)
    elapsed, steps = (run.ended_at or clock.now()) - run.started, run.current.steps - words.since_step
    step_s = next((a.median_s() for a in run.arms if a.plan == chosen and a.rounds), None) or turns.plain.median_s()
    words.cost = {"measured_s": round(elapsed, 3), "steps": steps, "switch_s": round(run.switch_s, 3),
                  "extra_s": round(max(elapsed - steps * (step_s or 0.0), 0.0), 3)}


def _seen(arm: Arm, chosen: dict | None) -> dict[str, Any]:
    """One candidate as far as it was measured: its step over what it was compared with, with the 90% interval."""
    ratio = arm.ratio_to(arm.against) if arm.against is not None else None
    median, measured = arm.median_s(), ratio is not None and bool(ratio.samples)
    return {"name": arm.name, "status": "chosen" if arm.plan == chosen else arm.status,
            "against": "the plain loop" if arm.against is None or not arm.against.plan else arm.against.name,
            "ratio": str(ratio) if measured else "", "estimate": round(ratio.estimate, 4) if measured else None,
            "reason": arm.reason, "rounds": len(arm.rounds), "step_ms": round(median * 1000, 3) if median else None}
