"""The one settings type of a search (``accel.Auto``), and its candidates, sorted by what they provide."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accel.errors import PlanError
from accel.hardware import probe
from accel.plan import Plan
from accel.plan.contract import REGISTRY, Capability
from accel.run.context import placement

MARGIN = 0.02  # a plan must be faster than the one it replaces by more than this fraction
MIN_BUDGET_S, BUDGET_STEPS = 90.0, 100  # the default budget: the larger of 90 s and 100 plain steps
SLOW_STOP = 3.0  # a candidate whose steps take this many plain steps (and over 0.5 s) is not timed further
COSTLY_GUESS_S = 30.0  # a costly warm-up (compile's) before one is measured on the setup (docs/measurement.md)


@dataclass
class Auto:
    """plan=accel.Auto(...) chooses the plan by measuring ("auto" is Auto()); accel.tune(**fields) takes the same.

    budget_s: what the search may spend (None: the larger of 90 s and 100 plain steps). expected_steps: the run's
    length (a costly warm-up must pay back within it). step_fn, or loss_fn with split: the search measures copies
    apart (accel.tune). candidates: plans to compare instead of the predicted stack; accelerators: those that may
    propose candidates. cache: True, a path, or False. Apart only: tolerance, check_steps, chunk_steps.
    memory_per_rank: bytes a rank may hold under a launcher (None: its device's).
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
    chunk_steps: int | None = None
    memory_per_rank: int | None = None

    def apart(self) -> bool:
        """A step function given: the search measures copies apart."""
        return not (self.step_fn is None and self.loss_fn is None and self.split is None)

    def deadline(self, started: float, step_s: float = 0.0) -> float:
        """When the search's budget ends: budget_s, else the larger of MIN_BUDGET_S and BUDGET_STEPS plain steps."""
        return started + (self.budget_s if self.budget_s is not None else max(MIN_BUDGET_S, BUDGET_STEPS * step_s))

    def key(self) -> dict[str, Any]:
        """What changes the answer (cache.KEY_SETTINGS)."""
        given = [Plan(c).to_dict() for c in self.candidates] if self.candidates is not None else "generated"
        return {"tolerance": self.tolerance, "margin": self.margin, "expected_steps": self.expected_steps,
                "accelerators": self.accelerators, "candidates": given}


def placed(device: Any) -> tuple[Any, Any, Any]:
    """The device and launch accelerate() decides, and the hardware as a run there sees it (a CPU run is offered no
    GPU's candidates)."""
    hardware, problems = probe(), []
    decided = placement(device, hardware, problems)
    if decided is None:
        raise PlanError(problems)
    kind = decided.device.type
    devices = {"cpu": 1, **({kind: hardware.devices.get(kind, 1)} if kind != "cpu" else {})}
    return decided.device, decided.launch, dataclasses.replace(hardware, devices=devices)


def provides(plan: dict[str, dict], capability: Capability) -> bool:
    return any(capability in REGISTRY[name].provides for name in plan)


def generate_candidates(hardware, model, optimizer=None, loader=None, accelerators: list[str] | None = None) -> list:
    """Every registered accelerator's configurations the hardware predicts pay here (of ``accelerators``), in plan
    order."""
    return [{cls.name: dict(options)} for cls in sorted(REGISTRY.values(), key=lambda c: (int(c.stage), c.name))
            if accelerators is None or cls.name in accelerators
            for options in cls.candidates(hardware, model, optimizer, loader)]


def candidates_of(settings: Auto, hardware, model, optimizer, loader, in_loop: bool) -> dict[str, Any]:
    """The candidates (none that distributes) by what they provide: "costly" (measured last, on top), in your loop
    "copies" (never switched in) and "epochwise" (a rebuilt loader: by the loop's data wait); the rest "stepwise"."""
    given = settings.candidates is not None
    plans = ([Plan(c).to_dict() for c in settings.candidates] if given else
             generate_candidates(hardware, model, optimizer, loader, settings.accelerators))
    plans = [p for p in plans if p and not provides(p, Capability.MODEL_DISTRIBUTED)]
    kinds = {"copies": [p for p in plans if in_loop and provides(p, Capability.MODEL_COPY)]}
    kinds["epochwise"] = [p for p in plans
                          if in_loop and p not in kinds["copies"] and provides(p, Capability.DATA_LOADER)]
    rest = [p for p in plans if p not in kinds["copies"] and p not in kinds["epochwise"]]
    kinds["costly"] = [p for p in rest if provides(p, Capability.SETUP_COSTLY) and not (given and not in_loop)]
    return {**kinds, "stepwise": [p for p in rest if p not in kinds["costly"]], "given": given}
