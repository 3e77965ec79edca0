"""attack10: what ddp and fsdp do not follow (a gradient hook on a shard, a parameter unfrozen after wrapping) is
said once, with the accelerator's name and at the loop's own line, also where the loop goes around run.step() and
steps its optimizer itself (the StaleWarning was asked only in run.step(): such a loop heard nothing)."""
from __future__ import annotations

import warnings

import pytest
import torch
from scripts.launching import heard, output, say, torchrun

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model


@pytest.mark.parametrize("around", [False, True], ids=["run.step", "optimizer.step"])
def test_a_gradient_hook_on_a_shard_is_said_once_at_the_loops_line(one_rank, around):
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp"], device="cpu")
    try:
        model.conv2.weight.register_hook(lambda grad: grad * 0.25)  # FSDP2 never runs it
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for _, (x, y) in zip(range(3), run.loader):
                loss = torch.nn.functional.cross_entropy(run.model(x), y)
                if around:  # the loop's own backward and step: run.step() never runs
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                else:
                    run.backward(loss)
                    run.step()
        stale = [w for w in said if issubclass(w.category, StaleWarning)]
        assert len(stale) == 1, [str(w.message) for w in said]
        assert str(stale[0].message).startswith("accel: fsdp: a gradient hook on the parameter(s) ['conv2.weight']")
        assert stale[0].filename == __file__  # the user's line, not one inside accel or torch
    finally:
        run.close()


def test_a_loop_that_calls_run_step_is_asked_there_and_pays_nothing_per_forward(one_rank):
    """The stale check before each forward is for a loop that never reaches run.step(): before, it ran before every
    forward of every loop until it had warned once. The first run.step() takes its hook off."""
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan=["fsdp"],
                           device="cpu")
    try:
        hooks = len(model._forward_pre_hooks)
        for _, (x, y) in zip(range(2), run.loader):
            run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
            run.step()
        assert len(model._forward_pre_hooks) == hooks - 1
    finally:
        run.close()


@pytest.mark.slow
def test_a_layer_unfrozen_under_ddp_is_said_once_by_each_rank_of_a_loop_around_run_step():
    result = torchrun("attack10_ddp_unfrozen_around.py")
    assert result.returncode == 0, output(result)
    reports = heard(result)
    assert len(reports) == 2, output(result)
    for said in reports:
        assert len(said) == 1, said
        filename, message = said[0]
        assert filename.endswith("attack10_ddp_unfrozen_around.py")
        assert message.startswith("accel: ddp: parameters were unfrozen after DDP wrapped the model")


class GAN(torch.nn.Module):
    """A generator and its discriminator in one model (one DDP wrapper): forward(z) scores the fakes, forward(z,
    real) scores the reals and the fakes detached (the discriminator's step)."""

    def __init__(self):
        super().__init__()
        self.g, self.d = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def forward(self, z, real=None):
        fake = self.g(z)
        return self.d(fake) if real is None else torch.cat([self.d(real), self.d(fake.detach())])


def gan_steps(run, model, steps=3):
    """CycleGAN's set_requires_grad(netD, False) around the generator's step, back on before the next step."""
    torch.manual_seed(run.decisions.launch.rank if run.decisions.launch else 0)
    for _ in range(steps):
        z, real = torch.randn(4, 4), torch.randn(4, 8)
        run.backward(run.model(z, real).square().mean())  # the discriminator's step
        run.step()
        model.d.requires_grad_(False)
        run.backward(-run.model(z).mean())  # the generator's step, the discriminator frozen
        run.step()
        model.d.requires_grad_(True)


@pytest.mark.slow  # (two ranks: two interpreters import torch)
def test_a_discriminator_frozen_for_the_generators_step_is_no_stale_ddp():
    """Before: ddp took any change of requires_grad since wrapping for one DDP misses, and a GAN that freezes its
    discriminator for the generator's step heard a false StaleWarning. DDP misses only a parameter unfrozen since
    (never registered); one frozen for a while trains on no rank and is synced again once unfrozen."""
    result = torchrun(__file__)
    assert result.returncode == 0, output(result)
    assert heard(result) == [[], []], output(result)


if __name__ == "__main__":  # each rank of the test above: the StaleWarnings it heard, and the ranks' weights agree
    model = GAN()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None,
                           plan=[{"ddp": {"find_unused_parameters": True}}], device="cpu")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        gan_steps(run, model)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(2)]
    torch.distributed.all_gather(gathered, weights)
    assert torch.equal(*gathered), "the ranks train apart"
    say([str(w.message) for w in said if issubclass(w.category, StaleWarning)])
    run.close()
