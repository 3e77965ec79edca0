"""What plan="auto" in your loop hands it besides the run: ``run.loader`` (your batches prepared by the plan in place,
the loop's wait for them timed) and, in words a PyTorch user reads ("measuring", "candidate", "chosen"), what it does
at every moment: ``str(run.report)`` prints them, ``run.report.to_dict()["search"]`` holds the numbers behind them."""
from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from accel import clock
from accel.errors import loops_level
from accel.measure import plan_label
from accel.plan import Plan
from accel.plan.contract import Capability
from accel.search.fault import summary
from accel.search.results import Arm, TuneResult, TuneRow, keep_answer
from accel.search.settings import provides

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


def verdict(run: Any, why: str = "", plan: dict | None = None, result: TuneResult | None = None) -> TuneResult:
    """The answer so far of an InLoopSearch (``result``: the cache's), remembered when established, and said: the
    table, with a rebuilt loader decided by the loop's wait for data; what was chosen, why and whether it is cached."""
    words, strategy = run.search, run.strategy
    if result is None:
        result = _table(run, why, plan)
        keep_answer(result, run.cache_key, run.settings.cache, strategy.established and not run.distributed and not why)
    chosen = {k: v for k, v in result.plan.to_dict().items() if k not in run.distributed}
    if result.from_cache:
        said, by = (f"from the cache (measured on this setup {result.measured_at}, key {result.key[:12]}): "
                    "nothing measured"), f"chosen by plan='auto' from the cache (measured {result.measured_at})"
    elif why or not strategy.best:
        said = result.why.split("; ")[0]
        by = f"taken by plan='auto' ({said})"
    else:
        said, by = strategy.gain, f"chosen by plan='auto': {strategy.gain}"
    words.chosen, words.chosen_why, words.by = chosen, said, dict.fromkeys(chosen, by)
    words.by.update({r.tests: f"chosen by plan='auto': {r.reason}" for r in result.rows  # the loader's wait
                     if r.decision == "chosen" and r.tests in chosen and r.status == "by data wait"})
    words.cached = (f"cached for the next run of this setup (key {result.key[:12]})" if result.key else
                    "not cached (" + ("cache=False" if not run.settings.cache else "no batch was read for its key"
                                      if run.cache_key is None else "measured under a launcher: the cache keeps "
                                      "a single process's answers" if run.distributed else "the search could not "
                                      "establish its answer") + ")")
    return result


def _table(run: Any, why: str, plan: dict | None) -> TuneResult:
    """The table and the answer so far (``plan``, ``why``: taken without a verdict, as a checkpoint's)."""
    strategy, plain, rows = run.strategy, run.turns.plain, list(run.strategy.rows)
    rows[0].median_ms = round(plain.median_s() * 1000, 3) if plain.rounds else None
    rows[0].vs_baseline, rows[0].reason = 1.0, f"{len(plain.rounds)} rounds, {plain.steps} steps"
    chosen = dict(strategy.best if plan is None else plan)
    loaders, loaded = run.loader.rows(chosen, run.epochwise if plan is None else [])
    rows += loaders + [TuneRow(plan_label(c), c, "not measured", reason=COPY) for c in run.copies]
    notes = run.notes + summary(run.faults.blames) + (
        ["your loop never iterated run.loader, so the cache was neither read nor written (its key needs a batch)"]
        if not run.loader.read and run.settings.cache and len(run.arms) > 1 else [])
    nothing = not strategy.candidates and not strategy.costly and not run.epochwise
    if loaded and not why and not strategy.best:  # the steps stay the plain loop's; the loader joins
        why = loaded
    else:
        why = (why or ("nothing to measure: no accelerator offers a candidate for this model on this hardware"
                       if nothing else strategy.why(f", at step {run.current.steps} of your loop"))
               ) + (f"; {loaded}" if loaded else "")
    record = {**run.settings.key(), "search": "your loop", "budget_s": round(run.turns.deadline - run.started, 1),
              "chosen_at_step": run.search.chosen_at, "settled_at_step": run.current.steps,
              "switch_s": round(run.switch_s, 3)}
    return run.for_ranks(TuneResult.measured(chosen, rows, why + "".join(f"; {n}" for n in notes), rows[0].median_ms,
                                             clock.now() - run.started, record, established=strategy.established))


def say(run: Any) -> None:
    """Bring the words of what auto does now up to date from an InLoopSearch, in place (every plan's report holds
    them)."""
    words, turns = run.search, run.turns
    words.step = run.current.steps
    words.in_place = {k: v for k, v in run.current.plan.to_dict().items() if k not in run.distributed}
    words.measuring = turns.request.what if turns.request is not None else ""
    words.plain_ms = round(turns.plain.median_s() * 1000, 3) if turns.plain.rounds else None
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
            "against": "the plain loop" if arm.against is None else arm.against.name,
            "ratio": str(ratio) if measured else "", "estimate": round(ratio.estimate, 4) if measured else None,
            "reason": arm.reason, "rounds": len(arm.rounds), "step_ms": round(median * 1000, 3) if median else None}


DATA_WAIT = 0.10  # a rebuilt loader (workers) pays when the loop waits this fraction of its step for data
JOINS = " joins at the next epoch"  # the why's words for a rebuilt loader chosen (replaced should it not join)


class SearchLoader:
    """run.loader: one object across the search's plan switches (every other name is the plan in place's loader's, a
    DeviceLoader). It keeps what the search knows of your data: the loop's wait for each batch, which decides a rebuilt
    loader (workers), and the rebuilt loader chosen, which joins at the next epoch's start."""

    def __init__(self, run: Any):  # an inloop.InLoopSearch
        self.run, self.read = run, False  # read: your loop iterated it (the data wait and the cache's key need that)
        self.waited_s = 0.0  # the loop's wait for batches, all along
        self.plain = [0.0, 0.0]  # the wait and the time of the plain loop's timed steps
        self.pending: dict | None = None  # the plan with a rebuilt loader chosen, joining at the next epoch

    def __iter__(self) -> Iterator[Any]:
        """The epoch begins at iter(), as iter(DataLoader) draws its seeds (zip(run.loader, other) keeps both orders):
        a rebuilt loader chosen joins, and the plan in place's loader starts its epoch."""
        self.join()
        return self._timed(self.run.current.loader.start_epoch())

    def _timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Each batch as the plan in place prepares it, the loop's wait for it counted."""
        began = clock.now()
        for batch in batches:
            self.waited_s += clock.now() - began
            self.read = True
            self.run.on_batch(batch)
            loader = self.run.current.loader
            if loader.drawn is not None:
                loader.drawn()
            yield loader.prepare(batch)
            began = clock.now()

    def __len__(self) -> int:
        return len(self.run.current.loader)

    def __getattr__(self, name: str) -> Any:
        if "run" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.run.current.loader, name)

    def now(self, plan: dict[str, dict]) -> dict[str, dict]:
        """The chosen plan to take now: a rebuilt loader in it waits (pending) for the next epoch's start."""
        now = {k: v for k, v in plan.items() if not provides({k: v}, Capability.DATA_LOADER)}
        self.pending = plan if now != plan else None
        return now

    def rows(self, chosen: dict, candidates: list[dict]) -> tuple[list[TuneRow], str]:
        """The rebuilt loaders' rows, each decided by the loop's wait for data (``chosen`` takes those that join), and
        what the answer's why says of them."""
        wait, spent = self.plain
        share = self.run.ranks.decide(wait / spent if spent else 0.0)  # every rank asks, whatever it decides
        joins = self.read and share >= DATA_WAIT
        rows = [TuneRow(plan_label(c), c, "by data wait", "eager", tests=next(iter(c))) for c in candidates]
        for row in rows:
            if not self.read:
                row.status, row.reason = "not measured", "your loop never iterated run.loader: its data wait is unknown"
            else:
                row.decision = "chosen" if joins else "not needed"
                row.reason = f"your loop waited {share:.0%} of its step for data" + (
                    ": it joins at the next epoch" if joins else "")
            chosen.update(row.plan if joins else {})
        return rows, (f"{', '.join(r.name for r in rows)}{JOINS}: your loop waited {share:.0%} of its step for data"
                      if joins and rows else "")

    def join(self) -> None:
        """At an epoch's start, the rebuilt loader chosen joins (accelerate() again); one that cannot is said, in a
        warning and in its row, and the loop goes on with the plan in place."""
        if self.pending is None:
            return
        run, plan, self.pending = self.run, self.pending, None
        outcome = types.SimpleNamespace(status="", reason="")
        if run.switch(plan, outcome) is not None:
            return
        joining = [n for n in plan if n not in run.current.plan.to_dict()]
        result = run.result
        if result is not None:  # the answer is the plan in place: the table and the why say so, and the words from them
            for row in result.rows:
                if row.decision == "chosen" and row.status == "by data wait":
                    row.status, row.decision = outcome.status, ""
                    row.reason = f"chosen, but it could not join: {outcome.reason}"
            result.plan = Plan({k: v for k, v in result.plan.to_dict().items() if k not in joining})
            result.why = result.why.replace(JOINS, f" could not join ({outcome.status})")
            # the remembered answer too (measured here, or the cache's): a replay would carry the loader again
            keep_answer(result, run.cache_key, run.settings.cache, bool(result.key) and not run.distributed)
            verdict(run, result=result)
        warnings.warn(f"accel: plan='auto' chose {', '.join(joining)} for your loop's wait for data, and it could not "
                      f"join at this epoch ({outcome.status}: {outcome.reason}); your loop goes on with the plan in "
                      "place", RuntimeWarning, stacklevel=loops_level())  # your loop's iter(run.loader)
