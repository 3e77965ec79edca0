"""Attack 13: a model whose module keeps plain data as its extra state (nn.Module.get_extra_state returning a dict,
as modules with settings or calibration of their own do) is an honest model, and run.save/run.load must round-trip
it. Under fsdp, torch's distributed checkpoint flattens that dict by its keys ('_extra_state.scale'), and run.load's
fit check compared them with the run's unflattened '_extra_state': refused as 'does not fit'. The single-file load
refused it too ('its model is not what run.save writes'): a model's extra state is read back as plain data (what
torch.load(weights_only=True) reads), numpy's scalars in it saved as Python's, anything else refused at the save."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import accel
from accel.testing import tiny_loader, tiny_model


class WithSettings(nn.Module):
    def __init__(self, seed: int, settings: dict):
        super().__init__()
        self.body, self.settings = tiny_model(seed), settings

    def forward(self, x):
        return self.body(x)

    def get_extra_state(self):
        return self.settings

    def set_extra_state(self, state):
        self.settings = state


def round_trip(tmp_path, plan):
    model = WithSettings(0, {"scale": 2.0, "name": "calibrated"})
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan, device="cpu")
    try:
        run.save(tmp_path / "ckpt")
    finally:
        run.close()
    model = WithSettings(1, {"scale": 1.0, "name": "fresh"})
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), plan, device="cpu")
    try:
        run.load(tmp_path / "ckpt")
        assert model.settings == {"scale": 2.0, "name": "calibrated"}
    finally:
        run.close()


@pytest.mark.slow
def test_a_sharded_checkpoint_of_a_module_with_dict_extra_state_loads(tmp_path, one_rank):
    round_trip(tmp_path, ["fsdp"])


def test_a_checkpoint_file_of_a_module_with_dict_extra_state_loads(tmp_path):
    assert "WORLD_SIZE" not in os.environ
    round_trip(tmp_path, [])


def test_numpy_in_a_models_extra_state_is_saved_as_python_and_a_path_is_refused_at_the_save(tmp_path):
    import pathlib

    import numpy as np

    model = WithSettings(0, {"scale": np.float64(2.0)})
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(), [], device="cpu")
    try:
        run.save(tmp_path / "numbers")
        run.load(tmp_path / "numbers")
        assert model.settings == {"scale": 2.0} and type(model.settings["scale"]) is float
        model.settings = {"where": pathlib.PurePosixPath("/data")}
        with pytest.raises(accel.CheckpointError, match="the model's extra state"):
            run.save(tmp_path / "path")
        assert not (tmp_path / "path").exists()
    finally:
        run.close()
