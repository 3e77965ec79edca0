import gc
import os
import signal

import pytest
from hypothesis import settings
from time_limit import time_limit

from accel.testing import process_state_restored

# CI draws the same generated cases on every run: a failure there is reproduced by running with CI=true, and a case
# that passes does not turn into another one that fails on the next push. Elsewhere each run draws new cases.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# A shell that starts the suite in the background without job control (`pytest ... &`, nohup, some schedulers)
# ignores SIGINT in it and in every process it starts, and Python then installs no KeyboardInterrupt handler: the
# fault tests send real Ctrl-Cs to this process and to subprocesses, as a user's terminal does. Give them Python's own.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A forked process (a DataLoader worker) inherits the garbage this long-lived process has not collected yet. A closed
# run ends the process group accel started (tests/test_group_released.py), but garbage that holds one (a test's own
# DDP over a group it joined) would, collected in the child, have gloo's destructor join the parent's threads, which do
# not exist there: the worker hangs, aborts or segfaults (tests/test_forked_workers.py;
# scripts/collect_in_forked_children.py shows it at once). Frozen across the fork (the use the gc docs give
# gc.freeze), what this process owns is finalized here, never there.
PYTEST_PROCESS = os.getpid()


def _freeze_before_fork():
    if os.getpid() == PYTEST_PROCESS:
        gc.freeze()


def _unfreeze_after_fork():
    if os.getpid() == PYTEST_PROCESS:
        gc.unfreeze()


os.register_at_fork(before=_freeze_before_fork, after_in_parent=_unfreeze_after_fork)

LIMIT_S = float(os.environ.get("ACCEL_TEST_LIMIT_S", "900"))  # the longest test takes 4 min on 2 busy cores


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Every test under a time limit (tests/time_limit.py); the GPU tests have their own (tests/cuda/conftest.py)."""
    if item.path.parent.name == "cuda":
        yield
        return
    with time_limit(LIMIT_S, item.nodeid):
        yield


@pytest.fixture(autouse=True)
def _restore_process_state():
    """Accelerators like threads change process-wide state; give every test a clean slate."""
    with process_state_restored():
        yield


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun --nproc-per-node 1's variables: ddp or fsdp joins a gloo group of one in this process, left by close."""
    import torch
    from scripts.launching import one_rank_env

    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    yield
    assert not torch.distributed.is_initialized()
