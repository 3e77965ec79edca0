"""threads: intra/inter-op threads, CPU affinity to physical cores, and the book's OpenMP variables.

OpenMP reads its variables when the runtime loads (at `import torch`), so in this process only
torch.set_num_threads and the affinity take effect; the variables are exported for child processes
(DataLoader workers, subprocesses) and for the next start, e.g. through `accel launch`.
"""
from __future__ import annotations

import os
import warnings

import torch

from accel.accelerator import Accelerator, Option, Stage, at_least, register
from accel.distributed import launcher_environment
from accel.hardware import format_cpu_list, loaded_openmp, parse_cpu_list

CORE_MAP_VARIABLE = "ACCEL_CORE_MAP"  # `accel launch`'s cores per local rank: "0,1;2,3" (rank 0: 0,1; rank 1: 2,3)


def local_rank_layout(environ=os.environ) -> tuple[int, int]:
    """(local rank, local world size) from torchrun, Open MPI, Intel MPI/MPICH or SLURM; (0, 1) alone."""
    launch = launcher_environment(environ)
    return (launch.local_rank, launch.local_world_size) if launch else (0, 1)


def cores_for_rank(physical_cpus: tuple[int, ...], local_rank: int, local_world: int,
                   per_rank: int | None = None) -> tuple[int, ...]:
    """The book's CPU allocation map: local ranks get disjoint, contiguous, equal shares of physical cores.

    With more ranks than cores, ranks share cores round-robin (oversubscribed, never empty).
    """
    share = per_rank or max(1, len(physical_cpus) // local_world)
    start = (local_rank * share) % max(1, len(physical_cpus))
    return tuple(physical_cpus[start:start + share])


def rank_cores(physical_cpus: tuple[int, ...], environ=os.environ) -> tuple[tuple[int, ...], str]:
    """This rank's cores and where they came from: `accel launch`'s choice, else the local-rank partition."""
    local_rank, local_world = local_rank_layout(environ)
    shares = environ.get(CORE_MAP_VARIABLE, "").split(";")
    if local_rank < len(shares) and shares[local_rank]:
        return parse_cpu_list(shares[local_rank]), "accel launch"
    return cores_for_rank(physical_cpus, local_rank, local_world), f"partition of {len(physical_cpus)} physical cores"


def openmp_variables(runtime: str, cpus: tuple[int, ...], threads: int) -> dict[str, str]:
    """The book's settings (chapter 4) for the loaded runtime."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if runtime == "intel":
        env.update(KMP_AFFINITY="granularity=fine,compact,1,0", KMP_BLOCKTIME="1")
    else:
        env.update(OMP_PROC_BIND="close", OMP_SCHEDULE="STATIC", GOMP_CPU_AFFINITY=format_cpu_list(cpus))
    return env


def pin_process(cpus: tuple[int, ...]) -> int:
    """Set the affinity of every thread of this process (the OpenMP pool included); returns threads pinned."""
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    pinned = 0
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
            pinned += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return pinned


@register
class Threads(Accelerator):
    """Compute threads = physical cores (per local rank), pinned, with OpenMP variables for children."""

    name = "threads"
    stage = Stage.ENVIRONMENT
    options = {
        "threads": Option("auto", (str, int), choices=("auto",), check=at_least(1),
                          help="intra-op threads; auto = this rank's physical cores"),
        "interop_threads": Option(None, (int, type(None)), check=at_least(1),
                                  help="inter-op threads; None leaves torch's default"),
        "affinity": Option(True, (bool,), help="pin this process's threads to its physical cores"),
        "export_env": Option(True, (bool,), help="export the OpenMP variables for child processes"),
    }

    def apply(self, ctx):
        hardware = ctx.hardware
        local_rank, local_world = local_rank_layout()
        cpus, source = rank_cores(hardware.physical_cpus)
        threads = len(cpus) if self.threads == "auto" else self.threads
        changes = {"threads": threads}
        if threads > len(hardware.cpus_allowed):
            warnings.warn(f"{threads} threads on {len(hardware.cpus_allowed)} allowed CPUs oversubscribe the cores",
                          stacklevel=2)
        torch.set_num_threads(threads)
        if self.interop_threads is not None:
            try:
                torch.set_num_interop_threads(self.interop_threads)
                changes["interop_threads"] = self.interop_threads
            except RuntimeError:
                changes["interop_threads"] = "unchanged (set once per process, before any parallel work)"
        if local_world > 1 or source == "accel launch":
            changes["rank_cores"] = f"local rank {local_rank}/{local_world} -> cpus {format_cpu_list(cpus)} ({source})"
        if self.affinity:
            pin_process(cpus)
            changes["affinity"] = format_cpu_list(cpus)
        runtime = loaded_openmp()
        changes["openmp"] = runtime
        if self.export_env:
            exported, kept = [], []
            for key, value in openmp_variables(runtime, cpus, threads).items():
                if key in os.environ and os.environ[key] != value:
                    kept.append(f"{key}={os.environ[key]}")
                else:
                    os.environ[key] = value
                    exported.append(f"{key}={value}")
            changes["exported_for_children"] = " ".join(exported) or "none"
            if kept:
                changes["kept_user_values"] = " ".join(kept)
            changes["in_this_process"] = "threads and affinity only; OpenMP variables apply from the next start"
        return changes
