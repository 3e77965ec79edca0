"""The contract every accelerator follows, built-in or user-written, and the name registry."""
from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from accel.errors import PlanError, Problem

if TYPE_CHECKING:
    from accel.context import Context


class Stage(enum.IntEnum):
    """What an accelerator does; the library applies stages in this order, whatever the user wrote."""

    ENVIRONMENT = 0  # process state: threads, affinity, OpenMP variables
    DATA = 1  # how batches are loaded and moved
    SURGERY = 2  # changes the model's structure (pruning)
    KERNELS = 3  # swaps kernels or layouts (IPEX, channels_last, fused optimizers)
    PRECISION = 4  # autocast and grad scaling
    DISTRIBUTION = 5  # process groups and wrappers (DDP)
    COMPILATION = 6  # torch.compile, always last and outermost


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


def at_least(low: int) -> Callable[[Any], str | None]:
    return lambda value: None if value is None or value >= low else f"must be >= {low}"


OPTIONAL = Option(False, (bool,), help="skip (with the reason) instead of failing when a package or device is missing")


class Accelerator:
    """Base class: a named step with a stage, typed options, plan-time checks and an apply.

    Subclasses set ``name``, ``stage`` and ``options``; they may set ``requires`` (distribution names
    probed without importing), override ``check`` to report conflicts before anything is touched, and
    implement ``apply(ctx)``, which changes the context and returns what changed (a dict for the
    report) or raises ``Skip(reason)``.
    """

    name: ClassVar[str] = ""
    stage: ClassVar[Stage]
    options: ClassVar[dict[str, Option]] = {}
    requires: ClassVar[tuple[str, ...]] = ()

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

    def check(self, ctx: Context) -> list[Problem]:
        """Problems visible before anything is touched: conflicts, missing devices. Default: none."""
        return []

    def apply(self, ctx: Context) -> dict[str, Any]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return dict(self.explicit)

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
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)
