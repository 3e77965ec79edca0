"""attack10: a block both parametrized and sharded by FSDP2 answers to the class its user wrote, in either order.
FSDP2 makes FSDPParametrizedResidual(FSDPModule, ParametrizedResidual): its last base is parametrize's class, one per
module, so own_class named each block apart ('ParametrizedResidual'): modules=['Residual'] was refused as absent and
'auto' found no repeated block on a model the user had sharded themselves."""
from __future__ import annotations

import pytest
import torch
from scripts.launching import one_rank_env
from torch import nn
from torch.nn.utils import parametrize

import accel
from accel import modules
from accel.testing import train_steps


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.gain = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x + self.layer(x) * self.gain


class Same(nn.Module):
    def forward(self, gain):
        return gain * 1.0


@pytest.fixture
def group(monkeypatch):
    """A gloo group of one in this process (torchrun --nproc-per-node 1), left at the end."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    torch.distributed.init_process_group("gloo")
    yield
    torch.distributed.destroy_process_group()


def blocks_model(shard_first: bool) -> nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), Residual(), Residual(), nn.Linear(8, 10))
    for block in model[2:4]:
        if shard_first:
            fully_shard(block)
        parametrize.register_parametrization(block, "gain", Same())
        if not shard_first:
            fully_shard(block)
    return model


@pytest.mark.parametrize("shard_first", [False, True], ids=["parametrized, then sharded", "sharded, then parametrized"])
def test_a_parametrized_sharded_block_is_its_users_class(group, shard_first):
    model = blocks_model(shard_first)
    assert [modules.own_class(b) for b in model[2:4]] == [Residual, Residual]
    assert modules.repeated_blocks(model) == {"Residual"}
    assert modules.chosen_classes(model, ["Residual"]) == ({"Residual"}, [])


@pytest.mark.parametrize("names", ["auto", ["Residual"]])
def test_checkpointing_a_model_the_user_sharded_finds_its_parametrized_blocks(group, names):
    from accel.testing import tiny_loader

    model = blocks_model(shard_first=False)
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                           plan={"activation_checkpointing": {"modules": names}}, device="cpu")
    try:
        row = {r.name: r for r in run.report.rows}["activation_checkpointing"]
        assert row.status == "applied", row
        assert "2 x Residual: 2, 3" in str(run.report)
        train_steps(run)
    finally:
        run.close()
