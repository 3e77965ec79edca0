"""The settings of a search (plan="auto", accel.Auto, accel.tune): what a search may spend and what it must keep."""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable

MARGIN = 0.02  # a plan must be faster than the one it replaces by more than this fraction
MIN_BUDGET_S = 90.0  # default budget: at least this, or BUDGET_STEPS baseline steps for slow models
BUDGET_STEPS = 100
SLOW_STOP = 3.0  # a candidate whose first steps take this many baseline steps (and over 0.5 s) is not timed
COMPILE_GUESS_S = 30.0  # compile's warm-up before one is measured (cold, here: resnet18 24-41 s, a 12-layer GPT 29 s;
# regional, half of it: 13 s on that GPT; benchmarks/bench_compile_warmup.py)
WARM_GUESS_S = 3.0  # compile's warm-up when inductor's cache is warm for the setup (measured 1.5-2.5 s against 17-50 s
# cold: bench_compile_warmup.py --warm); dynamo still traces


def warmup_guess(candidate: dict[str, dict], warm: bool = False) -> float:
    """The warm-up a costly candidate is assumed to take before one is measured: a search starts it only if this
    fits the budget left. A warm start of inductor's compile cache (accel.accelerators.compile.cache) loads its graphs."""
    if "compile" not in candidate:
        return 0.0  # another costly accelerator: its warm-up is measured when it is tried
    if warm:
        return WARM_GUESS_S
    return COMPILE_GUESS_S * (0.5 if candidate["compile"].get("regional") else 1.0)


@dataclass
class Settings:
    """How plan="auto" searches (accel.Auto takes these as keyword arguments).

    expected_steps: how many steps the run will take; the choice then minimises the whole run's time, warm-up
    included (compile is kept only if it pays back). budget_s: the search's time (None: the larger of 90 s and
    100 baseline steps). step_fn / loss_fn / split: how a batch becomes a loss (accel.measure.TrainStep): given,
    the search runs apart on copies (accel.tune); without them it runs in your own loop.
    cache: remember the choice (True: accel's cache folder; a path; False: always measure).
    """

    budget_s: float | None = None
    expected_steps: int | None = None
    step_fn: Callable | None = None
    loss_fn: Callable | None = None
    split: Callable | None = None
    tolerance: float = 0.05
    margin: float = MARGIN
    candidates: list | None = None
    accelerators: list[str] | None = None
    cache: Any = True
    check_steps: int = 2
    memory_per_rank: int | None = None  # bytes a rank may hold under a launcher (default: its device's total)


MOVED = {"expected_warmup": "accel.search.remembered", "remember_warmup": "accel.search.remembered"}


def __getattr__(name: str) -> Any:
    """0.3's names of the warm-up memory, now in accel.search.remembered (keyed on a warm or cold start too)."""
    if name not in MOVED:
        raise AttributeError(name)
    warnings.warn(f"accel: accel.search.config.{name} is {MOVED[name]}.{name}; the old name goes in 0.4 "
                  "(docs/migration.md)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(MOVED[name]), name)
