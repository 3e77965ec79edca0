"""An accelerator's options: one frozen dataclass per accelerator, each field declared with ``option()``, read as
``self.config.<name>``: an IDE sees the fields, they are checked in one place before anything is touched
(``Options.problems``), and they cannot change once the plan is built."""
from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from accel.errors import Problem

__all__ = ["Option", "Options", "at_least", "module_classes", "option", "positive"]


@dataclass(frozen=True)
class Option:
    """How one option is checked: its default, accepted types, allowed strings, and a value check.

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


def option(default: Any, types: tuple[type, ...] | None = None, *, choices: tuple[str, ...] | None = None,
           check: Callable[[Any], str | None] | None = None, allowed: str = "", help: str = "") -> Any:
    """A field of an Options dataclass: its default and how a value is checked (types default to the default's)."""
    spec = Option(default, types or (type(default),), choices, check, allowed, help)
    if isinstance(default, (list, dict, set)):  # a fresh copy per instance, as dataclasses require
        return dataclasses.field(default_factory=lambda: copy.copy(default), metadata={"option": spec})
    return dataclasses.field(default=default, metadata={"option": spec})


@dataclass(frozen=True, kw_only=True)
class Options:
    """Base of every accelerator's options (subclass it with frozen=True, kw_only=True and ``option()`` fields)."""

    optional: bool = option(False, help="skip (with the reason) instead of failing when a package or device is "
                                        "missing")
    owner: ClassVar[str] = ""  # the accelerator's name, for the problems
    example: ClassVar[dict[str, Any]] = {}  # values that make a valid example where the defaults do not (`accel env`)

    @classmethod
    def specs(cls) -> dict[str, Option]:
        return {f.name: f.metadata["option"] for f in dataclasses.fields(cls)}

    @classmethod
    def problems(cls, values: dict[str, Any], owner: str = "") -> list[Problem]:
        """Unknown options (with a suggestion) and bad values, all at once."""
        known, problems = cls.specs(), []
        for key, value in values.items():
            if key not in known:
                hint = difflib.get_close_matches(str(key), list(known), n=1)
                problems.append(Problem(
                    owner, "unknown option" + (f"; did you mean {hint[0]!r}?" if hint else ""),
                    field=str(key), allowed=", ".join(sorted(known)), kind="unknown"))
                continue
            message = known[key].problem(value)
            if message:
                problems.append(Problem(owner, message, field=key, value=value, allowed=known[key].describe()))
        return problems

    def to_dict(self) -> dict[str, Any]:
        """Every option's value, defaults included (plain types: what a checkpoint or cache key keeps)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def at_least(low: float) -> Callable[[Any], str | None]:
    return lambda value: None if value is None or value >= low else f"must be >= {low}"


def positive(value: Any) -> str | None:
    return None if value is None or value > 0 else "must be > 0"


def class_names_problem(value: Any) -> str | None:
    ok = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    return None if ok else "must be a non-empty list of module class names"


def module_classes(help: str) -> Any:
    """A field naming the module classes an accelerator works on: "auto" (the repeated blocks) or class names."""
    return option("auto", (str, list), choices=("auto",), check=class_names_problem, help=help)
