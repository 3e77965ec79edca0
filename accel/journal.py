"""The undo journal: every change an accelerator makes outside its own new objects, with how to undo and redo it.

Process state (threads, CPU affinity, environment variables, backend flags) and the placement of the user's
tensors (a model moved to its device) go through a Journal. accelerate() rolls it back when a plan fails
half-way, so the user's objects and the process are exactly as they were; tune keeps one journal per candidate
and switches candidates by undoing one and redoing the other; run.close() puts the process back.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

_MISSING = object()


def pin_process(cpus) -> int:
    """Set the affinity of every thread of this process (the OpenMP pool included); returns threads pinned."""
    cpus = tuple(cpus)
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    pinned = 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            pinned += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return pinned


def _affinity() -> tuple[int, ...] | None:
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None


@dataclass
class Entry:
    what: str
    redo: Callable[[], None]
    undo: Callable[[], None]
    process: bool  # process-wide (threads, env, flags) rather than the placement of the user's tensors


class Journal:
    """Changes made so far, in order; ``rollback`` undoes them newest first."""

    def __init__(self):
        self.entries: list[Entry] = []
        self.active = True

    def change(self, what: str, redo: Callable[[], None], undo: Callable[[], None], process: bool = True) -> None:
        """Make a change now (``redo``) and remember how to take it back (``undo``). A redo that fails half-way
        is undone at once, so a rollback never meets a half-made change."""
        try:
            redo()
        except BaseException:
            with contextlib.suppress(Exception):  # the redo's own error is the one to report
                undo()
            raise
        self.entries.append(Entry(what, redo, undo, process))

    def setenv(self, key: str, value: str) -> None:
        old = os.environ.get(key, _MISSING)
        self.change(f"environment {key}={value}", lambda: os.environ.__setitem__(key, value),
                    lambda: os.environ.pop(key, None) if old is _MISSING else os.environ.__setitem__(key, old))

    def set_threads(self, threads: int) -> None:
        old = torch.get_num_threads()
        self.change(f"torch threads {threads}", lambda: torch.set_num_threads(threads),
                    lambda: torch.set_num_threads(old))

    def set_affinity(self, cpus) -> bool:
        """Pin every thread to these CPUs; False where the OS offers no affinity (then nothing changed)."""
        old, cpus = _affinity(), tuple(cpus)
        if old is None:
            return False
        self.change(f"affinity {cpus}", lambda: pin_process(cpus), lambda: pin_process(old))
        return True

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """A flag on a module-level object, e.g. torch.backends.cudnn.benchmark."""
        old = getattr(obj, name)
        self.change(f"{getattr(obj, '__name__', type(obj).__name__)}.{name}={value}",
                    lambda: setattr(obj, name, value), lambda: setattr(obj, name, old))

    def move_module(self, module: torch.nn.Module, device: torch.device) -> None:
        """module.to(device) in place, remembering every tensor it replaced so undo restores them exactly.

        torch moves a gradient by assigning its .data (the same object, moved) and may swap in new Parameter
        objects; so the parameter dicts, each parameter's data and each gradient's data are all kept.
        """
        saved = [(m, dict(m._parameters), {k: (p, p.data, p.grad, None if p.grad is None else p.grad.data)
                                           for k, p in m._parameters.items() if p is not None}, dict(m._buffers))
                 for m in module.modules()]

        def undo():
            for m, parameters, params, buffers in saved:
                m._parameters.update(parameters)
                for p, data, grad, grad_data in params.values():
                    if grad is not None:
                        p.grad = None  # a moved gradient may no longer match the restored data's device/dtype
                        grad.data = grad_data
                    p.data = data
                    p.grad = grad
                m._buffers.update(buffers)

        self.change(f"model to {device}", lambda: module.to(device), undo, process=False)

    def rollback(self) -> None:
        """Undo every change, newest first (process state and tensor placement), and forget them. An undo that
        fails does not stop the others; the failures are raised together at the end."""
        failed = []
        for entry in reversed(self.entries):
            if entry.process is False or self.active:
                try:
                    entry.undo()
                except Exception as error:
                    failed.append(f"{entry.what}: {type(error).__name__}: {error}")
        self.entries.clear()
        self.active = True
        if failed:
            raise RuntimeError("could not undo " + "; ".join(failed))

    def suspend(self) -> None:
        """Undo the process-wide changes only, keeping them to redo (tune switching between candidates)."""
        if self.active:
            for entry in reversed(self.entries):
                if entry.process:
                    entry.undo()
            self.active = False

    def resume(self) -> None:
        if not self.active:
            for entry in self.entries:
                if entry.process:
                    entry.redo()
            self.active = True

    def release_objects(self) -> None:
        """After a plan succeeded: forget the user's old tensors (placement stays), keep process changes."""
        self.entries = [e for e in self.entries if e.process]

    def __repr__(self) -> str:
        return f"Journal({[e.what for e in self.entries]})"
