"""The one contract every accelerator follows, built-in or yours, and the name registry.

The lifecycle, in the order accelerate() calls it (docs/lifecycle.md):

1. Options: a frozen dataclass per accelerator (``Options``, accel/plan/options.py), checked when the plan is built;
   the accelerator reads them as ``self.config``. Nothing is set on the accelerator after construction.
2. ``decide(ctx)``: every accelerator writes typed decisions (``ctx.decide``); nothing is touched yet.
3. ``check(ctx)``: every accelerator reports problems, reading any decision. All problems of the plan
   raise one PlanError, and the user's objects and the process are as they were.
4. ``apply(ctx)``: in plan order, the change; returns the accelerator's per-run ``State`` (a dataclass, with
   what changed for the report in ``state.changes``). The run holds it and hands it to every hook.
   Process-wide changes go through ``ctx.journal``, so a failure anywhere rolls every change back.
5. Runtime hooks, chained by the Run over the applied accelerators in plan order (the earliest is the
   outermost and calls ``proceed`` to go on): ``forward_context`` (entered by run.autocast()), ``backward``,
   ``step``, ``optimizer_step`` (the update itself), ``unscale_gradients`` (called by whoever reads gradients),
   and ``unwrap`` (innermost wrapper first). ``state_dict``/``load_state_dict`` are the accelerator's part of
   ``Run.state_dict()`` (what run.save writes).
6. Services one accelerator offers the others through the run, never by reading each other's attributes:
   ``accumulating`` (a step schedule holds this step), ``gradient_sync`` (a distribution wrapper pauses its
   reduction: the run asks while a schedule accumulates), ``held_gradients`` (gradients a wrapper keeps
   unreduced) and ``grad_scaler`` (run.scaler).

``candidates(hardware, model, optimizer, loader)`` lists the configurations tune should measure here.
Ordering beyond the stage is declared with ``after``/``before``; ``conflicts`` refuses a plan. Their tokens
are accelerator names or ``Capability`` members some accelerator ``provides``, so accelerators need not name
each other. An accelerator written for 0.2 (an ``options`` dict, state on ``self``, hooks without ``state``)
still works for one release, with a DeprecationWarning (accel/plan/compat.py).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

import accel.plan.compat as compat
from accel.errors import PlanError, Problem
from accel.plan.declarations import EXACT, SAME_MATH, Capability, Keeps, Stage  # noqa: F401  (accel.plan.contract's names)
from accel.plan.options import Option, Options, at_least, positive  # noqa: F401  (re-exported)

# The hooks' arguments are an accel.run.context.Context, an accel.run.Run and an accel.hardware.Hardware; this module
# is the bottom of the package and imports none of those higher layers, so their names stand for Any here.
Context = Run = Hardware = Any


def dtype_name(dtype: torch.dtype | None) -> str:
    """'bfloat16' for torch.bfloat16: how reports name a dtype."""
    return str(dtype).replace("torch.", "")


@dataclass
class State:
    """An accelerator's per-run state: ``apply`` returns it, the run holds it and hands it to every hook.

    Subclass it with the fields your hooks need (amp: its GradScaler; grad_accumulation: the micro-step). An
    accelerator with nothing to keep returns ``State(changes={...})``, or just the dict of changes.
    """

    changes: dict[str, Any] = field(default_factory=dict, kw_only=True)  # what apply changed, for the report


class Accelerator:
    """Base class: a named step with a stage, typed options, decisions, checks, an apply and runtime hooks."""

    name: ClassVar[str] = ""
    stage: ClassVar[Stage]
    Options: ClassVar[type[Options]] = Options  # a frozen dataclass of option() fields (accel/plan/options.py)
    options: ClassVar[dict[str, Option]] = {}  # derived from Options: each option's spec (docs, CLI, accel env)
    requires: ClassVar[tuple[str, ...]] = ()  # distribution names, probed without importing
    needs: ClassVar[tuple[str, ...]] = ()  # "optimizer" and/or "loader": the core says when one is not given
    provides: ClassVar[tuple[str, ...]] = ()  # Capability members, for another's after/before/conflicts
    after: ClassVar[tuple[str, ...]] = ()  # names or capabilities applied before this one (within its stage)
    before: ClassVar[tuple[str, ...]] = ()
    conflicts: ClassVar[tuple[str, ...]] = ()  # names or capabilities that cannot be in the same plan
    keeps: ClassVar[Keeps] = EXACT
    state_per_rank: ClassVar[bool] = False  # its state differs between ranks (accumulated gradients): saved per rank
    shards_parameters: ClassVar[bool] = False  # holds the model's parameters as shards in place (fsdp) until close()
    # gathers them back; its run saves sharded checkpoints
    example: ClassVar[dict[str, Any]] = {}  # options that make a valid example (what `accel env` checks)
    legacy_hooks: ClassVar[frozenset[str]] = frozenset()  # 0.2-style hooks (no state), adapted by accel/plan/compat.py

    config: Options

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        compat.adapt(cls, Accelerator)
        cls.options = {k: v for k, v in cls.Options.specs().items() if k != "optional"}

    def __init__(self, **options: Any):
        problems = self.option_problems(options)
        if problems:
            raise PlanError(problems)
        object.__setattr__(self, "explicit", dict(options))  # what the user wrote: the plan's own dict
        object.__setattr__(self, "config", self.Options(**options))

    def __setattr__(self, key: str, value: Any) -> None:
        compat.set_on_accelerator(self, key, value)

    def __getattr__(self, key: str) -> Any:  # only for names not found: a 0.2-style read of an option
        return compat.option_read(self, key)

    @classmethod
    def all_options(cls) -> dict[str, Option]:
        return cls.Options.specs()

    @classmethod
    def option_problems(cls, options: dict[str, Any]) -> list[Problem]:
        """Unknown options (with a suggestion) and bad values, all at once."""
        return cls.Options.problems(options, cls.name)

    # --- plan time -------------------------------------------------------------------------------------------

    def decide(self, ctx: Context) -> None:
        """Write this accelerator's decisions with ctx.decide(name, value, why); raise Skip to stand aside."""

    def check(self, ctx: Context) -> list[Problem]:
        """Problems visible before anything is touched: conflicts, missing devices. Default: none."""
        return []

    def apply(self, ctx: Context) -> State | dict[str, Any]:
        """The change; returns this run's State (what changed in ``state.changes``). Change how the user's objects
        run through ``ctx.journal`` (a hook, a flag: undone by run.close() or a failed plan), never what they
        hold, so they stay live; or wrap them (ctx.model = Wrapper(ctx.model)). Replacing one (a copy of the
        model) makes the user's stale: the core names it in the report and warns."""
        return State()

    @classmethod
    def candidates(cls, hardware: Hardware, model: torch.nn.Module, optimizer: Any = None,
                   loader: Any = None) -> list[dict[str, Any]]:
        """Option sets worth measuring on this hardware and model (tune tries each); none by default."""
        return []

    # --- runtime hooks (chained by the Run; the defaults pass through); ``state`` is what apply returned -------

    def forward_context(self, run: Run, state: State) -> contextlib.AbstractContextManager | None:
        """A context entered around the forward pass and the loss (run.autocast()): autocast, or None."""
        return None

    def backward(self, run: Run, state: State, loss: torch.Tensor, proceed: Callable[[torch.Tensor], None]) -> None:
        proceed(loss)

    def step(self, run: Run, state: State, optimizer: torch.optim.Optimizer,
             proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        """Around the update; returns whether the optimizer stepped. The innermost step steps and zeroes grads."""
        return proceed(optimizer)

    def optimizer_step(self, run: Run, state: State, optimizer: torch.optim.Optimizer,
                       proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        """The update itself (innermost: ``optimizer.step()``); returns whether it stepped. A loss scaler steps
        through its GradScaler here instead of proceeding."""
        return proceed(optimizer)

    def unscale_gradients(self, run: Run, state: State, optimizer: torch.optim.Optimizer) -> None:
        """Make the gradients true gradients (an accelerator that scaled the loss divides them back), once a step."""

    def unwrap(self, state: State, model: torch.nn.Module) -> torch.nn.Module:
        """Peel this accelerator's own wrapper off the model (run.unwrap()), or return it as it is."""
        return model

    def relies_on(self, state: State) -> dict[str, str]:
        """The run's calls this accelerator's work goes through this run, each with what it does there, in words:
        "backward" (run.backward), "step" (run.step), "batch" (one batch of run.loader per run.step). The run
        watches those calls (accel/run/watch.py) and names this accelerator when the loop goes around one."""
        return {}

    def bypassed(self, run: Run, state: State, call: str) -> str:
        """The loop went around ``call`` (see relies_on): what this accelerator does from now on, in words (the
        report's row and the warning say it). An accelerator whose half-done work would corrupt the update
        (a scaled loss, a divided one) stands aside here and puts the gradients right."""
        return "idle from here on"

    def state_dict(self, state: State) -> dict[str, Any]:
        """Runtime state run.save() must keep (tensors and plain types only); none by default."""
        return {}

    def load_state_dict(self, state: State, saved: dict[str, Any]) -> None:
        """Restore what state_dict() returned; raise ValueError on a state that does not fit (nothing changed)."""

    # --- services: what this accelerator offers the others, through the run ------------------------------------

    def accumulating(self, state: State) -> bool:
        """Whether the step in progress only accumulates gradients (no optimizer update at its run.step()): the
        run then asks the distribution wrappers to hold their gradient reduction (``gradient_sync``)."""
        return False

    def gradient_sync(self, run: Run, state: State, enabled: bool) -> None:
        """Turn this wrapper's gradient reduction on or off for the next forward and backward (DDP, FSDP)."""

    def held_gradients(self, state: State) -> list[torch.Tensor]:
        """Gradients this accelerator holds unreduced, not yet in ``.grad`` (FSDP2 while accumulating)."""
        return []

    def release_held_gradients(self, run: Run, state: State) -> None:
        """The loop stepped around an accumulation (its own optimizer.step() in the middle of one): reduce now what
        this wrapper left unreduced, into the ``.grad`` the optimizer steps, as its next synced backward would have
        (a step late otherwise, which momentum and Adam carry on). A collective: every rank's loop gets here."""

    def grad_scaler(self, state: State) -> torch.amp.GradScaler | None:
        """The GradScaler this accelerator owns, or None: run.scaler, to read its scale (it alone steps it)."""
        return None

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
REPLACED = {"costly_setup": Capability.SETUP_COSTLY, "trains_a_copy": Capability.MODEL_COPY,
            "switch_at": Capability.DATA_LOADER}  # 0.3's flags, now capabilities: register() names which


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
    capabilities = {c.value for c in Capability}  # accel's own accelerators use these only; yours may add some
    unknown = [t for a in ("provides", "after", "before", "conflicts") for t in getattr(cls, a)
               if "." in t and t not in capabilities]
    strings = [t for a in ("provides", "after", "before", "conflicts") for t in getattr(cls, a)
               if t in capabilities and not isinstance(t, Capability)]
    if strings and not compat.broken(cls, f"capabilities as strings {strings}"):
        compat.deprecated(cls, f"names capabilities as strings {strings}; use accel.Capability members "
                               f"(e.g. accel.Capability({strings[0]!r}))")
    if compat.builtin(cls) and (unknown or not all(t in capabilities for t in cls.provides)):
        raise TypeError(f"{cls.__name__}: {sorted(set(unknown) or set(cls.provides) - capabilities)} are not "
                        f"capabilities (allowed: accel.Capability: {sorted(capabilities)}); after/before/conflicts "
                        "also take accelerator names")
    flags = [f"{f} -> provides {c!r}" for f, c in REPLACED.items() if f in vars(cls)]
    if flags:
        raise TypeError(f"{cls.__name__}: {', '.join(flags)}: a search reads what an accelerator provides")
    unknown = set(cls.needs) - {"optimizer", "loader"}
    if unknown:
        raise TypeError(f"{cls.__name__}.needs: {sorted(unknown)} are not things accelerate() is given "
                        "(allowed: 'optimizer', 'loader')")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)
