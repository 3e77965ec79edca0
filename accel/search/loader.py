"""run.loader of plan="auto" in your loop: one object across the search's plan switches, your batches prepared by the
plan in place. It keeps what the search knows of your data: the loop's wait for each batch, which decides a rebuilt
loader (workers), and the rebuilt loader chosen, which joins at the next epoch's start."""
from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from typing import Any

from accel import clock
from accel.measure import plan_label
from accel.plan import Plan
from accel.plan.contract import Capability
from accel.search.results import TuneRow, keep_answer
from accel.search.settings import provides
from accel.search.words import verdict

DATA_WAIT = 0.10  # a rebuilt loader (workers) pays when the loop waits this fraction of its step for data
DATA_STEPS = 8  # steps timed for the data wait alone, when no comparison timed the plain loop
JOINS = " joins at the next epoch"  # the why's words for a rebuilt loader chosen (replaced should it not join)


class SearchLoader:
    """Every other name is the run.loader's of the plan in place (a DeviceLoader)."""

    def __init__(self, run: Any):  # an inloop.InLoopSearch
        self.run, self.read = run, False  # read: your loop iterated it (the data wait and the cache's key need that)
        self.waited_s = 0.0  # the loop's wait for batches, all along
        self.plain = [0.0, 0.0]  # the wait and the time of the plain loop's timed steps
        self.timing: tuple | None = None  # (began, waited_s, step) while the wait alone is timed (): from the next step
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

    def timed(self, step: int) -> bool:
        """After each step while only the plain loop's data wait is timed: True once DATA_STEPS steps are (then the
        search finishes, its rebuilt loader decided by that wait)."""
        if not self.timing:
            self.timing = (clock.now(), self.waited_s, step)
            return False
        began, wait, first = self.timing
        if step - first < DATA_STEPS:
            return False
        self.plain = [self.waited_s - wait, clock.now() - began]
        return True

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
                      "place", RuntimeWarning, stacklevel=3)  # your loop's iter(run.loader)
