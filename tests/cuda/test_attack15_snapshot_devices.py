"""Attack 15: accel.testing's snapshots compared the optimizer's state with plan.same_options, which compares tensors
on any device (options may hold a tensor that a checkpoint brings back on the CPU): a user's optimizer state moved to
another device and left there passed as unchanged (the snapshots' own equality had raised on it)."""
import torch
from gpu_helpers import DEVICE, ON_GPU

from accel.testing import snapshot, tiny_model

pytestmark = ON_GPU


def test_a_snapshot_says_the_optimizer_state_moved_to_another_device():
    model = tiny_model(0)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    before = snapshot(model, optimizer)
    for state in optimizer.state.values():
        state["exp_avg"] = state["exp_avg"].to(DEVICE)
    assert "optimizer: changed" in before.changes(snapshot(model, optimizer))
