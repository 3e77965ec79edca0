"""Attack 13: torch's distributed checkpoint flattens a state by the text of its keys (str(key)), so a dict in the
optimizer's param groups keyed by numbers (a user's own per-layer table, {1: 0.5}) comes back keyed by '1': run.load
of a sharded checkpoint left the run's own value under 1 and added the saved one under '1', silently not restored.
The sharded save refuses it, naming the key, as it refuses what run.load cannot read back."""
from __future__ import annotations

import pytest
import torch

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


def test_a_param_group_dict_keyed_by_numbers_is_refused_at_a_sharded_save(tmp_path, one_rank):
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["per_layer"] = {1: 0.5, "name": "body"}
    run = accel.accelerate(model, optimizer, tiny_loader(), ["fsdp"], device="cpu")
    try:
        with pytest.raises(CheckpointError, match=r"\[1\]"):
            run.save(tmp_path / "ckpt")
        assert not list(tmp_path.glob("ckpt/step-*"))
    finally:
        run.close()
