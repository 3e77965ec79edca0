"""Warnings filters and captures that hold in the calling thread only.

``warnings.catch_warnings`` swaps the process-wide filter list and restores the one it saw on entry, so two threads
in such blocks at once restore each other's lists and catch each other's warnings. Here a block adds an entry to the
user's list that matches only in its own thread, and a capture takes only its own thread's warnings.
"""
from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from accel.run.interrupts import clean_up, deferred

_LOCK = threading.RLock()
_captures: dict[int, tuple[int, list[warnings.WarningMessage]]] = {}  # id(capture) -> (its thread, it), oldest first
_shown_before: Any = None  # warnings._showwarnmsg before the first capture hooked it


class _ThreadMatch:
    """A filter's message pattern that matches in one thread only, the one inside the block that added it, and only
    until the block ends (``thread`` None): a ``catch_warnings()`` of another thread, entered while the block was
    open and left after it ended, puts back a list that still holds the entry."""

    def __init__(self, pattern: str):
        self.regex, self.thread = re.compile(pattern, re.I), threading.get_ident()

    def match(self, text: str) -> bool:
        return threading.get_ident() == self.thread and self.regex.match(text) is not None


@contextlib.contextmanager
def thread_filter(action: str, message: str = "") -> Iterator[None]:
    """Like ``warnings.filterwarnings(action, message)`` inside ``catch_warnings()``, for this thread only. A
    Ctrl-C at any point leaves no entry behind (accel.run.interrupts)."""
    entry = (action, _ThreadMatch(message), Warning, None, 0)  # this block's own: taken back once, however often
    try:
        _add(entry)
        yield
    finally:
        try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
            clean_up(_remove, entry)
        except BaseException:
            clean_up(_remove, entry)
            raise


def _add(entry: tuple) -> None:
    with deferred(), _LOCK:
        warnings.filters.insert(0, entry)
        warnings._filters_mutated()  # warnings already seen once show again (as catch_warnings does)


def _remove(entry: tuple) -> None:
    with _LOCK:  # (inside clean_up: signals held)
        entry[1].thread = None  # ended: matches nothing, wherever a list that holds it is put back
        if any(e is entry for e in warnings.filters):  # else removed already, or the user reset the filters
            warnings.filters.remove(entry)
        warnings._filters_mutated()


def _show(message: warnings.WarningMessage) -> None:
    """warnings' display hook while a capture is open: into the capture of the thread that warned, else on."""
    with _LOCK:
        mine = [caught for thread, caught in _captures.values() if thread == threading.get_ident()]
    if mine:
        mine[-1].append(message)
    else:
        (_shown_before or warnings._showwarnmsg_impl)(message)


@contextlib.contextmanager
def captured() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning this thread raises inside the block (``catch_warnings(record=True)`` with ``"always"``), none
    of another thread's; nothing is shown."""
    caught: list[warnings.WarningMessage] = []
    try:
        _hook(caught)
        with thread_filter("always"):
            yield caught
    finally:
        try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
            clean_up(_unhook, caught)
        except BaseException:
            clean_up(_unhook, caught)
            raise


def _hook(caught: list) -> None:
    global _shown_before
    with deferred(), _LOCK:
        if not _captures:
            _shown_before, warnings._showwarnmsg = warnings._showwarnmsg, _show
        _captures[id(caught)] = (threading.get_ident(), caught)


def _unhook(caught: list) -> None:
    global _shown_before
    with _LOCK:  # (inside clean_up: signals held)
        if _captures.pop(id(caught), None) is None:
            return
        if not _captures:
            if warnings._showwarnmsg is _show:
                warnings._showwarnmsg = _shown_before
            _shown_before = None
