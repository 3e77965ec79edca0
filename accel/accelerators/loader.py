"""loader: rebuild the user's DataLoader with workers, pinned memory and prefetching chosen for the hardware.

The user's loader is left as it was; the run gets a new one over the same dataset, sampler, collate_fn,
batch size, drop_last, generator and worker_init_fn.
"""
from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel.accelerator import Accelerator, Option, Stage, at_least, register
from accel.errors import Problem, Skip
from accel.hardware import is_accelerator


def rebuild_loader(loader: DataLoader, **overrides) -> DataLoader:
    """A new DataLoader equal to ``loader`` but for ``overrides`` (num_workers, pin_memory, sampler, ...)."""
    kwargs = dict(
        dataset=loader.dataset, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device, in_order=getattr(loader, "in_order", True),
    )
    if not isinstance(loader.dataset, IterableDataset):
        if loader.batch_size is not None:  # built from batch_size/shuffle/sampler/drop_last
            kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)
        else:
            kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    if "in_order" not in DataLoader.__init__.__code__.co_varnames:
        kwargs.pop("in_order")  # torch < 2.6
    kwargs.update(overrides)
    if kwargs["num_workers"] == 0:
        kwargs.update(prefetch_factor=None, persistent_workers=False)
    return DataLoader(**kwargs)


@register
class Loader(Accelerator):
    """Workers from the cores the compute threads leave free; pinned memory only where a bus is crossed."""

    name = "loader"
    stage = Stage.DATA
    options = {
        "num_workers": Option("auto", (str, int), choices=("auto",), check=at_least(0),
                              help="auto = allowed CPUs left after the compute threads"),
        "pin_memory": Option("auto", (str, bool), choices=("auto",), help="auto = only for accelerator devices"),
        "persistent_workers": Option("auto", (str, bool), choices=("auto",), help="auto = when there are workers"),
        "prefetch_factor": Option(None, (int, type(None)), check=at_least(1), help="batches each worker loads ahead"),
        "non_blocking": Option("auto", (str, bool), choices=("auto",), help="auto = when memory is pinned"),
    }

    def check(self, ctx):
        if ctx.loader is None:
            return [Problem(self.name, "needs a loader: pass a DataLoader to accelerate()", kind="conflict")]
        if not isinstance(ctx.loader, DataLoader):
            return [Problem(self.name, "can only rebuild a torch.utils.data.DataLoader",
                            value=type(ctx.loader).__name__, kind="conflict")]
        return []

    def apply(self, ctx):
        loader = ctx.loader
        accelerator_device = is_accelerator(ctx.device)
        changes = {}
        if self.num_workers == "auto":
            spare = len(ctx.hardware.cpus_allowed) - torch.get_num_threads()
            workers = max(0, spare)
            changes["num_workers"] = f"{workers} ({len(ctx.hardware.cpus_allowed)} CPUs - {torch.get_num_threads()} compute threads)"
        else:
            workers = self.num_workers
            changes["num_workers"] = workers
        pin = accelerator_device if self.pin_memory == "auto" else self.pin_memory
        if pin and not accelerator_device:
            pin = False
            changes["pin_memory"] = "False"
            warnings.warn(f"loader: pin_memory=True ignored: device {ctx.device} needs no host-to-device copy",
                          stacklevel=2)
        else:
            changes["pin_memory"] = pin
        persistent = workers > 0 if self.persistent_workers == "auto" else self.persistent_workers
        if persistent and workers == 0:
            persistent = False
            changes["persistent_workers"] = "False (no workers to keep)"
        else:
            changes["persistent_workers"] = persistent
        prefetch = self.prefetch_factor if workers > 0 else None
        if self.prefetch_factor is not None and workers == 0:
            changes["prefetch_factor"] = "ignored (no workers)"
        elif prefetch is not None:
            changes["prefetch_factor"] = prefetch
        ctx.non_blocking = pin if self.non_blocking == "auto" else self.non_blocking
        changes["non_blocking"] = ctx.non_blocking
        current = (loader.num_workers, loader.pin_memory, loader.persistent_workers,
                   loader.prefetch_factor if loader.num_workers else None)
        if (workers, pin, persistent, prefetch) == current and not ctx.non_blocking:
            raise Skip(f"the loader already has these settings (num_workers={workers}, pin_memory={pin}); nothing to change")
        ctx.loader = rebuild_loader(loader, num_workers=workers, pin_memory=pin, persistent_workers=persistent,
                                    prefetch_factor=prefetch)
        return changes
