"""ATK17: what run.close()'s letting go of the process group (DDP's wrapper, FSDP2's meshes) does to what the user
holds."""
import torch
from scripts.launching import one_rank_env
from zoo import MODELS, Net

import accel
from accel.testing import tiny_loader, tiny_optimizer, train_steps


def test_a_ddp_wrapper_you_keep_on_a_group_your_script_joined_still_trains_after_close(monkeypatch):
    """The group is yours: letting the wrapper go of it ends no thread (the group lives on), and only breaks the
    wrapper you hold (run.model), whose forward needs its reducer and logger."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = Net(**MODELS["blocks"])
        run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["ddp"], device="cpu")
        train_steps(run)
        wrapper = run.model
        run.close()
        batch = next(iter(tiny_loader()))
        out = wrapper(batch[0])
        out.float().sum().backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    finally:
        torch.distributed.destroy_process_group()



def test_run_model_you_keep_after_closing_a_ddp_run_evaluates_and_trains_as_your_model(one_rank):
    """The group accel started is gone at close, and DDP's wrapper let go of it: its forward broadcast the model's
    buffers through a group of None (a segfault of the whole process) or asserted its logger. Before the release
    it ran; now it runs your model alone."""
    model = Net(**MODELS["blocks"])
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["ddp"], device="cpu")
    train_steps(run)
    run.close()
    x = next(iter(tiny_loader()))[0]
    run.model.eval()
    with torch.no_grad():
        assert torch.equal(run.model(x), model(x))
    run.model.train()
    run.model(x).float().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
