"""plan="auto" undoes a candidate's own NaN step in your weights and optimizer state (ATK19), but an optimizer that
counts its steps in its param groups (timm's Lamb and Adan: ``group["step"]``) kept the undone step counted, so each
later update was bias-corrected as one step further on than the training it belongs to."""
import pytest
import torch
from torch import nn
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.plan.contract import Accelerator, Stage, register, unregister
from accel.search import inloop
from accel.testing import tiny_loader, tiny_model

timm_optim = pytest.importorskip("timm.optim")
CLOCK = VirtualClock()


class Flaky(Accelerator):
    """A test accelerator whose plan gives one NaN output: the second forward after it is applied."""

    name = "flaky20"
    stage = Stage.KERNELS

    def apply(self, ctx):
        model, forwards = ctx.model, [0]

        def poison(module, args, output):
            forwards[0] += 1
            return output * float("nan") if forwards[0] == 2 else output

        ctx.journal.hook("flaky20", lambda: model.register_forward_hook(poison))
        return {}


@pytest.mark.parametrize("kind", ["Lamb", "Adan"])
def test_an_undone_nan_step_is_not_counted_in_the_param_groups(monkeypatch, kind):
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    register(Flaky)
    try:
        with accel.clock.use(CLOCK):
            torch.manual_seed(0)
            model = tiny_model()
            CLOCK.per_forward(model, 0.01)
            optimizer = counting(getattr(timm_optim, kind))(model.parameters(), lr=1e-3)
            run = accel.accelerate(model, optimizer, tiny_loader(), accel.Auto(
                cache=False, budget_s=10, candidates=[["flaky20"], ["channels_last"]]), device="cpu")
            updates = 0
            while run.phase != "settled" and updates < 200:
                for x, y in run.loader:
                    run.backward(nn.functional.cross_entropy(run.model(x), y))
                    updates += not run.step()
                    if run.phase == "settled":
                        break
            flaky = next(a for a in run.arms if a.plan == {"flaky20": {}})
            assert flaky.status == "loss off" and "put back" in flaky.reason, flaky
            in_groups = [int(group["step"]) for group in optimizer.param_groups]
            in_state = {state["updates"] for state in optimizer.state.values()}
            run.close()
    finally:
        unregister("flaky20")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert in_groups == [*in_state] and updates > in_groups[0], (in_groups, in_state, updates, flaky.reason)


def counting(optimizer_class):
    """The timm optimizer, also counting its updates in each parameter's state (as torch's own optimizers do), which
    the undoing puts back: its group's count must agree."""

    class Counting(optimizer_class):
        def step(self, closure=None):
            loss = super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["updates"] = self.state[p].get("updates", 0) + 1
            return loss

    return Counting
