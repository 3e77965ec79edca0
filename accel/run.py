"""The object the training loop talks to: model, optimizer, loader, autocast, backward, step, report."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch

from accel.context import Context
from accel.report import Report


def move(batch: Any, device: torch.device, non_blocking: bool, transforms=()) -> Any:
    """Move tensors in a batch (nested tuples, lists and dicts) to the device and apply the transforms."""
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device, non_blocking=non_blocking)
        for transform in transforms:
            batch = transform(batch)
        return batch
    if isinstance(batch, (list, tuple)):
        moved = [move(b, device, non_blocking, transforms) for b in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, dict):
        return {k: move(v, device, non_blocking, transforms) for k, v in batch.items()}
    return batch


class DeviceLoader:
    """Wraps the (possibly rebuilt) DataLoader: batches arrive on the device, transformed; epochs are counted
    so a distributed sampler reshuffles every epoch."""

    def __init__(self, loader: Any, device: torch.device, non_blocking: bool, transforms: list):
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.transforms = list(transforms)
        self.epoch = 0
        self._same_device = device.type == "cpu" and not self.transforms

    def __iter__(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        if self._same_device:
            yield from self.loader
            return
        for batch in self.loader:
            yield move(batch, self.device, self.non_blocking, self.transforms)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:  # dataset, sampler, batch_size, ... of the wrapped loader
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


class Run:
    """The accelerated training objects. Use run.model, run.optimizer and run.loader in your loop."""

    def __init__(self, ctx: Context, report: Report):
        self.model = ctx.model
        self.optimizer = ctx.optimizer
        self.device = ctx.device
        self.scaler = ctx.scaler
        self.autocast_dtype = ctx.autocast_dtype
        self.plan = ctx.plan
        self.report = report
        self.extras = ctx.extras
        self.loader = (DeviceLoader(ctx.loader, ctx.device, ctx.non_blocking, ctx.batch_transforms)
                       if ctx.loader is not None else None)
        self.steps = 0  # optimizer steps taken, restored by run.load
        self._last_step = time.perf_counter()  # the first step's time includes compile and warm-up

    def autocast(self):
        """The autocast context the plan chose (a no-op when no amp accelerator applied)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> bool:
        """Optimizer step (through the grad scaler when there is one), then zero_grad.

        Returns True when the step was skipped (the scaler found inf/NaN gradients and lowered its scale),
        so a learning-rate scheduler can skip too.
        """
        if self.optimizer is None:
            raise RuntimeError("run.step() needs an optimizer: pass one to accel.accelerate(model, optimizer, ...)")
        skipped = False
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        now = time.perf_counter()
        self.report.step_times.append(now - self._last_step)
        self._last_step = now
        return skipped

    def save(self, path) -> None:
        """Checkpoint model, optimizer, scaler, counters, RNG states and the plan (rank 0 writes, atomically)."""
        from accel.checkpoint import save

        save(self, path)

    def load(self, path) -> dict:
        """Restore a checkpoint written by run.save into this run; returns {"step", "epoch", "path"}."""
        from accel.checkpoint import load

        return load(self, path)

    def unwrap(self) -> torch.nn.Module:
        """The user's plain module, under every wrapper (DDP, compile): what to save."""
        return unwrap_model(self.model)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """Peel torch.compile's OptimizedModule and DDP/DataParallel wrappers, in any nesting."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        else:
            return model
