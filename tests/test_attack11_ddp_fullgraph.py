"""attack11: compile with fullgraph=True under ddp is refused with the plan, before anything changes: it compiled the
DDP wrapper whole, whose forward dynamo cannot trace (DDP's logger), and the user's first step raised torch's
Unsupported from inside the loop. regional=True compiles each block inside the wrapper and is taken."""
from __future__ import annotations

import pytest
import torch

import accel
from accel.errors import PlanError
from accel.testing import tiny_loader, tiny_model


def test_fullgraph_under_ddp_is_refused_with_the_plan(one_rank):
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PlanError) as refused:
        accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), tiny_loader(),
                         plan={"ddp": {}, "compile": {"fullgraph": True}}, device="cpu")
    problem = next(p for p in refused.value.problems if p.accelerator == "compile")
    assert problem.field == "fullgraph" and "regional=True" in str(problem.allowed)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
