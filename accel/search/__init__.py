"""plan="auto" and accel.tune: choose the plan by measuring on your own model, optimizer and loader.

    run = accel.accelerate(model, optimizer, loader, plan="auto")     # in your loop, or accel.Auto(...)
    result = accel.tune(model, optimizer, loader)                     # apart, on copies: every comparison, and why
"""
from __future__ import annotations

from typing import Any

import accel.api as api
from accel.plan import PlanSpec
from accel.search.inloop import InLoopSearch
from accel.search.offline import tune
from accel.search.results import TuneResult, TuneRow
from accel.search.settings import MARGIN, Auto, generate_candidates

__all__ = ["Auto", "MARGIN", "TuneResult", "TuneRow", "accelerate", "generate_candidates", "tune"]


def accelerate(model, optimizer=None, loader=None, plan: PlanSpec = None, device: Any = "auto"):
    """accel.api.accelerate, and plan="auto" (or accel.Auto(...)): in your own loop (an InLoopSearch), or apart on
    copies (accel.tune) before the run is made when a step_fn, loss_fn or split is given."""
    settings = Auto() if isinstance(plan, str) and plan == "auto" else plan if isinstance(plan, Auto) else None
    if settings is None:
        return api.accelerate(model, optimizer, loader, plan, device)
    if not settings.apart():
        return InLoopSearch(settings, model, optimizer, loader, device)

    def apart(model, optimizer, loader, device) -> tuple[Any, TuneResult]:
        result = tune(model, optimizer, loader, device, settings)
        return result.plan, result
    return api.accelerate(model, optimizer, loader, None, device, resolve=apart)
