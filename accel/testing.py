"""Helpers to test one accelerator in isolation: tiny real objects, apply one accelerator, see what changed.

accel's own tests use these; so can tests of a user's custom accelerator:

    with accel.testing.process_state_restored():
        result = accel.testing.apply_one(MyAccelerator(level=2))
    assert result.row.status == "applied"
    print(result.changed)   # e.g. ['model.conv.weight: memory format channels_last']
"""
from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader

from accel.accelerator import Accelerator
from accel.book import BookCNN, TinyCNN, accuracy, cifar_shaped, digits_datasets  # noqa: F401  (re-exported)
from accel.core import accelerate
from accel.journal import pin_process
from accel.report import Row
from accel.run import Run


def tiny_model(seed: int = 0) -> TinyCNN:
    torch.manual_seed(seed)
    return TinyCNN()


def tiny_optimizer(model: nn.Module, lr: float = 0.01) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def tiny_loader(samples: int = 64, batch_size: int = 16, seed: int = 0, **kwargs: Any) -> DataLoader:
    """Random 1x8x8 images with labels 0-9: for checking plumbing, not accuracy."""
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, **kwargs)


def train_steps(run: Run, epochs: int = 1, loss_fn=nn.functional.cross_entropy) -> list[float]:
    """The training loop from the README, over run.loader; returns the losses."""
    losses = []
    run.model.train()
    for _ in range(epochs):
        for x, y in run.loader:
            with run.autocast():
                loss = loss_fn(run.model(x), y)
            run.backward(loss)
            run.step()
            losses.append(loss.item())
    return losses


@dataclass
class Snapshot:
    """What can be compared of a model, optimizer and loader, taken without changing them."""

    model_id: int
    tensors: dict[str, torch.Tensor]
    formats: dict[str, bool]
    param_ids: list[int]
    modules: list[str]
    trainable: dict[str, bool]
    optimizer: Any = None
    loader: dict[str, Any] = field(default_factory=dict)

    def changes(self, other: Snapshot) -> list[str]:
        """Readable differences from this snapshot to another."""
        out = []
        if self.model_id != other.model_id:
            out.append("model: a different object")
        for name in sorted(set(self.tensors) | set(other.tensors)):
            a, b = self.tensors.get(name), other.tensors.get(name)
            if a is None or b is None:
                out.append(f"model.{name}: {'added' if a is None else 'removed'}")
            elif a.shape != b.shape:
                out.append(f"model.{name}: shape {tuple(a.shape)} -> {tuple(b.shape)}")
            elif a.dtype != b.dtype or a.device != b.device:
                out.append(f"model.{name}: {a.dtype}@{a.device} -> {b.dtype}@{b.device}")
            elif not torch.equal(a, b):
                out.append(f"model.{name}: values changed")
            if a is not None and b is not None and self.formats[name] != other.formats[name]:
                out.append(f"model.{name}: memory format {'channels_last' if other.formats[name] else 'contiguous'}")
        for name, flag in other.trainable.items():
            if name in self.trainable and self.trainable[name] != flag:
                out.append(f"model.{name}: requires_grad {flag}")
        if self.param_ids != other.param_ids:
            out.append("model: parameters replaced")
        if self.modules != other.modules:
            out.append("model: module types changed")
        if self.optimizer != other.optimizer:
            out.append("optimizer: changed")
        for key in sorted(set(self.loader) | set(other.loader)):
            if self.loader.get(key) != other.loader.get(key):
                out.append(f"loader.{key}: {self.loader.get(key)!r} -> {other.loader.get(key)!r}")
        return out


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, loader: Any = None) -> Snapshot:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    formats = {k: v.dim() == 4 and v.is_contiguous(memory_format=torch.channels_last) and not v.is_contiguous()
               for k, v in model.state_dict().items()}
    opt = None
    if optimizer is not None:
        opt = (type(optimizer).__name__,
               [{k: v for k, v in g.items() if k != "params"} | {"params": [id(p) for p in g["params"]]}
                for g in optimizer.param_groups],
               repr(copy.deepcopy(optimizer.state_dict()["state"])))
    loader_attrs = {}
    if loader is not None:
        loader_attrs = {k: getattr(loader, k, None) for k in
                        ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size", "drop_last")}
        loader_attrs["id"] = id(loader)
    return Snapshot(id(model), state, formats, [id(p) for p in model.parameters()],
                    [type(m).__name__ for m in model.modules()],
                    {n: p.requires_grad for n, p in model.named_parameters()}, opt, loader_attrs)


@dataclass
class Applied:
    run: Run
    row: Row
    changed: list[str]  # what the accelerator changed, from the user's objects to the run's


def apply_one(accelerator: Accelerator, model: nn.Module | None = None, optimizer=None, loader=None,
              device: str = "cpu") -> Applied:
    """Apply one accelerator alone to tiny real objects (or yours) and list what it changed."""
    model = model if model is not None else tiny_model()
    optimizer = optimizer if optimizer is not None else tiny_optimizer(model)
    loader = loader if loader is not None else tiny_loader()
    before = snapshot(model, optimizer, loader)
    run = accelerate(model, optimizer, loader, plan=[accelerator], device=device)
    inner = getattr(run.loader, "loader", None)
    after = snapshot(run.unwrap(), run.optimizer, inner)
    after.model_id = id(run.model)
    return Applied(run, run.report.row(accelerator.name), before.changes(after))


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """Undo process-wide settings (threads, affinity, environment) an accelerator may change."""
    threads = torch.get_num_threads()
    environ = dict(os.environ)
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)
        if affinity is not None:
            pin_process(tuple(affinity))
