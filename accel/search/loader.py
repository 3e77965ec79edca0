"""run.loader of plan="auto" in your loop: one object across the search's plan switches, your batches prepared by the
plan in place, the loop's wait for each counted (a rebuilt loader is decided by it)."""
from __future__ import annotations

from typing import Any

from accel import clock


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
