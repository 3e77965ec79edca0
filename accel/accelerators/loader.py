"""loader: rebuild the user's DataLoader with workers, pinned memory and prefetching chosen for the hardware.

What it does: gives the run a new DataLoader over the same dataset, sampler and arguments; workers come from the
CPUs the compute threads leave, pinned to them when ``threads`` pins the compute ones. A loader it cannot rebuild is
left alone, with the reason. When it helps: loading is part of the step, and GPUs (pinned, non-blocking copies).

What it keeps: the plain loop's batches exactly (augmentation draws differ with the workers: the row says so); an
IterableDataset keeps its number of workers. Its card: docs/accelerators/loader.md.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import IterableDataset

from accel.errors import Problem, Skip, loops_level
from accel.hardware import format_cpu_list, hyperthread_siblings, is_accelerator
from accel.hardware.launcher import cores_for_rank, rank_cores
from accel.plan.contract import Accelerator, Capability, Stage, State, register
from accel.plan.options import Options, at_least, option
from accel.run.device_loader import rebuild_loader, rebuild_problem
from accel.run.journal import pin_process

__all__ = ["Loader", "LoaderOptions", "PinWorkers"]


STREAM_BATCHES = "an IterableDataset's batches depend on the number of workers"


def workers_change_batches(dataset: Any) -> str | None:
    """Why another ``num_workers`` would change this dataset's batches, or None (a map-style dataset: its sampler
    batches in the main process). A stream is batched inside each worker from its own shard (or all of it), in an
    order only its own code knows, so no merge in the main process could give the plain loop's batches."""
    if not isinstance(dataset, IterableDataset):
        return None
    sharded = getattr(dataset, "shards_by_worker", None)  # it says whether it splits its stream between workers
    if sharded is None:  # or its __iter__ calls torch.utils.data.get_worker_info(), the documented way to shard
        code = getattr(getattr(type(dataset), "__iter__", None), "__code__", None)
        sharded = code is not None and "get_worker_info" in code.co_names
    if sharded:
        return ("this IterableDataset shards its stream by worker and each worker batches its own shard: another "
                "number of workers would change which samples share a batch")
    return "this IterableDataset does not shard its stream by worker: every worker would yield every sample"


@dataclass(frozen=True)
class PinWorkers:
    """A ``worker_init_fn`` that pins each worker to ``cpus`` (a fork inherits the compute threads' cores), then calls
    the user's own. A module-level class, so spawn can pickle it; wrapping one again replaces its CPUs."""

    cpus: tuple[int, ...]
    user_fn: Callable[[int], Any] | None = field(default=None, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "cpus", tuple(sorted(self.cpus)))
        if isinstance(self.user_fn, PinWorkers):
            object.__setattr__(self, "user_fn", self.user_fn.user_fn)

    def __call__(self, worker_id: int) -> None:
        if hasattr(os, "sched_setaffinity"):
            pin_process(self.cpus)  # every thread this worker has so far; later ones inherit the main thread's
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __repr__(self) -> str:
        then = f", then {getattr(self.user_fn, '__qualname__', self.user_fn)!s}" if self.user_fn is not None else ""
        return f"PinWorkers(cpus {format_cpu_list(self.cpus)}{then})"


def worker_cpus(ctx) -> tuple[tuple[int, ...] | None, str]:
    """Where the loader's workers should run (the CPUs to pin them to, or None to leave them with the main process's
    affinity; what the report says): the CPUs allowed minus every local rank's compute CPUs (``decisions.cpus``; their
    hyper-thread siblings are spare), shared between the local ranks as the cores are."""
    if (compute := ctx.decisions.cpus) is None:
        return None, "not pinned: where the main process runs (no compute CPUs decided: threads is not in the plan)"
    if not hasattr(os, "sched_setaffinity"):
        return None, "not pinned: this OS offers no CPU affinity"
    allowed, launch = tuple(ctx.hardware.cpus_allowed), ctx.decisions.launch
    ranks = launch.local_world_size if launch else 1
    busy = set(compute)
    for rank in range(ranks) if ranks > 1 else ():  # the other local ranks compute on their own cores
        busy.update(rank_cores(ctx.hardware.physical_cpus, dataclasses.replace(launch, local_rank=rank))[0])
    spare = tuple(cpu for cpu in allowed if cpu not in busy)
    if ranks > 1 and spare:
        spare = cores_for_rank(spare, launch.local_rank, ranks)
    if not spare:
        return None, (f"workers share the compute CPUs {format_cpu_list(compute)}: no spare CPU (allowed: "
                      f"{format_cpu_list(allowed)})")
    why = (f"the spare CPUs: {format_cpu_list(allowed)} allowed minus the compute CPUs "
           f"{format_cpu_list(sorted(busy) if ranks > 1 else compute)}")
    if ranks > 1:
        why += f", this local rank's share ({launch.local_rank} of {ranks})"
    if siblings := [cpu for cpu in hyperthread_siblings(compute) if cpu in spare]:
        why += f"; {format_cpu_list(siblings)} are hyper-threads of the compute cores"
    return spare, why


PERSISTENT = ("persistent workers draw the loader's seed once per run, others once per epoch: changing them, or "
              "dropping the workers they need, shifts the shuffle from the second epoch on")


@dataclass(frozen=True, kw_only=True)
class LoaderOptions(Options):
    num_workers: str | int = option("auto", (str, int), choices=("auto",), check=at_least(0),
                                    help="auto = allowed CPUs left after the compute threads")
    pin_memory: str | bool = option("auto", (str, bool), choices=("auto",), help="auto = only for accelerator devices")
    persistent_workers: str | bool = option("auto", (str, bool), choices=("auto",),
                                            help="auto = the loader's own setting")
    prefetch_factor: int | None = option(None, (int, type(None)), check=at_least(1),
                                         help="batches each worker loads ahead")
    non_blocking: str | bool = option("auto", (str, bool), choices=("auto",), help="auto = when memory is pinned")


@register
class Loader(Accelerator[LoaderOptions, State]):
    """Workers from the cores the compute threads leave free; pinned memory only where a bus is crossed."""

    name = "loader"
    stage = Stage.DATA
    requires = ("loader",)
    provides = (Capability.DATA_LOADER,)

    @classmethod
    def candidates(cls, hardware, model, optimizer=None, loader=None):
        if loader is None or rebuild_problem(loader) or loader.num_workers:
            return []
        # a stream's workers stay (only pinned memory could change); others may use the hyper-threads
        spare = not workers_change_batches(loader.dataset) and len(hardware.cpus_allowed) > hardware.physical_cores
        return [{}] if hardware.devices.keys() - {"cpu"} or spare else []

    def decide(self, ctx):
        loader, config = ctx.loader, self.config
        if why := rebuild_problem(loader):
            raise Skip(f"left as it was: {why}")
        if stream := workers_change_batches(loader.dataset):  # an explicit other number is refused by check()
            workers, why = loader.num_workers, f"kept: {stream}"
        elif config.num_workers != "auto":
            workers, why = config.num_workers, "asked for"
        else:
            threads = ctx.decisions.threads or torch.get_num_threads()
            ranks = ctx.decisions.launch.local_world_size if ctx.decisions.launch else 1
            allowed = len(ctx.hardware.cpus_allowed) // ranks  # this rank's share of the CPUs
            share = (f"this rank's {allowed} of {len(ctx.hardware.cpus_allowed)} CPUs" if ranks > 1
                     else f"{allowed} CPUs")
            workers, why = max(0, allowed - threads), f"{share} - {threads} compute threads"
            if workers == 0 and loader.persistent_workers:
                workers, why = loader.num_workers, f"kept ({why} = 0): {PERSISTENT}"
        ctx.decide("workers", workers, why)
        pin = is_accelerator(ctx.device) and config.pin_memory is not False
        ctx.decide("non_blocking", pin if config.non_blocking == "auto" else config.non_blocking,
                   "pinned memory" if pin else "no pinned memory")

    def check(self, ctx):
        config, user = self.config, ctx.loader.persistent_workers
        persistent = user if config.persistent_workers == "auto" else config.persistent_workers
        if ctx.decisions.workers == 0 and user or ctx.decisions.workers > 0 and persistent != user:
            return [Problem(self.name, PERSISTENT, field="persistent_workers" if persistent != user else "num_workers",
                            value=config.persistent_workers if persistent != user else ctx.decisions.workers,
                            allowed=f"the loader's own persistent_workers={user}"
                                    + (" with workers" if user else ""), kind="conflict")]
        stream = workers_change_batches(ctx.loader.dataset)  # what decide() found (the loader is the same)
        if stream and config.num_workers not in ("auto", ctx.loader.num_workers):
            return [Problem(self.name, f"{stream}; {STREAM_BATCHES}, and loader keeps the batches exact",
                            field="num_workers", value=config.num_workers,
                            allowed=f'"auto" or {ctx.loader.num_workers} (your loader\'s own); for other workers, '
                                    "set num_workers on your DataLoader: its batches are then the plain loop's too",
                            kind="conflict")]
        return []

    def apply(self, ctx):
        loader, config, decisions = ctx.loader, self.config, ctx.decisions
        workers, pin = decisions.workers, is_accelerator(ctx.device) and config.pin_memory is not False
        if config.pin_memory is True and not pin:
            warnings.warn(f"loader: pin_memory=True ignored: device {ctx.device} needs no host-to-device copy",
                          stacklevel=loops_level())
        persistent = (loader.persistent_workers if config.persistent_workers == "auto" else config.persistent_workers
                      ) and workers > 0  # check() refused any other change of it
        changes = {"num_workers": f"{workers} ({decisions.why['workers']})", "pin_memory": pin,
                   "persistent_workers": persistent}
        prefetch = (config.prefetch_factor or loader.prefetch_factor) if workers > 0 else None
        if prefetch is not None or config.prefetch_factor is not None:
            changes["prefetch_factor"] = prefetch or "ignored (no workers)"
        changes["non_blocking"] = decisions.non_blocking
        init = loader.worker_init_fn
        if workers > 0:
            cpus, where = worker_cpus(ctx)
            changes["worker_cpus"] = f"{format_cpu_list(cpus)} ({where})" if cpus else where
            if cpus and init != (pinned := PinWorkers(cpus, init)):  # (a PinWorkers of these CPUs stays)
                init, user = pinned, pinned.user_fn
                changes["worker_init_fn"] = "pins each worker to its CPUs, then calls " + (
                    f"yours ({getattr(user, '__qualname__', type(user).__name__)})" if user is not None
                    else "nothing (the loader had none)")
        had = (loader.num_workers, loader.pin_memory, loader.persistent_workers,
               loader.prefetch_factor if loader.num_workers else None)
        if (workers, pin, persistent, prefetch) == had and init is loader.worker_init_fn and not decisions.non_blocking:
            where = f"; {changes['worker_cpus']}" if "worker_cpus" in changes else ""
            raise Skip(f"the loader already has these settings (num_workers={workers}: {decisions.why['workers']}; "
                       f"pin_memory={pin}{where}); nothing to change")
        if workers != loader.num_workers and not isinstance(loader.dataset, IterableDataset):
            changes["random_draws"] = (  # said, not probed: reading a sample here would change the user's dataset
                "where your dataset or collate_fn draws random numbers (augmentation), "
                + (f"every worker ({workers}) draws them from a seed of its own, as in any DataLoader with workers"
                   if workers else f"they are drawn here in this process, not in your {loader.num_workers} workers")
                + ": the same samples in the same order, augmented with other draws (the same distribution)")
        ctx.loader = rebuild_loader(loader, num_workers=workers, pin_memory=pin, persistent_workers=persistent,
                                    prefetch_factor=prefetch, worker_init_fn=init)
        return changes
