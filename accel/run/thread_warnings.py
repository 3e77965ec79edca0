"""Warnings filters and captures that hold in the calling thread only.

``warnings.catch_warnings`` swaps the process-wide filter list and restores the one it saw on entry, so two threads
in such blocks at once restore each other's lists and catch each other's warnings. Here a block adds one entry to the
user's list that matches only in the threads inside such a block, and a capture takes only its own thread's warnings.
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
_active: dict[tuple[str, str], _ThreadMatch] = {}  # (action, pattern) -> its entry's matcher while a block uses it
_captures: dict[int, list[list[warnings.WarningMessage]]] = {}  # thread -> its open captures, innermost last
_shown_before: Any = None  # warnings._showwarnmsg before the first capture hooked it


class _ThreadMatch:
    """A filter's message pattern that matches in the threads inside a block, and only there (``entry``: the filter)."""

    def __init__(self, action: str, pattern: str):
        self.regex, self.threads = re.compile(pattern, re.I), {}
        self.entry = (action, self, Warning, None, 0)

    def match(self, text: str) -> bool:
        return threading.get_ident() in self.threads and self.regex.match(text) is not None


@contextlib.contextmanager
def thread_filter(action: str, message: str = "") -> Iterator[None]:
    """Like ``warnings.filterwarnings(action, message)`` inside ``catch_warnings()``, for this thread only. A
    Ctrl-C at any point leaves no entry behind (accel.run.interrupts)."""
    token = object()  # this block's claim on the entry: taken back once, however often the clean-up runs
    try:
        _claim(action, message, token)
        yield
    finally:
        try:  # twice if a Ctrl-C lands on the call (accel.run.interrupts)
            clean_up(_release, action, message, token)
        except BaseException:
            clean_up(_release, action, message, token)
            raise


def _claim(action: str, message: str, token: object) -> None:
    with deferred(), _LOCK:
        matcher = _active.get((action, message))
        if matcher is None:
            matcher = _active[(action, message)] = _ThreadMatch(action, message)
            warnings.filters.insert(0, matcher.entry)
        matcher.threads.setdefault(threading.get_ident(), set()).add(token)
        warnings._filters_mutated()  # warnings already seen once show again (as catch_warnings does)


def _release(action: str, message: str, token: object) -> None:
    with _LOCK:  # (inside clean_up: signals held)
        matcher, me = _active.get((action, message)), threading.get_ident()
        if matcher is None or token not in matcher.threads.get(me, ()):
            return
        matcher.threads[me].discard(token)
        if not matcher.threads[me]:
            del matcher.threads[me]
        if not matcher.threads:
            del _active[(action, message)]
            with contextlib.suppress(ValueError):  # the user may have reset the filters meanwhile
                warnings.filters.remove(matcher.entry)
        warnings._filters_mutated()


def _show(message: warnings.WarningMessage) -> None:
    """warnings' display hook while a capture is open: into the capture of the thread that warned, else on."""
    captures = _captures.get(threading.get_ident())
    if captures:
        captures[-1].append(message)
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
        _captures.setdefault(threading.get_ident(), []).append(caught)


def _unhook(caught: list) -> None:
    global _shown_before
    with _LOCK:  # (inside clean_up: signals held)
        mine = _captures.get(threading.get_ident(), [])
        if not any(c is caught for c in mine):
            return
        mine[:] = [c for c in mine if c is not caught]
        if not mine:
            del _captures[threading.get_ident()]
        if not _captures:
            if warnings._showwarnmsg is _show:
                warnings._showwarnmsg = _shown_before
            _shown_before = None
