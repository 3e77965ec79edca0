"""plan="auto" undoes a candidate's own NaN step in your weights and optimizer state (ATK19), but not all of it: an
optimizer that counts its steps in its param groups (timm's Lamb and Adan: ``group["step"]``) kept the undone steps
counted, so each later update was bias-corrected as further on than its training; and a candidate with
grad_accumulation left the gradients it held, NaN, for the plain loop's next update: all of the training NaN after."""
import pytest
import torch
from test_attack19_plan_nan_undone import searched


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
        monkeypatch, lambda params: counting(getattr(timm_optim, kind))(params, lr=1e-3), ["flaky"])
    in_groups = [int(group["step"]) for group in optimizer.param_groups]
    in_state = {state["updates"] for state in optimizer.state.values()}
    assert in_groups == [*in_state] and updates > in_groups[0], (in_groups, in_state, updates)
    assert all(torch.isfinite(p).all() for p in model.parameters()) and not faults, faults


def test_gradients_a_step_schedule_held_through_the_nan_are_not_stepped_by_the_plain_loop(monkeypatch):
    model, optimizer, faults, _ = searched(monkeypatch, lambda params: torch.optim.Adam(params, lr=1e-3, amsgrad=True),
                                           ["flaky", {"grad_accumulation": {"steps": 2}}])
    assert all(torch.isfinite(p).all() for p in model.parameters()), "the held NaN gradients were stepped"
    assert all(torch.isfinite(t).all() for s in optimizer.state.values() for t in s.values())
    assert not faults, faults
