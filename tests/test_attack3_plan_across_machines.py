"""Found from outside (attack3): a checkpoint saved with one plan loaded under another. A ddp run's single file
(written by rank 0 under torchrun) could not be loaded into one process at all: under the plan without ddp run.load
refuses the plan and names saved_plan(path) as the way; under saved_plan(path) ddp is skipped (no launcher) and
run.load refused the file again, for "state of accelerators this run did not apply: ['ddp']" (ddp's state is an
empty dict), where a sharded (fsdp) checkpoint loaded (checkpoint_fit.training_plan): now both do. The same refusal
still awaits an accelerator applied where the file was saved and skipped where it is loaded (amp saved on a CPU
with native bf16, loaded on one without): its state has nowhere to go."""
import os

import pytest
import torch
from scripts.launching import one_rank_env

import accel
from accel.run.state import saved_plan
from accel.testing import tiny_loader, tiny_model, tiny_optimizer, train_steps


@pytest.fixture
def ddp_checkpoint(tmp_path, monkeypatch):
    """A checkpoint of ["ddp", "channels_last"] written under torchrun's variables for one rank, in this process."""
    with monkeypatch.context() as launched:
        for key, value in one_rank_env().items():
            launched.setenv(key, value)
        model = tiny_model()
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), ["ddp", "channels_last"], device="cpu")
        assert run.report.applied == ["channels_last", "ddp"]
        train_steps(run, 2)
        run.save(tmp_path / "ckpt.pt")
        trained = {k: v.clone() for k, v in run.unwrap().state_dict().items()}
        run.close()
    assert "RANK" not in os.environ and not torch.distributed.is_initialized()
    return tmp_path / "ckpt.pt", trained


def test_a_ddp_checkpoint_loads_into_one_process_under_its_saved_plan(ddp_checkpoint):
    path, trained = ddp_checkpoint
    model = tiny_model(1)
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), saved_plan(path), device="cpu")
    try:
        assert run.load(path)["step"] == 8  # two epochs of 4 batches
        assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    finally:
        run.close()
