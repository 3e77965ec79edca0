"""The one settings type of a search (``accel.Auto``: plan="auto" in your loop or apart, and accel.tune), and its
candidates, sorted by what their accelerators provide (never by their names)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accel.plan import Plan
from accel.plan.contract import REGISTRY, Capability

MARGIN = 0.02  # a plan must be faster than the one it replaces by more than this fraction
MIN_BUDGET_S, BUDGET_STEPS = 90.0, 100  # the default budget: the larger of 90 s and 100 plain steps
SLOW_STOP = 3.0  # a candidate whose steps take this many plain steps (and over 0.5 s) is not timed further
COSTLY_GUESS_S = 30.0  # a costly first step before one is measured on the setup (compile, cold: resnet18 24-41 s, a
# 12-layer GPT 29 s; benchmarks/bench_compile_warmup.py)


@dataclass
class Auto:
    """plan=accel.Auto(...) chooses the plan by measuring ("auto" is Auto()); accel.tune(**fields) takes the same.

    budget_s: what the search may spend (None: the larger of 90 s and 100 plain steps; with expected_steps at most
    30% of the plain run). expected_steps: the run's length: a costly accelerator (compile) is kept only if its
    warm-up pays back within it. step_fn(run, batch) -> loss, or loss_fn(output, targets) with split(batch) ->
    (inputs, targets): given, the search measures copies apart (accel.tune); else your own loop. candidates: plans to
    compare with the plain loop instead of the stack the hardware predicts; accelerators: the registered ones that
    may propose candidates. cache: remember the choice (True: accel's folder; a path; False). Apart only: tolerance
    (how far a candidate's first losses may stray), check_steps (how many), chunk_steps (timed steps a turn).
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
        """Whether the search measures copies apart: a step function given (your loop's loss is unknown to it)."""
        return not (self.step_fn is None and self.loss_fn is None and self.split is None)

    def key(self) -> dict[str, Any]:
        """What changes the answer (accel.search.cache.KEY_SETTINGS)."""
        given = [Plan(c).to_dict() for c in self.candidates] if self.candidates is not None else "generated"
        return {"tolerance": self.tolerance, "margin": self.margin, "expected_steps": self.expected_steps,
                "accelerators": self.accelerators, "candidates": given}


def provides(plan: dict[str, dict], capability: Capability) -> bool:
    return any(capability in REGISTRY[name].provides for name in plan)


def for_device(hardware: Any, device: Any) -> Any:
    """The hardware as a run on this device sees it: a CPU run is offered no GPU's candidates."""
    devices = {"cpu": 1, **({device.type: hardware.devices.get(device.type, 1)} if device.type != "cpu" else {})}
    return dataclasses.replace(hardware, devices=devices)


def generate_candidates(hardware, model, optimizer=None, loader=None, accelerators: list[str] | None = None) -> list:
    """Every registered accelerator's configurations worth measuring here (of those in ``accelerators``, when
    given), in plan order: what the hardware predicts (bf16 where native, channels_last for convolutions, fused
    optimizers, workers where CPUs are spare)."""
    return [{cls.name: dict(options)} for cls in sorted(REGISTRY.values(), key=lambda c: (int(c.stage), c.name))
            if accelerators is None or cls.name in accelerators
            for options in cls.candidates(hardware, model, optimizer, loader)]


def candidates_of(settings: Auto, hardware, model, optimizer, loader, in_loop: bool) -> dict[str, Any]:
    """The candidates to measure (none that distributes: a launcher decides that), by what they provide: "costly" (a
    long first step: last, on top), and in your loop "copies" (never switched in) and "epochwise" (a rebuilt loader:
    by the loop's wait for data); the rest "stepwise"; and whether they were "given"."""
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
