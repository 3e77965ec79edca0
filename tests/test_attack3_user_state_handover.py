"""Found from outside (attack3): docs/lifecycle.md's EMA, copied as a user would, run through `accelerate()` again
after the user grew the model (an auxiliary head, its parameters added with optimizer.add_param_group: both live
per docs/contract.md). The earlier run hands its states over; one that does not fit should start afresh, said in the
report (run.hand_over), not fail the whole plan."""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import accel
from accel import Accelerator, Keeps, Options, Run, Stage, State, option
from accel.testing import tiny_loader, tiny_model, train_steps


@dataclass(frozen=True, kw_only=True)
class EMAOptions(Options):
    decay: float = option(0.99, check=lambda d: None if 0 < d < 1 else "must be in (0, 1)",
                          help="how much of the average each step keeps")


@dataclass
class EMAState(State):
    live: torch.nn.Module
    average: torch.nn.Module

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.average.load_state_dict(saved["average"])  # raises on a mismatch: as docs/lifecycle.md writes it


class EMA(Accelerator[EMAOptions, EMAState]):
    """docs/lifecycle.md's EMA, word for word but its name."""

    name = "attack3_ema"
    stage = Stage.STEP
    provides = ("weights.average",)
    keeps = Keeps("exact", note="trains exactly the plain loop's weights; the average is kept beside them")
    requires = ("optimizer",)

    def apply(self, ctx) -> EMAState:
        average = copy.deepcopy(ctx.model).requires_grad_(False)
        return EMAState(ctx.model, average, changes={"decay": self.config.decay})

    def step(self, run: Run, state: EMAState, optimizer: torch.optim.Optimizer,
             proceed: Callable[[torch.optim.Optimizer], bool]) -> bool:
        stepped = proceed(optimizer)
        if stepped:
            with torch.no_grad():
                for average, live in zip(state.average.parameters(), state.live.parameters()):
                    average.lerp_(live, 1 - self.config.decay)
        return stepped


@pytest.fixture
def ema():
    accel.register(EMA)
    yield
    accel.unregister(EMA.name)


def test_accelerate_again_after_growing_the_model_starts_the_docs_ema_afresh(ema):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    run = accel.accelerate(model, optimizer, tiny_loader(), ["channels_last", "attack3_ema"], device="cpu")
    train_steps(run, 2)
    model.aux = torch.nn.Linear(10, 2)  # an auxiliary head from the next epoch on, trained by the same optimizer
    optimizer.add_param_group({"params": list(model.aux.parameters())})
    again = accel.accelerate(model, optimizer, tiny_loader(), ["channels_last", "attack3_ema"], device="cpu")
    try:
        assert "aux.weight" in again.state("attack3_ema").average.state_dict()
        assert "attack3_ema started afresh" in again.report.continued
    finally:
        again.close()
