"""The Run: batches moved to the device, the loop's calls, unwrap, and the report as table and data."""
import json
from collections import namedtuple

import pytest
import torch

import accel
from accel.batches import move
from accel.testing import tiny_loader, tiny_model, tiny_optimizer, train_steps

Pair = namedtuple("Pair", "x y")


def test_move_handles_nested_batches():
    batch = {"a": (torch.ones(2), [torch.zeros(1), "label"]), "b": Pair(torch.ones(1, 2, 3, 3), 3)}
    moved = move(batch, torch.device("cpu"), False, [lambda t: t * 2])
    assert moved["a"][0].tolist() == [2.0, 2.0] and moved["a"][1][1] == "label"
    assert isinstance(moved["b"], Pair) and moved["b"].y == 3 and moved["b"].x.sum() == 36


def test_empty_plan_is_the_plain_loop():
    model = tiny_model()
    optimizer = tiny_optimizer(model)
    loader = tiny_loader()
    run = accel.accelerate(model, optimizer, loader, plan=None)
    assert (run.model, run.optimizer, run.loader.loader) == (model, optimizer, loader)
    assert run.report.rows == [] and "empty plan" in str(run.report)
    losses = train_steps(run, epochs=3)
    assert losses[-1] < losses[0]
    assert run.report.timing()["steps"] == 12
    assert all(p.grad is None for p in model.parameters())  # step() zeroes the gradients


def test_report_table_and_data_agree():
    model = tiny_model()
    run = accel.accelerate(model, tiny_optimizer(model), tiny_loader(),
                           plan=["channels_last", {"loader": {"num_workers": 0}}])
    train_steps(run)
    data = json.loads(run.report.to_json())
    assert [a["name"] for a in data["accelerators"]] == ["loader", "channels_last"]
    assert [a["status"] for a in data["accelerators"]] == ["skipped", "applied"]
    assert data["timing"]["steps"] == 4
    table = str(run.report)
    assert "channels_last" in table and "already has these settings" in table
    assert run.report.applied == ["channels_last"] and run.report.skipped == ["loader"]


def test_step_without_optimizer_says_what_is_missing():
    run = accel.accelerate(tiny_model(), None, None, plan=[])
    with pytest.raises(RuntimeError, match="needs an optimizer"):
        run.step()


def test_an_epoch_counter_drives_set_epoch():
    class Recorder(torch.utils.data.SequentialSampler):
        epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    dataset = tiny_loader().dataset
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=Recorder(dataset))
    run = accel.accelerate(tiny_model(), None, loader, plan=[])
    for _ in range(3):
        list(run.loader)
    assert Recorder.epochs == [0, 1, 2]
