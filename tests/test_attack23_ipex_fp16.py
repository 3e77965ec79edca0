"""attack23 on ipex's prepacks(): where IPEX cannot prepack the weights (an AVX2-only CPU such as CI's Zen 3),
ipex.optimize runs with weights_prepack=False. For float16 at level O1 IPEX then casts the model's weights to float16
and steps float32 master copies linked to them only through its prepacked modules: unpacked, the gradients land on
the float16 weights, the step updates masters no forward reads, and the model never trains, unsaid. Runs in the IPEX
environment (nox -s ipex); skipped elsewhere."""
import warnings

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel.hardware import ipex_problem

pytestmark = [pytest.mark.ipex,  # (nox -s ipex runs the tests marked so)
              pytest.mark.skipif(ipex_problem() is not None, reason=f"IPEX cannot run here: {ipex_problem()}")]
DIGITS = load_digits()


def test_float16_under_ipex_trains_the_model_or_ipex_stands_aside():
    data = TensorDataset(torch.tensor(DIGITS.data[:256], dtype=torch.float32) / 16, torch.tensor(DIGITS.target[:256]))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = accel.accelerate(model, optimizer, DataLoader(data, batch_size=32), device="cpu",
                               plan=[{"amp": {"dtype": "float16"}}, "ipex"])
        try:
            trained = run.unwrap() if run.report.row("ipex").status == "applied" else model
            before = [p.detach().clone() for p in trained.parameters()]
            for x, y in run.loader:
                with run.autocast():
                    loss = nn.functional.cross_entropy(run.model(x), y)
                run.backward(loss)
                run.step()
            moved = [not torch.equal(a, p.detach()) for a, p in zip(before, trained.parameters())]
        finally:
            run.close()
    assert all(moved), (run.report.row("ipex"), moved)
