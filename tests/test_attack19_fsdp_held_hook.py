"""Under fsdp the model trains shards in place of your parameters, and a gradient hook on a shard is named by a
StaleWarning; but one on the Parameter you hold (taken before accelerate(), hooked before or after it) never ran
either, and nothing said so: autograd never reaches your own Parameter while its shard trains."""
import pytest
import torch

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model


@pytest.mark.parametrize("hooked", ["before", "after"])
def test_a_gradient_hook_on_the_parameter_you_hold_is_named(one_rank, hooked):
    model = tiny_model()
    yours = model.conv2.weight
    ran = []
    if hooked == "before":
        yours.register_post_accumulate_grad_hook(lambda p: ran.append(1))
    optimizer = torch.optim.Adam(model.parameters())
    run = accel.accelerate(model, optimizer, tiny_loader(), plan=["fsdp"], device="cpu")
    if hooked == "after":
        yours.register_hook(lambda grad: ran.append(1))
    try:
        with pytest.warns(StaleWarning, match=r"gradient hook on the parameter\(s\) \['conv2.weight'\] never runs"):
            for _, (x, y) in zip(range(1), run.loader):
                run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
                run.step()
    finally:
        run.close()
    assert not ran  # what the warning says: it never ran
