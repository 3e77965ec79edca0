"""The undo journal: every change an accelerator makes outside its own new objects, with how to undo and redo it.

Its kinds: ``process`` (threads, affinity, environment, backend flags, a process group: layers of values shared by
every open run, accel/run/shared_settings.py), ``setup`` (undone only if the plan fails: the model moved to the
device, an earlier run closed) and ``object`` (how the user's objects run, never what they hold: a hook,
``fused=True``). A failed plan rolls everything back; run.close() undoes the process and object changes.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from accel.run.interrupts import clean_up, deferred
from accel.run.shared_settings import Layer

_MISSING = object()


def _each_thread(work: Callable[[int], None]) -> int:
    """work(tid) for every thread of this process; returns how many it was done for."""
    done = 0
    for tid in [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]:
        try:
            work(tid)
            done += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return done


@dataclass(frozen=True)
class Affinity:
    """The calling thread's CPUs (``cpus``: what a run sets and compares) and every thread's own (``threads``: what
    is put back, so a thread you pinned elsewhere returns there; one started meanwhile takes ``cpus``)."""

    cpus: tuple[int, ...]
    threads: dict[int, tuple[int, ...]] = field(compare=False)


def _affinity() -> Affinity | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    threads: dict[int, tuple[int, ...]] = {}
    _each_thread(lambda tid: threads.__setitem__(tid, tuple(sorted(os.sched_getaffinity(tid)))))
    return Affinity(tuple(sorted(os.sched_getaffinity(0))), threads)


def _pin(value: Affinity) -> int:
    """Put each thread on its own CPUs (``threads``), a thread not listed there on ``cpus``; returns threads pinned."""
    return _each_thread(lambda tid: os.sched_setaffinity(tid, value.threads.get(tid, value.cpus)))


def pin_process(cpus) -> int:
    """Set the affinity of every thread of this process (the OpenMP pool included); returns threads pinned."""
    return _pin(Affinity(tuple(cpus), {}))


class Entry(NamedTuple):
    what: str
    redo: Callable[[], None]
    undo: Callable[[], None]
    kind: str  # one of KINDS (see the module's docstring)


KINDS = ("process", "setup", "object")


class Journal:
    """Changes made so far, in order; ``rollback`` undoes them newest first."""

    def __init__(self):
        self.entries: list[Entry] = []
        self.active = True

    def change(self, what: str, redo: Callable[[], None], undo: Callable[[], None], kind: str = "process") -> None:
        """Make a change now (``redo``) and remember how to take it back (``undo``); a redo that fails half-way is
        undone at once. The entry is listed first, so a Ctrl-C just after the change leaves none that no undo knows
        of: an undo must be harmless on a change not made, a redo on a change already made."""
        if kind not in KINDS:
            raise ValueError(f"journal: kind {kind!r} is not one of {KINDS}")
        entry = Entry(what, redo, undo, kind)
        self.entries.append(entry)
        try:
            redo()
        except BaseException:
            try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
                clean_up(self._forget, entry)
            except BaseException:
                clean_up(self._forget, entry)
                raise
            raise

    def _forget(self, entry: Entry) -> None:
        """Undo a change whose redo failed or was interrupted, and drop its entry (once, however often called)."""
        if any(e is entry for e in self.entries):
            with contextlib.suppress(Exception):  # the redo's own error is the one to report
                entry.undo()
            self.entries = [e for e in self.entries if e is not entry]

    def layer(self, key: Hashable, what: str, read: Callable[[], Any], write: Callable[[Any], None],
              value: Any) -> None:
        """A process-wide value as a layer of its Setting: undone, it restores what other runs or the process had."""
        layer = Layer(key, value, read, write)
        self.change(what, layer.put, layer.take)

    def setenv(self, key: str, value: str) -> None:
        self.layer(("environ", key), f"environment {key}={value}", lambda: os.environ.get(key, _MISSING),
                   lambda v: os.environ.pop(key, None) if v is _MISSING else os.environ.__setitem__(key, v), value)

    def set_threads(self, threads: int) -> None:
        self.layer("torch threads", f"torch threads {threads}", torch.get_num_threads, torch.set_num_threads, threads)

    def set_affinity(self, cpus) -> bool:
        """Pin every thread to these CPUs; False where the OS offers no affinity (then nothing changed)."""
        cpus = tuple(sorted(cpus))
        if _affinity() is None:
            return False
        self.layer("affinity", f"affinity {cpus}", _affinity, _pin, Affinity(cpus, {}))
        return True

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """A flag on a module-level object, e.g. torch.backends.cudnn.benchmark."""
        self.layer(("attribute", id(obj), name), f"{getattr(obj, '__name__', type(obj).__name__)}.{name}={value}",
                   lambda: getattr(obj, name), lambda v: setattr(obj, name, v), value)

    def move_module(self, module: torch.nn.Module, device: torch.device) -> None:
        """module.to(device) in place, keeping what undo restores exactly: torch may swap in new Parameter objects
        and moves a gradient by assigning its .data, so the parameter dicts and each parameter's and gradient's data
        are kept."""
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

        self.change(f"model to {device}", lambda: module.to(device), undo, kind="setup")

    def hook(self, what: str, register: Callable[[], Any]) -> None:
        """A hook on one of the user's objects (``register`` returns its handle), removed by undo."""
        handles = []  # at most one: registered once however often redone, removed once however often undone
        self.change(what, lambda: handles or handles.append(register()), lambda: handles and handles.pop().remove(),
                    kind="object")

    def set_item(self, mapping: Any, key: str, value: Any, what: str = "") -> None:
        """mapping[key] = value on a user's object (a param group), undone exactly (a missing key is removed again)."""
        old = mapping.get(key, _MISSING)
        self.change(what or f"{key}={value}", lambda: mapping.__setitem__(key, value),
                    lambda: mapping.pop(key, None) if old is _MISSING else mapping.__setitem__(key, old), kind="object")

    def rollback(self) -> None:
        """Undo every change, newest first, and forget them; an undo that fails does not stop the others (raised
        together at the end). A Ctrl-C waits until every change is undone (accel.run.interrupts)."""
        failed = []
        with deferred():
            for entry in reversed(self._made()):
                try:
                    entry.undo()
                except Exception as error:
                    failed.append(f"{entry.what}: {type(error).__name__}: {error}")
            self.entries.clear()
            self.active = True
        if failed:
            raise RuntimeError("could not undo " + "; ".join(failed))

    def suspend(self) -> None:
        """Undo the process-wide changes only, keeping them to redo (tune switching between candidates); their
        layers leave the registry, and ``resume`` puts them back in their place among the other runs'."""
        with deferred():
            for entry in reversed(self._made("process")):
                entry.undo()
            self.active = False

    def resume(self) -> None:
        with deferred():
            for entry in [e for e in self.entries if e.kind == "process" and not self.active]:
                entry.redo()
            self.active = True

    def commit(self) -> None:
        """After a plan succeeded: the setup stays; the process and object changes stay recorded, for run.close()."""
        self.entries = [e for e in self.entries if e.kind != "setup"]

    def detach(self) -> Journal:
        """These changes, handed to a new journal (this one left empty) that can put them back if its plan fails."""
        moved = Journal()
        moved.entries, moved.active = self.entries, self.active
        self.entries, self.active = [], True
        return moved

    def attach(self, moved: Journal) -> None:
        """Take back the changes ``detach`` handed over (an earlier run put back when the next plan failed)."""
        self.entries, self.active = moved.entries + self.entries, moved.active

    def undo_all(self) -> None:
        """Undo every change, newest first, keeping them to redo (``redo_all``)."""
        with deferred():
            for entry in reversed(self._made()):
                entry.undo()

    def redo_all(self) -> None:
        with deferred():
            for entry in self._made():
                entry.redo()

    def _made(self, kind: str = "") -> list[Entry]:
        """The changes in effect (of one kind): every one but the process-wide ones while suspended."""
        return [e for e in self.entries if (e.kind != "process" or self.active) and e.kind == (kind or e.kind)]

    def __repr__(self) -> str:
        return f"Journal({[e.what for e in self.entries]})"
