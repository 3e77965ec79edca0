"""run.loader of plan="auto" in your loop: one object across the search's plan switches, your batches prepared by the
plan in place, the loop's wait for each counted (a rebuilt loader is decided by it)."""
from __future__ import annotations

from typing import Any

from accel import clock

DATA_STEPS = 8  # steps timed for the data wait alone, when no comparison timed the plain loop


class SearchLoader:
    """Every other name is the run.loader's of the plan in place (a DeviceLoader)."""

    def __init__(self, run: Any):  # an inloop.InLoopSearch
        self.run = run

    def __iter__(self):
        run = self.run
        run.epoch_boundary()
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
