"""Attack 12: channels_last's process-wide forward pre-hook under torch.func.

Per-sample gradients by torch.func (the PyTorch tutorial "Per-sample-gradients": vmap over grad of functional_call)
run the model's convolutions under vmap, where torch has no channels_last copy: the hook made that code raise."""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

import accel
from accel.testing import tiny_loader, tiny_optimizer


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 10))


def per_sample_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """As the tutorial computes them: vmap over the batch of grad of the loss of one sample, by functional_call."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(params, sample, target):
        out = functional_call(model, params, (sample.unsqueeze(0),))
        return nn.functional.cross_entropy(out, target.unsqueeze(0))
    return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)


def test_per_sample_gradients_by_torch_func_on_a_channels_last_run_are_the_plain_ones():
    model = conv_net()
    x, y = next(iter(tiny_loader()))
    plain = per_sample_gradients(model, x, y)
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(), plan=["channels_last"], device="cpu")
    try:
        assert run.report.row("channels_last").status == "applied"
        got = per_sample_gradients(run.model, x, y)
    finally:
        run.close()
    for name, value in plain.items():
        torch.testing.assert_close(got[name], value)
