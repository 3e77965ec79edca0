"""Distributed runs: read the launcher's environment, start the process group, and helpers for training scripts.

torchrun, Open MPI, Intel MPI / MPICH and SLURM each name rank and world size differently; they are mapped to
the RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE that torch's env:// initialisation reads. The helpers
(is_main_process, barrier, all_reduce_mean) also work in a single process, where they do nothing.
"""
from __future__ import annotations

import atexit
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch

from accel.hardware import parse_cpu_list

__all__ = ["Launch", "all_reduce_mean", "barrier", "cores_for_rank", "init_process_group", "is_main_process",
           "launcher_environment", "node_cores", "rank", "rank_cores", "world_size", "drain_gloo_workers"]

CORE_MAP_VARIABLE = "ACCEL_CORE_MAP"  # `accel launch`'s cores per local rank: "0,1;2,3" (rank 0: 0,1; rank 1: 2,3)
NODE_CPUS_VARIABLE = "ACCEL_NODE_CPUS"  # `accel launch`'s node: the physical CPUs it shared out, "0-3"

# launcher -> (rank, world size, local rank, local world size) variable names, in order of precedence:
# torchrun comes first, because `srun torchrun ...` and `mpirun torchrun ...` leave the outer variables set.
LAUNCHERS = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "intel-mpi/mpich": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE"),
}


@dataclass(frozen=True)
class Launch:
    """Where this process sits in a launched job."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    def to_env(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size)}


def slurm_tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """SLURM's compressed per-node task counts: '4,2(x3)' with node 2 -> 2."""
    counts: list[int] = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", tasks_per_node):
        counts += [int(count)] * int(repeat or 1)
    return counts[min(node_id, len(counts) - 1)]


def launcher_environment(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """This process's rank and world from the first launcher whose rank and size variables are set; None alone.

    A missing local size (a hand-set RANK/WORLD_SIZE, an MPI without it) means one node: local = global.
    """
    for launcher, (rank_key, size_key, local_key, local_size_key) in LAUNCHERS.items():
        if rank_key not in environ or size_key not in environ:
            continue
        rank, world = int(environ[rank_key]), int(environ[size_key])
        local_rank = int(environ.get(local_key, rank))
        local_size = environ.get(local_size_key, "")
        if launcher == "slurm" and local_size:
            local_world = slurm_tasks_on_node(local_size, int(environ.get("SLURM_NODEID", 0)))
        else:
            local_world = int(local_size) if local_size else world
        return Launch(launcher, rank, world, local_rank, local_world)
    return None


def cores_for_rank(physical_cpus: tuple[int, ...], local_rank: int, local_world: int,
                   per_rank: int | None = None) -> tuple[int, ...]:
    """The book's CPU allocation map: local ranks get disjoint, contiguous, equal shares of physical cores.

    With more ranks than cores, ranks share cores round-robin (oversubscribed, never empty).
    """
    share = per_rank or max(1, len(physical_cpus) // local_world)
    start = (local_rank * share) % max(1, len(physical_cpus))
    return tuple(physical_cpus[start:start + share])


def rank_cores(physical_cpus: tuple[int, ...], launch: Launch | None,
               environ: Mapping[str, str] = os.environ) -> tuple[tuple[int, ...], str]:
    """This rank's cores and where they came from: `accel launch`'s map, else the local-rank partition."""
    local_rank, local_world = (launch.local_rank, launch.local_world_size) if launch else (0, 1)
    shares = environ.get(CORE_MAP_VARIABLE, "").split(";")
    if local_rank < len(shares) and shares[local_rank]:
        return parse_cpu_list(shares[local_rank]), "accel launch"
    return cores_for_rank(physical_cpus, local_rank, local_world), f"partition of {len(physical_cpus)} physical cores"


def node_cores(physical_cores: int, environ: Mapping[str, str] = os.environ) -> int:
    """The node's physical cores, which a rank pinned by `accel launch` no longer sees (its affinity is its
    share): what a single process on the same node counts. Elsewhere (a single process, torchrun, which pins
    nothing) the cores this process sees."""
    node = environ.get(NODE_CPUS_VARIABLE, "")
    try:
        return len(parse_cpu_list(node)) if node else physical_cores
    except ValueError:
        return physical_cores


EXIT_BARRIER_S = 30


def init_process_group(backend: str, timeout_s: float, environ=os.environ) -> Launch:
    """Map the launcher's variables (keeping any the user set) and join the group through env://."""
    import torch.distributed as dist

    launch = launcher_environment(environ)
    if launch is None:
        raise RuntimeError("no launcher environment: start with accel launch, torchrun, mpirun or srun")
    for key, value in launch.to_env().items():
        environ.setdefault(key, value)
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        store = _attempt_store(launch, environ, timeout)
        dist.init_process_group(backend, init_method=None if store else "env://", store=store, rank=launch.rank,
                                world_size=launch.world_size, timeout=timeout)
        atexit.register(leave_group)  # a group left to the interpreter's exit can abort it ("terminate called ...")
    return launch


def leave_group() -> None:
    """At exit, and when run.close() takes back the group accel started: wait (briefly) for the other ranks, then
    tear the group down together.

    A rank that tears down while its peers still talk to it can abort them ("terminate called without an
    active exception", seen in about 1 of 10 two-rank gloo launches here); a rank that crashed is not waited for
    longer than EXIT_BARRIER_S.
    """
    if not _initialized():
        return
    dist = torch.distributed
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=EXIT_BARRIER_S))
    except Exception:  # at exit, a peer that is gone is not our failure
        pass
    dist.destroy_process_group()


GLOO_WORKER = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads
DRAIN_LIMIT_S = 5.0


def _task_comms(task_dir: str = "/proc/self/task") -> list[str]:
    try:
        return [f"{task_dir}/{tid}/comm" for tid in os.listdir(task_dir)]
    except OSError:
        return []


def _read_text(path: str) -> str:
    """A /proc file's text, or '' where the thread ended meanwhile."""
    try:
        with open(path) as comm:
            return comm.read()
    except OSError:  # the thread ended meanwhile
        return ""


def gloo_workers_busy(task_dir: str = "/proc/self/task") -> int:
    """How many of this process's gloo worker threads are running or runnable (state R), from /proc; 0 where
    there is none or /proc is absent. A parked worker (waiting for work) sleeps in S."""
    busy = 0
    for path in _task_comms(task_dir):
        if _read_text(path).startswith(GLOO_WORKER):
            stat = _read_text(path[:-len("comm")] + "stat")
            busy += stat.rsplit(")", 1)[-1].split()[:1] == ["R"]
    return busy


def drain_gloo_workers(limit_s: float = DRAIN_LIMIT_S, calm_polls: int = 3, poll_s: float = 0.005) -> bool:
    """Give gloo's worker threads the GIL and the CPU until each is parked (seen idle `calm_polls` times in a
    row), at most ``limit_s``; True when they were.

    Why: DDP keeps its process group alive past ``destroy_process_group()`` (on torch 2.15 the first DDP wrapper in
    a process leaves 10 references to its group that outlive the wrapper), so the group's worker threads outlive it. A worker that finished a collective still drops its
    last reference to that work, and so to the tensors in it; a tensor whose Python object outlived the Python side
    needs the GIL to be freed. If the interpreter is finalizing by then, Python ends that thread with a forced
    unwind through torch's noexcept frames: std::terminate, "terminate called without an active exception",
    SIGABRT after the script's last line (seen in 1 of 10 two-rank gloo runs on a busy 2-core machine; gdb showed
    the worker in ~AsyncAllgatherWork -> THPVariable_clear -> take_gil -> pthread_exit). Waiting here, while
    the interpreter still runs and the GIL is free, lets that worker finish first.
    """
    if not any(_read_text(path).startswith(GLOO_WORKER) for path in _task_comms()):
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


def _attempt_store(launch: Launch, environ, timeout: timedelta):
    """torchrun's agent store under a prefix per restart, or None outside torchrun.

    Its static rendezvous (the default) keeps one store across --max-restarts, so restarted ranks could read
    the killed attempt's gloo addresses and fail with "connection refused" (cf. pytorch/pytorch#135712).
    """
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from torch.distributed import PrefixStore, TCPStore

    client = TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), launch.world_size, is_master=False,
                      timeout=timeout)
    return PrefixStore(f"accel/attempt_{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if _initialized() else 1


def is_main_process() -> bool:
    """True on global rank 0, and in a single process: where to print, log and write files."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (nothing to wait for in a single process)."""
    if _initialized():
        torch.distributed.barrier()


BACKEND_DEVICE = {"nccl": "cuda", "xccl": "xpu"}  # other backends reduce CPU tensors


def all_reduce_mean(value: float | torch.Tensor) -> float | torch.Tensor:
    """The mean of a metric over all ranks (a float stays a float); the value itself in a single process."""
    if not _initialized():
        return value
    device = BACKEND_DEVICE.get(torch.distributed.get_backend(), "cpu")
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to(device=device, dtype=torch.float64 if device == "cpu" else torch.float32).clone()
    else:
        tensor = torch.tensor(float(value), dtype=torch.float64 if device == "cpu" else torch.float32, device=device)
    torch.distributed.all_reduce(tensor)
    tensor /= torch.distributed.get_world_size()
    if isinstance(value, torch.Tensor):
        return tensor.to(device=value.device, dtype=value.dtype)
    return tensor.item()
