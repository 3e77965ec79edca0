"""The clock every measurement in accel reads: ``now()``, by default ``time.perf_counter()``.

One place, so that tests, and users replaying recorded step times, can install another clock for a block (``use``)
that the search cannot misread: under a clock that moves only when told, the machine's load cannot flip a verdict.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

_source: Callable[[], float] = time.perf_counter


def now() -> float:
    """Seconds from the installed clock (only differences mean anything)."""
    return _source()


@contextlib.contextmanager
def use(clock: Callable[[], float]) -> Iterator[Callable[[], float]]:
    """Read ``clock()`` instead of the current clock inside the block; the previous one is restored however the
    block ends. Process-wide: every thread measuring meanwhile reads it too."""
    global _source
    previous, _source = _source, clock
    try:
        yield clock
    finally:
        _source = previous
