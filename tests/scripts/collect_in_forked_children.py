"""A pytest plugin that makes every forked child (a DataLoader worker) collect all its garbage first thing, as its
collector may at any allocation: what it inherited and would finalize shows at once, not once in many runs.

    pytest -p scripts.collect_in_forked_children tests/...

A child that hangs there is ended by SIGALRM ("killed by signal: Alarm clock"). tests/conftest.py freezes the
collector's objects across each fork, so with it nothing inherited is collected; without it, the closed runs of
earlier tests (their gloo process groups) hang or crash the workers of later ones (tests/test_forked_workers.py).
"""
import gc
import os
import signal

HANG_S = 20


def _collect_all() -> None:
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(HANG_S)
    gc.collect()
    signal.alarm(0)


os.register_at_fork(after_in_child=_collect_all)
