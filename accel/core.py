"""accelerate(): validate the whole plan, then apply it in stage order and report every decision."""
from __future__ import annotations

import time
import warnings
from typing import Any

import torch

from accel.context import Context
from accel.errors import PlanError, Problem, Skip
from accel.hardware import package_version, probe, resolve_device
from accel.plan import Plan, PlanSpec
from accel.report import Report, Row
from accel.run import Run


class AccelerateError(RuntimeError):
    """An accelerator failed while being applied (after the plan was validated)."""


def _device(device: Any, problems: list[Problem]) -> torch.device | None:
    try:
        return resolve_device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        problems.append(Problem("device", str(error), value=device,
                                allowed="'auto', 'cpu', 'cuda[:N]', 'xpu[:N]', 'mps' or any torch device string"))
        return None


def check_plan(plan: Plan, ctx: Context) -> tuple[list[Problem], dict[str, str]]:
    """Problems that fail the plan, and accelerators to skip (optional ones whose package or device is missing)."""
    problems: list[Problem] = []
    skips: dict[str, str] = {}
    for accelerator in plan:
        found = [Problem(accelerator.name, f"needs the package {name!r}, which is not installed",
                         allowed=f"pip install {name}", kind="missing")
                 for name in accelerator.requires if package_version(name) is None]
        found += accelerator.check(ctx)
        if accelerator.optional and found and all(p.kind == "missing" for p in found):
            skips[accelerator.name] = "optional, and " + "; ".join(p.message for p in found)
        else:
            problems += found
    return problems, skips


def accelerate(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, loader: Any = None,
               plan: PlanSpec = None, device: Any = "auto") -> Run:
    """Apply a plan of accelerators to the user's model, optimizer and loader and return a Run.

    Every problem in the plan is raised together in one PlanError before anything is touched.
    """
    started = time.perf_counter()
    tuning = None
    if isinstance(plan, str) and plan == "auto":  # choose by measuring on the user's own model (accel.tune)
        from accel.tune import tune

        tuning = tune(model, optimizer, loader, device=device)
        plan = tuning.plan
    plan, problems = Plan.parse(plan)
    resolved = _device(device, problems)
    if not isinstance(model, torch.nn.Module):
        problems.append(Problem("model", "is not a torch.nn.Module", value=type(model).__name__))
        raise PlanError(problems)
    if resolved is None:
        raise PlanError(problems)
    hardware = probe()
    ctx = Context(model=model, optimizer=optimizer, loader=loader, device=resolved, hardware=hardware, plan=plan)
    found, skips = check_plan(plan, ctx)
    if problems or found:
        raise PlanError(problems + found)

    if next((p.device for p in model.parameters()), resolved) != resolved:
        model.to(resolved)
    report = Report(device=str(resolved), hardware=describe(hardware), tuning=tuning)
    for accelerator in plan:
        row = Row(accelerator.name, accelerator.stage.name.lower(), "skipped")
        report.rows.append(row)
        if accelerator.name in skips:
            row.reason = skips[accelerator.name]
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                row.changes = accelerator.apply(ctx) or {}
                row.status = "applied"
            except Skip as skip:
                row.reason = skip.reason
            except Exception as error:
                raise AccelerateError(f"{accelerator.name} failed while being applied: {error}") from error
        for warning in caught:  # keep them in the report and still show them to the user
            row.warnings.append(str(warning.message))
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    report.setup_s = time.perf_counter() - started
    return Run(ctx, report)


def describe(hardware) -> str:
    isa = ",".join(hardware.isa) or "no AVX2"
    return (f"{hardware.physical_cores} physical cores ({len(hardware.cpus_allowed)} CPUs allowed), {isa}, "
            f"OpenMP {hardware.openmp}, torch {hardware.versions['torch']}")
