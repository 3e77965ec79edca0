"""plan="auto" undoes a candidate's own NaN step in your weights and optimizer state (ATK19), but not all of it: an
optimizer that counts its steps in its param groups (timm's Lamb and Adan: ``group["step"]``) kept the undone steps
counted, so each later update was bias-corrected as further on than its training; and a candidate with
grad_accumulation left the gradients it held, NaN, for the plain loop's next update: all of the training NaN after."""
import pytest
import torch
from torch import nn
from virtual_clock import VirtualClock

import accel
import accel.clock
from accel.plan.contract import Accelerator, Stage, register, unregister
from accel.search import inloop
from accel.testing import tiny_loader, tiny_model

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


def searched(monkeypatch, make_optimizer, flaky_plan):
    """Your loop under plan="auto" until it settles, then one more epoch: (model, optimizer, the flaky arm, the
    report's search faults, the updates)."""
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)
    register(Flaky)
    try:
        with accel.clock.use(CLOCK):
            torch.manual_seed(0)
            model = tiny_model()
            CLOCK.per_forward(model, 0.01)
            optimizer = make_optimizer(model.parameters())
            run = accel.accelerate(model, optimizer, tiny_loader(), accel.Auto(
                cache=False, budget_s=10, candidates=[flaky_plan, ["channels_last"]]), device="cpu")
            updates, epochs = 0, 0
            while epochs < 1 and updates < 200:
                for x, y in run.loader:
                    run.backward(nn.functional.cross_entropy(run.model(x), y))
                    updates += not run.step()
                epochs += run.phase == "settled"
            faults = run.report.to_dict()["search"]["faults"]
            run.close()
    finally:
        unregister("flaky20")
    flaky = next(a for a in run.arms if "flaky20" in a.plan)
    assert flaky.status == "loss off" and "put back" in flaky.reason, flaky
    return model, optimizer, faults, updates


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


@pytest.mark.parametrize("kind", ["Lamb", "Adan"])
def test_an_undone_nan_step_is_not_counted_in_the_param_groups(monkeypatch, kind):
    timm_optim = pytest.importorskip("timm.optim")
    model, optimizer, faults, updates = searched(
        monkeypatch, lambda params: counting(getattr(timm_optim, kind))(params, lr=1e-3), ["flaky20"])
    in_groups = [int(group["step"]) for group in optimizer.param_groups]
    in_state = {state["updates"] for state in optimizer.state.values()}
    assert in_groups == [*in_state] and updates > in_groups[0], (in_groups, in_state, updates)
    assert all(torch.isfinite(p).all() for p in model.parameters()) and not faults, faults


def test_gradients_a_step_schedule_held_through_the_nan_are_not_stepped_by_the_plain_loop(monkeypatch):
    model, optimizer, faults, _ = searched(monkeypatch, lambda params: torch.optim.Adam(params, lr=1e-3, amsgrad=True),
                                           ["flaky20", {"grad_accumulation": {"steps": 2}}])
    assert all(torch.isfinite(p).all() for p in model.parameters()), "the held NaN gradients were stepped"
    assert all(torch.isfinite(t).all() for s in optimizer.state.values() for t in s.values())
    assert not faults, faults
