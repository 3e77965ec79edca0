"""attack11: compile with fullgraph=True under ddp is refused with the plan, before anything changes: it compiled the
DDP wrapper whole, whose forward dynamo cannot trace (DDP's logger), and the user's first step raised torch's
Unsupported from inside the loop. regional=True compiles each block inside the wrapper and is taken."""
from __future__ import annotations

import pytest
import torch
from scripts.launching import one_rank_env

import accel
from accel.errors import PlanError
from accel.testing import tiny_loader, tiny_model


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun --nproc-per-node 1's variables: ddp joins a gloo group of one in this process."""
    for key, value in one_rank_env().items():
        monkeypatch.setenv(key, value)
    yield
    assert not torch.distributed.is_initialized()


def test_fullgraph_under_ddp_is_refused_with_the_plan(one_rank):
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PlanError) as refused:
        accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                         plan={"ddp": {}, "compile": {"fullgraph": True}}, device="cpu")
    problem = next(p for p in refused.value.problems if p.accelerator == "compile")
    assert problem.field == "fullgraph" and "regional=True" in str(problem.allowed)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
