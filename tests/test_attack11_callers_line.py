"""attack11: the StaleWarning's line is the loop's own even where the loop's file sits next to accel's or torch's
package folder (``accel_runs/train.py`` beside an editable ``accel/``, ``torchvision`` beside ``torch``):
``callers_level`` compared paths by a bare prefix, took such a file for accel's own and pointed past the loop."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model

LOOP = """
for _, (x, y) in zip(range(2), run.loader):
    loss = torch.nn.functional.cross_entropy(run.model(x), y)
    run.backward(loss)
    run.step()
"""


@pytest.mark.parametrize("beside", [accel, torch], ids=["accel_runs", "torch_runs"])
def test_a_loop_in_a_folder_named_like_accels_is_still_the_users_line(one_rank, beside):
    model = tiny_model()
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan=["fsdp"],
                           device="cpu")
    loop = os.path.dirname(beside.__file__) + "_runs/train.py"  # the user's file, a sibling of the package folder
    try:
        model.conv2.weight.register_hook(lambda grad: grad * 0.25)  # FSDP2 never runs it: said once
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            exec(compile(LOOP, loop, "exec"), {"run": run, "torch": torch})
        stale = [w for w in said if issubclass(w.category, StaleWarning)]
        assert [w.filename for w in stale] == [loop]
    finally:
        run.close()
