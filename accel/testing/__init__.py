"""Helpers to test one accelerator in isolation: tiny real objects, apply one accelerator, see what changed.

    with accel.testing.process_state_restored():
        result = accel.testing.apply_one(MyAccelerator(level=2))
    assert result.row.status == "applied"
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel.api import accelerate
from accel.measure import TrainStep
from accel.plan.contract import Accelerator
from accel.run import Run
from accel.run.journal import pin_process
from accel.run.report import Row
from accel.testing.harness import Equivalence, check_equivalence  # noqa: F401  (public)
from accel.testing.setup import Held, Loop, Setup  # noqa: F401  (public)
from accel.testing.snapshots import Snapshot, snapshot  # noqa: F401  (public)
from accel.workloads import NormCNN, digits_datasets, tiny_loader, tiny_model, tiny_optimizer  # noqa: F401  (public)

__all__ = ["Applied", "Equivalence", "Held", "Loop", "Setup", "Snapshot", "apply_one", "check_equivalence",
           "process_state_restored", "snapshot", "tiny_loader", "tiny_model", "tiny_optimizer", "tiny_setup",
           "train_steps"]


def train_steps(run: Run, epochs: int = 1, loss_fn=nn.functional.cross_entropy) -> list[float]:
    """The training loop from the README, over run.loader; returns the losses."""
    step = TrainStep(loss_fn=loss_fn)
    run.model.train()
    return [step(run, batch).item() for _ in range(epochs) for batch in run.loader]


def tiny_setup(seed: int = 0) -> Setup:
    """A user's code in miniature, for check_equivalence(plan, tiny_setup): a CNN with BatchNorm, Adam, and 96 of
    sklearn's real digits in batches of 16, built the same from the same seed every time."""
    torch.manual_seed(seed)
    model = NormCNN()
    images, labels = digits_datasets(seed=0)[0].tensors
    loader = DataLoader(TensorDataset(images[:96], labels[:96]), batch_size=16)
    return Setup(model, torch.optim.Adam(model.parameters(), lr=0.01), loader)


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
