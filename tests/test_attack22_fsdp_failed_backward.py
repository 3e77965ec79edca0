"""Under fsdp, a backward that raises late (an out-of-memory error that the loop catches and skips the batch, as
loops that retry do) leaves FSDP2 itself stuck: its end-of-backward callback never ran, and no later backward gives
the shards a gradient (found by attack 22; checked: accel's own sharing with your Parameters resets at the next
forward, the shards' .grad stay None). The plain loop goes on training; under fsdp it stops, silently. Open: accel
should at least say it (torch's state after a failed backward), or finish FSDP2's backward itself."""
import pytest
import torch
from torch import nn

import accel
from accel.testing import tiny_loader, tiny_model

MAX_NORM = 0.05


def batches(steps=3):
    return [batch for _, batch in zip(range(steps), tiny_loader())]


def train(model, params, optimizer, backward, step, zero):
    """A first backward that raises late (in the input's gradient), caught and skipped; then plain steps. The norms
    clip_grad_norm_ returned after each good backward."""
    norms = []
    for i, (x, y) in enumerate(batches()):
        if i == 0:
            x = x.clone().requires_grad_(True)
            x.register_hook(lambda grad: (_ for _ in ()).throw(RuntimeError("out of memory (late in backward)")))
        loss = nn.functional.cross_entropy(model(x), y)
        try:
            backward(loss)
        except RuntimeError:
            zero()
            continue
        norm = nn.utils.clip_grad_norm_(params, MAX_NORM)
        norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
        step()
        zero()
    return norms


@pytest.mark.xfail(strict=True, reason="FSDP2 gives the shards no gradient after a backward that raised "
                   "(its end-of-backward callback never ran): training stops, unsaid")
def test_clipping_your_parameters_after_a_failed_backward_still_clips(one_rank):
    model = tiny_model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    expected = train(model, params, optimizer, lambda loss: loss.backward(), optimizer.step, optimizer.zero_grad)

    model = tiny_model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    run = accel.accelerate(model, optimizer, None, plan=["fsdp"], device="cpu")
    try:
        norms = train(run.model, params, optimizer, lambda loss: loss.backward(), optimizer.step,
                      optimizer.zero_grad)
    finally:
        run.close()
    assert norms == pytest.approx(expected, rel=1e-4)
