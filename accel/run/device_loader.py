"""The run's loader: the user's batches (or a loader an accelerator rebuilt) moved to the run's device; and
rebuilding a user's DataLoader with other settings (workers, pinning, a sampler), its constructor arguments read back
from its attributes (refused for a subclass: what it adds would be lost). The user's loader is never changed."""
from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel.batches import move
from accel.errors import LoopWarning, StaleWarning, loops_level
from accel.run.pulls import rebuilt_from, timed_as_plain

_END = object()


def _yielded_all(iterator: Any) -> bool | None:
    """Whether a DataLoader's iterator has given every batch of its epoch (None where it cannot say: a stream)."""
    try:
        return iterator._num_yielded >= len(iterator)
    except (AttributeError, TypeError):
        return None


_TOLD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sampler -> the epoch a run last set on it


def _last_told(sampler: Any) -> Any:
    """The epoch a run last set on this sampler; for one no run set yet, its epoch if still torch's first (0),
    else a mark no epoch equals: the loop set it (before accelerate(), each epoch) and keeps setting it."""
    try:
        return _TOLD[sampler]
    except (KeyError, TypeError):  # (a sampler that cannot be weakly referenced or hashed is judged afresh by each run)
        epoch = getattr(sampler, "epoch", None)
        return epoch if epoch in (None, 0) else _END


class DeviceLoader:
    """Wraps the run's DataLoader: batches arrive on the device, then go through the plan's batch transforms;
    epochs are counted so a distributed sampler reshuffles every epoch."""

    def __init__(self, loader: Any, device: torch.device, non_blocking: bool, transforms: list, rebuilt: bool = False):
        self.loader = loader
        self.rebuilt = rebuilt  # an accelerator rebuilt the user's loader: its workers are the run's to stop
        self.device = device
        self.non_blocking = non_blocking
        self.transforms = list(transforms)
        self.epoch = 0
        self.drawn: Callable[[], None] | None = None  # told of every batch (the run watching for own accumulation)
        self.open: list[Any] = []  # the wrapped loader's iterators of the epochs begun and not ended
        self.handed_over = False  # accelerate() again on the model made another run: this loader is the earlier's
        self.read_by_a_run = False  # the loop gave it to accelerate() again: the new run's loader reads it
        self.readers: weakref.WeakSet = weakref.WeakSet()  # the loaders of the runs given it (another model's too)
        self.ending = False  # its workers stop once no epoch of it is open (handed over, or closed under a reader's)
        if isinstance(loader, DeviceLoader):
            loader.read_by_a_run = True
            loader.readers.add(self)
        self.stopped: str | None = None  # why the workers were stopped under an open epoch (said if it goes on)
        self.told = _last_told(getattr(loader, "sampler", None))  # the sampler's epoch as a run last set it

    def __iter__(self) -> Iterator[Any]:
        batches = self.start_epoch()  # now, as iter(DataLoader) draws its seeds: zip(run.loader, other) keeps its order
        if self.device.type == "cpu" and not self.transforms and self.drawn is None:
            return batches
        return self._prepared(batches)

    def _prepared(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if self.drawn is not None:
                self.drawn()
            yield self.prepare(batch)

    def start_epoch(self) -> Iterator[Any]:
        """The wrapped loader's batches for the next epoch, as they come (its sampler told the epoch)."""
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch") and getattr(sampler, "epoch", None) == self.told:  # else the loop set it
            sampler.set_epoch(self.epoch)  # itself (set_epoch(epoch) from 1, or its start_epoch): its order stays
            self.told = getattr(sampler, "epoch", None)
            with contextlib.suppress(TypeError):  # (a sampler no dict can key: each run judges it afresh)
                _TOLD[sampler] = self.told
        self.epoch += 1
        if self.handed_over and not self.read_by_a_run:  # the loop kept it (train_loader = run.loader) past one
            warnings.warn("accel: run.loader: a new epoch on the loader of a run that accelerate() again took over: "
                          "your loop holds the earlier run's loader, so the new run's (its plan's batches) is not "
                          "read; iterate the new run's run.loader each epoch", StaleWarning, stacklevel=loops_level())
        return self._epoch(timed_as_plain(self.loader))

    def _epoch(self, make: Callable[[], tuple[Iterator[Any], Any]]) -> Iterator[Any]:
        iterator, timing = make()  # at the first batch (timing: its sampler pulled as the user's loader pulls it)
        self.open.append(iterator)
        try:
            while True:
                if self.stopped:  # the run was closed under this epoch: at its end, or with batches left
                    done = _yielded_all(iterator)
                    if done is False:
                        raise RuntimeError(self.stopped)
                    if done is None:  # a stream cannot say: the epoch ends here, said
                        warnings.warn(f"accel: {self.stopped}; this stream's epoch ends here, with whatever batches it "
                                      "had left", LoopWarning, stacklevel=loops_level())
                    return
                if timing is not None:
                    timing.before()
                batch = _END  # (next() raised, a bad sample or a Ctrl-C: the pulls kept to where the plain loader's
                try:  # next() stands, for the loop that goes on with another epoch)
                    batch = next(iterator, _END)
                finally:
                    if timing is not None:
                        timing.result(batch is _END)
                if batch is _END:
                    return
                yield batch
        finally:
            self.open = [i for i in self.open if i is not iterator]
            if self.ending and self.rebuilt and not self.open:  # hand_over or close stopped none under an epoch
                self.stop_workers()

    def stop_workers(self, why: str | None = None) -> None:
        """Stop the wrapped loader's worker processes now: an open epoch's, and a persistent iterator's; an open epoch
        that goes on raises ``why`` (else it would end early, silently). Its run closed (``why``) while another run
        reads it (a GAN's generator given the discriminator's run.loader): that run's epoch goes on, and the workers
        stop once no epoch is open, as after a hand-over."""
        if why and any(reader.open for reader in self.readers):
            self.ending = True
            return
        for iterator in self.open:
            if hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
        release_workers(self.loader)
        if self.open and why and getattr(self.loader, "num_workers", 0):
            self.stopped = why

    def hand_over(self) -> None:
        """Another run took over (a new epoch here is warned of); a rebuilt loader's workers stop once the open
        epochs end (the loop may finish the epoch it is in), or now if none is."""
        self.handed_over = self.ending = True
        if self.rebuilt and not self.open:
            self.stop_workers()

    def prepare(self, batch: Any) -> Any:
        """One batch as the plan wants it: on the device, through the batch transforms."""
        if self.device.type != "cpu":
            batch = move(batch, self.device, self.non_blocking)
        for transform in self.transforms:
            batch = transform(batch)
        return batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # dataset, sampler, batch_size, ... of the wrapped loader
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def rebuild_problem(loader: Any) -> str | None:
    """Why a faithful rebuild of this loader is not possible, or None."""
    if not isinstance(loader, DataLoader):
        return f"it is a {type(loader).__name__}, not a torch.utils.data.DataLoader"
    if type(loader) is not DataLoader:
        return (f"it is a DataLoader subclass ({type(loader).__name__}): a rebuild would lose what the subclass "
                "adds")
    return None


_KEPT = ("dataset", "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
         "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")  # as the user gave them


def rebuild_loader(loader: DataLoader, **overrides: Any) -> DataLoader:
    """A new DataLoader equal to ``loader`` but for ``overrides`` (num_workers, pin_memory, sampler, ...): built from
    its constructor arguments, read back from its attributes."""
    why = rebuild_problem(loader)
    if why:
        raise ValueError(f"cannot rebuild the loader: {why}")
    kwargs = {name: getattr(loader, name) for name in _KEPT}
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:  # built from batch_size (+ shuffle/sampler/drop_last)
        kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:  # the user's own batch_sampler (batch_size and drop_last left default)
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:  # batch_size=None: no automatic batching, one sample at a time
        kwargs.update(sampler=loader.sampler, batch_size=None)
    if "sampler" in overrides and "batch_sampler" in kwargs:
        raise ValueError("cannot replace the sampler of a loader built with its own batch_sampler")
    kwargs.update(overrides)
    if kwargs["num_workers"] == 0:  # settings torch accepts only with worker processes (a timeout waits on them)
        kwargs.update(prefetch_factor=None, persistent_workers=False, multiprocessing_context=None, timeout=0)
    rebuilt = DataLoader(**kwargs)
    rebuilt_from(rebuilt, loader)
    return rebuilt


def release_workers(loader: Any) -> None:
    """Stop a DataLoader's persistent workers now, not at garbage collection (maybe in a forked process that cannot)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None
