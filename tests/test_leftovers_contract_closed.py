"""docs/contract.md's stale table says what a loop that goes on with a closed run is told: its row for accelerate()
again named only ``run.step()``, and no row named run.close(), where the run says so for ``run.backward()``,
``with run.autocast()``, ``run.save()`` and ``run.load()`` too (ATK18, ATK20), and a closed run's rebuilt loader
stops its workers under an epoch that goes on. Each call below is made on a closed run, and each that warns must be
named in the row for how the run was closed; each the code leaves unsaid must not be said to warn."""
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import accel
from accel.errors import StaleWarning
from accel.testing import tiny_loader, tiny_model

CONTRACT = Path(__file__).resolve().parents[1] / "docs" / "contract.md"
ROWS = {"accelerate() again": r"^\| any, with `accelerate\(\)` again \|(.*)$",
        "run.close()": r"^\| any, after `run\.close\(\)` \|(.*)$"}


def backward(run, tmp_path):
    run.backward(nn.functional.cross_entropy(run.model(torch.randn(2, 1, 8, 8)), torch.tensor([0, 1])))


def autocast(run, tmp_path):
    with run.autocast():
        run.model(torch.randn(2, 1, 8, 8))


def save(run, tmp_path):
    run.save(tmp_path / "closed.pt")


def load(run, tmp_path):
    path = tmp_path / "saved.pt"
    if not path.exists():
        model = tiny_model()
        other = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), None, [], device="cpu")
        other.save(path)
        other.close()
    run.load(path)


CALLS = {"`run.step()`": lambda run, tmp_path: run.step(), "`run.backward()`": backward,
         "`with run.autocast()`": autocast, "`run.save()`": save, "`run.load()`": load}


def row(closed_by: str) -> str:
    found = re.search(ROWS[closed_by], CONTRACT.read_text(), re.M)
    assert found, f"contract.md's stale table has no row for a run closed by {closed_by}"
    return found.group(1)


def warns(closed_by: str, call, tmp_path) -> bool:
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = accel.accelerate(model, optimizer, tiny_loader(), [], device="cpu")
    latest = None
    if closed_by == "run.close()":
        run.close()
    else:
        latest = accel.accelerate(model, optimizer, tiny_loader(), [], device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(run, tmp_path)
    if latest is not None:
        latest.close()
    return any(issubclass(w.category, StaleWarning) and "closed run" in str(w.message) for w in caught)


@pytest.mark.parametrize("closed_by", list(ROWS))
def test_the_stale_table_names_each_call_a_closed_run_warns_of(closed_by, tmp_path):
    text = row(closed_by)
    said, unsaid = text.split(" warn", 1)[0], text.split(" warn", 1)[1]
    for name, call in CALLS.items():
        if warns(closed_by, call, tmp_path):
            assert name in said, f"{name} on a run closed by {closed_by} warns; the table does not say so: {text}"
        else:
            assert name not in said, f"{name} on a run closed by {closed_by} is not said; the table says so: {text}"
            assert name in unsaid, f"the table should say that {name} stays unsaid after {closed_by}: {text}"
