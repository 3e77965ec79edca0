"""The one contract every accelerator follows, built-in or yours, and the name registry.

The lifecycle, in the order accelerate() calls it (docs/lifecycle.md):

1. Options are checked when the plan is built (``options``: typed ``Option`` specs).
2. ``decide(ctx)``: every accelerator writes typed decisions (``ctx.decide``); nothing is touched yet.
3. ``check(ctx)``: every accelerator reports problems, reading any decision. All problems of the plan
   raise one PlanError, and the user's objects and the process are as they were.
4. ``apply(ctx)``: in plan order, the change; returns what changed, for the report. Process-wide changes
   go through ``ctx.journal``, so a failure anywhere rolls every change back.
5. Runtime hooks, chained by the Run over the applied accelerators in plan order (the earliest is the
   outermost and calls ``proceed`` to go on): ``forward_context`` (entered by run.autocast()), ``backward``,
   ``step``, ``optimizer_step`` (the update itself), ``unscale_gradients`` (called by whoever reads gradients),
   and ``unwrap`` (innermost wrapper first). ``state_dict``/``load_state_dict`` are the accelerator's part of
   ``Run.state_dict()`` (what run.save writes).

``candidates(hardware, model, optimizer, loader)`` lists the configurations tune should measure here.
Ordering beyond the stage is declared with ``after``/``before``; ``conflicts`` refuses a plan. Their tokens
are accelerator names or capabilities some accelerator ``provides``, so accelerators need not name each other.
Each run gets its own copy of every accelerator object, so ``self`` holds per-run state.
"""
from __future__ import annotations

import contextlib
import difflib
import enum
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

from accel.errors import PlanError, Problem

# The hooks' arguments are an accel.context.Context, an accel.run.Run and an accel.hardware.Hardware; this module
# is the bottom of the package and imports none of those higher layers, so their names stand for Any here.
Context = Run = Hardware = Any


class Stage(enum.IntEnum):
    """What an accelerator does; the library applies stages in this order, whatever the user wrote."""

    ENVIRONMENT = 0  # process state: threads, affinity, OpenMP variables
    DATA = 1  # how batches are loaded and moved
    SURGERY = 2  # changes the model's structure (pruning)
    KERNELS = 3  # swaps kernels, layouts or how modules run (IPEX, channels_last, fused optimizers, recompute)
    PRECISION = 4  # autocast and loss scaling
    STEP = 5  # how gradients become an update: accumulation, clipping
    DISTRIBUTION = 6  # process groups and wrappers (DDP)
    COMPILATION = 7  # torch.compile, always last and outermost


@dataclass(frozen=True)
class Option:
    """One option of an accelerator: its default, accepted types, allowed strings, and a value check.

    ``choices`` constrains string values only (e.g. "auto" or a mode name); ``check(value)`` returns
    None when a non-string value is fine, else what is wrong; ``allowed`` is the text shown to users.
    """

    default: Any
    types: tuple[type, ...]
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], str | None] | None = None
    allowed: str = ""
    help: str = ""

    def describe(self) -> str:
        if self.allowed:
            return self.allowed
        names = ["None" if t is type(None) else t.__name__ for t in self.types if t is not str or not self.choices]
        return ", ".join([repr(c) for c in self.choices or ()] + names)

    def problem(self, value: Any) -> str | None:
        # bool is an int subclass: refuse True where only numbers are meant.
        if not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types):
            return f"wrong type {type(value).__name__}"
        if isinstance(value, str) and self.choices is not None:
            return None if value in self.choices else "not allowed"
        return self.check(value) if self.check else None


def at_least(low: float) -> Callable[[Any], str | None]:
    return lambda value: None if value is None or value >= low else f"must be >= {low}"


def dtype_name(dtype: torch.dtype | None) -> str:
    """'bfloat16' for torch.bfloat16: how reports name a dtype."""
    return str(dtype).replace("torch.", "")


def positive(value: Any) -> str | None:
    return None if value is None or value > 0 else "must be > 0"


OPTIONAL = Option(False, (bool,), help="skip (with the reason) instead of failing when a package or device is missing")


@dataclass(frozen=True)
class Keeps:
    """What an accelerator keeps of the user's training: its card, checked by accel.testing.check_equivalence.

    weights: "exact" (bit for bit), "float" (the same math in another order: rtol/atol after a few steps),
    "tolerance" (lower precision: the losses within loss_rtol, the weights within rtol/atol), or "changed"
    (a declared change, e.g. pruning; only the structural promises are compared).
    Everything else is always compared: the batches the loop saw, parameter names, shapes, requires_grad,
    ties, the output's shape, and the user's objects left unchanged.
    """

    weights: str = "exact"
    rtol: float = 0.0
    atol: float = 0.0
    loss_rtol: float = 0.0
    structure: bool = True  # same parameter names and shapes (False: surgery)
    note: str = ""  # what it may change, in words


EXACT = Keeps()
SAME_MATH = Keeps("float", rtol=1e-3, atol=1e-4, loss_rtol=1e-4, note="the same math, summed in another order")


class Accelerator:
    """Base class: a named step with a stage, typed options, decisions, checks, an apply and runtime hooks."""

    name: ClassVar[str] = ""
    stage: ClassVar[Stage]
    options: ClassVar[dict[str, Option]] = {}
    requires: ClassVar[tuple[str, ...]] = ()  # distribution names, probed without importing
    needs: ClassVar[tuple[str, ...]] = ()  # "optimizer" and/or "loader": the core says when one is not given
    provides: ClassVar[tuple[str, ...]] = ()  # capabilities, e.g. "optimizer.update", for after/before/conflicts
    after: ClassVar[tuple[str, ...]] = ()  # names or capabilities applied before this one (within its stage)
    before: ClassVar[tuple[str, ...]] = ()
    conflicts: ClassVar[tuple[str, ...]] = ()  # names or capabilities that cannot be in the same plan
    keeps: ClassVar[Keeps] = EXACT
    costly_setup: ClassVar[bool] = False  # its first step is long (compile): tune tries it last, on the best stack
    switch_at: ClassVar[str] = "step"  # where plan="auto" in your loop may switch it in or out: "step", or "epoch"
    # (a rebuilt loader's workers serve a whole epoch)
    state_per_rank: ClassVar[bool] = False  # its state differs between ranks (accumulated gradients): saved per rank
    shards_parameters: ClassVar[bool] = False  # holds the model's parameters as shards in place (fsdp) until close()
    # gathers them back; its run saves sharded checkpoints
    example: ClassVar[dict[str, Any]] = {}  # options that make a valid example (what `accel env` checks)

    def __init__(self, **options: Any):
        problems = self.option_problems(options)
        if problems:
            raise PlanError(problems)
        self.explicit = dict(options)
        for key, spec in self.all_options().items():
            setattr(self, key, options.get(key, spec.default))

    @classmethod
    def all_options(cls) -> dict[str, Option]:
        return {**cls.options, "optional": OPTIONAL}

    @classmethod
    def option_problems(cls, options: dict[str, Any]) -> list[Problem]:
        """Unknown options (with a suggestion) and bad values, all at once."""
        known = cls.all_options()
        problems = []
        for key, value in options.items():
            if key not in known:
                hint = difflib.get_close_matches(str(key), list(known), n=1)
                problems.append(Problem(
                    cls.name, "unknown option" + (f"; did you mean {hint[0]!r}?" if hint else ""),
                    field=str(key), allowed=", ".join(sorted(known)), kind="unknown"))
                continue
            spec = known[key]
            message = spec.problem(value)
            if message:
                problems.append(Problem(cls.name, message, field=key, value=value, allowed=spec.describe()))
        return problems

    # --- plan time -------------------------------------------------------------------------------------------

    def decide(self, ctx: Context) -> None:
        """Write this accelerator's decisions with ctx.decide(name, value, why); raise Skip to stand aside."""

    def check(self, ctx: Context) -> list[Problem]:
        """Problems visible before anything is touched: conflicts, missing devices. Default: none."""
        return []

    def apply(self, ctx: Context) -> dict[str, Any]:
        """The change; returns what changed. Change how the user's objects run through ``ctx.journal`` (a hook,
        a flag: undone by run.close() or a failed plan), never what they hold, so they stay live; or wrap them
        (ctx.model = Wrapper(ctx.model)). Replacing one (a copy of the model) makes the user's stale: the core
        names it in the report and warns."""
        return {}

    @classmethod
    def candidates(cls, hardware: Hardware, model: torch.nn.Module, optimizer: Any = None,
                   loader: Any = None) -> list[dict[str, Any]]:
        """Option sets worth measuring on this hardware and model (tune tries each); none by default."""
        return []

    # --- runtime hooks (chained by the Run; the defaults pass through) ---------------------------------------

    def forward_context(self, run: Run) -> contextlib.AbstractContextManager | None:
        """A context entered around the forward pass and loss (run.autocast()): autocast, DDP's no_sync... or None."""
        return None

    def backward(self, run: Run, loss: torch.Tensor, proceed: Callable[[torch.Tensor], None]) -> None:
        proceed(loss)

    def step(self, run: Run, optimizer: torch.optim.Optimizer,
             proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        """Around the update; returns whether the optimizer stepped. The innermost step steps and zeroes grads."""
        return proceed(optimizer)

    def optimizer_step(self, run: Run, optimizer: torch.optim.Optimizer,
                       proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        """The update itself (innermost: ``optimizer.step()``); returns whether it stepped. A loss scaler steps
        through its GradScaler here instead of proceeding."""
        return proceed(optimizer)

    def unscale_gradients(self, run: Run, optimizer: torch.optim.Optimizer) -> None:
        """Make the gradients true gradients (an accelerator that scaled the loss divides them back), once a step."""

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Peel this accelerator's own wrapper off the model (run.unwrap()), or return it as it is."""
        return model

    def relies_on(self) -> dict[str, str]:
        """The run's calls this accelerator's work goes through this run, each with what it does there, in words:
        "backward" (run.backward), "step" (run.step), "batch" (one batch of run.loader per run.step). The run
        watches those calls (accel/watch.py) and names this accelerator when the loop goes around one."""
        return {}

    def bypassed(self, run: Run, call: str) -> str:
        """The loop went around ``call`` (see relies_on): what this accelerator does from now on, in words (the
        report's row and the warning say it). An accelerator whose half-done work would corrupt the update
        (a scaled loss, a divided one) stands aside here and puts the gradients right."""
        return "idle from here on"

    def state_dict(self) -> dict[str, Any]:
        """Runtime state run.save() must keep (tensors and plain types only); none by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned; raise ValueError on a state that does not fit (nothing changed)."""

    # --- helpers ---------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dict(self.explicit)

    def overrides(self, hook: str) -> bool:
        """Whether this accelerator implements a runtime hook (the Run chains only those)."""
        return getattr(type(self), hook) is not getattr(Accelerator, hook)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.explicit.items())
        return f"{type(self).__name__}({args})"


REGISTRY: dict[str, type[Accelerator]] = {}


def register(cls: type[Accelerator]) -> type[Accelerator]:
    """Class decorator: make an accelerator available by name in plans."""
    if not cls.name or not isinstance(getattr(cls, "stage", None), Stage):
        raise TypeError(f"{cls.__name__} needs a non-empty 'name' and a 'stage' from accel.Stage")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"an accelerator named {cls.name!r} is already registered ({REGISTRY[cls.name].__name__})")
    for attribute in ("provides", "after", "before", "conflicts", "needs"):
        value = getattr(cls, attribute)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{cls.__name__}.{attribute} must be a tuple of strings, got {value!r}")
    unknown = set(cls.needs) - {"optimizer", "loader"}
    if unknown:
        raise TypeError(f"{cls.__name__}.needs: {sorted(unknown)} are not things accelerate() is given "
                        "(allowed: 'optimizer', 'loader')")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)
