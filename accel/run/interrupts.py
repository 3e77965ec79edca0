"""Critical sections that a Ctrl-C cannot tear: the signal is held until the section ends, then delivered.

A KeyboardInterrupt can be raised between any two bytecodes. Where accel changes two things that must change
together (a journal entry and the change it records, a setting's layers and its value, a restore of a checkpoint's
tensors and counters), an interrupt in between leaves a state no undo can repair: a variable set that no journal
lists, a model half from the checkpoint. Inside ``deferred()`` the signals whose handler is Python's (SIGINT's
KeyboardInterrupt, a SIGTERM handler the user installed) are noted instead of handled; when the outermost section
ends, the old handlers are back and each noted signal is handled once, as if it had arrived then.

A section cannot start before its first line runs, and Python checks for signals when a function is called: a
Ctrl-C landing on the call of a clean-up (in an ``except`` or ``finally`` block) is raised before the clean-up
holds anything, and would skip it. So a clean-up is written idempotent and called as

    try:
        cleanup()          # holds signals inside (deferred)
    except BaseException:  # a Ctrl-C landed on the call: nothing was done, or all of it
        cleanup()
        raise

which no single signal can skip (a second Ctrl-C in the same instant still could).

Only the main thread receives signals in Python, so elsewhere the section holds nothing and costs nothing.
Signals whose handler is the OS's (SIGKILL, a SIGTERM nobody handles) end the process at once: what is on disk
stays whole by atomic renames (accel.files), not by this.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)
_depth = 0  # sections open in the main thread (they nest: a rollback inside a load)
_arrived: list[int] = []


def _note(signum, frame) -> None:
    if signum not in _arrived:
        _arrived.append(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT (and a Python handler's SIGTERM) until the block ends; then deliver what arrived."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth:  # inside an outer section: it delivers
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    previous = {}
    for signum in HELD:
        handler = signal.getsignal(signum)
        if callable(handler):  # a Python handler: KeyboardInterrupt's, or the user's own
            previous[signum] = handler
            signal.signal(signum, _note)
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        arrived = [s for s in _arrived if s in previous]
        _arrived.clear()
        for signum in arrived:  # the first handler that raises ends the section with its exception
            previous[signum](signum, None)


@contextlib.contextmanager
def autograd_kept() -> Iterator[None]:
    """torch's autograd switch as it was when the block ends with an exception: torch's own ``no_grad`` blocks
    (in an optimizer's state_dict, in load_state_dict) leave it off when a Ctrl-C lands between their last steps."""
    import torch

    enabled = torch.is_grad_enabled()
    try:
        yield
    except BaseException:
        torch.set_grad_enabled(enabled)
        raise


def held(work, *args) -> None:
    """work(*args) with signals held (``deferred``): the clean-up of the pattern in the module's docstring."""
    with deferred():
        work(*args)
