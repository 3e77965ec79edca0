"""attack10: what ddp and fsdp do not follow (a gradient hook on a shard, a parameter unfrozen after wrapping) is
said once, with the accelerator's name and at the loop's own line, also where the loop goes around run.step() and
steps its optimizer itself (the StaleWarning was asked only in run.step(): such a loop heard nothing)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from scripts.launching import output, torchrun

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


@pytest.mark.slow
def test_a_layer_unfrozen_under_ddp_is_said_once_by_each_rank_of_a_loop_around_run_step():
    result = torchrun("attack10_ddp_unfrozen_around.py")
    assert result.returncode == 0, output(result)
    heard = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(heard) == 2, output(result)
    for said in heard:
        assert len(said) == 1, said
        filename, message = said[0]
        assert filename.endswith("attack10_ddp_unfrozen_around.py")
        assert message.startswith("accel: ddp: parameters were frozen or unfrozen after DDP wrapped the model")
