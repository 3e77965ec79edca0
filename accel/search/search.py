"""tune(): the offline search, on copies of the user's objects side by side (accel.measure.Lab)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch

from accel import clock
import accel.plan.cache as plancache
from accel.plan.contract import REGISTRY
from accel.search import distribution, strategies
from accel.search.config import BUDGET_STEPS, MARGIN, MIN_BUDGET_S
from accel.search.remembered import cached_answer, keep_answer
from accel.search.results import TuneResult, timing_fields
from accel.search.state import Search
from accel.search.wording import why
from accel.run.context import placement
from accel.errors import MeasureError, PlanError, Problem
from accel.hardware import Hardware, probe
from accel.measure import Lab, TrainStep
from accel.plan import Plan


def for_device(hardware: Hardware, device: torch.device) -> Hardware:
    """The hardware as a run on this device sees it: a CPU run is offered no GPU's candidates."""
    devices = {"cpu": 1, **({device.type: hardware.devices.get(device.type, 1)} if device.type != "cpu" else {})}
    return dataclasses.replace(hardware, devices=devices)


def generate_candidates(hardware, model, optimizer=None, loader=None,
                        accelerators: list[str] | None = None) -> list[dict[str, dict]]:
    """Every registered accelerator's configurations worth measuring here (only those named in ``accelerators``
    when given), in plan (stage) order."""
    found = []
    for cls in sorted(REGISTRY.values(), key=lambda c: (int(c.stage), c.name)):
        if accelerators is not None and cls.name not in accelerators:
            continue
        for options in cls.candidates(hardware, model, optimizer, loader):
            found.append({cls.name: dict(options)})
    return found


def tune(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any, device: Any = "auto",
         candidates: list | None = None, steps: int | None = None, warmup: int = 2, budget_s: float | None = None,
         tolerance: float = 0.05, loss_fn: Callable | None = None, step_fn: Callable | None = None,
         split: Callable | None = None, expected_steps: int | None = None, margin: float = MARGIN,
         accelerators: list[str] | None = None, cache: Any = False,
         memory_per_rank: int | None = None) -> TuneResult:
    """Measure plans on the user's model and loader; return the fastest established plan that keeps the loss.

    candidates: plans to compare with the baseline instead of the search over generated stacks.
    steps: timed steps per plan and round (default: as many as take about 0.5 s). warmup: first steps of every
    plan from the common start, timed apart and compared for the loss. budget_s: the search's time (default:
    the larger of 90 s and 100 baseline steps); what it leaves out is reported. step_fn(run, batch) -> loss,
    or loss_fn(output, targets) with split(batch) -> (inputs, targets): how a batch becomes a loss (default:
    (inputs, targets) batches and cross-entropy). accelerators: names the generated candidates may come from
    (default: every registered accelerator). cache: a path or True to remember the choice. Under a launcher
    with several ranks, ddp or fsdp joins the plan by whether the training state fits a rank's memory
    (``memory_per_rank`` bytes, default the device's), and the rest comes from the cache (accel.search.distribution).
    """
    if optimizer is None or loader is None:
        raise MeasureError("tune measures training steps: it needs an optimizer and a loader")
    started = clock.now()
    hardware, problems = probe(), []
    decided = placement(device, hardware, problems)  # the same launch and device accelerate() decides
    if decided is None:
        raise PlanError(problems)
    launch, resolved = decided.launch, decided.device
    hardware = for_device(hardware, resolved)
    step = TrainStep(loss_fn=loss_fn, split=split, step_fn=step_fn)
    lab = Lab(model, optimizer, loader, resolved, step, check_steps=max(1, warmup))
    settings = {"budget_s": budget_s, "steps": steps, "warmup": warmup, "tolerance": tolerance, "margin": margin,
                "expected_steps": expected_steps, "device": str(resolved), "accelerators": accelerators,
                "candidates": [Plan(c).to_dict() for c in candidates] if candidates is not None else "generated"}
    batch = lab.first_batch()
    if batch is None:
        raise MeasureError("tune needs batches, and the loader yields none")
    step.check(batch)
    key_parts = plancache.setup_key(model, optimizer, loader, batch, resolved, hardware, step, settings) if cache \
        else None
    hit = cached_answer(key_parts, cache, started)
    if hit is not None:
        lab.close()
        return _distributed(hit, model, optimizer, resolved, launch, memory_per_rank)
    if launch is not None and launch.world_size > 1:  # every rank measuring on its own would choose on its own
        lab.close()
        result = TuneResult.measured({}, [], "", None, clock.now() - started, settings)
        result.why = ("the rest of the plan is not measured under a launcher (each rank would choose on its own): "
                      "run plan='auto' once in a single process on the same setup, and the cache gives the ranks "
                      "its answer" if cache else "the rest of the plan is not measured under a launcher (each rank "
                      "would choose on its own), and the cache is off")
        return _distributed(result, model, optimizer, resolved, launch, memory_per_rank)
    generated = candidates is None
    plans = (generate_candidates(hardware, model, optimizer, loader, accelerators) if generated
             else [Plan(c).to_dict() for c in candidates])
    plans = [p for p in plans if p]
    search = Search(lab, tolerance, margin, math.inf, expected_steps)
    search.facts, search.cache = key_parts, cache
    search.model, search.device, search.cpu_model = model, resolved, hardware.cpu_model
    try:
        base = lab.trial({})
        search.base = base
        base_row = search.row_of(base, against="")
        if base.status == "refused":
            raise PlanError([Problem("tune", f"the baseline (empty plan) is refused: {base.error}")])
        if base.status != "ready":
            raise MeasureError(f"the baseline (empty plan) cannot train: {base.error}")
        step_s = base.settled_step_s
        lab.pace(step_s, steps)
        budget = budget_s if budget_s is not None else max(MIN_BUDGET_S, BUDGET_STEPS * step_s)
        search.deadline = started + budget
        settings["budget_s"] = round(budget, 1)
        base_row.vs_baseline, base_row.loss_ok, base_row.decision = 1.0, True, "baseline"
        chosen = strategies.given(search, plans) if not generated else strategies.search_stacks(search, plans)
        search.finish_row(base_row, base)
    finally:
        lab.close()
    result = TuneResult.measured(chosen.plan if chosen is not None else {}, search.rows, why(search, chosen),
                                 timing_fields(median_s=base.median_s).get("median_ms"), clock.now() - started,
                                 settings, established=chosen is not None or not any("noisy" in n for n in search.notes))
    complete = result.established and not search.cut_short and not any(r.status == "not measured"
                                                                        for r in result.rows)
    keep_answer(result, key_parts, cache, complete)
    return result


def _distributed(result: TuneResult, model, optimizer, device, launch, memory: int | None) -> TuneResult:
    """In a launched job of several ranks: the plan plus ddp or fsdp, chosen by memory fit, with the why."""
    return distribution.distribute(result, model, optimizer, device, launch, memory)
