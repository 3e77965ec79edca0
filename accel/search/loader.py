"""run.loader of plan="auto" in your loop: one object across the search's plan switches, your batches prepared by the
plan in place, the loop's wait for each counted (a rebuilt loader is decided by it)."""
from __future__ import annotations

import types
import warnings
from typing import Any

from accel import clock
from accel.measure import plan_label
from accel.search.results import TuneRow

DATA_WAIT = 0.10  # a rebuilt loader (workers) pays when the loop waits this fraction of its step for data
DATA_STEPS = 8  # steps timed for the data wait alone, when no comparison timed the plain loop


class SearchLoader:
    """Every other name is the run.loader's of the plan in place (a DeviceLoader)."""

    def __init__(self, run: Any):  # an inloop.InLoopSearch
        self.run = run

    def __iter__(self):
        run = self.run
        join_at_epoch(run)
        batches = iter(run.current.loader.start_epoch())
        while True:
            began = clock.now()
            batch = next(batches, StopIteration)
            if batch is StopIteration:
                return
            run.data_wait_s += clock.now() - began
            run.on_batch(batch)
            loader = run.current.loader
            if loader.drawn is not None:
                loader.drawn()
            yield loader.prepare(batch)

    def __len__(self) -> int:
        return len(self.run.current.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "run":
            raise AttributeError(name)
        return getattr(self.run.current.loader, name)


def time_data_wait(run: Any) -> None:
    """After each step while only the plain loop's data wait is timed: from the first step on, DATA_STEPS steps,
    then the search finishes (its rebuilt loader decided by that wait)."""
    if not run.data_timing:
        run.data_timing = (clock.now(), run.data_wait_s, run.current.steps)
    elif run.current.steps - run.data_timing[2] >= DATA_STEPS:
        began, wait, _ = run.data_timing
        run.turns.plain_wait = [run.data_wait_s - wait, clock.now() - began]
        run.finish()


def loader_rows(run: Any, chosen: dict, candidates: list[dict]) -> tuple[list[TuneRow], str]:
    """The rebuilt loaders' rows, each decided by the loop's wait for data (``chosen`` takes those that join), and
    what the answer's why says of them."""
    wait, spent = run.turns.plain_wait
    share = run.ranks.decide(wait / spent if spent else 0.0)  # every rank asks, whatever it decides
    rows, joining = [], []
    for candidate in candidates:
        row = TuneRow(plan_label(candidate), candidate, "by data wait", "eager", tests=next(iter(candidate)))
        if not run.loader_read:
            row.status, row.reason = "not measured", "your loop never iterated run.loader: its data wait is unknown"
        else:
            joins = share >= DATA_WAIT
            chosen.update(candidate if joins else {})
            joining += [row.name] if joins else []
            row.decision = "chosen" if joins else "not needed"
            row.reason = f"your loop waited {share:.0%} of its step for data" + (
                ": it joins at the next epoch" if joins else "")
        rows.append(row)
    return rows, (f"{', '.join(joining)} joins at the next epoch: your loop waited {share:.0%} of its step for data"
                  if joining else "")


def join_at_epoch(run: Any) -> None:
    """At an epoch's start, the rebuilt loader chosen joins (accelerate() again); one that cannot is said, in a
    warning and in its row, and the loop goes on with the plan in place."""
    if run.pending is None:
        return
    plan, run.pending = run.pending, None
    outcome = types.SimpleNamespace(status="", reason="")
    if run.switch(plan, outcome) is not None:
        return
    joining = [n for n in plan if n not in run.current.plan.to_dict()]
    for row in run.result.rows if run.result is not None else []:
        if row.decision == "chosen" and row.status == "by data wait":
            row.status, row.decision = outcome.status, ""
            row.reason = f"chosen, but it could not join: {outcome.reason}"
    warnings.warn(f"accel: plan='auto' chose {', '.join(joining)} for your loop's wait for data, and it could not "
                  f"join at this epoch ({outcome.status}: {outcome.reason}); your loop goes on with the plan in place",
                  RuntimeWarning, stacklevel=4)
