"""End to end on real data: a small CNN on sklearn's digits, plain loop vs accelerate() with a stacked plan."""
import pytest
import torch
from torch.utils.data import DataLoader

import accel
from accel.testing import train_steps
from accel.workloads import TinyCNN, accuracy, digits_datasets

EPOCHS = 4


def train(plan):
    train_set, test_set = digits_datasets(seed=0)
    torch.manual_seed(0)
    model = TinyCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    loader = DataLoader(train_set, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    run = accel.accelerate(model, optimizer, loader, plan=plan, device="cpu")
    train_steps(run, epochs=EPOCHS)
    return accuracy(run.model, test_set, run.autocast), run


@pytest.mark.slow
def test_stacked_plan_reaches_the_plain_loops_accuracy_within_two_points():
    plain, _ = train([])
    accelerated, run = train(["compile", "channels_last", "amp", {"loader": {"num_workers": 1}}, "threads"])
    assert plain > 0.9, "the plain loop itself must learn the digits"
    assert abs(accelerated - plain) <= 0.02, (plain, accelerated, str(run.report))
    assert run.report.applied[:1] == ["threads"] and run.report.rows[-1].name == "compile"
    assert run.report.row("loader").status == "applied"
    assert run.unwrap() is not run.model  # compiled
