"""Attack 13: run.load reads a sharded checkpoint's bytes items (the optimizer's hyper-parameters) as weights only,
so the sharded save must write them as the single-file save does: numpy's scalars as Python's (a learning rate a
numpy schedule set), and refuse, not write, what weights_only cannot read back. It wrote both as they were: an honest
checkpoint of a run whose lr was an np.float64 was written and then refused by run.load."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import accel
from accel.errors import CheckpointError
from accel.testing import tiny_loader, tiny_model


def train(run, steps):
    for _, (x, y) in zip(range(steps), run.loader):
        run.backward(torch.nn.functional.cross_entropy(run.model(x), y))
        run.step()


def weights(run):
    return {k: v.full_tensor().clone() for k, v in run.unwrap().state_dict().items()}


def fsdp_run(seed, group_values):
    model = tiny_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.param_groups[0].update(group_values)
    return accel.accelerate(model, optimizer, tiny_loader(), ["fsdp"], device="cpu")


@pytest.mark.slow
def test_a_numpy_learning_rate_is_saved_as_a_number_run_load_reads(tmp_path, one_rank):
    run = fsdp_run(0, {"lr": np.float64(0.05)})
    try:
        train(run, 2)
        run.save(tmp_path / "ckpt")
        saved = weights(run)
    finally:
        run.close()
    other = fsdp_run(1, {"lr": 0.1})
    try:
        other.load(tmp_path / "ckpt")
        assert other.optimizer.param_groups[0]["lr"] == 0.05
        assert all(torch.equal(v, saved[k]) for k, v in weights(other).items())
    finally:
        other.close()


def test_a_param_group_value_run_load_could_not_read_is_refused_at_save(tmp_path, one_rank):
    run = fsdp_run(0, {"frozen": frozenset({1, 2})})
    try:
        train(run, 1)
        with pytest.raises(CheckpointError, match="frozenset"):
            run.save(tmp_path / "ckpt")
        assert not list(tmp_path.glob("ckpt/step-*"))
    finally:
        run.close()
