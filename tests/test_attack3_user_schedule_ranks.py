"""Found from outside (attack3): a user's own step schedule (it plays accel's StepSchedule role, its State is
per_rank because it holds each rank's unreduced gradients, as docs/lifecycle.md describes). A checkpoint saved in
the middle of its accumulation by two ranks must not resume at another world size, as grad_accumulation's is
refused; checkpoint_fit.rank_problems decided that by looking for grad_accumulation's own key ("micro") in every
per-rank state, so the user's schedule resumed with rank 0's gradients alone, silently. Now run.save asks the
schedules (StepSchedule.accumulating) and writes the answer. The two-rank file is made from a one-rank save by
giving the second rank the same parts, as gathered() writes them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

import accel
from accel import Accelerator, Stage, State
from accel.errors import CheckpointError
from accel.plan.contract import StepSchedule
from accel.run.checkpoint import checksum
from accel.testing import tiny_loader, tiny_model, tiny_optimizer


@dataclass
class EveryOtherState(State):
    per_rank: ClassVar[bool] = True  # it holds this rank's own gradients between the two batches
    model: torch.nn.Module | None = None
    held: int = 0

    def state_dict(self) -> dict[str, Any]:
        grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None} if self.held else {}
        return {"held": self.held, "grads": grads}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.held = saved["held"]
        for name, param in self.model.named_parameters():
            param.grad = saved["grads"][name].clone() if name in saved["grads"] else None


class EveryOther(Accelerator[Any, EveryOtherState], StepSchedule[EveryOtherState]):
    """Steps the optimizer every second batch (a user's accumulation of two, summing the gradients)."""

    name = "attack3_every_other"
    stage = Stage.STEP
    requires = ("optimizer",)

    def apply(self, ctx) -> EveryOtherState:
        return EveryOtherState(model=ctx.model)

    def accumulating(self, state: EveryOtherState) -> bool:
        return state.held == 0  # the batch in progress is the first of two

    def step(self, run, state, optimizer, proceed):
        if state.held == 0:
            state.held = 1
            return False
        state.held = 0
        return proceed(optimizer)


@pytest.fixture
def every_other():
    accel.register(EveryOther)
    yield
    accel.unregister(EveryOther.name)


def saved_mid_accumulation(tmp_path, plan):
    """A checkpoint saved after one batch of two, then made as two ranks write it."""
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan, device="cpu")
    x, y = next(iter(run.loader))
    run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
    assert run.step()  # held: not stepped
    run.save(tmp_path / "ckpt.pt")
    run.close()
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    state.update(world_size=2, rng=state["rng"] * 2, accelerators_per_rank=state["accelerators_per_rank"] * 2)
    state["checksum"] = checksum(state)
    torch.save(state, tmp_path / "ckpt.pt")
    return tmp_path / "ckpt.pt"


@pytest.mark.parametrize("plan", [
    pytest.param([{"grad_accumulation": {"steps": 2}}], id="grad_accumulation"),
    pytest.param(["attack3_every_other"], id="users-schedule")])
def test_a_checkpoint_saved_mid_accumulation_by_two_ranks_is_refused_in_one(tmp_path, every_other, plan):
    path = saved_mid_accumulation(tmp_path, plan)
    model = tiny_model(1)
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan, device="cpu")
    try:
        with pytest.warns(UserWarning, match="saved by 2 rank"), pytest.raises(CheckpointError, match="accumulat"):
            run.load(path)
    finally:
        run.close()
