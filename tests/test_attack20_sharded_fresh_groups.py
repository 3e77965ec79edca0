"""torch's get_state_dict/set_state_dict create the state of an optimizer that has none by stepping it once with lr 0;
run.save and run.load of a sharded checkpoint then clear that state (ATK18), but an optimizer that counts its steps in
its param groups (timm's Lamb and Adan: ``group["step"]``) kept the creating step counted: a save before the first step,
or a refused load, bias-corrected every later update as one step further on (the training after it changed). And an
optimizer whose step() takes no closure (a user's own) made that step raise after torch set every lr to 0: the save
failed and left the lr at 0 and the gradients zero tensors, so a loop that went on after the failed save trained
nothing."""
import shutil

import pytest
import torch

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model

timm_optim = pytest.importorskip("timm.optim")


def fsdp_run(model=None):
    model = model if model is not None else tiny_model(0)
    return accel.accelerate(model, timm_optim.Lamb(model.parameters(), lr=0.01), tiny_loader(), ["fsdp"],
                            device="cpu")


def trained(run) -> list[torch.Tensor]:
    """One epoch of the README's loop; the weights after it (whole), the run closed."""
    try:
        for images, labels in run.loader:
            run.backward(torch.nn.functional.cross_entropy(run.model(images), labels))
            run.step()
        return [getattr(v, "full_tensor", v.detach)().detach().clone() for v in run.unwrap().state_dict().values()]
    finally:
        run.close()


@pytest.mark.slow
def test_a_save_and_a_refused_load_before_the_first_step_leave_the_groups_step_count(tmp_path, one_rank):
    plain = trained(fsdp_run())

    run = fsdp_run()
    run.save(tmp_path / "first")  # before the first step (a loop that saves at step 0)
    counted = [g.get("step") for g in run.optimizer.param_groups]
    assert all(torch.equal(x, y) for x, y in zip(trained(run), plain, strict=True)) and counted == [None], counted

    resumed = fsdp_run(tiny_model(1))
    resumed.load(tmp_path / "first")  # the checkpoint's optimizer had taken no step: nor its groups
    counted = [g.get("step") for g in resumed.optimizer.param_groups]
    assert all(torch.equal(x, y) for x, y in zip(trained(resumed), plain, strict=True)) and counted == [None], counted

    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))  # another model's checkpoint
    saver = accel.accelerate(other, torch.optim.Adam(other.parameters()), tiny_loader(), ["fsdp"], device="cpu")
    saver.save(tmp_path / "other")
    saver.close()
    run = fsdp_run()
    with pytest.raises(CheckpointError, match="does not fit"):
        run.load(tmp_path / "other")
    counted = [g.get("step") for g in run.optimizer.param_groups]
    assert all(torch.equal(x, y) for x, y in zip(trained(run), plain, strict=True)) and counted == [None], counted
    shutil.rmtree(tmp_path)


class OwnSGD(torch.optim.Optimizer):
    """A user's own optimizer, as many are written: its step() takes no closure."""

    def __init__(self, params, lr: float):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


@pytest.mark.slow
def test_a_save_failing_in_torchs_creating_step_leaves_the_lr_and_gradients(tmp_path, one_rank):
    def own_run():
        model = tiny_model(0)
        return accel.accelerate(model, OwnSGD(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"], device="cpu")

    plain = trained(own_run())
    run = own_run()
    with pytest.raises(TypeError, match="closure"):  # torch calls step(closure=None)
        run.save(tmp_path / "first")
    lrs, grads = [g["lr"] for g in run.optimizer.param_groups], [p.grad for p in run.unwrap().parameters()]
    assert all(torch.equal(x, y) for x, y in zip(trained(run), plain, strict=True)) and lrs == [0.1], lrs
    assert all(grad is None for grad in grads)
