"""Critical sections that a Ctrl-C cannot tear: inside ``deferred()``, SIGINT (and a SIGTERM handled in Python) is
noted and delivered when the outermost section ends, so two things changed together (a journal entry and its change,
a checkpoint's tensors and counters) are never torn apart. A signal that lands on the call of a clean-up skips it
(CPython handles signals as a function is entered, before its first ``try``), so a clean-up is idempotent and its
caller calls it again from its own ``except BaseException``. Only the main thread receives signals."""
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
    previous, outermost = {}, not _depth
    if outermost:  # a note left by a section whose end a second signal interrupted (that one was delivered)
        _arrived.clear()
    _depth += 1
    try:  # (holding inside: a handler that raises between holding SIGINT and SIGTERM leaves nothing held)
        for signum in HELD if outermost else ():  # an inner section leaves holding and delivering to the outermost
            handler = signal.getsignal(signum)
            if callable(handler):  # a Python handler: KeyboardInterrupt's, or the user's own
                previous[signum] = handler
                signal.signal(signum, _note)
        yield
    finally:
        _depth -= 1
        if outermost:
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


def clean_up(work, *args) -> None:
    """work(*args) with signals held (``deferred``): the clean-up of the pattern in the module's docstring. A signal
    handled on entering this function skips it, so the caller calls it again from its own ``except BaseException``
    (``work`` is idempotent); no helper can retry its own call."""
    with deferred():
        work(*args)
