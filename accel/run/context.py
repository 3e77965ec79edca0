"""What a plan works on: the user's objects, the run's objects, the typed decisions, and the undo journal.

Accelerators never read each other; they read ``ctx.decisions``, made for the whole plan before anything is applied,
so an accelerator of an early stage can follow what a later one decided."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from accel.errors import Problem
from accel.hardware import Hardware, device_problem, resolve_device
from accel.hardware.launcher import Launch, launcher_environment
from accel.run.journal import Journal

if TYPE_CHECKING:
    from accel.plan import Plan

__all__ = ["Context", "Decisions", "placement"]


@dataclass
class Decisions:
    """Typed decisions of a plan; ``by`` says which accelerator made each one and ``why``. device and launch are
    the core's (before any stage: every rank starts on its own device); the others are set through ``Context.decide``.
    """

    device: torch.device
    launch: Launch | None = None  # this process's place in a launched job; None in a single process
    compute_dtype: torch.dtype | None = None  # autocast's dtype; None computes in the parameters' dtype
    loss_scaling: bool = False  # a GradScaler scales the loss (fp16)
    threads: int | None = None  # compute threads of this process
    cpus: tuple[int, ...] | None = None  # the CPUs this process computes on
    workers: int | None = None  # DataLoader worker processes
    non_blocking: bool = False  # host-to-device copies overlap compute (pinned memory)
    extra: dict[str, Any] = field(default_factory=dict)  # decisions of user-written accelerators
    by: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.launch.rank if self.launch else 0

    def summary(self) -> dict[str, str]:
        """Every decision that was made, as text for the report."""
        shown = {"device": str(self.device)}
        if launch := self.launch:
            shown["rank"] = f"{launch.rank}/{launch.world_size} (local {launch.local_rank}, {launch.launcher})"
        for name in self.by:  # modules by count and class (a module's repr is its whole tree)
            value = self.extra[name] if name in self.extra else getattr(self, name)
            if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.nn.Module) for v in value):
                shown[name] = f"{len(value)} module(s): {', '.join(sorted({type(v).__name__ for v in value}))}"
            else:
                shown[name] = str(value).replace("torch.", "")
        return shown


@dataclass
class Context:
    """The user's objects, the run's objects (the user's own unless an accelerator wraps or replaces them: then in
    ``model``/``optimizer``/``loader``), and the decisions. Accelerators change how the user's objects run through the
    journal, never what they hold. ``batch_transforms`` run on every batch of the run's loader, on the device."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    loader: Any
    hardware: Hardware
    plan: Plan
    decisions: Decisions
    journal: Journal = field(default_factory=Journal)
    batch_transforms: list[Callable[[Any], Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list, repr=False)

    def __post_init__(self):
        self.user_model, self.user_optimizer, self.user_loader = self.model, self.optimizer, self.loader
        self.deciding = ""  # the accelerator whose decide() runs now (Context.decide records it)

    @property
    def device(self) -> torch.device:
        return self.decisions.device

    def decide(self, name: str, value: Any, why: str = "") -> None:
        """Record a typed decision (or one in ``extra`` for a user-written accelerator's own); two accelerators
        deciding the same thing differently is a conflict in the plan."""
        by = self.deciding or "accel"
        known = name in Decisions.__dataclass_fields__ and name not in ("extra", "by", "why")
        decided = vars(self.decisions) if known else self.decisions.extra  # a typed field, or a user's own
        current = decided.get(name)
        if name in self.decisions.by and self.decisions.by[name] != by:
            if current != value:
                self.problems.append(Problem(by, f"decides {name}={value}, but {self.decisions.by[name]} decided "
                                             f"{current}", field=name, kind="conflict"))
            return  # the same value: the first to decide keeps it (a later one that skips takes back nothing)
        decided[name] = value
        self.decisions.by[name] = by
        self.decisions.why[name] = why


def placement(device: Any, hardware: Hardware, problems: list[Problem]) -> Decisions | None:
    """The launch (rank) and this rank's device, decided before any accelerator runs (accelerate, tune and bench
    alike); None with the problems said when they cannot be."""
    try:
        launch = launcher_environment()
    except ValueError as error:  # e.g. RANK=abc
        problems.append(Problem("launch", f"the launcher's variables cannot be read: {error}", kind="value"))
        return None
    try:
        resolved = resolve_device(device, local_rank=launch.local_rank if launch else 0, hardware=hardware)
    except (RuntimeError, TypeError, ValueError) as error:
        problems.append(Problem("device", str(error), value=device,
                                allowed="'auto', 'cpu', 'cuda[:N]', 'xpu[:N]', 'mps' or any torch device string"))
        return None
    why = device_problem(resolved, hardware)
    if why:
        problems.append(Problem("device", why, value=device if isinstance(device, str) else str(device),
                                allowed="'auto', 'cpu', or a device that is here", kind="missing"))
        return None
    why = (f"local rank {launch.local_rank}'s device" if launch and resolved.index is not None
           else "asked for" if device not in (None, "auto") else "the fastest device here")
    return Decisions(device=resolved, launch=launch, by={"device": "accel"}, why={"device": why})
