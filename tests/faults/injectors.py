"""The fault injectors of accel's fault suite: real signals at points hypothesis chooses, full disks, read-only
folders, the process's state to compare.

``signal_at(n, signum)`` sends a real signal to this process at the n-th call made inside the block (a Python
function's or a C function's: accel's, torch's, the standard library's), so a failing example names the exact
point; ``count_calls()`` says how many points a block has. A full disk is a tmpfs of a few hundred
KiB (mounting needs root: elsewhere those tests are skipped, saying so).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import uuid
import warnings
from pathlib import Path

import pytest
import torch

import accel
from accel.testing import tiny_loader, tiny_model, tiny_optimizer
from accel.testing.trace import global_hooks

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


@contextlib.contextmanager
def signal_at(point: int | None, signum: int = 2, within=None):
    """Send ``signum`` (SIGINT by default) to this process at the ``point``-th call inside the block (None: only
    count); ``within`` (a function) counts only the calls made while it runs. Yields a list whose length is the
    number of points passed."""
    passed: list[int] = []
    code, depth = getattr(within, "__code__", None), [0]

    def profile(frame, event, arg):
        if code is not None and frame.f_code is code and event in ("call", "return"):
            depth[0] += 1 if event == "call" else -1
        if event in ("call", "c_call") and (code is None or depth[0] > 0):
            passed.append(1)
            if len(passed) == point:
                os.kill(os.getpid(), signum)

    sys.setprofile(profile)
    try:
        yield passed
    finally:
        sys.setprofile(None)


def count_calls(block, within=None) -> int:
    """How many points signal_at offers in block() (within that function)."""
    with signal_at(None, within=within) as passed:
        block()
    return len(passed)


class Affinities(dict):
    """Each thread's CPUs; equal to another where the threads of both agree (threads torch started meanwhile, a
    compile's workers, are not the process's changed state)."""

    def __eq__(self, other):
        return isinstance(other, dict) and all(self[t] == other[t] for t in self.keys() & other.keys())

    __hash__ = None


def process_state() -> tuple:
    """What accel may change in the process and must put back: threads, environment, every thread's affinity,
    the warnings filters, torch's process-wide hooks."""
    affinity = Affinities({tid: tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir("/proc/self/task")
                           if _alive(tid)}) if hasattr(os, "sched_getaffinity") else None
    return torch.get_num_threads(), dict(os.environ), affinity, list(warnings.filters), global_hooks()


def _alive(tid: str) -> bool:
    try:
        os.sched_getaffinity(int(tid))
        return True
    except OSError:
        return False


def objects(seed: int = 0):
    model = tiny_model(seed)
    return model, tiny_optimizer(model), tiny_loader(samples=32, batch_size=16)


def warm_up() -> None:
    """One run opened and closed: torch writes TORCHINDUCTOR_CACHE_DIR at its first look-up, no run's change."""
    accel.accelerate(*objects(), plan=["threads"], device="cpu").close()


def train(run, steps: int = 2, clock=None) -> None:
    """steps of the README's loop, over as many epochs as it takes; on this clock (accel.clock.use), if given."""
    done = 0
    with accel.clock.use(clock) if clock is not None else contextlib.nullcontext():
        while done < steps:
            for x, y in run.loader:
                with run.autocast():
                    loss = torch.nn.functional.cross_entropy(run.model(x), y)
                run.backward(loss)
                run.step()
                done += 1
                if done == steps:
                    return


@contextlib.contextmanager
def tmpfs(size: str, options: str = ""):
    """A tmpfs of this size (a full disk in miniature), unmounted after; skipped where mounting is not allowed."""
    if not ROOT:
        pytest.skip("a full disk needs a tmpfs, which only root can mount (run the suite as root to include it)")
    where = Path(tempfile.mkdtemp(prefix="accel-tmpfs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{',' + options if options else ''}", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if done.returncode:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        where.rmdir()


def fill(disk: Path, leave: int) -> None:
    """Fill the disk but ``leave`` bytes (to a block)."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    with open(filler, "wb") as file:
        while True:
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            if free <= leave:
                break
            try:
                file.write(b"\0" * min(free - leave, 1 << 20))
                file.flush()
            except OSError:
                break


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder nothing can write into (for root too: a read-only tmpfs), or skipped."""
    if ROOT:
        with tmpfs("64k", "ro") as where:
            yield where
        return
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


def in_thread(target, *args):
    """Run target in a thread and return what it returned (or raise what it raised)."""
    box = {}

    def run():
        try:
            box["value"] = target(*args)
        except BaseException as error:  # noqa: BLE001 (handed to the caller)
            box["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


@contextlib.contextmanager
def profiled(hook):
    """sys.setprofile(hook) for the block."""
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)
