"""A sharded checkpoint reads the optimizer's state through torch's get_state_dict, which creates the state of an
optimizer that has none (no step yet) by stepping it once with lr 0: Adam's step count moved to 1, so its first real
step was bias-corrected as its second. A refused run.load, or a run.save before the first step, changed the training
that followed (found by ATK18)."""
import shutil

import pytest
import torch

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


def fsdp_run(model=None):
    model = model if model is not None else tiny_model(0)
    return accel.accelerate(model, torch.optim.Adam(model.parameters(), lr=0.1), tiny_loader(), ["fsdp"],
                            device="cpu")


def trained(run) -> list[torch.Tensor]:
    """One epoch of the README's loop; the weights after it (whole), the run closed."""
    try:
        for images, labels in run.loader:
            with run.autocast():
                loss = torch.nn.functional.cross_entropy(run.model(images), labels)
            run.backward(loss)
            run.step()
        return [getattr(v, "full_tensor", v.detach)().detach().clone() for v in run.unwrap().state_dict().values()]
    finally:
        run.close()


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.slow
def test_a_refused_load_and_a_save_before_the_first_step_leave_the_training_as_it_was(tmp_path, one_rank):
    plain = trained(fsdp_run())

    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))  # another model's checkpoint
    saver = fsdp_run(other)
    saver.save(tmp_path / "other")
    saver.close()
    run = fsdp_run()
    with pytest.raises(CheckpointError, match="does not fit"):
        run.load(tmp_path / "other")
    assert not run.optimizer.state  # as it was: no step yet
    assert same(trained(run), plain)

    run = fsdp_run()
    run.save(tmp_path / "first")  # before the first step (a loop that saves at step 0)
    assert not run.optimizer.state
    assert same(trained(run), plain)

    resumed = fsdp_run(tiny_model(1))
    resumed.load(tmp_path / "first")
    assert not resumed.optimizer.state  # the checkpoint's optimizer had taken no step
    assert same(trained(resumed), plain)
    shutil.rmtree(tmp_path)

