"""Accelerators written for 0.2 keep working for one release, each with a DeprecationWarning that says what to write.

0.2's contract: options declared as ``options = {name: Option(...)}`` and set as attributes, per-run state set on
``self`` in ``apply``, and hooks without the ``state`` argument. 0.3's (accel/plan/contract.py): a frozen ``Options``
dataclass read as ``self.config``, the ``State`` that ``apply`` returns, handed to every hook. Accelerators shipped
with accel follow 0.3 strictly: for them each of these is recorded in ``BROKEN``, which the lifecycle test
requires empty (tests/test_contract.py), instead of warning the user about accel's own code.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

from accel.plan.options import options_from_specs

# each hook's arguments in 0.3, after self: the position of ``state`` is what a 0.2 hook lacks
HOOKS = {
    "forward_context": ("run", "state"),
    "backward": ("run", "state", "loss", "proceed"),
    "step": ("run", "state", "optimizer", "proceed"),
    "optimizer_step": ("run", "state", "optimizer", "proceed"),
    "unscale_gradients": ("run", "state", "optimizer"),
    "unwrap": ("state", "model"),
    "relies_on": ("state",),
    "bypassed": ("run", "state", "call"),
    "state_dict": ("state",),
    "load_state_dict": ("state", "saved"),
}


BROKEN: set[str] = set()  # where an accelerator shipped with accel breaks 0.3's contract (must stay empty)


def builtin(cls: type) -> bool:
    return cls.__module__.startswith("accel.")


def broken(cls: type, what: str) -> bool:
    """Record a built-in's breach (True), or say nothing for a user's class (False: it warns instead)."""
    if builtin(cls):
        BROKEN.add(f"{cls.__name__}: {what}")
    return builtin(cls)


def adapt(cls: type, base: type) -> None:
    """Give a 0.2-style subclass an Options dataclass built from its ``options`` dict, and hooks taking ``state``."""
    if "options" in cls.__dict__ and "Options" not in cls.__dict__:
        parent = next(c.Options for c in cls.__mro__[1:] if hasattr(c, "Options"))
        specs = {**parent.specs(), **cls.__dict__["options"]}
        specs.pop("optional", None)
        cls.Options = options_from_specs(f"{cls.__name__}Options", specs)
        broken(cls, "declares options as a dict, not an Options dataclass") or deprecated(
            cls, "declares options as a dict; declare a frozen dataclass: class Options(accel.Options): "
                 "steps: int = accel.option(1)  (read as self.config.steps)")
    legacy = set(getattr(cls, "legacy_hooks", ()))
    for hook, arguments in HOOKS.items():
        method = cls.__dict__.get(hook)
        if method is None or isinstance(method, (classmethod, staticmethod)):
            continue
        given = [p for p in inspect.signature(method).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
        if len(given) == len(arguments) - 1:
            setattr(cls, hook, without_state(method, arguments.index("state")))
            legacy.add(hook)
    if legacy - set(getattr(cls, "legacy_hooks", ())) and not broken(cls, f"hooks {sorted(legacy)} take no state"):
        deprecated(cls, f"hooks {sorted(legacy)} take no state; write them as accel.Accelerator's (the state apply "
                        "returned is their argument after run)")
    cls.legacy_hooks = frozenset(legacy)


def without_state(method, index: int):
    @functools.wraps(method)
    def adapted(self, *args):
        return method(self, *args[:index], *args[index + 1:])
    return adapted


def set_on_accelerator(accelerator: Any, key: str, value: Any) -> None:
    """0.3 sets nothing on an accelerator after construction: per-run state is the State apply returns."""
    if not broken(type(accelerator), f"sets {key!r} on itself after construction"):
        deprecated(type(accelerator), f"sets {key!r} on itself; keep per-run state in the State apply returns")
    object.__setattr__(accelerator, key, value)


def option_read(accelerator: Any, key: str) -> Any:
    """``self.steps`` of a 0.2-style accelerator: its option, now ``self.config.steps``."""
    config = accelerator.__dict__.get("config")
    if key.startswith("__") or config is None or key not in type(config).specs():
        raise AttributeError(f"{type(accelerator).__name__!r} object has no attribute {key!r}")
    if not broken(type(accelerator), f"reads the option {key!r} as self.{key}"):
        deprecated(type(accelerator), f"reads the option {key!r} as self.{key}; read self.config.{key}")
    return getattr(config, key)


_said: set[tuple[str, str]] = set()


def deprecated(cls: type, what: str) -> None:
    """Once per class and message: the class keeps working for one release."""
    if (cls.__qualname__, what) not in _said:
        _said.add((cls.__qualname__, what))
        warnings.warn(f"accel: {cls.__name__} {what} (0.2's contract, removed in 0.4; docs/migration.md)",
                      DeprecationWarning, stacklevel=4)


class Applied:
    """``run.accelerator(name)`` where the accelerator keeps a run state: the accelerator itself, and 0.2's reads of
    that state through it (``run.accelerator("grad_clipping").last_norm``), each with a DeprecationWarning."""

    def __init__(self, accelerator: Any, state: Any):
        object.__setattr__(self, "_accelerator", accelerator)
        object.__setattr__(self, "_state", state)

    def __getattr__(self, key: str) -> Any:
        accelerator, state = self._accelerator, self._state
        if key.startswith("__") or key in type(accelerator).__dict__ or not hasattr(state, key) or hasattr(
                type(accelerator), key):
            return getattr(accelerator, key)
        deprecated(Applied, f"read {key!r} from run.accelerator({accelerator.name!r}); read "
                            f"run.state({accelerator.name!r}).{key}")
        return getattr(state, key)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"run.accelerator({self._accelerator.name!r}) is read-only; its state is "
                             f"run.state({self._accelerator.name!r})")

    def __repr__(self) -> str:
        return repr(self._accelerator)
