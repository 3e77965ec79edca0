"""The training step and the one timed loop, so "a step" means the same to tune, bench and the benchmarks."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from accel import clock
from accel.batches import describe_batch
from accel.errors import MeasureError


def synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def split_pair(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets) of a tuple or list batch: its first two items."""
    if isinstance(batch, (list, tuple)) and len(batch) >= 2 and not hasattr(batch, "keys"):
        return batch[0], batch[1]
    raise MeasureError(f"accel's default training step takes (inputs, targets) batches, and this loader yields "
                       f"{describe_batch(batch)}; pass step_fn=fn(run, batch) -> loss, or split=fn(batch) -> "
                     "(inputs, targets) (and loss_fn=fn(output, targets) for another loss)")


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """model(x) for a tensor, model(*inputs) for a tuple or list, model(**inputs) for a mapping."""
    if isinstance(inputs, dict) or hasattr(inputs, "keys"):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


@dataclass
class TrainStep:
    """One training step on a Run: the loss under run.autocast() (step_fn(run, batch), else loss_fn(model(inputs),
    targets) with split(batch), by default a batch's first two items), run.backward(loss), run.step()."""

    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    split: Callable[[Any], tuple[Any, Any]] | None = None
    step_fn: Callable[[Any, Any], torch.Tensor] | None = None

    def loss(self, run, batch: Any) -> torch.Tensor:
        if self.step_fn is not None:
            return self.step_fn(run, batch)
        inputs, targets = (self.split or split_pair)(batch)
        return (self.loss_fn or torch.nn.functional.cross_entropy)(call_model(run.model, inputs), targets)

    def check(self, batch: Any) -> None:
        """Raise a ValueError naming what is needed when this step cannot use the loader's batches."""
        if self.step_fn is None:
            (self.split or split_pair)(batch)

    def __call__(self, run, batch: Any) -> torch.Tensor:
        with run.autocast():
            loss = self.loss(run, batch)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise MeasureError(f"the step's loss must be a scalar tensor, got {describe_batch(loss)}")
        run.backward(loss)
        run.step()
        return loss.detach()


def endless(loader) -> Iterator[Any]:
    """Batches of the loader, epoch after epoch."""
    return itertools.chain.from_iterable(itertools.repeat(loader))


def timed_steps(run, batches: Iterator[Any], count: int, step: TrainStep) -> tuple[list[float], list[float]]:
    """The one timed loop: (seconds, loss) of ``count`` steps, each from fetching its batch to the device done."""
    times, losses = [], []
    for _ in range(count):
        start = clock.now()
        loss = step(run, next(batches))
        losses.append(float(loss.float().item()))
        synchronize(run.device)
        times.append(clock.now() - start)
    return times, losses


CHUNK_S = 0.5  # a chunk's timed steps take about this long
MAX_CHUNK = 20  # timed steps per chunk at most
SETTLE_BELOW_S = 2.0  # steps shorter than this are not timed right after a switch (it leaves them cold)


def chunk_steps(step_s: float, least: int = 1, target_s: float = CHUNK_S, most: int = MAX_CHUNK) -> int:
    """Timed steps per chunk: about ``target_s`` of them, between ``least`` and ``most``."""
    return max(least, min(most, math.ceil(target_s / max(step_s, 1e-6))))

