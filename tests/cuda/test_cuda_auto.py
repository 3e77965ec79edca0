"""plan="auto" in the training loop on the GPU, on resnet18 and GPT-2 small (built from configs, random data): the
search takes turns on the user's own objects, settles within its budget, keeps training, and its report names the
GPU and what this GPU offers (every candidate measured, or named with why not)."""
import math
import os
import time

import pytest
from gpu_helpers import DEVICE, ON_GPU, REHEARSAL, limit

import accel
from accel.search import generate_candidates
from accel.workloads import WORKLOADS

pytestmark = ON_GPU
BUDGET_S = float(os.environ.get("ACCEL_CUDA_AUTO_BUDGET_S", "15"))
SIZE = {"resnet18": {"batch": 32, "steps": 8}, "gpt2": {"batch": 8, "steps": 8}}  # 224x224 images; 256 tokens


@limit(BUDGET_S + 75)
@pytest.mark.parametrize("name", ["resnet18", "gpt2"])
def test_auto_settles_in_the_loop_on_the_gpu_and_says_what_it_offers(name):
    workload = WORKLOADS[name]
    model, optimizer, loader = workload.build("tiny" if REHEARSAL else "real", **SIZE[name])
    offered = {next(iter(c)) for c in generate_candidates(accel.probe(), model, optimizer, loader)}
    run = accel.accelerate(model, optimizer, loader, plan=accel.Auto(budget_s=BUDGET_S, cache=False))
    losses, deadline, after = [], time.monotonic() + BUDGET_S + 40, 0
    while after < 5 and time.monotonic() < deadline:  # the loop, unchanged, until 5 steps after it settled
        for batch in run.loader:
            with run.autocast():
                loss = workload.loss(run.model, batch)
            run.backward(loss)
            run.step()
            losses.append(loss.item())
            after += run.phase == "settled"
            if after >= 5 or time.monotonic() > deadline:
                break
    text = str(run.report)
    assert run.phase == "settled", text
    assert all(math.isfinite(loss) for loss in losses)
    assert run.report.device == str(DEVICE) and f"device {DEVICE}" in text
    assert run.device == DEVICE and all(p.device == DEVICE for p in run.unwrap().parameters())
    assert {"amp", "fused_optimizer", "compile"} <= offered or REHEARSAL, offered
    assert ("channels_last" in offered) is (name == "resnet18")
    missing = [c for c in offered if c not in text]
    assert not missing, f"candidates this GPU offers that the report does not name: {missing}\n{text}"
    chosen = run.plan.names()
    if "amp" in chosen:  # what this GPU computes in, and TF32 for the rest
        changes = run.report.row("amp").changes
        assert changes["dtype"] == "bfloat16" and changes["allow_tf32"] is True, changes
    assert "ipex" not in chosen
    run.close()
