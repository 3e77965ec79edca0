"""Attack 15: what the session's "same behaviour" simplifications of the core changed.

A plan file is read as any file from outside is (accel.files.read_small): a huge one, however sparse, is refused
unread. A
compiled model of the user's own kind (a subclass of torch's OptimizedModule with a constructor of its own) keeps its
compile settings around the plan's model, as torch's own kind does."""
from __future__ import annotations

import tracemalloc
import warnings

import pytest
import torch
import torch._dynamo

import accel
from accel.errors import PlanError
from accel.plan import Plan
from accel.testing import tiny_loader, tiny_model, tiny_optimizer


def test_a_huge_plan_file_is_refused_unread(tmp_path):
    path = tmp_path / "plan.yaml"
    with open(path, "wb") as file:
        file.truncate(64 << 20)  # sparse: nothing on the disk, 64 MiB when read
    tracemalloc.start()
    try:
        with pytest.raises(PlanError) as refused:
            Plan(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "64.0 MiB" in str(refused.value)
    assert peak < 8 << 20  # not read into memory


class Tagged(torch._dynamo.eval_frame.OptimizedModule):
    """A user's own kind of compiled model, built from a compiled one (its constructor is not torch's)."""

    def __init__(self, compiled: torch.nn.Module, tag: str):
        super().__init__(compiled._orig_mod, compiled.dynamo_ctx)
        self.tag = tag


@pytest.mark.slow  # NNI's pruning
def test_your_own_kind_of_compiled_model_keeps_its_settings_around_a_replaced_model():
    pytest.importorskip("nni")
    model = tiny_model(0)
    yours = Tagged(torch.compile(model, backend="eager"), "mine")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (prune's StaleWarning: its copy trains)
        run = accel.accelerate(yours, tiny_optimizer(model), tiny_loader(), plan=["prune"], device="cpu")
    try:
        assert run.report.decisions["your_compile"].startswith("kept outermost")
        assert run.model.dynamo_ctx is yours.dynamo_ctx and run.unwrap() is not model
    finally:
        run.close()
