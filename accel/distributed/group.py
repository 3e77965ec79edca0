"""The process group: joined and left through a run's journal (layered: the last run that joined it leaves it),
torn down together at exit, gloo's workers drained before the interpreter finalizes; and helpers for training
scripts (is_main_process, all_reduce_mean), which also work in a single process, where they do nothing.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from accel.hardware.launcher import Launch, _initialized, rank
from accel.run.shared_settings import set_by_runs

__all__ = ["BACKEND_DEVICE", "DEVICE_BACKEND", "EXIT_BARRIER_S", "all_reduce_mean", "collective_device",
           "drain_gloo_workers", "gloo_workers_busy", "is_main_process", "join_group", "leave_group", "let_go"]

EXIT_BARRIER_S = 30


def leave_group() -> None:
    """At exit, and when run.close() gives back the group accel joined: wait for the other ranks (a crashed one at
    most EXIT_BARRIER_S), then tear down together: a rank leaving while its peers still talk to it can abort them."""
    if not _initialized():
        return
    with contextlib.suppress(Exception):  # at exit, a peer that is gone is not our failure
        if torch.distributed.get_backend() == "gloo":
            torch.distributed.monitored_barrier(timeout=timedelta(seconds=EXIT_BARRIER_S))
    torch.distributed.destroy_process_group()


GLOO_WORKER = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads
DRAIN_LIMIT_S = 5.0


def _gloo_states(task_dir: str = "/proc/self/task") -> list[str]:
    """The state of each of this process's gloo worker threads, from /proc: R runs or waits for the CPU, S is parked."""
    states = []
    for stat in Path(task_dir).glob("*/stat"):  # none where the folder is absent
        try:
            name, _, fields = stat.read_text().partition("(")[2].rpartition(")")
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(GLOO_WORKER):
            states += fields.split()[:1]
    return states


def gloo_workers_busy(task_dir: str = "/proc/self/task") -> int:
    """How many of this process's gloo worker threads are running or runnable (0 where /proc is absent)."""
    return _gloo_states(task_dir).count("R")


def drain_gloo_workers(limit_s: float = DRAIN_LIMIT_S, calm_polls: int = 3, poll_s: float = 0.005) -> bool:
    """Give gloo's worker threads the GIL and the CPU until each is parked (idle `calm_polls` times in a row), at most
    ``limit_s``; True when they were. DDP keeps its group, and so its workers, alive past destroy_process_group(); a
    worker dropping its last tensor needs the GIL, and one that takes it while the interpreter finalizes is ended
    through torch's noexcept frames: "terminate called without an active exception" after the script's last line."""
    if not _gloo_states():
        return True  # no gloo group was ever made here: nothing to wait for
    deadline, calm = time.monotonic() + limit_s, 0
    while calm < calm_polls:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)  # releases the GIL: a worker waiting for it takes it now
        calm = calm + 1 if not gloo_workers_busy() else 0
    return True


# Registered at import, so that it runs after leave_group and after every handler registered later (atexit runs
# them last-in first-out): the last thing before the interpreter finalizes.
atexit.register(drain_gloo_workers)


def _attempt_store(launch: Launch, timeout: timedelta):
    """torchrun's agent store under a prefix per restart (its static rendezvous keeps one store across restarts, whose
    ranks would read the killed attempt's addresses: pytorch/pytorch#135712), or None outside torchrun."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from torch.distributed import PrefixStore, TCPStore

    client = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), launch.world_size, is_master=False,
                      timeout=timeout)
    return PrefixStore(f"accel/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def join_group(journal, launch, backend: str, timeout_s: float) -> None:
    """Join the launcher's process group as a layered setting of this journal (accel.run.shared_settings): it stays
    until the last journal that joined it is undone, in any order. A group your script joined stays yours."""
    if torch.distributed.is_initialized() and not set_by_runs("process group"):
        return
    for key, value in launch.to_env().items():  # as env:// reads them; yours are kept
        if key not in os.environ or set_by_runs(("environ", key)):
            journal.setenv(key, value)
    journal.layer("process group", f"process group ({backend})", torch.distributed.is_initialized,
                  lambda joined: _join_or_leave(joined, launch, backend, timeout_s), True)


def _join_or_leave(joined: bool, launch: Launch, backend: str, timeout_s: float) -> None:
    """Join the group through env:// (join_group set the launcher's variables) or leave it (a barrier first: a rank
    leaving while a peer still talks aborts it)."""
    if joined and not torch.distributed.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        store = _attempt_store(launch, timeout)
        torch.distributed.init_process_group(backend, init_method=None if store else "env://", store=store,
                                             rank=launch.rank, world_size=launch.world_size, timeout=timeout)
        atexit.register(leave_group)  # a group left to the interpreter's exit can abort it ("terminate called ...")
    elif not joined and torch.distributed.is_initialized():
        leave_group()


def let_go(journal, what: str, holder: object, names: tuple[str, ...], empty: Callable[[], Any] = lambda: None
           ) -> bool:
    """Journal that ``holder`` (a wrapper or mesh accel made) lets go of the process group when the run is closed:
    its attributes ``names`` set to ``empty()``, their values kept only while the journal can still redo (a
    hand-over whose next plan fails). destroy_process_group() ends nothing a holder still has: gloo's threads live
    on, in garbage that a forked DataLoader worker inherits, whose destructor there joins threads it does not have.
    A group your script joined is not let go of: its threads are yours and live on, and the wrapper you may keep
    using after close (run.model) needs its hold. True when journaled."""
    if not set_by_runs("process group"):
        return False
    kept: dict[str, object] = {}

    def release():
        if kept:  # let go already
            return
        kept.update({name: getattr(holder, name) for name in names if getattr(holder, name, None) is not None})
        for name in kept:
            setattr(holder, name, empty())

    def restore():
        for name, value in kept.items():
            setattr(holder, name, value)
        kept.clear()
    journal.change(what, restore, release, kind="object")
    return True


def is_main_process() -> bool:
    """True on global rank 0, and in a single process: where to print, log and write files."""
    return rank() == 0


BACKEND_DEVICE = {"nccl": "cuda", "xccl": "xpu"}  # other backends reduce CPU tensors
DEVICE_BACKEND = {device: backend for backend, device in BACKEND_DEVICE.items()}  # every other device: gloo


def collective_device(group: Any = None) -> torch.device:
    """Where the group's backend reduces tensors: this rank's current device for nccl and xccl, else the cpu."""
    kind = BACKEND_DEVICE.get(torch.distributed.get_backend(group), "cpu")
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, getattr(torch, kind).current_device())


def all_reduce_mean(value: float | torch.Tensor) -> float | torch.Tensor:
    """The mean of a metric over all ranks (a float stays a float); the value itself in a single process."""
    if not _initialized():
        return value
    device = collective_device()
    dtype = torch.float64 if device.type == "cpu" else torch.float32
    tensor = torch.as_tensor(value, dtype=dtype, device=device).detach().clone()  # never the caller's own tensor
    torch.distributed.all_reduce(tensor)
    tensor /= torch.distributed.get_world_size()
    if isinstance(value, torch.Tensor):
        return tensor.to(device=value.device, dtype=value.dtype)
    return tensor.item()
