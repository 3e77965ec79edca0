"""What people train today, through plan="auto" with their ordinary loops and no extra arguments: the seed CNNs,
Hugging Face BERT, GPT-2 and ViT from small configs, a timm CNN, a torchvision detector, an LSTM on packed
sequences (accel.testing.workloads; random weights, nothing downloaded)."""
import math

import pytest
import torch

import accel
from accel.autotune import inloop
from accel.hardware import importable
from accel.testing.harness import process_state
from accel.workloads import WORKLOADS


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workload_runs_through_auto_in_its_own_loop(name, monkeypatch):
    workload = WORKLOADS[name]
    missing = [p for p in workload.requires if not importable(p)]
    if missing:
        pytest.skip(f"needs {missing}")
    monkeypatch.setattr(inloop, "CHUNK_S", 0.0)  # short chunks: a short loop sees every arm
    model, optimizer, loader = workload.build("tiny", steps=16)
    before = process_state()
    run = accel.accelerate(model, optimizer, loader, accel.Auto(cache=False, budget_s=3), device="cpu")
    losses = []
    while run.phase != "settled" and len(losses) < 2000:
        for batch in run.loader:
            with run.autocast():
                loss = workload.loss(run.model, batch)
            run.backward(loss)
            run.step()
            losses.append(float(loss.detach()))
    assert run.phase == "settled", f"{name}: not settled after {len(losses)} steps"
    assert all(math.isfinite(x) for x in losses), losses
    assert run.steps == len(losses)
    assert run.unwrap() is model and run.optimizer is optimizer  # the user's own objects trained
    tuning = run.report.tuning
    assert tuning is not None and tuning.why and str(run.report)
    measured = [row for row in tuning.rows if row.status == "measured"]
    assert measured and measured[0].name == "eager", tuning.rows
    run.close()
    assert process_state() == before
