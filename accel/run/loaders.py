"""Rebuilding a user's DataLoader with other settings (workers, pinning, a sampler) while keeping everything else:
its constructor arguments read back from its attributes, exact for torch's own DataLoader in every batching mode,
refused for a subclass (what it adds would be lost). The user's loader itself is never changed.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from accel.hardware import format_cpu_list
from accel.run.journal import pin_process


def rebuild_problem(loader: Any) -> str | None:
    """Why a faithful rebuild of this loader is not possible, or None."""
    if not isinstance(loader, DataLoader):
        return f"it is a {type(loader).__name__}, not a torch.utils.data.DataLoader"
    if type(loader) is not DataLoader:
        return (f"it is a DataLoader subclass ({type(loader).__name__}): a rebuild would lose what the subclass "
                "adds")
    return None


def shards_by_worker(dataset: Any) -> bool:
    """Whether an IterableDataset splits its stream between workers: it says so (``shards_by_worker = True``), or its
    __iter__ calls ``torch.utils.data.get_worker_info()``, the documented way to shard."""
    declared = getattr(dataset, "shards_by_worker", None)
    if declared is not None:
        return bool(declared)
    code = getattr(getattr(type(dataset), "__iter__", None), "__code__", None)
    return code is not None and "get_worker_info" in code.co_names


STREAM_BATCHES = "an IterableDataset's batches depend on the number of workers"


def workers_change_batches(dataset: Any) -> str | None:
    """Why another ``num_workers`` would change this dataset's batches, or None (a map-style dataset: its sampler
    batches in the main process). A stream is batched inside each worker from its own shard (or all of it), in an
    order only its own code knows, so no merge in the main process could give the plain loop's batches."""
    if not isinstance(dataset, IterableDataset):
        return None
    if shards_by_worker(dataset):
        return ("this IterableDataset shards its stream by worker and each worker batches its own shard: another "
                "number of workers would change which samples share a batch")
    return "this IterableDataset does not shard its stream by worker: every worker would yield every sample"


def constructor_arguments(loader: DataLoader) -> dict[str, Any]:
    """The arguments that build an equal DataLoader, read back from its attributes."""
    kwargs = dict(
        dataset=loader.dataset, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device, in_order=loader.in_order,
    )
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:  # built from batch_size (+ shuffle/sampler/drop_last)
        kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:  # the user's own batch_sampler (batch_size and drop_last left default)
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:  # batch_size=None: no automatic batching, one sample at a time
        kwargs.update(sampler=loader.sampler, batch_size=None)
    return kwargs


def rebuild_loader(loader: DataLoader, **overrides: Any) -> DataLoader:
    """A new DataLoader equal to ``loader`` but for ``overrides`` (num_workers, pin_memory, sampler, ...)."""
    why = rebuild_problem(loader)
    if why:
        raise ValueError(f"cannot rebuild the loader: {why}")
    kwargs = constructor_arguments(loader)
    if "sampler" in overrides and "batch_sampler" in kwargs:
        raise ValueError("cannot replace the sampler of a loader built with its own batch_sampler")
    kwargs.update(overrides)
    if kwargs["num_workers"] == 0:  # settings torch accepts only with worker processes (a timeout waits on them)
        kwargs.update(prefetch_factor=None, persistent_workers=False, multiprocessing_context=None, timeout=0)
    return DataLoader(**kwargs)


class PinWorkers:
    """A ``worker_init_fn`` that pins each worker to ``cpus`` (a fork inherits the compute threads' cores), then calls
    the user's own. A module-level class, so spawn can pickle it; wrapping one again replaces its CPUs."""

    def __init__(self, cpus, user_fn: Callable[[int], Any] | None = None):
        self.cpus = tuple(sorted(cpus))
        self.user_fn = user_fn.user_fn if isinstance(user_fn, PinWorkers) else user_fn

    def __call__(self, worker_id: int) -> None:
        if hasattr(os, "sched_setaffinity"):
            pin_process(self.cpus)  # every thread this worker has so far; later ones inherit the main thread's
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PinWorkers) and (self.cpus, self.user_fn) == (other.cpus, other.user_fn)

    def __hash__(self) -> int:
        return hash(self.cpus)

    def __repr__(self) -> str:
        then = f", then {getattr(self.user_fn, '__qualname__', self.user_fn)!s}" if self.user_fn is not None else ""
        return f"PinWorkers(cpus {format_cpu_list(self.cpus)}{then})"


def settings(loader: DataLoader) -> tuple:
    """(num_workers, pin_memory, persistent_workers, prefetch_factor): what the loader accelerator chooses."""
    return (loader.num_workers, loader.pin_memory, loader.persistent_workers,
            loader.prefetch_factor if loader.num_workers else None)


def release_workers(loader: Any) -> None:
    """Stop a DataLoader's persistent worker processes now, not whenever the garbage collector runs (maybe in a
    process forked later, which cannot stop them)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None
