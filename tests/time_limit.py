"""A time limit per test: a hang (a DataLoader worker that never answers, a rank that never joins) fails its own test
with the stack where it waited, instead of running CI into its 90-minute wall with nothing said.

signal's alarm is used, not pytest-timeout: nothing to install, and a test inside a C call that does not return
(a CUDA or NCCL call) is left to the outer bound (CI's, benchmarks/gpu/run.sh's) and to pytest's
faulthandler_timeout (pyproject.toml), which prints every thread's stack first."""
import contextlib
import signal


class TooLong(Exception):
    """The test ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    def expire(signum, frame):
        raise TooLong(f"{what} ran past its limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
