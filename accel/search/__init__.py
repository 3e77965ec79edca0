"""plan="auto" and accel.tune: choose the plan by measuring on your own model, optimizer and loader.

    run = accel.accelerate(model, optimizer, loader, plan="auto")     # in your loop, or accel.Auto(...)
    result = accel.tune(model, optimizer, loader)                     # apart, on copies: every comparison, and why

One search (strategy.py), one settings type (settings.Auto), one set of verdicts (verdicts.py), one table and cache
(results.py); run on your own steps (inloop.py, turns.py) or apart on copies (offline.py), and under a launcher on
every rank in step (ranks.py, distribution.py).
"""
from __future__ import annotations

import functools
from typing import Any

import accel.api as api
from accel.plan import PlanSpec
from accel.search.inloop import InLoopSearch
from accel.search.offline import tune
from accel.search.results import TuneResult, TuneRow
from accel.search.settings import MARGIN, Auto, generate_candidates

__all__ = ["Auto", "MARGIN", "TuneResult", "TuneRow", "accelerate", "generate_candidates", "tune"]


def accelerate(model, optimizer=None, loader=None, plan: PlanSpec = None, device: Any = "auto"):
    """Apply a plan of accelerators to your model, optimizer and loader and return a run (accel.api.accelerate).

    plan="auto" (or accel.Auto(...)) chooses the plan by measuring: in your own loop (an inloop.InLoopSearch, used
    as any run) unless a step_fn, loss_fn or split is given; then apart on copies (accel.tune) before the run is made,
    with the search's table in ``run.report.tuning``. Every problem in a plan is raised together in one PlanError
    before anything is touched; a failure while applying rolls every change back and raises AccelerateError.
    """
    settings = Auto() if isinstance(plan, str) and plan == "auto" else plan if isinstance(plan, Auto) else None
    if settings is None:
        return api.accelerate(model, optimizer, loader, plan, device)
    if not settings.apart():
        return InLoopSearch(settings, model, optimizer, loader, device)
    return api.accelerate(model, optimizer, loader, None, device, resolve=functools.partial(_apart, settings))


def _apart(settings: Auto, model, optimizer, loader, device) -> tuple[Any, TuneResult]:
    """plan="auto" apart: accel.tune's answer (under a launcher of several ranks, the single-process answer from the
    cache, with ddp or fsdp by memory fit), run by accelerate() once an earlier run on the model is undone."""
    result = tune(model, optimizer, loader, device, settings)
    return result.plan, result
