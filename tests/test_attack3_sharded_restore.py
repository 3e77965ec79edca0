"""Found from outside (attack3): a sharded checkpoint's load that fails half-way must put every accelerator's state
back, as the single-file load does. A user's State whose state_dict hands out its live tensors (as a module's
state_dict() does, and as docs/lifecycle.md's EMA does) is the ordinary case."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from scripts.launching import one_rank_env

import accel
from accel import Accelerator, Stage, State
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


@dataclass
class CountState(State):
    total: torch.Tensor = field(default_factory=lambda: torch.zeros(()))

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}  # the live tensor, as nn.Module.state_dict() hands out

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.total.copy_(saved["total"])


class Count(Accelerator[Any, CountState]):
    """Counts the optimizer steps in a tensor (a user's accelerator with runtime state)."""

    name = "attack3_count"
    stage = Stage.STEP
    requires = ("optimizer",)

    def apply(self, ctx) -> CountState:
        return CountState()

    def step(self, run, state, optimizer, proceed):
        stepped = proceed(optimizer)
        state.total += bool(stepped)
        return stepped


@dataclass
class PickyState(State):
    steps: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if saved["steps"] > 2:
            raise ValueError("a state from past its second step does not fit (a user's own rule)")
        self.steps = saved["steps"]


class Picky(Accelerator[Any, PickyState]):
    """Refuses a state saved past its second step: its load raises, after Count's was restored."""

    name = "attack3_picky"
    stage = Stage.STEP
    after = ("attack3_count",)

    def apply(self, ctx) -> PickyState:
        return PickyState()

    def step(self, run, state, optimizer, proceed):
        state.steps += 1
        return proceed(optimizer)


@pytest.fixture
def users_accelerators():
    for cls in (Count, Picky):
        accel.register(cls)
    yield
    for cls in (Count, Picky):
        accel.unregister(cls.name)


def train(run, steps):
    for _, (x, y) in zip(range(steps), run.loader):
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        run.step()


@pytest.mark.parametrize("sharded", [
    True, False])
def test_a_load_refused_by_a_later_accelerator_puts_every_state_back(tmp_path, monkeypatch, users_accelerators,
                                                                      sharded):
    if sharded:
        for key, value in one_rank_env().items():
            monkeypatch.setenv(key, value)
    plan = ["attack3_count", "attack3_picky"] + (["fsdp"] if sharded else [])
    model = tiny_model(0)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan, device="cpu")
    train(run, 3)
    run.save(tmp_path / "ckpt")
    run.close()

    model = tiny_model(1)
    other = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan, device="cpu")
    try:
        train(other, 1)
        with pytest.raises(CheckpointError, match="put back"):
            other.load(tmp_path / "ckpt")
        assert other.state("attack3_count").total.item() == 1  # its own count, not the checkpoint's 3
    finally:
        other.close()
