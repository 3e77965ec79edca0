"""The one contract every accelerator follows, built-in or yours, and the name registry (docs/lifecycle.md).

``class Mine(Accelerator[MineOptions, MineState])``: typed in its options (``self.config``) and its per-run state
(what ``apply`` returns, handed to every hook). ``decide``, ``check`` (every problem in one PlanError, nothing
touched), ``apply`` (through ``ctx.journal``), then the runtime hooks, chained by the Run in plan order. Beyond the
hooks an accelerator plays roles (``LossScaler``, ``StepSchedule``, ``GradientSync``), never read by another."""
from __future__ import annotations

import enum
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar, get_args, runtime_checkable

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from accel.errors import PlanError, Problem
from accel.hardware import Hardware
from accel.plan.options import Options

if TYPE_CHECKING:
    from accel.run.context import Context
    from accel.run.run import Run

__all__ = ["EXACT", "REGISTRY", "SAME_MATH", "Accelerator", "Call", "Capability", "GradientSync", "Keeps",
           "LossScaler", "Stage", "State", "StepSchedule", "dtype_name", "overrides", "packages", "register",
           "unregister"]

Call = Literal["backward", "step", "batch"]  # the run's calls an accelerator's work may go through (watched)


def dtype_name(dtype: torch.dtype | None) -> str:
    """'bfloat16' for torch.bfloat16: how reports name a dtype."""
    return str(dtype).replace("torch.", "")


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


class Capability(str, enum.Enum):
    """What an accelerator provides: the tokens of another's ``after``/``before``/``conflicts``, and what the run and a
    search read instead of names (``model.sharded``: sharded checkpoints; ``data.loader``: switched between epochs;
    ``model.copy``: never switched out; ``setup.costly``: tried last)."""

    DATA_LOADER = "data.loader"
    DATA_SHARD = "data.shard"
    GRADIENTS_CLIP = "gradients.clip"
    MODEL_COMPILE = "model.compile"
    MODEL_COPY = "model.copy"
    MODEL_DISTRIBUTED = "model.distributed"
    MODEL_KERNELS = "model.kernels"
    MODEL_LAYOUT = "model.layout"
    MODEL_RECOMPUTE = "model.recompute"
    MODEL_SHARDED = "model.sharded"
    MODEL_STRUCTURE = "model.structure"
    OPTIMIZER_UPDATE = "optimizer.update"
    PRECISION_AUTOCAST = "precision.autocast"
    PRECISION_LOSS_SCALING = "precision.loss_scaling"
    PROCESS_THREADS = "process.threads"
    SETUP_COSTLY = "setup.costly"
    STEP_SCHEDULE = "step.schedule"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # in messages, the token as a plan file or another accelerator writes it
        return repr(self.value)


@dataclass(frozen=True)
class Keeps:
    """What an accelerator keeps of the user's training, checked by accel.testing.check_equivalence. weights:
    "exact", "float" (the same math in another order: rtol/atol), "tolerance" (lower precision: losses within
    loss_rtol, weights within rtol/atol) or "changed" (declared: only the structure is compared)."""

    weights: str = "exact"
    rtol: float = 0.0
    atol: float = 0.0
    loss_rtol: float = 0.0
    structure: bool = True  # same parameter names and shapes (False: surgery)
    note: str = ""  # what it may change, in words


EXACT = Keeps()
SAME_MATH = Keeps("float", rtol=1e-3, atol=1e-4, loss_rtol=1e-4, note="the same math, summed in another order")


@dataclass
class State:
    """An accelerator's per-run state: ``apply`` returns it, the run holds it and hands it to every hook. Subclass
    it with the fields your hooks need; with nothing to keep, return ``State(changes={...})`` or the dict itself."""

    per_rank: ClassVar[bool] = False  # it differs between ranks (unreduced gradients): run.save keeps each rank's
    changes: dict[str, Any] = field(default_factory=dict, kw_only=True)  # what apply changed, for the report
    # the run's calls its work goes through, each with what it does there: the run watches them (run/watch.py) and
    # names this accelerator when the loop goes around one
    relies_on: dict[Call, str] = field(default_factory=dict, kw_only=True)

    def state_dict(self) -> dict[str, Any]:
        """What run.save() must keep (tensors and plain types only); none by default."""
        return {}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what state_dict() returned; raise ValueError on a state that does not fit (nothing changed)."""


OptionsT = TypeVar("OptionsT", bound=Options)
StateT = TypeVar("StateT", bound=State)
StateIn = TypeVar("StateIn", bound=State, contravariant=True)  # the roles only take it


class Accelerator(Generic[OptionsT, StateT]):
    """Base class: a named step with a stage, typed options and state, decisions, checks, an apply and runtime
    hooks. ``class Mine(Accelerator[MineOptions, MineState])``; ``class Mine(Accelerator)`` has none."""

    name: ClassVar[str] = ""
    stage: ClassVar[Stage]
    keeps: ClassVar[Keeps] = EXACT
    requires: ClassVar[tuple[str, ...]] = ()  # "optimizer", "loader", or a package's distribution name (probed)
    provides: ClassVar[tuple[str, ...]] = ()  # Capability members, for another's after/before/conflicts
    after: ClassVar[tuple[str, ...]] = ()  # names or capabilities applied before this one (within its stage)
    before: ClassVar[tuple[str, ...]] = ()
    conflicts: ClassVar[tuple[str, ...]] = ()  # names or capabilities that cannot be in the same plan
    # derived from the type arguments by __init_subclass__, never declared
    Options: ClassVar[type[Options]] = Options
    State: ClassVar[type[State]] = State
    config: OptionsT
    explicit: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        args = [arg for klass in cls.__mro__ for base in vars(klass).get("__orig_bases__", ())
                for arg in get_args(base) if isinstance(arg, type)]
        cls.Options = next((arg for arg in args if issubclass(arg, Options)), cls.Options)
        cls.State = next((arg for arg in args if issubclass(arg, State)), cls.State)

    def __init__(self, **options: Any):
        problems = self.Options.problems(options, self.name)
        if problems:
            raise PlanError(problems)
        object.__setattr__(self, "explicit", dict(options))  # what the user wrote: the plan's own dict
        object.__setattr__(self, "config", self.Options(**options))

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__}.{key}: an accelerator keeps no run state: put it in its State")

    # --- plan time -------------------------------------------------------------------------------------------

    @classmethod
    def candidates(cls, hardware: Hardware, model: nn.Module, optimizer: Optimizer | None = None,
                   loader: Any = None) -> list[dict[str, Any]]:
        """Option sets worth measuring on this hardware and model (tune tries each); none by default."""
        return []

    def decide(self, ctx: Context) -> None:
        """Write this accelerator's decisions with ctx.decide(name, value, why); raise Skip to stand aside."""

    def check(self, ctx: Context) -> list[Problem]:
        """Problems visible before anything is touched: conflicts, missing devices. Default: none."""
        return []

    def apply(self, ctx: Context) -> StateT | dict[str, Any]:
        """The change, through ``ctx.journal`` (undone by run.close() or a failed plan), never to what the user's
        objects hold; or a wrapper (ctx.model = Wrapper(ctx.model)). Returns this run's State."""
        return State()  # type: ignore[return-value]

    # --- runtime hooks (chained by the Run; the defaults pass through); ``state`` is what apply returned -------

    def forward_context(self, run: Run, state: StateT) -> AbstractContextManager[Any] | None:
        """A context entered around the forward pass and the loss (run.autocast()): autocast, or None."""
        return None

    def backward(self, run: Run, state: StateT, loss: Tensor, proceed: Callable[[Tensor], None]) -> None:
        proceed(loss)

    def step(self, run: Run, state: StateT, optimizer: Optimizer, proceed: Callable[[Optimizer], bool]) -> bool:
        """Around the update; returns whether the optimizer stepped. The innermost step steps and zeroes grads."""
        return proceed(optimizer)

    def optimizer_step(self, run: Run, state: StateT, optimizer: Optimizer,
                       proceed: Callable[[Optimizer], bool]) -> bool:
        """The update itself (innermost: ``optimizer.step()``); returns whether it stepped (amp's GradScaler)."""
        return proceed(optimizer)

    def unwrap(self, state: StateT, model: nn.Module) -> nn.Module:
        """Peel this accelerator's own wrapper off the model (run.unwrap()), or return it as it is."""
        return model

    def bypassed(self, run: Run, state: StateT, call: Call) -> str:
        """The loop went around ``call`` (State.relies_on): stand aside, put half-done work right (a scaled or divided
        loss), and say in words what it does from now on (the report's row and the warning)."""
        return "idle from here on"

    # --- helpers ---------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dict(self.explicit)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.explicit.items())
        return f"{type(self).__name__}({args})"


def packages(cls: type[Accelerator]) -> tuple[str, ...]:
    """The distribution names an accelerator requires: its ``requires`` but the optimizer and the loader."""
    return tuple(r for r in cls.requires if r not in ("optimizer", "loader"))


def overrides(accelerator: Accelerator, hook: str) -> bool:
    """Whether an accelerator implements a runtime hook (the Run chains only those)."""
    return getattr(type(accelerator), hook) is not getattr(Accelerator, hook)


# --- roles: what the run asks of the accelerators that play them (isinstance); play one by subclassing it ---------

@runtime_checkable
class LossScaler(Protocol[StateIn]):
    """It scales the loss (amp with fp16): run.scaler reads its GradScaler, run.unscale_gradients() asks it to
    divide the gradients back before they are read (once a step)."""

    def grad_scaler(self, state: StateIn) -> torch.amp.GradScaler | None: ...

    def unscale_gradients(self, run: Run, state: StateIn, optimizer: Optimizer) -> None: ...


@runtime_checkable
class StepSchedule(Protocol[StateIn]):
    """It holds some steps' updates (grad_accumulation): while it accumulates, the run pauses gradient reduction."""

    def accumulating(self, state: StateIn) -> bool: ...


@runtime_checkable
class GradientSync(Protocol[StateIn]):
    """A distribution wrapper (ddp, fsdp) whose gradient reduction the run turns off while a schedule accumulates."""

    def gradient_sync(self, run: Run, state: StateIn, enabled: bool) -> None:
        """Turn the wrapper's gradient reduction on or off for the next forward and backward."""

    def held_gradients(self, state: StateIn) -> list[Tensor]:
        """Gradients it holds unreduced, not yet in ``.grad`` (FSDP2 while accumulating)."""

    def release_held_gradients(self, run: Run, state: StateIn) -> None:
        """The loop stepped in the middle of an accumulation: reduce now what it left unreduced, into the ``.grad``
        the optimizer steps (a collective: every rank's loop gets here)."""


REGISTRY: dict[str, type[Accelerator]] = {}


def register(cls: type[Accelerator]) -> type[Accelerator]:
    """Class decorator: make an accelerator available by name in plans."""
    if not cls.name or not isinstance(getattr(cls, "stage", None), Stage):
        raise TypeError(f"{cls.__name__} needs a non-empty 'name' and a 'stage' from accel.Stage")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"an accelerator named {cls.name!r} is already registered ({REGISTRY[cls.name].__name__})")
    for attribute in ("provides", "after", "before", "conflicts", "requires"):
        value = getattr(cls, attribute)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{cls.__name__}.{attribute} must be a tuple of strings, got {value!r}")
    if "example" in vars(cls):  # 0.3's place for it: said, not ignored by `accel env`
        raise TypeError(f"{cls.__name__}.example: put the example options on its Options class (example = {{...}})")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)
