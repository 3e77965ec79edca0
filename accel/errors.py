"""Errors users see. Every accel error is an AccelError, so a script or the CLI can catch them all at once.

PlanError carries every problem found in a plan; nothing has been changed when it is raised.
"""
from __future__ import annotations

import contextlib
import os
import reprlib
import sys
from dataclasses import dataclass
from typing import Any

_UNSET = object()


def loops_level() -> int:
    """The ``stacklevel`` that makes a warnings.warn in the calling function name the loop's own line: the first frame
    outside accel's and torch's folders, contextlib (the ``with`` of an accel context manager) and torch.fx's
    generated forwards (a GraphModule's), however many hooks, wrappers and accel layers are between."""
    inside = (*(os.path.dirname(sys.modules[name].__file__) + os.sep for name in ("torch", "accel")),
              contextlib.__file__, "<eval_with_key>")
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


class AccelError(Exception):
    """Base of the errors accel raises for a user's mistake or an unusable input (never a bug of accel's)."""


class StaleWarning(UserWarning):
    """An object the user holds no longer drives the training (a plan replaced it); the message says what to use."""


class BypassWarning(UserWarning):
    """The loop went around the run (its own backward or optimizer step, its own accumulation): the message names
    the accelerator whose work that made idle and what to call instead."""


class LoopWarning(UserWarning):
    """A mistake of the loop's own that accel can see but not undo (run.step() with no backward since the last
    one): the message says what happened to the training and what to call instead."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a plan. kind: "unknown" (name or option), "value", "conflict", or "missing" (package or
    device: only these turn into skips when the accelerator is marked optional)."""

    accelerator: str
    message: str
    field: str | None = None
    value: Any = _UNSET
    allowed: str | None = None
    kind: str = "value"

    def __str__(self) -> str:
        where = named(self.accelerator) + (f".{named(self.field)}" if self.field else "")  # a user's key, maybe
        value = f"{brief(self.value)}: " if self.value is not _UNSET else ""
        return f"{where}: {value}{self.message}" + (f" (allowed: {self.allowed})" if self.allowed else "")


def brief(value: Any, most: int = 80) -> str:
    """A short repr of any value, however large or deep (a YAML alias bomb, a hostile checkpoint's contents)."""
    text = _BOUNDED.repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def named(name: Any, most: int = 80) -> str:
    """A name as given when it is short and printable, else its brief repr (a hostile key of a plan file)."""
    return name if isinstance(name, str) and len(name) <= most and name.isprintable() else brief(name, most)


_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 4, 200, 200
_BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxdict = _BOUNDED.maxset = 20


class PlanError(AccelError, ValueError):
    """Raised before anything is touched, listing every problem in the plan at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [f"{len(self.problems)} problem(s) in the plan; nothing was changed:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class AccelerateError(AccelError, RuntimeError):
    """An accelerator failed while being applied; every change made so far was rolled back."""


class LoopError(AccelError, RuntimeError):
    """The loop asked the run for something the plan cannot do (a double backward under compile); the message
    names the accelerator and the plans that can, and the run's weights, optimizer and counters are unchanged."""


class MeasureError(AccelError, ValueError):
    """What measuring (tune, plan="auto", bench) needs is not there: an optimizer, batches it can use, a copy."""


class CheckpointError(AccelError, ValueError):
    """A checkpoint cannot be read, or cannot be loaded into this run; the run was left as it was."""


class Skip(Exception):
    """Raised inside Accelerator.decide or apply to skip it with a reason that goes to the report."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)
