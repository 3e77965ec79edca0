"""Loops that wrap the user's objects before accelerate(): a DataLoader of their own over a self-sharding stream,
and ``torch.compile(model)``."""
from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from accel.modules import checkpoints_itself, running_statistics
from accel.testing.trace import Loop


class SelfSharding(IterableDataset):
    """A map-style dataset streamed and split between the DataLoader's workers, as torch documents it."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(start, len(self.dataset), step):
            yield self.dataset[index]


class Stream(Loop):
    """The user's own DataLoader of two workers over a stream that shards itself between them: which samples share
    a batch depends on the number of workers, so the run keeps the user's."""

    name = "stream"

    def wrap(self, model, loader):
        if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
            return model, loader  # already a stream, or batched by the dataset: as it is
        return model, DataLoader(SelfSharding(loader.dataset), batch_size=loader.batch_size,
                                 collate_fn=loader.collate_fn, num_workers=2)


class Precompiled(Loop):
    """``model = torch.compile(model)`` before accelerate(), as many scripts do (dynamo's eager backend: the
    wrapper, not the kernels, is what accel must see through). run.unwrap() is the module inside it."""

    name = "precompiled"

    def wrap(self, model, loader):
        import torch._dynamo  # what torch.compile imports anyway; not at import of accel.testing (1 s)

        torch._dynamo.reset()  # every case compiles a new instance of the same classes: a fresh cache each time
        if checkpoints_itself(model) and running_statistics(model):  # dynamo fails it in backward, without accel
            return model, loader  # ('modified by an inplace operation'): no one keeps such a compile of their own
        return torch.compile(model, backend="eager"), loader
