"""Where this process sits in a launched job: torchrun's, Open MPI's, Intel MPI / MPICH's and SLURM's variables
mapped to the RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE that torch's env:// reads, each rank's cores, and
rank(), world_size() and barrier(), which also work in a single process. The group is accel.distributed.group's.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from accel.errors import brief
from accel.hardware import parse_cpu_list

__all__ = ["CORE_MAP_VARIABLE", "LAUNCHERS", "Launch", "NODE_CPUS_VARIABLE", "barrier", "cores_for_rank",
           "launcher_environment", "node_cores", "rank", "rank_cores", "slurm_tasks_on_node", "world_size"]

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
    """SLURM's compressed per-node task counts: '4,2(x3)' with node 2 -> 2 (past the last node: the last count),
    walked without expanding the repeats. ValueError when the text holds no count."""
    count = None
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", tasks_per_node):
        node_id -= int(repeat or 1)
        if node_id < 0:
            break
    if count is None:
        raise ValueError(f"SLURM_TASKS_PER_NODE={brief(tasks_per_node, 80)} holds no task count (SLURM writes "
                         "counts such as '4' or '4,2(x3)')")
    return int(count)


def _number(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    """An integer variable, or ValueError naming it and its value."""
    if key not in environ and default is not None:
        return default
    value = environ[key]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}={brief(value, 80)} is no integer (allowed: whole numbers)") from None


def _check_world(environ: Mapping[str, str], rank_key: str | None, size_key: str, rank: int, size: int) -> None:
    """ValueError naming the variable when the world holds no process or the rank is outside it (rank_key None: a
    rank that was not given, but taken from another, is not checked against this world)."""
    if size < 1:
        raise ValueError(f"{size_key}={brief(environ[size_key], 80)}: a world of processes holds at least one "
                         "(allowed: 1 or more)")
    if rank_key is not None and not 0 <= rank < size:
        raise ValueError(f"{rank_key}={brief(environ[rank_key], 80)} is outside its world of {size} ({size_key}): "
                         f"allowed: 0 to {size - 1}")


def launcher_environment(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """This process's rank and world from the first launcher whose variables are set; None alone. Without a local
    size (a hand-set RANK/WORLD_SIZE) it is one node: local = global. ValueError naming the variable whose value no
    launcher writes (no integer; a world under one; a rank outside its world)."""
    for launcher, (rank_key, size_key, local_key, local_size_key) in LAUNCHERS.items():
        if rank_key not in environ or size_key not in environ:
            continue
        rank, world = _number(environ, rank_key), _number(environ, size_key)
        local_rank = _number(environ, local_key, rank)
        local_size = environ.get(local_size_key, "")
        if launcher == "slurm" and local_size:
            local_world = slurm_tasks_on_node(local_size, max(0, _number(environ, "SLURM_NODEID", 0)))
        else:
            local_world = _number(environ, local_size_key) if local_size else world
        _check_world(environ, rank_key, size_key, rank, world)
        _check_world(environ, local_key if local_key in environ else None, local_size_key if local_size else size_key,
                     local_rank, local_world)
        return Launch(launcher, rank, world, local_rank, local_world)
    return None


def cores_for_rank(physical_cpus: tuple[int, ...], local_rank: int, local_world: int,
                   per_rank: int | None = None) -> tuple[int, ...]:
    """The book's CPU allocation map: local ranks get disjoint, contiguous, equal shares of physical cores (with
    more ranks than cores, shared round-robin: never empty)."""
    share = per_rank or max(1, len(physical_cpus) // local_world)
    start = (local_rank * share) % max(1, len(physical_cpus))
    return tuple(physical_cpus[start:start + share])


def rank_cores(physical_cpus: tuple[int, ...], launch: Launch | None,
               environ: Mapping[str, str] = os.environ) -> tuple[tuple[int, ...], str]:
    """This rank's cores and where they came from: `accel launch`'s map, else the local-rank partition."""
    local_rank, local_world = (launch.local_rank, launch.local_world_size) if launch else (0, 1)
    text = environ.get(CORE_MAP_VARIABLE, "")
    cpus = max(os.cpu_count() or 1, max(physical_cpus, default=-1) + 1)  # this machine's, or the one decided for
    shares = [core_share(share, cpus) for share in text.split(";")] if text else []  # all checked, not only this one
    if local_rank < len(shares) and shares[local_rank]:
        return shares[local_rank], "accel launch"
    return cores_for_rank(physical_cpus, local_rank, local_world), f"partition of {len(physical_cpus)} physical cores"


def core_share(text: str, cpus: int, variable: str = CORE_MAP_VARIABLE) -> tuple[int, ...]:
    """One rank's CPUs in a variable `accel launch` writes, each under ``cpus`` (the machine's); ValueError naming
    the variable, its value and what is allowed."""
    try:
        return parse_cpu_list(text, cpus)
    except ValueError as error:
        raise ValueError(f"{variable} holds {brief(text, 80)}: {error} (allowed: CPU numbers and ranges of them as "
                         f"Linux writes them, '0-3,8', each under {cpus}; ';' between local ranks)") from None


def node_cores(physical_cores: int, environ: Mapping[str, str] = os.environ) -> int:
    """The node's physical cores, which a rank pinned by `accel launch` no longer sees (its affinity is its share);
    elsewhere the cores this process sees."""
    node = environ.get(NODE_CPUS_VARIABLE, "")
    try:
        return len(core_share(node, max(os.cpu_count() or 1, physical_cores), NODE_CPUS_VARIABLE)) if node \
            else physical_cores
    except ValueError:
        return physical_cores


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if _initialized() else 1


def barrier() -> None:
    """Wait for every rank (nothing to wait for in a single process)."""
    if _initialized():
        torch.distributed.barrier()
